#!/usr/bin/env python
"""Recording overhead of nndb, as a ratio against the same loop without it.

For each workload the same training loop runs plain (A) and recorded by nndb
(B), interleaved A B A B ... in this one process, each from the same seed and
initial weights; B is what `nndb run --batch` does: the recorder, the debugger
session with no commands, and the rules (``--rules``).  Only the loop is timed (no interpreter start-up, no model
construction, no trace creation or closing).  Printed: the median of the
per-pair ratios B/A with their min-max, the plain and recorded step times
(the steady state: what a long run pays per step), trace bytes per recorded
step, and nndb's one-time cost, the extra time of the warm-up, untimed
above: naming the model, choosing how steps end, creating the series, the
first checkpoint (a fork, then the copy-on-write page faults of the steps
after it: a recorded warm-up goes on until time travel has measured that,
SETTLE_STEPS at most, and its steps beyond the first WARMUP are counted at
the timed loop's rate), and the first 20 steps, where the rules look at
every step and activations are recorded on every step.  Later checkpoints
fall in the timed loops as they come (one every ~8 s on the MLP).

    python scripts/bench.py                      # all workloads, default sizes
    python scripts/bench.py --pairs 7 --json bench.json
    python scripts/bench.py --workload cnn --every 10
    python scripts/bench.py --catch --pairs 5    # catch nan against detect_anomaly (mlp, cnn)
    python scripts/bench.py --ranks 2 --pairs 5  # 2 DDP ranks: all-stop agreement off / on (cnn)
    python scripts/bench.py --writes sync        # the trace's blocks written in the training thread
    python scripts/bench.py --workload mlp --threads 1   # torch on one thread (the default: one per core)
    python scripts/bench.py --phases --workload mlp      # where a recorded step's extra time goes (scripts/bench_phases.py)
    python scripts/bench.py --floor --pairs 6            # plain, capture-only hooks, nndb (scripts/bench_floor.py)
    python scripts/bench.py --second-core --workload mlp # the plain loop beside a busy helper process (scripts/bench_second_core.py)
    python scripts/bench.py --export-speed               # nndb export to TensorBoard, steps/s (scripts/bench_export.py)

Workload ``cnn_fullgrad`` is the CNN keeping its conv layers' gradients
whole every 10 steps in fp16 (``--record-full 'grad:conv*'
--full-tensors-every 10 --precision fp16``; FULL_RULES): compare its trace
bytes per step and ratio with ``cnn``'s.

    python scripts/bench.py --workload cnn --workload cnn_fullgrad

Targets (default recording): cnn <= 1.10x, mlp <= 1.5x; with ``--lineage all``
(the op recorder on every step): cnn <= 2x the plain step.

B also takes time travel's checkpoints as ``nndb run`` does (``--replica
auto``: forked checkpoints on the adaptive schedule); ``--replica off``
measures without them.  ``--travel`` then measures time travel itself, on a
run stopped at its last step: the latency of ``reverse-step N`` (a replica
resumed from the nearest checkpoint, replaying to the target and handing
back) and of ``predict N``, against the targets 1.2 x (steps replayed x step
time) + 0.3 s and 1.2 x N x step time + 0.3 s, and the private memory of
each live checkpoint process.  The script restarts itself with Intel's
OpenMP runtime preloaded when it is installed, as ``nndb run`` does, so
that replicas run with all threads.

``--instructions`` counts instead of timing: each loop runs once under
valgrind's callgrind (one thread, only the loop instrumented, time
travel's checkpoints off: their schedule is on wall time), and the table
gives instructions per step plain and recorded.  The plain count repeats
to 0.2%; the recorded one moved by up to 5% between runs of one tree
(3,376,643 and 3,455,922 on 2026-12-02; the trace writer's thread and the
garbage collector do not fall the same way into the counted steps each
time), far less than the timed ratio moves on a shared machine: compare
trees by two runs or more;
they leave out what time also pays (cache misses: nndb's code runs once a
step between PyTorch's kernels, with the caches cold), so the timed ratio
is the one the targets are about.

    python scripts/bench.py --instructions --workload mlp     # about 4 minutes

(The CNN's convolutions are slow under valgrind: over ten minutes.)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from nndb.run import meta as runmeta  # noqa: E402
from nndb.run.config import RecordSchedule, RunConfig  # noqa: E402
from nndb.run.launcher import Target  # noqa: E402
from nndb.driver import DebugOptions, build_session  # noqa: E402
from nndb.frontends.batch import BatchFrontend  # noqa: E402
from nndb.run.runner import Recording  # noqa: E402


# -- workloads: (build(seed) -> (model, opt, batches), steps) -------------------

def _batches(n, make):
    g = torch.Generator().manual_seed(1234)
    return [make(g) for _ in range(n)]


def mlp(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    data = _batches(8, lambda g: (torch.randn(64, 32, generator=g), torch.randint(0, 10, (64,), generator=g)))
    return model, opt, nn.CrossEntropyLoss(), data


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def cnn(seed):
    torch.manual_seed(seed)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), 0.05, momentum=0.9)
    data = _batches(4, lambda g: (torch.randn(32, 3, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g)))
    return model, opt, nn.CrossEntropyLoss(), data


class LSTMClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        self.lstm = nn.LSTM(32, 64, batch_first=True)
        self.fc = nn.Linear(64, 5)

    def forward(self, x):
        out, _ = self.lstm(self.emb(x))
        return self.fc(out[:, -1])


def lstm(seed):
    torch.manual_seed(seed)
    model = LSTMClassifier()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    data = _batches(4, lambda g: (torch.randint(0, 100, (32, 24), generator=g), torch.randint(0, 5, (32,), generator=g)))
    return model, opt, nn.CrossEntropyLoss(), data


def transformer(seed):
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.1, batch_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False),
                          nn.Flatten(), nn.Linear(64 * 16, 10))
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    data = _batches(4, lambda g: (torch.randn(16, 16, 64, generator=g), torch.randint(0, 10, (16,), generator=g)))
    return model, opt, nn.CrossEntropyLoss(), data


# (build, steps of a timed loop, steps of a counted or travelled one).  A timed
# loop runs about 3 s, long enough to pay for the aftermath of the first
# checkpoint (taken in the warm-up) and for some of the later ones.
WORKLOADS = {"mlp": (mlp, 2400, 600), "cnn": (cnn, 150, 60), "lstm": (lstm, 400, 100),
             "transformer": (transformer, 250, 100), "cnn_fullgrad": (cnn, 150, 60)}
# Workloads that also keep whole tensors (nndb run --record-full ...): the CNN
# keeps its conv layers' gradients (SmallCNN's convs are features.0, .4 and .8:
# 'grad:conv*' in a model that names them conv) every 10 steps in fp16, i.e.
# --record-full 'grad:features.[048].*' --full-tensors-every 10 --precision fp16.
FULL_RULES = {"cnn_fullgrad": (("grad:features.[048].*", 10, "fp16"),)}


def _full_rules(name):
    from nndb.tracer.fulltensors import parse_rule
    return tuple(parse_rule(spec, every, precision) for spec, every, precision in FULL_RULES.get(name, ()))


def train(model, opt, crit, data, steps, start=0):
    """``steps`` steps over the batches from batch ``start`` on (cycling)."""
    for i in range(start, start + steps):
        x, y = data[i % len(data)]
        opt.zero_grad()
        loss = crit(model(x), y)
        loss.backward()
        opt.step()
    return float(loss.detach())


WARMUP = 25         # (covers the first 20 steps: rules and activations on every step)
# A recorded loop's warm-up goes on, a step at a time, until time travel has
# measured the first checkpoint (its copy-on-write aftermath: 1 s of steps
# and 16 after them, ~1,000-1,500 steps of the MLP), at most SETTLE_STEPS steps;
# until 2026-12 the timed loop paid the first ~300 MLP steps of that one-time
# cost (~100 ms of a ~2.4 s loop).  Later checkpoints fall in the timed loops
# as they come: that is their steady cost.
SETTLE_STEPS = 2000


RULES = "default"     # --rules: what `nndb run` runs by default
REPLICA = "auto"      # --replica: checkpoints as `nndb run` takes them
LINEAGE = None        # --lineage all: the op recorder on every step
#: --clock: wall time (the default), or the process's CPU time (user + system,
#: all its threads: a fork's copy-on-write faults included), which other
#: processes on a loaded machine disturb much less than the wall clock
CLOCK = time.perf_counter


class _Quiet(BatchFrontend):
    def __init__(self):
        super().__init__()
        self.lines = []

    def message(self, text):
        self.lines.append(text)

    def error(self, text):
        self.lines.append(text)


def _session(rec, path, frontend=None):
    session = build_session(frontend or BatchFrontend(), DebugOptions(
        batch=True, stop_at_start=False, rules=RULES, replica=REPLICA, lineage=LINEAGE))
    session.attach(rec, path)
    return session


def _recording(schedule, tmpdir, flush_secs=None, full_rules=()):
    """What `nndb run --batch` adds to the loop: the recorder, the debugger
    session (no commands), the rules and time travel's checkpoints (and the
    whole tensors of ``full_rules``, as --record-full)."""
    path = os.path.join(tmpdir, f"bench-{time.monotonic_ns()}.h5")
    meta = runmeta.collect(Target(path="bench.py"), schedule.describe())
    config = RunConfig(Target(path="bench.py"), path, schedule, full_rules=tuple(full_rules))
    if flush_secs is not None:
        config.flush_secs = flush_secs
    rec = Recording(path, meta, config, message=lambda m: print(m, file=sys.stderr))
    return rec, _session(rec, path), path


def warm_up(model, opt, crit, data, session) -> int:
    """The untimed WARMUP steps, then, recorded (``session``), more until time
    travel has measured its first checkpoint (SETTLE_STEPS at most); the
    steps beyond WARMUP."""
    train(model, opt, crit, data, WARMUP)
    extra = 0
    machine = session.machine if session is not None else None
    while machine is not None and machine.settling and extra < SETTLE_STEPS:
        # (the batches go on cycling: one batch again and again overfits it,
        # and the recorded loop would then train, and judge, another run)
        train(model, opt, crit, data, 1, start=WARMUP + extra)
        extra += 1
    return extra


def end_recording(rec, session, path) -> float:
    """Close what ``_recording`` opened; the trace's bytes per step written (the file is removed)."""
    rec.__exit__(None, None, None)
    rec.close()
    session.run_ended("finished", 0, "")
    session.machine.close()
    size = os.path.getsize(path) / max(1, rec.writer.steps_written)
    os.remove(path)
    return size


