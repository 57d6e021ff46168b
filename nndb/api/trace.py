"""``Trace``: a trace as Python objects, for notebooks and scripts.

A thin layer over ``nndb.store.reader.TraceReader``, the one reader of the
trace schema: everything here is read through it.  What a query returns is
plain data (numpy arrays, lists, dicts, small frozen records); nothing in it
keeps the file open except the Trace itself (``close()``, or ``with``).

Indexing: ``steps`` holds the step number of each recorded row, in order
(rows follow the recording schedule, so numbers may have gaps: ``--every``,
``--steps``).  ``series(...)[i]`` is the value at step ``steps[i]``, NaN
where it was not measured.  ``history(...)`` gives ``(steps, values)`` of the
measured rows only, when the step numbers themselves are wanted.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..errors import TraceError, UsageError
from .. import schema as K
from ..render.plotdata import in_model_order
from ..store.measured import measured, measured_values
from ..store.reader import TraceReader

PANDAS_MISSING = "to_pandas() needs pandas: pip install 'nndb[pandas]'"


@dataclass(frozen=True)
class TensorInfo:
    """One recorded series: ``name`` and ``kind`` (param, grad, update, act,
    loss) as the trace names them, the tensor's ``shape`` where the trace has
    it (param, grad, update), and the ``module`` it belongs to: a parameter's
    owning module path (``encoder.0`` for ``encoder.0.weight``), an
    activation's module (a second use ``encoder.0#2`` is ``encoder.0``);
    None for the loss and for a parameter of the model itself (no dot in its
    name: the trace does not say which model variable it is)."""
    name: str
    kind: str
    shape: Optional[tuple]
    module: Optional[str]


def _read_only(a: np.ndarray) -> np.ndarray:
    """A view the caller cannot write through (the reader's own array stays as read)."""
    v = a.view()
    v.flags.writeable = False
    return v


class Trace:
    """An nndb trace, opened with ``nndb.open(PATH)``.

    Opens a finished trace, one whose run is still writing it (HDF5 SWMR:
    what was flushed when it was opened; ``refresh()`` reads again), and one
    whose run was killed (up to its last flush).  A file that is not a
    readable trace raises ``nndb.errors.TraceError`` with a one-line reason.
    """

    def __init__(self, path: str):
        self.path = path
        self._reader = TraceReader(path)
        self._tensors: Optional[list] = None
        self._writer = None

    @classmethod
    def of_writer(cls, writer) -> "Trace":
        """The trace a TraceWriter of this process is writing, through its open
        file (every step so far: TraceReader.from_writer); ``refresh()`` reads
        through the writer while it is open, then the file."""
        self = cls.__new__(cls)
        self._reader = TraceReader.from_writer(writer)
        self.path, self._tensors, self._writer = writer.path, None, writer
        return self

    # -- what the run was ------------------------------------------------------
    @property
    def reader(self) -> TraceReader:
        """The underlying TraceReader (the schema's one reader)."""
        return self._reader

    @property
    def meta(self) -> dict:
        """The run's metadata (docs/trace-format.md, "Run metadata"): script, argv, versions..."""
        return dict(self._reader.meta)

    @property
    def status(self) -> str:
        """How the run ended (finished, failed, interrupted, terminated, killed),
        or "incomplete": it is still writing, or it was killed."""
        return self._reader.status

    @property
    def end(self) -> Optional[dict]:
        """{"status", "exit_code", "reason", "steps", "last_step", "end_time"}, or None (incomplete)."""
        return dict(self._reader.end) if self._reader.end else None

    @property
    def steps(self) -> np.ndarray:
        """int64 array (read-only): the step number of each recorded row, in order."""
        return _read_only(self._reader.steps)

    @property
    def partial(self) -> np.ndarray:
        """bool array (read-only): True for a row that is no whole step: what the script
        did after its last step's end (an evaluation's backward, an iteration it raised
        in), kept as one more row (docs/steps.md, "The end of the run")."""
        return _read_only(self._reader.partial)

    @property
    def times(self) -> np.ndarray:
        """float64 array (read-only): seconds since the run started, at each recorded row's end."""
        return _read_only(self._reader.times)

    @property
    def tensors(self) -> list:
        """[TensorInfo] of every recorded series, as ``nndb inspect`` and
        ``stats`` list them: the loss, the activations in the order they were
        made, then the values, updates and gradients, each in the model's order."""
        if self._tensors is None:
            self._tensors = [TensorInfo(s.name, s.kind, s.shape, K.module_of_series(s.name, s.kind))
                             for s in self._series()]
        return list(self._tensors)

    def _series(self) -> list:
        # (not the trace's column order: a parameter too large for the host block has
        # its columns before the activations, mnist's fc1.weight on top)
        return in_model_order(self._reader, list(self._reader.series()), by_kind=True)[0]

    @property
    def columns(self) -> tuple:
        """The statistics recorded for each tensor (count, mean, std, min, max, norm, ...)."""
        return tuple(self._reader.columns)

    @property
    def findings(self) -> list:
        """The rules' findings of the run, in order, as the session report has
        them: {"rule", "severity", "step", "tensor"|"module", "message", "evidence"}.
        Written to the trace as the run goes (a killed run keeps those flushed);
        a trace written before nndb kept them has none (``nndb check-trace``
        runs the rules over it again)."""
        return FindingList(self._reader.records("finding"))

    @property
    def stops(self) -> list:
        """The debugger's stops of the run (breakpoints, watchpoints, rules with
        the stop action, exceptions), as the session report has them:
        {"step", "reason", "id", "detail"}."""
        return self._reader.records("stop")

    @property
    def changes(self) -> list:
        """What was changed at the live run's stops, in order (``set``, ``set ... --hold``,
        ``unset``, ``py``/``!``): {"line", "step", "place"} (place ``start``, ``end`` of the
        step, or ``inside`` it), as ``nndb inspect`` lists them: the steps after one are not
        the script's alone."""
        return self._reader.records("change")

    @property
    def events(self) -> list:
        """The run's warnings: [{"time", "step", "kind", "message"}]."""
        return self._reader.events()

    # -- statistics ------------------------------------------------------------
    def _series_info(self, name: str, kind: str):
        if kind not in K.KINDS:
            raise UsageError(f"unknown kind {kind!r}; one of: {', '.join(K.KINDS)}")
        found = self._reader.find(name, kind)
        if not found:
            kinds = [s.kind for s in self._reader.find(name)]
            hint = f" (it is recorded as {', '.join(kinds)})" if kinds else \
                " (the learning rates: trace.learning_rates())" if name == "lr" else " (trace.tensors lists them)"
            raise UsageError(f"no {kind} series {name!r} in {self.path}{hint}")
        return found[0]

    def _stat_index(self, stat: str) -> int:
        if stat not in self._reader.columns:
            if stat in K.STAT_NAMES:        # (a statistic every trace has: its column names damaged)
                raise TraceError(f"{self.path}: the trace has no column '{stat}' (its columns read "
                                 f"{', '.join(map(repr, self._reader.columns))}): a damaged trace")
            raise UsageError(f"unknown statistic {stat!r}; one of: {', '.join(self._reader.columns)}")
        return self._reader.columns.index(stat)

    def _column(self, name: str, kind: str, stat: str) -> tuple:
        """(measured, values): one statistic of one series at every row (``stat`` None: the
        kind's default, schema.default_stat: the loss's value, a tensor's norm)."""
        j = self._stat_index(stat or K.default_stat(kind))
        block = self._reader.column(self._series_info(name, kind))
        return measured(block, self._reader.columns)[:, j], block[:, j]

    def series(self, name: str, kind: str = "grad", stat: Optional[str] = None) -> np.ndarray:
        """float64 array of len(steps): ``stat`` of the ``kind`` series ``name``
        at row i (step ``steps[i]``), NaN where it was not measured (a measured
        NaN is NaN too: ``history`` keeps only the measured rows)."""
        ok, values = self._column(name, kind, stat)
        return np.where(ok, values, np.nan)

    def history(self, name: str, kind: str = "grad", stat: Optional[str] = None, partial: bool = False) -> tuple:
        """(steps, values): ``stat`` of one series at the steps where it was measured; a
        partial row (``Trace.partial``: the work after the run's last step end, no step's
        values) left off, as ``to_pandas()`` and the exports' curves leave it (``partial=True``:
        kept, as ``series`` keeps every row)."""
        ok, values = self._column(name, kind, stat)
        if not partial:
            ok = ok & ~np.asarray(self._reader.partial, dtype=bool)
        return self._reader.steps[ok].copy(), values[ok]

    def learning_rates(self) -> dict:
        """{``OPTIMIZER.groupG``: float64 array of len(steps)}: each param group's
        learning rate at row i (step ``steps[i]``), the one the step used, NaN
        before the group's first step (the columns of ``nndb inspect --series lr``,
        ``history lr`` at the prompt, the exports' ``hyper/OPTIMIZER.groupG/lr``);
        {} where no optimizer stepped."""
        return {f"{opt}.group{group}": values for opt, group, values in self._reader.learning_rates()}

    def hyperparameters(self, name: str = "lr") -> dict:
        """``learning_rates()`` of one of ``lr``, ``weight_decay``, ``momentum``, ``beta1``,
        ``beta2`` (an Adam's betas): the param groups that have it, each at every row
        (a weight-decay schedule, OneCycleLR's momentum); {} where none has it, or the
        trace was written before nndb kept it."""
        if name not in K.HYPER_NAMES:
            raise UsageError(f"unknown hyper-parameter {name!r}; one of: {', '.join(K.HYPER_NAMES)}")
        return {f"{opt}.group{group}": values for opt, group, values in self._reader.hyper_values(name)}

    def _recorded_near(self, step: int) -> str:
        """The recorded steps, said so that a gap shows: ``0..15``, and where
        ``step`` falls between two of them (``--every 5``: ``0..15, one in 5;
        the nearest 0 and 5``), or that there are none."""
        steps = self._reader.steps
        if not len(steps):
            return "none"
        span = f"{int(steps[0])}..{int(steps[-1])}"
        gaps = np.unique(np.diff(steps))
        if len(gaps) == 1 and gaps[0] > 1:
            span += f", one in {int(gaps[0])}"
        elif len(gaps) > 1:
            span += f", {len(steps)} of them"
        before, after = steps[steps < step], steps[steps > step]
        if len(before) and len(after):
            span += f"; the nearest {int(before[-1])} and {int(after[0])}"
        return span

    def stats(self, step: int) -> "StepStats":
        """Every series' statistics at one recorded step: {kind: {name: {stat:
        float or None}}} (None: not measured at that step); its ``partial`` is
        True where the row is no whole step (``Trace.partial``: the work after
        the run's last step end, as ``stats`` at the prompt says 'step N (partial)')."""
        rows = np.flatnonzero(self._reader.steps == step)
        if not len(rows):
            raise UsageError(f"step {step} was not recorded in {self.path} "
                             f"(recorded steps: {self._recorded_near(step)})")
        cols = self._reader.columns
        row = int(rows[-1])
        out = StepStats(int(step), bool(self._reader.partial[row]))
        for (name, kind), values in self._reader.row(row).items():
            out.setdefault(kind, {})[name] = dict(zip(cols, measured_values(values, cols)))
        return out

    def tensor(self, name: str, kind: str = "grad", step: int = 0) -> np.ndarray:
        """The whole tensor ``kind name`` as it was at ``step``, if the run kept
        it (``nndb run --record-full KIND:GLOB``): read chunk by chunk from the
        file, decoded to the tensor's dtype (within the stored precision's
        error: ``full_tensors()`` says which); UsageError if it was not kept."""
        from ..store.distributions import full_tensor
        return full_tensor(self._reader, name, K.KIND_WORDS.get(kind, kind), int(step))[0]

    def full_tensors(self) -> list:
        """Every kept whole tensor: dicts of name, kind, step, shape, dtype, the
        precision asked and stored, and that precision's largest relative error."""
        from ..store.distributions import tensor_info
        keys = dict.fromkeys((e["name"], e["kind"], e["step"]) for e in self._reader.full_index())
        return [tensor_info(self._reader.full_entry(*k)) for k in keys]

    def histogram(self, name: str, kind: str = "grad", step: int = 0) -> np.ndarray:
        """The histogram of ``kind name`` at a full step: 200 counts in value
        order (nndb.histogram: NaN, -Inf, negative half-binades, exact
        zeros, positive half-binades, +Inf); UsageError if there is none."""
        from ..store.distributions import histogram
        return histogram(self._reader, name, K.KIND_WORDS.get(kind, kind), int(step))

    def histogram_steps(self, name: str, kind: str = "grad") -> list:
        """The steps at which ``kind name`` has a histogram."""
        return self._reader.histogram_steps(name, K.KIND_WORDS.get(kind, kind))

    def lineage(self, step: int) -> Optional[dict]:
        """The operations recorded at ``step`` (docs/lineage.md), or None where
        the step's lineage was not recorded (``nndb run --lineage STEPS``)."""
        return self._reader.lineage(step)

    @property
    def lineage_steps(self) -> list:
        """The steps whose lineage was recorded."""
        return self._reader.lineage_steps()

    def to_pandas(self, partial: bool = False):
        """A pandas DataFrame indexed by step, one column per (kind, name, stat)
        (a MultiIndex), NaN where not measured: the whole steps' rows, a partial
        row (``Trace.partial``: the work after the run's last step end, no step's
        values) left off the steps as the exports and plots leave it off their
        curves; ``partial=True``: every row, as ``steps``.  ``df.attrs["partial_steps"]``
        names the partial rows' steps either way.  Needs the optional pandas
        (``pip install 'nndb[pandas]'``)."""
        try:
            import pandas as pd
        except ImportError:
            raise UsageError(PANDAS_MISSING) from None
        cols = self._reader.columns
        infos = self._series()
        block = self._reader.all_stats() if self._reader.n_steps else np.empty((0, len(infos), len(cols)))
        block = np.where(measured(block, cols), block, np.nan)[:, [s.id for s in infos]]
        steps, part = self._reader.steps, np.asarray(self._reader.partial, dtype=bool)
        keep = slice(None) if partial else ~part
        index = pd.MultiIndex.from_tuples([(s.kind, s.name, c) for s in infos for c in cols],
                                          names=["kind", "name", "stat"])
        df = pd.DataFrame(block[keep].reshape(len(block[keep]), -1), index=pd.Index(steps[keep], name="step"),
                          columns=index)
        df.attrs["partial_steps"] = [int(x) for x in steps[part]]
        return df

    # -- the file ----------------------------------------------------------------
    def refresh(self) -> "Trace":
        """Read the file again (a live run's newer steps); returns self."""
        live = self._writer is not None and not self._writer.closed
        reader = TraceReader.from_writer(self._writer) if live else TraceReader(self.path)
        self._reader.close()
        self._reader, self._tensors = reader, None
        return self

    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> "Trace":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        # (the run may have finished where the recording did not: an internal error stopped it)
        stopped = [e for e in self._reader.events() if e.get("kind") == "recording_stopped"]
        cut = f", recording stopped at step {stopped[0].get('step')}" if stopped else ""
        part = [int(x) for x in self._reader.steps[np.asarray(self._reader.partial, dtype=bool)]]
        part_said = f" ({'steps' if len(part) > 1 else 'step'} {', '.join(map(str, part))} partial)" if part else ""
        return (f"<nndb.Trace {self.path!r}: {self._reader.n_steps} step(s){part_said}, {self.status}{cut}, "
                f"{len(self._reader.series())} series>")

    def summary(self) -> dict:
        """What ``_repr_html_`` shows: script, steps, status, findings, tensors."""
        steps = self._reader.steps
        return {"path": self.path, "script": self._reader.meta.get("script"), "status": self.status,
                "steps": int(len(steps)), "first_step": int(steps[0]) if len(steps) else None,
                "last_step": int(steps[-1]) if len(steps) else None,
                "partial_steps": [int(x) for x in steps[self.partial]],
                "findings": len(self._reader.records("finding")),
                "stops": len(self._reader.records("stop")),
                "changes": len(self._reader.records("change")),
                "tensors": self.tensors}

    def _repr_html_(self) -> str:
        from ..render.html import trace_summary
        return trace_summary(self.summary())


class StepStats(dict):
    """``Trace.stats(step)``: {kind: {name: {stat: value}}}, with the ``step`` and
    whether its row is ``partial`` (no whole step: the work after the run's last step end)."""

    def __init__(self, step: int, partial: bool):
        super().__init__()
        self.step, self.partial = step, partial

    def __repr__(self) -> str:
        return f"StepStats(step {self.step} (partial), {dict.__repr__(self)})" if self.partial else dict.__repr__(self)


class FindingList(list):
    """The findings (a list of dicts) with an HTML table for notebooks."""

    def _repr_html_(self) -> str:
        from ..render.html import findings_table
        return findings_table(self)
