"""Breakpoints and watchpoints: plain objects the session checks at stop points.

A *point* has gdb's bookkeeping (number, disposition, enabled, hit count,
ignore count, condition, commands) and one of three triggers:

* ``StepBreak``: step N has just finished;
* ``ModuleBreak``: a module whose name matches a glob is about to run its
  forward (or its backward: the gradient of its output has just been computed);
* ``ExprBreak``: a Python expression is true at a step end;
* ``Watch``: a recorded statistic of the tensors matching a glob crosses a
  threshold, or its smoothed value leaves [1/100, 50] times a slowly following
  baseline (nndb.debugger.watchband), possibly K steps in a row.

Parsing lives here too (``parse_break``, ``parse_watch``), so the grammar and
the objects cannot drift apart.  Parse errors raise ``CommandError``.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import fnmatch
import math
import operator
from dataclasses import dataclass, field
from typing import Optional

from .. import globs
from ..errors import CommandError
from ..schema import KIND_WORDS, STAT_NAMES as STATS, default_stat
from . import watchband
from .evaluate import compile_expr
# The statistics measured at every recorded step (the others only at full
# steps); a watch on any other makes the session measure everything.
BASIC_STATS = ("count", "norm", "nan_count", "inf_count")
WATCH_KINDS = KIND_WORDS
OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
       "==": operator.eq, "!=": operator.ne}

BREAK_USAGE = "break step N | break module GLOB [forward|backward] | break if EXPR  [fail] [if EXPR]"
WATCH_USAGE = ("watch KIND GLOB [STAT] [OP VALUE] [consecutive K] [always] [fail]   "
               "(KIND: grad weight update act loss)")


@dataclass
class Point:
    number: int
    temporary: bool = False          # tbreak: deleted after its first stop
    enabled: bool = True
    hits: int = 0
    ignore_count: int = 0
    condition: Optional[str] = None  # source text; compiled by the session
    commands: list = field(default_factory=list)
    silent: bool = False             # the first line of `commands` was `silent`
    fail: bool = False               # the `fail` action: the run fails with exit 4

    type_name = "breakpoint"

    @property
    def disp(self) -> str:
        return "del" if self.temporary else "keep"

    def what(self) -> str:
        raise NotImplementedError


@dataclass
class StepBreak(Point):
    step: int = 0

    def what(self) -> str:
        return f"step {self.step}"


@dataclass
class ModuleBreak(Point):
    glob: str = "*"
    phase: str = "forward"           # forward | backward

    def what(self) -> str:
        return f"module {self.glob} {self.phase}"

    def matches(self, name: str) -> bool:
        return globs.matches(name, self.glob)


@dataclass
class ExprBreak(Point):
    expr: str = "True"

    def what(self) -> str:
        return f"if {self.expr}"


@dataclass
class CatchPoint(Point):
    """``catch nan|inf|nonfinite``: the first operation (forward, backward or the
    optimizer's) whose output is not finite while its inputs were; for ``nan``,
    an output with NaN while no input had one.  Found at the end of the step
    that made it, by a replay of that step (nndb.lineage.catchstep), or with
    ``eager`` inside the operation, every operation being checked as the run goes."""
    what_kind: str = "nonfinite"
    eager: bool = False

    type_name = "catchpoint"

    def what(self) -> str:
        return f"catch {self.what_kind}" + (" --eager" if self.eager else "")

    def matches(self, info: dict) -> bool:
        finite_in = not (info["in_nan"] or info["in_inf"])
        if self.what_kind == "nan":
            return info["nan"] and not info["in_nan"]
        if self.what_kind == "inf":
            return info["inf"] and finite_in
        return finite_in


@dataclass
class Watch(Point):
    kind: str = "grad"               # a trace kind: param grad update act loss
    label: str = "grad"              # as the user wrote it (weight -> param)
    glob: str = "*"
    stat: str = "norm"
    op: Optional[str] = None
    value: Optional[float] = None
    consecutive: int = 1
    always: bool = False             # level-triggered: a hit every K steps while the condition holds
    band: dict = field(default_factory=dict)       # the relative rule's state (nndb.debugger.watchband)
    streak: dict = field(default_factory=dict)     # series name -> consecutive steps true
    # [step, detail or None]: the last step judged and its answer; judged again (a checkpoint
    # taken at that step's stop, resumed by a reverse search, checks its step end once more),
    # the same answer, the streak not counted twice (rc from a watch's second hit found no
    # first one: resumed at the first's stop, the streak went 1 -> 2, no hit)
    checked: list = field(default_factory=list)
    # the same for the series a hand-written loop's step has only with its record, at the
    # next step's end: clip_grad_norm_'s total, which the script computes after backward()
    checked_late: list = field(default_factory=list)

    type_name = "watchpoint"

    def what(self) -> str:
        s = f"{self.label} {self.glob} {self.stat}"
        if self.op is not None:
            s += f" {self.op} {self.value:g}"
        else:
            s += " " + watchband.describe()
        if self.consecutive > 1:
            s += f" consecutive {self.consecutive}"
        if self.always:
            s += " always"
        return s

    def reset(self) -> None:
        """A new run: no baseline, no streak."""
        self.band.clear()
        self.streak.clear()
        self.checked.clear()
        self.checked_late.clear()

    def series(self, names) -> list:
        """The (name, kind) pairs of ``names`` this watch looks at."""
        return [(n, k) for n, k in names if k == self.kind and globs.matches(n, self.glob)]

    def _holds(self, name: str, value: float, scale: float):
        """None: the condition does not hold for this series at this step;
        else the detail it adds (the band's numbers, for the relative rule)."""
        if self.op is not None:
            return {} if OPS[self.op](value, self.value) else None
        return watchband.Band(self.band).judge(name, value, scale)

    def check(self, rows, scale: float = 0.0) -> Optional[dict]:
        """``rows``: [(name, value)] of the matching series at one step
        (``scale``: the largest finite |value| of the statistic among all
        series of the kind, for the relative rule's numerically-zero test).
        Edge-triggered, like gdb's watchpoints: a series hits when its
        condition has held for ``consecutive`` steps in a row, and again only
        after the condition was false at some step; ``always`` hits every
        ``consecutive`` steps while it holds.  Returns the detail of the first
        series that hits (the others that hit at that step under "also"), or
        None."""
        hits = []
        for name, value in rows:
            if math.isnan(value):
                continue            # not measured at this step: the streak neither grows nor breaks
            extra = self._holds(name, value, scale)
            if extra is None:
                self.streak[name] = 0
                continue
            n = self.streak.get(name, 0) + 1
            self.streak[name] = 0 if self.always and n >= self.consecutive else n
            if n == self.consecutive or (self.always and n >= self.consecutive):
                hits.append((name, value, extra))
        if not hits:
            return None
        name, value, extra = hits[0]
        hit = {"tensor": name, "kind": self.kind, "stat": self.stat, "value": value}
        if self.op is not None:
            hit["op"], hit["threshold"] = self.op, self.value
        hit.update(extra)
        if len(hits) > 1:
            hit["also"] = [h[0] for h in hits[1:]]
        return hit

    def take_zero_notes(self) -> list:
        """[(name, baseline)] of the series newly found numerically zero (said once)."""
        return watchband.Band(self.band).take_new_zero() if self.op is None else []


_PORTABLE = {cls.__name__: cls for cls in (StepBreak, ModuleBreak, ExprBreak, Watch, CatchPoint)}


def is_portable(p: Point) -> bool:
    """A point a replica can take over (as plain data)."""
    return type(p).__name__ in _PORTABLE


def point_to_dict(p: Point) -> dict:
    d = dataclasses.asdict(p)
    d["type"] = type(p).__name__
    return d


def point_from_dict(d: dict) -> Optional[Point]:
    d = dict(d)
    cls = _PORTABLE.get(d.pop("type", ""))
    return cls(**d) if cls is not None else None


class Points(collections.abc.Mapping):
    """The session's points by number (a mapping: ``points[n]``, ``n in
    points``, ``points.values()``) and its displays, each numbered apart as
    gdb does.  ``on_change`` is called when a point is added (the session
    installs the tracer callbacks the points need).  What passes between the
    live run and a replica is ``snapshot()``, plain JSON-able data; gdb does
    not roll breakpoints back, so ``restore`` takes the other process's points
    but keeps this process's own watch baselines."""

    def __init__(self, on_change=None):
        self._by_number: dict = {}           # number -> Point
        self.numbered = self._by_number      # (the same dict: ``not points.numbered`` at every step end, no call)
        self._next_number = 1
        # bumped by every change of which points there are or are enabled: what is read at
        # every step end from them (the catch points) is kept while it stands
        self.version = 0
        self.displays: list = []             # [(number, expr source, code)]
        self._next_display = 1
        self._on_change = on_change

    def __getitem__(self, number: int) -> Point:
        return self._by_number[number]

    def __iter__(self):
        return iter(self._by_number)

    def __len__(self) -> int:
        return len(self._by_number)

    def pop(self, number: int, default=None):
        self.version += 1
        return self._by_number.pop(number, default)

    def enable(self, p: Point, on: bool) -> None:
        """Enable (or disable) ``p``."""
        p.enabled = on
        self.version += 1

    def add(self, cls, fields: dict, condition: Optional[str] = None, temporary: bool = False,
            fail: bool = False) -> Point:
        """A new point of class ``cls`` (its own ``fields``), numbered next."""
        if condition is not None:
            compile_expr(condition)
        p = cls(number=self._next_number, temporary=temporary, condition=condition, fail=fail, **fields)
        self._next_number += 1
        self._by_number[p.number] = p
        self.version += 1
        if self._on_change is not None:
            self._on_change()
        return p

    def by_number(self, number: int) -> Point:
        p = self._by_number.get(number)
        if p is None:
            raise CommandError(f"no breakpoint number {number}")
        return p

    def crossed_in_reverse(self, numbers, at_step_end: bool = True) -> bool:
        """``reverse-continue`` crossed a place where these points held (their
        conditions true): as gdb counts a crossing whichever way it runs, each
        counts a hit and an ignore count swallows it (the newest crossing first).
        True if one of them stops the run there; then, at a step end, a temporary
        one (``tbreak``) that stops is deleted.  (Inside a step the replica stops
        at the point itself and counts that hit there.)"""
        stopping = []
        for number in numbers:
            p = self._by_number.get(number)
            if p is None:
                continue
            if p.ignore_count > 0:
                p.hits += 1
                p.ignore_count -= 1
                continue
            stopping.append(p)
        if at_step_end:
            for p in stopping:
                p.hits += 1
                if p.temporary:
                    self.pop(p.number)
        return bool(stopping)

    def new_display(self, src: str, code) -> int:
        number = self._next_display
        self._next_display += 1
        self.displays.append((number, src, code))
        return number

    def catch_points(self) -> list:
        """The enabled catch points (the lineage recorder runs for them)."""
        return [p for p in self._by_number.values() if isinstance(p, CatchPoint) and p.enabled]

    def new_run(self, replica: bool = False) -> None:
        """A run starts: gdb counts the hits of each run; watches start afresh.
        A respawned replica (the script run again from its start to replay the
        past) is no new run: its points keep the hits the live run counted
        (they come back with the replica's state; they were zeroed, and
        ``info breakpoints`` read 0 hits after a travel that went back to the
        present), while its watches start afresh, as its steps do."""
        for p in self._by_number.values():
            if not replica:
                p.hits = 0
            if isinstance(p, Watch):
                p.reset()

    def snapshot(self) -> dict:
        return {
            "points": [point_to_dict(p) for p in self._by_number.values() if is_portable(p)],
            "next_number": self._next_number,
            "displays": [[n, src] for n, src, _ in self.displays],
            "next_display": self._next_display,
        }

    def restore(self, state: dict) -> None:
        mine = dict(self._by_number)
        self.version += 1
        # (in place: ``numbered`` is the same dict)
        self._by_number.clear()
        self._by_number.update((p.number, p) for p in map(point_from_dict, state.get("points", [])) if p is not None)
        for n, p in self._by_number.items():
            if isinstance(p, Watch):
                # a watch's streaks and baselines belong to this process's own
                # steps (a replica replays the past): keep ours, or start afresh
                old = mine.get(n)
                if isinstance(old, Watch) and old.what() == p.what():
                    p.band, p.streak, p.checked, p.checked_late = old.band, old.streak, old.checked, old.checked_late
                else:
                    p.streak.clear()
                    p.checked.clear()
                    p.checked_late.clear()
        self._next_number = max(self._next_number, int(state.get("next_number", 1)))
        self.displays = []
        for n, src in state.get("displays", []):
            try:
                self.displays.append((n, src, compile_expr(src)))
            except CommandError:
                pass
        self._next_display = max(self._next_display, int(state.get("next_display", 1)))


def split_action(text: str) -> tuple[str, bool]:
    """Strip a trailing ``fail`` action word."""
    t = text.rstrip()
    if t == "fail" or t.endswith((" fail", "\tfail")):
        return t[:-4].rstrip(), True
    return t, False


def split_condition(text: str) -> tuple[str, Optional[str]]:
    """``SPEC if EXPR`` -> (SPEC, EXPR)."""
    words = text.split(None, 1)
    if words and words[0] == "if":
        return "", (words[1].strip() if len(words) > 1 else "")
    i = text.find(" if ")
    if i < 0:
        return text.strip(), None
    return text[:i].strip(), text[i + 4:].strip()


def parse_break(text: str) -> tuple[type, dict, Optional[str], bool]:
    """-> (point class, its fields, condition, fail)."""
    text, fail = split_action(text)
    spec, cond = split_condition(text)
    if cond == "":
        raise CommandError("'if' needs an expression", BREAK_USAGE)
    words = spec.split()
    if not words:
        if cond is None:
            raise CommandError("break what?", BREAK_USAGE)
        expr, cond = _split_expr_condition(cond)
        return ExprBreak, {"expr": expr}, cond, fail
    if words[0] == "step":
        if len(words) != 2:
            raise CommandError("break step needs one step number", BREAK_USAGE)
        n = parse_int(words[1], "step")
        if n < 0:
            raise CommandError(f"step numbers start at 0, not {n}", BREAK_USAGE)
        return StepBreak, {"step": n}, cond, fail
    if words[0] == "module":
        if len(words) not in (2, 3):
            raise CommandError("break module needs a module name or glob", BREAK_USAGE)
        phase = words[2] if len(words) == 3 else "forward"
        if phase not in ("forward", "backward"):
            raise CommandError(f"'{phase}' is neither forward nor backward", BREAK_USAGE)
        return ModuleBreak, {"glob": words[1], "phase": phase}, cond, fail
    w = words[0]
    if w.isdigit() or (":" in w and w.rpartition(":")[2].isdigit()) or w.isidentifier():
        # pdb's and gdb's 'break LINE', 'break FILE:LINE', 'break FUNCTION': nndb has none
        step = f"'break step {w}' stops when training step {w} has finished; " if w.isdigit() else ""
        raise CommandError(f"cannot break on '{w}': nndb breaks at training steps and module calls, not at "
                           f"source lines or functions ({step}to stop at a line, put nndb.set_trace() "
                           f"there)", BREAK_USAGE)
    raise CommandError(f"cannot break on '{w}'", BREAK_USAGE)


def _split_expr_condition(text: str) -> tuple[str, Optional[str]]:
    """``break if A if B``: (A, B), at the last " if " that leaves two valid
    expressions, when the whole is not one (Python's ``x if c else y`` is)."""
    from .evaluate import with_dollars

    def valid(src: str) -> bool:
        try:
            compile(with_dollars(src), "<nndb>", "eval")
            return True
        except Exception:
            return False

    if valid(text):
        return text, None
    i = text.rfind(" if ")
    while i > 0:
        a, b = text[:i].strip(), text[i + 4:].strip()
        if a and b and valid(a) and valid(b):
            return a, b
        i = text.rfind(" if ", 0, i)
    return text, None


def parse_int(word: str, what: str) -> int:
    try:
        return int(word, 0)
    except ValueError:
        raise CommandError(f"{what} must be an integer, not '{word}'") from None


def parse_float(word: str, what: str) -> float:
    try:
        return float(word)
    except ValueError:
        raise CommandError(f"{what} must be a number, not '{word}'", WATCH_USAGE) from None


def did_you_mean(word: str, choices) -> str:
    near = difflib.get_close_matches(word, list(choices), n=1)
    return f"did you mean {near[0]}? " if near else ""


def _unknown(what: str, word: str, choices) -> CommandError:
    return CommandError(f"unknown {what} '{word}' ({did_you_mean(word, choices)}one of: {', '.join(choices)})",
                        WATCH_USAGE)


def _could_name_a_loss(word: str) -> bool:
    """Loss series are named "loss" or "loss/OPTIMIZER": in ``watch loss WORD``,
    a WORD that can match none of them is not a glob but a misspelt statistic."""
    return word.startswith("loss") or fnmatch.fnmatchcase("loss", word) or any(c in word for c in "*?[")


_KEYWORDS = ("consecutive", "always")


def parse_watch(text: str) -> dict:
    """-> the fields of a Watch (and ``fail``)."""
    text, fail = split_action(text)
    words = text.split()
    if not words:
        raise CommandError("watch what?", WATCH_USAGE)
    label = words.pop(0)
    if label not in WATCH_KINDS:
        raise _unknown("kind", label, WATCH_KINDS)
    kind = WATCH_KINDS[label]
    glob = "*"
    if words and not (kind == "loss" and (words[0] in STATS or words[0] in OPS or words[0] in _KEYWORDS)):
        if kind == "loss" and not _could_name_a_loss(words[0]):
            raise _unknown("statistic", words[0], STATS)
        glob = words.pop(0)
    elif kind != "loss":
        raise CommandError(f"watch {label} needs a tensor name or glob", WATCH_USAGE)
    stat = default_stat(kind)
    if words and words[0] in STATS:
        stat = words.pop(0)
    elif words and words[0] not in OPS and words[0] not in _KEYWORDS:
        raise _unknown("statistic", words[0], STATS)
    op = value = None
    if words and words[0] in OPS:
        op = words.pop(0)
        if not words:
            raise CommandError(f"'{op}' needs a value", WATCH_USAGE)
        value = parse_float(words.pop(0), "the value")
    consecutive = 1
    if words and words[0] == "consecutive":
        words.pop(0)
        if not words:
            raise CommandError("'consecutive' needs a count", WATCH_USAGE)
        consecutive = parse_int(words.pop(0), "the count")
        if consecutive < 1:
            raise CommandError("the count must be at least 1", WATCH_USAGE)
    always = bool(words) and words[0] == "always"
    if always:
        words.pop(0)
    if words:
        raise CommandError(f"unexpected '{' '.join(words)}'", WATCH_USAGE)
    return {"kind": kind, "label": label, "glob": glob, "stat": stat, "op": op, "value": value,
            "consecutive": consecutive, "always": always, "fail": fail}
