"""The changes made at the live run's prompt (``set``, ``set var``, ``set
--hold``, ``unset``, ``py``): part of the run's history, so every replay of
the run makes them again where they were made.

One record for both kinds of replay: a replica resumed from a checkpoint (or
respawned) makes the session's changes at their step ends
(nndb.timetravel.roles), and across ranks the console makes its own at the
stops of the job it drives again (nndb.distributed.travel.to_step).  A replay runs
silently from step end to step end, so a change is made again at the end of
a step: one made there is made again exactly; one made inside a step (a
module's breakpoint, ``step``, ``nndb.set_trace()``) at the end of the step
before, which is the same for a setting the script does not touch in
between; one made at the start stop at the start stop of a replay that has
one (a job across ranks, driven again from its start); a fork checkpoint
holds it already, and a respawned replica, which has no start stop, cannot
make it.  A divergence after a change not made where it was made names the
change, never randomness.

What a change does is data, not text: a ``HyperChange`` (an optimizer's
hyper-parameter), a ``VarChange`` (a variable of the script's frame), a
``Release`` (``unset``) or a ``Statement`` (``py``), made by one function,
``make``: by the commands at the prompt, by a replay making the live run's
changes again, and by ``predict --set`` on its replica
(nndb.timetravel.predict).  A ``Change`` is one such edit made at a stop of
the live run: the trace keeps its line (the command as typed), a replica is
sent its edit too (``message``).
"""
from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from ..errors import CommandError
from . import evaluate as E
from .hyperparams import (HoldCheck, Shadow, check_scheduled, follow_schedule, schedule_ignores, schedulers_of,
                          set_hyperparameter)

SET_USAGE = "set HYPER VALUE [group N] [optimizer NAME] [--hold]  |  set var NAME VALUE    (e.g. set lr 1e-4)"
UNSET_USAGE = "unset HYPER [group N] [optimizer NAME]    (lets go of 'set HYPER VALUE --hold')"


# -- what a change does ---------------------------------------------------------------------
@dataclass(frozen=True)
class HyperChange:
    """``set KEY VALUE [group N] [optimizer NAME] [--hold]``: an optimizer's
    hyper-parameter set to a number (or tuple of numbers) in every param
    group, or in ``group``; ``optimizer`` None: the only one.  When ``key``
    names a variable of the script's frame instead, ``make`` assigns it (as
    ``set var``)."""
    optimizer: Optional[str]
    group: Optional[int]
    key: str
    value: Any
    hold: bool = False
    line: str = field(default="", compare=False)     # the command, as warnings quote it (without --hold)

    def __post_init__(self):
        if isinstance(self.value, list):            # (from a message: JSON has no tuples)
            object.__setattr__(self, "value", tuple(self.value))
        if not self.line:
            words = ["set", self.key, repr(self.value)]
            words += ["group", str(self.group)] if self.group is not None else []
            words += ["optimizer", self.optimizer] if self.optimizer is not None else []
            object.__setattr__(self, "line", " ".join(words))


@dataclass(frozen=True)
class VarChange:
    """``set var NAME VALUE``: a variable of the script's frame (NAME or
    NAME.ATTR) assigned VALUE, a Python expression evaluated in that frame."""
    name: str
    value: str

    @property
    def line(self) -> str:
        return f"set var {self.name} {self.value}"


@dataclass(frozen=True)
class Release:
    """``unset KEY [group N] [optimizer NAME]``: let go of a held hyper-parameter."""
    key: str
    group: Optional[int] = None
    optimizer: Optional[str] = None


@dataclass(frozen=True)
class Statement:
    """``py STMT``: a Python statement run in the script's current frame."""
    source: str


Edit = Union[HyperChange, VarChange, Release, Statement]
_KINDS = {"hyper": HyperChange, "var": VarChange, "release": Release, "statement": Statement}


def edit_as_dict(edit: Edit) -> dict:
    """An edit as a message holds it (JSON: a tuple value becomes a list)."""
    kind = next(k for k, t in _KINDS.items() if isinstance(edit, t))
    return {"kind": kind, **{f: getattr(edit, f) for f in edit.__dataclass_fields__}}


def edit_from_dict(d: dict) -> Edit:
    return _KINDS[d["kind"]](**{k: v for k, v in d.items() if k != "kind"})


def check_var(name: str, src: str) -> None:
    """``set var NAME VALUE``'s words, before anything runs: a variable name
    and an expression."""
    if not all(part.isidentifier() for part in name.split(".")):
        raise CommandError(f"'{name}' is not a variable name (NAME or NAME.ATTR)", SET_USAGE)
    E.compile_expr(src)


