"""When the op recorder runs, and where its steps go: the session's side of
lineage (``session.lineage``).

Off by default (a normal run stays as cheap as the recorder alone); on for
the steps of ``--lineage STEPS``, from ``lineage on`` until ``lineage off``,
for every step while a ``catch`` point is enabled (with NaN/Inf checks), and
for a step asked for after the fact (a replica replays it: ``get``).
"""
from __future__ import annotations

import functools
import sys
from typing import Callable, Optional

from ..errors import CommandError
from .catchstep import StepEndCatch, catch_detail, first_inf, from_earlier_inf, recomputed
from .oprecord import MODULE


def parse_steps(text: Optional[str]):
    """'5', '0:10' (10 excluded), '3,7,9', 'all' -> a predicate on steps."""
    if text is None or text == "":
        return None
    t = text.strip()
    if t == "all":
        return lambda s: True
    parts = []
    for w in t.split(","):
        w = w.strip()
        try:
            if ":" in w:
                a, b = w.split(":", 1)
                lo = int(a) if a else 0
                hi = int(b) if b else None
            else:
                lo = int(w)
                hi = lo + 1
        except ValueError:
            raise CommandError(f"bad step list '{text}' (use N, A:B, N,M or all)") from None
        if lo < 0 or (hi is not None and hi < 0):
            raise CommandError(f"bad step list '{text}': steps count from 0 (use N, A:B, N,M or all)")
        if hi is not None and hi <= lo:
            raise CommandError(f"bad step list '{text}': {w} holds no step (A:B is A to B-1, so B > A)")
        parts.append((lo, hi))
    return lambda s: any(lo <= s and (hi is None or s < hi) for lo, hi in parts)


class LineageControl:
    KEEP = 20                          # steps kept in memory for questions

    def __init__(self, steps: Optional[str] = None):
        self.wanted = parse_steps(steps)
        self.always = False            # lineage on
        self.stats = False             # lineage on --stats: every op's output statistics
        self.forced: set = set()       # steps a replica must record (asked after the fact)
        self.recorder = None
        self.done: dict = {}           # step -> StepLineage (live maps: EXPR -> id)
        self.session = None
        # replay(session, step) -> a step's NaN/Inf-checked lineage, on a replica
        # (set by the driver, which may drive time travel); None: catch points
        # are eager
        self.replay: Optional[Callable] = None
        self.step_end = StepEndCatch()
        self._catch_key = None           # (catch_state: the points' version its list is of)
        self._catch: list = []
        self._catch_eager = False
        self._forward_hits = (None, set())     # (step, its forward's hits: catchstep.recomputed)

    # -- policy ---------------------------------------------------------------------------
    def catching(self) -> list:
        return self.catch_state()[0]

    def catch_state(self) -> tuple:
        """(the enabled catch points, whether they are eager: ``eager``), in one call of
        ours: it runs at every step end while one is armed.  The points are listed again
        only when the session's points change (``Points.version``)."""
        s = self.session
        if s is None:
            return [], False
        if s.points.version != self._catch_key:
            self._catch_key = s.points.version
            self._catch = points = s.points.catch_points()
            self._catch_eager = any(p.eager for p in points)
        points = self._catch
        if not points:
            return points, False
        if self._catch_eager or self.replay is None:
            return points, True
        if s.replica is not None:
            return points, s.replica.kind != "scan"
        m = s.machine
        return points, m is None or m.mode == "off"

    def eager(self, points: Optional[list] = None) -> bool:
        """Does a catch point need every operation checked as the run goes?
        One armed --eager does; so does any where no step can be replayed:
        in a replica other than a scan (the past, a prediction: they take no
        checkpoints) and in a run without time travel (--replica off).
        ``points``: ``catching()``, where the caller has it already."""
        if points is None:
            return self.catch_state()[1]
        if not points:
            return False
        s = self.session
        if any(p.eager for p in points) or self.replay is None:
            return True
        if s.replica is not None:
            return s.replica.kind != "scan"
        m = s.machine
        return m is None or m.mode == "off"

    def wants(self, step: int) -> bool:
        return self.always or step in self.forced or (self.wanted is not None and self.wanted(step)) \
            or self.eager()

    # -- the run ------------------------------------------------------------------------
    def attach(self, s) -> None:
        self.session = s
        self._catch_key = None
        self.done = {}
        self.step_end.reset()
        if self.recorder is not None:
            self.recorder.stop()
        self.recorder = None
        self.refresh(0)

    def refresh(self, step: int) -> None:
        """Record step ``step`` (the next to run) if anything wants it; else stop."""
        s = self.session
        if s is None or s.rec is None or not s.live:
            return
        if self.wants(step):
            if self.recorder is None:
                from .ops import OpRecorder
                self.recorder = OpRecorder(s.rec.tracer)
            eager = self.eager()
            self.recorder.check = eager or step in self.forced
            self.recorder.stats = self.stats
            self.recorder.on_nonfinite = self._nonfinite if eager else None
            if self.recorder.current is None:
                self.recorder.start(step)
            elif self.recorder.current.step != step:
                self.recorder.current.step = step
        elif self.recorder is not None and self.recorder.current is not None:
            self.recorder.stop()

    def at_step_end(self, s, step: int) -> None:
        r = self.recorder
        if r is None and not (self.always or self.forced or self.wanted is not None):
            # (nothing records the next step: no lineage asked for, no catch point, or only
            # catch points armed at the step end: ``refresh``'s answer, in fewer calls)
            if not s.points.numbered or not self.catch_state()[1]:
                return
        if r is not None and r.current is not None and r.current.step == step:
            done = r.next_step(step + 1) if self.wants(step + 1) else r.stop()
            if done is not None:
                done.step = step
                record = done.as_dict()         # (its events' NaN/Inf that ended within it: absorbed)
                if done.checked:
                    inf = self.step_end.inf
                    if inf is not None and inf.get("step") == step:
                        # (the first Inf, as --eager saw it, may be one the step absorbed: a
                        # causal mask's -inf, made at every step, is no NaN's beginning)
                        self.step_end.inf = first_inf(record["ops"], step, record["events"])
                    if all(info.get("absorbed") for _, info in record["events"]):
                        self.step_end.inf = None   # (a step all finite: an earlier Inf is not the next NaN's)
                self.done[step] = done
                for old in sorted(self.done)[:-self.KEEP]:
                    del self.done[old]
                s.rec.writer.lineage(step, record)
        self.refresh(step + 1)

    def step_end_catch(self, s, record, accept) -> list:
        """The hits of the catch points armed at the step end, for the
        record handed on at this step end (catchstep.StepEndCatch.check)."""
        points, eager = self.catch_state() if record is not None else ((), False)
        if not points or eager:
            return []
        return self.step_end.check(record, self.catching, lambda step: self.replay(s, step), accept,
                                   functools.partial(nonfinite_buffers, s.rec.naming), points=points,
                                   cadence=getattr(s.rec.recorder, "schedule", None))

    def missed_at_exception(self, record) -> Optional[dict]:
        """The script raised in the step of ``record``: what the catch points
        armed at the step end missed there (catchstep.StepEndCatch.missed)."""
        points, eager = self.catch_state()
        if not points or eager:
            return None
        return self.step_end.missed(record, functools.partial(nonfinite_buffers, self.session.rec.naming))

    def run_ended(self) -> None:
        if self.recorder is not None:
            self.recorder.stop()
        self.recorder = None

    # -- catch ------------------------------------------------------------------------------
    def _nonfinite(self, idx: int, info: dict) -> None:
        s = self.session
        cur = self.recorder.current if self.recorder is not None else None
        if s is None or cur is None:
            return
        hits = []
        if self._forward_hits[0] != cur.step:
            self._forward_hits = (cur.step, set())
        inf = self.step_end.inf
        if inf is None:
            self.step_end.inf = first_inf(cur.ops, cur.step, [(idx, info)])
        for p in self.catching():
            if p.matches(info):
                detail = from_earlier_inf(catch_detail(cur.ops, cur.step, idx, info), info, inf)
                if recomputed(p, detail, self._forward_hits[1]):
                    continue
                if s.point_hits(p, detail):
                    hits.append((p, detail))
        if hits:
            s.on_catch(hits, cur.ops[idx][MODULE], sys._getframe(1))

    # -- asking ----------------------------------------------------------------------------
    def live(self, step: int) -> Optional[dict]:
        if step in self.done:
            return self.done[step].as_dict()
        r = self.recorder
        if r is not None and r.current is not None and r.current.step == step:
            return dict(r.current.as_dict(), partial=True)
        return None

    def find(self, t, step: int) -> Optional[int]:
        sl = self.done.get(step)
        if sl is None and self.recorder is not None and self.recorder.current is not None \
                and self.recorder.current.step == step:
            sl = self.recorder.current
        return sl.find(t) if sl is not None else None



