"""TraceWriter: the only code that writes a trace (schema in ``schema.py``).

It appends StepRecords to an in-memory buffer and writes them in one block
per dataset every ``flush_steps`` steps or ``flush_secs`` seconds, whichever
comes first.  A block is committed in two steps: its data (every dataset
resized and written, then flushed), then the ``committed`` counts, which a
reader trusts over the datasets' extents; so a write that fails half-way
never leaves a readable-but-wrong row.  Before a block the writer checks that
the disk (and the process's file size limit) has room for it; a write error
all the same (the disk filled up, the file went away) is reported once
through ``on_error``, the file is closed without writing anything more to it
(HDF5 would otherwise write metadata that points past the file's end),
recording stops, the run goes on, and every committed step stays readable.

The writer only appends: reading, the debugger's of its own live trace
included, is ``TraceReader``'s (``TraceReader.from_writer``).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import h5py
import numpy as np

from ..errors import TraceWriteError
from ..numbers import json_value
from ..tracer.stats import N_RAW, finalize_many
from . import fullstore
from . import schema as K
from .space import NoRoom, check_room, detach_file, reason as _reason

_BLOBS = ("series", "events", "end", "optimizers", "hyper", "fingerprints")
# The JSON-lines blobs a run appends to (row dicts), counted in lines for a replica's reader.
_ROW_BLOBS = ("optimizers", "hyper", "fingerprints")
_STEP_COLUMNS = ("step", "time", "backward_count", "optimizer_steps", "partial")


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
    steps: dict = field(default_factory=dict)        # step column -> list, as _STEP_COLUMNS
    stats: Optional[np.ndarray] = None               # (rows, series, N_STATS), NaN where absent
    lineage: list = field(default_factory=list)      # [(step, seq)]
    sequences: list = field(default_factory=list)    # [JSON text], lines sequences_written on
    events: list = field(default_factory=list)       # [{"time", "step", "kind", "message"}]
    rows_of: dict = field(default_factory=dict)      # row blob (_ROW_BLOBS) -> its rows not in the file
    row_lines_written: dict = field(default_factory=dict)   # row blob -> its lines in the file


def _put_blob(ds, text: str, append: bool = True) -> None:
    data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    start = ds.shape[0] if append else 0
    ds.resize((start + data.size,))
    ds[start:] = data


def _blob_bytes(lines: list) -> int:
    return sum(len(t.encode("utf-8")) for t in lines)


class TraceWriter:
    def __init__(self, path: str, meta: dict, flush_steps: int = 500, flush_secs: float = 2.0,
                 on_error: Optional[Callable[[str], None]] = None, full_max_bytes: Optional[int] = None):
        self.path = path
        self.flush_steps = max(1, int(flush_steps))
        self.flush_secs = flush_secs
        self.on_error = on_error or (lambda msg: None)
        self.failed: Optional[str] = None
        self.closed = False
        self.series: dict = {}          # (name, kind) -> id
        self._new_series: list = []
        self._layouts: dict = {}        # tuple of (name, kind) -> series ids (steps repeat their layout)
        self._by_list: dict = {}        # id of a record's names list -> (that list, series ids)
        self._rows: list = []           # (record, [ids])
        self._events: list = []
        self._last_flush = time.monotonic()
        self.steps_written = 0
        self.last_step: Optional[int] = None
        self.detached = False
        self._sequences: dict = {}       # sequence JSON -> line number
        self._new_sequences: list = []
        self._lineage: list = []         # (step, seq) not yet written
        self.lineage_written = 0
        # (name, kind) -> the tensor's shape, or None: given by the recording (the recorder knows the tensors)
        self.shape_of: Optional[Callable[[str, str], Optional[list]]] = None
        # (name, kind) -> the shape of this rank's shard of a sharded (FSDP) parameter, else None
        self.local_shape_of: Optional[Callable[[str, str], Optional[list]]] = None
        self._pending_rows: dict = {name: [] for name in _ROW_BLOBS}
        self.row_lines_written: dict = {name: 0 for name in _ROW_BLOBS}
        # Whole tensors and histograms waiting for a flush (bounded: nndb.store.fullstore)
        self.full = fullstore.FullPending(max_bytes=fullstore.DEFAULT_MAX_BYTES if full_max_bytes is None
                                          else full_max_bytes)
        self.hist_rows_written = 0
        try:
            d = os.path.dirname(os.path.abspath(path))
            os.makedirs(d, exist_ok=True)
            # No chunk cache: a block's data reaches the file in its write, so a
            # disk that is full fails there, before HDF5 flushes metadata for it.
            self._f = h5py.File(path, "w", libver="latest", rdcc_nbytes=0)
            self._create(meta)
            self._f.swmr_mode = True
            self._f.flush()
        except (OSError, ValueError, RuntimeError) as e:
            self._release()
            raise TraceWriteError(f"cannot create trace {path}: {_reason(e)}") from None
        self._committed_rows = 0
        self._grown = 0                 # bytes the file grew by over the committed rows (room estimates)
        self._size0 = os.path.getsize(path)

    def _create(self, meta: dict) -> None:
        f = self._f
        f.attrs["nndb_format"] = K.FORMAT
        f.attrs["schema_version"] = K.SCHEMA_VERSION
        for key in K.RANK_ATTRS:        # (also in meta: on the root, a job's files are told apart cheaply)
            if meta.get(key) is not None:
                f.attrs[key] = meta[key]
        meta_bytes = np.frombuffer(json.dumps(meta, sort_keys=True).encode("utf-8"), dtype=np.uint8)
        f.create_dataset("meta", data=meta_bytes)
        for name in _BLOBS:
            f.create_dataset(name, shape=(0,), maxshape=(None,), chunks=K.BLOB_CHUNK, dtype="u1")
        g = f.create_group("steps")
        for name, dt in zip(_STEP_COLUMNS, ("i8", "f8", "i4", "i4", "u1")):
            g.create_dataset(name, shape=(0,), maxshape=(None,), chunks=K.STEPS_CHUNK, dtype=dt)
        lg = f.create_group("lineage")
        for name in ("step", "seq"):
            lg.create_dataset(name, shape=(0,), maxshape=(None,), chunks=K.STEPS_CHUNK, dtype="i8")
        lg.create_dataset("sequences", shape=(0,), maxshape=(None,), chunks=K.BLOB_CHUNK, dtype="u1")
        ds = f.create_dataset("stats", shape=(0, 0, K.N_STATS), maxshape=(None, None, K.N_STATS),
                              chunks=K.STATS_CHUNK, dtype="f8", fillvalue=np.nan, **K.STATS_FILTERS)
        ds.attrs["columns"] = json.dumps(list(K.COLUMNS))
        c = f.create_dataset("committed", data=np.zeros(len(K.COMMITTED), dtype="i8"))
        c.attrs["names"] = json.dumps(list(K.COMMITTED))
        # Every dataset opened once: h5py opens it anew at each f[name], which
        # dominated a flush (docs/performance.md).
        self._ds = {name: f[name] for name in _BLOBS + ("stats", "committed")}
        self._ds.update({f"steps/{name}": g[name] for name in g})
        self._ds.update({f"lineage/{name}": lg[name] for name in lg})
        self._ds.update(fullstore.create(f))

    @property
    def file(self) -> Optional[h5py.File]:
        """The open HDF5 file (None once closed), for a reader in this process."""
        return None if self.closed else self._f

    # -- appending -----------------------------------------------------------
    def _series_id(self, name: str, kind: str) -> int:
        key = (name, kind)
        sid = self.series.get(key)
        if sid is None:
            sid = len(self.series)
            self.series[key] = sid
            line = {"id": sid, "name": name, "kind": kind}
            shape = self.shape_of(name, kind) if self.shape_of is not None else None
            if shape is not None:
                line["shape"] = [int(n) for n in shape]
            local = self.local_shape_of(name, kind) if self.local_shape_of is not None else None
            if local is not None:
                line["local_shape"] = [int(n) for n in local]
            self._new_series.append(line)
        return sid

    def append(self, record) -> None:
        if self.failed or self.closed:
            return
        known = self._by_list.get(id(record.names))
        if known is not None and known[0] is record.names:   # (the recorder reuses a layout's list)
            ids = known[1]
        else:
            layout = tuple(record.names)
            ids = self._layouts.get(layout)
            if ids is None:
                ids = [self._series_id(n, k) for n, k in record.names]
                self._layouts[layout] = ids
            if len(self._by_list) < 64:
                self._by_list[id(record.names)] = (record.names, ids)
        self._rows.append((record, ids))
        hist = record.hist
        if hist is not None and not self.detached:
            have = hist[:, 0] >= 0
            if have.any():
                self.full.hists.append((record.step, [i for i, h in zip(ids, have) if h], hist[have]))
        self.last_step = record.step
        if len(self._rows) >= self.flush_steps or \
                time.monotonic() - self._last_flush >= self.flush_secs:
            self.flush()

    def full_tensor(self, meta: dict, nbytes: int, copy: Callable[[], np.ndarray]) -> bool:
        """Keep a whole tensor (``meta``: name, kind, step, shape, dtype, asked;
        ``copy()`` gives its values, a flat host copy, called only if it is
        kept).  Bounded (nndb.store.fullstore): flushes first if the tensor
        would pass the pending bounds; skips it, and says so, if it cannot be
        held even then.  False: not kept."""
        if self.failed or self.closed or self.detached:
            return False
        pending = self.full
        if pending.full(nbytes):
            self.flush()
            if self.failed:
                return False
        if not pending.fits_alone(nbytes):
            step = meta.get("step")
            note, say = pending.skip(step, f"full tensors of step {step} skipped: {meta.get('kind')} "
                                           f"{meta.get('name')} needs {nbytes} bytes, over the "
                                           f"{pending.max_bytes}-byte bound on pending full tensors "
                                           f"(nndb run --full-tensors-buffer)")
            if note is not None:
                self.event("full_tensors_skipped", note, step)
            if say is not None:
                self.on_error("nndb: " + say + " (said once; every skipped step is in the trace's events)")
            return False
        pending.add(meta, copy())
        return True

    def detach(self) -> None:
        """In a replica (a forked copy of the live run): never write to the
        shared file again; steps are kept in memory (``unwritten`` has them)."""
        self.flush_steps = 1 << 62
        self.flush_secs = float("inf")
        self.detached = True

    def lineage(self, step: int, data: dict) -> None:
        """A step's operations (nndb.lineage); a sequence seen before is stored once."""
        if self.failed or self.closed:
            return
        keys = ("ops", "labels", "nonfinite", "checked", "first_bad", "stats", "containers")
        text = json.dumps({k: data[k] for k in keys if k in data}, separators=(",", ":"))
        seq = self._sequences.get(text)
        if seq is None:
            seq = self._sequences[text] = len(self._sequences)
            self._new_sequences.append(text)
        self._lineage.append((step, seq))

    def event(self, kind: str, message: str, step: Optional[int] = None, detail: Optional[dict] = None) -> None:
        """A warning for the trace's ``events`` (``kind``: one of schema.EVENT_KINDS),
        or a finding or stop (schema.RECORD_KINDS, with its ``detail``), written
        at the next flush."""
        if self.failed or self.closed:
            return
        e = {"time": time.time(), "step": step, "kind": kind, "message": message}
        if detail is not None:
            e["detail"] = json_value(detail)    # (JSON-safe now: a flush must never meet a numpy scalar)
        self._events.append(e)

    def optimizers(self, step: int, optimizers: list) -> None:
        """The optimizers as the rules see them from ``step`` on, written when
        they change: [{"name", "groups": [[parameter names], ...]}]."""
        if self.failed or self.closed:
            return
        self._pending_rows["optimizers"].append({"step": step, "optimizers": optimizers})

    def hyper(self, step: int, optimizer: str, group: int, lr: Optional[float]) -> None:
        """The learning rate of one optimizer group from ``step`` on, written when it changes."""
        if self.failed or self.closed:
            return
        self._pending_rows["hyper"].append({"step": step, "optimizer": optimizer, "group": group, "lr": lr})

    def fingerprint(self, row: dict) -> None:
        """A row of the checksums and timings the ranks are compared by
        (nndb.tracer.fingerprint): at each observed step, and at the run's end."""
        if self.failed or self.closed:
            return
        self._pending_rows["fingerprints"].append(row)

    def flush(self) -> None:
        if self.failed or self.closed or self.detached:
            return
        try:
            if self._rows or self._new_series or self._lineage or self._events or \
                    any(self._pending_rows.values()) or self.full.tensors or self.full.hists:
                check_room(self.path, self._f, self._room_needed())
                self._write_pending()
                self._f.flush()                 # the data first,
                self._commit()
                self._f.flush()                 # then the counts that make it readable
        except NoRoom as e:
            self._fail(str(e), wrote=False)
        except (OSError, ValueError, RuntimeError, KeyError) as e:
            self._fail(_reason(e), wrote=True)
        self._last_flush = time.monotonic()

    def _room_needed(self) -> int:
        """Bytes the next block may add to the file, at most: its rows at the
        rate the file grew per committed row (twice), or uncompressed before
        the first block, and its JSON (twice), plus room for metadata.  (A
        block writes whole chunks of ``stats``: no chunk is written twice.)"""
        k, s = len(self._rows), len(self.series)
        rows = k * s * K.N_STATS * 8 + k * 32
        if self.steps_written and self._grown > 0:
            rows = min(rows, 2 * k * (self._grown // self.steps_written + 1))
        blobs = _blob_bytes([json.dumps(x) for x in self._new_series + self._events]) + \
            _blob_bytes(self._new_sequences) + 16 * len(self._lineage) + \
            sum(_blob_bytes([json.dumps(r) for r in pending]) for pending in self._pending_rows.values())
        return rows + 2 * blobs + self.full.bytes_needed() + K.ROOM_MARGIN

    def _commit(self) -> None:
        """Write the counts a reader trusts (schema ``committed``), once the data is on disk."""
        n = {"rows": self.steps_written, "lineage": self.lineage_written, "hist": self.hist_rows_written}
        for name in K.COMMITTED:
            if name not in n:
                n[name] = self._ds[name].shape[0]
        self._ds["committed"][:] = np.asarray([n[name] for name in K.COMMITTED], dtype="i8")
        self._committed_rows = self.steps_written
        self._grown = max(0, os.path.getsize(self.path) - self._size0)

    def _write_pending(self) -> None:
        if self._new_series:
            _put_blob(self._ds["series"], "".join(json.dumps(s) + "\n" for s in self._new_series))
            self._new_series = []
        if self._rows:
            k = len(self._rows)
            n_series = len(self.series)
            block = _stats_block(self._rows, n_series)
            ds = self._ds["stats"]
            start = self.steps_written
            ds.resize((start + k, max(n_series, ds.shape[1]), K.N_STATS))
            ds[start:start + k, :n_series, :] = block
            for name, values in _step_columns(self._rows).items():
                d = self._ds["steps/" + name]
                d.resize((start + k,))
                d[start:] = np.asarray(values, dtype=d.dtype)
            self.steps_written += k
            self._rows = []
        if self._new_sequences or self._lineage:
            if self._new_sequences:
                _put_blob(self._ds["lineage/sequences"], "".join(t + "\n" for t in self._new_sequences))
                self._new_sequences = []
            if self._lineage:
                for i, name in enumerate(("step", "seq")):
                    d = self._ds["lineage/" + name]
                    start = self.lineage_written
                    d.resize((start + len(self._lineage),))
                    d[start:] = np.asarray([row[i] for row in self._lineage], dtype="i8")
                self.lineage_written += len(self._lineage)
                self._lineage = []
        if self._events:
            _put_blob(self._ds["events"], "".join(json.dumps(e) + "\n" for e in self._events))
            self._events = []
        if self.full.tensors or self.full.hists:
            self.hist_rows_written = self.full.write(self._ds, self.hist_rows_written)
        for name, rows in self._pending_rows.items():
            if rows:
                _put_blob(self._ds[name], "".join(json.dumps(r) + "\n" for r in rows))
                self.row_lines_written[name] += len(rows)
                self._pending_rows[name] = []

    def unwritten(self) -> Unwritten:
        """What the file does not hold yet (see Unwritten): a reader adds it."""
        out = Unwritten(self.steps_written, len(self.series) - len(self._new_series),
                        self.lineage_written, len(self._sequences) - len(self._new_sequences),
                        list(self._new_series), lineage=list(self._lineage),
                        sequences=list(self._new_sequences), events=list(self._events),
                        rows_of={k: list(v) for k, v in self._pending_rows.items()},
                        row_lines_written=dict(self.row_lines_written))
        if self._rows:
            out.steps = _step_columns(self._rows)
            out.stats = _stats_block(self._rows, len(self.series))
        return out

    def _fail(self, why: str, wrote: bool) -> None:
        """Stop recording, say so once, and close the file.  After a write
        that failed (``wrote``), nothing more reaches the file: HDF5 would
        flush metadata (the new extents, the end-of-file address) that points
        at data the disk never got; what is on disk is the last committed block."""
        self.failed = f"cannot write trace {self.path}: {why}; recording stopped " \
                      f"(the trace keeps the {self._committed_rows} steps written before)"
        self._rows = []
        self.full.drop()
        self.on_error("nndb: " + self.failed)
        if wrote:
            detach_file(self._f)
        self._release()
        self.closed = True

    def _release(self) -> None:
        """Close the file, our dataset objects first (h5py's close of a file
        whose datasets are still referenced left ids that crashed the
        interpreter in garbage collection)."""
        self._ds = {}
        f = getattr(self, "_f", None)
        if f is None:
            return
        try:
            f.close()
        except Exception:
            pass

    def close(self, status: str, exit_code: int, reason: str = "") -> None:
        """Flush everything and record how the run ended (a replica: nothing)."""
        if self.detached:
            return
        if self.closed:
            return
        self.flush()
        if self.failed:
            return
        try:
            end = {"status": status, "exit_code": exit_code, "reason": reason,
                   "steps": self.steps_written, "last_step": self.last_step, "end_time": time.time()}
            check_room(self.path, self._f, K.ROOM_MARGIN)
            _put_blob(self._ds["end"], json.dumps(end), append=False)
            self._f.flush()
            self._commit()
            self._f.flush()
        except NoRoom as e:
            self._fail(str(e), wrote=False)
            return
        except (OSError, ValueError, RuntimeError, KeyError) as e:
            self._fail(_reason(e), wrote=True)
            return
        self._release()
        self.closed = True


def _stats_block(rows: list, n_series: int) -> np.ndarray:
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


def _step_columns(rows: list) -> dict:
    return {name: [getattr(r, name) for r, _ in rows] for name in _STEP_COLUMNS}
