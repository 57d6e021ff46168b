"""TraceReader: the only code that reads a trace (schema in ``schema.py``).

Opens in SWMR mode, so a trace can be read while its run is still writing it
and after its writer was killed; ``from_writer`` reads the trace a writer of
this process is writing, through its open file, latest steps included.  Anything that is not a readable nndb trace
raises ``TraceError`` with a one-line reason; nothing is unpickled.

Why this size: the one reader of the trace format (docs/trace-format.md): every
dataset, its additions since version 1 and the forms a killed run leaves, read in
one place so that a reader of a damaged trace fails one way, with one line.
"""
from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass
from typing import Optional

import h5py
import numpy as np

from ..errors import TraceError, UsageError
from .. import schema as K
from .fullreader import FullReads


@dataclass(frozen=True)
class SeriesInfo:
    id: int
    name: str
    kind: str
    shape: Optional[tuple] = None       # a param, grad or update series' tensor shape (None: not recorded)
    local_shape: Optional[tuple] = None  # its shard's shape on this rank, for a sharded (FSDP) parameter


def _series_info(d: dict) -> SeriesInfo:
    shape, local = d.get("shape"), d.get("local_shape")
    return SeriesInfo(int(d["id"]), d["name"], d["kind"], tuple(int(n) for n in shape) if shape is not None else None,
                      tuple(int(n) for n in local) if local is not None else None)


# What h5py, numpy and json raise on a file that is damaged in some way: the
# reader turns each into a TraceError (one line; nndb inspect exits 2).
_DAMAGE = (OSError, KeyError, ValueError, TypeError, IndexError, AttributeError, RuntimeError,
           UnicodeDecodeError, OverflowError, RecursionError)


class _ClosedFile:
    """What a closed TraceReader reads through: every read is one UsageError
    line.  (h5py's closed File answers ``get`` with None, so the readers of
    the optional groups, whole tensors, histograms, lineage, said the trace
    kept none, and the others that the file was corrupted.)"""

    def __init__(self, path: str):
        self._path = path

    def _closed(self, *_args, **_kw):
        raise UsageError(f"trace {self._path} was closed (close(), or the end of its 'with' block): "
                         f"nndb.open it again to read it")

    def __getattr__(self, name):
        self._closed()

    __getitem__ = __contains__ = __iter__ = _closed


def _reads(method):
    """A query that reads the file: a damaged part of it raises TraceError."""
    @functools.wraps(method)
    def guarded(self, *args, **kw):
        try:
            return method(self, *args, **kw)
        except TraceError:
            raise
        except _DAMAGE as e:
            raise TraceError(f"cannot read trace {self.path}: it is corrupted ({_short(e)})") from None
    return guarded


def _json_blob(ds, n: Optional[int] = None) -> str:
    """A JSON blob's text: its first ``n`` bytes (the committed ones), or all."""
    return bytes(np.asarray(ds[:n], dtype=np.uint8)).decode("utf-8")


# SWMR reads retry a metadata block that fails its checksum (a writer may be
# midway through it): HDF5's default is 100 attempts with a growing sleep,
# which on a damaged file is minutes to hours.  A few attempts (a few ms) are
# enough for a live writer's flush, which nndb makes in one go.
SWMR_READ_ATTEMPTS = 4


def _open_swmr(path: str) -> "h5py.File":
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_EARLIEST, h5py.h5f.LIBVER_LATEST)
    _limit_read_attempts(fapl, SWMR_READ_ATTEMPTS)
    fid = h5py.h5f.open(os.fsencode(path), h5py.h5f.ACC_RDONLY | h5py.h5f.ACC_SWMR_READ, fapl=fapl)
    return h5py.File(fid)


_SET_READ_ATTEMPTS: list = []


