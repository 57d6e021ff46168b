"""A distributed job's run directory, read as one: ``nndb inspect RUNDIR``.

A run directory holds one trace per rank (``rank<R>.h5``, or any ``*.h5``
whose metadata names its rank).  ``open_job`` checks that they make one
whole job (the same job id, script and world size, every rank once) and
refuses anything else with one line (a UsageError: exit code 2);
``job_summary`` returns plain data (renderers print it): the ranks and
their steps, each rank's findings (its own rule engine's), the cross-rank
findings given (nndb.rules.crossrank.judge_rundir over the ranks' fingerprint rows), and per
tensor the statistics at the last whole step every rank recorded, merged across
ranks (nndb.store.merge) or, with ``ranks=True``, side by side.
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..errors import UsageError
from .measured import measured_values
from .merge import merge_stats
from .reader import TraceReader


@dataclass
class Job:
    directory: str
    readers: dict                       # rank -> TraceReader
    job_id: str
    script: str
    world_size: int
    warnings: list = field(default_factory=list)    # one line each: what the summary should say first

    @property
    def ranks(self) -> list:
        return sorted(self.readers)

    def close(self) -> None:
        for r in self.readers.values():
            r.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _refuse(readers: list, message: str):
    for r in readers:
        r.close()
    raise UsageError(message)


def open_job(directory: str) -> Job:
    """The rank traces of ``directory``, checked to be one whole job."""
    if not os.path.isdir(directory):
        raise UsageError(f"{directory} is not a run directory")
    paths = sorted(glob.glob(os.path.join(glob.escape(directory), "*.h5")))
    if not paths:
        raise UsageError(f"{directory} holds no rank traces (rank<R>.h5): not a run directory of a job")
    readers: list = []
    for p in paths:
        try:
            readers.append(TraceReader(p))
        except Exception:
            for r in readers:
                r.close()
            raise
    first = readers[0]
    fm = first.meta
    by_rank: dict = {}
    for r in readers:
        m = r.meta
        for key, what in (("job_id", "job"), ("script", "script"), ("world_size", "world size")):
            if m.get(key) != fm.get(key):
                _refuse(readers, f"{directory} mixes jobs: {os.path.basename(first.path)} has {what} "
                                 f"{fm.get(key)!r}, {os.path.basename(r.path)} {m.get(key)!r}")
        rank = m.get("rank")
        if not isinstance(rank, int):
            _refuse(readers, f"{r.path} has no rank in its metadata")
        if rank in by_rank:
            _refuse(readers, f"{directory} has two traces of rank {rank}: "
                             f"{os.path.basename(by_rank[rank].path)} and {os.path.basename(r.path)}")
        by_rank[rank] = r
    world = fm.get("world_size")
    if not isinstance(world, int) or world < 1:
        _refuse(readers, f"{first.path} has no world size in its metadata")
    missing = [k for k in range(world) if k not in by_rank]
    if missing:
        _refuse(readers, f"{directory} lacks the trace of rank{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(map(str, missing))} of {world}: a job is read whole")
    stray = sorted(k for k in by_rank if k >= world)
    if stray:
        _refuse(readers, f"{directory} has a trace of rank {stray[0]} in a job of {world} rank(s)")
    job = Job(directory, by_rank, fm.get("job_id") or "", fm.get("script") or "", world)
    for k in job.ranks:
        if by_rank[k].status == "incomplete":
            job.warnings.append(f"rank {k}'s trace is incomplete (its process was killed or is still "
                                f"writing): read up to its last flush")
    return job


def _merge_kind(series) -> str:
    """How one series' rows of several ranks combine (nndb.store.merge)."""
    if series.kind in ("param", "grad", "update"):
        sharded = series.local_shape is not None and series.shape is not None and \
            tuple(series.local_shape) != tuple(series.shape)
        return "shards" if sharded else "replicated"
    return "batch"


def _agree(rows: list) -> bool:
    """Are the ranks' statistics rows of one replicated tensor the same (NaN,
    unmeasured, equal to NaN)?"""
    return all(np.array_equal(rows[0], r, equal_nan=True) for r in rows[1:])


def job_summary(job: Job, cross: tuple, ranks: bool = False) -> dict:
    """The job as plain data (see the module's docstring); ``cross``: the
    cross-rank findings and why they could not be judged
    (nndb.rules.crossrank.judge_rundir)."""
    info = []
    for k in job.ranks:
        r = job.readers[k]
        steps = r.steps
        info.append({"rank": k, "trace": r.path, "status": r.status, "steps": r.n_steps,
                     "first_step": int(steps[0]) if len(steps) else None,
                     "last_step": int(steps[-1]) if len(steps) else None,
                     "partial_steps": [int(x) for x in np.asarray(steps)[np.asarray(r.partial, dtype=bool)]],
                     "findings": r.records("finding")})
    cross, why = cross
    return {"rundir": job.directory, "job_id": job.job_id, "script": job.script,
            "world_size": job.world_size, "warnings": list(job.warnings), "ranks": info,
            "cross_rank_findings": cross, "cross_rank_unjudged": why,
            **_tensors(job, side_by_side=ranks)}


def _tensors(job: Job, side_by_side: bool) -> dict:
    """Per tensor, its statistics at the last whole step every rank recorded (a
    rank's partial last row, the work after its last step end, is no step)."""
    common: Optional[set] = None
    for k in job.ranks:
        r = job.readers[k]
        s = {int(x) for x in np.asarray(r.steps)[~np.asarray(r.partial, dtype=bool)]}
        common = s if common is None else common & s
    if not common:
        return {"step": None, "tensors": []}
    step = max(common)
    rows: dict = {}                     # (name, kind) -> {"series", "by_rank": {rank: stats}}
    cols = job.readers[job.ranks[0]].columns
    for k in job.ranks:
        r = job.readers[k]
        i = int(np.flatnonzero((np.asarray(r.steps) == step) & ~np.asarray(r.partial, dtype=bool))[0])
        block = r.stats_rows(i, i + 1)[0]
        for s in r.series():
            if s.id >= block.shape[0] or np.isnan(block[s.id, 0]):
                continue
            entry = rows.setdefault((s.name, s.kind), {"series": s, "by_rank": {}})
            entry["by_rank"][k] = block[s.id]
    out = []
    for (name, kind), entry in rows.items():
        by = entry["by_rank"]
        how = _merge_kind(entry["series"])
        if how == "replicated" and not _agree(list(by.values())):
            how = "differs"             # (replicas that are not: rank_divergence; or no DDP at all)
        t = {"name": name, "kind": kind, "merge": how, "ranks": sorted(by)}
        if side_by_side:
            t["by_rank"] = {str(k): dict(zip(cols, measured_values(v, cols))) for k, v in sorted(by.items())}
        else:
            merged = by[min(by)] if how in ("replicated", "differs") else merge_stats(list(by.values()))
            t["stats"] = dict(zip(cols, measured_values(merged, cols)))
        out.append(t)
    return {"step": step, "tensors": out}
