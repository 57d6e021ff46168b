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
    python scripts/bench.py --workload gpt --workload resnet --pairs 3
    python scripts/bench.py --workload mlp --pairs 3 --against c1f73ae   # this tree's nndb against c1f73ae's
    python scripts/bench.py --pairs 7 --json bench.json
    python scripts/bench.py --workload cnn --every 10
    python scripts/bench.py --catch --pairs 5    # catch nan against detect_anomaly (mlp, cnn)
    python scripts/bench.py --instructions --cache --split --workload mlp   # and the L1/L2 misses a step
    python scripts/bench.py --instructions --catch --workload mlp   # catch nan's instructions a step
    python scripts/bench.py --ranks 2 --pairs 5  # 2 DDP ranks: all-stop agreement off / on (cnn)
    python scripts/bench.py --writes sync        # the trace's blocks written in the training thread
    python scripts/bench.py --workload mlp --threads 1   # torch on one thread (the default: one per core)
    python scripts/bench.py --phases --workload mlp      # where a recorded step's extra time goes (scripts/bench_phases.py)
    python scripts/bench.py --floor --pairs 6            # plain, capture-only hooks, nndb (scripts/bench_floor.py)
    python scripts/bench.py --second-core --workload mlp # the plain loop beside a busy helper process (scripts/bench_second_core.py)
    python scripts/bench.py --export-speed               # nndb export to TensorBoard, steps/s (scripts/bench_export.py)

Workloads: ``mlp`` (6 parameter tensors, a sub-millisecond step), ``cnn``
(14), ``lstm``, ``transformer``, ``gpt`` (a GPT-style decoder: 4 pre-norm
blocks of d_model 128, causal attention by F.scaled_dot_product_attention,
GELU MLPs, AdamW in two groups; vocabulary 128, context 32, batch 8; 53
tensors) and ``resnet`` (a CIFAR-size ResNet-14: BasicBlocks with BatchNorm,
SGD with momentum, 16 images of 32x32; 47 tensors).

Each loop is timed by the wall clock and by the process's CPU time
(``time.process_time``: user + system of all its threads, the writer's and
OpenMP's included) at once; the table gives both ratios, each the median of
the rounds with its min-max, ``--clock`` choosing which one the JSON's
ratio_median and the one-time column use.  After the last round's timed
loops, ``--count-steps`` (32) more steps of each run under
``sys.setprofile`` count Python calls in the training thread: "nndb
calls/step" is the median of the 'call' events whose code lies in the nndb
package measured (its own functions), "calls/step" the plain loop's total
and, for nndb, the median of all 'call' events net of the plain loop's (what
nndb makes Python do, in its own code and in torch's and numpy's Python
functions it calls).  The JSON has the means too (calls_per_step_mean: one
observed step in 32 costs far more than a usual one).

``--against REV`` measures another revision's nndb in the same invocation.
``git archive REV nndb`` is extracted into a temporary directory (no
worktree registered, nothing left behind), and every loop runs in a child
process of this script (``--loop-child``) whose NNDB_BENCH_TREE and
PYTHONPATH put one tree's nndb first: the plain loop, this tree's nndb and
REV's, in rounds whose order rotates by one each round (with --pairs 3 each
variant runs once first, once second, once last).  The workloads, the loop,
the warm-up and the options are this script's for all three; only the
nndb package differs; the children's start-up (imports, model, trace) is
not timed.  With ``--instructions``, REV's recorded loop is counted by
callgrind beside the plain and this tree's.  What the script imports from
nndb is in one block ("nndb's internals"), with the older spellings it
falls back to (c1f73ae made its debugger session by hand).

    python scripts/bench.py --workload mlp --workload gpt --pairs 3 --against c1f73ae

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

``--split`` also counts the usual steps and the observed ones
(nndb.cadence.observed: full statistics, activations, the probes, the
rules' block) apart, by two more runs of this tree's recorded loop: one in
which callgrind is switched on over each stretch of usual steps and off
over the observed step between two (``callgrind_control``, one process a
switch), and one that only switches, as often, around no step, whose count
(what the switching itself costs the counted process, ~0.3 M instructions a
pair) is taken off the first's.  The observed steps' count a step is the
whole loop's less the usual steps':

    python scripts/bench.py --instructions --split --workload mlp   # about 10 minutes

(The CNN's and the ResNet's convolutions are slow under valgrind: over ten minutes.)
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
import torch.nn.functional as F

#: The tree whose nndb is measured: this script's own (the default), or the
#: one --against extracted, handed to a child process in NNDB_BENCH_TREE.
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.environ.get("NNDB_BENCH_TREE") or os.path.join(HERE, ".."))
sys.path.insert(0, ROOT)

# -- nndb's internals: the one place this script reaches into nndb ---------------
# (besides travel(), and the sibling scripts of --phases, --floor, --catch,
# --ranks and --export-speed, which measure parts of nndb by name).  The same
# lines must import another revision's nndb for --against: where a name moved,
# add the other spelling here.

