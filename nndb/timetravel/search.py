"""Searches over the past with scan replicas: ``reverse-continue`` (the
last earlier step where a point held), ``bisect`` (the first step where an
expression held) and ``replay --verify`` (replayed statistics against the
trace, bit for bit)."""
from __future__ import annotations

import copy
import math
from typing import Optional

from .. import globs
from ..debugger import evaluate as E
from ..debugger import points as P
from ..errors import CommandError, TraceError
from ..store.reader import TraceReader
from ..schema import STAT_NAMES, series_label


def reverse_continue_target(s, machine, step: int, at_end: bool, floor: int = -1, what: str = "reverse-continue",
                            nth: Optional[int] = None):
    """The last hit before (step, at_end), after the end of step ``floor`` (reverse-step N's
    target: gdb's reverse-step stops at a breakpoint on the way): searched one checkpoint
    segment at a time, newest first.  ``nth``: inside step ``step`` + 1, the ordinal of the stop
    there (its earlier hits are searched first).  (target, then, why, skip) for
    ``TimeMachine.travel``, or None.
    Where a replica may be respawned (no fork checkpoint before a step: DataLoader
    workers alive, ``--replica respawn``), the steps before the first checkpoint are
    the last segment, replayed from the start (``replay`` respawns from step 0 anyway)."""
    if at_end and step == 0:
        return None           # (nothing is before step 0's end: a hit in its forward pass is shown there)
    cur = step + 1 if nth is not None and not at_end else None      # (the step we are inside)
    end = step if cur is None else cur
    judged = None             # the step end the newer segment judged already (its checkpoint's)
    in_steps = s is not None and any(isinstance(p, P.ModuleBreak) and p.enabled for p in s.points.values())
    starts = [] if machine.mode == "respawn" else sorted({c.step for c in machine.checkpoints.values()},
                                                         reverse=True)
    if machine.mode not in ("fork", "off"):
        starts.append(-1)
    primed = primed_watches(s, starts)
    for first in starts:
        if first > end or first == judged:
            continue
        goal = {"kind": "scan", "from": max(first, 0), "end": end, "points": True,
                "primed": primed.get(first, {})}
        res = machine.replay(s, goal, first)
        hits = [h for h in res["result"]["hits"]
                if ((h["step"] == cur and not h["at_step_end"] and h.get("nth", 0) < nth) if h["step"] == cur else
                    (h["step"] < step or (h["step"] == step and not (h["at_step_end"] and at_end))))
                and not (h["at_step_end"] and h["step"] == judged) and h["step"] > floor
                and not (at_end and step == 0 and h["step"] == 0)]      # (step 0's hits are shown at its end)
        # newest first, each crossing counted and its ignore counts spent (the live session's
        # points: 'info breakpoints' shows them after), as gdb does in reverse
        for h in reversed(hits):
            if h["points"] and s is not None and not s.points.crossed_in_reverse(
                    h["points"], at_step_end=h["at_step_end"] or h["step"] == 0):
                continue
            why = f"{what}: {', '.join(map(str, h['points'])) or 'a rule'} held" + \
                (f" on the way, short of step {floor}" if floor >= 0 else "")
            if h["at_step_end"] or h["step"] == 0:
                # (the stop at that step end is the points' hit, counted above)
                return h["step"], "stop", why + ("" if h["at_step_end"] else " in step 0 (shown at its end)"), 0
            return h["step"] - 1, "points", why, h.get("nth", 0)
        if first <= floor:
            break             # (the steps after the floor are searched)
        # With a module breakpoint, the next segment, from an older checkpoint, ends with the step of
        # this one's: its end was judged here (resumed at the checkpoint), the module breakpoints
        # inside it were not (rc from the end of step 8, a checkpoint there, never stopped in step
        # 8's forward pass)
        # (after the checkpoint at step 0, the segment of step 0 alone: its forward pass, where a module
        # breakpoint may have held, is replayed from the start in a new process where one may be
        # respawned; it said 'No earlier step' where the breakpoint held in step 0)
        end, judged = (first, first) if in_steps else (first - 1, None)
        if end < 0:
            break
    return None


def unsearched(s, machine) -> str:
    """What a search that found nothing could not look at, for its message: with ``--replica
    fork`` nothing replays what came before the oldest checkpoint (step 0's forward pass, where
    a module breakpoint may have held, with the checkpoint at step 0's end)."""
    if machine.mode != "fork" or not machine.checkpoints:
        return ""
    first = min(c.step for c in machine.checkpoints.values())
    in_steps = s is not None and any(isinstance(p, P.ModuleBreak) and p.enabled for p in s.points.values())
    if first == 0 and not in_steps:
        return ""
    return f" after the checkpoint at step {first} (what came before it cannot be replayed with --replica fork)"