def _limit_read_attempts(fapl, attempts: int) -> None:
    """H5Pset_metadata_read_attempts, which h5py does not wrap, from the
    HDF5 library this process has loaded (h5py's); left at HDF5's default
    where it cannot be found."""
    if not _SET_READ_ATTEMPTS:
        fn = None
        try:
            import ctypes
            with open("/proc/self/maps") as maps:
                libs = sorted({line.split()[-1] for line in maps if "/libhdf5" in line
                               and "libhdf5_hl" not in line})
            if libs:
                fn = ctypes.CDLL(libs[0]).H5Pset_metadata_read_attempts
                fn.argtypes, fn.restype = [ctypes.c_int64, ctypes.c_uint], ctypes.c_int
        except (OSError, AttributeError, ImportError):
            fn = None
        _SET_READ_ATTEMPTS.append(fn)
    fn = _SET_READ_ATTEMPTS[0]
    if fn is not None:
        fn(fapl.id, attempts)


def open_hdf5(path: str) -> "h5py.File":
    """An HDF5 file opened for reading: plainly, or, if it is flagged open for
    writing (a live writer, or one killed), in SWMR mode."""
    try:
        return h5py.File(path, "r")
    except _DAMAGE:
        return _open_swmr(path)


def _directory_refused(path: str) -> str:
    """The line for a directory given where one trace goes: a torchrun job's run
    directory (one trace per rank) is named so, with what to give instead."""
    names = sorted(n for n in os.listdir(path) if n.endswith(".h5"))
    if not names:
        return f"{path} is a directory, not a trace"
    first = os.path.join(path, "rank0.h5" if "rank0.h5" in names else names[0])
    held = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return (f"{path} is a directory of {len(names)} trace(s) ({held}), a distributed job's run directory: give "
            f"one rank's trace ({first}); nndb inspect {path} reads the ranks together")