def hyper_value(text: str):
    """A hyper-parameter's value as typed: a number or a tuple of numbers."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        raise CommandError(f"'{text}' is not a number or tuple of numbers", SET_USAGE) from None
    if not isinstance(value, (int, float, bool, tuple)) or \
            (isinstance(value, tuple) and not all(isinstance(x, (int, float)) for x in value)):
        raise CommandError(f"'{text}' is not a number or tuple of numbers", SET_USAGE)
    return value


# -- making one ----------------------------------------------------------------------------
@dataclass
class HyperSet:
    """What a ``HyperChange`` did: [(optimizer, group, key, was, now)], one a
    group changed, and what the schedulers or a hold say about it."""
    rows: list
    notes: list


def make(s, edit: Edit):
    """Make ``edit`` in session ``s``, at its stop (the one function for the
    prompt, a replay and predict's replica).  Returns what it did: a line
    (``VarChange``), a ``HyperSet`` (or a line when the key was a variable),
    [(optimizer, group, value)] let go (``Release``), the values a
    ``Statement`` showed (or None).  A CommandError says why it could not."""
    if isinstance(edit, VarChange):
        return _set_var(s, edit.name, edit.value)
    if isinstance(edit, HyperChange):
        return _set_hyper(s, edit)
    if isinstance(edit, Release):
        return _release(s, edit)
    if isinstance(edit, Statement):
        return _run_statement(s, edit.source)
    raise TypeError(f"not a change: {edit!r}")


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


def _read_var(s, frame, name: str, is_global: bool):
    """``name``'s value in ``frame``; a global's from the frame's globals themselves (an
    expression's namespace has the frame's locals over them: a local that hides the global,
    made by 'py lr = 0.5' in a function, read as the global)."""
    if not is_global:
        return E.evaluate(E.compile_expr(name), frame, s.view.variables(frame))
    root = name.split(".")[0]
    try:
        return eval(compile(f"__g[{root!r}]" + name[len(root):], "<set>", "eval"),
                    {"__g": frame.f_globals, "__builtins__": {}})
    except Exception as e:
        raise CommandError(f"{type(e).__name__}: {e}") from None


def _set_var(s, name: str, src: str) -> str:
    frame = s.frame
    if frame is None:
        raise CommandError("set var works at a stop, in the script's frame")
    if not _has_variable(frame, name):
        raise CommandError(f"no variable '{name.split('.')[0]}' in {frame.f_code.co_name}()")
    root = name.split(".")[0]
    scope = f"global {root}; " if not _is_local(frame, root) else ""
    old = _read_var(s, frame, name, bool(scope))
    E.execute(f"{scope}{name} = ({src})", frame, s.view.variables(frame))
    new = _read_var(s, frame, name, bool(scope))
    where = "a global" if scope else f"in {frame.f_code.co_name}()"
    return f"{name} ({where}): was {E.safe_repr(old)}, now {E.safe_repr(new)}"


def _set_hyper(s, edit: HyperChange):
    key, value, group, oname, hold = edit.key, edit.value, edit.group, edit.optimizer, edit.hold
    if set_target(s, key, group, oname) == "var":
        if hold:
            raise CommandError(f"'{key}' is a variable of the script's frame: --hold holds an optimizer's "
                               f"hyper-parameter", SET_USAGE)
        return _set_var(s, key, repr(value))
    opts, notes = s.view.optimizers(), []
    if oname is not None:
        opts = s.view.optimizer_named(oname, opts)
        if not opts:
            raise CommandError(f"no optimizer named '{oname}' (there are: {', '.join(n for n, _ in s.view.optimizers())})")
        if opts[0][0] != oname:
            notes.append(f"'{oname}' is the stopped frame's, which nndb names {opts[0][0]}.")
    elif len(opts) > 1:
        raise CommandError(f"{len(opts)} optimizers: say which with 'optimizer NAME' "
                           f"({', '.join(n for n, _ in opts)})", SET_USAGE)
    rows = []
    for name, opt in opts:
        for check in [c for c in s.hold_checks if c.about(opt, key)]:
            check.stop()              # (replaced by this change: it judged the value set before)
            s.hold_checks.remove(check)
        scheds = schedulers_of(opt)
        if not hold:                   # (a held value is set again after the scheduler too)
            check_scheduled(name, key, scheds)
        # (what the schedule gives next, unchanged: against it the next step end judges the change)
        checked = not hold and (s.replica is None or not s.replica.replaying)
        unchanged = Shadow(opt, scheds) if key == "lr" and scheds and checked else None
        ahead = Shadow(opt, scheds) if key == "lr" and scheds and not hold else None
        changed = set_hyperparameter(name, opt, key, value, group)
        rows += changed
        ignored = None
        if key == "lr" and scheds and not hold:
            followed = follow_schedule(opt, changed, scheds)
            ignored = schedule_ignores(ahead, Shadow(opt, scheds), changed, scheds)
            notes += [ignored] if ignored else followed
        if hold:
            s.holds.hold(name, opt, key, value, [r[1] for r in changed], edit.line + " --hold")
            notes.append(f"Held: {name}'s {key} is set to {value!r} again before each of its steps, whatever "
                         f"the script or a scheduler sets, until 'unset {key}'.")
        elif s.replica is None or not s.replica.replaying:
            s.hold_checks.append(HoldCheck(name, opt, key, changed, edit.line, bool(scheds),
                                           (unchanged, Shadow(opt, scheds)) if unchanged is not None and not ignored
                                           else None, every_step=bool(ignored)))
    return HyperSet(rows, notes)


def _release(s, edit: Release) -> list:
    key = edit.key
    gone = s.holds.release(key, edit.optimizer, edit.group)
    if not gone:
        held = ", ".join(f"{n}'s {k} in group {gi}" for n, gi, k, _, _ in s.holds.held())
        raise CommandError(f"{key} is not held" + (f" (held: {held})" if held else "")
                           + f": 'set {key} VALUE --hold' holds it")
    return gone


def _run_statement(s, text: str) -> Optional[list]:
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


def edit_of(table, line: str) -> Optional[Edit]:
    """The edit a command line of the 'changing' group makes (``table``: the
    session's command table, which reads lines); None for another line."""
    parsed = table.parse(line)
    if parsed is None:
        return None
    value = parsed[1]
    if hasattr(value, "spec") and hasattr(value, "value"):     # (a line for some ranks: this one's)
        value = value.value
    return value if isinstance(value, (HyperChange, VarChange, Release, Statement)) else None


# -- a change made at a stop of the live run ---------------------------------------------------
@dataclass(frozen=True)
class Change:
    line: str                  # the command, as it is typed again in a replay
    step: Optional[int]        # the stop's step: the one that ended ("end"), else the one in progress
    place: str = "end"         # end: a step end | inside: inside the step | start: the start stop
    edit: Optional[Edit] = field(default=None, compare=False)    # what it does (None: read from line)

    @property
    def replay_at(self) -> Optional[int]:
        """The end of the step where a replay makes it again (None: at the start stop)."""
        if self.place == "start" or self.step is None:
            return None
        if self.place == "end":
            return self.step
        return self.step - 1 if self.step > 0 else None

    @property
    def exact(self) -> bool:
        """Made again where it was made: at its step end, or at the start stop of a replay that has one."""
        return self.place in ("end", "start")

    def where(self) -> str:
        if self.place == "start":
            return "at the start"
        if self.place == "end":
            return f"at the end of step {self.step}"
        again = self.replay_at
        return f"inside step {self.step}" + (f"; a replay makes it at the end of step {again}"
                                             if again is not None else "")

    def describe(self) -> str:
        return f"'{self.line}' (made {self.where()})"

    def as_dict(self) -> dict:
        """What the trace keeps (an event of kind "change")."""
        return {"line": self.line, "step": self.step, "place": self.place}

    def message(self) -> dict:
        """What a replica is sent: the trace's fields and the edit."""
        d = self.as_dict()
        if self.edit is not None:
            d["edit"] = edit_as_dict(self.edit)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Change":
        step = d.get("step")
        edit = edit_from_dict(d["edit"]) if d.get("edit") else None
        return cls(str(d["line"]), None if step is None else int(step), str(d.get("place", "end")), edit)


def due(changes: list, at: Optional[int]) -> list:
    """The changes a replay makes again at the stop at the end of step ``at``
    (None: the start stop), in the order they were made."""
    return [c for c in changes if c.replay_at == at]


def kept_before(changes: list, target: int) -> list:
    """The changes a replay to the end of step ``target`` passes on its way
    (made again at the start or at an earlier step end)."""
    return [c for c in changes if c.replay_at is None or c.replay_at < target]


def not_as_made(changes: list, upto: int, has_start: bool) -> list:
    """Of ``changes`` (those a replay was given), the ones it made, or could
    not make, other than where the live run made them, up to the end of step
    ``upto``; ``has_start``: the replay stops at the script's start."""
    return [c for c in changes if (c.replay_at is None or c.replay_at <= upto)
            and (c.place == "inside" or (c.place == "start" and not has_start))]
