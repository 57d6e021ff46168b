"""A block of the trace writer (nndb.store.writer): what one flush writes,
taken out of the writer's buffers, and the arrays and blobs it becomes."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..tracer.stats import N_RAW, finalize_many
from . import schema as K

STEP_COLUMNS = ("step", "time", "backward_count", "optimizer_steps", "partial")


@dataclass
class Block:
    """What one flush writes, taken out of the writer's buffers in the
    training thread (``TraceWriter._take``) and written in the writer's
    thread, while the buffers fill again."""
    n_series: int
    series: list
    rows: list
    sequences: list
    lineage: list
    events: list
    rows_of: dict
    full: object               # fullstore.FullPending: the whole tensors and histograms


def put_blob(ds, text: str, append: bool = True) -> None:
    data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    start = ds.shape[0] if append else 0
    ds.resize((start + data.size,))
    ds[start:] = data


def blob_bytes(lines: list) -> int:
    return sum(len(t.encode("utf-8")) for t in lines)


def stats_block(rows: list, n_series: int) -> np.ndarray:
    """(len(rows), n_series, N_STATS) statistics of buffered rows; absent series NaN."""
    k = len(rows)
    raw = np.full((k, n_series, N_RAW), np.nan)
    # the steps of one layout (the same series: a few layouts recur) in one assignment
    groups: dict = {}
    for i, (rec, ids) in enumerate(rows):
        g = groups.get(id(ids))
        if g is None:
            g = groups[id(ids)] = (ids, [], [])
        g[1].append(i)
        g[2].append(rec.raw)
    for ids, at, raws in groups.values():
        raw[np.asarray(at)[:, None], np.asarray(ids, dtype=np.int64)[None, :], :] = np.stack(raws)
    # one vectorised finalisation for the whole block; absent series stay NaN
    return finalize_many(raw.reshape(-1, N_RAW)).reshape(k, n_series, K.N_STATS)


def step_columns(rows: list) -> dict:
    return {name: [getattr(r, name) for r, _ in rows] for name in STEP_COLUMNS}