def primed_watches(s, starts) -> dict:
    """{step: {number: {"band", "streak"}}}: each enabled watch's state where a scan resumed at
    the end of ``step`` starts (its arrival judges that step itself), judged over the recorded
    steps before it from step 0, as the live run judges each step end.  A scan's replica whose
    own watch judged no step (one set after its checkpoint was taken) starts from it, so that
    the watch hits where the live run's would have, wherever the checkpoints are (with one
    checkpoint a step, 'watch loss mean > 1.1' and rc stopped at every step the loss was above
    1.1, fresh in each segment; with one at step 0, only where it crossed 1.1)."""
    watches = [p for p in s.points.values() if isinstance(p, P.Watch) and p.enabled] if s is not None else []
    starts = sorted(c for c in starts if c > 0)
    if not watches or not starts:
        return {}
    out: dict = {c: {} for c in starts}
    try:
        trace = _Recorded(s)
        with trace.reader as reader:
            steps = sorted(st for st in trace.rows if st < starts[-1])
            for p in watches:
                w = P.point_from_dict(P.point_to_dict(p))
                w.reset()
                col = reader.columns.index(p.stat)
                values = {i.name: reader.column(i)[:, col].tolist() for i in reader.series() if i.kind == p.kind}
                watched = [n for n in values if globs.matches(n, p.glob)]
                if p.op is not None:
                    values = {n: values[n] for n in watched}     # (the scale is the relative rule's alone)
                pending = list(starts)
                for st in steps + [math.inf]:
                    while pending and st >= pending[0]:
                        out[pending.pop(0)][str(p.number)] = {"band": copy.deepcopy(w.band),
                                                              "streak": dict(w.streak)}
                    if not pending:
                        break
                    i = trace.rows[st]
                    row = {n: v[i] for n, v in values.items()}
                    scale = max((abs(v) for v in row.values() if math.isfinite(v)), default=0.0) \
                        if p.op is None else 0.0
                    w.check([(n, row[n]) for n in watched], scale)
    except TraceError:
        return {}
    return out


def _value_at(s, machine, expr: str, step: int):
    res = machine.replay(s, {"kind": "scan", "from": step, "end": step, "exprs": [expr]}, step)
    return _values(res).get(step)


def _values(res: dict) -> dict:
    out = {}
    for step, _src, value, err in res["result"]["values"]:
        if err is not None:
            raise CommandError(f"bisect: at step {step}: {err}")
        out[step] = value
    return out


def bisect(s, machine, expr: str) -> str:
    """The first step where ``expr`` became true, searched from the live run's
    stop at a step end, or after the run ended (from its last step, as goto)."""
    if machine.replica:
        raise CommandError("bisect searches the live run's past: 'present' first")
    if s.last_step is None:
        raise CommandError("no step has finished yet")
    here = s.last_step
    if s.control.state == "live":
        if s.here.stop is None or not s.here.stop.at_step_end:
            raise CommandError("bisect starts from a stop at a step end of the live run")
        now = E.evaluate(E.compile_expr(expr), s.frame, s.view.variables(s.frame, step_end=True))
    else:                                   # the run is over: its last step is read on a replica
        E.compile_expr(expr)
        now = _value_at(s, machine, expr, here)
    if not now:
        return f"{expr} is false at the current step {here}: nothing to bisect."
    cks = sorted({c.step for c in machine.checkpoints.values() if c.step < here})
    probes = 0
    lo, hi = -1, len(cks)            # false before cks[0] is assumed, true at the present
    if cks:
        probes += 1
        if _value_at(s, machine, expr, cks[0]):
            if cks[0] == 0:
                return f"{expr} is already true at step 0 (1 probe)."
            hi = 0
        else:
            lo = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        probes += 1
        if _value_at(s, machine, expr, cks[mid]):
            hi = mid
        else:
            lo = mid
    start = cks[lo] if lo >= 0 else None
    end = cks[hi] if hi < len(cks) else here
    if start is None:
        if machine.mode == "fork":
            return f"{expr} is true at step {end}, the earliest checkpoint ({probes} probe(s))."
        start_step = 0
    else:
        start_step = start + 1
    if end - (start_step - 1) <= 1 and start is not None:
        return f"{expr} first became true at step {end} ({probes} probe(s), no replay needed)."
    res = machine.replay(s, {"kind": "scan", "from": start_step, "end": end, "exprs": [expr]},
                         start if start is not None else -1)
    values = _values(res)
    first = next((st for st in sorted(values) if values[st]), end)
    replayed = end - (start if start is not None else -1)
    return (f"{expr} first became true at step {first} ({probes} probe(s) at checkpoints, "
            f"{replayed} step(s) replayed).  'goto {first}' goes there.")


