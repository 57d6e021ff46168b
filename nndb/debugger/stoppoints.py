"""Deciding whether to stop: the tracer's callbacks at step ends and module
calls, breakpoints, watchpoints and run-control targets.

A base of Session (bdb's ``stop_here``/``break_here`` are ``Bdb``'s own
methods): it reads the session's run control (``control``) and points,
notes where a stop happens (``here``) and hands Stop objects to the
session's ``_stop``."""
from __future__ import annotations

import math
import sys
import threading
from dataclasses import dataclass, field
from typing import Optional

from .. import globs
from ..errors import CommandError, KillRun, RestartRun
from ..schema import CLIP_SERIES
from ..tracer.recorder import LATE_KINDS
from . import evaluate as E
from . import points as P
from .modes import Mode, StepEnd, StopKind


@dataclass
class Stop:
    kind: StopKind             # (a word is taken too: Stop("past", ...))
    step: Optional[int]        # the step that just finished (step-end stops), or the step in progress
    at_step_end: bool = True
    module: Optional[str] = None
    phase: Optional[str] = None    # forward | backward (module stops)
    hits: list = field(default_factory=list)   # [(point, detail dict)]
    exception: Optional[BaseException] = None
    note: str = ""

    def __post_init__(self):
        self.kind = StopKind(self.kind)


@dataclass
class RuleHit:
    """A rule whose action is stop or fail, as a stop's hit (points' interface)."""
    rule: object
    finding: object
    number = None
    type_name = "rule"
    temporary = False
    silent = False
    commands: tuple = ()

    @property
    def fail(self) -> bool:
        return self.rule.action == "fail"

    def what(self) -> str:
        return f"rule {self.rule.id}"


def _with_rule_hits(stop: Optional[Stop], step: int, rule_hits: list) -> Stop:
    if stop is None:
        return Stop(StopKind.RULE, step, hits=rule_hits)
    if stop.kind in (StopKind.BREAKPOINT, StopKind.WATCHPOINT):
        stop.hits = stop.hits + rule_hits
        return stop
    return Stop(StopKind.RULE, step, hits=rule_hits)


class _NamedOptimizers:
    """The run's optimizers as the rules ask for them: called, [(name,
    optimizer)]; ``raw()``, the optimizers alone (named only when they changed)."""

    def __init__(self, rec):
        self.rec = rec
        self.raw = rec.tracer.optimizers
        # the step pipeline's record of them, whose ``changes`` counts what changed (the rules
        # take a new snapshot of the optimizers only then)
        self.state = getattr(rec, "write_records", None)

    def __call__(self) -> list:
        naming = self.rec.naming
        return [(naming.optimizer_name(o), o) for o in self.raw()]


