"""``nndb plot``: a picture of a trace (nndb.render.pictures)."""
from __future__ import annotations

import click

from ..errors import NndbError
from ..schema import KINDS as KIND_CHOICES, STAT_NAMES as STAT_CHOICES
from ..text import printable
from .common import fail


@click.command("plot")
@click.argument("trace", metavar="TRACE")
@click.option("--what", type=click.Choice(["heatmap", "loss", "history", "ratio"]), default="heatmap",
              show_default=True, help="heatmap: layers x steps; loss: the loss curve; history: one tensor's "
                                      "statistics; ratio: update/weight ratio per layer.")
@click.option("--kind", type=click.Choice(KIND_CHOICES), help="The tensors' kind (default: grad; history: param).")
@click.option("--stat", type=click.Choice(STAT_CHOICES), default="norm", show_default=True,
              help="The statistic of the heat map.")
@click.option("--glob", metavar="PATTERN", help="Only the tensors whose names match (history: the tensor).")
@click.option("--rules", "rules", default="default", show_default=True, metavar="default|FILE.yaml|none",
              help="The rules whose findings are marked (as nndb check-trace runs them).")
@click.option("--report", "report_path", metavar="FILE.json", type=click.Path(dir_okay=False),
              help="Mark the stops of this nndb run --report too.")
@click.option("-o", "--output", metavar="FILE.png|FILE.svg",
              help="Write the picture here (default: beside the trace, named for what it shows).")
def plot(trace, what, kind, stat, glob, rules, report_path, output):
    """Draw a picture of TRACE: a heat map of a statistic per layer and step
    (log colour scale, layers in model order), the loss curve, one tensor's
    history, or the update/weight ratio per layer; findings (and with
    --report, stops) are marked.  Prints the picture's path."""
    from ..extras import require
    from ..render.pictures import picture, stops_of_report
    from ..export.scalars import trace_findings
    from ..store.reader import TraceReader

    try:
        require("plot", "nndb plot")
        stops = stops_of_report(report_path) if report_path else []
        with TraceReader(trace) as reader:
            path = picture(reader, what, kind, stat, glob, trace_findings(reader, rules), stops, output)
    except NndbError as e:
        fail(e)
    click.echo(printable(path))
