"""Write a trace with TraceWriter until the disk (or ``ulimit -f``) is full.

python store_fill_disk.py TRACE STEPS SERIES [--no-room-check]

Each step's statistics are a function of the step number (``value(step)``),
so a reader can check every row it gets back.  Prints "committed N" for each
block the writer committed, and "failed: MESSAGE" once if it stopped.
--no-room-check turns the writer's room check off, so that the write itself
fails (the disk filling up under the writer)."""
import sys

import numpy as np

from nndb.store import writer as W
from nndb.tracer.recorder import StepRecord


def value(step: int, j: int) -> float:
    return 1.0 + step * 1e-3 + j * 1e-6


def main() -> int:
    path, steps, n_series = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if "--no-room-check" in sys.argv:
        W.check_room = lambda *a: None
    errors = []
    w = W.TraceWriter(path, {"script": "fill"}, flush_steps=50, flush_secs=1e9, on_error=errors.append)
    names = [(f"layer{j}.weight", "param") for j in range(n_series)]
    for step in range(steps):
        v = np.array([value(step, j) for j in range(n_series)])
        raw = np.stack([np.full(n_series, 10.0), 10 * v, 10 * v * v, v, v, 10 * v,
                        np.zeros(n_series), np.zeros(n_series), np.zeros(n_series)], axis=1)
        w.append(StepRecord(step, step * 0.5, 1, 1, names, raw))
        if w.steps_written and not errors:
            print("committed", w._committed_rows, flush=True)
    w.close("finished", 0)
    for e in errors:
        print("failed:", e, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