class TraceReader(FullReads):
    def __init__(self, path: str):
        self.path = path
        self._live = False
        if not os.path.exists(path):
            raise TraceError(f"no such trace: {path}")
        if os.path.isdir(path):
            raise TraceError(_directory_refused(path))
        try:
            if not h5py.is_hdf5(path):
                raise TraceError(f"{path} is not an nndb trace (not an HDF5 file)")
        except _DAMAGE as e:
            raise TraceError(f"cannot read {path}: {_short(e)}") from None
        _check_not_truncated(path)
        # A closed trace opens plainly.  A trace whose writer is still running,
        # or was killed, carries HDF5's "open for writing" flag and opens only
        # in SWMR mode (which retries reads that fail their checksums, so it
        # is used only where needed).
        try:
            self._f = h5py.File(path, "r")
        except _DAMAGE as plain_error:
            try:
                self._f = _open_swmr(path)
            except _DAMAGE:
                raise TraceError(f"cannot read trace {path}: it is truncated or corrupted "
                                 f"({_short(plain_error)})") from None
        self._guarded_load(None)

    @classmethod
    def from_writer(cls, writer) -> "TraceReader":
        """The trace a TraceWriter of this process is writing, read through its
        open file: the writer is flushed first, so every step appended so far
        is seen (a detached writer's, a replica's, from its buffer).  Closing
        this reader leaves the writer's file open."""
        writer.flush()
        f = writer.file
        if f is None:
            raise TraceError(f"cannot read trace {writer.path}: "
                             f"{writer.failed or 'its writer has closed it'}")
        self = cls.__new__(cls)
        self.path = writer.path
        self._live = True
        self._f = f
        self._guarded_load(writer.unwritten())
        return self

    def _guarded_load(self, unwritten) -> None:
        try:
            self._load(unwritten)
        except TraceError:
            self.close()
            raise
        except _DAMAGE as e:
            self.close()
            raise TraceError(f"cannot read trace {self.path}: it is truncated or corrupted ({_short(e)})") from None

    def _load(self, unwritten) -> None:
        f = self._f
        if f.attrs.get("nndb_format") != K.FORMAT:
            raise TraceError(f"{self.path} is not an nndb trace")
        raw = np.asarray(f.attrs.get("schema_version", -1)).item()
        if isinstance(raw, (bytes, str)) or not math.isfinite(float(raw)):
            raise ValueError(f"schema_version {raw!r} is not a number")
        if float(raw) > K.SCHEMA_VERSION:       # (1.5 too: not version 1)
            raise TraceError(f"{self.path} has trace schema version {raw:g}; "
                             f"this nndb reads version {K.SCHEMA_VERSION} (upgrade nndb)")
        version = int(raw)
        if version != raw or version < 1:
            raise TraceError(f"cannot read trace {self.path}: it is corrupted "
                             f"(schema version {version}: nndb never wrote one)")
        _check_layout(f)
        self.schema_version = version
        if not self._live:      # (a file open for writing here is current already)
            for ds in (f["stats"], f["series"], f["end"], f["events"], *f["steps"].values()):
                ds.refresh()
        self._committed = _committed(f, self._live)
        self.meta = _expect(json.loads(_json_blob(f["meta"])), dict, "meta")
        self.columns = tuple(json.loads(f["stats"].attrs["columns"]))
        if len(self.columns) != f["stats"].shape[2] or not all(isinstance(c, str) for c in self.columns) \
                or not {"count", "zero_frac"} <= set(self.columns):     # (what measured() reads)
            raise ValueError("the statistics' columns do not match stats")
        self._series: list = []
        for line in _json_blob(f["series"], self._committed.get("series")).splitlines():
            if line.strip():
                info = _series_info(_expect(json.loads(line), dict, "a series"))
                if info.id != len(self._series) or not isinstance(info.name, str) or info.kind not in K.KINDS:
                    raise ValueError(f"series line {len(self._series) + 1} is not the schema's")
                self._series.append(info)
        # A kill between two writes can leave one dataset a flush ahead of
        # another; a failed write, extents ahead of their data: only the
        # committed rows count (traces before ``committed``: the shortest).
        n_rows = min([f["stats"].shape[0]] + [d.shape[0] for d in f["steps"].values()])
        if "rows" in self._committed:
            n_rows = min(n_rows, self._committed["rows"])
        n_series = min(len(self._series), f["stats"].shape[1])
        if unwritten is not None:       # only what this writer wrote (a replica's file moves on)
            n_rows = min(n_rows, unwritten.rows_written)
            n_series = min(n_series, unwritten.series_written)
        self._n_rows = n_rows
        self._n_series = n_series
        self._series = self._series[:n_series]
        steps = {name: _counts(f["steps"][name][:n_rows], name) if name != "time" else
                 np.asarray(f["steps"][name][:n_rows])
                 for name in ("step", "time", "backward_count", "optimizer_steps", "partial")}
        self._events = [_expect(json.loads(line), dict, "an event")
                        for line in _json_blob(f["events"], self._committed.get("events")).splitlines() if line.strip()]
        self._unwritten = unwritten
        self._sequence_lines: Optional[list] = None
        self._row_blobs: dict = {}      # name -> its rows (None: the trace predates it), read once
        self._extra_stats = None        # (rows, series, N_STATS) not in the file yet
        if unwritten is not None:
            self._series += [_series_info(d) for d in unwritten.series]
            if unwritten.stats is not None:
                self._extra_stats = unwritten.stats
                for name in steps:
                    steps[name] = np.concatenate([steps[name], np.asarray(unwritten.steps[name],
                                                                          dtype=steps[name].dtype)])
            self._events += unwritten.events
        self.steps = steps["step"]
        self.times = steps["time"]
        self.backward_count = steps["backward_count"]
        self.optimizer_steps = steps["optimizer_steps"]
        self.partial = steps["partial"].astype(bool)
        end = _json_blob(f["end"], self._committed.get("end"))
        self.end: Optional[dict] = _expect(json.loads(end), dict, "end") if end.strip() else None
        if self.end is not None and not isinstance(self.end.get("status"), str):
            raise ValueError("end has no status")
        self._by_key = {(s.name, s.kind): s for s in self._series}

    # -- lineage (nndb.lineage) ------------------------------------------------
    @_reads
    def lineage_steps(self) -> list:
        g = self._f.get("lineage")
        if g is None:
            return []
        if not self._live:
            g["step"].refresh()
            g["seq"].refresh()
        n = min(g["step"].shape[0], g["seq"].shape[0], self._committed.get("lineage", 1 << 62))
        if self._unwritten is not None:
            n = min(n, self._unwritten.lineage_written)
        steps = [int(x) for x in g["step"][:n]]
        if self._unwritten is not None:
            steps += [st for st, _ in self._unwritten.lineage]
        return steps

    @_reads
    def lineage(self, step: int) -> Optional[dict]:
        """A step's recorded operations (the last record of that step), or None."""
        g = self._f.get("lineage")
        if g is None:
            return None
        steps = self.lineage_steps()
        if step not in steps:
            return None
        i = len(steps) - 1 - steps[::-1].index(step)
        n_file = len(steps) - (len(self._unwritten.lineage) if self._unwritten is not None else 0)
        seq = int(g["seq"][i]) if i < n_file else self._unwritten.lineage[i - n_file][1]
        lines = self._sequences()
        if seq >= len(lines):
            return None
        return dict(json.loads(lines[seq]), step=step)

    @_reads
    def lineage_sequences(self) -> int:
        if self._f.get("lineage") is None:
            return 0
        return sum(1 for line in self._sequences() if line.strip())

    def _sequences(self) -> list:
        """The lines of ``lineage/sequences`` (read once: the blob can be large)."""
        if self._sequence_lines is None:
            ds = self._f["lineage"]["sequences"]
            if not self._live:
                ds.refresh()
            lines = _json_blob(ds, self._committed.get("lineage/sequences")).splitlines()
            if self._unwritten is not None:
                lines = lines[:self._unwritten.sequences_written] + self._unwritten.sequences
            self._sequence_lines = lines
        return self._sequence_lines

    # -- JSON-lines rows (None for a trace written before they were recorded) ---------
    def optimizers(self) -> Optional[list]:
        """[{"step", "optimizers": [{"name", "groups": [[parameter names], ...]}]}]: the
        optimizers (in the order the rules saw them) and each group's parameters, from
        ``step`` on, a row each time they changed."""
        return self._rows("optimizers")

    def hyper(self) -> Optional[list]:
        """[{"step", "optimizer", "group", "lr"[, "weight_decay", "momentum", "betas"]}]: a
        group's hyper-parameters from ``step`` on (null: not a number; a key absent: the group
        has none, or a trace written before it was kept), a row each time one changed."""
        return self._rows("hyper")

    def learning_rates(self) -> list:
        """[(optimizer, group, values)]: each param group's learning rate at every recorded
        step (``values`` beside ``steps``): the ``hyper`` rows carried forward; NaN before a
        group's first row, where the lr was not a number, and at the steps where the
        ``optimizers`` rows no longer hold the group (an optimizer replaced by a new one for a
        second training stage: its last lr was carried on to the run's end)."""
        return self.hyper_values("lr")

    def hyper_values(self, name: str) -> list:
        """``learning_rates`` of one of schema.HYPER_NAMES (lr, weight_decay, momentum, beta1,
        beta2): the groups whose rows have it."""
        key, at = ("betas", int(name[-1]) - 1) if name in ("beta1", "beta2") else (name, None)
        steps = np.asarray(self.steps, dtype=np.int64)
        by_group: dict = {}
        for r in self.hyper() or []:
            by_group.setdefault((str(r.get("optimizer")), r.get("group")), []).append(r)
        held = self._groups_held(steps)
        out = []
        for (opt, group), changes in by_group.items():
            if key != "lr" and not any(key in r for r in changes):
                continue
            values = np.full(len(steps), np.nan)
            for r in sorted(changes, key=lambda r: r["step"]):
                lr = r.get(key)
                if at is not None:
                    lr = lr[at] if isinstance(lr, list) and len(lr) == 2 else None
                values[steps >= int(r["step"])] = float(lr) if isinstance(lr, (int, float)) else np.nan
            if held is not None:
                mask, unknown = held
                values[~(mask.get((opt, group), unknown) | unknown)] = np.nan
            out.append((opt, group, values))
        return out

    def _groups_held(self, steps: np.ndarray) -> Optional[tuple]:
        """({(optimizer, group): steps (a mask beside ``steps``) at which the ``optimizers``
        rows hold that group}, the steps at which they could not say); None for a trace
        without them."""
        rows = self.optimizers()
        if not rows:
            return None
        rows = sorted(rows, key=lambda r: r["step"])
        held: dict = {}
        unknown = np.zeros(len(steps), dtype=bool)
        for i, row in enumerate(rows):
            now = steps >= int(row["step"])
            if i + 1 < len(rows):
                now &= steps < int(rows[i + 1]["step"])
            if row.get("optimizers") is None:
                unknown |= now
                continue
            for o in row["optimizers"]:
                for g in range(len(o.get("groups") or ())):
                    key = (str(o.get("name")), g)
                    held[key] = held.get(key, np.zeros(len(steps), dtype=bool)) | now
        return held, unknown

    def modules(self) -> Optional[list]:
        """[{"step", "modules": [module name, ...], "types": [class name, ...]}]:
        the model's modules in registration order from ``step`` on, and their
        classes (``types``: absent in traces written before it), a row each
        time a root was added (None: a trace written before nndb kept them)."""
        return self._rows("modules")

    def module_types(self) -> Optional[dict]:
        """{module name: its class's name} of every module the ``modules`` rows
        name (as the live rules' ``module_types``); None where the trace does
        not keep the classes."""
        out: dict = {}
        for row in self.modules() or []:
            types = row.get("types")
            names = row.get("modules") or []
            if not isinstance(types, list) or len(types) != len(names):
                return None
            out.update(zip(names, types))
        return out or None

    def clips(self) -> Optional[list]:
        """[{"step", "clips": {series name: [max_norm, scaled]} | null}]: what each
        clip_grad_norm_ call of the steps from ``step`` on was given (max_norm: whether it
        clipped) and whether it measured gradients a GradScaler had not unscaled, a row each
        time it changed (None: a trace written before nndb kept them)."""
        return self._rows("clips")

    def fingerprints(self) -> Optional[list]:
        """What ranks are compared by (nndb.tracer.fingerprint): [{"step", "inputs":
        [[step, checksum], ...], "params", "bn", "data_time", "compute_time", "timed",
        "loaders"}] (all but "step" and "inputs" at observed steps only)."""
        return self._rows("fingerprints")

    @_reads
    def _rows(self, name: str) -> Optional[list]:
        if name not in self._row_blobs:
            ds = self._f.get(name)
            rows = None
            if ds is not None:
                try:
                    if not self._live:
                        ds.refresh()
                    lines = [line for line in _json_blob(ds, self._committed.get(name)).splitlines() if line.strip()]
                    if self._unwritten is not None:
                        lines = lines[:self._unwritten.row_lines_written.get(name, 0)]
                    rows = [_expect(json.loads(line), dict, f"a row of {name}") for line in lines]
                except (OSError, ValueError) as e:
                    raise TraceError(f"cannot read {name} of trace {self.path}: it is corrupted ({_short(e)})") \
                        from None
                if self._unwritten is not None:
                    rows += [dict(r) for r in self._unwritten.rows_of.get(name, ())]
            self._row_blobs[name] = rows
        rows = self._row_blobs[name]
        return None if rows is None else [dict(r) for r in rows]

    # -- queries --------------------------------------------------------------
    @property
    def status(self) -> str:
        """How the run ended (one of schema.STATUSES), or "incomplete" while it
        writes or after it was killed.  Shown, never branched on: a status
        this reader does not know reads as well as one it does."""
        return self.end["status"] if self.end else K.INCOMPLETE

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    def series(self) -> list:
        return list(self._series)

    def find(self, name: str, kind: Optional[str] = None) -> list:
        """Series with this name (and kind, if given)."""
        if kind is not None:
            s = self._by_key.get((name, kind))
            return [s] if s else []
        return [s for s in self._series if s.name == name]

    def events(self) -> list:
        """The warnings recorded during the run: [{"time", "step", "kind", "message"}]
        (the findings and stops that ``events`` also keeps are ``records``')."""
        return [dict(e) for e in self._events if e.get("kind") not in K.RECORD_KINDS]

    def records(self, kind: str) -> list:
        """What the run's debugger session recorded of ``kind`` (schema.RECORD_KINDS):
        its rules' findings ("finding") or its stops ("stop"), in order, each the
        object the session report holds for it (docs/report.md).  A trace written
        before they were recorded has none."""
        out = []
        for e in self._events:
            if e.get("kind") == kind:
                detail = e.get("detail")
                if not isinstance(detail, dict):
                    raise TraceError(f"cannot read trace {self.path}: it is corrupted (a {kind} without its detail)")
                out.append(dict(detail))
        return out

    @_reads
    def history(self, s: SeriesInfo, stat: Optional[str] = None):
        """(steps, values) for one series: values is (N, 10), or (N,) for one stat.
        Rows where the series has no value are dropped."""
        block = self.column(s)
        keep = ~np.isnan(block[:, 0])
        steps = self.steps[keep]
        block = block[keep]
        if stat is None:
            return steps, block
        return steps, block[:, self.columns.index(stat)]

    @_reads
    def column(self, s: SeriesInfo) -> np.ndarray:
        """(N, 10): one series' statistics at every row (row i: ``steps[i]``),
        NaN where the series has no value."""
        if s.id < self._n_series:
            block = np.asarray(self._f["stats"][:self._n_rows, s.id, :])
        else:
            block = np.full((self._n_rows, len(self.columns)), np.nan)
        extra = self._extra_stats
        if extra is not None:
            block = np.concatenate([block, extra[:, s.id, :] if s.id < extra.shape[1]
                                    else np.full((len(extra), len(self.columns)), np.nan)])
        return block

    @_reads
    def row(self, i: int) -> dict:
        """{(name, kind): the statistics} of the series recorded at row ``i``."""
        if i < self._n_rows:
            block = np.asarray(self._f["stats"][i, :self._n_series, :])
        else:
            block = self._extra_stats[i - self._n_rows]
        return {(s.name, s.kind): block[s.id] for s in self._series
                if s.id < len(block) and not np.isnan(block[s.id, 0])}

    @_reads
    def stats_rows(self, start: int, stop: int, columns=slice(None)) -> np.ndarray:
        """(stop - start, S, ...) statistics of the file's rows [start, stop)
        (a long trace read block by block); NaN where a series has no value."""
        return np.asarray(self._f["stats"][start:min(stop, self._n_rows), :self._n_series, columns])

    @_reads
    def all_stats(self) -> np.ndarray:
        """(N, S, 10) for everything (small traces; summaries)."""
        block = np.asarray(self._f["stats"][:self._n_rows, :self._n_series, :])
        extra = self._extra_stats
        if extra is None:
            return block
        n_series = len(self._series)
        out = np.full((self._n_rows + len(extra), n_series, len(self.columns)), np.nan)
        out[:self._n_rows, :block.shape[1]] = block
        out[self._n_rows:, :extra.shape[1]] = extra
        return out

    def close(self) -> None:
        """Close the file (a reader over a writer's file leaves it to the writer)."""
        if self._live or isinstance(self._f, _ClosedFile):
            return
        f, self._f = self._f, _ClosedFile(self.path)
        try:
            f.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _expect(value, kind: type, what: str):
    if not isinstance(value, kind):
        raise ValueError(f"{what} is not a JSON {kind.__name__}")
    return value


