"""``nndb export``'s speed (``python scripts/bench.py --export-speed``).

The bench's MLP is recorded for STEPS steps as ``nndb run --batch`` records
it (the rules, no checkpoints), then the trace is exported to TensorBoard
``--repeat`` times in this process (``nndb.export.offline.export_trace``
with TensorBoard's sink: reading the trace, the scalars, the learning
rates, the histograms and the event file, closed; the interpreter's start
and the imports are not timed).  Printed: the median seconds and the steps
exported per second (steps / seconds), with the values and tags written.

On 2026-12-03 (2 shared cores) a 2001-step trace of 251 tags took 94 s
through ``add_scalar`` (one event per value, through the writer's queue of
10); one event per step: see docs/performance.md.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time

STEPS = 2000


def record(bench, steps: int, tmpdir: str) -> str:
    """A trace of ``steps`` steps of the bench's MLP, recorded as nndb run --batch records it."""
    from nndb.run.config import RecordSchedule
    bench.REPLICA = "off"
    model, opt, crit, data = bench.mlp(0)
    rec, session, path = bench._recording(RecordSchedule.parse(None, None, None, None), tmpdir)
    with rec:
        bench.train(model, opt, crit, data, steps)
    rec.close()
    session.run_ended("finished", 0, "")
    session.machine.close()
    return path


def main(bench, steps: int = STEPS, repeat: int = 3) -> dict:
    from nndb.export.offline import export_trace
    from nndb.export.tensorboard import TensorBoardSink
    from nndb.store.reader import TraceReader
    with tempfile.TemporaryDirectory() as tmpdir:
        path = record(bench, steps, tmpdir)
        times = []
        for i in range(repeat):
            with TraceReader(path) as reader:
                n = reader.n_steps
                t0 = time.perf_counter()
                done = export_trace(reader, TensorBoardSink(os.path.join(tmpdir, f"tb{i}")), [], "tensorboard")
                times.append(time.perf_counter() - t0)
    s = statistics.median(times)
    out = {"steps": n, "tags": done.tags, "values": done.points, "histograms": done.histograms,
           "seconds_median": s, "seconds": times, "steps_per_s": n / s}
    print(f"export to TensorBoard: {n} steps, {done.tags} tags, {done.points} values, {done.histograms} "
          f"histograms: {s:.2f} s (median of {repeat}: {', '.join(f'{t:.2f}' for t in times)}), "
          f"{n / s:.0f} steps/s")
    return out
