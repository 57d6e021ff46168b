"""``catch nan`` at the cost of one check a step: the step-end catch.

A catch point is armed in one of two ways:

* at the step end (the default, where a replica can replay a step): the
  step's record already holds the NaN and Inf counts of the loss, of every
  parameter, gradient and update (and of the activations on the steps they
  are recorded), so "did this step make a non-finite value" costs one count
  of the record's rows.  A step where a series went non-finite that was
  finite until then (since the last all-finite record) is replayed on a
  replica with the op recorder's NaN/Inf checks on, and the replay's
  *events* (the operations that made a non-finite value, nndb.lineage.ops)
  become the catch point's hits, reported at the end of that step;
* eagerly (``catch nan --eager``, and wherever no replay is possible: in a
  replica, with ``--replica off``): every operation's output is checked as the
  run goes and the run stops inside the operation (LineageControl).

Both build a hit's detail with ``catch_detail``, so the two report the same
operation, module, source line and step.  Plain functions and one small
class; the replay itself is passed in (this package cannot drive one).
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ..errors import CommandError
from ..schema import series_label
from ..tracer.stats import NONFINITE_FIELDS
from .oprecord import FILE, LINE, MODULE, NODE, OP, PHASE, op_name

# replay(step) -> the step's lineage dict (with "ops" and "events"), NaN/Inf-checked;
# raises CommandError when the step cannot be replayed
Replay = Callable[[int], dict]

SHOWN_SERIES = 4        # the non-finite series named in a stop that could not locate its operation


def where(op) -> dict:
    """What a catch stop reports of an operation: its name, phase, module and source line."""
    return {"op": op_name(op), "overload": op[OP], "phase": op[PHASE], "module": op[MODULE],
            "file": op[FILE], "line": op[LINE], "node": op[NODE]}


_PLACE = ("op", "phase", "module", "file", "line", "node")


def inputs_of(ops: list, inputs: Optional[list]) -> list:
    """An event's inputs as a stop shows them: ``from`` (the index of the operation that
    made an input's NaN/Inf, ``StepLineage.provenance``) becomes where that operation is."""
    out = []
    for d in inputs or ():
        if isinstance(d.get("from"), int) and 0 <= d["from"] < len(ops):
            d = dict(d, **{"from": {k: v for k, v in where(ops[d["from"]]).items() if k != "overload"}})
        out.append(d)
    return out


def catch_detail(ops: list, step: int, idx: int, info: dict) -> dict:
    """A catch hit's detail for the operation ``idx`` of a step (``info``: what
    the op recorder noted of it).  ``inputs`` are always ``op``'s: for a NaN
    made from an Inf, ``op`` is the operation that made the Inf (its inputs,
    where the step's events kept them) and ``via`` the one that turned it into
    NaN, with its own ``inputs``, each saying where its NaN/Inf began."""
    detail = dict(where(ops[idx]), step=step, nan=info["nan"], inputs=inputs_of(ops, info["inputs"]))
    if info.get("numbers"):
        detail["numbers"] = info["numbers"]
    if info.get("entered") is not None:       # (a NaN no operation of the step made: where it came in)
        detail.update(entered=info["entered"], label=info.get("label"))
    if info.get("origin") is not None or info.get("origin_entered") is not None:
        # a NaN from an Inf: the operation that made the Inf is where it began (or, where
        # no operation of the step made it, the operation it came into the step with)
        detail["via"] = {k: detail.pop(k) if k in ("inputs", "numbers") else detail[k]
                         for k in (*_PLACE, "inputs", "numbers") if k in detail}
        if info.get("origin") is not None:
            detail.update(where(ops[info["origin"]]), nan=False)
            if info.get("origin_inputs") is not None:
                detail["inputs"] = inputs_of(ops, info["origin_inputs"])
            if info.get("origin_numbers"):
                detail["numbers"] = info["origin_numbers"]
        else:
            at, position = info["origin_entered"]
            detail.update(where(ops[at]), nan=False, entered=position, label=info.get("origin_label"))
    return detail


def first_inf(ops: list, step: int, events: list) -> Optional[dict]:
    """Where the first Inf of a step's ``events`` was made from finite inputs
    (``where`` and ``step``), or None: kept while the run stays non-finite, so
    that a NaN made in a later step from that Inf is traced to it.  An Inf the
    step absorbed (a causal mask's -inf in the softmax) is none."""
    for idx, info in events:
        if info.get("inf") and not (info.get("in_nan") or info.get("in_inf")) and info.get("entered") is None \
                and not info.get("absorbed"):
            return dict(where(ops[int(idx)]), step=step, inputs=inputs_of(ops, info.get("inputs")),
                        **({"numbers": info["numbers"]} if info.get("numbers") else {}))
    return None