try:                                     # (the layout since 66423cf)
    from nndb.run import meta as runmeta  # noqa: E402
    from nndb.run.config import RecordSchedule, RunConfig  # noqa: E402
    from nndb.run.launcher import Target  # noqa: E402
    from nndb.frontends.batch import BatchFrontend  # noqa: E402
    from nndb.run.runner import Recording  # noqa: E402
except ImportError:                      # (--against an older tree)
    from nndb import runmeta  # noqa: E402
    from nndb.config import RecordSchedule, RunConfig  # noqa: E402
    from nndb.launcher import Target  # noqa: E402
    from nndb.debugger.frontend import BatchFrontend  # noqa: E402
    from nndb.runner import Recording  # noqa: E402

NNDB_DIR = os.path.dirname(sys.modules["nndb"].__file__) + os.sep   # (--against: whose code the calls are)


def _build_session(frontend, rules, replica, lineage):
    """The debugger session ``nndb run --batch`` makes (no commands)."""
    try:
        from nndb.driver import DebugOptions, build_session
    except ImportError:
        try:
            from nndb.debugger.driver import DebugOptions, build_session    # (before 66423cf)
        except ImportError:
            build_session = None
    if build_session is None:            # (trees before build_session: c1f73ae and earlier)
        from nndb.debugger.session import Session
        from nndb.lineage.control import LineageControl
        from nndb.rules.catalog import load as load_rules
        from nndb.timetravel.machine import TimeMachine
        session = Session(frontend, interactive=False, stop_at_start=False, rules=load_rules(rules))
        session.machine = TimeMachine(replica, rules_spec=rules)
        session.lineage = LineageControl(lineage)
        return session
    return build_session(frontend, DebugOptions(batch=True, stop_at_start=False, rules=rules,
                                                replica=replica, lineage=lineage))


def _run_config(path, schedule, full_rules):
    if full_rules:
        return RunConfig(Target(path="bench.py"), path, schedule, full_rules=tuple(full_rules))
    return RunConfig(Target(path="bench.py"), path, schedule)


def _parse_full_rule(spec, every, precision):
    from nndb.tracer.fulltensors import parse_rule
    return parse_rule(spec, every, precision)


def _settling(machine) -> bool:
    """Time travel still measuring its first checkpoint (trees without the measure: never)."""
    return bool(getattr(machine, "settling", False))


def _preloaded_env():
    try:
        from nndb.run.preload import preloaded_env
    except ImportError:                  # (older trees)
        try:
            from nndb.preload import preloaded_env
        except ImportError:
            from nndb.timetravel.preload import preloaded_env
    return preloaded_env()


def _tune(background_writes=None, block_seconds=None):
    """Module-level knobs: the writer's thread (--writes) and the rules' block
    length (under callgrind); a tree without the knob ignores it."""
    if background_writes is not None:
        from nndb.store import writer
        writer.BACKGROUND = background_writes
    if block_seconds is not None:
        from nndb.rules import engine
        engine.BLOCK_SECONDS = block_seconds


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


def wide(seed):
    """An MLP whose weight matrices are past the host block (stats.HOST_MAX_PARAM_ELEMENTS,
    as a real model's are): their norms, gradients' and updates' read where they lie, a
    step (1.6 M parameters, AdamW)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    data = _batches(4, lambda g: (torch.randn(32, 512, generator=g), torch.randint(0, 10, (32,), generator=g)))
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


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: one Linear for q, k and v, torch's fused attention."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class GPTBlock(nn.Module):
    """Pre-norm decoder block: x + attn(ln(x)), then x + mlp(ln(x)) (a GELU MLP 4x wide)."""

    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A GPT-style decoder: token and position embeddings, 4 blocks of d_model 128,
    a final LayerNorm and an untied head: 53 parameter tensors.  Returns the
    logits flattened to (batch * context, vocab) for CrossEntropyLoss."""

    def __init__(self, vocab=128, context=32, d=128, heads=4, layers=4):
        super().__init__()
        self.vocab = vocab
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(context, d)
        self.blocks = nn.ModuleList(GPTBlock(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x)).view(-1, self.vocab)


