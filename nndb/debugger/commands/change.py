"""Changing the run and the session: set, py/!, source, echo, help."""
from __future__ import annotations

import ast
import sys

from ...errors import CommandError
from .. import evaluate as E
from ..hyperparams import set_hyperparameter
from ..points import parse_int
from .table import Command, Table

SET_USAGE = "set HYPER VALUE [group N] [optimizer NAME]    (e.g. set lr 1e-4)"


def _set_arg(text):
    words = text.split()
    if len(words) < 2:
        raise CommandError("set needs a hyper-parameter and a value", SET_USAGE)
    key = words.pop(0)
    opts = {"group": None, "optimizer": None}
    value_words = []
    while words:
        w = words.pop(0)
        if w in opts and words:
            v = words.pop(0)
            opts[w] = parse_int(v, "the group") if w == "group" else v
        else:
            value_words.append(w)
    try:
        value = ast.literal_eval(" ".join(value_words))
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        raise CommandError(f"'{' '.join(value_words)}' is not a number or tuple of numbers", SET_USAGE) from None
    if not isinstance(value, (int, float, bool, tuple)) or \
            (isinstance(value, tuple) and not all(isinstance(x, (int, float)) for x in value)):
        raise CommandError(f"'{' '.join(value_words)}' is not a number or tuple of numbers", SET_USAGE)
    return key, value, opts["group"], opts["optimizer"]


def _set(s, arg):
    key, value, group, oname = arg
    opts = s.optimizers()
    if not opts:
        raise CommandError("no optimizer has been seen yet")
    if oname is not None:
        opts = [(n, o) for n, o in opts if n == oname]
        if not opts:
            raise CommandError(f"no optimizer named '{oname}' (there are: {', '.join(n for n, _ in s.optimizers())})")
    elif len(opts) > 1:
        raise CommandError(f"{len(opts)} optimizers: say which with 'optimizer NAME' "
                           f"({', '.join(n for n, _ in opts)})", SET_USAGE)
    rows = []
    for name, opt in opts:
        rows += set_hyperparameter(name, opt, key, value, group)
    return Table(("optimizer", "group", "hyper-parameter", "was", "now"), rows)


def _py(s, text):
    if not text.strip():
        raise CommandError("py needs a statement")
    shown = []                         # an expression statement's value: shown as print shows it,
    hook = sys.displayhook             # through the front end (not on the script's stdout)
    sys.displayhook = lambda v: shown.append(v) if v is not None else None
    try:
        E.execute(text, s.frame, s.variables(s.frame))
    finally:
        sys.displayhook = hook
    return [E.safe_repr(v) for v in shown] or None


def _source_arg(text):
    t = text.strip()
    if not t:
        raise CommandError("source needs a file name")
    return t


def _source(s, path):
    from ..rcfiles import read_command_file
    lines = read_command_file(path)
    s.queue.extendleft(reversed(lines))


def _echo(s, text):
    return text.replace("\\n", "\n")


def _help(s, text):
    w = text.strip()
    if w == "info":
        return s.table.help("info")
    return s.table.help(w or None)


COMMANDS = [
    Command("set", SET_USAGE, """Change an optimizer hyper-parameter (lr, momentum, weight_decay, betas ...)
in every param group, or in group N; with several optimizers, name one.
It takes effect at the optimizer's next step.  (An LR scheduler may set lr again.)""",
            _set, _set_arg, args=("hyper", "sub:group|optimizer"), group="changing"),
    Command("py", "py STMT   |   !STMT", """Run a Python statement in the script's current frame (assignments stick).""",
            _py, aliases=("!",), args=("expr",), group="changing"),
    Command("source", "source FILE", "Run the commands in FILE (one per line, # comments).",
            _source, _source_arg, args=("file",), group="session"),
    Command("echo", "echo TEXT", "Print TEXT (\\n for a new line); handy in command files.",
            _echo, group="session"),
    Command("help", "help [CMD]", "List the commands, or show one command's usage and help.",
            _help, aliases=("h",), args=("command",), group="session"),
]
