"""Queries over a trace that return plain data; renderers print it."""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from .errors import UsageError
from .store.reader import TraceReader


def _clean(x):
    x = float(x)
    return None if math.isnan(x) else x


def summary(reader: TraceReader) -> dict:
    """Metadata, step count and, per recorded tensor, its last, min and max statistics."""
    cols = reader.columns
    tensors = []
    block = reader.all_stats() if reader.n_steps else None
    for s in reader.series():
        if block is None:
            continue
        vals = block[:, s.id, :]
        present = ~np.isnan(vals[:, 0])
        if not present.any():
            continue
        v = vals[present]
        last_i = np.flatnonzero(present)[-1]
        with np.errstate(all="ignore"):
            mins = np.nanmin(np.where(np.isnan(v), np.inf, v), axis=0)
            maxs = np.nanmax(np.where(np.isnan(v), -np.inf, v), axis=0)
        mins = np.where(np.isinf(mins) & (mins > 0), np.nan, mins)
        maxs = np.where(np.isinf(maxs) & (maxs < 0), np.nan, maxs)
        tensors.append({
            "name": s.name, "kind": s.kind, "rows": int(present.sum()),
            "last_step": int(reader.steps[last_i]),
            "last": {c: _clean(x) for c, x in zip(cols, vals[last_i])},
            "min": {c: _clean(x) for c, x in zip(cols, mins)},
            "max": {c: _clean(x) for c, x in zip(cols, maxs)},
        })
    steps = reader.steps
    return {
        "trace": reader.path,
        "schema_version": reader.schema_version,
        "meta": reader.meta,
        "status": reader.status,
        "end": reader.end,
        "steps": reader.n_steps,
        "first_step": int(steps[0]) if len(steps) else None,
        "last_step": int(steps[-1]) if len(steps) else None,
        "events": reader.events(),
        "tensors": tensors,
    }


def series(reader: TraceReader, name: str, stat: str, kind: Optional[str] = None) -> dict:
    """The history of one statistic of one tensor (all its kinds unless ``kind``)."""
    if stat not in reader.columns:
        raise UsageError(f"unknown statistic {stat!r}; one of: {', '.join(reader.columns)}")
    found = reader.find(name, kind)
    if not found:
        what = f"{kind} {name!r}" if kind else repr(name)
        raise UsageError(f"no series {what} in {reader.path} (run 'nndb inspect {reader.path}' for the list)")
    out = []
    for s in found:
        steps, values = reader.history(s, stat)
        out.append({"kind": s.kind, "steps": [int(x) for x in steps],
                    "values": [_clean(x) for x in values]})
    return {"trace": reader.path, "name": name, "stat": stat, "series": out}