def from_earlier_inf(detail: dict, info: dict, inf: Optional[dict]) -> dict:
    """A NaN an operation made from an Inf that no operation of its step made
    (a parameter an earlier step's update made Inf): the stop names the
    operation that made the run's first Inf, in its step (``inf``:
    ``first_inf`` of that step), with ``via`` for the one that turned it into
    NaN, and its step, as for an Inf made in the same step."""
    if inf is None or info.get("origin") is not None or not info.get("nan") or info.get("in_nan") \
            or not info.get("in_inf") or info.get("entered") is not None or inf["step"] >= detail["step"]:
        return detail
    # (where the Inf came into the step, catch_detail's origin_entered, a weight the earlier
    # step's update made Inf, gives way to the operation that made the run's first Inf)
    via = dict(detail.get("via") or {k: detail[k] for k in (*_PLACE, "inputs", "numbers") if k in detail},
               step=detail["step"])
    kept = {k: v for k, v in detail.items() if k not in ("entered", "label", "inputs", "numbers")}
    return dict(kept, **inf, via=via, nan=False)


def hits_from_events(points: list, data: dict, step: int, accept: Callable, inf: Optional[dict] = None) -> list:
    """[(point, detail)] of the replayed step's events, in the order the
    operations ran; ``accept(point, detail)`` is the session's hit test
    (condition, ignore count); ``inf``: where the run's first Inf was made, in
    an earlier step (``from_earlier_inf``)."""
    hits = []
    ops = data.get("ops", [])
    hit = set()           # (an operation is a point's hit once a step: the same op of each
    #                        micro-batch of an accumulating step is not a hit of its own)
    forward = set()       # (op, file, line, nan) of the forward's hits: the same source line run
    #                        again in the backward is its recomputation (activation checkpointing
    #                        runs a block's forward again there), not a second source
    for idx, info in data.get("events", []):
        if info.get("absorbed"):
            # (its NaN/Inf ended within the step: a causal mask's -inf that the softmax took,
            # made at every step; the step-end catch looks for what reached the step's record)
            continue
        for p in points:
            if not p.matches(info):
                continue
            detail = dict(from_earlier_inf(catch_detail(ops, step, int(idx), info), info, inf), located="replay")
            key = (id(p), *(detail.get(k) for k in ("op", "phase", "module", "file", "line", "nan")))
            if recomputed(p, detail, forward):
                continue
            if key not in hit and accept(p, detail):
                hits.append((p, detail))
                hit.add(key)
    return hits


def recomputed(point, detail: dict, forward: set) -> bool:
    """Is this hit of ``point`` the backward's recomputation of an operation
    the forward made the non-finite value with (the same operation at the
    same source line: activation checkpointing, ``torch.utils.checkpoint``,
    runs a block's forward again in the backward)?  ``forward`` collects the
    forward's hits of the step as they are asked about."""
    line = (id(point), *(detail.get(k) for k in ("op", "file", "line", "nan")))
    if detail.get("phase") == "forward":
        forward.add(line)
        return False
    return detail.get("phase") == "backward" and detail.get("file") is not None and line in forward


def unseen_before(cadence, step: int) -> Optional[dict]:
    """The steps right before the recorded ``step`` that were not recorded
    (``--every``, ``--steps``): no record, so the step-end catch looked at
    none of them; a non-finite value made there is found first at ``step``.
    {"first", "last", "flag"}, or None."""
    every, start = getattr(cadence, "every", 1), getattr(cadence, "start", 0)
    if every > 1 and step - every >= start:
        return {"first": step - every + 1, "last": step - 1, "flag": f"--every {every}"}
    if step == start and start > 0:
        return {"first": 0, "last": start - 1, "flag": f"--steps {start}:"}
    return None


def _with_unseen(hits: list, unseen: Optional[dict]) -> list:
    if unseen is not None:
        for _, detail in hits:
            detail["unseen"] = unseen
    return hits


def _wanted(p, nan: bool, inf: bool) -> bool:
    return {"nan": nan, "inf": inf}.get(p.what_kind, nan or inf)


