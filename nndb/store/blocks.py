"""A block of the trace writer (nndb.store.writer): what one flush writes,
taken out of the writer's buffers, and the arrays and blobs it becomes."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..tracer.stats import N_RAW, finalize_many
from .. import schema as K
from .space import NoRoom, check_room

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


def room_needed(b: Block, steps_written: int, grown: int, hist_rows_written: int,
                exact: bool = True) -> int:
    """Bytes block ``b`` may add to the file, at most: its rows at the rate
    the file grew per committed row (``grown`` bytes for ``steps_written``
    rows; twice), or uncompressed before the first block, and its JSON
    (twice), plus room for metadata.  (A block writes whole chunks of
    ``stats``: no chunk is written twice.)  ``exact`` False: its histograms
    counted before compression (FullPending.bytes_needed), a bound that costs nothing."""
    k, s = len(b.rows), b.n_series
    rows = k * s * K.N_STATS * 8 + k * 32
    if steps_written and grown > 0:
        rows = min(rows, 2 * k * (grown // steps_written + 1))
    blobs = blob_bytes([json.dumps(x) for x in b.series + b.events]) + \
        blob_bytes(b.sequences) + 16 * len(b.lineage) + \
        sum(blob_bytes([json.dumps(r) for r in pending]) for pending in b.rows_of.values())
    return rows + 2 * blobs + b.full.bytes_needed(hist_rows_written, exact) + K.ROOM_MARGIN


def check_block_room(path: str, f, b: Block, steps_written: int, grown: int, hist_rows_written: int) -> None:
    """``check_room`` for block ``b`` (room_needed): its histograms counted before compression
    first, a bound that costs nothing, and as deflated only where that bound does not fit
    (measuring them deflated every chunk twice, HDF5 then writing it: 0.9% of a recorded MLP step)."""
    try:
        check_room(path, f, room_needed(b, steps_written, grown, hist_rows_written, exact=False))
    except NoRoom:
        check_room(path, f, room_needed(b, steps_written, grown, hist_rows_written))


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


@dataclass
class Unwritten:
    """What a writer holds that its file does not: all of it in a detached
    writer (a replica's), nothing after a flush.  ``*_written`` say how much
    of the file is this writer's (a replica's copy may see the live run's
    later writes)."""
    rows_written: int
    series_written: int
    lineage_written: int
    sequences_written: int
    series: list = field(default_factory=list)       # [{"id", "name", "kind"}]
    steps: dict = field(default_factory=dict)        # step column -> list, as STEP_COLUMNS
    stats: Optional[np.ndarray] = None               # (rows, series, N_STATS), NaN where absent
    lineage: list = field(default_factory=list)      # [(step, seq)]
    sequences: list = field(default_factory=list)    # [JSON text], lines sequences_written on
    events: list = field(default_factory=list)       # [{"time", "step", "kind", "message"}]
    rows_of: dict = field(default_factory=dict)      # row blob (_ROW_BLOBS) -> its rows not in the file
    row_lines_written: dict = field(default_factory=dict)   # row blob -> its lines in the file


def whole_chunks(written: int, rows: int, waited: bool) -> int:
    """How many of ``rows`` buffered rows a flush on time (--flush-secs)
    writes, ``written`` rows being in the file: up to the last whole
    ``stats`` chunk (K.STATS_CHUNK rows).  A chunk written part-full is
    written again, anew (SWMR mode reuses no space), when it fills; on a
    run whose steps outlast --flush-secs that was once every step.  So the
    rest wait, unless they ``waited`` HOLD_SECS and the file's last chunk is
    whole (a chunk is written part-full at most once that way).  Every other
    flush (--flush-every, a fork, a reader, the end) writes every row."""
    per = K.STATS_CHUNK[0]
    cut = (written + rows) // per * per - written
    if cut <= 0:
        return rows if waited and written % per == 0 else 0
    return cut
