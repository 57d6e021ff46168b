"""Changing the run and the session: set, py/!, source, echo, help."""
from __future__ import annotations

import ast
import sys

from ..errors import CommandError
from ..debugger import evaluate as E
from ..debugger.hyperparams import HoldCheck, check_scheduled, follow_schedule, schedulers_of, set_hyperparameter
from ..debugger.points import parse_int
from .table import Command, Table

SET_USAGE = "set HYPER VALUE [group N] [optimizer NAME] [--hold]  |  set var NAME VALUE    (e.g. set lr 1e-4)"
UNSET_USAGE = "unset HYPER [group N] [optimizer NAME]    (lets go of 'set HYPER VALUE --hold')"


def _set_arg(text):
    words = text.split()
    if words and words[0] == "var":
        if len(words) < 3:
            raise CommandError("set var needs a variable and a value", SET_USAGE)
        name = words[1]
        if not all(part.isidentifier() for part in name.split(".")):
            raise CommandError(f"'{name}' is not a variable name (NAME or NAME.ATTR)", SET_USAGE)
        src = text.split(None, 2)[2]
        E.compile_expr(src)
        return ("var", name, src)
    hold = "--hold" in words
    words = [w for w in words if w != "--hold"]
    if len(words) < 2:
        raise CommandError("set needs a hyper-parameter and a value", SET_USAGE)
    line = "set " + " ".join(words)
    key = words.pop(0)
    opts, value_words = _hyper_options(words)
    try:
        value = ast.literal_eval(" ".join(value_words))
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        raise CommandError(f"'{' '.join(value_words)}' is not a number or tuple of numbers", SET_USAGE) from None
    if not isinstance(value, (int, float, bool, tuple)) or \
            (isinstance(value, tuple) and not all(isinstance(x, (int, float)) for x in value)):
        raise CommandError(f"'{' '.join(value_words)}' is not a number or tuple of numbers", SET_USAGE)
    return ("hyper", key, value, opts["group"], opts["optimizer"], hold, line)


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


def _is_local(frame, root: str) -> bool:
    """A variable the frame's code really has (not one a 'py' statement added
    to its locals, which the code never reads)."""
    code = frame.f_code
    return frame.f_locals is frame.f_globals or root in code.co_varnames or root in code.co_cellvars \
        or root in code.co_freevars


def _has_variable(frame, name: str) -> bool:
    root = name.split(".")[0]
    return frame is not None and ((_is_local(frame, root) and root in frame.f_locals) or root in frame.f_globals)


def set_target(s, key: str, group=None, oname=None) -> str:
    """What ``set KEY ...`` changes: "hyper" (an optimizer's) or "var" (a
    variable of the script's frame); a CommandError if neither."""
    opts = s.view.optimizers()
    if oname is None and group is None and _has_variable(s.frame, key) and \
            not any(key in g for _, o in opts for g in o.param_groups if key != "params"):
        return "var"
    if not opts:
        hint = f" ('{key}' is no variable of the script's frame either)" if s.frame is not None else ""
        raise CommandError(f"no optimizer has been seen yet{hint}")
    return "hyper"


def _set_var(s, name: str, src: str):
    frame = s.frame
    if frame is None:
        raise CommandError("set var works at a stop, in the script's frame")
    if not _has_variable(frame, name):
        raise CommandError(f"no variable '{name.split('.')[0]}' in {frame.f_code.co_name}()")
    root = name.split(".")[0]
    scope = f"global {root}; " if not _is_local(frame, root) else ""
    read = E.compile_expr(name if not scope else f"globals()[{root!r}]" + name[len(root):])
    old = E.evaluate(read, frame, s.view.variables(frame))
    E.execute(f"{scope}{name} = ({src})", frame, s.view.variables(frame))
    new = E.evaluate(read, frame, s.view.variables(frame))
    where = "a global" if scope else f"in {frame.f_code.co_name}()"
    return f"{name} ({where}): was {E.safe_repr(old)}, now {E.safe_repr(new)}"


