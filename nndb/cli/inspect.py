"""``nndb inspect``: one trace (its summary, one tensor's history, a kept
whole tensor) or a distributed job's run directory, as text or JSON."""
from __future__ import annotations

import os
from typing import Optional

import click

from ..errors import NndbError, UsageError
from ..schema import KINDS as KIND_CHOICES, STAT_NAMES as STAT_CHOICES
from ..text import to_json
from .common import fail


@click.command("inspect")
@click.argument("trace", metavar="TRACE|RUNDIR")
@click.option("--series", "series_name", metavar="NAME", help="Print the history of one tensor.")
@click.option("--stat", type=click.Choice(STAT_CHOICES),
              help="The statistic --series prints (default: the loss's value, its mean; a tensor's norm).")
@click.option("--kind", type=click.Choice(KIND_CHOICES), help="With --series: only this kind.")
@click.option("--ranks", "side_by_side", is_flag=True,
              help="With a RUNDIR: each tensor's statistics per rank, side by side (default: merged).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--tensor", "tensor_spec", metavar="KIND:NAME",
              help="A whole tensor kept by --record-full, or a histogram, at --step.")
@click.option("--step", "tensor_step", type=int, metavar="N", help="With --tensor: the step.")
@click.option("--npy", "npy_path", metavar="OUT.npy", type=click.Path(dir_okay=False),
              help="With --tensor: write the kept tensor to OUT.npy (numpy's format).")
def inspect(trace, series_name, stat, kind, side_by_side, as_json, tensor_spec, tensor_step, npy_path):
    """Print a trace's metadata, step count and recorded tensors.  Given a
    run directory of a distributed job (one rank<R>.h5 per rank): the job's
    ranks, their steps and findings, the cross-rank findings, and each
    tensor's statistics merged across ranks (--ranks: side by side).  Exit
    code 0; 2 for an unreadable trace, or a directory that is not one whole
    job (empty, mixed jobs or scripts, a rank missing)."""
    try:
        out = inspect_text(trace, series_name, stat, kind, side_by_side, as_json, tensor_spec, tensor_step,
                           npy_path)
    except NndbError as e:
        fail(e)
    click.echo(out)


def inspect_text(trace: str, series_name: Optional[str], stat: Optional[str], kind: Optional[str], side_by_side: bool,
                 as_json: bool, tensor_spec: Optional[str], tensor_step: Optional[int],
                 npy_path: Optional[str]) -> str:
    from ..api import inspect as queries
    from ..render import text
    from ..store.reader import TraceReader

    if (tensor_step is not None or npy_path) and not tensor_spec:
        raise UsageError("--step and --npy go with --tensor KIND:NAME")
    if os.path.isdir(trace):
        if series_name or kind or tensor_spec:
            raise UsageError("--series, --kind and --tensor go with a trace, not a run directory")
        from ..rules.crossrank import judge_rundir
        from ..store.job import job_summary, open_job
        with open_job(trace) as job:
            data = job_summary(job, judge_rundir(job), ranks=side_by_side)
        return to_json(data) if as_json else text.job(data)
    if side_by_side:
        raise UsageError("--ranks goes with a run directory (RUNDIR), not one trace")
    with TraceReader(trace) as reader:
        if tensor_spec:
            if tensor_step is None:
                raise UsageError("--tensor needs --step N")
            data = queries.tensor_at(reader, tensor_spec, tensor_step, npy_path)
            return to_json(data) if as_json else text.tensor_at(data)
        if series_name:
            data = queries.series(reader, series_name, stat, kind)
            return to_json(data) if as_json else text.series(data)
        if kind:
            raise UsageError("--kind goes with --series")
        data = queries.summary(reader)
        return to_json(data) if as_json else text.summary(data)
