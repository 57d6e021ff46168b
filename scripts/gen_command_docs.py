#!/usr/bin/env python
"""Write the debugger's command reference and the "what is recorded by
default" table into docs/commands.md, and the built-in rules into
docs/rules.md, from the command table (nndb/commands), the recording
cadence (nndb/cadence.py) and the rule catalog (nndb/rules/catalog.py),
between the ``commands:``, ``cadence:`` and ``rules:`` start/end markers.
``--check`` exits 1 if a document is out of date (the test suite runs it), so
the documents cannot drift from ``help`` and ``info rules``.

    python scripts/gen_command_docs.py            # rewrite the generated sections
    python scripts/gen_command_docs.py --check
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from nndb.cadence import Cadence  # noqa: E402
from nndb.commands import TABLE  # noqa: E402
from nndb.rules.catalog import default_rules  # noqa: E402

COMMANDS_DOC = os.path.join(ROOT, "docs", "commands.md")
RULES_DOC = os.path.join(ROOT, "docs", "rules.md")
START, END = "<!-- commands:start (scripts/gen_command_docs.py) -->", "<!-- commands:end -->"
RULES_START, RULES_END = "<!-- rules:start (scripts/gen_command_docs.py) -->", "<!-- rules:end -->"
CADENCE_START, CADENCE_END = "<!-- cadence:start (scripts/gen_command_docs.py) -->", "<!-- cadence:end -->"


def reference() -> str:
    lines = ["| command | aliases | what it does |", "|---|---|---|"]
    for c in TABLE.commands:
        usage = c.usage.replace("|", "\\|")
        lines.append(f"| `{usage}` | {', '.join(f'`{a}`' for a in c.aliases)} | {c.summary} |")
    return "\n".join(lines)


def rules_reference() -> str:
    lines = ["| rule | severity | what it catches | thresholds (default: where it comes from) |",
             "|---|---|---|---|"]
    for r in default_rules():
        th = "<br>".join(f"`{k}` = {t.default:g}: {t.why}" for k, t in r.THRESHOLDS.items()) or "-"
        lines.append(f"| `{r.id}` | {r.severity} | {r.explanation} | {th.replace('|', '/')} |")
    return "\n".join(lines)


def _between(text: str, start: str, end: str, body: str) -> str:
    a, b = text.index(start), text.index(end)
    return text[:a + len(start)] + "\n" + body + "\n" + text[b:]


def cadence_table() -> str:
    """docs/commands.md's "what is recorded by default", from the recording cadence."""
    lines = ["| what is measured | steps | changed by |", "|---|---|---|"]
    for what, steps, flag in Cadence().table():
        lines.append(f"| {what} | {steps} | {flag or '-'} |")
    return "\n".join(lines)


def render_commands(text: str) -> str:
    text = _between(text, START, END, reference())
    return _between(text, CADENCE_START, CADENCE_END, cadence_table())


def render_rules(text: str) -> str:
    return _between(text, RULES_START, RULES_END, rules_reference())


DOCUMENTS = ((COMMANDS_DOC, render_commands), (RULES_DOC, render_rules))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    stale = []
    for path, render in DOCUMENTS:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        new = render(text)
        if new == text:
            continue
        if args.check:
            stale.append(os.path.relpath(path, ROOT))
        else:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(new)
    if stale:
        print(f"{', '.join(stale)}: the generated sections are out of date: run scripts/gen_command_docs.py",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