def timed_loop(build, steps, recorded, schedule, tmpdir, seed=0, arm=None, around=contextlib.nullcontext,
               full_rules=()):
    """Seconds for ``steps`` steps after WARMUP untimed ones (both under the
    recorder when ``recorded``), the final loss, trace bytes per step, and the
    seconds the warm-up took (where nndb's one-time costs fall: naming the
    model, choosing the step rule, creating series).  ``arm(session)`` sets
    the debugger up before the run (a catch point); both loops run inside
    ``around()`` (torch.autograd.set_detect_anomaly)."""
    model, opt, crit, data = build(seed)
    rec = session = path = None
    if recorded:
        rec, session, path = _recording(schedule, tmpdir, full_rules=full_rules)
        if arm is not None:
            arm(session)
        rec.__enter__()
    with around():
        t = CLOCK()
        extra = warm_up(model, opt, crit, data, session)
        warmup = CLOCK() - t
        t = CLOCK()
        loss = train(model, opt, crit, data, steps)
        elapsed = CLOCK() - t
    # (the warm-up's steps beyond WARMUP counted at the timed loop's rate: the rest is one-time)
    warmup -= extra * elapsed / steps
    size = end_recording(rec, session, path) if rec is not None else None
    return elapsed, loss, size, warmup


def bench(name, pairs, schedule, tmpdir, scale=1.0):
    build, steps, _ = WORKLOADS[name]
    steps = max(5, int(steps * scale))
    ratios, plain, traced, sizes, startup = [], [], [], [], []
    for i in range(pairs):
        order = (False, True) if i % 2 == 0 else (True, False)
        times, warm = {}, {}
        for recorded in order:
            elapsed, loss, size, warm[recorded] = timed_loop(build, steps, recorded, schedule, tmpdir,
                                                             full_rules=_full_rules(name))
            times[recorded] = elapsed
            if size is not None:
                sizes.append(size)
        startup.append(warm[True] - warm[False])
        plain.append(times[False] / steps)
        traced.append(times[True] / steps)
        ratios.append(times[True] / times[False])
    return {
        "workload": name, "steps": steps, "pairs": pairs,
        "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
        "plain_ms": statistics.median(plain) * 1e3, "recorded_ms": statistics.median(traced) * 1e3,
        "trace_bytes_per_step": statistics.median(sizes) if sizes else None,
        "startup_extra_ms": statistics.median(startup) * 1e3,
    }


