"""TraceWriter: the only code that writes a trace (schema in ``schema.py``).

It appends StepRecords to an in-memory buffer and writes them in one block
per dataset every ``flush_steps`` steps or ``flush_secs`` seconds, whichever
comes first (a flush on time writes the whole ``stats`` chunks,
schema.STATS_CHUNK: the last few steps wait for theirs to fill, at most
HOLD_SECS).  The block that a step's ``append`` starts is written in a
thread of the writer's own (``_write``: h5py lets go of the GIL while HDF5
compresses and writes the chunks), while the training thread goes on and
the buffers fill again; one block at a time, so memory stays bounded.
The thread lives as long as the writer (``_Worker``): handing it a block
is a queue put, where starting a thread per block waited a scheduler slice
for it to start (~2% of a sub-millisecond step's loop on a loaded machine).
Whoever needs the file as it stands waits for that block first: ``flush``
(a reader in this process, a checkpoint), ``unwritten``, ``close``, and
every ``os.fork`` (a child forked in the middle of a block would inherit
HDF5's locks held).  A block that fails in the thread is reported by the
training thread, at its next ``append`` or ``flush``.  A block is committed in two steps: its data (every dataset
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

import _thread
import json
import os
import queue
import threading
import time
import weakref
from typing import Callable, Optional

import h5py
import numpy as np

from ..errors import TraceWriteError
from ..text import json_value
from . import fullstore
from .blocks import (STEP_COLUMNS, Block, Unwritten, check_block_room, put_blob, step_columns,
                     stats_block, whole_chunks)
from .. import schema as K
from .space import NoRoom, check_room, detach_file, reason as _reason

_BLOBS = ("series", "events", "end", "optimizers", "hyper", "fingerprints", "modules", "clips")
# The JSON-lines blobs a run appends to (row dicts), counted in lines for a replica's reader.
_ROW_BLOBS = ("optimizers", "hyper", "fingerprints", "modules", "clips")


# The block a step's end starts is written in the writer's thread (False: in
# the training thread, as before; ``scripts/bench.py --writes sync`` measures both).
BACKGROUND = True

# The longest a row waits in memory for its ``stats`` chunk to fill (a run of
# slow steps): then it is written with the chunk part-full (blocks.whole_chunks).
HOLD_SECS = 30.0

# Writers whose thread may be writing: a fork waits for it first (a child
# forked in the middle of a block would inherit HDF5's and h5py's locks held).
_LIVE: "weakref.WeakSet" = weakref.WeakSet()


class _InFlight:
    """A block handed to the writer's thread, until it is written: ``join``
    waits for it (a lock the thread releases when the block is done)."""
    __slots__ = ("_done",)

    def __init__(self):
        self._done = _thread.allocate_lock()
        self._done.acquire()

    def is_alive(self) -> bool:
        return self._done.locked()

    def join(self) -> None:
        self._done.acquire()
        self._done.release()


class _Worker:
    """The writer's one thread, started at its first block and kept until the
    writer closes (or is collected): it writes the blocks put on its queue, one
    at a time.  It holds no reference to the writer between blocks."""

    def __init__(self):
        self.pid = os.getpid()
        self.jobs: "queue.SimpleQueue" = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, args=(self.jobs,), daemon=True,
                                       name="nndb-trace-writer")
        self.thread.start()

    @staticmethod
    def _run(jobs) -> None:
        while True:
            job = jobs.get()
            if job is None:
                return
            write, block, done = job
            try:
                write(block)
            finally:
                del write, block, job           # (no writer held while the thread waits)
                done._done.release()

    def submit(self, write, block) -> _InFlight:
        done = _InFlight()
        self.jobs.put((write, block, done))
        return done

    def stop(self) -> None:
        self.jobs.put(None)


def _before_fork() -> None:
    for w in list(_LIVE):
        w.wait()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork)


def _unlink_old(path: str) -> None:
    """An old trace at ``path`` (``--force``, ``force=True``) is replaced, not
    truncated: HDF5 will not truncate a file this process still has open (a
    ``Trace`` of it: a notebook cell's result), and that reader goes on
    reading the old file.  A symbolic link is left to truncate its target."""
    if os.path.isfile(path) and not os.path.islink(path):
        os.unlink(path)


class TraceWriter:
    """The trace's one writer (the module's docstring says how it writes).

    Why this size: one file written in blocks: the series and sequence
    registries, the rows buffered for the next block, the block's thread and
    its error, and the counts a reader trusts all describe the same file and
    change together at each commit."""

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
        self._rows_since = 0.0          # when the oldest of them came (time.monotonic())
        self._events: list = []
        self._last_flush = time.monotonic()
        self.steps_written = 0
        self.last_step: Optional[int] = None
        self.last_whole_step: Optional[int] = None      # (the last step that ended: no partial row)
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
        self._thread: Optional[_InFlight] = None     # the block the writer's thread is writing, if any
        self._worker: Optional[_Worker] = None       # that thread (started at the first block in the background)
        self._error: Optional[tuple] = None                  # (why, wrote) of a block that failed there
        self._pid = os.getpid()
        try:
            d = os.path.dirname(os.path.abspath(path))
            os.makedirs(d, exist_ok=True)
            _unlink_old(path)
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
        self._grown = 0                 # bytes the file grew by for the committed rows (room estimates)
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
        for name, dt in zip(STEP_COLUMNS, ("i8", "f8", "i4", "i4", "u1")):
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
        if self._error is not None:          # (the last block failed in the writer's thread: said now)
            self.wait()
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
        if not self._rows:
            self._rows_since = time.monotonic()
        self._rows.append((record, ids))
        hist = record.hist
        if hist is not None and not self.detached:
            have = hist[:, 0] >= 0
            if have.any():
                self.full.hists.append((record.step, [i for i, h in zip(ids, have) if h], hist[have]))
        self.last_step = record.step
        if not record.partial:
            self.last_whole_step = record.step
        if len(self._rows) >= self.flush_steps:
            self._flush(background=BACKGROUND)
        elif time.monotonic() - self._last_flush >= self.flush_secs:
            self._flush(background=BACKGROUND, whole=True)      # (whole stats chunks: blocks.whole_chunks)

    def full_tensor(self, meta: dict, nbytes: int, copy: Callable[[], np.ndarray], unnamed: bool = False) -> bool:
        """Keep a whole tensor (``meta``: name, kind, step, shape, dtype, asked;
        ``copy()`` gives its values, a flat host copy, called only if it is
        kept).  Bounded (nndb.store.fullstore): flushes first if the tensor
        would pass the pending bounds; skips it, and says so, if it cannot be
        held even then.  ``unnamed``: taken before step 0 ended, its name may
        still change: held, unwritten, until ``self.full.release()``.  False: not kept."""
        if self.failed or self.closed or self.detached:
            return False
        pending = self.full
        if pending.full(nbytes):
            self.flush()
            if self.failed:
                return False
        if not pending.fits(nbytes):
            step = meta.get("step")
            note, say = pending.skip(step, pending.over_bound(meta, nbytes))
            if note is not None:
                self.event("full_tensors_skipped", note, step)
            if say is not None:
                self.on_error("nndb: " + say + " (said once; every skipped step is in the trace's events)")
            return False
        pending.add(meta, copy(), unnamed)
        return True

    def detach(self) -> None:
        """In a replica (a forked copy of the live run): never write to the
        shared file again; steps are kept in memory (``unwritten`` has them)."""
        self.wait()
        self.flush_steps = 1 << 62
        self.flush_secs = float("inf")
        self.detached = True

    def lineage(self, step: int, data: dict) -> None:
        """A step's operations (nndb.lineage); a sequence seen before is stored once."""
        if self.failed or self.closed:
            return
        keys = ("ops", "labels", "nonfinite", "checked", "first_bad", "stats", "containers", "echoes")
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
        self._row("optimizers", {"step": step, "optimizers": optimizers})

    def hyper(self, step: int, optimizer: str, group: int, lr: Optional[float], weight_decay=None, momentum=None,
              betas: Optional[tuple] = None) -> None:
        """One optimizer group's hyper-parameters from ``step`` on, written when one changes (those it has)."""
        row = {"step": step, "optimizer": optimizer, "group": group, "lr": lr, "weight_decay": weight_decay,
               "momentum": momentum, "betas": None if betas is None else list(betas)}
        self._row("hyper", {k: v for k, v in row.items() if v is not None or k == "lr"})

    def modules(self, step: int, names: list, types: Optional[list] = None) -> None:
        """The model's modules in registration order (each root's modules, a
        module after those it holds; roots in the order seen), as they are
        named in the trace's series, and their classes' names (``types``,
        beside ``names``), written when a root is added."""
        row = {"step": step, "modules": names}
        if types is not None:
            row["types"] = types
        self._row("modules", row)

    def clips(self, step: int, clips: Optional[dict]) -> None:
        """The step's clip_grad_norm_ calls from ``step`` on, written when they change:
        {series name: [max_norm or None, measured gradients a GradScaler had not unscaled]}
        (None: no call)."""
        self._row("clips", {"step": step, "clips": None if clips is None else {k: list(v) for k, v in clips.items()}})

    def fingerprint(self, row: dict) -> None:
        """A row of the checksums and timings the ranks are compared by
        (nndb.tracer.fingerprint): at each observed step, and at the run's end."""
        self._row("fingerprints", row)

    def _row(self, blob: str, row: dict) -> None:
        if not (self.failed or self.closed):
            self._pending_rows[blob].append(row)

    def flush(self) -> None:
        """Write everything appended so far, and return once it is committed
        (a reader of the file, a fork, the run's end need that)."""
        self._flush(background=False)

    def start_flush(self, min_steps: int = 1) -> bool:
        """With ``min_steps`` steps or more appended, hand what is appended to
        the writer's thread and return at once (a checkpoint asks this ahead
        of its fork: ``flush`` then has little left to write); True if it did."""
        if len(self._rows) < min_steps:
            return False
        self._flush(background=BACKGROUND)
        return True

    @property
    def busy(self) -> bool:
        """The writer's thread is writing a block now."""
        return self._thread is not None and self._thread.is_alive()

    def _held_back(self) -> tuple:
        """(rows, histograms) a flush on time leaves for a later one
        (blocks.whole_chunks): the last rows, and their steps' histograms."""
        rows = self._rows
        if not rows:
            return [], []
        cut = whole_chunks(self.steps_written, len(rows), time.monotonic() - self._rows_since >= HOLD_SECS)
        if cut >= len(rows):
            return [], []
        if cut > 0:
            self._rows_since = time.monotonic()     # (about when the rows held came: since the last flush)
        self._rows = rows[:cut]
        first = rows[cut][0].step
        hists = [h for h in self.full.hists if h[0] >= first]
        if hists:
            self.full.hists = [h for h in self.full.hists if h[0] < first]
        return rows[cut:], hists

    def _flush(self, background: bool, whole: bool = False) -> None:
        self.wait()                      # (one block at a time: memory stays bounded)
        if self.failed or self.closed or self.detached:
            return
        held, held_hists = self._held_back() if whole else ([], [])
        if self._rows or self._new_series or self._lineage or self._events or \
                any(self._pending_rows.values()) or self.full.tensors or self.full.hists:
            block = self._take()
            if background:
                worker = self._worker
                if worker is None or worker.pid != os.getpid():      # (a forked child has no thread of ours)
                    worker = self._worker = _Worker()
                    weakref.finalize(self, worker.stop)
                    _LIVE.add(self)
                self._thread = worker.submit(self._write, block)
            else:
                self._write(block)
                self._settle()
        if held:
            self._rows = held + self._rows        # (still the oldest: none came in between)
            self.full.hists = held_hists + self.full.hists
        self._last_flush = time.monotonic()

    def wait(self) -> None:
        """Wait for the block the writer's thread is writing, if any; a write
        that failed there is reported here, in the caller's thread."""
        t = self._thread
        if t is None:
            return
        if self._pid == os.getpid():
            t.join()
        self._thread = None
        self._settle()

    def _settle(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            self._fail(*error)

    def _write(self, block: Block) -> None:
        """One block: its data, then the counts that make it readable.  Runs
        in the writer's thread (h5py lets go of the GIL while HDF5 compresses
        and writes) or in the caller's; touches only the file and the
        ``*_written`` counts, never the buffers the training thread fills."""
        try:
            check_block_room(self.path, self._f, block, self.steps_written, self._grown, self.hist_rows_written)
            self._write_block(block)
            self._f.flush()                 # the data first,
            self._commit()
            self._f.flush()                 # then the counts that make it readable
        except NoRoom as e:
            self._error = (str(e), False)
        except (OSError, ValueError, RuntimeError, KeyError) as e:
            self._error = (_reason(e), True)
        except Exception as e:              # (never into the user's program, from any thread)
            self._error = (f"{type(e).__name__}: {e}", True)

    def _take(self) -> Block:
        """The buffers, as a block to write; they start empty again."""
        block = Block(len(self.series), self._new_series, self._rows,
                       self._new_sequences, self._lineage, self._events,
                       {k: v for k, v in self._pending_rows.items() if v}, self.full.take())
        self._new_series, self._rows, self._new_sequences, self._lineage, self._events = [], [], [], [], []
        self._pending_rows = {name: [] for name in _ROW_BLOBS}
        return block

    def _commit(self) -> None:
        """Write the counts a reader trusts (schema ``committed``), once the data is on disk."""
        n = {"rows": self.steps_written, "lineage": self.lineage_written, "hist": self.hist_rows_written}
        for name in K.COMMITTED:
            if name not in n:
                n[name] = self._ds[name].shape[0]
        self._ds["committed"][:] = np.asarray([n[name] for name in K.COMMITTED], dtype="i8")
        self._committed_rows = self.steps_written
        # (less what whole tensors and histograms take: the next block's are counted on their own)
        self._grown = max(0, os.path.getsize(self.path) - self._size0 - fullstore.stored_bytes(self._ds))

    def _write_block(self, b: Block) -> None:
        if b.series:
            put_blob(self._ds["series"], "".join(json.dumps(s) + "\n" for s in b.series))
        ds = self._ds["stats"]
        if b.n_series > ds.shape[1]:        # (new series whose rows wait for their chunk: read from the buffer)
            ds.resize((ds.shape[0], b.n_series, K.N_STATS))
        if b.rows:
            k = len(b.rows)
            block = stats_block(b.rows, b.n_series)
            start = self.steps_written
            ds.resize((start + k, ds.shape[1], K.N_STATS))
            ds[start:start + k, :b.n_series, :] = block
            for name, values in step_columns(b.rows).items():
                d = self._ds["steps/" + name]
                d.resize((start + k,))
                d[start:] = np.asarray(values, dtype=d.dtype)
            self.steps_written += k
        if b.sequences:
            put_blob(self._ds["lineage/sequences"], "".join(t + "\n" for t in b.sequences))
        if b.lineage:
            for i, name in enumerate(("step", "seq")):
                d = self._ds["lineage/" + name]
                start = self.lineage_written
                d.resize((start + len(b.lineage),))
                d[start:] = np.asarray([row[i] for row in b.lineage], dtype="i8")
            self.lineage_written += len(b.lineage)
        if b.events:
            put_blob(self._ds["events"], "".join(json.dumps(e) + "\n" for e in b.events))
        if b.full.tensors or b.full.hists:
            self.hist_rows_written = b.full.write(self._ds, self.hist_rows_written)
        for name, rows in b.rows_of.items():
            put_blob(self._ds[name], "".join(json.dumps(r) + "\n" for r in rows))
            self.row_lines_written[name] += len(rows)

    def unwritten(self) -> Unwritten:
        self.wait()
        """What the file does not hold yet (see Unwritten): a reader adds it."""
        out = Unwritten(self.steps_written, len(self.series) - len(self._new_series),
                        self.lineage_written, len(self._sequences) - len(self._new_sequences),
                        list(self._new_series), lineage=list(self._lineage),
                        sequences=list(self._new_sequences), events=list(self._events),
                        rows_of={k: list(v) for k, v in self._pending_rows.items()},
                        row_lines_written=dict(self.row_lines_written))
        if self._rows:
            out.steps = step_columns(self._rows)
            out.stats = stats_block(self._rows, len(self.series))
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
        worker, self._worker = self._worker, None
        if worker is not None and worker.pid == os.getpid():
            worker.stop()
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
        self.full.release()      # (a run that ended before step 0 did: its tensors under the names they had)
        self.flush()
        if self.failed:
            return
        try:
            end = {"status": status, "exit_code": exit_code, "reason": reason,
                   "steps": self.steps_written, "last_step": self.last_step, "end_time": time.time()}
            check_room(self.path, self._f, K.ROOM_MARGIN)
            put_blob(self._ds["end"], json.dumps(end), append=False)
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