_BUFFER_MODULES: dict = {}     # id(naming) -> (roots_version, [(module name, module)] of modules holding floating buffers)


def nonfinite_buffers(naming) -> list:
    """[((name, "buffer"), nan, inf)] of the models' floating-point buffers
    holding a NaN or Inf: one check of them all (a concatenation), then per
    buffer only when one is bad.  The modules that hold floating buffers are
    listed again only when a model is added (at every step end with ``catch
    nan`` armed, walking every module's ``named_buffers`` was ~40 us of a
    0.5 ms step); their buffers are read each time (a script may replace
    one).  Never raises (it runs in the user's step)."""
    import torch
    try:
        known = _BUFFER_MODULES.get(id(naming))
        if known is None or known[0] != naming.roots_version:
            mods = [(naming.module_name(m), m) for root in naming.roots() for m in root.modules()
                    if any(b is not None and b.is_floating_point() for b in m._buffers.values())]
            if len(_BUFFER_MODULES) > 16:
                _BUFFER_MODULES.clear()
            known = _BUFFER_MODULES[id(naming)] = (naming.roots_version, mods)
        if not known[1]:
            return []
        bufs = [(f"{mname}.{n}" if mname else n, b) for mname, m in known[1] for n, b in m._buffers.items()
                if b is not None and b.is_floating_point() and b.numel()]
        if not bufs:
            return []
        with torch.no_grad():
            if bool(torch.isfinite(torch.cat([b.detach().reshape(-1).float() for _, b in bufs])).all()):
                return []
            return [((name, "buffer"), bool(torch.isnan(b).any()), bool(torch.isinf(b).any()))
                    for name, b in bufs if not bool(torch.isfinite(b).all())]
    except Exception:
        return []