class StepEndCatch:
    """The step-end catch of one run: which series have been non-finite
    since the last all-finite record (a NaN that spreads step after step is
    looked for once, where it began)."""

    def __init__(self):
        # series -> [NaN seen, Inf seen] since the last all-finite record: a series that was
        # Inf and now holds NaN (a diverging run's usual end) is new for a NaN catch
        self.bad: dict = {}
        # steps already looked for (a hand-written loop's step is checked at its end, as far as
        # it is known, and again when its record closes a step later: replayed once)
        self.judged: list = []
        # where the run's first Inf was made (first_inf), since the last all-finite record
        self.inf: Optional[dict] = None

    def reset(self) -> None:
        self.bad = {}
        self.judged = []
        self.inf = None

    def _newly_nonfinite(self, record, bufs: list) -> list:
        """[(series, nan, inf)] of the record's series (and ``bufs``, the model's
        buffers) that hold a NaN or Inf they did not hold since the last
        all-finite record; the bookkeeping follows."""
        # (record.nonfinite, inline: every step end while a catch point is armed)
        if not np.count_nonzero(record.raw[:, NONFINITE_FIELDS]) and not bufs:
            self.bad = {}
            self.inf = None
            return []
        flags = record.raw[:, NONFINITE_FIELDS] > 0
        rows = np.flatnonzero(flags.any(axis=1))
        now = [(record.names[i], bool(flags[i, 0]), bool(flags[i, 1])) for i in rows] + list(bufs)
        bad = self.bad
        new = []
        for name, nan, inf in now:
            seen = bad.get(name)
            if seen is None or (nan and not seen[0]) or (inf and not seen[1]):
                new.append((name, nan, inf))
            bad[name] = [nan or (seen is not None and seen[0]), inf or (seen is not None and seen[1])]
        return new

    def missed(self, record, buffers: Callable[[], list] = lambda: []) -> Optional[dict]:
        """The script raised inside the step of ``record`` (partial): that step
        has no end for the catch to look at, and time travel cannot replay a
        step that raised, so no operation can be named; where the step went
        non-finite, {"step", "series", "more_series"} for the one line that
        says so (else None)."""
        if record is None or not record.partial or record.step in self.judged:
            return None
        new = self._newly_nonfinite(record, buffers())
        if not new:
            return None
        series = [series_label(n, k) for (n, k), _, _ in new]
        return {"step": record.step, "series": series[:SHOWN_SERIES],
                "more_series": max(0, len(series) - SHOWN_SERIES)}

    def check(self, record, catching: Callable[[], list], replay: Optional[Replay], accept: Callable,
              buffers: Callable[[], list] = lambda: [], points: Optional[list] = None, cadence=None) -> list:
        """The hits for a record handed on at a step end: as in
        ``hits_from_events``, or, where the replay failed or found no
        operation that made the value from finite inputs (a NaN in the batch),
        one hit per point saying so, at this step's end.
        ``catching()``: the catch points (asked again after the replay, which
        may hand the session's points back as new objects).  ``buffers()``:
        [((name, "buffer"), nan, inf)] of the model's buffers that are not
        finite (BatchNorm's running statistics are not in the record).
        ``points``: ``catching()`` now, where the caller has it already.
        ``cadence``: the recorded steps (nndb.cadence.Cadence): a hit after
        steps that were not recorded says so (``unseen_before``)."""
        if points is None:
            points = catching()
        if record is None or not points:
            return []
        had_nan = any(v[0] for v in self.bad.values())
        had_inf = any(v[1] for v in self.bad.values())
        new = self._newly_nonfinite(record, buffers())
        if not new or record.step in self.judged:
            return []
        self.judged = self.judged[-3:] + [record.step]
        # where it first appeared: no series held that kind before (a NaN that spreads to a
        # series step after step, through the parameters, is looked for where it began)
        first = any(nan for _, nan, _ in new) and not had_nan or any(inf for _, _, inf in new) and not had_inf
        step = record.step
        why = "time travel is not available in this session" if replay is None else None
        if replay is not None:
            try:
                data = replay(step)
            except CommandError as e:
                why = str(e).removeprefix("nndb: ")
            numbers = {p.number for p in points}
            points = [p for p in catching() if p.number in numbers]
        if why is None:
            if had_nan:      # (a NaN no operation made is the one the run held already: not where it came in)
                data = dict(data, events=[e for e in data.get("events", []) if e[1].get("entered") is None])
            hits = hits_from_events(points, data, step, accept, self.inf)
            if self.inf is None:
                self.inf = first_inf(data.get("ops", []), step, data.get("events", []))
            if hits or not first:
                return _with_unseen(hits, unseen_before(cadence, step))
            # no operation made it from finite inputs: it came with the step's data (a NaN in
            # the batch) or from before the step, and this step is where it first appeared: the
            # catch stops here (it ran on with a note, and never stopped)
            why = ("its replay found no operation that made it from finite inputs: it came in with the "
                   "step's data or from before the step")
        series = [series_label(n, k) for (n, k), _, _ in new]
        hits = []
        # (from the counts alone: an Inf that became NaN within the step is not seen)
        for p in (p for p in points if any(_wanted(p, nan, inf) for _, nan, inf in new)):
            detail = {"step": step, "unlocated": why, "series": series[:SHOWN_SERIES],
                      "more_series": max(0, len(series) - SHOWN_SERIES),
                      "nan": any(nan for _, nan, _ in new)}
            if accept(p, detail):
                hits.append((p, detail))
        return _with_unseen(hits, unseen_before(cadence, step))
