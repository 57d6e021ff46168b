"""The documents match the program.

Every example in README.md and docs/*.md that shows output is a ``console``
block, and this module runs it and compares (the convention is in
docs/development.md, "Examples that show output"): lines starting ``$ `` are
commands, run in order by one bash in a fresh directory holding a copy of
scripts/examples/, stdout and stderr together; the lines after a command are
its expected output, where a line ``...`` stands for any number of lines and
``...`` inside a line for any text.  A shell session outside a ``console``
block, or a debugger session that shows output, would go unchecked, so
neither is allowed.  Also: the help texts render as they are meant to read."""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys

import click
import pytest

from conftest import ROOT, _base_env
from nndb.cli import cli

DOCS = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
FENCE = re.compile(r"^```(\S*)\s*$")
PROMPT = re.compile(r"^\(nndb[^)]*\) ")
MARK = "\x1e"                                   # (between two commands' outputs)


def fenced_blocks(path: str):
    """(line of the opening fence, info string, body lines) of each fenced block."""
    lines = open(path, encoding="utf-8").read().split("\n")
    at = None
    for i, line in enumerate(lines, 1):
        m = FENCE.match(line)
        if m and at is None:
            at, info, body = i, m.group(1), []
        elif line.rstrip() == "```" and at is not None:
            yield at, info, body
            at = None
        elif at is not None:
            body.append(line)


def parse_transcript(body: list) -> list:
    """[(command, [expected output lines])]; a command line ending in a
    backslash goes on on the next line."""
    steps = []
    lines = iter(body)
    for line in lines:
        if line.startswith("$ "):
            cmd = line[2:]
            while cmd.endswith("\\"):
                cmd = cmd + "\n" + next(lines)
            steps.append((cmd, []))
        elif not steps:
            raise ValueError(f"output before the first command: {line!r}")
        else:
            steps[-1][1].append(line.rstrip())
    return steps


def _line_matches(expected: str, actual: str) -> bool:
    if "..." not in expected:
        return expected == actual
    return re.fullmatch(".*?".join(map(re.escape, expected.split("..."))), actual, re.S) is not None


def output_matches(expected: list, actual: list) -> bool:
    """A line "..." matches any number of lines; "..." in a line, any text."""
    memo = {}

    def match(e: int, a: int) -> bool:
        if (e, a) not in memo:
            if e == len(expected):
                ok = a == len(actual)
            elif expected[e] == "...":
                ok = any(match(e + 1, k) for k in range(a, len(actual) + 1))
            else:
                ok = a < len(actual) and _line_matches(expected[e], actual[a]) and match(e + 1, a + 1)
            memo[e, a] = ok
        return memo[e, a]
    return match(0, 0)


