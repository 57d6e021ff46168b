"""The rules across ranks, live: the front process judges the rows the ranks
send it (nndb.tracer.fingerprint's rows, also written to each rank's trace)
with the same judge, fed in the same order, as ``nndb inspect RUNDIR`` runs
over the finished job's traces (nndb.rules.crossrank.judge_job): the
findings are the same either way.

Offline, the judge is fed each step that any rank has a row for, in step
order, with the rows of the ranks that have one.  Live, a step is fed once
every rank has sent a row for it or a later step (each rank sends its rows
in step order, so no row for it can come after), and the rest at the job's
end.  Each new finding is said at once (one line) and kept for the report.
"""
from __future__ import annotations

import threading
from typing import Callable

from ..rules.crossrank import CrossRankJudge


class LiveJudge:
    def __init__(self, world: int, say: Callable[[str], None]):
        self.world = world
        self.say = say
        self.judge = CrossRankJudge()
        self._pending: dict = {}        # step -> {rank: row}
        self._latest: dict = {}         # rank -> the step of its last row
        self._lock = threading.Lock()

    @property
    def findings(self) -> list:
        return self.judge.findings

    def add(self, rank: int, row: dict) -> None:
        """A rank's row (from its link's thread in the front)."""
        step = row.get("step")
        if not isinstance(step, int):
            return
        with self._lock:
            self._pending.setdefault(step, {})[rank] = row
            self._latest[rank] = max(step, self._latest.get(rank, step))
            self._feed(lambda s: len(self._latest) >= self.world and min(self._latest.values()) >= s)

    def finish(self) -> None:
        """The job ended: the steps not fed yet, in order."""
        with self._lock:
            self._feed(lambda s: True)

    def _feed(self, ready: Callable[[int], bool]) -> None:
        while self._pending:
            step = min(self._pending)
            if not ready(step):
                return
            for f in self.judge.feed(step, self._pending.pop(step)):
                self.say(f"nndb: {f.severity}: {f.rule} at step {f.step} (across ranks): {f.message}")
