"""What the machine's other core is worth to nndb (``python scripts/bench.py --second-core``).

nndb does its per-step work (records, rules, the trace) in the training
thread.  The other design takes it off that thread: the hooks copy a step's
rows into shared memory and a helper process does the rest on another core.
That pays only if the other core is free.  This measures whether it is: the
plain loop of a workload alone, and beside a helper process that keeps a
core busy for a given share of the time (pure Python, as nndb's work is),
at nice 0 and at nice 19, interleaved.  The benchmark runs it with Intel's
OpenMP runtime preloaded when it is installed, as ``nndb run`` does (forked
replicas need it to replay with all threads, bit for bit): its worker
threads spin between parallel regions, so a helper competes with them.

Printed per helper: its duty (busy share it asks for), nice, the share of a
core it got, and the plain step's time beside it as a ratio to the step
alone (median over the pairs).
"""
from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time

# A helper: busy for WORK_US, asleep for REST_US, until SIGTERM.
HELPER = r"""
import signal, sys, time
work, rest = float(sys.argv[1]) * 1e-6, float(sys.argv[2]) * 1e-6
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
print("ready", flush=True)
n = 0
while True:
    t = time.perf_counter()
    while time.perf_counter() - t < work:
        n += 1
    if rest:
        time.sleep(rest)
"""

# (label, busy us, asleep us, nice): half a core in 300 us slices (about what
# nndb's work on a 0.6 ms MLP step would ask of it), and a whole core
HELPERS = [("half a core", 300, 300, 0), ("half a core", 300, 300, 19), ("a whole core", 1000, 0, 19)]


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _with_helper(work_us: int, rest_us: int, nice: int, fn):
    """fn() timed beside a helper; (fn's result, the helper's share of a core)."""
    p = subprocess.Popen([sys.executable, "-c", HELPER, str(work_us), str(rest_us)], stdout=subprocess.PIPE,
                         preexec_fn=(lambda: os.nice(nice)) if nice else None)
    try:
        p.stdout.readline()                      # (started)
        c0, t0 = _cpu_seconds(p.pid), time.perf_counter()
        out = fn()
        share = (_cpu_seconds(p.pid) - c0) / (time.perf_counter() - t0)
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait()
        p.stdout.close()
    return out, share


def plain_step(build, steps: int, bench) -> float:
    """Seconds a plain step of the workload takes (after the benchmark's WARMUP)."""
    model, opt, crit, data = build(0)
    bench.train(model, opt, crit, data, bench.WARMUP)
    t = time.perf_counter()
    bench.train(model, opt, crit, data, steps)
    return (time.perf_counter() - t) / steps


def main(names, pairs: int, scale: float, bench, helpers=HELPERS) -> list:
    from tabulate import tabulate
    from nndb.run import meta as runmeta
    out, rows = [], []
    for name in names:
        build, steps, _ = bench.WORKLOADS[name]
        steps = max(5, int(steps * scale))
        alone, beside, shares = [], {h: [] for h in helpers}, {h: [] for h in helpers}
        for _ in range(pairs):
            for h in helpers:
                a = plain_step(build, steps, bench)
                b, share = _with_helper(h[1], h[2], h[3], lambda: plain_step(build, steps, bench))
                alone.append(a)
                beside[h].append(b / a)
                shares[h].append(share)
        for h in helpers:
            label, work, rest, nice = h
            r = {"workload": name, "helper": label, "duty": work / (work + rest), "nice": nice,
                 "helper_core_share": statistics.median(shares[h]), "ratio": statistics.median(beside[h]),
                 "ratio_min": min(beside[h]), "ratio_max": max(beside[h]),
                 "plain_ms": statistics.median(alone) * 1e3}
            out.append(r)
            rows.append([name, label, nice, f"{r['helper_core_share']:.2f}", f"{r['plain_ms']:.2f}",
                         f"{r['ratio']:.3f}x ({r['ratio_min']:.3f}-{r['ratio_max']:.3f})"])
    print(f"OpenMP {runmeta.openmp_runtime()}, {os.cpu_count()} cores; the plain loop beside a helper process, "
          f"against the loop alone")
    print(tabulate(rows, headers=["workload", "helper", "nice", "its share of a core", "plain ms/step alone",
                                  "plain step beside it (min-max)"], disable_numparse=True))
    return out
