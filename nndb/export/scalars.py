"""What an export writes, as plain data: no exporter is imported here.

A tag names one statistic of one series, ``KIND/NAME/STAT`` (``grad/fc1.weight/norm``,
``act/relu#2/zero_frac``, ``loss/loss/mean``), and each loss series also
has a headline tag, ``NAME/value`` (``loss/value``, or ``loss/netD/value``
with several optimizers), whose value is the step's loss (its ``mean``: a
scalar loss is one number, the sum over the step's backward passes).  No tag is a prefix of another: MLflow's file
store keeps a metric ``a/b`` as a file under the directory ``a``.  A value is exported where it was measured and is a
number: "not measured" (nndb.store.measured) and a measured NaN are both
left out, never written as 0; an Inf is written as it is.  Steps are the
run's own step numbers; wall times are the run's start plus each step's time.
A row that is no whole step (the work after the run's last step end: an
evaluation's ``backward()``, the iteration a Ctrl-C or an exception cut
short; nndb.Trace.partial) goes to the same tags under ``partial/``
(``partial/loss/value``), never onto a training step's curve.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional, Sequence

import numpy as np

from ..text import printable_line
from ..store.measured import measured
from ..schema import HYPER_NAMES, STAT_NAMES


@dataclass(frozen=True)
class ScalarSeries:
    """One tag's points: ``steps`` (int64) and ``values`` (float64), with
    ``walltimes`` (seconds since the epoch, float64) of the same length."""
    tag: str
    steps: np.ndarray
    values: np.ndarray
    walltimes: np.ndarray


def tag(kind: str, name: str, stat: str) -> str:
    return f"{kind}/{name}/{stat}"


def loss_tag(name: str) -> str:
    """The headline tag of a loss series: the step's loss."""
    return f"{name}/value"


PARTIAL = "partial/"        # the prefix of a partial row's tags


def _whole_then_partial(partial, n: int):
    """(prefix, row mask) for the whole steps' rows, then the partial ones'."""
    part = np.zeros(n, bool) if partial is None else np.asarray(partial, dtype=bool)
    return (("", ~part), (PARTIAL, part))


def series_scalars(name: str, kind: str, steps, block, walltimes,
                   columns: Sequence[str] = STAT_NAMES, partial=None) -> Iterator[ScalarSeries]:
    """The tags of one series, from its rows ``block`` ((N, columns)) at
    ``steps``: every statistic's measured numbers, then the loss headline;
    the rows ``partial`` marks (a bool per row) under ``partial/``."""
    steps = np.asarray(steps, dtype=np.int64)
    block = np.asarray(block, dtype=np.float64).reshape(len(steps), len(columns))
    walltimes = np.asarray(walltimes, dtype=np.float64)
    numbers = measured(block, columns) & ~np.isnan(block)
    for prefix, rows in _whole_then_partial(partial, len(steps)):
        keep = numbers & rows[:, None]
        for j, stat in enumerate(columns):
            k = keep[:, j]
            if k.any():
                yield ScalarSeries(prefix + tag(kind, name, stat), steps[k], block[k, j], walltimes[k])
        if kind == "loss" and "mean" in columns:
            j = list(columns).index("mean")
            k = keep[:, j]
            if k.any():
                yield ScalarSeries(prefix + loss_tag(name), steps[k], block[k, j], walltimes[k])


def trace_scalars(reader) -> Iterator[ScalarSeries]:
    """Every tag of a trace (nndb.store.reader.TraceReader), series by series
    in the trace's order, then the learning rates (``hyper_scalars``)."""
    for tags in series_tags(reader):
        yield from tags
    yield from hyper_scalars(reader)


def series_tags(reader) -> Iterator[list]:
    """Each series' tags (a list, empty for a series without a value), in the trace's order."""
    start = start_time(reader.meta)
    time_of = dict(zip(reader.steps.tolist(), reader.times.tolist()))
    partial_steps = np.asarray(reader.steps)[np.asarray(reader.partial, dtype=bool)]
    for s in reader.series():
        steps, block = reader.history(s)
        if len(steps) == 0:
            yield []
            continue
        times = start + np.array([time_of[int(st)] for st in steps], dtype=np.float64)
        yield list(series_scalars(s.name, s.kind, steps, block, times, reader.columns,
                                  np.isin(steps, partial_steps)))