class StopPoints:
    # -- stop points (from the run's step pipeline and the tracer's hooks) -------------
    def check_stops(self, step: int, record, rule_hits: list, known) -> None:
        """At the end of ``step`` (``record``: the newest record handed on
        there, or None; ``known``: the step's own record as far as it is known,
        see ``check_points_at_step_end``): stop if a point, a rule or run control says so.
        The step pipeline (SessionSteps) calls it only where something can stop."""
        role = self.replica
        agreement = self.agreement
        self.here.hook_frame = sys._getframe(1)
        try:
            if role is not None:
                role.remake(self, step)      # (the live run's changes at this step, in a replay)
            stop = role.before_stops(self, step) if role is not None else None
            if stop == StepEnd.SKIP:
                stop = None
            elif stop is None:
                stop = self._check_step_end(step, record, known)
            if rule_hits:
                stop = _with_rule_hits(stop, step, rule_hits)
            if agreement is not None:
                stop = agreement.agree(self, step, stop)
        except (KillRun, RestartRun):
            self.here.hook_frame = None
            raise
        except Exception as e:
            self.here.hook_frame = None
            self.error(f"nndb: internal error at a step boundary, skipped: {type(e).__name__}: {e}")
            return
        if stop is not None:
            # (a start stop that falls at step 0's end, in a loop whose step calls no module's
            # forward: the watches set there, by -e, -x or at the prompt, see step 0 too, as
            # they would have at its start; a '-e watch loss ...' first hit at step 1)
            before = set(self.points.numbered) if stop.kind is StopKind.START and stop.at_step_end \
                and role is None and agreement is None else None
            self._stop(stop, E.stop_frame(self.here.hook_frame))
            if before is not None and set(self.points.numbered) - before:
                late = self.check_points_at_step_end(step, record, known, new_since=before)
                if late:
                    self._stop(Stop(StopKind.WATCHPOINT, step, hits=late), E.stop_frame(self.here.hook_frame))
        self.here.hook_frame = None       # (the step end's frames hold the script's locals)
        if role is not None:
            role.after_stops(self, step)

    def on_module(self, module, phase: str, payload) -> None:
        if threading.get_ident() != self.control.main_thread or self.prompting:
            return                    # a device thread: stop at the next main-thread stop point
        try:
            name = self.view.module_name(module)
            # (in step 0, names not yet qualified: '2' of the model 'body' is 'body.2' from its end on;
            # a model alone keeps '2', which 'model.2' names as the script writes it)
            alias = self.rec.naming.qualified_alias(module)
            stop = None
            if self.control.pending_start and phase == "forward":
                self.control.pending_start = False
                stop = Stop(StopKind.START, self.step_in_progress(), at_step_end=False, module=name, phase=phase)
            elif self.control.interrupt_requested:
                self.control.interrupt_requested = False
                stop = Stop(StopKind.INTERRUPT, self.step_in_progress(), at_step_end=False, module=name, phase=phase)
            stop = self._module_stop(self.points.numbered.values(), module, phase, payload, name, alias, stop,
                                     sys._getframe(1))
        except (KillRun, RestartRun):
            raise
        except Exception as e:
            self.error(f"nndb: internal error at a module stop point, skipped: {type(e).__name__}: {e}")
            return
        if stop is None:
            return
        # The start stop is before the module it names runs: a module breakpoint set there (at
        # the prompt, by -e or -x, which a batch run's silent start stop runs) that matches it
        # stops at that call, as it does at every later one ('break module enc' then 'continue'
        # went on to enc's second call of step 0, a batch run saying nothing of where it stood)
        before = set(self.points.numbered) if stop.kind is StopKind.START else None
        self._stop(stop, E.stop_frame(self.here.hook_frame))
        if before is None or not set(self.points.numbered) - before:
            return
        try:
            new = [p for n, p in self.points.numbered.items() if n not in before]
            stop = self._module_stop(new, module, phase, payload, name, alias, None, sys._getframe(1), step=False)
        except (KillRun, RestartRun):
            raise
        except Exception as e:
            self.error(f"nndb: internal error at a module stop point, skipped: {type(e).__name__}: {e}")
            return
        if stop is not None:
            self._stop(stop, E.stop_frame(self.here.hook_frame))

    def _module_stop(self, points, module, phase: str, payload, name: str, alias, stop, hook_frame,
                     step: bool = True) -> Optional[Stop]:
        """The stop at this call of ``module`` (``stop``, a start or an interrupt, or a hit of the
        module breakpoints among ``points``, or, with ``step``, a ``step`` at the prompt's), the
        call's payload and frame held for it; None where the run goes on."""
        hits, name, probed, crossed = self._module_hits(points, module, phase, payload, name, alias, hook_frame)
        if crossed and not hits:
            self.count_in_step(self.step_in_progress())      # (a hit an ignore count swallowed)
        if hits:
            stop = Stop(StopKind.BREAKPOINT, self.step_in_progress(), at_step_end=False,
                        module=name, phase=phase, hits=hits)
        elif stop is None and step and self.control.mode is Mode.STEP:
            stop = Stop(StopKind.STEP, self.step_in_progress(), at_step_end=False, module=name, phase=phase)
        if stop is None:
            if probed:
                self.here.let_go()           # hold no tensor, no frame between stops
            return None
        stop.note = "inputs" if phase == "forward" else "grad_output"
        self.here.payload = payload
        self.here.module = module
        self.here.hook_frame = hook_frame
        return stop

    def _module_hits(self, points, module, phase: str, payload, name: str, alias, hook_frame) -> tuple:
        """([(point, detail)] of the module breakpoints among ``points`` that hold at this call
        of ``module`` (a hit counted, a condition judged in ``hook_frame``), the name the stop
        gives it, whether a condition's probe holds the call's frame and payload, and whether a
        point's hit counted here at all (its ignore count may have swallowed it))."""
        hits = []
        probe = None
        crossed = False
        for p in list(points):              # (the dict's values: no Python call an item)
            if isinstance(p, P.ModuleBreak) and p.enabled and p.phase == phase and (
                    p.matches(name) or alias is not None and p.matches(alias)):
                if alias is not None and not p.matches(name):
                    name = alias
                detail = {"module": name, "phase": phase}
                if probe is None:        # what a condition sees: $step in progress, $inputs ...
                    self.here.hook_frame = hook_frame
                    self.here.payload, self.here.module = payload, module
                    probe = Stop(StopKind.PROBE, self.step_in_progress(), at_step_end=False, module=name,
                                 phase=phase, note="inputs" if phase == "forward" else "grad_output")
                counted = p.hits
                if self.point_hits(p, detail, probe):
                    hits.append((p, detail))
                crossed = crossed or p.hits > counted
        return hits, name, probe is not None, crossed

    def stop_requested(self, frame) -> bool:
        """``nndb.set_trace()`` (or ``breakpoint()``) in the script: stop at
        ``frame``'s line as at a breakpoint.  False where no stop can happen
        (no live run, another thread, nndb's own prompt evaluating it)."""
        if not self.live or threading.get_ident() != self.control.main_thread or self.prompting:
            return False
        self.here.hook_frame = frame
        self._stop(Stop(StopKind.SET_TRACE, self.step_in_progress(), at_step_end=False), frame)
        return True

    def on_catch(self, hits: list, module, frame) -> None:
        """The op recorder saw an operation a catch point wants (inside the step)."""
        if threading.get_ident() != self.control.main_thread or self.prompting:
            return
        self.here.hook_frame = frame
        stop = Stop(StopKind.CATCHPOINT, self.step_in_progress(), at_step_end=False, module=module or "(script)",
                    phase=hits[0][1].get("phase"), hits=hits)
        self._stop(stop, E.stop_frame(frame))

    def step_in_progress(self) -> int:
        return self.rec.recorder.step if self.rec is not None else 0

    def run_rules(self, record, defer: bool = True) -> list:
        """The rules on one record: findings are printed and kept for the
        report; those whose action is stop or fail become hits."""
        try:
            opts = self.view.rule_optimizers
            if opts is None or opts.rec is not self.rec:
                opts = self.view.rule_optimizers = _NamedOptimizers(self.rec)
            cache = self.view.stats_cache           # (view.cached_stats(record), inline: every step end)
            stats = cache[1] if cache[0] is record else None
            # (a replica judges each step as it comes: what it replays, the live run reported)
            found = self.rules.on_record(record, stats, opts, defer=defer and self.replica is None)
        except Exception as e:
            self.error(f"nndb: internal error in the rules, skipped: {type(e).__name__}: {e}")
            return []
        if not found and not self.rules.errors and not self.rules.probe_news:
            return []       # (the usual step: nothing found, nothing failed)
        return self._rule_findings(found)

    def judge_at_exception(self, records) -> None:
        """The script raised: the records closed as the run ended (the step it
        raised in, a hand-written loop's last step) are judged now, each
        finding marked ``judged_at: exception`` in the report.  No stop: the
        post-mortem follows; a fail action still fails the run."""
        self.flush_rules()
        self.log.at_exception = True
        try:
            for record in records:
                if self.rules is not None:
                    self.rules.ending = record is records[-1]     # (no step comes after it)
                for hit, _ in self.run_rules(record, defer=False):
                    if hit.rule.action == "fail":
                        self.log.failed_points.append(hit.rule.id)
        finally:
            self.log.at_exception = False
            if self.rules is not None:
                self.rules.ending = False

    def judge_at_end(self, records) -> None:
        """The run ended (finished, exited, killed): the whole steps whose records
        closed only then are judged as any step end's; no stop comes after the end,
        and a fail action fails the run."""
        for record in records:
            for hit, _ in self.run_rules(record, defer=False):
                if hit.rule.action == "fail":
                    self.log.failed_points.append(hit.rule.id)

    def flush_rules(self) -> None:
        """Judge the steps the rules keep in a block (nndb.rules.block): before
        a stop, a checkpoint's fork and the end of the run, every step's
        findings are in."""
        if self.rules is None or not self.rules.waiting:
            return
        try:
            found = self.rules.flush()
        except Exception as e:
            self.error(f"nndb: internal error in the rules, skipped: {type(e).__name__}: {e}")
            return
        # A block waits only while every action is warn, and a stop flushes it
        # before a command can change one: no hit is expected here, and a
        # fail action would still fail the run.
        for hit, _ in self._rule_findings(found):
            if hit.rule.action == "fail":
                self.log.failed_points.append(hit.rule.id)

    def _rule_findings(self, found: list) -> list:
        """Print and keep the findings; those whose action is stop or fail become hits."""
        for msg in self.rules.take_errors():
            self.error(f"nndb: {msg}")
        hits = []
        at_exception = self.log.at_exception
        for f in found:
            self.log.findings.append(f.as_dict())
            if at_exception:
                self.log.findings[-1]["judged_at"] = "exception"
            rule = self.rules.rule(f.rule)
            if self.replica is not None and self.replica.replaying:
                continue              # the live run reported it already
            when = " (judged as the script raised)" if at_exception else ""
            self.error(f"nndb: {f.severity}: {f.rule} at step {f.step}{when}: {f.message}")
            self.keep_in_trace("finding", f.message, self.log.findings[-1])
            if rule.action in ("stop", "fail") and self.control.mode is not Mode.DETACH:
                hits.append((RuleHit(rule, f), f.as_dict()))
            elif rule.action == "fail":
                self.log.failed_points.append(rule.id)
        return hits

    def check_points_at_step_end(self, step: int, record, known, new_since: Optional[set] = None) -> list:
        """[(point, detail)] of the points that hit at the end of ``step``.
        ``record``: the newest record handed on there; ``known``: the record
        of ``step`` as far as it is known at its end (``record`` itself, but
        for a hand-written loop, whose record of step N is handed on at
        N+1's end: step N's loss, gradients and activations).  A watch looks
        at each step once, as soon as its kind is known: a loss, gradient or
        activation watch at the step's own end, a param or update watch at
        the record's (LATE_KINDS).  ``new_since``: only the watches whose
        numbers are not in it (set at a start stop at this step's end)."""
        hits = []
        late = self._late_record(record, known)
        for n, p in list(self.points.numbered.items()):      # (the dict: no Python call an item)
            if not p.enabled or new_since is not None and (n in new_since or not isinstance(p, P.Watch)):
                continue
            detail = None
            try:
                if isinstance(p, P.StepBreak):
                    detail = {"step": step} if p.step == step else None
                elif isinstance(p, P.ExprBreak):
                    detail = self._expr_hit(p, step)
                elif isinstance(p, P.Watch):
                    seen = (late or record) if p.kind in LATE_KINDS else known
                    detail = self._judge_watch(p, seen, p.checked)
                    if detail is None and p.kind == "grad" and late is not None:
                        # (a hand-written loop: clip_grad_norm_'s total of step N, taken after
                        # its backward, comes with its record at N+1's end)
                        detail = self._judge_watch(p, late, p.checked_late, clips=True)
            except CommandError as e:
                detail = {"error": str(e)}
            if detail is not None and self.point_hits(p, detail):
                hits.append((p, detail))
        return hits

    def _check_step_end(self, step: int, record, known) -> Optional[Stop]:
        hits = self.check_points_at_step_end(step, record, known) + self._step_end_catch(record)
        if known is not None and known is not record and known.step == step:
            # (a hand-written loop: step N's record is closed at N+1's end; its loss and
            # gradients, known now, are where a NaN made in step N shows first)
            hits += self._step_end_catch(known)
        if hits:
            kind = StopKind.WATCHPOINT if all(isinstance(p, P.Watch) for p, _ in hits) else \
                StopKind.CATCHPOINT if all(isinstance(p, P.CatchPoint) for p, _ in hits) else StopKind.BREAKPOINT
            return Stop(kind, step, hits=hits)
        if self.control.pending_start:
            self.control.pending_start = False
            return Stop(StopKind.START, step)
        if self.control.interrupt_requested:
            self.control.interrupt_requested = False
            return Stop(StopKind.INTERRUPT, step)
        if self.control.mode is Mode.NEXT:
            self.control.count -= 1
            if self.control.count <= 0:
                return Stop(StopKind.NEXT, step)
        elif self.control.mode is Mode.STEP:
            return Stop(StopKind.STEP, step)
        elif self.control.mode is Mode.FINISH:
            return Stop(StopKind.FINISH, step)
        elif self.control.mode is Mode.UNTIL and self.control.until_step is not None and \
                step >= self.control.until_step:
            return Stop(StopKind.UNTIL, step)
        return None

    def _step_end_catch(self, record) -> list:
        """The hits of the catch points armed at the step end: the record
        says the step went non-finite, a replay of it names the operation."""
        if self.lineage is None or record is None:
            return []
        return self.lineage.step_end_catch(self, record, self.point_hits)

    def catch_missed_at_exception(self, records) -> None:
        """The script raised inside a step (its own check of the loss,
        torch.multinomial on NaN probabilities): a catch point armed at the
        step end never sees that step's end, and no replay reaches into a step
        that raised; where the step went non-finite, one line says so, and how
        to find the operation (it said nothing)."""
        if self.lineage is None or not records:
            return
        missed = self.lineage.missed_at_exception(records[-1])
        if missed is None:
            return
        points = self.points.catch_points()
        named = ", ".join(f"{p.number} ({p.what()})" for p in points)
        more = f" and {missed['more_series']} more" if missed["more_series"] else ""
        self.error(f"nndb: catchpoint {named}: step {missed['step']} went non-finite "
                   f"({', '.join(missed['series'])}{more}), but the script raised in it, before the step's end "
                   f"where the catch looks, and a step that raised cannot be replayed: "
                   f"'catch {points[0].what_kind} --eager', then 'run', stops inside the operation")

    def _expr_hit(self, p: P.ExprBreak, step: int) -> Optional[dict]:
        frame = E.stop_frame(self.here.hook_frame)
        value = E.evaluate(E.compile_expr(p.expr), frame, self.view.variables(frame, step_end=True),
                           what=f"break if {p.expr}: ")
        return {"expr": p.expr, "step": step} if value else None

    def _late_record(self, record, known):
        """A hand-written loop's record of the step before ``known`` (closed at
        ``known``'s end, with what came after that step's backward: its update,
        its clip_grad_norm_), or None in other loops.  ``record`` is it, but
        where a replica resumed at a stop checks that step end again, which
        passes the step's own record as far as known for both."""
        if record is not None and known is not None and record is not known:
            return record
        last = self.rec.recorder.last if self.rec is not None else None
        if last is not None and known is not None and last is not known and last.step < known.step:
            return last
        return None

    def _judge_watch(self, p: P.Watch, seen, memo: list, clips: bool = False) -> Optional[dict]:
        """The detail of ``p``'s hit at the record ``seen`` (``clips``: its
        clip_grad_norm_ series alone), or None; ``memo`` ([step, detail]) keeps
        the answer, so that a step judged again gives it without counting twice."""
        if seen is None:
            return None
        if memo and memo[0] == seen.step:
            return dict(memo[1]) if memo[1] is not None else None
        rows, scale = self._watch_rows(p, seen)
        if clips:
            rows = [(n, v) for n, v in rows if n.split("#")[0] == CLIP_SERIES]
        detail = p.check(rows, scale)
        self._say_zero_baselines(p)
        if detail is not None:
            detail["step"] = seen.step
        memo[:] = [seen.step, dict(detail) if detail is not None else None]
        return detail

    def _watch_rows(self, p: P.Watch, record) -> tuple:
        """([(name, value)] of the series ``p`` watches at this record, the
        largest finite |value| of its statistic among all series of its kind)."""
        col = P.STATS.index(p.stat)
        stats = self.view.stats_of(record)
        rows, scale = [], 0.0
        for i, (n, k) in enumerate(record.names):
            if k != p.kind:
                continue
            v = float(stats[i, col])
            if math.isfinite(v):
                scale = max(scale, abs(v))
            if globs.matches(n, p.glob):
                rows.append((n, v))
        return rows, scale

    def _say_zero_baselines(self, p: P.Watch) -> None:
        """Once per series: the relative rule does not judge a numerically zero one."""
        zero = p.take_zero_notes()
        if not zero or (self.replica is not None and self.replica.replaying):
            return
        names = ", ".join(f"{n} ({base:.2g})" for n, base in zero)
        self.message(f"Watchpoint {p.number}: not judging {names} against the band: "
                     f"{'its' if len(zero) == 1 else 'their'} {p.label} {p.stat} is numerically zero "
                     f"(at most {P.watchband.ZERO:g} x the largest {p.label} {p.stat})")

    def point_hits(self, p: P.Point, detail: dict, stop: Optional[Stop] = None) -> bool:
        """gdb's order: the condition decides whether it is a hit; a hit counts,
        then the ignore count may swallow it."""
        if p.condition and "error" not in detail:
            try:
                frame = E.stop_frame(self.here.hook_frame)
                if not E.evaluate(E.compile_expr(p.condition), frame, self.view.variables(frame, stop=stop),
                                  what=f"condition of {p.number}: "):
                    return False
            except CommandError as e:
                detail["error"] = str(e)
        p.hits += 1
        if p.ignore_count > 0:
            p.ignore_count -= 1
            return False
        return True