def travel(name, tmpdir, back=(1, 10), ahead=(1, 10)):
    """Time travel on a run of the workload stopped at its last step (batch
    commands queued at a breakpoint, as ``-x`` would): reverse-step N then
    present, predict N (the stop leaves max(ahead) steps to predict).  Latencies are measured around the machine's calls."""
    from nndb.debugger import points as P
    from nndb.timetravel import forking, machine as M, predict as PR
    build, _, steps = WORKLOADS[name]
    model, opt, crit, data = build(0)
    path = os.path.join(tmpdir, f"travel-{time.monotonic_ns()}.h5")
    meta = runmeta.collect(Target(path="bench.py"), "")
    rec = Recording(path, meta, RunConfig(Target(path="bench.py"), path), message=lambda m: None)
    session = _session(rec, path, _Quiet())
    stop_at = WARMUP + steps - 1 - max(ahead)       # (predict needs steps left to run)
    session.add_point(P.StepBreak, {"step": stop_at})
    timings = []
    real_travel, real_predict = M.TimeMachine.travel, PR.predict

    def timed_travel(self, s, target, then="stop", why=""):
        ck = self.nearest(target)
        t = time.perf_counter()
        real_travel(self, s, target, then, why)
        timings.append(("reverse-step", s.last_step - target, target - ck.step, time.perf_counter() - t))

    def timed_predict(s, m, n, sets):
        t = time.perf_counter()
        out = real_predict(s, m, n, sets)
        timings.append(("predict", n, n, time.perf_counter() - t))
        return out

    M.TimeMachine.travel = timed_travel
    PR.predict = timed_predict
    from nndb.debugger.session import QueuedLine
    for n in back:
        session.queue_lines([QueuedLine(f"reverse-step {n}"), QueuedLine("present")])
    for n in ahead:
        session.queue_lines([QueuedLine(f"predict {n}")])
    mem = []
    try:
        rec.__enter__()
        t = time.perf_counter()
        train(model, opt, crit, data, WARMUP + steps)
        total = time.perf_counter() - t
        for ck in session.machine.checkpoints.values():
            m = forking.memory_kib(ck.pid)
            if m:
                mem.append(m["private"] / 1024)
        n_ck = len(session.machine.checkpoints)
        rec.__exit__(None, None, None)
        rec.close()
        session.run_ended("finished", 0, "")
        session.machine.close()
    finally:
        M.TimeMachine.travel, PR.predict = real_travel, real_predict
        os.remove(path)
    spent = sum(t for *_, t in timings)
    step_s = (total - spent) / (WARMUP + steps)
    rows = []
    for what, n, replayed, secs in timings:
        bound = 1.2 * replayed * step_s + 0.3
        rows.append({"workload": name, "command": f"{what} {n}", "steps_replayed": replayed,
                     "latency_s": secs, "bound_s": bound, "within": secs <= bound})
    return rows, {"workload": name, "checkpoints": n_ck, "step_ms": step_s * 1e3,
                  "private_mib_median": statistics.median(mem) if mem else None,
                  "private_mib_max": max(mem) if mem else None}


