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
import zlib
from typing import Optional

import numpy as np

from .. import schema as K
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
        # Tensors kept before step 0 ends, whose names may still change (a second model seen
        # later in step 0 qualifies them: 'main.0' is 'netG.main.0' from then on): no flush
        # writes them until ``release`` (FullTensors.settle renames them first).  Their bytes
        # count in ``bytes``, toward the memory bound, not toward ``max_pending``.
        self.unnamed: list = []
        self.bytes = 0
        self.hists: list = []            # (step, [series ids], (k, HIST_BINS) counts)
        self.skipped_steps: set = set()
        self.said_skip = False

    def full(self, nbytes: int) -> bool:
        """Would one more tensor of ``nbytes`` pass a bound?"""
        return len(self.tensors) + 1 > self.max_pending or self.bytes + nbytes > self.max_bytes

    def fits(self, nbytes: int) -> bool:
        """Can a tensor of ``nbytes`` be held beside what no flush can write yet (``unnamed``)?"""
        return self.bytes + nbytes <= self.max_bytes

    @property
    def unnamed_bytes(self) -> int:
        return sum(flat.nbytes for _, flat in self.unnamed)

    def add(self, meta: dict, flat: np.ndarray, unnamed: bool = False) -> None:
        (self.unnamed if unnamed else self.tensors).append((meta, flat))
        self.bytes += flat.nbytes

    def release(self) -> None:
        """Step 0 has ended: the tensors held for their names are written with the next flush."""
        self.tensors += self.unnamed
        self.unnamed = []

    def bytes_needed(self, hist_rows_written: int = 0, exact: bool = True) -> int:
        """At most what the next flush adds to the file (the room check): the
        tensors' bytes before compression, the histograms' chunks as deflated
        (``hist_bytes``; with ``exact`` False, as they are before compression:
        ~15x more, but nothing deflated twice), and the chunks of step numbers they begin."""
        if not self.hists:
            return self.bytes + 512 * len(self.tensors)
        per = K.STEPS_CHUNK[0]
        k = len(self.hists)
        new_chunks = -(-(hist_rows_written + k) // per) - -(-hist_rows_written // per)
        if exact:
            hists = hist_bytes(self._hist_block())
        else:
            width = max(max(ids) + 1 if ids else 0 for _, ids, _ in self.hists)
            chunks = k * -(-width // K.HIST_CHUNK[1])
            hists = chunks * (K.HIST_CHUNK[1] * K.HIST_BINS * 8 + CHUNK_OVERHEAD)
        return self.bytes + 512 * len(self.tensors) + hists + new_chunks * per * 8

    def _hist_block(self) -> np.ndarray:
        """(rows, series, HIST_BINS) of the histograms waiting, -1 where a series has none."""
        k = len(self.hists)
        width = max(max(ids) + 1 if ids else 0 for _, ids, _ in self.hists)
        block = np.full((k, width, K.HIST_BINS), -1, dtype=np.int64)
        for i, (_, ids, counts) in enumerate(self.hists):
            block[i, ids, :] = counts
        return block

    def write(self, ds: dict, hist_rows_written: int) -> int:
        """Encode and append what waits; returns the histogram rows now in the file."""
        if self.tensors:
            lines = []
            for meta, flat in self.tensors:
                if meta.get("dropped"):
                    continue            # (nndb.tracer.fulltensors.FullTensors.settle)
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
            block = self._hist_block()
            k, width = block.shape[:2]
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
        self.tensors, self.hists = [], []
        self.bytes = self.unnamed_bytes

    def take(self) -> "FullPending":
        """What waits, for a block to write (``write``); this starts empty again, but for
        the tensors still held for their names (``unnamed``)."""
        out = FullPending(self.max_pending, self.max_bytes)
        out.tensors, out.hists = self.tensors, self.hists
        out.bytes = sum(flat.nbytes for _, flat in self.tensors)
        self.drop()
        return out

    def over_bound(self, meta: dict, nbytes: int) -> str:
        """Why a tensor of ``nbytes`` (``meta``'s) is not kept: the bound (``fits``)."""
        held = self.unnamed_bytes
        waiting = (f" beside the {held} bytes of step 0's tensors held until step 0 ends "
                   f"(their names may change until then)") if held else ""
        return (f"full tensors of step {meta.get('step')} skipped: {meta.get('kind')} {meta.get('name')} "
                f"needs {nbytes} bytes{waiting}, over the {self.max_bytes}-byte bound on pending full "
                f"tensors (nndb run --full-tensors-buffer)")

    def skip(self, step: Optional[int], why: str):
        """Note a skipped step's tensor; the message to say (once) or None."""
        first = step not in self.skipped_steps
        self.skipped_steps.add(step)
        if not first:
            return None, None
        said = self.said_skip
        self.said_skip = True
        return why, (None if said else why)


# What HDF5 keeps beside each chunk it writes (its B-tree entry), and the
# share deflate may come out above the size measured here (a different zlib).
CHUNK_OVERHEAD = 64
DEFLATE_SLACK = 1.25


def hist_bytes(block: np.ndarray) -> int:
    """The bytes a block of histogram rows takes in the file, at most: each
    chunk (K.HIST_CHUNK, padded with the fill value -1 as HDF5 writes it)
    shuffled and deflated as K.HIST_FILTERS do, measured by doing it (a
    histogram row is mostly -1 and 0: ~1/15 of its 1.6 KB), with a slack."""
    per = K.HIST_CHUNK[1]
    level = int(K.HIST_FILTERS["compression_opts"])
    k, width = block.shape[:2]
    padded = np.full((k, -(-width // per) * per, K.HIST_BINS), -1, dtype=np.int64)
    padded[:, :width] = block
    total = 0
    for i in range(k):
        for j in range(0, padded.shape[1], per):
            chunk = np.ascontiguousarray(padded[i, j:j + per]).view(np.uint8).reshape(-1, 8)
            total += len(zlib.compress(chunk.T.tobytes(), level)) + CHUNK_OVERHEAD   # (HDF5's shuffle: byte planes)
    return int(total * DEFLATE_SLACK)


def stored_bytes(ds: dict) -> int:
    """The bytes whole tensors and histograms take in the file now (their
    chunks as stored), which the room check counts apart from the rows."""
    total = 0
    for name in ("full/u16", "full/f32", "full/f64", "full/index", "hist/counts", "hist/step"):
        d = ds.get(name)
        if d is not None:
            total += int(d.id.get_storage_size())
    return total