def _check_layout(f) -> None:
    """The datasets read whole, of the schema's shapes and types (a damaged file can hold anything)."""
    for name in ("meta", "series", "events", "end", "stats", "steps"):
        if name not in f:
            raise ValueError(f"no {name}")
    stats = f["stats"]
    if not isinstance(stats, h5py.Dataset) or stats.ndim != 3 or stats.dtype.kind != "f":
        raise ValueError("stats is not float[N, S, columns]")
    for name in ("meta", "series", "events", "end"):
        ds = f[name]
        if not isinstance(ds, h5py.Dataset) or ds.ndim != 1 or ds.dtype != np.uint8:
            raise ValueError(f"{name} is not a byte string")
    steps = f["steps"]
    if not isinstance(steps, h5py.Group):
        raise ValueError("steps is not a group")
    for name in ("step", "time", "backward_count", "optimizer_steps", "partial"):
        ds = steps.get(name)
        if not isinstance(ds, h5py.Dataset) or ds.ndim != 1 or ds.dtype.kind not in "iuf":
            raise ValueError(f"steps/{name} is not a number per row")


def _counts(values, name: str) -> np.ndarray:
    """A step number or count per row, as int64: whole numbers, none
    negative (nndb writes integers; a float one must hold whole numbers)."""
    values = np.asarray(values)
    if values.dtype.kind == "f":
        if not np.isfinite(values).all() or (values != np.floor(values)).any() or (np.abs(values) > 2**62).any():
            raise ValueError(f"steps/{name} holds a value that is not a whole number")
        values = values.astype(np.int64)
    values = values.astype(np.int64)
    if (values < 0).any():
        raise ValueError(f"steps/{name} holds a negative value")
    return values


