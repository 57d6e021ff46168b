"""The debugger's part of a run's step pipeline (nndb.tracer.pipeline): one
listener, ``SessionSteps``, that does in order what the prompt shows, the
rules, time travel's checkpoints, lineage, the progress line and the
decision to stop.  One object, not one per part: a step end costs the
training loop a Python call per listener, and these parts read the same
session (issue 43: a step's calls constant and few).  While the session is
at a prompt, steps that the typed commands run (``p model(x)``) are recorded
but neither checked nor stopped in.  A part that fails is said once and
skipped; the others still run (the pipeline's promise for its listeners)."""
from __future__ import annotations

from .modes import Mode


class SessionSteps:
    """The session at a step end: ``seen`` (the last step and the newest
    record; whether the last ``set`` held), ``rules`` (hits wait for the stop
    check), ``checkpoints``, ``lineage``, the progress line, ``stops``."""

    def __init__(self, session):
        self.session = session
        self._failed: set = set()

    def on_step(self, end) -> None:
        s = self.session
        step = end.step
        records = end.records
        try:
            if step is not None and records and records[-1].step == step and not (s.hold_checks or s.holds.problems):
                s.latest_record = s.step_record = records[-1]       # (_seen's usual case, inline: every step)
                s.last_step = step
            else:
                _seen(s, end, step)
        except Exception as e:
            self._error("seen", e)
        if s.prompting:
            return
        if step is None and end.records and getattr(s.rec, "raised", None) is not None:
            try:
                s.catch_missed_at_exception(end.records)
            except Exception as e:
                self._error("catch", e)
        if s.rules is not None:
            try:
                if step is None:
                    # The run's last records (the step the script raised in, a hand-written
                    # loop's last step): judged when the script raised, before the post-mortem,
                    # so that a run dying of what the rules see is not left without a finding;
                    # at any other end, the whole steps among them (a hand-written loop's last,
                    # whose record waits for the next step's end: its NaN loss went unjudged)
                    if end.records and getattr(s.rec, "raised", None) is not None:
                        s.judge_at_exception(end.records)
                    elif end.records:
                        s.judge_at_end([r for r in end.records if not r.partial])
                else:
                    hits = []
                    for record in records:              # (a loop: no call of its own, every step)
                        hits += s.run_rules(record)
                    s.rule_hits = hits
                    nxt = s.rec.recorder.step
                    if nxt >= s.rules.arm_due:          # the probes the next step needs (when they change)
                        s.rules.arm(nxt)
            except Exception as e:
                self._error("rules", e)
        if step is None:
            if s.progress is not None:
                s.progress.on_step(end)
            return
        if s.lineage is not None:
            # (before the checkpoint: a replica forked there starts with this step's lineage
            # closed, and records the next step alone, as the live run did)
            try:
                s.lineage.at_step_end(s, step)
            except Exception as e:
                self._error("lineage", e)
        if s.machine is not None:
            try:
                s.machine.at_step_end(s, step)          # (in a forked checkpoint, a replica resumes here)
            except Exception as e:
                self._error("checkpoints", e)
        if s.progress is not None:                      # (after the rules: it counts their findings)
            try:
                s.progress.on_step(end)
            except Exception as e:
                self._error("progress", e)
        hits, s.rule_hits = s.rule_hits, []
        # Can anything stop here (a rule's hit, a replica's role, other ranks, run control, a
        # point)?  At most step ends nothing can: check_stops is not called.
        c = s.control
        if hits or s.replica is not None or s.agreement is not None or c.pending_start or not (
                c.mode is Mode.DETACH or (c.mode is Mode.CONTINUE and not s.points.numbered
                                          and not c.interrupt_requested)):
            s.check_stops(step, records[-1] if records else None, hits, s.step_record)

    def _error(self, part: str, e: Exception) -> None:
        if part not in self._failed:
            self._failed.add(part)
            self.session.error(f"nndb: internal error in the session's {part} at a step end: "
                               f"{type(e).__name__}: {e}")


def _seen(s, end, step) -> None:
    """The last step that ended and the newest record: what the prompt shows;
    the step's own record as far as it is known (``step_record``); and whether
    the last ``set`` held (said at the step end after the optimizer stepped:
    nndb.debugger.hyperparams.HoldCheck)."""
    if (s.hold_checks or s.holds.problems) and step is not None:
        _say_held(s, step)
    if end.records:
        s.latest_record = end.records[-1]
    if step is not None:
        s.last_step = step
        s.step_record = None
        if s.latest_record is not None and s.latest_record.step == step:
            s.step_record = s.latest_record
        else:
            # a hand-written loop closes step N's record at N+1's end: the
            # prompt and the watches see step N as far as it is known (its
            # loss, gradients and activations), not N-1
            known = s.rec.recorder.provisional()
            if known is not None and known.step == step:
                s.latest_record = s.step_record = known


def _say_held(s, step: int) -> None:
    # (a replay's steps were the live run's: what was undone there, it said there; the check ends)
    replaying = s.replica is not None and getattr(s.replica, "replaying", False)
    for check in list(s.hold_checks):
        verdict = check.verdict(step)
        if check.done:
            s.hold_checks.remove(check)
        if verdict and not replaying:
            s.error(verdict)
    problems, s.holds.problems = s.holds.problems, []
    for line in problems:
        s.error(line)


def session_listeners(s) -> list:
    return [SessionSteps(s)]
