#!/usr/bin/env python
"""Python calls per recorded step made by nndb (issue 43's measure).

Runs a bench.py workload recorded as ``nndb run --batch`` does (rules,
checkpoints off: their forks are on wall time), warms it up, then counts
with ``sys.setprofile`` over ``--steps`` steps: the calls of nndb's own
Python functions (frames whose code lives under nndb/), and every profile
event (C calls included) net of the same plain loop.  ``--top N`` lists
the functions called most.

    python scripts/bench_calls.py --workload mlp --workload cnn --top 30
    python scripts/bench_calls.py --workload mlp --median --catch     # with 'catch nan' armed
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench  # noqa: E402
from nndb.run.config import RecordSchedule  # noqa: E402

import nndb  # noqa: E402

NNDB = os.path.dirname(os.path.realpath(nndb.__file__))


def count(name, recorded, steps, tmpdir, catch=False):
    build, _, _ = bench.WORKLOADS[name]
    model, opt, crit, data = build(0)
    rec = session = path = None
    if recorded:
        rec, session, path = bench._recording(RecordSchedule(), tmpdir)
        if catch:                       # (as typing ``catch nan`` at the prompt: checked at step ends)
            from nndb.debugger import points as P
            session.points.add(P.CatchPoint, {"what_kind": "nan", "eager": False})
        rec.__enter__()
    bench.train(model, opt, crit, data, 64)
    own, events = collections.Counter(), [0]

    ours: dict = {}

    def prof(frame, event, arg):
        events[0] += 1
        if event == "call":
            c = frame.f_code
            mine = ours.get(c.co_filename)
            if mine is None:
                mine = ours[c.co_filename] = os.path.realpath(c.co_filename).startswith(NNDB + os.sep)
            if mine:
                own[f"{os.path.relpath(os.path.realpath(c.co_filename), NNDB)}:{c.co_firstlineno} {c.co_qualname}"] += 1
    per_step, counters = [], []
    for i in range(steps):
        before = own.copy()
        sys.setprofile(prof)
        try:
            bench.train(model, opt, crit, data, 1, start=64 + i)
        finally:
            sys.setprofile(None)
        counters.append(own - before)
        per_step.append(sum(counters[-1].values()))
    if recorded:
        bench.end_recording(rec, session, path)
    median = sorted(range(steps), key=per_step.__getitem__)[steps // 2]
    return own, events[0], per_step, counters[median]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", action="append", choices=sorted(bench.WORKLOADS))
    ap.add_argument("--steps", type=int, default=64, help="steps counted (64: two observed steps' stretches)")
    ap.add_argument("--top", type=int, default=0, help="the N functions called most, calls a step")
    ap.add_argument("--median", action="store_true", help="the calls of the median step, by function")
    ap.add_argument("--catch", action="store_true", help="with 'catch nan' armed (issue 43: at most the "
                                                         "default recording's cost + 0.05x)")
    a = ap.parse_args()
    # (checkpoints' forks are on wall time; but 'catch nan' checks at step ends only where a step
    # can be replayed: with them, as `nndb run` has them, else it checks every operation)
    bench.REPLICA = "auto" if a.catch else "off"
    # Blocks of steps judged by the rules end at the observed steps, not on time
    # (the profiler slows a step tenfold: on time they would end every few steps).
    from nndb.rules import engine
    engine.BLOCK_SECONDS = float("inf")
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.workload or ["mlp", "cnn"]:
            _, plain, _, _ = count(name, False, a.steps, tmp)
            own, ev, per_step, median = count(name, True, a.steps, tmp, catch=a.catch)
            q = statistics.quantiles(per_step, n=4)
            print(f"{name}: nndb's own calls/step median {statistics.median(per_step)}, "
                  f"quartiles {q[0]}-{q[2]}, min {min(per_step)}, "
                  f"mean {sum(own.values()) / a.steps:.1f}, max {max(per_step)}; "
                  f"profile events/step net of plain {(ev - plain) / a.steps:.1f}")
            for fn, n in own.most_common(a.top):
                print(f"  {n / a.steps:7.2f}  {fn}")
            if a.median:
                print("  the median step's calls:")
                for fn, n in median.most_common():
                    print(f"  {n:4d}  {fn}")


if __name__ == "__main__":
    main()