def hyper_tag(optimizer: str, group, name: str = "lr") -> str:
    """A hyper-parameter's tag: ``hyper/OPTIMIZER.groupG/NAME`` (``hyper/opt.group0/lr``)."""
    return f"hyper/{optimizer}.group{group}/{name}"


def hyper_scalars(reader) -> Iterator[ScalarSeries]:
    """Each param group's learning rate (and weight_decay, momentum, beta1, beta2, those
    it has: schema.HYPER_NAMES) at every recorded step: the trace's ``hyper`` rows (a
    group's values from a step on, written when one changed) carried forward over the
    recorded steps; none before a group's first row, none where the value was not a
    number; a partial row's under ``partial/``."""
    steps = np.asarray(reader.steps, dtype=np.int64)
    if not len(steps):
        return
    walltimes = start_time(reader.meta) + np.asarray(reader.times, dtype=np.float64)
    for name in HYPER_NAMES:
        for opt, group, values in reader.hyper_values(name):
            for prefix, rows in _whole_then_partial(reader.partial, len(steps)):
                k = ~np.isnan(values) & rows
                if k.any():
                    yield ScalarSeries(prefix + hyper_tag(printable_line(opt), group, name), steps[k], values[k],
                                       walltimes[k])


def record_scalars(record, start: float) -> Iterator[ScalarSeries]:
    """The tags of one live step's record (nndb.tracer.recorder.StepRecord)."""
    stats = record.stats
    steps = np.array([record.step], dtype=np.int64)
    times = np.array([start + record.time])
    for (name, kind), row in zip(record.names, stats):
        yield from series_scalars(name, kind, steps, row[None, :], times, partial=[record.partial])


def start_time(meta: dict) -> float:
    t = meta.get("start_time")
    return float(t) if isinstance(t, (int, float)) and np.isfinite(t) else 0.0


# -- findings ---------------------------------------------------------------------------------

def finding_line(f: dict) -> str:
    """One finding (a Finding.as_dict(), live or from a trace) as one line of
    text; one from a trace says who found it (``[run]``, ``[check-trace]``)."""
    subject = f.get("tensor") or f.get("module")
    who = f" [{', '.join(f['found_by'])}]" if f.get("found_by") else ""
    return printable_line(f"{f.get('severity', '?')}: {f.get('rule', '?')}"
                          + (f" ({subject})" if subject else "") + f"{who}: {f.get('message', '')}")


def findings_by_step(findings: Iterable[dict]) -> dict:
    """{step: [line, ...]} in the order the findings came."""
    out: dict = {}
    for f in findings:
        step = f.get("step")
        if isinstance(step, int):
            out.setdefault(step, []).append(finding_line(f))
    return out


def trace_findings(reader, rules: Optional[str] = "default") -> list:
    """The findings the live run stored in the trace and what ``rules`` find
    on it again (nndb check-trace's findings), as dicts marked ``found_by``
    (nndb.rules.offline.merge_findings); ``rules`` none: the run's alone."""
    from ..rules.catalog import load
    from ..rules.offline import check_trace, stored_findings
    engine = load(rules)
    if engine is None:
        return stored_findings(reader)
    return check_trace(reader, engine).all_findings()


# -- the run's parameters -------------------------------------------------------------------

# The metadata worth a parameter (meta keys, in this order).
META_PARAMS = ("script", "module", "argv", "nndb_argv", "start_time_iso", "torch", "nndb_version", "device",
               "world_size", "git_commit", "schedule")


def run_params(meta: dict) -> dict:
    """{key: text}: the run's script, argv and setup from the trace's
    metadata (the learning rates are scalars at every step: ``hyper_scalars``)."""
    out = {}
    for key in META_PARAMS:
        v = meta.get(key)
        if v is None or v == "" or v == []:
            continue
        if key in ("argv", "nndb_argv") and isinstance(v, list):
            v = shlex.join(str(a) for a in v)
        out[key] = printable_line(v)
    return out
