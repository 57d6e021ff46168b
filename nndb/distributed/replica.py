"""A replica job: the live job's script run again from its start, beside the
live job, for ``predict`` and ``reverse-continue`` across ranks.

Fork checkpoints cannot share a process group, so the replica is a whole
second job: every rank respawned by torch's launcher on its own rendezvous
(``--standalone``: a free port), its own run directory (a fresh temporary
one), its workers' output in log files there (silent), and its own front
(nndb.distributed.front.Front, its own socket and secret).  The live job stays
stopped at its prompts meanwhile (its ranks hold its process group).  The
ranks of the replica are interactive sessions driven from here as the
console drives the live ones; ``end()`` ends every rank, waits for the
launcher and removes the directory (its traces are read before that).
"""
from __future__ import annotations

import dataclasses
import shutil
import tempfile
import threading
from typing import Optional

from .front import Front

_END_WAIT_S = 60.0
# ``nndb run``'s flags in the live ranks' command line (nndb.distributed.launch.worker_argv)
_VALUED = {"--every", "--steps", "--full-every", "--act-every", "--flush-every", "--flush-secs", "--rules",
           "--trace", "-x", "-e", "--lineage", "--export"}
# ...those a replica leaves out: its own trace directory; every step recorded
# (what predict reports is read from its traces); no start-up commands (the
# replica is driven from its start stop; the live job's points are set again);
# no exports (the user's TensorBoard/MLflow runs are the live job's) nor lineage
_DROPPED = {"--trace", "--every", "--steps", "--full-every", "--act-every", "-x", "-e", "--run", "--lineage",
            "--export"}


def replica_argv(argv: list) -> list:
    """The live ranks' ``nndb run ...`` line for a replica (see ``_DROPPED``)."""
    out, i = [argv[0]], 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-m":
        k = 2 if argv[i] in _VALUED else 1
        if argv[i] not in _DROPPED:
            out += argv[i:i + k]
        i += k
    return out + argv[i:]


class ReplicaJob:
    """One replica job of ``front``'s script (see the module's docstring)."""

    def __init__(self, front: Front, argv: list):
        self.dir = tempfile.mkdtemp(prefix="nndb-replica-")
        o = front.options
        opts = dataclasses.replace(o, rdzv_backend=None, rdzv_endpoint=None, rdzv_id=None, rdzv_conf=None,
                                   master_addr=None, master_port=None, hang_timeout=None, log_dir=self.dir)
        self.notes: list = []                     # what its front said (a rank that failed ...)
        self.front = Front(front.target, opts, self.notes.append)
        self.front.interactive = True
        self.front.replica_dir = self.dir          # (its ranks' writes go to scratch copies)
        self.argv = replica_argv(argv)
        self.n = o.nproc_per_node
        self._done = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.held: dict = {}                      # rank -> where it waits, not at a stop (``resume``)

    def _agent(self) -> None:
        try:
            self.front.run(self.argv, self.dir)
        except BaseException as e:                # (a launcher's error: said as the replica's)
            self.notes.append(f"{type(e).__name__}: {e}")
        finally:
            self._done.set()

    def start(self) -> bool:
        """Start every rank; True once each is at its start stop."""
        self._thread = threading.Thread(target=self._agent, name="nndb-replica-job", daemon=True)
        self._thread.start()
        self.front.wait_hello(self.n, self._done.is_set, _END_WAIT_S)
        return self.wait()

    def wait(self) -> bool:
        """Until every rank is at its prompt: True; False if the job ended."""
        self.front.wait(list(range(self.n)), finished=self._done.is_set)
        live = self.front.live_ranks()
        ok = len(live) == self.n and all(self.front.state.ranks[r].at_prompt for r in live)
        for r in live:
            self.front.take_output(r)
        return ok and not self._done.is_set()

    def stop_step(self) -> Optional[int]:
        steps = {self.front.state.ranks[r].stop_step for r in self.front.live_ranks() if r not in self.held}
        return steps.pop() if len(steps) == 1 else None

    def on(self, rank: int, line: str) -> list:
        """``line`` on a stopped rank: its output [(text, is_error)]."""
        self.front.send_line(rank, line)
        self.front.wait([rank], finished=self._done.is_set)
        return self.front.take_output(rank)

    def resume(self, line: str) -> dict:
        """A run-control line on every rank; the output of those at a stop
        when every rank is at one, or held where it is (``held``: rank ->
        where it waits; a rank out of inputs under Join never comes to a
        stop again) ({rank: [(text, is_error)]}; {} if the job ended)."""
        ranks = [r for r in self.front.live_ranks() if r not in self.held]
        for r in ranks:
            self.front.send_line(r, line)
        self.held = self.front.settle(self._done.is_set)
        if self._done.is_set() or len(self.front.live_ranks()) != self.n:
            return {}
        return {r: self.front.take_output(r) for r in ranks if r not in self.held}

    def traces(self) -> dict:
        """rank -> its trace's path (read them before ``end``... they are kept until ``close``)."""
        return {r: i.trace for r, i in self.front.state.ranks.items() if i.trace}

    def end(self) -> None:
        """End every rank (each closes its trace) and wait for the launcher."""
        if self._thread is None:
            return
        if self.held:                             # (a rank held in a collective takes no line: ended at once)
            self.front._abort_all("killed", 137, "the replica job is over")
        for r in self.front.live_ranks():
            self.front.send_line(r, "kill")
        self._thread.join(_END_WAIT_S)
        if self._thread.is_alive():               # (a rank that does not end: the launcher stops it)
            self.front._abort_all("killed", 137, "the replica job is over")
            self._thread.join(_END_WAIT_S)

    def close(self) -> None:
        self.end()
        self.front.close()
        shutil.rmtree(self.dir, ignore_errors=True)
