"""The documents match the program: every ``console`` example in README.md
and docs/*.md is run and its output compared (the convention is in
docs/development.md, "Examples that show output"), and the help texts
render as they are meant to read."""
from __future__ import annotations

import click

from nndb.cli import cli


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
