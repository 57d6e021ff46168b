"""``nndb export``: a finished (or live, or killed) trace written to a sink."""
from __future__ import annotations

from dataclasses import dataclass

from .scalars import findings_by_step, run_params, start_time, trace_scalars


@dataclass
class ExportSummary:
    target: str
    tags: int
    points: int
    findings: int
    histograms: int = 0


def export_trace(reader, sink, findings: list, label: str) -> ExportSummary:
    """Write the trace read by ``reader`` and its ``findings`` (dicts) to
    ``sink``, then close it with the run's status."""
    first = int(reader.steps[0]) if reader.n_steps else 0
    sink.params(run_params(reader.meta, reader.hyper()), first)
    tags = points = 0
    for series in trace_scalars(reader):
        sink.scalars(series)
        tags += 1
        points += len(series.steps)
    start = start_time(reader.meta)
    time_of = dict(zip(reader.steps.tolist(), reader.times.tolist()))
    by_step = findings_by_step(findings)
    for step in sorted(by_step):
        sink.findings(step, by_step[step], start + time_of.get(step, 0.0))
    hists = 0
    if hasattr(sink, "histogram"):            # (TensorBoard: its histogram view)
        from .histograms import trace_histograms
        for p in trace_histograms(reader):
            sink.histogram(p)
            hists += 1
    sink.artifact(reader.path)
    sink.close(reader.status)
    return ExportSummary(label, tags, points, sum(map(len, by_step.values())), hists)
