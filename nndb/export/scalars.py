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
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional, Sequence

import numpy as np

from ..safetext import printable_line
from ..store.measured import measured
from ..store.schema import STAT_NAMES


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


def series_scalars(name: str, kind: str, steps, block, walltimes,
                   columns: Sequence[str] = STAT_NAMES) -> Iterator[ScalarSeries]:
    """The tags of one series, from its rows ``block`` ((N, columns)) at
    ``steps``: every statistic's measured numbers, then the loss headline."""
    steps = np.asarray(steps, dtype=np.int64)
    block = np.asarray(block, dtype=np.float64).reshape(len(steps), len(columns))
    walltimes = np.asarray(walltimes, dtype=np.float64)
    keep = measured(block, columns) & ~np.isnan(block)
    for j, stat in enumerate(columns):
        k = keep[:, j]
        if k.any():
            yield ScalarSeries(tag(kind, name, stat), steps[k], block[k, j], walltimes[k])
    if kind == "loss" and "mean" in columns:
        j = list(columns).index("mean")
        k = keep[:, j]
        if k.any():
            yield ScalarSeries(loss_tag(name), steps[k], block[k, j], walltimes[k])


def trace_scalars(reader) -> Iterator[ScalarSeries]:
    """Every tag of a trace (nndb.store.reader.TraceReader), series by series
    in the trace's order."""
    start = start_time(reader.meta)
    time_of = dict(zip(reader.steps.tolist(), reader.times.tolist()))
    for s in reader.series():
        steps, block = reader.history(s)
        if len(steps) == 0:
            continue
        times = start + np.array([time_of[int(st)] for st in steps], dtype=np.float64)
        yield from series_scalars(s.name, s.kind, steps, block, times, reader.columns)


def record_scalars(record, start: float) -> Iterator[ScalarSeries]:
    """The tags of one live step's record (nndb.tracer.recorder.StepRecord)."""
    stats = record.stats
    steps = np.array([record.step], dtype=np.int64)
    times = np.array([start + record.time])
    for (name, kind), row in zip(record.names, stats):
        yield from series_scalars(name, kind, steps, row[None, :], times)


def start_time(meta: dict) -> float:
    t = meta.get("start_time")
    return float(t) if isinstance(t, (int, float)) and np.isfinite(t) else 0.0


# -- findings ---------------------------------------------------------------------------------

def finding_line(f: dict) -> str:
    """One finding (a Finding.as_dict(), live or from a trace) as one line of text."""
    subject = f.get("tensor") or f.get("module")
    return printable_line(f"{f.get('severity', '?')}: {f.get('rule', '?')}"
                          + (f" ({subject})" if subject else "") + f": {f.get('message', '')}")


def findings_by_step(findings: Iterable[dict]) -> dict:
    """{step: [line, ...]} in the order the findings came."""
    out: dict = {}
    for f in findings:
        step = f.get("step")
        if isinstance(step, int):
            out.setdefault(step, []).append(finding_line(f))
    return out


def trace_findings(reader, rules: Optional[str] = "default") -> list:
    """What the rules find on a trace (nndb check-trace's findings) as dicts."""
    from ..rules.catalog import load
    from ..rules.offline import check_trace
    engine = load(rules)
    if engine is None:
        return []
    return [f.as_dict() for f in check_trace(reader, engine).findings]


# -- the run's parameters -------------------------------------------------------------------

# The metadata worth a parameter (meta keys, in this order).
META_PARAMS = ("script", "module", "argv", "start_time_iso", "torch", "nndb_version", "device",
               "world_size", "git_commit", "schedule")


def run_params(meta: dict, hyper: Optional[list]) -> dict:
    """{key: text}: the run's script, argv and setup from the trace's metadata,
    and each optimizer param group's first learning rate (the only
    hyper-parameter a trace keeps: ``hyper`` rows)."""
    out = {}
    for key in META_PARAMS:
        v = meta.get(key)
        if v is None or v == "":
            continue
        if key == "argv" and isinstance(v, list):
            v = shlex.join(str(a) for a in v)
        out[key] = printable_line(v)
    for row in hyper or ():
        key = f"{row.get('optimizer')}.group{row.get('group')}.lr"
        if key not in out and row.get("lr") is not None:
            out[key] = repr(row["lr"])
    return out
