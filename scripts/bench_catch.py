"""``catch nan`` against ``torch.autograd.set_detect_anomaly``, side by side
(``python scripts/bench.py --catch``).

Five modes of the same training loop, each from the same seed and initial
weights, interleaved in this one process (the order rotates every round, so
that no mode always runs first or after a given one):

* plain: the loop alone;
* nndb: what ``nndb run --batch`` adds (recorder, session, rules, checkpoints);
* catch: that, with ``catch nan`` armed (the default: each step's recorded
  NaN/Inf counts are checked; a bad step would be replayed on a replica);
* eager: that, with ``catch nan --eager`` (every operation's output checked
  as the run goes: what ``catch nan`` cost before it checked at step ends);
* anomaly: the plain loop under ``torch.autograd.set_detect_anomaly(True)``.

Printed per workload and mode: the median ratio to the plain loop of the
same round, its min-max over the rounds, and the median ms a step.  The
target: catch at or below anomaly on both workloads.
"""
from __future__ import annotations

import json
import statistics
import warnings

import torch

from nndb.debugger import points as P

MODES = ("plain", "nndb", "catch", "eager", "anomaly")


def _arm(eager: bool):
    def arm(session):
        session.points.add(P.CatchPoint, {"what_kind": "nan", "eager": eager})
    return arm


def _anomaly():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # ("Anomaly Detection has been enabled ...")
        return torch.autograd.set_detect_anomaly(True)


def one(mode: str, build, steps: int, schedule, tmpdir, timed_loop) -> float:
    recorded = mode in ("nndb", "catch", "eager")
    arm = _arm(mode == "eager") if mode in ("catch", "eager") else None
    kw = {"around": _anomaly} if mode == "anomaly" else {}
    elapsed, *_ = timed_loop(build, steps, recorded, schedule, tmpdir, arm=arm, **kw)
    return elapsed


def compare(name: str, pairs: int, scale: float, schedule, tmpdir, workloads, timed_loop) -> dict:
    build, steps, _ = workloads[name]
    steps = max(5, int(steps * scale))
    times = {m: [] for m in MODES}
    ratios = {m: [] for m in MODES if m != "plain"}
    for i in range(pairs):
        order = MODES[i % len(MODES):] + MODES[:i % len(MODES)]
        got = {m: one(m, build, steps, schedule, tmpdir, timed_loop) for m in order}
        for m in MODES:
            times[m].append(got[m] / steps)
            if m != "plain":
                ratios[m].append(got[m] / got["plain"])
    return {"workload": name, "steps": steps, "rounds": pairs,
            "ms_per_step": {m: statistics.median(v) * 1e3 for m, v in times.items()},
            "ratio_median": {m: statistics.median(v) for m, v in ratios.items()},
            "ratio_min": {m: min(v) for m, v in ratios.items()},
            "ratio_max": {m: max(v) for m, v in ratios.items()}}


def main(names, pairs, scale, schedule, tmpdir, workloads, timed_loop, json_path=None) -> int:
    from tabulate import tabulate
    results = [compare(n, pairs, scale, schedule, tmpdir, workloads, timed_loop) for n in names]
    rows = []
    for r in results:
        rows.append([r["workload"], "plain", f"{r['ms_per_step']['plain']:.2f}", "1", "-"])
        for m in MODES[1:]:
            rows.append(["", m, f"{r['ms_per_step'][m]:.2f}", f"{r['ratio_median'][m]:.2f}x",
                         f"{r['ratio_min'][m]:.2f}-{r['ratio_max'][m]:.2f}"])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {pairs} rounds of "
          f"{', '.join(MODES)} (rotated), schedule: {schedule.describe()}")
    print(tabulate(rows, headers=["workload", "mode", "ms/step", "ratio to plain (median)", "min-max"],
                   disable_numparse=True))
    verdict = {r["workload"]: r["ratio_median"]["catch"] <= r["ratio_median"]["anomaly"] for r in results}
    print("catch nan at or below detect_anomaly: " + ", ".join(f"{n} {'yes' if ok else 'NO'}"
                                                                 for n, ok in verdict.items()))
    if json_path:
        with open(json_path, "w") as fh:
            json.dump({"torch": torch.__version__, "catch": results}, fh, indent=2)
    return 0