# -- instructions (callgrind): nndb's CPU work, without the machine's noise -----------

def _callgrind(on: bool) -> None:
    try:
        subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(os.getpid())],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    except OSError:
        pass                           # (not under valgrind: nothing to switch)


def collected(stderr: str):
    """The instructions valgrind counted in the first process of its output
    (``==PID== Collected : N``; a process that the loop forked, a DataLoader
    worker say, reports its own), or None."""
    lines = [m.groups() for m in re.finditer(r"^==(\d+)== (.*)$", stderr, re.M)]
    counts = [int(text.split()[-1].replace(",", "")) for pid, text in lines
              if pid == lines[0][0] and text.startswith("Collected :")]
    return counts[0] if counts else None


def _instructions_child(name, recorded, steps, schedule):
    """Run under callgrind: the loop of ``steps`` steps after WARMUP, the only
    instrumented part.  One thread: a spinning OpenMP worker's instructions
    vary from run to run.  Flushes by step count only, since valgrind's
    slowdown would make the 2 s flush come every few steps (and the rules'
    blocks, nndb.rules.engine.BLOCK_SECONDS, hold a step or two)."""
    torch.set_num_threads(1)
    from nndb.rules import engine
    engine.BLOCK_SECONDS = float("inf")      # (blocks of the rules by step count only, for the same reason)
    model, opt, crit, data = WORKLOADS[name][0](0)
    with tempfile.TemporaryDirectory() as tmpdir:
        rec = None
        if recorded:
            rec, session, _ = _recording(schedule, tmpdir, flush_secs=float("inf"), full_rules=_full_rules(name))
            rec.__enter__()
        train(model, opt, crit, data, WARMUP)
        _callgrind(True)
        train(model, opt, crit, data, steps)
        _callgrind(False)
        if rec is not None:
            rec.__exit__(None, None, None)
            rec.close()
            session.run_ended("finished", 0, "")
            session.machine.close()