def _set(s, arg):
    if arg[0] == "var":
        return _set_var(s, arg[1], arg[2])
    _, key, value, group, oname, hold, line = arg
    if set_target(s, key, group, oname) == "var":
        if hold:
            raise CommandError(f"'{key}' is a variable of the script's frame: --hold holds an optimizer's "
                               f"hyper-parameter", SET_USAGE)
        return _set_var(s, key, repr(value))
    opts = s.view.optimizers()
    if oname is not None:
        opts = [(n, o) for n, o in opts if n == oname]
        if not opts:
            raise CommandError(f"no optimizer named '{oname}' (there are: {', '.join(n for n, _ in s.view.optimizers())})")
    elif len(opts) > 1:
        raise CommandError(f"{len(opts)} optimizers: say which with 'optimizer NAME' "
                           f"({', '.join(n for n, _ in opts)})", SET_USAGE)
    rows, notes = [], []
    for name, opt in opts:
        scheds = schedulers_of(opt)
        if not hold:                   # (a held value is set again after the scheduler too)
            check_scheduled(name, key, scheds)
        changed = set_hyperparameter(name, opt, key, value, group)
        rows += changed
        if key == "lr" and scheds and not hold:
            notes += follow_schedule(opt, changed, scheds)
        if hold:
            s.holds.hold(name, opt, key, value, [r[1] for r in changed], line + " --hold")
            notes.append(f"Held: {name}'s {key} is set to {value!r} again before each of its steps, whatever "
                         f"the script or a scheduler sets, until 'unset {key}'.")
        elif s.replica is None or not s.replica.replaying:
            s.hold_checks.append(HoldCheck(name, opt, key, changed, line, bool(scheds)))
    return [Table(("optimizer", "group", "hyper-parameter", "was", "now"), rows)] + notes


def _unset_arg(text):
    words = text.split()
    if not words:
        raise CommandError("unset needs a hyper-parameter", UNSET_USAGE)
    key = words.pop(0)
    opts, rest = _hyper_options(words)
    if rest:
        raise CommandError(f"unexpected '{' '.join(rest)}'", UNSET_USAGE)
    return key, opts["group"], opts["optimizer"]


def _unset(s, arg):
    key, group, oname = arg
    gone = s.holds.release(key, oname, group)
    if not gone:
        held = ", ".join(f"{n}'s {k} in group {gi}" for n, gi, k, _, _ in s.holds.held())
        raise CommandError(f"{key} is not held" + (f" (held: {held})" if held else "")
                           + f": 'set {key} VALUE --hold' holds it")
    return [f"Let go of {n}'s {key} in group {gi} (held at {v!r}): the script and its schedulers set it "
            f"again" for n, gi, v in gone]


def _py(s, text):
    if not text.strip():
        raise CommandError("py needs a statement")
    shown = []                         # an expression statement's value: shown as print shows it,
    hook = sys.displayhook             # through the front end (not on the script's stdout)
    sys.displayhook = lambda v: shown.append(v) if v is not None else None
    frame = s.frame
    before = set(frame.f_locals) if frame is not None and frame.f_locals is not frame.f_globals else None
    try:
        E.execute(text, frame, s.view.variables(frame))
    finally:
        sys.displayhook = hook
    if before is not None:
        for name in sorted((set(frame.f_locals) - before) & set(frame.f_globals)):
            s.error(f"nndb: warning: '{name}' is now a local of {frame.f_code.co_name}(), hiding the global "
                    f"'{name}' (the script reads the global: 'set var {name} VALUE' changes it)")
    return [E.safe_repr(v) for v in shown] or None


def _source_arg(text):
    t = text.strip()
    if not t:
        raise CommandError("source needs a file name")
    return t


def _source(s, path):
    from .rcfiles import read_command_file
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
It takes effect at the optimizer's next step.  An LR scheduler driving the
optimizer follows a new lr (its scale is multiplied by new/old, and it says
so); a change a scheduler would undo is refused.  When the optimizer steps
with the value set back (a script that sets param_group['lr'] itself at
every iteration, as a warmup does), the next step end says so.  --hold sets
the value again just before each step of the optimizer until 'unset HYPER'
('info optimizer' lists what is held).  'set var NAME VALUE' (or 'set NAME
VALUE' for a name that is no hyper-parameter) assigns a variable of the
script's frame: a hand-written loop's lr.  A change at a stop of the live
run is part of its history: kept in the trace, made again by every replay.""",
            _set, _set_arg, args=("hyper", "sub:group|optimizer|--hold"), group="changing",
            ranks="suffix"),
    Command("unset", UNSET_USAGE, """Let go of a hyper-parameter held by 'set HYPER VALUE --hold' (all groups, or group N).
From the optimizer's next step on, the script and its schedulers set it again.""",
            _unset, _unset_arg, args=("hyper", "sub:group|optimizer"), group="changing", ranks="suffix"),
    Command("py", "py STMT   |   !STMT", """Run a Python statement in the script's current frame (assignments stick).""",
            _py, aliases=("!",), args=("expr",), group="changing"),
    Command("source", "source FILE", "Run the commands in FILE (one per line, # comments).",
            _source, _source_arg, args=("file",), group="session"),
    Command("echo", "echo TEXT", "Print TEXT (\\n for a new line); handy in command files.",
            _echo, group="session"),
    Command("help", "help [CMD]", "List the commands, or show one command's usage and help.",
            _help, aliases=("h",), args=("command",), group="session"),
]
