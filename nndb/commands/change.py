"""Changing the run and the session: set, py/!, source, echo, help."""
from __future__ import annotations

import re

from ..errors import CommandError
from ..debugger.changes import (SET_USAGE, UNSET_USAGE, HyperChange, HyperSet, Release, Statement, VarChange,
                                check_var, hyper_value, make)
from ..debugger.points import parse_int
from .table import Command, Table, raw


# gdb's 'set var NAME = VALUE' (and predict's 'lr=1e-4'): the '=' between a name and its value
_ASSIGN = re.compile(r"\s*([^\s=]+)\s*(?:=(?!=)\s*|\s+)(.*)", re.S)


def _set_arg(text):
    words = text.split()
    if words and words[0] in ("var", "variable"):
        m = _ASSIGN.fullmatch(text.strip()[len(words[0]):])
        if m is None or not m.group(2).strip():
            raise CommandError("set var needs a variable and a value", SET_USAGE)
        name, src = m.group(1), m.group(2).strip()
        check_var(name, src)
        return VarChange(name, src)
    m = _ASSIGN.fullmatch(text)
    if m is not None:
        words = [m.group(1)] + m.group(2).split()
    hold = "--hold" in words
    words = [w for w in words if w != "--hold"]
    if len(words) < 2:
        raise CommandError("set needs a hyper-parameter and a value", SET_USAGE)
    line = "set " + " ".join(words)
    key = words.pop(0)
    opts, value_words = _hyper_options(words)
    value = hyper_value(" ".join(value_words))
    return HyperChange(opts["optimizer"], opts["group"], key, value, hold, line)


def _hyper_options(words: list) -> tuple:
    """``group N`` and ``optimizer NAME`` among ``words``: ({"group", "optimizer"}, the other words)."""
    opts = {"group": None, "optimizer": None}
    rest = []
    while words:
        w = words.pop(0)
        if w in opts and words:
            v = words.pop(0)
            opts[w] = parse_int(v, "the group") if w == "group" else v
        else:
            rest.append(w)
    return opts, rest


def _set(s, edit):
    made = make(s, edit)
    if not isinstance(made, HyperSet):
        return made                    # (a variable: one line)
    return [Table(("optimizer", "group", "hyper-parameter", "was", "now"), made.rows)] + made.notes


def _unset_arg(text):
    words = text.split()
    if not words:
        raise CommandError("unset needs a hyper-parameter", UNSET_USAGE)
    key = words.pop(0)
    opts, rest = _hyper_options(words)
    if rest:
        raise CommandError(f"unexpected '{' '.join(rest)}'", UNSET_USAGE)
    return Release(key, opts["group"], opts["optimizer"])


def _unset(s, edit):
    return [f"Let go of {n}'s {edit.key} in group {gi} (held at {v!r}): the script and its schedulers set it "
            f"again" for n, gi, v in make(s, edit)]


def _py_arg(text):
    return Statement(raw(text))


def _py(s, edit):
    return make(s, edit)


def _source_arg(text):
    t = text.strip()
    if not t:
        raise CommandError("source needs a file name")
    return t


def _source(s, path):
    from .rcfiles import read_command_file
    lines = read_command_file(path)
    s.input.queue.extendleft(reversed(lines))


# gdb's echo takes C's escapes: '\t' a tab, '\\' a backslash ('echo a\tb' printed a\tb)
_ECHO_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'"}


def _echo(s, text):
    # (printed as a line: gdb's 'echo TEXT\n', its own line's end, is not a blank line more)
    out = re.sub(r"\\(.)", lambda m: _ECHO_ESCAPES.get(m.group(1), m.group(0)), text)
    return out[:-1] if out.endswith("\n") else out


def _help(s, text):
    w = text.strip()
    if w == "info":
        return s.table.help("info")
    return s.table.help(w or None)


COMMANDS = [
    Command("set", SET_USAGE, """Change an optimizer hyper-parameter (lr, momentum, weight_decay, betas ...)
in every param group, or in group N; with several optimizers, name one: as
the stopped frame calls it first (a local, or an attribute of its self:
'optimizer opt' at 'self.opt.step()'), else as 'info optimizer' names it.
It takes effect at the optimizer's next step.  An LR scheduler driving the
optimizer follows a new lr: its scale (base, peak and floor lrs) is
multiplied by new/old, so the rest of its schedule is the script's times
new/old (a floor one for all groups, eta_min, only where every group is set
by one factor; else it is kept), and it says so; a change a scheduler would
undo is refused.  When the optimizer steps with the value set back (a script
that sets param_group['lr'] itself at every iteration, as a warmup does, or at
each epoch's start; under a scheduler, judged at the next step against what
the schedule gives, with and without the change), that step's end says so,
once; a later 'set' of the same hyper-parameter replaces the check.  --hold sets
the value again just before each step of the optimizer until 'unset HYPER'
('info optimizer' lists what is held).  'set var NAME VALUE' (or 'set NAME
VALUE' for a name that is no hyper-parameter) assigns a variable of the
script's frame: a hand-written loop's lr.  An '=' may stand between the name
and the value, as in gdb's 'set var NAME = VALUE' ('set lr = 1e-4').  A change
at a stop of the live run is part of its history: kept in the trace, made
again by every replay.""",
            _set, _set_arg, args=("hyper", "sub:group|optimizer|--hold"), group="changing",
            ranks="suffix"),
    Command("unset", UNSET_USAGE, """Let go of a hyper-parameter held by 'set HYPER VALUE --hold' (all groups, or group N).
From the optimizer's next step on, the script and its schedulers set it again.""",
            _unset, _unset_arg, args=("hyper", "sub:group|optimizer"), group="changing", ranks="suffix"),
    Command("py", "py STMT   |   !STMT", """Run a Python statement in the script's current frame (assignments stick).""",
            _py, _py_arg, aliases=("!",), args=("expr",), group="changing"),
    Command("source", "source FILE", "Run the commands in FILE (one per line, # comments).",
            _source, _source_arg, args=("file",), group="session"),
    Command("echo", "echo TEXT", "Print TEXT (\\n for a new line, \\t a tab, \\\\ a backslash; a last \\n, as gdb's echo has it, ends the line); handy in command files.",
            _echo, group="session"),
    Command("help", "help [CMD]", "List the commands, or show one command's usage and help.",
            _help, aliases=("h",), args=("command",), group="session"),
]
