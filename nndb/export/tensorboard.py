"""The TensorBoard sink: torch.utils.tensorboard's SummaryWriter (the
``tensorboard`` extra), imported when the sink is opened.

Scalars go to their tags at their steps and wall times; the findings of a
step go to the text tag ``findings`` (one entry per step, a line per
finding); the run's parameters to the text tag ``run`` at the first step.
The histograms a trace holds (at full steps: nndb.export.histograms) go
to TensorBoard's histogram view, tag ``KIND/NAME/hist``.

Scalars are written as one event per step holding every tag's value there
(a ``Summary`` of many values, as TensorBoard reads it), not one event per
value through ``add_scalar``: a 2001-step trace of 251 tags was 177,123
events through the writer's queue of 10, 94 s; it is 2,001 events.  They
are kept until ``flush`` (or PENDING_MAX values) and written in step order;
every value of one tag goes out in one batch, in step order, so TensorBoard
never sees a tag's step go back.  ``abort`` (Ctrl-C in ``nndb export``)
closes the writer and removes the event files this sink made (and its
directory, if it made it and it is left empty): no partial export is left.
"""
from __future__ import annotations

import os

FINDINGS_TAG = "findings"
RUN_TAG = "run"


def _markdown_line(text: str) -> str:
    """TensorBoard renders text as Markdown: a line is shown as written."""
    return "".join("\\" + c if c in "\\`*_[]<>#|~" else c for c in text)


PENDING_MAX = 200_000       # scalar values kept before they are written


class TensorBoardSink:
    def __init__(self, logdir: str):
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard import SummaryWriter
        self.logdir = logdir
        self._made_dir = not os.path.isdir(logdir)
        self._files_before = set() if self._made_dir else set(os.listdir(logdir))
        self._writer = SummaryWriter(log_dir=logdir, max_queue=4096)     # (the default 10 blocks each put)
        self._summary, self._value = Summary, Summary.Value
        self._pending: dict = {}        # step -> (walltime, [Summary.Value])
        self._n_pending = 0

    def scalars(self, series) -> None:
        pending, value, tag = self._pending, self._value, series.tag
        for step, v, wall in zip(series.steps.tolist(), series.values.tolist(), series.walltimes.tolist()):
            entry = pending.get(step)
            if entry is None:
                entry = pending[step] = (wall, [])
            entry[1].append(value(tag=tag, simple_value=v))
        self._n_pending += len(series.steps)
        if self._n_pending >= PENDING_MAX:
            self._write_pending()

    def _write_pending(self) -> None:
        if not self._pending:
            return
        writer = self._writer._get_file_writer()
        for step in sorted(self._pending):
            wall, values = self._pending[step]
            writer.add_summary(self._summary(value=values), step, wall)
        self._pending.clear()
        self._n_pending = 0

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
        self._write_pending()
        self._writer.flush()

    def close(self, status: str = "finished") -> None:
        self._write_pending()
        self._writer.close()

    def abort(self) -> None:
        """Stop: close the writer and remove what this sink wrote."""
        self._pending.clear()
        self._writer.close()
        for name in set(os.listdir(self.logdir)) - self._files_before:
            if name.startswith("events.out.tfevents."):
                os.remove(os.path.join(self.logdir, name))
        if self._made_dir and not os.listdir(self.logdir):
            os.rmdir(self.logdir)
