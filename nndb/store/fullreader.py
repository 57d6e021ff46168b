"""The trace reader's queries of whole tensors (schema ``full/``) and
histograms (schema ``hist/``): a mixin of ``TraceReader``, which wraps each
in its damage guard (a damaged part raises TraceError)."""
from __future__ import annotations

import json
from typing import Optional

import numpy as np

from .. import schema as K
from .precision import MAX_REL_ERROR, PRECISIONS, decode


def _blob(ds, n: Optional[int] = None) -> str:
    return bytes(np.asarray(ds[:n], dtype=np.uint8)).decode("utf-8")


def _expect_dict(value, kind, what: str):
    if not isinstance(value, kind):
        raise ValueError(f"{what} is not a JSON object")
    return value


def _joined_shape(shapes: list) -> list:
    """The shape of several calls' tensors joined along their first dimension;
    flat where their other dimensions differ (or one is a scalar)."""
    if all(len(x) >= 1 and x[1:] == shapes[0][1:] for x in shapes) and len(shapes[0]) >= 1:
        return [sum(int(x[0]) for x in shapes), *shapes[0][1:]]
    return [sum(int(np.prod(x, dtype=np.int64)) for x in shapes)]


class FullReads:
    """Needs ``_f`` (the open file), ``_live``, ``_committed`` and ``_by_key``
    (TraceReader's)."""

    # -- whole tensors and histograms (schema full/, hist/) ------------------
    def full_index(self) -> list:
        """The whole tensors kept in the trace: one dict per tensor and step
        (schema ``full/index``), in the order written; [] in a trace without them."""
        cached = getattr(self, "_full_index", None)
        if cached is not None:
            return cached
        g = self._f.get("full")
        out: list = []
        if g is not None:
            ds = g["index"]
            if not self._live:
                ds.refresh()
            for line in _blob(ds, self._committed.get("full/index")).splitlines():
                if line.strip():
                    e = _expect_dict(json.loads(line), dict, "a full-tensor index line")
                    if not (isinstance(e.get("name"), str) and e.get("kind") in K.FULL_KINDS
                            and isinstance(e.get("step"), int) and isinstance(e.get("shape"), list)
                            and e.get("store") in K.FULL_DATA and isinstance(e.get("offset"), int)
                            and isinstance(e.get("count"), int) and e.get("used") in PRECISIONS):
                        raise ValueError(f"full-tensor index line {len(out) + 1} is not the schema's")
                    out.append(e)
        self._full_index = out
        return out

    def full_entries(self, name: str, kind: str, step: int) -> list:
        """The index lines of ``kind name`` at ``step``, in the order written:
        an activation has one a forward call of its module in the step (a
        gradient accumulation's micro-batches), a gradient or parameter one
        an optimizer ``step()`` that holds it (a WGAN critic's several)."""
        return [e for e in self.full_index() if e["name"] == name and e["kind"] == kind and e["step"] == step]

    def full_entry(self, name: str, kind: str, step: int) -> Optional[dict]:
        """The index line of ``kind name`` at ``step`` (None: not kept).  An
        activation kept from several calls in the step is one tensor of all
        of them, as its statistics and histogram merge the calls: the calls
        joined along their first dimension (flat where the others differ);
        ``calls`` says how many, ``used`` the least precise.  A gradient or
        parameter kept at several ``step()`` calls: the last (the step's end)."""
        found = self.full_entries(name, kind, step)
        if not found:
            return None
        if kind != "act" or len(found) == 1:
            return found[-1]
        return dict(found[0], shape=_joined_shape([e["shape"] for e in found]), count=sum(e["count"] for e in found),
                    used=max((e["used"] for e in found), key=MAX_REL_ERROR.__getitem__), calls=len(found))

    def full_steps(self, name: str, kind: str) -> list:
        return sorted({e["step"] for e in self.full_index() if e["name"] == name and e["kind"] == kind})

    def tensor(self, name: str, kind: str, step: int) -> Optional[np.ndarray]:
        """The whole tensor ``kind name`` as it was at ``step`` (``full_entry``:
        an activation's calls joined), read chunk by chunk (only the chunks
        that hold it), in its own dtype (bfloat16 and other non-numpy floats:
        float32); None if the trace did not keep it."""
        entry = self.full_entry(name, kind, step)
        if entry is None:
            return None
        parts = self.full_entries(name, kind, step) if entry.get("calls") else [entry]
        arrays = [self._read_full(e) for e in parts]
        if len(arrays) == 1:
            return arrays[0]
        shape = tuple(int(x) for x in entry["shape"])
        if len(shape) == 1 and any(a.ndim != 1 for a in arrays):
            arrays = [a.reshape(-1) for a in arrays]
        return np.concatenate(arrays, axis=0).reshape(shape)

    def _read_full(self, e: dict) -> np.ndarray:
        ds = self._f["full"][e["store"]]
        if not self._live:
            ds.refresh()
        end = e["offset"] + e["count"]
        n = min(ds.shape[0], self._committed.get("full/" + e["store"], ds.shape[0]))
        shape = tuple(int(x) for x in e["shape"])
        if e["offset"] < 0 or end > n or int(np.prod(shape, dtype=np.int64)) != e["count"]:
            raise ValueError(f"the full tensor {e['kind']} {e['name']} at step {e['step']} lies outside its data")
        return decode(ds[e["offset"]:end], e["used"], float(e.get("scale", 1.0)), str(e.get("dtype"))).reshape(shape)

    def _hist_rows(self) -> tuple:
        """(steps of the histogram rows, the counts dataset), or ([], None)."""
        g = self._f.get("hist")
        if g is None:
            return np.zeros(0, dtype=np.int64), None
        steps, counts = g["step"], g["counts"]
        if not self._live:
            steps.refresh()
            counts.refresh()
        n = min(steps.shape[0], counts.shape[0], self._committed.get("hist", 1 << 62))
        return np.asarray(steps[:n]), counts

    def histogram_steps(self, name: str, kind: str) -> list:
        """The steps at which ``kind name`` has a histogram."""
        s = self._by_key.get((name, kind))
        steps, counts = self._hist_rows()
        if s is None or counts is None or s.id >= counts.shape[1] or not len(steps):
            return []
        have = np.asarray(counts[:len(steps), s.id, 0]) >= 0
        return [int(x) for x in steps[have]]

    def histogram(self, name: str, kind: str, step: int) -> Optional[np.ndarray]:
        """The histogram of ``kind name`` at ``step`` (N_BINS counts,
        nndb.histogram), or None where the trace has none."""
        s = self._by_key.get((name, kind))
        steps, counts = self._hist_rows()
        if s is None or counts is None or s.id >= counts.shape[1]:
            return None
        rows = np.nonzero(steps == step)[0]
        if not len(rows):
            return None
        h = np.asarray(counts[int(rows[-1]), s.id, :], dtype=np.int64)
        if h.shape != (K.HIST_BINS,):
            raise ValueError("a histogram row is not HIST_BINS counts")
        return None if (h < 0).any() else h

