"""The trace writer's part for whole tensors (schema ``full/``) and histograms
(schema ``hist/``): what waits for the next flush, and how it is written.

Bounded memory: at most ``max_pending`` tensors and ``max_bytes`` bytes of
them wait for a flush.  A tensor that would pass either bound makes the
writer flush first (the write is synchronous: a bounded pause, never an
unbounded wait); a step's tensor larger than ``max_bytes`` on its own, or one
offered while the writer cannot write, is skipped, and the skip is said once
on stderr and recorded in the trace's events (``full_tensors_skipped``) for
every step it happens at.
"""
from __future__ import annotations

import json
from typing import Optional

import numpy as np

from . import schema as K
from .precision import STORE_OF, encode

DEFAULT_MAX_PENDING = 32
DEFAULT_MAX_BYTES = 256 << 20


def create(f) -> dict:
    """The ``full/`` and ``hist/`` datasets (at open, before SWMR), by name."""
    g = f.create_group("full")
    g.create_dataset("index", shape=(0,), maxshape=(None,), chunks=K.BLOB_CHUNK, dtype="u1")
    for name, dt in K.FULL_DATA.items():
        g.create_dataset(name, shape=(0,), maxshape=(None,), chunks=K.FULL_CHUNK, dtype=dt, **K.FULL_FILTERS)
    h = f.create_group("hist")
    h.create_dataset("step", shape=(0,), maxshape=(None,), chunks=K.STEPS_CHUNK, dtype="i8")
    h.create_dataset("counts", shape=(0, 0, K.HIST_BINS), maxshape=(None, None, K.HIST_BINS),
                     chunks=K.HIST_CHUNK, dtype="i8", fillvalue=-1, **K.HIST_FILTERS)
    out = {f"full/{n}": g[n] for n in g}
    out.update({f"hist/{n}": h[n] for n in h})
    return out


class FullPending:
    """Whole tensors and histogram rows waiting for the writer's next flush."""

    def __init__(self, max_pending: int = DEFAULT_MAX_PENDING, max_bytes: int = DEFAULT_MAX_BYTES):
        self.max_pending = max(1, int(max_pending))
        self.max_bytes = max(0, int(max_bytes))
        self.tensors: list = []          # (meta dict, flat array)
        self.bytes = 0
        self.hists: list = []            # (step, [series ids], (k, HIST_BINS) counts)
        self.skipped_steps: set = set()
        self.said_skip = False

    def full(self, nbytes: int) -> bool:
        """Would one more tensor of ``nbytes`` pass a bound?"""
        return len(self.tensors) + 1 > self.max_pending or self.bytes + nbytes > self.max_bytes

    def fits_alone(self, nbytes: int) -> bool:
        return nbytes <= self.max_bytes

    def add(self, meta: dict, flat: np.ndarray) -> None:
        self.tensors.append((meta, flat))
        self.bytes += flat.nbytes

    def bytes_needed(self) -> int:
        """At most what the next flush adds to the file (the room check)."""
        rows = sum(len(ids) * K.HIST_BINS * 8 + 8 for _, ids, _ in self.hists)
        return self.bytes + 512 * len(self.tensors) + rows

    def write(self, ds: dict, hist_rows_written: int) -> int:
        """Encode and append what waits; returns the histogram rows now in the file."""
        if self.tensors:
            lines = []
            for meta, flat in self.tensors:
                enc = encode(flat, meta["asked"])
                store = STORE_OF[enc.used]
                d = ds["full/" + store]
                start = d.shape[0]
                d.resize((start + enc.data.size,))
                d[start:] = enc.data
                lines.append(dict(meta, used=enc.used, scale=enc.scale, store=store,
                                  offset=int(start), count=int(enc.data.size)))
            text = "".join(json.dumps(m) + "\n" for m in lines)
            data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
            idx = ds["full/index"]
            start = idx.shape[0]
            idx.resize((start + data.size,))
            idx[start:] = data
            self.tensors = []
            self.bytes = 0
        if self.hists:
            k = len(self.hists)
            width = max(max(ids) + 1 if ids else 0 for _, ids, _ in self.hists)
            block = np.full((k, width, K.HIST_BINS), -1, dtype=np.int64)
            for i, (_, ids, counts) in enumerate(self.hists):
                block[i, ids, :] = counts
            counts_ds, steps_ds = ds["hist/counts"], ds["hist/step"]
            start = hist_rows_written
            counts_ds.resize((start + k, max(width, counts_ds.shape[1]), K.HIST_BINS))
            counts_ds[start:start + k, :width, :] = block
            steps_ds.resize((start + k,))
            steps_ds[start:] = np.asarray([s for s, _, _ in self.hists], dtype=np.int64)
            self.hists = []
            hist_rows_written += k
        return hist_rows_written

    def drop(self) -> None:
        self.tensors, self.hists, self.bytes = [], [], 0

    def take(self) -> "FullPending":
        """What waits, for a block to write (``write``); this starts empty again."""
        out = FullPending(self.max_pending, self.max_bytes)
        out.tensors, out.hists, out.bytes = self.tensors, self.hists, self.bytes
        self.drop()
        return out

    def skip(self, step: Optional[int], why: str):
        """Note a skipped step's tensor; the message to say (once) or None."""
        first = step not in self.skipped_steps
        self.skipped_steps.add(step)
        if not first:
            return None, None
        said = self.said_skip
        self.said_skip = True
        return why, (None if said else why)
