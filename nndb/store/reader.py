"""TraceReader: the only code that reads a trace (schema in ``schema.py``).

Opens in SWMR mode, so a trace can be read while its run is still writing it
and after its writer was killed.  Anything that is not a readable nndb trace
raises ``TraceError`` with a one-line reason; nothing is unpickled.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Optional

import h5py
import numpy as np

from ..errors import TraceError
from . import schema as K


@dataclass(frozen=True)
class SeriesInfo:
    id: int
    name: str
    kind: str


def _json_blob(ds) -> str:
    return bytes(np.asarray(ds[:], dtype=np.uint8)).decode("utf-8")


class TraceReader:
    def __init__(self, path: str):
        self.path = path
        if not os.path.exists(path):
            raise TraceError(f"no such trace: {path}")
        if os.path.isdir(path):
            raise TraceError(f"{path} is a directory, not a trace")
        try:
            if not h5py.is_hdf5(path):
                raise TraceError(f"{path} is not an nndb trace (not an HDF5 file)")
        except OSError as e:
            raise TraceError(f"cannot read {path}: {e.strerror or e}") from None
        _check_not_truncated(path)
        # A closed trace opens plainly.  A trace whose writer is still running,
        # or was killed, carries HDF5's "open for writing" flag and opens only
        # in SWMR mode (which retries reads that fail their checksums, so it
        # is used only where needed).
        try:
            self._f = h5py.File(path, "r")
        except OSError as plain_error:
            try:
                self._f = h5py.File(path, "r", swmr=True)
            except OSError:
                raise TraceError(f"cannot read trace {path}: it is truncated or corrupted "
                                 f"({_short(plain_error)})") from None
        try:
            self._load()
        except TraceError:
            self.close()
            raise
        except (OSError, KeyError, ValueError, UnicodeDecodeError, json.JSONDecodeError) as e:
            self.close()
            raise TraceError(f"cannot read trace {path}: it is truncated or corrupted ({_short(e)})") from None

    def _load(self) -> None:
        f = self._f
        if f.attrs.get("nndb_format") != K.FORMAT:
            raise TraceError(f"{self.path} is not an nndb trace")
        version = int(f.attrs.get("schema_version", -1))
        if version > K.SCHEMA_VERSION or version < 1:
            raise TraceError(f"{self.path} has trace schema version {version}; "
                             f"this nndb reads version {K.SCHEMA_VERSION} (upgrade nndb)")
        self.schema_version = version
        for ds in (f["stats"], f["series"], f["end"], f["events"], *f["steps"].values()):
            ds.refresh()
        self.meta = json.loads(_json_blob(f["meta"]))
        self.columns = tuple(json.loads(f["stats"].attrs["columns"]))
        self._series: list = []
        for line in _json_blob(f["series"]).splitlines():
            if line.strip():
                d = json.loads(line)
                self._series.append(SeriesInfo(int(d["id"]), d["name"], d["kind"]))
        # A kill between two writes can leave one dataset a flush ahead of another.
        n_rows = min([f["stats"].shape[0]] + [d.shape[0] for d in f["steps"].values()])
        self._n_rows = n_rows
        self._n_series = min(len(self._series), f["stats"].shape[1])
        self._series = self._series[:self._n_series]
        self.steps = np.asarray(f["steps"]["step"][:n_rows])
        self.times = np.asarray(f["steps"]["time"][:n_rows])
        self.backward_count = np.asarray(f["steps"]["backward_count"][:n_rows])
        self.optimizer_steps = np.asarray(f["steps"]["optimizer_steps"][:n_rows])
        self.partial = np.asarray(f["steps"]["partial"][:n_rows]).astype(bool)
        end = _json_blob(f["end"])
        self.end: Optional[dict] = json.loads(end) if end.strip() else None
        self.events = [json.loads(line) for line in _json_blob(f["events"]).splitlines() if line.strip()]
        self._by_key = {(s.name, s.kind): s for s in self._series}

    # -- lineage (nndb.lineage) ------------------------------------------------
    def lineage_steps(self) -> list:
        g = self._f.get("lineage")
        if g is None:
            return []
        g["step"].refresh()
        g["seq"].refresh()
        n = min(g["step"].shape[0], g["seq"].shape[0])
        return [int(x) for x in g["step"][:n]]

    def lineage(self, step: int) -> Optional[dict]:
        """A step's recorded operations (the last record of that step), or None."""
        g = self._f.get("lineage")
        if g is None:
            return None
        steps = self.lineage_steps()
        if step not in steps:
            return None
        i = len(steps) - 1 - steps[::-1].index(step)
        seq = int(g["seq"][i])
        g["sequences"].refresh()
        lines = _json_blob(g["sequences"]).splitlines()
        if seq >= len(lines):
            return None
        return dict(json.loads(lines[seq]), step=step)

    def lineage_sequences(self) -> int:
        g = self._f.get("lineage")
        if g is None:
            return 0
        g["sequences"].refresh()
        return sum(1 for line in _json_blob(g["sequences"]).splitlines() if line.strip())

    # -- queries --------------------------------------------------------------
    @property
    def status(self) -> str:
        return self.end["status"] if self.end else "incomplete"

    @property
    def n_steps(self) -> int:
        return int(self._n_rows)

    def series(self) -> list:
        return list(self._series)

    def find(self, name: str, kind: Optional[str] = None) -> list:
        """Series with this name (and kind, if given)."""
        if kind is not None:
            s = self._by_key.get((name, kind))
            return [s] if s else []
        return [s for s in self._series if s.name == name]

    def history(self, s: SeriesInfo, stat: Optional[str] = None):
        """(steps, values) for one series: values is (N, 10), or (N,) for one stat.
        Rows where the series has no value are dropped."""
        block = np.asarray(self._f["stats"][:self._n_rows, s.id, :])
        keep = ~np.isnan(block[:, 0])
        steps = self.steps[keep]
        block = block[keep]
        if stat is None:
            return steps, block
        return steps, block[:, self.columns.index(stat)]

    def all_stats(self) -> np.ndarray:
        """(N, S, 10) for everything (small traces; summaries)."""
        return np.asarray(self._f["stats"][:self._n_rows, :self._n_series, :])

    def close(self) -> None:
        try:
            self._f.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


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
