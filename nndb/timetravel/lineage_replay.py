"""A past step's lineage, asked for after the fact: a scan replica replays
the step from the checkpoint before it with the op recorder on (and finds
the tensors of expressions evaluated in its frame)."""
from __future__ import annotations

import time

from ..errors import CommandError
from ..lineage.fetch import recorded_lineage


def replay_lineage(s, machine, step: int, resolve: tuple = ()) -> tuple:
    """(the step's lineage dict, {expr: tensor id or error}); the lineage is
    added to the trace if it holds none for the step yet."""
    if machine is None or s.rec is None:
        raise CommandError(f"step {step} has no recorded lineage and time travel is off")
    if s.last_step is None or step > s.last_step:
        raise CommandError(f"step {step} has not finished yet")
    res = machine.replay(s, {"kind": "scan", "from": step, "end": step, "lineage": [step],
                             "resolve": list(resolve)}, step - 1)
    data = res["result"]["lineage"].get(str(step))
    if data is None:
        raise CommandError(f"the replay of step {step} recorded no lineage ({res.get('ended') or 'no step'})")
    if recorded_lineage(s, step, whole=False) is None:
        s.rec.writer.lineage(step, data)
    return data, res["result"].get("resolved", {})


def replay_checked(s, step: int) -> dict:
    """The NaN/Inf-checked lineage of ``step``, which has just ended, replayed
    for a catch point armed at the step end (nndb.lineage.catchstep); the
    replay's time is not the run's (the checkpoint schedule's clock)."""
    machine = s.machine
    t0 = time.monotonic()
    try:
        return replay_lineage(s, machine, step)[0]
    finally:
        if machine is not None:
            machine.paused(time.monotonic() - t0)