def instructions(name, flags, scale=1.0):
    """Instructions per step of the loop, plain and recorded, each counted
    by callgrind in a process of its own (deterministic: the same tree and
    inputs give the same counts whatever else the machine does; not time:
    cache misses and the OpenMP threads are not in it)."""
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise SystemExit(f"bench: --instructions needs valgrind ({tool} is not on PATH)")
    steps = max(5, int(WORKLOADS[name][2] * scale))
    per_step = {}
    with tempfile.TemporaryDirectory() as tmpdir:
        for recorded in (False, True):
            cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                   f"--callgrind-out-file={os.path.join(tmpdir, 'callgrind.%p')}",
                   sys.executable, os.path.abspath(__file__), *flags,
                   "--instructions-child", name, "recorded" if recorded else "plain", str(steps)]
            out = subprocess.run(cmd, capture_output=True, text=True)
            count = collected(out.stderr)
            if out.returncode != 0 or count is None:
                raise SystemExit(f"bench: callgrind failed on {name}: {out.stderr.strip()[-500:]}")
            per_step[recorded] = count / steps
    return {"workload": name, "steps": steps, "plain_instructions": per_step[False],
            "nndb_instructions": per_step[True], "ratio": per_step[True] / per_step[False]}


def _restart_preloaded():
    """Replicas need Intel's OpenMP runtime to run multi-threaded (see nndb.run.preload)."""
    from nndb.run.preload import preloaded_env
    env = preloaded_env()
    if env is not None and sys.platform.startswith("linux"):
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", action="append", choices=sorted(WORKLOADS),
                    help="run only this workload (repeatable; default: all)")
    ap.add_argument("--pairs", type=int, default=7, help="A/B pairs per workload (default 7)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the steps per loop")
    ap.add_argument("--every", type=int, default=None, help="record every N-th step")
    ap.add_argument("--full-every", type=int, default=None,
                    help="full statistics of large tensors every N-th recorded step (default: nndb's)")
    ap.add_argument("--act-every", type=int, default=None,
                    help="record module outputs every N-th recorded step after the first 20 (default: nndb's)")
    ap.add_argument("--rules", default="default", help="the rules nndb runs: default, none or a YAML file")
    ap.add_argument("--replica", default="auto", choices=["auto", "off"],
                    help="take time travel's checkpoints as nndb run does (auto) or not (off)")
    ap.add_argument("--lineage", default=None, metavar="STEPS",
                    help="also record tensor lineage (the op recorder), e.g. 'all'")
    ap.add_argument("--travel", action="store_true",
                    help="also measure reverse-step and predict latency and checkpoint memory")
    ap.add_argument("--instructions", action="store_true",
                    help="count instructions per step with valgrind's callgrind instead of timing "
                         "(deterministic: compares two trees where the machine's noise hides a few percent)")
    ap.add_argument("--instructions-child", nargs=3, metavar=("WORKLOAD", "MODE", "STEPS"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--catch", action="store_true",
                    help="instead: plain, nndb, 'catch nan' armed, 'catch nan --eager' and "
                         "torch.autograd.set_detect_anomaly side by side (default workloads: mlp and cnn; "
                         "see scripts/bench_catch.py)")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="time the loops by the wall clock (default) or by the process's CPU time "
                         "(user + system of all its threads: steadier on a machine other work loads)")
    ap.add_argument("--writes", choices=["thread", "sync"], default="thread",
                    help="the trace's blocks written in the writer's thread, as nndb run does (default), "
                         "or in the training thread (sync), to measure what the thread saves")
    ap.add_argument("--phases", action="store_true",
                    help="instead: the recorded step's extra time by phase of the loop (zero_grad, forward, "
                         "loss, backward, step) and by kind of step (see scripts/bench_phases.py)")
    ap.add_argument("--floor", action="store_true",
                    help="instead: plain, the fewest hooks that capture what every recorded step must read "
                         "(the floor) and nndb, interleaved (see scripts/bench_floor.py)")
    ap.add_argument("--second-core", action="store_true",
                    help="instead: the plain loop alone and beside a helper process that keeps the other core "
                         "busy (half or all of it, nice 0 and 19): what moving nndb's work off the training "
                         "thread would cost it (see scripts/bench_second_core.py)")
    ap.add_argument("--ranks", type=int, default=None, metavar="N",
                    help="instead: N ranks (gloo, DDP) of the CNN recorded by nndb, without and with the "
                         "all-stop agreement across ranks (see scripts/bench_ranks.py)")
    ap.add_argument("--threads", type=int, default=None, metavar="N",
                    help="torch's intra-op threads for the timed loops (default: torch's own, "
                         "one per core): with 1, nndb's serial Python meets a serial plain step")
    ap.add_argument("--agreement", choices=["auto", "gloo"], default="auto",
                    help="with --ranks: the agreement as nndb makes it (auto: shared memory on one machine) "
                         "or always the gloo all_reduce")
    ap.add_argument("--export-speed", action="store_true",
                    help="instead: nndb export's speed to TensorBoard on a trace of the MLP's --export-steps "
                         "steps, in steps/s (see scripts/bench_export.py)")
    ap.add_argument("--export-steps", type=int, default=2000, metavar="N", help="with --export-speed: the steps")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args(argv)
    if args.export_speed:
        import bench_export
        measured = bench_export.main(sys.modules[__name__], args.export_steps)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"torch": torch.__version__, "export": measured}, fh, indent=2)
        return 0
    if args.ranks:
        import bench_ranks
        return bench_ranks.main(args.ranks, args.pairs, args.scale, args.json, clock=args.clock,
                                transport=args.agreement)
    global RULES, REPLICA, LINEAGE, CLOCK
    RULES, REPLICA, LINEAGE = args.rules, args.replica, args.lineage
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    from nndb.store import writer as trace_writer
    trace_writer.BACKGROUND = args.writes == "thread"
    schedule = RecordSchedule.parse(args.every, None, args.full_every, args.act_every)
    if args.instructions_child:
        name, mode, steps = args.instructions_child
        _instructions_child(name, mode == "recorded", int(steps), schedule)
        return 0
    if argv is None and not args.instructions:
        _restart_preloaded()
    from tabulate import tabulate
    if args.threads:
        torch.set_num_threads(args.threads)
    names = args.workload or list(WORKLOADS)
    if args.instructions:
        # Checkpoints are taken on a wall-time budget, which valgrind's slowdown
        # would turn into many more: counted without them (their cost, a fork
        # and copy-on-write faults, is the kernel's: the timed benchmark has it).
        REPLICA = "off"
        flags = ["--rules", RULES, "--replica", REPLICA]
        for opt, value in (("--every", args.every), ("--full-every", args.full_every),
                           ("--act-every", args.act_every), ("--lineage", LINEAGE)):
            if value is not None:
                flags += [opt, str(value)]
        counted = [instructions(name, flags, args.scale) for name in names]
        print(f"torch {torch.__version__}, 1 thread, callgrind, schedule: {schedule.describe()}, rules: {RULES}, "
              f"checkpoints: {REPLICA}, lineage: {LINEAGE or 'off'}")
        print(tabulate([[c["workload"], c["steps"], f"{c['plain_instructions']:,.0f}",
                         f"{c['nndb_instructions']:,.0f}", f"{c['ratio']:.3f}x"] for c in counted],
                       headers=["workload", "steps", "plain instructions/step", "nndb instructions/step",
                                "ratio"], disable_numparse=True))
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"torch": torch.__version__, "schedule": schedule.describe(),
                           "instructions": counted}, fh, indent=2)
        return 0
    if args.phases:
        import bench_phases
        with tempfile.TemporaryDirectory() as tmpdir:
            return bench_phases.main(args.workload or ["mlp", "cnn"], args.pairs, args.scale, schedule, tmpdir,
                                     sys.modules[__name__])
    if args.floor:
        import bench_floor
        with tempfile.TemporaryDirectory() as tmpdir:
            floors = bench_floor.main(args.workload or ["mlp", "cnn"], args.pairs, args.scale, schedule, tmpdir,
                                      sys.modules[__name__])
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"torch": torch.__version__, "schedule": schedule.describe(), "floor": floors}, fh,
                          indent=2)
        return 0
    if args.second_core:
        import bench_second_core
        measured = bench_second_core.main(args.workload or ["mlp"], args.pairs, args.scale, sys.modules[__name__])
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"torch": torch.__version__, "second_core": measured}, fh, indent=2)
        return 0
    if args.catch:
        import bench_catch
        with tempfile.TemporaryDirectory() as tmpdir:
            return bench_catch.main(args.workload or ["mlp", "cnn"], args.pairs, args.scale, schedule, tmpdir,
                                    WORKLOADS, timed_loop, args.json)
    results = []
    with tempfile.TemporaryDirectory() as tmpdir:
        for name in names:
            results.append(bench(name, args.pairs, schedule, tmpdir, args.scale))
    rows = [[r["workload"], f"{r['plain_ms']:.2f}", f"{r['recorded_ms']:.2f}",
             f"{r['ratio_median']:.3f}x", f"{r['ratio_min']:.3f}-{r['ratio_max']:.3f}",
             f"{r['trace_bytes_per_step']:.0f}" if r["trace_bytes_per_step"] else "-",
             f"{r['startup_extra_ms']:.0f}"] for r in results]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, OpenMP {runmeta.openmp_runtime()}, "
          f"schedule: {schedule.describe()}, rules: {RULES}, checkpoints: {REPLICA}, "
          f"lineage: {LINEAGE or 'off'}")
    print(tabulate(rows, headers=["workload", "plain ms/step", "nndb ms/step", "ratio (median)",
                                  "ratio min-max", "trace B/step", "one-time ms"], disable_numparse=True))
    travel_rows, memory = [], []
    if args.travel:
        with tempfile.TemporaryDirectory() as tmpdir:
            for name in names:
                r, m = travel(name, tmpdir)
                travel_rows.extend(r)
                memory.append(m)
        print()
        print(tabulate([[r["workload"], r["command"], r["steps_replayed"], f"{r['latency_s']:.3f}",
                         f"{r['bound_s']:.3f}", "yes" if r["within"] else "NO"] for r in travel_rows],
                       headers=["workload", "command", "steps replayed", "latency s", "target s", "within"],
                       disable_numparse=True))
        print()
        print(tabulate([[m["workload"], m["checkpoints"], f"{m['step_ms']:.2f}",
                         f"{m['private_mib_median']:.1f}" if m["private_mib_median"] is not None else "-",
                         f"{m['private_mib_max']:.1f}" if m["private_mib_max"] is not None else "-"]
                        for m in memory],
                       headers=["workload", "live checkpoints", "step ms", "private MiB (median)",
                                "private MiB (max)"], disable_numparse=True))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"torch": torch.__version__, "threads": torch.get_num_threads(),
                       "schedule": schedule.describe(), "results": results,
                       "travel": travel_rows, "checkpoint_memory": memory}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
