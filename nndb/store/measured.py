"""Which statistics of a trace row were measured: the one place that tells
"not measured" from a measured NaN.

Version 1 of the trace stores both as NaN in ``stats``: a series with no
value at a row has NaN everywhere (its ``count`` is NaN), and between full
steps (``nndb.cadence.Cadence.full``) a tensor's mean, std, min, max,
mean_abs and zero_frac are not measured (NaN) while its count, norm and
NaN/Inf counts are.  What was measured shows in the row itself: a measured
row of a non-empty tensor always has a ``zero_frac`` (the fraction of exact
zeros is defined for every element, NaN and Inf included), so a row whose
``zero_frac`` is NaN was measured without the full statistics.  A NaN in a
measured column is a real NaN: the mean of a tensor that holds only NaN, the
std of an infinite loss.

Everything that shows or exports a statistic asks ``measured`` (or
``measured_values``) here, so a trace layout that stores only what it
measured changes this module and nothing else.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..schema import STAT_NAMES

# Measured at every recorded row of a series; the others only at full rows.
ALWAYS = ("count", "norm", "nan_count", "inf_count")


def measured(stats: np.ndarray, columns: Sequence[str] = STAT_NAMES) -> np.ndarray:
    """bool array of ``stats``' shape (``(..., len(columns))``): which values
    were measured.  ``stats`` holds rows as the reader gives them."""
    stats = np.asarray(stats, dtype=np.float64)
    cols = list(columns)
    count = stats[..., cols.index("count")]
    zero = stats[..., cols.index("zero_frac")]
    has_row = ~np.isnan(count)
    non_empty = has_row & (count > 0)
    full = non_empty & ~np.isnan(zero)
    out = np.empty(stats.shape, dtype=bool)
    for j, name in enumerate(cols):
        if name == "count":
            out[..., j] = has_row
        elif name in ("nan_count", "inf_count"):
            out[..., j] = has_row & ~np.isnan(stats[..., j])
        elif name == "norm":
            out[..., j] = non_empty
        else:
            out[..., j] = full
    return out


def is_measured(row, stat: str, columns: Sequence[str] = STAT_NAMES) -> bool:
    """Was ``stat`` measured in this one row of statistics?"""
    return bool(measured(np.asarray(row, dtype=np.float64)[None, :], columns)[0, list(columns).index(stat)])


def measured_values(row, columns: Sequence[str] = STAT_NAMES, missing=None) -> list:
    """One row of statistics as Python floats, ``missing`` for what was not
    measured (None in data; ``nndb.text.NOT_MEASURED`` where a float is
    needed)."""
    row = np.asarray(row, dtype=np.float64)
    mask = measured(row[None, :], columns)[0]
    return [float(v) if m else missing for v, m in zip(row.tolist(), mask)]


def measured_column(block, stat: str, columns: Sequence[str] = STAT_NAMES, missing=None) -> list:
    """One statistic of rows ``block`` ((N, len(columns))) as a list of floats
    and ``missing``."""
    block = np.asarray(block, dtype=np.float64).reshape(-1, len(columns))
    j = list(columns).index(stat)
    mask = measured(block, columns)[:, j]
    return [float(v) if m else missing for v, m in zip(block[:, j].tolist(), mask)]
