"""Statistics of one tensor merged across ranks.

A rank's row describes its own part of a tensor: its shard of an FSDP
parameter (and of its gradient and update), its share of the global batch
for activations and the loss.  Raw accumulator rows (nndb.tracer.stats:
count, sum, sum of squares, min, max, sum of |x|, zeros, NaN and Inf
counts) merge exactly by adding sums and counts and taking the extremes:
``merge_raw_rows``, which the front of a live job can use on what ranks
send.  A trace keeps the ten finalised statistics; ``raw_of_stats`` gives
back the raw row they came from (the sums to the last bit of a float64
product: mean x count, norm squared), so ``merge_stats`` combines the rows
of several rank traces into the full tensor's statistics.  A statistic one
rank did not measure stays unmeasured (NaN) in the merge.

What is merged: a sharded parameter's rows (``shard``: its shards add up to
the tensor), activations and losses (the ranks' batches add up to the
global batch).  A replicated parameter (DDP) is the same tensor on every
rank: its merged view is one rank's row (``replicated``), never a sum
(which would count it once per rank); that the replicas agree is
``rank_divergence``'s business.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..tracer.stats import N_RAW, finalize_many, merge_raw
from ..schema import N_STATS, STAT_NAMES

_C = {name: i for i, name in enumerate(STAT_NAMES)}


def merge_raw_rows(raws: Sequence[np.ndarray]) -> np.ndarray:
    """One raw row from several (exact)."""
    rows = [np.asarray(r, dtype=np.float64) for r in raws]
    out = rows[0].copy()
    for r in rows[1:]:
        out = merge_raw(out, r)
    return out


def raw_of_stats(stats: np.ndarray) -> np.ndarray:
    """The raw row (stats.RAW_FIELDS) of one row of the ten statistics; NaN
    where a statistic was not measured; all NaN for an absent row."""
    v = np.asarray(stats, dtype=np.float64)
    raw = np.full(N_RAW, np.nan)
    n = v[_C["count"]]
    if np.isnan(n):
        return raw
    nnan, ninf = v[_C["nan_count"]], v[_C["inf_count"]]
    finite = n - nnan - ninf
    raw[0], raw[7], raw[8] = n, nnan, ninf
    if finite > 0:
        raw[1] = v[_C["mean"]] * finite
        raw[2] = v[_C["norm"]] ** 2
        raw[5] = v[_C["mean_abs"]] * finite
    else:                               # (no finite element: the finite sums are 0)
        raw[1] = raw[2] = raw[5] = 0.0
    if n - nnan > 0:
        raw[3], raw[4] = v[_C["min"]], v[_C["max"]]
    else:
        raw[3], raw[4] = np.inf, -np.inf
    raw[6] = v[_C["zero_frac"]] * n if n > 0 else 0.0
    return raw


def merge_stats(rows: Sequence[np.ndarray]) -> np.ndarray:
    """The ten statistics of a tensor from its parts' rows (absent rows, all NaN, are skipped)."""
    raws = [raw_of_stats(r) for r in rows if not np.isnan(np.asarray(r, dtype=float)[_C["count"]])]
    if not raws:
        return np.full(N_STATS, np.nan)
    return finalize_many([merge_raw_rows(raws)])[0]