class _Recorded:
    """The recorded statistics of steps, from the trace through the live
    writer (its unflushed rows too): the step index is read once."""

    def __init__(self, s):
        # (the live run's writer while it writes; the closed trace after the run)
        w = s.rec.writer if s.rec is not None else None
        self.reader = TraceReader.from_writer(w) if w is not None and not w.closed else TraceReader(s.log.trace_path)
        self.rows = {int(st): i for i, st in enumerate(self.reader.steps)}   # (the last row of a step)

    def step(self, step: int) -> dict:
        """{(name, kind): stats row} of one step ({} if it was not recorded)."""
        i = self.rows.get(step)
        if i is None:
            return {}
        return {nk: [float(x) for x in vals] for nk, vals in self.reader.row(i).items()}


def recorded_losses(s, first: int, last: int) -> dict:
    """{step: [[loss series, recorded mean or None], ...]} of the recorded
    steps in [first, last]: what a replay of them must give again."""
    if last < first or (s.rec is None and not s.log.trace_path):
        return {}
    out: dict = {}
    try:
        with _Recorded(s).reader as reader:
            for info in reader.series():
                if info.kind != "loss":
                    continue
                steps, values = reader.history(info, "mean")
                for st, v in zip(steps, values):
                    if first <= st <= last:      # (a step's last row wins, as in the record)
                        out.setdefault(str(int(st)), {})[info.name] = None if math.isnan(v) else float(v)
    except TraceError:
        return {}                           # (nothing to check against: the replay is not checked)
    return {st: sorted(d.items()) for st, d in out.items()}


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def verify(s, machine, rng) -> list:
    if machine.replica:
        raise CommandError("replay --verify checks the live run's trace: 'present' first")
    if s.last_step is None:
        raise CommandError("no step has finished yet")
    first_ck = min((c.step for c in machine.checkpoints.values()), default=0)
    lo, stop = rng if rng is not None else (None, None)
    lo = first_ck if lo is None else lo
    hi = s.last_step if stop is None else stop - 1          # A:B is A..B-1, as --steps and --lineage
    shown = f"{lo}:{hi + 1}"
    if hi < lo:
        raise CommandError(f"the range {shown} is empty")
    if hi > s.last_step:
        raise CommandError(f"step {hi} has not run yet (the present is step {s.last_step})")
    if lo < 0:
        raise CommandError("step numbers start at 0")
    ck = machine.nearest(lo)
    # one step past the range where there is one: a hand-written loop closes step N's record at N+1's end
    res = machine.replay(s, {"kind": "scan", "from": lo, "end": min(hi + 1, s.last_step), "stats": True}, lo)
    compared = steps = 0
    trace = _Recorded(s)
    for step, rows in res["result"]["stats"]:
        if not lo <= step <= hi:
            continue
        recorded = trace.step(step)
        if not recorded:
            continue
        steps += 1
        for name, kind, vals, nans in rows:
            want = recorded.get((name, kind))
            if want is None:
                return [f"replay --verify {shown}: first divergence at step {step}: "
                        f"{series_label(name, kind)} was not recorded in the trace"]
            got = [math.nan if v is None else v for v in vals]
            for col, (a, b) in enumerate(zip(want, got)):
                compared += 1
                if not _same(a, b):
                    stat = STAT_NAMES[col] if col < len(STAT_NAMES) else str(col)
                    return [f"replay --verify {shown}: first divergence at step {step}: {series_label(name, kind)} "
                            f"{stat}: recorded {a!r}, replayed {b!r}"]
    src = f"the checkpoint at step {ck.step}" if ck is not None else "the start"
    if res.get("ended"):
        return [f"replay --verify {shown}: the replay ended early ({res['ended']}) after {steps} step(s) "
                "matched"]
    if compared == 0:                       # nothing compared is no evidence of anything
        raise CommandError(f"replay --verify {shown}: nothing to compare: no replayed step of the range has "
                           "a record in the trace (the steps were not recorded, or their records are "
                           "still open)")
    return [f"replay --verify {shown}: {steps} step(s) replayed from {src}: identical to the trace, "
            f"bit for bit ({compared} values)"]
