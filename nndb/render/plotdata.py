"""The arrays each picture shows, read from a trace: no drawing here.

Every function takes a TraceReader and returns a small dataclass of numpy
arrays, NaN where a value was not measured (nndb.store.measured), with the
findings and stops to mark as ``Mark``s.  ``nndb.render.plot`` draws them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from .. import globs
from ..schema import CLIP_SERIES, model_order
from ..errors import UsageError
from ..text import printable_line
from ..store.measured import measured

WHATS = ("heatmap", "loss", "history", "ratio")
# CS231n's rule of thumb for the update/weight ratio, and the band drawn around it.
RATIO_TARGET = 1e-3
RATIO_BAND = (1e-4, 1e-2)
HISTORY_STATS = ("norm", "mean", "std", "min", "max")


@dataclass(frozen=True)
class Mark:
    step: int
    label: str              # a finding's rule, or a stop's reason
    kind: str = "finding"   # finding | stop


@dataclass
class Heatmap:
    kind: str
    stat: str
    layers: list            # names, in model order (top to bottom)
    steps: np.ndarray       # (T,) the steps with a value
    values: np.ndarray      # (L, T) NaN where not measured
    nonfinite: np.ndarray   # (L, T) bool: a measured NaN or Inf, or a tensor that held some (OF_THE_FINITE)
    marks: list = field(default_factory=list)
    title: str = ""
    span: tuple = (0, 0)    # the trace's first and last recorded step: the x axis runs over them
    order: str = "model order"      # how the layers are ordered (ORDER_KNOWN or ORDER_UNKNOWN)
    every: int = 1          # the usual spacing of the recorded steps (--every): the axis ends a cell past the last
    partial: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))   # steps of rows that are no
    # whole step (the work after the run's last step end: nndb.Trace.partial)


@dataclass
class LossCurve:
    names: list             # the loss series (one per optimizer with several)
    steps: list             # [(N,) per name]
    values: list            # [(N,) per name]: NaN where not measured, Inf as measured
    nonfinite: list         # [(N,) bool per name]: a measured NaN or Inf
    marks: list = field(default_factory=list)
    title: str = ""
    partial: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))   # steps of rows that are no
    # whole step (the work after the run's last step end: nndb.Trace.partial)


@dataclass
class History:
    name: str
    kind: str
    steps: np.ndarray                           # (N,)
    stats: dict = field(default_factory=dict)   # stat -> (N,) NaN where not measured
    marks: list = field(default_factory=list)
    title: str = ""
    nonfinite: Optional[np.ndarray] = None      # (N,) bool: the norm measured NaN or Inf
    span: tuple = (0, 0)    # the trace's first and last recorded step: the x axis runs over them
    recorded: Optional[np.ndarray] = None       # the trace's recorded steps (a line breaks where one was skipped)
    held: Optional[np.ndarray] = None           # (N,) bool: a finite norm of a tensor that held NaN or Inf
    # (the norm, mean and std are then its finite elements': OF_THE_FINITE)
    partial: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))   # steps of rows that are no
    # whole step (the work after the run's last step end: nndb.Trace.partial)


@dataclass
class Ratio:
    layers: list
    steps: np.ndarray       # (T,)
    values: np.ndarray      # (L, T): update norm / weight norm, NaN where either is missing
    nonfinite: Optional[np.ndarray] = None     # (L, T) bool: the update's or the weight's norm measured NaN or Inf
    target: float = RATIO_TARGET
    band: tuple = RATIO_BAND
    marks: list = field(default_factory=list)
    title: str = ""
    order: str = "model order"


def marks(findings: Sequence[dict] = (), stops: Sequence[dict] = ()) -> list:
    """Findings (rule, step) and stops (reason, step) as marks, once per (step, label)."""
    out = []
    for kind, items, key in (("finding", findings, "rule"), ("stop", stops, "reason")):
        for item in items:
            step = item.get("step") if isinstance(item, dict) else None
            if isinstance(step, int) and not isinstance(step, bool):
                m = Mark(step, printable_line(str(item.get(key, kind)))[:60], kind)
                if m not in out:
                    out.append(m)
    return out


def _title(reader, what: str) -> str:
    script = reader.meta.get("script") or reader.meta.get("module") or reader.path
    return printable_line(f"{what} ({os.path.basename(str(script))})")


def _matching(reader, kind: str, glob: Optional[str]) -> list:
    found = [s for s in reader.series() if s.kind == kind and (glob is None or globs.matches(s.name, glob))]
    if not found:
        what = f"{kind} tensor" + (f" matches '{glob}'" if glob else " was recorded")
        raise UsageError(printable_line(f"no {what} in {reader.path}"))
    return found


ORDER_KNOWN = "model order"
ORDER_UNKNOWN = "recording order: this trace predates the model order"


def in_model_order(reader, series: list, by_kind: bool = False) -> tuple:
    """(``series`` in the model's registration order, the order's label):
    by their module's place in the trace's ``modules`` rows, the first row's
    modules first and each later row's new ones after them, in its order (a
    root's own parameters at the root; kinds and names kept in the trace's
    order within a module; a series of no known module after the others;
    ``by_kind``: grouped by kind first, schema.KIND_ORDER).
    Not the last row alone: a k-fold loop's rows are each fold's model, and its
    last fold's layers came first, above the first fold's, the second fold's
    below them.  A trace without the rows: the series' order, labelled
    ORDER_UNKNOWN."""
    rows = reader.modules()
    if not rows and not by_kind:
        return list(series), ORDER_UNKNOWN
    modules = [n for row in rows for n in row.get("modules") or []]
    order = model_order([(s.name, s.kind) for s in series], modules, by_kind)
    return [series[i] for i in order], ORDER_KNOWN if rows else ORDER_UNKNOWN


# The statistics of a tensor's finite elements alone (min and max: of those not NaN) where
# it holds NaN or Inf (trace-format.md, "Statistics"): a finite number that says nothing of them.
OF_THE_FINITE = ("mean", "std", "norm", "mean_abs", "min", "max")


def _column(reader, s, stat: str, held: bool = False):
    """(steps, values, nonfinite) of one statistic of one series: NaN where not measured;
    nonfinite where the value is NaN or Inf, and with ``held`` also where the tensor held
    NaN or Inf elements beside a finite value of the others (OF_THE_FINITE)."""
    steps, block = reader.history(s)
    cols = reader.columns
    j = cols.index(stat)
    ok = measured(block, cols)
    v = np.where(ok[:, j], block[:, j], np.nan)
    bad = ok[:, j] & ~np.isfinite(block[:, j])
    if held and stat in OF_THE_FINITE:
        for c in ("nan_count", "inf_count"):
            k = cols.index(c)
            bad |= ok[:, j] & ok[:, k] & (np.nan_to_num(block[:, k]) > 0)
    return steps.astype(np.int64), v, bad


def _grid(reader, series: list, stat: str, held: bool = False):
    """Rows of one statistic per series over the steps where any has a value
    (``held``: as _column's)."""
    cols = [_column(reader, s, stat, held) for s in series]
    steps = np.unique(np.concatenate([c[0] for c in cols])) if cols else np.zeros(0, np.int64)
    values = np.full((len(series), len(steps)), np.nan)
    bad = np.zeros((len(series), len(steps)), bool)
    for i, (st, v, nf) in enumerate(cols):
        at = np.searchsorted(steps, st)
        values[i, at] = v
        bad[i, at] = nf
    keep = ~np.all(np.isnan(values) & ~bad, axis=0)
    return steps[keep], values[:, keep], bad[:, keep]


def heatmap(reader, kind: str = "grad", stat: str = "norm", glob: Optional[str] = None,
            findings=(), stops=()) -> Heatmap:
    _check_stat(reader, stat)
    found = _matching(reader, kind, glob)
    if glob is None and kind == "grad":      # (per layer: clip_grad_norm_'s total is no layer's; a glob names it)
        found = [s for s in found if not s.name.startswith(CLIP_SERIES)] or found
    series, order = in_model_order(reader, found)
    steps, values, bad = _grid(reader, series, stat, held=True)
    span = (int(reader.steps[0]), int(reader.steps[-1])) if reader.n_steps else (0, 0)
    every = int(np.median(np.diff(reader.steps))) if reader.n_steps > 1 else 1
    return Heatmap(kind, stat, [s.name for s in series], steps, values, bad, marks(findings, stops),
                   _title(reader, f"{kind} {stat} per layer"), span, order, max(1, every), _partial(reader))


def _partial(reader) -> np.ndarray:
    """The steps of the trace's rows that are no whole step (nndb.Trace.partial)."""
    return np.asarray(reader.steps, dtype=np.int64)[np.asarray(reader.partial, dtype=bool)]


def loss(reader, findings=(), stops=()) -> LossCurve:
    series = _matching(reader, "loss", None)
    cols = [_column(reader, s, "mean") for s in series]
    return LossCurve([s.name for s in series], [c[0] for c in cols], [c[1] for c in cols], [c[2] for c in cols],
                     marks(findings, stops), _title(reader, "loss"), _partial(reader))


def history(reader, name: str, kind: str = "param", findings=(), stops=()) -> History:
    found = _matching(reader, kind, name)
    if len(found) > 1:
        names = ", ".join(s.name for s in found[:5]) + (", ..." if len(found) > 5 else "")
        raise UsageError(printable_line(f"'{name}' matches {len(found)} {kind} tensors ({names}): name one"))
    s = found[0]
    stats = {}
    steps = None
    for stat in HISTORY_STATS:
        steps, v, bad = _column(reader, s, stat)
        stats[stat] = v
        if stat == "norm":
            nonfinite = bad
    held = _column(reader, s, "norm", held=True)[2] & ~nonfinite
    span = (int(reader.steps[0]), int(reader.steps[-1])) if reader.n_steps else (0, 0)
    return History(s.name, kind, steps, stats, marks(findings, stops), _title(reader, f"{kind} {s.name} history"),
                   nonfinite, span, np.asarray(reader.steps, dtype=np.int64), held, _partial(reader))


def ratio(reader, glob: Optional[str] = None, findings=(), stops=()) -> Ratio:
    """Per parameter with both an update and a weight series (by default the
    weights of 2 dimensions or more: biases and norm scales move by other
    rules): ||update|| / ||weight|| at each step."""
    updates = {s.name: s for s in reader.series() if s.kind == "update"}
    params = [s for s in reader.series() if s.kind == "param" and s.name in updates
              and (globs.matches(s.name, glob) if glob else s.shape is None or len(s.shape) >= 2)]
    if not params:
        raise UsageError(printable_line("no parameter with an update" + (f" matches '{glob}'" if glob else "")
                                        + f" in {reader.path}"))
    params, order = in_model_order(reader, params)
    up_steps, up, up_bad = _grid(reader, [updates[s.name] for s in params], "norm")
    w_steps, w, w_bad = _grid(reader, params, "norm")
    steps = np.intersect1d(up_steps, w_steps)
    u = up[:, np.searchsorted(up_steps, steps)]
    wv = w[:, np.searchsorted(w_steps, steps)]
    bad = up_bad[:, np.searchsorted(up_steps, steps)] | w_bad[:, np.searchsorted(w_steps, steps)]
    with np.errstate(divide="ignore", invalid="ignore"):
        values = np.where(wv > 0, u / wv, np.nan)
    return Ratio([s.name for s in params], steps, values, bad, marks=marks(findings, stops),
                 title=_title(reader, "update/weight ratio per layer"), order=order)


def _check_stat(reader, stat: str) -> None:
    if stat not in reader.columns:
        raise UsageError(f"unknown statistic {stat!r}; one of: {', '.join(reader.columns)}")


def default_name(trace_path: str, what: str, kind: Optional[str] = None, stat: Optional[str] = None,
                 glob: Optional[str] = None, ext: str = ".png") -> str:
    """Where a picture of a trace goes by default: beside it, named for what it shows."""
    base = os.path.splitext(trace_path)[0]
    parts = [what] + [p for p in (kind, glob, stat) if p]
    safe = "-".join(parts).replace("*", "all").replace("?", "_")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in safe)
    return f"{base}-{safe}{ext}"

