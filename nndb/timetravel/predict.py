"""``predict``: fork the current process at the stop and run it N steps
ahead as a replica that reports per-step figures and ends.  The live process
only waits: it must finish as if predict had never been used.

One vocabulary for one process and for a job across ranks
(nndb.distributed.travel): ``parse_request`` reads ``predict [N] [--set
KEY=VALUE ...]`` into a ``PredictRequest``, and each run ahead comes back as
a ``Prediction``.  In one process the changed replica makes each ``--set`` as
an edit of nndb.debugger.changes (``HyperChange`` or ``VarChange``), with the
same function the prompt's ``set`` uses (``changes.make``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..debugger.changes import SET_USAGE, check_var
from ..errors import CommandError
from . import forking
from .channel import Channel
from .settings import Setting, make_changes


@dataclass(frozen=True)
class PredictRequest:
    steps: int
    sets: tuple = ()                   # (Setting, ...)


def parse_request(text: str) -> PredictRequest:
    """``[N] [--set KEY=VALUE ...]``; a CommandError for bad words (a bad
    name or value fails here, before anything runs)."""
    from ..debugger.points import parse_int
    words = text.split()
    n, sets = 1, []
    while words:
        w = words.pop(0)
        if w == "--set":
            if not words or "=" not in words[0]:
                raise CommandError("--set needs KEY=VALUE (for instance --set lr=1e-4)")
            key, _, value = words.pop(0).partition("=")
            sets.append(Setting(key, value))
        elif w.startswith("--set="):
            key, _, value = w[6:].partition("=")
            sets.append(Setting(key, value))
        else:
            n = parse_int(w, "the number of steps")
            if n < 1:
                raise CommandError(f"the number of steps must be at least 1, not {n}")
    for st in sets:                    # (as 'set var KEY VALUE' would read them)
        if not st.key or not st.value:
            raise CommandError("set var needs a variable and a value", SET_USAGE)
        check_var(st.key, st.value)
    return PredictRequest(n, tuple(sets))


@dataclass
class Prediction:
    """What one run ahead found: one row a step ({"step", "loss",
    "grad_norm", "clipped", "grad_norm_missing" (why grad_norm is None),
    "findings"}: nndb.timetravel.compare's
    ``step_grad_norm`` and ``compare_predictions``), where a
    point or rule stopped it, why it ended early, why it gave no answer
    (``error``), and the ``--set`` changes that did not hold."""
    rows: list = field(default_factory=list)
    stopped: Optional[str] = None
    ended: Optional[str] = None
    error: Optional[str] = None
    undone: list = field(default_factory=list)
    live_undone: list = field(default_factory=list)    # the stop's own sets that did not hold

    @classmethod
    def from_message(cls, msg: Optional[dict]) -> "Prediction":
        """The predicting replica's last message (None: it sent none)."""
        msg = msg or {}
        return cls(list(msg.get("rows") or []), msg.get("stopped"), msg.get("ended"), msg.get("error"),
                   list(msg.get("undone") or []), list(msg.get("live_undone") or []))


def fork_and_wait(s, machine, become):
    """Fork a helper replica of this stop (``predict``, ``fuzz``): in the child
    ``become(chan)`` takes over and None is returned; the live run waits for
    the child's last message and returns it.  A fork that cannot compute what the run does bit for
    bit (GNU OpenMP, several threads: the child runs one) says so first, as a replay does, in
    every --replica mode: under 'respawn' a prediction is a fork too (its baseline read 0.949103 at
    a step whose loss the script printed as 0.9491024613, and nothing said why)."""
    exact, why = forking.exactness()
    if not exact:
        s.error(f"nndb: warning: this replica may not be exact: {why}")
    with machine.watching_files(s):
        parent, child = Channel.pair()
        pid = forking.fork(close=tuple(c.chan for c in machine.checkpoints.values()) + (parent,))
        if pid == 0:
            become(child)
            return None
        child.close()
        try:
            return machine.wait_for_replica(s, parent, pid=pid)      # (SIGTERM ends it: forking.SigtermEnds)
        finally:
            parent.close()
            forking.reap(pid)


def predict(s, machine, n: int, changes: list) -> Prediction:
    """Run ``n`` steps ahead on a replica forked here, making ``changes``
    ([PredictChange]) first; the live run waits and is left unchanged.  Where
    fork() is unsafe (DataLoader workers alive: a forked child's iterator
    fails, "can only test a child process"), a replica replayed to the end of
    this step (respawned, as goto's) predicts instead."""
    why = forking.blockers()
    if why:
        stop = s.here.stop
        if s.last_step is None or (stop is not None and not stop.at_step_end):
            raise CommandError("predict cannot fork a replica here (" + "; ".join(why) + "): from a stop "
                               "at a step end it predicts on a replica replayed to it")
        goal = {"kind": "predict", "steps": n, "at": s.last_step, "end": s.last_step,
                "sets": [[c.setting.key, c.setting.value] for c in changes]}
        return Prediction.from_message(machine.replay(s, goal, s.last_step))
    msg = fork_and_wait(s, machine, lambda chan: _become_predictor(s, machine, chan, n, changes))
    return Prediction.from_message(msg)


def _become_predictor(s, machine, chan, n: int, changes: list) -> None:
    from .roles import Predict
    from . import sandbox
    machine.replica = True
    machine.checkpoints = {}
    s.rec.writer.detach()
    sandbox.enter(nndb_files=[s.log.trace_path])    # (the script's own writes go to scratch copies)
    # In the past, the live run's changes still ahead of this step (a 'set lr --hold' let go
    # with 'unset lr' two steps on) are made again at their steps, as 'continue' there makes
    # them: the prediction is of the run's own history (it held the lr to the end instead).
    past = s.replica
    ahead = [c.message() for c in getattr(past, "changes", ())
             if c.replay_at is not None and s.last_step is not None and c.replay_at > s.last_step]
    role = Predict(chan, {"kind": "predict", "steps": n, "changes": ahead})
    # a 'set' made at this stop that the script undoes (its own lr schedule): the live run's next
    # step end says so; the prediction, whose replica steps first, says it too
    role.live_checks = list(s.hold_checks)
    s.become_replica(role)
    role.begin(s)                      # (output to /dev/null from here)
    s.input.queue.clear()                    # the rest of a command file is the live run's
    make_changes(s, role, changes)
    s.set_continue()               # the stop's prompt loop ends; the script runs on here
