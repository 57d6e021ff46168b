"""``nndb export``: a trace to TensorBoard and/or MLflow (nndb.export)."""
from __future__ import annotations

import sys

import click

from ..errors import EXIT_SIGINT, NndbError, UsageError
from ..text import printable
from .common import fail, stderr_is_terminal


@click.command("export")
@click.argument("trace", metavar="TRACE")
@click.option("--tensorboard", "tb_dir", metavar="DIR", help="Write TensorBoard event files into DIR.")
@click.option("--mlflow", "mlflow_uri", is_flag=False, flag_value="", default=None, metavar="[TRACKING_URI]",
              help="Log an MLflow run (default tracking URI: MLFLOW_TRACKING_URI, else a file store in ./mlruns).")
@click.option("--experiment", default="nndb", show_default=True, metavar="NAME", help="The MLflow experiment.")
@click.option("--run-name", metavar="NAME", help="The MLflow run's name (default: the trace's file name without its extension: run for run.h5).")
@click.option("--rules", "rules", default="default", show_default=True, metavar="default|FILE.yaml|none",
              help="The rules whose findings are exported (as nndb check-trace runs them).")
def export(trace, tb_dir, mlflow_uri, experiment, run_name, rules):
    """Export TRACE to TensorBoard and/or MLflow: every recorded statistic
    as a scalar at its step (tags KIND/NAME/STAT, the loss also as 'loss/value'), the
    findings as text (TensorBoard) or tags (MLflow), each param group's
    learning rate at every step (hyper/OPT.groupG/lr), the run's parameters,
    the histograms (TensorBoard) and (MLflow) the trace as an artifact.  On
    a terminal a progress line shows on stderr.  Exit code 0; 2 for an
    unreadable trace or a store that refuses the export; 130 at Ctrl-C
    (the TensorBoard event files begun are removed, an MLflow run begun is
    marked KILLED)."""
    import os
    from ..debugger.progress import CountLine
    from ..export.scalars import trace_findings
    from ..export.targets import mlflow_target, tensorboard_target
    from ..store.reader import TraceReader

    line = None
    try:
        if tb_dir is None and mlflow_uri is None:
            raise UsageError("export where? --tensorboard DIR and/or --mlflow [TRACKING_URI]")
        targets = []
        if tb_dir is not None:
            targets.append(tensorboard_target(tb_dir, "nndb export --tensorboard"))
        if mlflow_uri is not None:
            name = run_name or os.path.splitext(os.path.basename(trace))[0]
            targets.append(mlflow_target(mlflow_uri, "nndb export --mlflow", experiment, name))
        with TraceReader(trace) as reader:
            findings = trace_findings(reader, rules)
            for t in targets:
                line = CountLine(printable(f"nndb: exporting to {t.label}"), "series and histograms") \
                    if stderr_is_terminal() else None
                done = export_to(reader, t, findings, line.update if line else None)
                if line:
                    line.clear()
                hists = f", {done.histograms} histogram(s)" if done.histograms else ""
                click.echo(printable(f"nndb: exported {done.points} value(s) in {done.tags} tag(s){hists} and "
                                     f"{done.findings} finding(s) to {done.target}"))
    except NndbError as e:
        fail(e)
    except KeyboardInterrupt:
        if line:
            line.clear()
        click.echo("nndb: export interrupted (Ctrl-C): the event files it had begun are removed; an MLflow run "
                   "begun is marked KILLED; exports finished before stay", err=True)
        sys.exit(EXIT_SIGINT)


def export_to(reader, target, findings, progress=None):
    """One export; a store that refuses it (unreachable, read-only) is one line, exit 2.
    A KeyboardInterrupt (Ctrl-C) aborts the sink (its partial files removed,
    an MLflow run marked KILLED) and goes on up."""
    from ..export.offline import export_trace
    sink = None
    try:
        sink = target.open()
        return export_trace(reader, sink, findings, target.label, progress)
    except KeyboardInterrupt:
        if sink is not None:
            sink.abort()
        raise
    except NndbError:
        raise
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise UsageError(f"cannot export to {target.label}: {type(e).__name__}: {first}") from None
