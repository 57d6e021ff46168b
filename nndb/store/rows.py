"""Reading a trace's statistics row block by row block (the offline rule
invoker walks a whole run without holding its (N, S, 10) array in memory).

It reads through TraceReader.stats_rows only."""
from __future__ import annotations

from typing import Iterator

import numpy as np

BLOCK_ROWS = 512                      # steps at a time (whole chunks: a chunk is one step)


def stat_blocks(reader, rows: int = BLOCK_ROWS) -> Iterator[tuple]:
    """(first row, float64[k, S, 10]) for consecutive blocks of the trace's rows,
    S the number of series the reader knows (NaN where a series has no value)."""
    for start in range(0, reader.n_steps, rows):
        yield start, reader.stats_rows(start, start + rows)


def present(reader, rows: int = BLOCK_ROWS) -> np.ndarray:
    """bool[N, S]: which series have a value at each row (their ``count`` is not NaN)."""
    out = np.zeros((reader.n_steps, len(reader.series())), dtype=bool)
    for start in range(0, reader.n_steps, rows):
        block = reader.stats_rows(start, start + rows, 0)
        out[start:start + len(block), :block.shape[1]] = ~np.isnan(block)
    return out
