#!/usr/bin/env python
"""Write README.md's "what is recorded by default" table from the recording
cadence (nndb/cadence.py), between the ``cadence:start``/``cadence:end``
markers.  ``--check`` exits 1 if README is out of date (the test suite runs
it), so the README cannot drift from what the recorder, rules and probes do.

    python scripts/gen_cadence_docs.py            # rewrite the README table
    python scripts/gen_cadence_docs.py --check
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from nndb.cadence import Cadence  # noqa: E402

README = os.path.join(ROOT, "README.md")
START, END = "<!-- cadence:start (scripts/gen_cadence_docs.py) -->", "<!-- cadence:end -->"


def table() -> str:
    lines = ["| what is measured | steps | changed by |", "|---|---|---|"]
    for what, steps, flag in Cadence().table():
        lines.append(f"| {what} | {steps} | {flag or '-'} |")
    return "\n".join(lines)


def render(text: str) -> str:
    a, b = text.index(START), text.index(END)
    return text[:a + len(START)] + "\n" + table() + "\n" + text[b:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    with open(README, encoding="utf-8") as fh:
        text = fh.read()
    new = render(text)
    if args.check:
        if new != text:
            print("README.md's recording table is out of date: run scripts/gen_cadence_docs.py", file=sys.stderr)
            return 1
        return 0
    with open(README, "w", encoding="utf-8") as fh:
        fh.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
