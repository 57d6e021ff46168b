"""Queries over a trace that return plain data; renderers print it.

A statistic is a float (NaN and Inf as they are) or None where it was not
measured (nndb.store.measured); nndb.text shows both, as text or JSON."""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..errors import UsageError
from ..schema import HYPER_NAMES, default_stat
from ..render.plotdata import in_model_order
from ..run.paths import claim_output
from ..store.measured import measured, measured_column, measured_values
from ..rules.offline import stored_findings
from ..store.reader import TraceReader


def _extremes(v: np.ndarray, cols) -> tuple:
    """Per column of rows ``v``: (min, max) over the measured values that are
    numbers; NaN where every measured value is NaN, None where none was measured."""
    ok = measured(v, cols)
    num = ok & ~np.isnan(v)
    lo = np.where(num, v, np.inf).min(axis=0)
    hi = np.where(num, v, -np.inf).max(axis=0)

    def pick(x, j):
        return float(x) if num[:, j].any() else float("nan") if ok[:, j].any() else None

    return ({c: pick(lo[j], j) for j, c in enumerate(cols)}, {c: pick(hi[j], j) for j, c in enumerate(cols)})


def summary(reader: TraceReader) -> dict:
    """Metadata, step count, the findings the live run stored (``found_by:
    ["run"]``; ``nndb check-trace`` re-checks a trace) and, per recorded
    tensor, its last, min and max statistics over the whole steps (a partial
    row's values are no step's: ``partial``, the partial row's statistics; a
    series recorded in the partial row alone, by it)."""
    cols = reader.columns
    tensors = []
    block = reader.all_stats() if reader.n_steps else None
    partial = np.asarray(reader.partial, dtype=bool)
    # (listed as ``stats`` lists them: the loss, the activations, the parameters' values,
    # updates and gradients, each in the model's order, not the order of the trace's columns,
    # where a parameter too large for the host block came before the activations)
    for s in in_model_order(reader, list(reader.series()), by_kind=True)[0]:
        if block is None:
            continue
        vals = block[:, s.id, :]
        present = ~np.isnan(vals[:, 0])
        if not present.any():
            continue
        apart = present & partial
        if (present & ~partial).any():
            present &= ~partial
        last_i = np.flatnonzero(present)[-1]
        mins, maxs = _extremes(vals[present], cols)
        tensors.append({
            "name": s.name, "kind": s.kind, "rows": int(present.sum()),
            "last_step": int(reader.steps[last_i]),
            "last": dict(zip(cols, measured_values(vals[last_i], cols))),
            "min": mins,
            "max": maxs,
            "partial": dict(zip(cols, measured_values(vals[np.flatnonzero(apart)[-1]], cols)))
            if apart.any() and not apart[last_i] else None,
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
        "partial_steps": _partial_steps(reader),
        "events": reader.events(),
        "findings": stored_findings(reader),
        "loss_kinds": reader.records("loss_kind"),
        "changes": reader.records("change"),
        "tensors": tensors,
    }


def series(reader: TraceReader, name: str, stat: Optional[str], kind: Optional[str] = None) -> dict:
    """The history of one statistic of one tensor (all its kinds unless ``kind``); ``stat``
    None: the kinds' default (schema.default_stat: the loss's value, a tensor's norm)."""
    if stat is not None and stat not in reader.columns:
        raise UsageError(f"unknown statistic {stat!r}; one of: {', '.join(reader.columns)}")
    found = reader.find(name, kind)
    if not found and name in HYPER_NAMES and kind is None and stat in (None, name):
        return _hyper_series(reader, name)
    if not found:
        what = f"{kind} {name!r}" if kind else repr(name)
        losses = [s.name for s in reader.series() if s.kind == "loss"] if name == "loss" else []
        if losses:          # (several optimizers: a loss each, loss/optimizerD ...)
            raise UsageError(f"no series {what} in {reader.path}: its losses are {', '.join(losses)} "
                             f"(one per optimizer)")
        raise UsageError(f"no series {what} in {reader.path} (run 'nndb inspect {reader.path}' for the list)")
    if stat is None:
        kinds = {s.kind for s in found}
        stat = default_stat(kinds.pop() if len(kinds) == 1 else None)
    out = []
    for s in found:
        steps, block = reader.history(s)
        out.append({"kind": s.kind, "steps": [int(x) for x in steps],
                    "values": measured_column(block, stat, reader.columns)})
    return {"trace": reader.path, "name": name, "stat": stat, "series": out,
            "partial_steps": _partial_steps(reader)}


def _hyper_series(reader: TraceReader, name: str) -> dict:
    """``series``'s answer for ``lr`` (or another of HYPER_NAMES: ``weight_decay``,
    ``momentum``, ``beta1``, ``beta2``): each param group's value at the recorded steps, a
    column per group (``OPTIMIZER.groupG``), from the trace's hyper rows (the exports'
    ``hyper/.../NAME``)."""
    groups = reader.hyper_values(name)
    if not groups:
        if name == "lr":
            raise UsageError(f"no learning rates in {reader.path} (no optimizer stepped, or a trace written before "
                             "nndb kept them)")
        raise UsageError(f"no {name} in {reader.path} (no param group of an optimizer that stepped has one, "
                         "or a trace written before nndb kept it)")
    steps = [int(x) for x in reader.steps]
    out = [{"kind": f"{opt}.group{group}", "steps": [st for st, v in zip(steps, values) if not np.isnan(v)],
            "values": [float(v) for v in values if not np.isnan(v)]} for opt, group, values in groups]
    return {"trace": reader.path, "name": name, "stat": name, "series": out, "partial_steps": _partial_steps(reader)}


def _partial_steps(reader: TraceReader) -> list:
    """The steps of the rows that are no whole step: the work after the run's
    last step end (the iteration a Ctrl-C or an exception ended, an evaluation's
    backward()), kept as one more row (nndb.Trace.partial)."""
    return [int(x) for x in np.asarray(reader.steps)[np.asarray(reader.partial, dtype=bool)]]


def tensor_at(reader: TraceReader, spec: str, step: int, npy_path: Optional[str] = None) -> dict:
    """A whole tensor kept at ``step`` (saved to ``npy_path`` if given) and
    its histogram there, whichever the trace has; UsageError if neither."""
    from ..store import distributions as D
    kind, name = D.parse_tensor_spec(spec)
    out: dict = {"name": name, "kind": kind, "step": step, "tensor": None, "histogram": None}
    why = []
    if kind in D.FULL_KINDS and reader.full_entry(name, kind, step) is not None:
        arr, entry = D.full_tensor(reader, name, kind, step)
        out["tensor"] = D.tensor_info(entry)
        if npy_path:
            claim_output(npy_path, "--npy", "npy")
            try:
                with open(npy_path, "wb") as fh:
                    np.save(fh, arr, allow_pickle=False)
            except OSError as e:
                raise UsageError(f"cannot write {npy_path}: {e.strerror or e}") from None
            out["tensor"]["npy"] = npy_path
    else:
        try:
            D.full_tensor(reader, name, kind, step)
        except UsageError as e:
            why.append(str(e))
        if npy_path:
            raise UsageError(why[0] if why else f"the trace keeps no whole tensor of {kind} {name}")
    if reader.histogram(name, kind, step) is not None:
        out["histogram"] = D.describe(reader.histogram(name, kind, step), step)
        out["note"] = D.APPROX_NOTE
    elif out["tensor"] is None:
        try:
            D.histogram(reader, name, kind, step)
        except UsageError as e:
            why.append(str(e))
        raise UsageError("; ".join(why))
    return out
