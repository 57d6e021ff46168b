"""``nndb export``: a finished (or live, or killed) trace written to a sink."""
from __future__ import annotations

from dataclasses import dataclass

from .scalars import findings_by_step, hyper_scalars, run_params, series_tags, start_time


@dataclass
class ExportSummary:
    target: str
    tags: int
    points: int
    findings: int
    histograms: int = 0


def export_trace(reader, sink, findings: list, label: str, progress=None) -> ExportSummary:
    """Write the trace read by ``reader`` and its ``findings`` (dicts) to
    ``sink``, then close it with the run's status.  ``progress(done, total)``,
    if given, is called after each series and histogram (``total``: the
    trace's series and histograms)."""
    first = int(reader.steps[0]) if reader.n_steps else 0
    sink.params(run_params(reader.meta), first)
    n_series = len(reader.series())
    with_hists = hasattr(sink, "histogram")     # (TensorBoard: its histogram view)
    n_hists = sum(len(reader.histogram_steps(s.name, s.kind)) for s in reader.series()) if with_hists else 0
    total, done = n_series + n_hists, 0
    tags = points = 0
    for group in series_tags(reader):
        for series in group:
            sink.scalars(series)
            tags += 1
            points += len(series.steps)
        done += 1
        if progress is not None:
            progress(done, total)
    for series in hyper_scalars(reader):
        sink.scalars(series)
        tags += 1
        points += len(series.steps)
    start = start_time(reader.meta)
    time_of = dict(zip(reader.steps.tolist(), reader.times.tolist()))
    by_step = findings_by_step(findings)
    for step in sorted(by_step):
        sink.findings(step, by_step[step], start + time_of.get(step, 0.0))
    hists = 0
    if with_hists:
        from .histograms import trace_histograms
        for p in trace_histograms(reader):
            sink.histogram(p)
            hists += 1
            if progress is not None:
                progress(n_series + hists, total)
    sink.artifact(reader.path)
    sink.close(reader.status)
    return ExportSummary(label, tags, points, sum(map(len, by_step.values())), hists)
