"""A distributed job's run directory, opened with ``nndb.open(RUNDIR)``."""
from __future__ import annotations

from typing import Optional

from ..rules.crossrank import judge_rundir
from ..store.job import job_summary, open_job
from .trace import FindingList, Trace


class Job:
    """The rank traces of one job (nndb.store.job checks they make one whole job:
    a UsageError with one line otherwise).  ``ranks``: {rank: Trace};
    ``findings``: the cross-rank findings (the ranks' own are each
    Trace's ``findings``); ``summary(ranks=False)``: what ``nndb inspect
    RUNDIR --json`` prints."""

    def __init__(self, path: str):
        self.path = path
        self._job = open_job(path)
        self.ranks = {k: Trace(r.path) for k, r in self._job.readers.items()}
        self._findings: Optional[list] = None

    @property
    def world_size(self) -> int:
        return self._job.world_size

    @property
    def findings(self) -> list:
        if self._findings is None:
            self._findings = judge_rundir(self._job)[0]
        return FindingList(self._findings)

    def summary(self, ranks: bool = False) -> dict:
        return job_summary(self._job, judge_rundir(self._job), ranks=ranks)

    def close(self) -> None:
        for t in self.ranks.values():
            t.close()
        self._job.close()

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<nndb.Job {self.path!r}: {self.world_size} rank(s)>"