def _committed(f, live: bool) -> dict:
    """{name: committed length} (schema.COMMITTED); {} in a trace written before them."""
    ds = f.get("committed")
    if ds is None:
        return {}
    if not live:
        ds.refresh()
    names = json.loads(ds.attrs["names"])
    values = np.asarray(ds[:], dtype=np.int64)
    if not isinstance(names, list) or len(names) != len(values) or (values < 0).any():
        raise ValueError("bad committed counts")
    return {str(k): int(v) for k, v in zip(names, values)}


_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _check_not_truncated(path: str) -> None:
    """A file shorter than the end-of-file address in its superblock lost its
    tail.  (HDF5's SWMR reader would retry such reads for a long time.)"""
    with open(path, "rb") as fh:
        head = fh.read(64)
    if head[:8] != _SIGNATURE or len(head) < 12 or head[8] not in (2, 3):
        return              # no superblock we know here; h5py will judge the file
    size_of_offsets = head[9]
    if size_of_offsets not in (2, 4, 8):
        raise TraceError(f"cannot read trace {path}: it is corrupted (bad superblock)")
    at = 12 + 2 * size_of_offsets
    eof = int.from_bytes(head[at:at + size_of_offsets], "little")
    if os.path.getsize(path) < eof:
        raise TraceError(f"cannot read trace {path}: it is truncated "
                         f"({os.path.getsize(path)} of {eof} bytes)")


def _short(e: Exception) -> str:
    text = str(e).strip() or type(e).__name__
    return text.split("(")[0].strip() if len(text) > 120 else text


# The queries of whole tensors and histograms read the file: damage is a TraceError there too.
for _name in ("full_index", "tensor", "histogram_steps", "histogram"):
    setattr(TraceReader, _name, _reads(getattr(FullReads, _name)))
