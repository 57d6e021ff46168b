"""The TensorBoard sink: torch.utils.tensorboard's SummaryWriter (the
``tensorboard`` extra), imported when the sink is opened.

Scalars go to their tags at their steps and wall times; the findings of a
step go to the text tag ``findings`` (one entry per step, a line per
finding); the run's parameters to the text tag ``run`` at the first step.
The histograms a trace holds (at full steps: nndb.export.histograms) go
to TensorBoard's histogram view, tag ``KIND/NAME/hist``.
"""
from __future__ import annotations

FINDINGS_TAG = "findings"
RUN_TAG = "run"


def _markdown_line(text: str) -> str:
    """TensorBoard renders text as Markdown: a line is shown as written."""
    return "".join("\\" + c if c in "\\`*_[]<>#|~" else c for c in text)


class TensorBoardSink:
    def __init__(self, logdir: str):
        from torch.utils.tensorboard import SummaryWriter
        self.logdir = logdir
        self._writer = SummaryWriter(log_dir=logdir)

    def scalars(self, series) -> None:
        add = self._writer.add_scalar
        for step, value, wall in zip(series.steps.tolist(), series.values.tolist(), series.walltimes.tolist()):
            add(series.tag, value, step, walltime=wall)

    def findings(self, step: int, lines: list, walltime=None) -> None:
        self._writer.add_text(FINDINGS_TAG, "  \n".join(_markdown_line(x) for x in lines), step, walltime=walltime)

    def params(self, params: dict, step: int = 0) -> None:
        if params:
            table = "| parameter | value |\n|---|---|\n" + "\n".join(
                f"| {_markdown_line(k)} | {_markdown_line(v)} |" for k, v in params.items())
            self._writer.add_text(RUN_TAG, table, step)

    def histogram(self, p) -> None:
        """One nndb.export.histograms.HistogramPoint."""
        self._writer.add_histogram_raw(p.tag, p.min, p.max, p.num, p.sum, p.sum_squares,
                                       p.bucket_limits, p.bucket_counts, p.step, walltime=p.walltime)

    def artifact(self, path: str) -> None:
        """(TensorBoard keeps no files: the trace stays where it is.)"""

    def flush(self) -> None:
        self._writer.flush()

    def close(self, status: str = "finished") -> None:
        self._writer.close()
