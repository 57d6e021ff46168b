"""``predict``: fork the current process at the stop and run it N steps
ahead as a replica that reports per-step figures and ends.  The live process
only waits: it must finish as if predict had never been used."""
from __future__ import annotations

from . import forking
from .channel import Channel


def predict(s, machine, n: int, set_lines: list) -> dict:
    parent, child = Channel.pair()
    pid = forking.fork(close=tuple(c.chan for c in machine.checkpoints.values()) + (parent,))
    if pid == 0:
        _become_predictor(s, machine, child, n, set_lines)
        return {}
    child.close()
    try:
        msg = machine._wait(s, parent, None)
    finally:
        parent.close()
        forking.reap(pid)
    return msg


def _become_predictor(s, machine, chan, n: int, set_lines: list) -> None:
    from .roles import Predict
    machine.replica = True
    machine.checkpoints = {}
    s.rec.writer.detach()
    role = Predict(chan, {"kind": "predict", "steps": n})
    s.become_replica(role)
    role.begin(s)                      # (output to /dev/null from here)
    s.queue.clear()                    # the rest of a command file is the live run's
    for line in set_lines:
        s.execute(line)
    s.resume("continue")               # the stop's prompt loop ends; the script runs on here
