"""A trace's histograms (schema ``hist/``) as a sink's histogram points:
TensorBoard's histogram view (``add_histogram_raw``).

A point is the finite values of one series at one full step: the trace's
half-binade bins (nndb.histogram) as buckets, whose upper edges are
the bucket limits; NaN and +/-Inf have no bucket in TensorBoard and are left
out (their counts are the ``nan_count`` and ``inf_count`` scalars).  ``sum``
and ``sum_squares`` come from the step's statistics (mean over the finite
elements and norm), ``min`` and ``max`` from the statistics where finite,
else from the outermost non-empty bins.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator

import numpy as np

from .. import histogram as H
from .scalars import PARTIAL, start_time

# the finite bins, in value order, and each one's upper edge (the overflow bins: the float32 extremes)
_FINITE = np.arange(H.I_NEG_OVER, H.I_POS_OVER + 1)
_F32_MAX = float(np.finfo(np.float32).max)
_LIMITS = np.array([min(H.RANGES[i][1], _F32_MAX) for i in _FINITE], dtype=np.float64)


def tag(kind: str, name: str) -> str:
    return f"{kind}/{name}/hist"


@dataclass(frozen=True)
class HistogramPoint:
    tag: str
    step: int
    walltime: float
    min: float
    max: float
    num: int
    sum: float
    sum_squares: float
    bucket_limits: list
    bucket_counts: list


def _stat(stats: dict, key: str):
    v = stats.get(key)
    return v if v is not None and np.isfinite(v) else None


def point(kind: str, name: str, step: int, walltime: float, h: np.ndarray, stats: dict):
    """One histogram as a point, or None without a finite element."""
    counts = np.asarray(h, dtype=np.int64)[_FINITE]
    num = int(counts.sum())
    if num == 0:
        return None
    used = np.nonzero(counts)[0]
    lo_bin, hi_bin = int(used[0]), int(used[-1])
    low = max(H.RANGES[_FINITE[lo_bin]][0], -_F32_MAX)
    high = min(H.RANGES[_FINITE[hi_bin]][1], _F32_MAX)
    mn = _stat(stats, "min")
    mx = _stat(stats, "max")
    mean, norm = _stat(stats, "mean"), _stat(stats, "norm")
    total = mean * num if mean is not None else 0.0
    sumsq = norm * norm if norm is not None else 0.0
    # TensorBoard draws buckets between the limits from ``min`` on: only the used range
    sel = slice(lo_bin, hi_bin + 1)
    return HistogramPoint(tag(kind, name), int(step), float(walltime),
                          float(mn if mn is not None else low), float(mx if mx is not None else high),
                          num, float(total), float(sumsq), _LIMITS[sel].tolist(), counts[sel].tolist())


def trace_histograms(reader) -> Iterator[HistogramPoint]:
    """Every histogram of a trace, series by series, step by step (a partial
    row's under ``partial/``, as its scalars)."""
    start = start_time(reader.meta)
    time_of = dict(zip(reader.steps.tolist(), reader.times.tolist()))
    row_of = {int(s): i for i, s in enumerate(reader.steps.tolist())}
    partial = {int(s) for s in reader.steps[reader.partial]}
    cols = list(reader.columns)
    for s in reader.series():
        for step in reader.histogram_steps(s.name, s.kind):
            h = reader.histogram(s.name, s.kind, step)
            if h is None:
                continue
            i = row_of.get(step)
            stats = {}
            if i is not None:
                row = reader.stats_rows(i, i + 1)[0, s.id]
                stats = dict(zip(cols, row.tolist()))
            p = point(s.kind, s.name, step, start + time_of.get(step, 0.0), h, stats)
            if p is not None:
                yield replace(p, tag=PARTIAL + p.tag) if step in partial else p
