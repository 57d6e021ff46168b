"""The debugger's part of a run's step pipeline (nndb.tracer.pipeline), in
the order the session joins it: what the prompt shows, the rules, time
travel's checkpoints, lineage, and the decision to stop.  While the session
is at a prompt, steps that the typed commands run (``p model(x)``) are
recorded but neither checked nor stopped in."""
from __future__ import annotations


class _Listener:
    def __init__(self, session):
        self.session = session


class StepSeen(_Listener):
    """The last step that ended and the newest record: what the prompt shows;
    the step's own record as far as it is known (``step_record``); and whether
    the last ``set`` held (said at the step end after the optimizer stepped:
    nndb.debugger.hyperparams.HoldCheck)."""

    def on_step(self, end) -> None:
        s = self.session
        if (s.hold_checks or s.holds.problems) and end.step is not None:
            _say_held(s, end.step)
        if end.records:
            s.latest_record = end.records[-1]
        if end.step is not None:
            s.last_step = end.step
            s.step_record = None
            if s.latest_record is not None and s.latest_record.step == end.step:
                s.step_record = s.latest_record
            else:
                # a hand-written loop closes step N's record at N+1's end: the
                # prompt and the watches see step N as far as it is known (its
                # loss, gradients and activations), not N-1
                known = s.rec.recorder.provisional()
                if known is not None and known.step == end.step:
                    s.latest_record = s.step_record = known


def _say_held(s, step: int) -> None:
    for check in list(s.hold_checks):
        verdict = check.verdict(step)
        if verdict is not None:
            s.hold_checks.remove(check)
            if verdict:
                s.error(verdict)
    problems, s.holds.problems = s.holds.problems, []
    for line in problems:
        s.error(line)


class RuleCheck(_Listener):
    """The rules on each record; hits (stop or fail actions) wait for StopCheck."""

    def on_step(self, end) -> None:
        s = self.session
        if s.prompting:
            return
        if end.step is None:
            # The run's last records (the step the script raised in, a
            # hand-written loop's last step): judged when the script raised,
            # before the post-mortem, so that a run dying of what the rules
            # see is not left without a finding.
            if end.records and getattr(s.rec, "raised", None) is not None:
                s.judge_at_exception(end.records)
            return
        s.rule_hits = [hit for record in end.records for hit in s.run_rules(record)]
        s.rules.arm(s.rec.recorder.step)         # the probes the next step needs


class Checkpoints(_Listener):
    """Time travel's checkpoints (in a forked checkpoint, a replica resumes here)."""

    def on_step(self, end) -> None:
        s = self.session
        if end.step is not None and not s.prompting:
            s.machine.at_step_end(s, end.step)


class LineageSteps(_Listener):
    """The step's operations, when its lineage is recorded."""

    def on_step(self, end) -> None:
        s = self.session
        if end.step is not None and not s.prompting:
            s.lineage.at_step_end(s, end.step)


class StopCheck(_Listener):
    """Breakpoints, watchpoints, rule hits and run control: stop here or go on."""

    def on_step(self, end) -> None:
        s = self.session
        if end.step is None or s.prompting:
            return
        hits, s.rule_hits = s.rule_hits, []
        s.check_stops(end.step, end.record, hits, s.step_record)


def session_listeners(s) -> list:
    out = [StepSeen(s)]
    if s.rules is not None:
        out.append(RuleCheck(s))
    if s.machine is not None:
        out.append(Checkpoints(s))
    if s.lineage is not None:
        out.append(LineageSteps(s))
    if s.progress is not None:
        out.append(s.progress)               # (after the rules: it counts their findings)
    out.append(StopCheck(s))
    return out
