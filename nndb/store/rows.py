"""Reading a trace's statistics row block by row block (the offline rule
invoker walks a whole run without holding its (N, S, 10) array in memory).

A function beside TraceReader rather than a method of it while the reader is
being reworked; it reads only through the reader's open file and its row and
series counts."""
from __future__ import annotations

from typing import Iterator

import numpy as np

from .schema import STATS_CHUNK

BLOCK_ROWS = 8 * STATS_CHUNK[0]       # whole chunks: 512 steps at a time


def stat_blocks(reader, rows: int = BLOCK_ROWS) -> Iterator[tuple]:
    """(first row, float64[k, S, 10]) for consecutive blocks of the trace's rows,
    S the number of series the reader knows (NaN where a series has no value)."""
    ds = reader._f["stats"]
    n_series = len(reader.series())
    for start in range(0, reader.n_steps, rows):
        stop = min(start + rows, reader.n_steps)
        yield start, np.asarray(ds[start:stop, :n_series, :])


def present(reader, rows: int = BLOCK_ROWS) -> np.ndarray:
    """bool[N, S]: which series have a value at each row (their ``count`` is not NaN)."""
    ds = reader._f["stats"]
    n_series = len(reader.series())
    out = np.zeros((reader.n_steps, n_series), dtype=bool)
    for start in range(0, reader.n_steps, rows):
        stop = min(start + rows, reader.n_steps)
        out[start:stop] = ~np.isnan(np.asarray(ds[start:stop, :n_series, 0]))
    return out
