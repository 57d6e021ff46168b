"""What the commands share: a number type that refuses NaN, SCRIPT or
-m MODULE as a launcher Target, errors as one line and an exit code, and
the front end of a debugger session."""
from __future__ import annotations

import os
import sys

import click

from ..errors import NndbError
from ..text import printable

# nndb run's and nndb fuzz's context: everything after SCRIPT is the script's
SCRIPT_CONTEXT = {"ignore_unknown_options": True, "allow_interspersed_args": False}


class ScriptCommand(click.Command):
    """A command of SCRIPT [ARGS] or -m MODULE [ARGS] (run, check, fuzz): everything after
    SCRIPT or MODULE is the script's, as python's rule is, even a word that is also an
    option of the command (``nndb run -m mlp --steps 2``: the module's ``--steps``)."""

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, module_args_apart(self, list(args)))


def module_args_apart(command: click.Command, args: list) -> list:
    """``args`` with ``--`` after ``-m MODULE`` where -m comes among the command's own options
    (before SCRIPT): click then takes what follows as the module's arguments."""
    opts = {name: p for p in command.params if isinstance(p, click.Option) for name in p.opts + p.secondary_opts}
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--" or word == "-" or not word.startswith("-"):
            return args                        # (SCRIPT, or the end of the options)
        if word == "-m":
            return args[:i + 2] + ["--"] + args[i + 2:] if i + 1 < len(args) else args
        if word.startswith("-m") and not word.startswith("--"):          # (-mMODULE)
            return args[:i + 1] + ["--"] + args[i + 1:]
        p = opts.get(word.split("=", 1)[0])
        if p is None:
            return args                        # (unknown: click says so, or takes it as SCRIPT)
        i += 1 if p.is_flag or p.count or "=" in word else 1 + p.nargs
    return args


class Number(click.FloatRange):
    """click's FloatRange, NaN refused (it passes every comparison's range check)."""

    def convert(self, value, param, ctx):
        v = super().convert(value, param, ctx)
        if v != v:
            self.fail(f"{value!r} is not a number.", param, ctx)
        return v


def target_of(module, script, args):
    """SCRIPT ARGS or -m MODULE ARGS -> a launcher Target."""
    from ..run.launcher import Target
    args = list(args)
    if module:
        if script is not None:
            args.insert(0, script)
        return Target(module=module, args=args)
    if script is None:
        raise click.UsageError("missing SCRIPT (or -m MODULE)")
    if script.startswith("-") and script != "-":
        _unknown_option(script)
    return Target(path=script, args=args, cwd=os.getcwd())


def _unknown_option(word: str) -> None:
    """An option before SCRIPT that the command does not have: click's own
    error (with its 'Did you mean'), not 'no such file'.  (The commands take
    unknown options as SCRIPT, so that everything after SCRIPT is the script's.)"""
    import difflib
    ctx = click.get_current_context()
    names = [n for p in ctx.command.params if isinstance(p, click.Option) for n in p.opts + p.secondary_opts]
    name = word.split("=", 1)[0]
    raise click.NoSuchOption(name, possibilities=difflib.get_close_matches(name, names), ctx=ctx)


def fail(e: NndbError) -> None:
    """An nndb error: one line on stderr, its exit code (nndb.errors)."""
    click.echo(printable(f"nndb: error: {e}"), err=True)
    sys.exit(e.exit_code)


def message(text: str) -> None:
    click.echo(printable(text), err=True)


def stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def session_frontend(interactive: bool, scripted: bool = False):
    """The front end of a debugger session: the prompt_toolkit REPL at a
    terminal, else batch mode (a scripted one for a replica of a test's session)."""
    if scripted:
        from ..frontends.batch import ScriptedFrontend
        return ScriptedFrontend([])
    if interactive:
        from ..frontends.repl import ReplFrontend
        return ReplFrontend()
    from ..frontends.batch import BatchFrontend
    return BatchFrontend()