def gpt(seed):
    """Next-token prediction on windows of one random token stream; AdamW with
    weight decay on the matrices only (two parameter groups)."""
    torch.manual_seed(seed)
    vocab, context, batch = 128, 32, 8
    model = TinyGPT(vocab, context)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95))
    stream = torch.randint(0, vocab, (4096,), generator=torch.Generator().manual_seed(1234))

    def window(g):
        starts = torch.randint(0, len(stream) - context - 1, (batch,), generator=g)
        chunks = torch.stack([stream[s:s + context + 1] for s in starts.tolist()])
        return chunks[:, :-1].contiguous(), chunks[:, 1:].reshape(-1)
    return model, opt, nn.CrossEntropyLoss(), _batches(8, window)


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with BatchNorm, a 1x1 projection
    on the shortcut where the shape changes."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet14(nn.Module):
    """CIFAR-size ResNet (6n+2, n=2): a 3x3 stem, three stages of two basic blocks
    (16, 32, 64 channels), global average pooling, a Linear head: 47 parameter tensors."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        blocks, cin = [], 16
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*blocks)
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def resnet(seed):
    torch.manual_seed(seed)
    model = ResNet14()
    opt = torch.optim.SGD(model.parameters(), 0.05, momentum=0.9, weight_decay=5e-4)
    data = _batches(4, lambda g: (torch.randn(16, 3, 32, 32, generator=g), torch.randint(0, 10, (16,), generator=g)))
    return model, opt, nn.CrossEntropyLoss(), data


# (build, steps of a timed loop, steps of a counted or travelled one).  A timed
# loop runs about 3 s, long enough to pay for the aftermath of the first
# checkpoint (taken in the warm-up) and for some of the later ones.
WORKLOADS = {"mlp": (mlp, 2400, 600), "cnn": (cnn, 150, 60), "lstm": (lstm, 400, 100),
             "transformer": (transformer, 250, 100), "cnn_fullgrad": (cnn, 150, 60),
             "gpt": (gpt, 150, 40), "resnet": (resnet, 60, 20), "wide": (wide, 300, 60)}
# Workloads that also keep whole tensors (nndb run --record-full ...): the CNN
# keeps its conv layers' gradients (SmallCNN's convs are features.0, .4 and .8:
# 'grad:conv*' in a model that names them conv) every 10 steps in fp16, i.e.
# --record-full 'grad:features.[048].*' --full-tensors-every 10 --precision fp16.
FULL_RULES = {"cnn_fullgrad": (("grad:features.[048].*", 10, "fp16"),)}


def _full_rules(name):
    return tuple(_parse_full_rule(spec, every, precision) for spec, every, precision in FULL_RULES.get(name, ()))


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
    session = _build_session(frontend or BatchFrontend(), RULES, REPLICA, LINEAGE)
    session.attach(rec, path)
    return session


def _recording(schedule, tmpdir, flush_secs=None, full_rules=()):
    """What `nndb run --batch` adds to the loop: the recorder, the debugger
    session (no commands), the rules and time travel's checkpoints (and the
    whole tensors of ``full_rules``, as --record-full)."""
    path = os.path.join(tmpdir, f"bench-{time.monotonic_ns()}.h5")
    meta = runmeta.collect(Target(path="bench.py"), schedule.describe())
    config = _run_config(path, schedule, full_rules)
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
    while machine is not None and _settling(machine) and extra < SETTLE_STEPS:
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


def count_calls(model, opt, crit, data, steps, start=0):
    """Python calls per step over ``steps`` more steps of the loop, counted with
    ``sys.setprofile`` (the training thread only: the trace writer's thread is
    not in it): for each step, the 'call' events whose code object's file lies
    in the measured nndb package (NNDB_DIR: nndb's own functions, another
    tree's under --against) and all 'call' events (the plain loop's too:
    ``train``, torch's modules and optimizer; the difference to the plain
    loop's is what nndb makes Python do, in its own code and in what it calls)."""
    own, every = [], []
    counts = [0, 0]
    prefix = NNDB_DIR

    def profile(frame, event, arg):
        if event == "call":
            counts[1] += 1
            if frame.f_code.co_filename.startswith(prefix):
                counts[0] += 1
    for i in range(steps):
        counts[0] = counts[1] = 0
        sys.setprofile(profile)
        try:
            train(model, opt, crit, data, 1, start=start + i)
        finally:
            sys.setprofile(None)
        own.append(counts[0])
        every.append(counts[1])
    return {"own": own, "all": every}


def timed_loop(build, steps, recorded, schedule, tmpdir, seed=0, arm=None, around=contextlib.nullcontext,
               full_rules=(), count=0):
    """Seconds for ``steps`` steps after WARMUP untimed ones (both under the
    recorder when ``recorded``), the final loss, trace bytes per step, the
    seconds the warm-up took (where nndb's one-time costs fall: naming the
    model, choosing the step rule, creating series), and the loop's figures:
    {"wall": s, "cpu": s (the process's CPU time, all its threads), "calls":
    count_calls() over ``count`` steps after the timed ones, or None}; the
    first three by CLOCK.  ``arm(session)`` sets the debugger up before the run
    (a catch point); both loops run inside ``around()``
    (torch.autograd.set_detect_anomaly)."""
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
        wall, cpu = time.perf_counter(), time.process_time()
        loss = train(model, opt, crit, data, steps)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        elapsed = cpu if CLOCK is time.process_time else wall
        calls = count_calls(model, opt, crit, data, count, start=WARMUP + extra + steps) if count else None
    # (the warm-up's steps beyond WARMUP counted at the timed loop's rate: the rest is one-time)
    warmup -= extra * elapsed / steps
    size = end_recording(rec, session, path) if rec is not None else None
    return elapsed, loss, size, warmup, {"wall": wall, "cpu": cpu, "calls": calls}


def _spread(values, key):
    return {key: statistics.median(values), key + "_min": min(values), key + "_max": max(values)}


def figures(rounds, tree, steps):
    """One tree's figures over the rounds, each against the plain loop of its
    round: ``rounds`` is a list of {variant: timed_loop()'s tuple}, variant
    "plain" and ``tree``."""
    out = {}
    for clock in ("wall", "cpu"):
        out.update(_spread([r[tree][4][clock] / r["plain"][4][clock] for r in rounds], "ratio_" + clock))
        out["recorded_%s_ms" % clock] = statistics.median(r[tree][4][clock] for r in rounds) / steps * 1e3
    out["recorded_ms"] = statistics.median(r[tree][0] for r in rounds) / steps * 1e3
    sizes = [r[tree][2] for r in rounds if r[tree][2] is not None]
    out["trace_bytes_per_step"] = statistics.median(sizes) if sizes else None
    out["startup_extra_ms"] = statistics.median(r[tree][3] - r["plain"][3] for r in rounds) * 1e3
    counted = [r for r in rounds if r[tree][4]["calls"] and r["plain"][4]["calls"]]
    if counted:
        mine, plain = counted[-1][tree][4]["calls"], counted[-1]["plain"][4]["calls"]
        out.update({
            "calls_per_step": statistics.median(mine["own"]),
            "calls_per_step_mean": statistics.fmean(mine["own"]),
            "calls_net_per_step": statistics.median(mine["all"]) - statistics.median(plain["all"]),
            "calls_net_per_step_mean": statistics.fmean(mine["all"]) - statistics.fmean(plain["all"]),
            "calls_steps": len(mine["own"])})
    else:
        out.update(dict.fromkeys(("calls_per_step", "calls_per_step_mean", "calls_net_per_step",
                                  "calls_net_per_step_mean", "calls_steps")))
    return out


def summary(name, steps, rounds, against=None):
    """The result of a workload: the plain loop, this tree's figures (and the
    ratio by CLOCK as ratio_median/min/max), and with ``against`` ({"rev",
    "commit"}) the figures of the rounds' "against" variant under "against"."""
    plain = {"plain_ms": statistics.median(r["plain"][0] for r in rounds) / steps * 1e3}
    for clock in ("wall", "cpu"):
        plain["plain_%s_ms" % clock] = statistics.median(r["plain"][4][clock] for r in rounds) / steps * 1e3
    counted = [r["plain"][4]["calls"] for r in rounds if r["plain"][4]["calls"]]
    plain["plain_calls_per_step"] = statistics.median(counted[-1]["all"]) if counted else None
    this = figures(rounds, "this", steps)
    out = {"workload": name, "steps": steps, "pairs": len(rounds),
           **_spread([r["this"][0] / r["plain"][0] for r in rounds], "ratio"), **plain, **this}
    out["ratio_median"] = out.pop("ratio")
    if against is not None:
        out["against"] = {**against, **figures(rounds, "against", steps)}
    return out


def bench(name, pairs, schedule, tmpdir, scale=1.0, count=0):
    """A/B pairs in this process, the order alternating; the calls counted
    (``count`` steps) after the timed loops of the last pair."""
    build, steps, _ = WORKLOADS[name]
    steps = max(5, int(steps * scale))
    rounds = []
    for i in range(pairs):
        order = (False, True) if i % 2 == 0 else (True, False)
        got = {}
        for recorded in order:
            got["this" if recorded else "plain"] = timed_loop(
                build, steps, recorded, schedule, tmpdir, full_rules=_full_rules(name),
                count=count if i == pairs - 1 else 0)
        rounds.append(got)
    return summary(name, steps, rounds)


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
    session.points.add(P.StepBreak, {"step": stop_at})
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
    events = collected_events(stderr)
    return events[0] if events else None


def collected_events(stderr: str):
    """All the events valgrind counted in the first process of its output, in its
    order (``Ir``; with the cache simulation, CACHE_EVENTS), or None."""
    lines = [m.groups() for m in re.finditer(r"^==(\d+)== (.*)$", stderr, re.M)]
    counts = [[int(n.replace(",", "")) for n in text.split(":", 1)[1].split()] for pid, text in lines
              if pid == lines[0][0] and text.startswith("Collected :")]
    return counts[0] if counts else None


# --cache: callgrind's cache simulation, one core of the machine these figures are taken on
# (an AVX-512 Xeon: 64 KiB 8-way L1i, 48 KiB 12-way L1d, 2 MiB 16-way L2, the last level
# simulated; the L3 behind it is not).  Fixed, so that a count means the same on any machine.
CACHE_GEOMETRY = ("--I1=65536,8,64", "--D1=49152,12,64", "--LL=2097152,16,64")
CACHE_EVENTS = ("Ir", "Dr", "Dw", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")


def misses(events) -> tuple:
    """(L1 misses, last-level misses) of callgrind's events (CACHE_EVENTS' order)."""
    e = dict(zip(CACHE_EVENTS, events))
    return e["I1mr"] + e["D1mr"] + e["D1mw"], e["ILmr"] + e["DLmr"] + e["DLmw"]


def _settle_writer(rec) -> None:
    """Wait for the trace block the writer's thread is writing, if any."""
    writer = getattr(rec, "writer", None)
    if writer is not None:
        writer.wait()


def _instructions_child(name, mode, steps, schedule):
    """Run under callgrind: the loop of ``steps`` steps after WARMUP, the only
    instrumented part (modes ``usual`` and ``switch``, --split: recorded, with
    callgrind switched on over each stretch of usual steps; the same switches
    around no step).  One thread: a spinning OpenMP worker's instructions
    vary from run to run.  Flushes by step count only, since valgrind's
    slowdown would make the 2 s flush come every few steps (and the rules'
    blocks, nndb.rules.engine.BLOCK_SECONDS, hold a step or two)."""
    torch.set_num_threads(1)
    _tune(block_seconds=float("inf"))      # (blocks of the rules by step count only, for the same reason)
    model, opt, crit, data = WORKLOADS[name][0](0)
    with tempfile.TemporaryDirectory() as tmpdir:
        rec = None
        each = mode in ("usual", "switch")
        if mode != "plain":
            rec, session, _ = _recording(schedule, tmpdir, flush_secs=float("inf"), full_rules=_full_rules(name))
            if mode == "catch":
                from nndb.debugger import points as P
                session.points.add(P.CatchPoint, {"what_kind": "nan", "eager": False})
            rec.__enter__()
        train(model, opt, crit, data, WARMUP)
        # The writer's thread compresses a block while the loop goes on: whether that work fell
        # inside the window or after it moved a count by up to 5% between invocations (one
        # tree: 3,028 K and 3,190 K). A block begun before the window is written before it,
        # and one begun in it is counted whole.
        _settle_writer(rec)
        if each:
            from nndb.cadence import observed
            on = False
            for i in range(steps):
                usual = not observed(rec.tracer.recorder.step)
                if usual != on:
                    _callgrind(usual if mode == "usual" else True)
                    if mode == "switch":
                        _callgrind(False)
                    on = usual
                    print("switched", file=sys.stderr)
                train(model, opt, crit, data, 1, start=WARMUP + i)
                if usual:
                    print("usual step", file=sys.stderr)
            if on and mode == "usual":
                _settle_writer(rec)
                _callgrind(False)
        else:
            _callgrind(True)
            train(model, opt, crit, data, steps)
            _settle_writer(rec)
            _callgrind(False)
        if rec is not None:
            rec.__exit__(None, None, None)
            rec.close()
            session.run_ended("finished", 0, "")
            session.machine.close()


def split_counts(per_step: dict, counted: dict, steps: int) -> dict:
    """The usual and the observed steps' instructions a step (--split), from the counts a
    step of the runs ``recorded`` (unswitched), ``usual`` (switched on over each stretch of
    usual steps) and ``switch`` (the same switches around no step), and what the runs said:
    ``counted[run] = (usual steps, switches)``."""
    usual_steps, switched = counted["usual"]
    pairs = (switched + 1) // 2                   # (on and off: one pair a stretch of usual steps)
    switch = per_step["switch"] * steps / max(counted["switch"][1], 1)    # (a pair's cost)
    usual = (per_step["usual"] * steps - pairs * switch) / usual_steps
    k = steps - usual_steps
    observed = (per_step["recorded"] * steps - usual * usual_steps) / max(k, 1)
    return {"observed_steps": k, "switch_instructions": switch, "usual_instructions": usual,
            "usual_ratio": usual / per_step["plain"], "observed_instructions": observed,
            "observed_ratio": observed / per_step["plain"],
            "observed_added": (per_step["recorded"] - usual) / per_step["plain"]}


def instructions(name, flags, scale=1.0, against=None, catch=False, split=False, cache=False):
    """Instructions per step of the loop, plain and recorded, each counted
    by callgrind in a process of its own (deterministic: the same tree and
    inputs give the same counts whatever else the machine does; not time:
    cache misses and the OpenMP threads are not in it); with ``against``
    (a tree from checkout()) its recorded loop too; with ``catch``, this tree's
    with ``catch nan`` armed and without, both with checkpoints (without time travel
    catch nan checks every operation, as --eager: not what a run pays); with
    ``split``, the usual and the observed steps apart (see the module's doc); with
    ``cache``, callgrind's cache simulation too (CACHE_GEOMETRY): each run's L1 and
    last-level misses a step, the usual step's with ``split``."""
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise SystemExit(f"bench: --instructions needs valgrind ({tool} is not on PATH)")
    steps = max(5, int(WORKLOADS[name][2] * scale))
    per_step, per_step_misses = {}, {}
    variants = [("plain", ROOT), ("recorded", ROOT)] + ([("against", against)] if against else []) \
        + ([("recorded-tt", ROOT), ("catch", ROOT)] if catch else []) \
        + ([("usual", ROOT), ("switch", ROOT)] if split else [])
    counted = {}
    with tempfile.TemporaryDirectory() as tmpdir:
        for variant, tree in variants:
            mode = {"against": "recorded", "recorded-tt": "recorded"}.get(variant, variant)
            own = [("auto" if variant in ("catch", "recorded-tt") and f == "off" and i and flags[i - 1] == "--replica"
                    else f) for i, f in enumerate(flags)]
            cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                   *(("--cache-sim=yes", *CACHE_GEOMETRY) if cache else ()),
                   f"--callgrind-out-file={os.path.join(tmpdir, 'callgrind.%p')}",
                   sys.executable, os.path.abspath(__file__), *own,
                   "--instructions-child", name, mode, str(steps)]
            out = subprocess.run(cmd, capture_output=True, text=True, env=_tree_env(tree))
            events = collected_events(out.stderr)
            if out.returncode != 0 or events is None or (cache and len(events) != len(CACHE_EVENTS)):
                raise SystemExit(f"bench: callgrind failed on {name}: {out.stderr.strip()[-500:]}")
            per_step[variant] = events[0] / steps
            if cache:
                per_step_misses[variant] = [m / steps for m in misses(events)]
            counted[variant] = (out.stderr.count("usual step"), out.stderr.count("switched"))
    out = {"workload": name, "steps": steps, "plain_instructions": per_step["plain"],
           "nndb_instructions": per_step["recorded"], "ratio": per_step["recorded"] / per_step["plain"]}
    if against:
        out["against_instructions"] = per_step["against"]
        out["against_ratio"] = per_step["against"] / per_step["plain"]
    if catch:
        out["checkpoints_instructions"] = per_step["recorded-tt"]
        out["catch_instructions"] = per_step["catch"]
        out["catch_ratio"] = per_step["catch"] / per_step["plain"]
        out["catch_added"] = (per_step["catch"] - per_step["recorded-tt"]) / per_step["plain"]
    if split:
        out.update(split_counts(per_step, counted, steps))
    if cache:
        for level, i in (("l1", 0), ("ll", 1)):
            for variant, m in per_step_misses.items():
                out[f"{variant}_{level}_misses"] = m[i]
            if split:
                # (the usual step's misses, split as its instructions are)
                out[f"usual_{level}_misses"] = split_counts(
                    {v: m[i] for v, m in per_step_misses.items()}, counted, steps)["usual_instructions"]
    return out


# -- --against REV: another revision's nndb, in child processes -------------------

CHILD_TAG = "BENCH-CHILD "


def _tree_env(tree):
    """The environment of a child that imports ``tree``'s nndb."""
    return dict(os.environ, NNDB_BENCH_TREE=tree,
                PYTHONPATH=os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH")) if p))


def checkout(rev, into):
    """``rev``'s nndb package extracted into the directory ``into`` (git archive: no
    worktree to register and remove); the full commit id."""
    top = os.path.abspath(os.path.join(HERE, ".."))
    got = subprocess.run(["git", "-C", top, "rev-parse", "--verify", "--quiet", rev + "^{commit}"],
                         capture_output=True, text=True)
    if got.returncode != 0:
        raise SystemExit(f"bench: --against {rev}: not a revision of {top}")
    commit = got.stdout.strip()
    archive = subprocess.run(["git", "-C", top, "archive", "--format=tar", commit, "nndb"], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"bench: --against {rev}: git archive failed: {archive.stderr.decode()[-300:]}")
    import io
    import tarfile
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(into, filter="data")
        else:
            tar.extractall(into)
    return commit


def child_loop(name, mode, steps, count, tree, flags):
    """timed_loop() in a child process that imports ``tree``'s nndb (this script's
    workloads and loop, the same flags); its tuple, as JSON gives it back."""
    cmd = [sys.executable, os.path.abspath(__file__), *flags, "--loop-child", name, mode, str(steps), str(count)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=_tree_env(tree))
    for line in reversed(out.stdout.splitlines()):
        if line.startswith(CHILD_TAG):
            got = json.loads(line[len(CHILD_TAG):])
            if not got["nndb"].startswith(os.path.join(tree, "nndb")):
                raise SystemExit(f"bench: the child for {tree} imported nndb from {got['nndb']}")
            return got["loop"]
    raise SystemExit(f"bench: the {mode} loop of {name} ({tree}) failed (exit {out.returncode}): "
                     f"{out.stderr.strip()[-800:]}")


def _loop_child(name, mode, steps, count, schedule):
    """In the child: one loop, its figures on stdout after CHILD_TAG."""
    with tempfile.TemporaryDirectory() as tmpdir:
        got = timed_loop(WORKLOADS[name][0], steps, mode == "recorded", schedule, tmpdir,
                         full_rules=_full_rules(name) if mode == "recorded" else (), count=count)
    print(CHILD_TAG + json.dumps({"loop": got, "nndb": NNDB_DIR}), flush=True)


def bench_against(name, pairs, scale, count, tree, rev, commit, flags):
    """Rounds of three child processes: the plain loop, this tree's nndb and
    ``tree``'s (``rev``), the order rotating by one each round; the calls
    counted in the last round."""
    build, steps, _ = WORKLOADS[name]
    steps = max(5, int(steps * scale))
    variants = ["plain", "this", "against"]
    rounds = []
    for i in range(pairs):
        order = variants[i % 3:] + variants[:i % 3]
        rounds.append({v: child_loop(name, "plain" if v == "plain" else "recorded", steps,
                                     count if i == pairs - 1 else 0, tree if v == "against" else ROOT, flags)
                       for v in order})
    return summary(name, steps, rounds, against={"rev": rev, "commit": commit})


def _restart_preloaded():
    """Replicas need Intel's OpenMP runtime to run multi-threaded (see nndb.run.preload)."""
    env = _preloaded_env()
    if env is not None and sys.platform.startswith("linux"):
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


def _child_flags(args, replica):
    """The options a child process needs to run the same loop."""
    flags = ["--rules", RULES, "--replica", replica, "--clock", args.clock, "--writes", args.writes]
    for opt, value in (("--every", args.every), ("--full-every", args.full_every),
                       ("--act-every", args.act_every), ("--lineage", LINEAGE), ("--threads", args.threads)):
        if value is not None:
            flags += [opt, str(value)]
    return flags


def table(results, tabulate):
    """A row for the plain loop and one per nndb measured, per workload."""
    def num(v, fmt):
        return "-" if v is None else format(v, fmt)
    rows = []
    for r in results:
        calls = r["plain_calls_per_step"]
        rows.append([r["workload"], "plain", f"{r['plain_wall_ms']:.2f}", f"{r['plain_cpu_ms']:.2f}",
                     "", "", "", "", "-", num(calls, ".0f"), "-", "-"])
        trees = [("nndb" if "against" not in r else "this tree", r)]
        if "against" in r:
            trees.append((r["against"]["rev"], r["against"]))
        for label, f in trees:
            rows.append(["", label, f"{f['recorded_wall_ms']:.2f}", f"{f['recorded_cpu_ms']:.2f}",
                         f"{f['ratio_wall']:.3f}x", f"{f['ratio_wall_min']:.3f}-{f['ratio_wall_max']:.3f}",
                         f"{f['ratio_cpu']:.3f}x", f"{f['ratio_cpu_min']:.3f}-{f['ratio_cpu_max']:.3f}",
                         num(f["calls_per_step"], ".0f"),
                         "-" if f["calls_net_per_step"] is None else f"+{f['calls_net_per_step']:.0f}",
                         num(f["trace_bytes_per_step"], ".0f"), f"{f['startup_extra_ms']:.0f}"])
    return tabulate(rows, headers=["workload", "loop", "wall ms/step", "CPU ms/step", "ratio wall", "min-max",
                                   "ratio CPU", "min-max", "nndb calls/step", "calls/step", "trace B/step",
                                   "one-time ms"], disable_numparse=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", action="append", choices=sorted(WORKLOADS),
                    help="run only this workload (repeatable; default: all)")
    ap.add_argument("--pairs", type=int, default=7,
                    help="A/B pairs per workload (rounds of three loops with --against; default 7)")
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
    ap.add_argument("--cache", action="store_true",
                    help="with --instructions: callgrind's cache simulation too (one core of an AVX-512 Xeon: "
                         "L1 and L2 misses per step, deterministic; what the instructions leave out of the time)")
    ap.add_argument("--split", action="store_true",
                    help="with --instructions: the usual and the observed steps counted apart "
                         "(two more callgrind runs, switched at each observed step)")
    ap.add_argument("--instructions-child", nargs=3, metavar=("WORKLOAD", "MODE", "STEPS"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--against", metavar="REV",
                    help="also measure the nndb of git revision REV (e.g. c1f73ae): each loop in a child "
                         "process, plain, this tree's nndb and REV's rotated round by round; with "
                         "--instructions, REV's recorded count too")
    ap.add_argument("--count-steps", type=int, default=32, metavar="N",
                    help="count Python calls (sys.setprofile) over N steps after the last round's timed "
                         "loops: nndb's own per step and all net of the plain loop (default 32; 0: off)")
    ap.add_argument("--loop-child", nargs=4, metavar=("WORKLOAD", "MODE", "STEPS", "COUNT"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--catch", action="store_true",
                    help="instead: plain, nndb, 'catch nan' armed, 'catch nan --eager' and "
                         "torch.autograd.set_detect_anomaly side by side (default workloads: mlp and cnn; "
                         "see scripts/bench_catch.py); with --instructions, this tree counted with checkpoints, without and with "
                         "'catch nan' armed (what catch nan adds)")
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
    if args.cache and not args.instructions:
        raise SystemExit("bench: --cache goes with --instructions (callgrind's cache simulation)")
    global RULES, REPLICA, LINEAGE, CLOCK
    RULES, REPLICA, LINEAGE = args.rules, args.replica, args.lineage
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    _tune(background_writes=args.writes == "thread")
    schedule = RecordSchedule.parse(args.every, None, args.full_every, args.act_every)
    if args.instructions_child:
        name, mode, steps = args.instructions_child
        _instructions_child(name, mode, int(steps), schedule)
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.loop_child:
        name, mode, steps, count = args.loop_child
        _loop_child(name, mode, int(steps), int(count), schedule)
        return 0
    if argv is None and not args.instructions:
        _restart_preloaded()
    from tabulate import tabulate
    names = args.workload or list(WORKLOADS)
    if args.instructions:
        # Checkpoints are taken on a wall-time budget, which valgrind's slowdown
        # would turn into many more: counted without them (their cost, a fork
        # and copy-on-write faults, is the kernel's: the timed benchmark has it).
        REPLICA = "off"
        flags = _child_flags(args, REPLICA)
        with tempfile.TemporaryDirectory(prefix="nndb-bench-") as tree:
            commit = checkout(args.against, tree) if args.against else None
            counted = [instructions(name, flags, args.scale, tree if args.against else None, args.catch,
                                    args.split, args.cache) for name in names]
        print(f"torch {torch.__version__}, 1 thread, callgrind"
              + (" (cache simulation: " + ", ".join(g.lstrip("-") for g in CACHE_GEOMETRY) + ")" if args.cache else "")
              + f", schedule: {schedule.describe()}, rules: {RULES}, "
              f"checkpoints: {REPLICA}, lineage: {LINEAGE or 'off'}"
              + (f", against {args.against} ({commit[:10]})" if commit else ""))
        rows = [[c["workload"], c["steps"], f"{c['plain_instructions']:,.0f}",
                 f"{c['nndb_instructions']:,.0f}", f"{c['ratio']:.3f}x"]
                + ([f"{c['against_instructions']:,.0f}", f"{c['against_ratio']:.3f}x"] if commit else [])
                + ([f"{c['checkpoints_instructions']:,.0f}", f"{c['catch_instructions']:,.0f}",
                    f"+{c['catch_added']:.3f}x"] if args.catch else [])
                + ([f"{c['usual_instructions']:,.0f} ({c['usual_ratio']:.3f}x)",
                    f"{c['observed_instructions']:,.0f} ({c['observed_ratio']:.2f}x, {c['observed_steps']})",
                    f"+{c['observed_added']:.3f}x"] if args.split else [])
                + ([f"{c['plain_l1_misses']:,.0f} / {c['recorded_l1_misses']:,.0f}"
                    + (f" ({c['usual_l1_misses']:,.0f})" if args.split else ""),
                    f"{c['plain_ll_misses']:,.0f} / {c['recorded_ll_misses']:,.0f}"
                    + (f" ({c['usual_ll_misses']:,.0f})" if args.split else "")]
                   + ([f"{c['against_ll_misses']:,.0f}"] if commit else []) if args.cache else [])
                for c in counted]
        headers = ["workload", "steps", "plain instructions/step", "nndb instructions/step", "ratio"]
        if commit:
            headers += [f"{args.against} instructions/step", f"{args.against} ratio"]
        if args.catch:
            headers += ["with checkpoints", "and catch nan", "catch nan adds"]
        if args.split:
            headers += ["usual step", "observed step (steps)", "observed steps add"]
        if args.cache:
            usual = " (usual step)" if args.split else ""
            headers += [f"L1 misses/step plain / nndb{usual}", f"L2 misses/step plain / nndb{usual}"]
            if commit:
                headers += [f"{args.against} L2 misses/step"]
        print(tabulate(rows, headers=headers, disable_numparse=True))
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"torch": torch.__version__, "schedule": schedule.describe(),
                           "against": {"rev": args.against, "commit": commit} if commit else None,
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
    commit = None
    if args.against:
        with tempfile.TemporaryDirectory(prefix="nndb-bench-") as tree:
            commit = checkout(args.against, tree)
            flags = _child_flags(args, REPLICA)
            results = [bench_against(name, args.pairs, args.scale, args.count_steps, tree, args.against, commit,
                                     flags) for name in names]
    else:
        with tempfile.TemporaryDirectory() as tmpdir:
            results = [bench(name, args.pairs, schedule, tmpdir, args.scale, args.count_steps) for name in names]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, OpenMP {runmeta.openmp_runtime()}, "
          f"schedule: {schedule.describe()}, rules: {RULES}, checkpoints: {REPLICA}, "
          f"lineage: {LINEAGE or 'off'}, {args.pairs} rounds"
          + (f", against {args.against} ({commit[:10]}; every loop in a child process)" if commit else ""))
    print(table(results, tabulate))
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
                       "schedule": schedule.describe(), "clock": args.clock,
                       "against": {"rev": args.against, "commit": commit} if commit else None,
                       "results": results,
                       "travel": travel_rows, "checkpoint_memory": memory}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
