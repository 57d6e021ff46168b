"""Where a recorded step's extra time goes (``python scripts/bench.py --phases``).

The same loop as the timed benchmark, plain and recorded (what ``nndb run
--batch`` adds), interleaved, with a clock read between the phases of each
step: ``zero_grad()``, the forward pass, the loss, ``backward()`` and
``opt.step()``.  Printed per workload:

* per phase, the median over the usual steps (plain: every step; recorded:
  the steps that are not observed, nndb.cadence.observed), and what of
  nndb's runs in that phase.  A phase where no code of nndb's runs and that
  still takes longer recorded is the script's own work slowed by what
  nndb's code did to the caches in between (docs/performance.md, "Seventh
  round");
* per step, the recorded step's extra time split into the usual step's
  (median against median), the observed steps' (their mean excess over the
  usual median, spread over all steps) and the rest: the usual steps' mean
  over their median, which is where the trace writer's thread and time
  travel's checkpoints show (a few steps of several ms each).

The medians are per step; the split's parts add up to the difference of
the means (the timed benchmark's ratio is a ratio of means).
"""
from __future__ import annotations

import statistics
import time

from nndb import cadence

PHASES = ("zero_grad", "forward", "loss", "backward", "step")
# What of nndb's runs in each phase (on a usual step; observed steps add module hooks)
NNDB_IN = {
    "zero_grad": "nothing",
    "forward": "nothing (module hooks only on observed steps)",
    "loss": "nothing (module hooks only on observed steps)",
    "backward": "gradient hooks, the backward's end (the loss)",
    "step": "the optimizer's hooks, the step's end (record, listeners)",
}


def phase_loop(build, steps: int, recorded: bool, schedule, tmpdir, bench) -> tuple:
    """([(phase seconds...)] per step, [observed?] per step, [step number]
    per recorded step) of ``steps`` steps after the benchmark's warm-up
    (``bench``: scripts/bench.py)."""
    model, opt, crit, data = build(0)
    rec = session = path = None
    if recorded:
        rec, session, path = bench._recording(schedule, tmpdir)
        rec.__enter__()
    bench.warm_up(model, opt, crit, data, session)
    recorder = rec.tracer.recorder if rec is not None else None
    clock = time.perf_counter
    times, observed, numbers = [], [], []
    for i in range(steps):
        x, y = data[i % len(data)]
        if recorder is not None:
            numbers.append(recorder.step)
        obs = recorder is not None and cadence.observed(recorder.step)
        t0 = clock()
        opt.zero_grad()
        t1 = clock()
        out = model(x)
        t2 = clock()
        loss = crit(out, y)
        t3 = clock()
        loss.backward()
        t4 = clock()
        opt.step()
        t5 = clock()
        times.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4))
        observed.append(obs)
    if rec is not None:
        bench.end_recording(rec, session, path)
    return times, observed, numbers


def split(plain: list, recorded: list, observed: list) -> dict:
    """The per-phase medians and the step's split (microseconds) of one
    workload's steps: ``plain`` and ``recorded`` lists of per-phase tuples,
    ``observed`` a flag per recorded step."""
    usual = [t for t, o in zip(recorded, observed) if not o]
    obs = [t for t, o in zip(recorded, observed) if o]
    us = 1e6
    phases = {p: (statistics.median(t[j] for t in plain) * us, statistics.median(t[j] for t in usual) * us)
              for j, p in enumerate(PHASES)}
    plain_steps = [sum(t) * us for t in plain]
    usual_steps = [sum(t) * us for t in usual]
    obs_steps = [sum(t) * us for t in obs]
    n = len(recorded)
    usual_median = statistics.median(usual_steps)
    plain_mean = statistics.fmean(plain_steps)
    recorded_mean = statistics.fmean(usual_steps + obs_steps)
    return {
        "phases": phases,
        "plain_median": statistics.median(plain_steps),
        "usual_median": usual_median,
        "plain_mean": plain_mean,
        "recorded_mean": recorded_mean,
        # the parts of recorded_mean - plain_mean
        "usual_step": usual_median - statistics.median(plain_steps),
        "observed": sum(s - usual_median for s in obs_steps) / n,
        "rest": sum(s - usual_median for s in usual_steps) / n
        - (plain_mean - statistics.median(plain_steps)),
        "observed_steps": len(obs_steps),
        "steps": n,
    }


def main(names, pairs: int, scale: float, schedule, tmpdir, bench) -> int:
    from tabulate import tabulate
    for name in names:
        build, steps, _ = bench.WORKLOADS[name]
        steps = max(5, int(steps * scale))
        plain, recorded, observed = [], [], []
        for i in range(pairs):
            for rec in ((False, True) if i % 2 == 0 else (True, False)):
                times, obs, _ = phase_loop(build, steps, rec, schedule, tmpdir, bench)
                if rec:
                    recorded += times
                    observed += obs
                else:
                    plain += times
        if not any(observed) or all(observed):
            obs_note = ""
        else:
            obs_note = f", {observed.count(True)} observed"
        s = split(plain, recorded, observed)
        print(f"\n{name}: {pairs} pair(s) of {steps} steps{obs_note}; medians of the usual steps, us")
        print(tabulate([[p, f"{a:.1f}", f"{b:.1f}", f"{b - a:+.1f}", NNDB_IN[p]] for p, (a, b) in s["phases"].items()]
                       + [["whole step", f"{s['plain_median']:.1f}", f"{s['usual_median']:.1f}",
                           f"{s['usual_median'] - s['plain_median']:+.1f}", ""]],
                       headers=["phase", "plain", "recorded", "extra", "nndb's code in it"], disable_numparse=True))
        print(f"mean step: plain {s['plain_mean']:.0f} us, recorded {s['recorded_mean']:.0f} us "
              f"({s['recorded_mean'] / s['plain_mean']:.3f}x); the extra "
              f"{s['recorded_mean'] - s['plain_mean']:.0f} us a step: the usual step {s['usual_step']:.0f}, "
              f"observed steps {s['observed']:.0f}, the rest (writer, checkpoints, the machine) {s['rest']:.0f}")
    return 0