def run_transcript(steps: list, cwd: str, timeout: float = 300) -> list:
    """Each command's output lines, the commands run in order by one bash."""
    script = ["exec 2>&1"]
    for i, (cmd, _) in enumerate(steps):
        script += [cmd, f"__rc=$?; printf '{MARK}%d\\n' {i}; (exit $__rc)"]
    env = dict(_base_env(), PYTHONUNBUFFERED="1", HOME=cwd, COLUMNS="200",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    proc = subprocess.run(["bash", "-c", "\n".join(script)], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, text=True, timeout=timeout)
    chunks = re.split(f"{MARK}\\d+\n", proc.stdout)
    assert len(chunks) == len(steps) + 1, proc.stdout
    return [[line.rstrip() for line in c.rstrip("\n").split("\n")] if c.strip("\n") else [] for c in chunks[:-1]]


def _transcripts():
    for path in DOCS:
        for at, info, body in fenced_blocks(path):
            if info == "console":
                yield pytest.param(path, at, body, id=f"{os.path.relpath(path, ROOT)}:{at}")


TRANSCRIPTS = list(_transcripts())


def test_the_documents_have_transcripts():
    names = {p.id.split(":")[0] for p in TRANSCRIPTS}
    assert "README.md" in names and len(TRANSCRIPTS) >= 5


@pytest.mark.parametrize("path,at,body", TRANSCRIPTS)
def test_transcript(path, at, body, tmp_path):
    steps = parse_transcript(body)
    shutil.copytree(os.path.join(ROOT, "scripts", "examples"), tmp_path / "scripts" / "examples")
    for (cmd, expected), actual in zip(steps, run_transcript(steps, str(tmp_path))):
        assert output_matches(expected, actual), (
            f"{os.path.relpath(path, ROOT)}:{at}: $ {cmd}\n--- the document shows:\n" + "\n".join(expected)
            + "\n--- the program printed:\n" + "\n".join(actual))


def test_examples_that_show_output_are_transcripts():
    """A shell session ($ lines) is a console block; a debugger session
    (prompt lines) outside one shows commands only, no output."""
    wrong = []
    for path in DOCS:
        for at, info, body in fenced_blocks(path):
            if info == "console":
                continue
            where = f"{os.path.relpath(path, ROOT)}:{at}"
            if any(line.startswith("$ ") for line in body):
                wrong.append(f"{where}: a shell session outside a console block")
            if any(PROMPT.match(line) for line in body):
                lone = [line for line in body if line.strip() and not PROMPT.match(line)
                        and not line.startswith(("nndb ", "#", "    ", "%"))]
                if lone:
                    wrong.append(f"{where}: a debugger session showing output: {lone[0]!r}")
    assert wrong == []


# -- the transcript machinery itself ------------------------------------------------------------

def test_output_matching_elides_lines_and_text():
    assert output_matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert output_matches(["a", "...", "b"], ["a", "b"])
    assert output_matches(["step ... loss 1"], ["step 3 loss 1"])
    assert not output_matches(["a", "d"], ["a", "b", "d"])
    assert not output_matches(["a"], ["a", "b"])
    assert not output_matches(["step ... loss 1"], ["step 3 loss 2"])


def test_transcript_commands_run_in_order_with_their_status(tmp_path):
    steps = parse_transcript(["$ printf 'x\\ny'", "x", "y", "$ false", "$ echo $? \\", "  more", "1 more"])
    assert [c for c, _ in steps] == ["printf 'x\\ny'", "false", "echo $? \\\n  more"]
    assert run_transcript(steps, str(tmp_path)) == [["x", "y"], [], ["1 more"]]


# -- help texts -------------------------------------------------------------------------------

def _commands(group: click.Group, ctx: click.Context):
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        sub = click.Context(cmd, info_name=name, parent=ctx)
        yield sub, cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, sub)


def test_help_texts_have_no_printf_escapes():
    """click does not %-format help: a '%%' written for printf shows as '%%'
    (``--checkpoint-memory``'s '25%%' did)."""
    root = click.Context(cli, info_name="nndb")
    helps = [root.command.get_help(root)] + [cmd.get_help(ctx) for ctx, cmd in _commands(cli, root)]
    assert len(helps) > 5
    assert [h for h in helps if "%%" in h] == []
    run = next(cmd.get_help(ctx) for ctx, cmd in _commands(cli, root) if ctx.info_name == "run")
    assert "25%)" in " ".join(run.split())


# -- links between the documents ----------------------------------------------------------------

LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(path: str) -> set:
    """The anchors GitHub gives a Markdown file's headings."""
    out, fenced = set(), False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_links_between_the_documents_resolve():
    """Every relative link in README.md and docs/*.md names a file that
    exists and, with '#', a heading in it (README's sections moved to docs/)."""
    broken = []
    for path in DOCS:
        text = open(path, encoding="utf-8").read()
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            if not os.path.exists(dest):
                broken.append(f"{os.path.relpath(path, ROOT)}: {target} (no such file)")
            elif anchor and dest.endswith(".md") and anchor not in _anchors(dest):
                broken.append(f"{os.path.relpath(path, ROOT)}: {target} (no such heading)")
    assert broken == []


# -- the command table's usage lines ------------------------------------------------------------

def test_each_usage_line_names_its_own_command():
    """A usage line's alternatives (``A | B``) that start with a command's name
    start with this command's: 'help tbreak' (and docs/commands.md) read
    'tbreak step N | break module GLOB ... | break if EXPR', two of its three
    forms another command's."""
    from nndb.commands import TABLE
    names = {c.name for c in TABLE.commands}
    wrong = [c.usage for c in TABLE.commands for alt in c.usage.split(" | ")
             if alt.split() and alt.split()[0] in names and alt.split()[0] != c.name]
    assert wrong == []
