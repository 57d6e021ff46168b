#!/usr/bin/env python
"""Write the debugger's command reference into README.md from the command
table (nndb/debugger/commands), between the ``commands:start`` and
``commands:end`` markers.  ``--check`` exits 1 if README is out of date (the
test suite runs it), so the README cannot drift from ``help``.

    python scripts/gen_command_docs.py            # rewrite the README section
    python scripts/gen_command_docs.py --check
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from nndb.debugger.commands import TABLE  # noqa: E402

README = os.path.join(ROOT, "README.md")
START, END = "<!-- commands:start (scripts/gen_command_docs.py) -->", "<!-- commands:end -->"


def reference() -> str:
    lines = ["| command | aliases | what it does |", "|---|---|---|"]
    for c in TABLE.commands:
        usage = c.usage.replace("|", "\\|")
        lines.append(f"| `{usage}` | {', '.join(f'`{a}`' for a in c.aliases)} | {c.summary} |")
    return "\n".join(lines)


def render(text: str) -> str:
    a, b = text.index(START), text.index(END)
    return text[:a + len(START)] + "\n" + reference() + "\n" + text[b:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    with open(README, encoding="utf-8") as fh:
        text = fh.read()
    new = render(text)
    if args.check:
        if new != text:
            print("README.md's command reference is out of date: run scripts/gen_command_docs.py", file=sys.stderr)
            return 1
        return 0
    with open(README, "w", encoding="utf-8") as fh:
        fh.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
