#!/usr/bin/env python
"""One check of nndb on a device: record, stop, catch and replay the bundled
examples, print a table, write JSON, exit 1 if any check failed.

    python scripts/gpu_check.py --device cuda --json gpu.json      # on a GPU
    python scripts/gpu_check.py --device cpu --steps 8 --pairs 1   # the same checks on the CPU

On a lent device machine (its python3 has torch with CUDA, h5py, click,
numpy, tabulate and pyyaml; nndb needs no install, and batch mode no
prompt_toolkit), one call (316-362 s on an H200 of this workplace, 2026-12-04,
each process starting CUDA in ~10 s; figures in docs/performance.md):

    PYTHONUNBUFFERED=1 python3 scripts/gpu_check.py --device cuda --json $OUT/gpu.json 2>&1 | tee $OUT/gpu.txt

Checks (each a row of the table, an object in the JSON's ``checks``):

* ``overhead:cnn``, ``overhead:transformer``: ``python EXAMPLE --device D
  --time`` against ``nndb run --batch`` of the same command, A/B interleaved
  (PAIRS pairs, the order alternating): the loop's time a step after its first
  min(20, steps/4) steps (the script's ``--time``, synchronised on CUDA) and
  the whole process's wall time (start-up included; the plain side gets the
  OpenMP runtime nndb gives the script).  The ratios are reported, never
  judged; the check fails if a run fails, or if the recorded run prints other
  numbers than the plain one where both are deterministic (the CPU; the CNN,
  run ``--deterministic``, on CUDA too).
* ``recording``: the CNN trained in this process under ``nndb.record``;
  norm, mean, min and max that nndb recorded for parameters and gradients
  on the device equal, to float32 tolerance, the same statistics computed
  in float64 on the host from ``.cpu()`` copies this script takes at the
  same steps.  The same run counts nndb's host transfers (below) and, on
  CUDA, its memory: ``torch.cuda.max_memory_allocated`` of a plain loop
  and of the recorded one, and ``memory_allocated`` early and late in the
  recorded run (growth fails the check).
* ``catch-nan``: tests/scripts/device_log0.py (log(0) at step 3)
  under ``catch nan``: the stop names log, the module, the line and step 3.
* ``nan-recorded``: the same script without ``catch``: the trace holds the
  step-3 loss as NaN and its NaN count, and the ``nonfinite`` rule reports
  step 3 (statistics of device tensors never miss a NaN).
* ``break-watch-replay``: the CNN with ``--deterministic`` under ``--replica
  respawn``: ``break step 5``, ``watch grad conv* norm > 0``, then ``goto
  2`` (checked against the trace's losses as every replay is) and ``replay
  --verify 0:6`` (every statistic, bit for bit).
* ``fork-refused`` (CUDA only): with ``--replica fork`` a replay is refused
  and nndb says that CUDA is initialised.
* ``disk-checkpoint``: tests/scripts/device_dropout.py (dropout, batches
  drawn on the device) with ``--total-steps 20``: fork checkpoints are off
  on CUDA, the disk ones are written all the same (steps 2, 4, .. 18), and
  the script resumed from step 10's file (``torch.load(weights_only=True)``,
  nndb.timetravel.disk.restore_rng) prints the run's losses of steps 11-19
  bit for bit; on CUDA the file holds the CUDA RNG state.
* ``check``: ``nndb check --json`` of the CNN on the device; no check FAILs.

Sync counting: while the ``recording`` loop runs, ``Tensor.item``,
``.cpu``, ``.tolist``, ``.numpy``, ``.to(cpu)``, ``float()``, ``int()`` and
``bool()`` are wrapped (here only, for that loop, then restored) and a call
is counted when it comes from a module of the ``nndb`` package on a tensor
of the device.  On the CPU there is no transfer: calls on CPU tensors are
counted as the stand-in.  Reported per recorded step (median, max, and
after the first 20 steps, where rules and activations look at every step),
with the calling lines.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import importlib.util
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)        # this checkout's nndb, installed or not (a device machine has it uninstalled)
EXAMPLES = os.path.join(ROOT, "scripts", "examples")
PLANTED = os.path.join(ROOT, "tests", "scripts", "device_log0.py")
CNN_TARGET = 1.05          # the goal for the CNN on a GPU (reported, not judged)


class Fail(Exception):
    """A check did not hold: its one-line reason."""


def _env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in e.get("PYTHONPATH", "").split(os.pathsep) if p])
    e["PYTHONHASHSEED"] = "0"        # a respawned replay orders sets of strings as the live run
    e.pop("NNDB_DEBUG", None)
    return e


def _run(argv, timeout, env=None):
    t0 = time.perf_counter()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env or _env(),
                           stdin=subprocess.DEVNULL, cwd=ROOT)
    except subprocess.TimeoutExpired:
        raise Fail(f"{' '.join(argv[-6:])}: no end within {timeout} s")
    took = time.perf_counter() - t0
    for text in (p.stdout, p.stderr):
        if "Traceback" in text or "internal error" in text:
            raise Fail(f"{os.path.basename(argv[-1])}: a traceback or internal error: "
                       + text.strip().splitlines()[-1][:200])
    return p, took


def _read_json(path):
    with open(path) as f:
        return json.load(f)


def _nndb(*args):
    return [sys.executable, "-m", "nndb", *args]


def _losses(stdout):
    return [line for line in stdout.splitlines() if line.startswith(("step ", "val step "))]


# -- checks ------------------------------------------------------------------------------

def check_overhead(a, tmp, name):
    script = os.path.join(EXAMPLES, f"{name}.py")
    # the CNN deterministic (both sides): on CUDA too nndb must change no number it prints
    cmd = [script, "--steps", str(a.steps), "--device", a.device, "--time"] + (["--deterministic"] if name == "cnn" else [])
    plain, recorded, ratios, loops = [], [], [], {"plain": [], "nndb": []}
    same = True
    # the plain side with the OpenMP runtime nndb run gives the script (libiomp5 preloaded
    # when installed), so that the ratio is nndb's and not the runtime's
    from nndb.run.preload import libiomp_path
    plain_env, omp = _env(), libiomp_path()
    if omp and "libiomp5" not in plain_env.get("LD_PRELOAD", ""):
        plain_env["LD_PRELOAD"] = omp + (":" + plain_env["LD_PRELOAD"] if plain_env.get("LD_PRELOAD") else "")
    for i in range(a.pairs):
        took = {}
        for side in (("plain", "nndb") if i % 2 == 0 else ("nndb", "plain")):
            if side == "plain":
                p, took[side] = _run([sys.executable, *cmd], a.timeout, plain_env)
            else:
                trace = os.path.join(tmp, f"{name}-{i}.h5")
                p, took[side] = _run(_nndb("run", "--batch", "-q", "--trace", trace, *cmd), a.timeout)
            if p.returncode != 0:
                raise Fail(f"{side} {name}.py exited {p.returncode}: {p.stderr.strip()[-200:]}")
            took[side + "_out"] = _losses(p.stdout)
            m = re.search(r"^time (\d+) steps (\S+) s$", p.stderr, re.M)
            if not m:
                raise Fail(f"{side} {name}.py printed no loop time")
            loops[side].append(float(m.group(2)) / int(m.group(1)))
        if took["plain_out"] != took["nndb_out"]:
            same = False
        plain.append(took["plain"])
        recorded.append(took["nndb"])
        ratios.append(took["nndb"] / took["plain"])
    if (a.device == "cpu" or name == "cnn") and not same:
        raise Fail(f"{name}.py printed other numbers under nndb than plain")
    loop_ratios = [n / p for p, n in zip(loops["plain"], loops["nndb"])]
    return {"plain_s": plain, "nndb_s": recorded, "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios), "ratio_max": max(ratios), "same_numbers": same,
            "same_numbers_judged": a.device == "cpu" or name == "cnn",
            "deterministic": name == "cnn",
            "loop_step_s": loops, "loop_ratio_median": statistics.median(loop_ratios),
            "loop_ratio_min": min(loop_ratios), "loop_ratio_max": max(loop_ratios),
            "target": CNN_TARGET if name == "cnn" else None,
            "plain_openmp": "libiomp5 preloaded, as nndb run does" if omp else "the default",
            "note": "ratio_*: wall time of the whole process, start-up included; loop_ratio_*: the "
                    "training loop's time per step after its first min(20, steps/4) steps (--time)"}


def _load_cnn():
    spec = importlib.util.spec_from_file_location("nndb_gpu_check_cnn", os.path.join(EXAMPLES, "cnn.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class SyncCounter:
    """Counts calls that read a tensor's data to the host, made from nndb's
    own modules, while installed (``with``); everything is put back on exit."""

    METHODS = ("item", "cpu", "tolist", "numpy", "to", "__float__", "__int__", "__bool__")

    def __init__(self, torch, device_type):
        import nndb
        self.torch, self.device_type = torch, device_type
        self.pkg = os.path.dirname(os.path.abspath(nndb.__file__)) + os.sep
        self.total = 0
        self.where = collections.Counter()
        self._saved = {}

    def _wrap(self, name, orig):
        counter = self

        def wrapper(t, *args, **kwargs):
            if getattr(t, "device", None) is not None and t.device.type == counter.device_type:
                if name != "to" or _to_host(args, kwargs):
                    f = sys._getframe(1)
                    path = f.f_code.co_filename
                    if path.startswith(counter.pkg):
                        counter.total += 1
                        rel = os.path.relpath(path, ROOT)
                        counter.where[f"{rel}:{f.f_lineno} {name.strip('_')}"] += 1
            return orig(t, *args, **kwargs)
        return wrapper

    def __enter__(self):
        T = self.torch.Tensor
        for name in self.METHODS:
            self._saved[name] = T.__dict__.get(name)
            setattr(T, name, self._wrap(name, getattr(T, name)))
        return self

    def __exit__(self, *exc):
        T = self.torch.Tensor
        for name, orig in self._saved.items():
            if orig is None:
                delattr(T, name)
            else:
                setattr(T, name, orig)


def _to_host(args, kwargs):
    """Whether a ``Tensor.to`` call's target is the host (``to(other)``, a
    dtype: not; no str() of a tensor, which would itself read it)."""
    dev = kwargs.get("device", args[0] if args else None)
    return isinstance(dev, str) and dev.startswith("cpu") or getattr(dev, "type", None) == "cpu" \
        and not hasattr(dev, "shape")


def check_recording(a, tmp):
    import torch

    import nndb
    cnn = _load_cnn()
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    x, y = cnn.make_data(640, 0)
    x, y = x.to(dev), y.to(dev)
    steps = a.record_steps
    compare_at = sorted({0, 1, min(5, steps - 1), steps - 1})

    def loop(model, opt, n, on_step=None):
        for step in range(n):
            idx = torch.randint(0, 512, (32,)).to(dev)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            if on_step:
                on_step(step, model)

    mem = {"plain_peak_bytes": None, "recorded_peak_bytes": None, "nndb_extra_peak_bytes": None,
           "allocated_early_bytes": None, "allocated_end_bytes": None, "growth_bytes": None}
    t_plain = None
    plain_alloc, alloc = [], []         # memory_allocated at every step's end (CUDA)
    if cuda:
        torch.manual_seed(0)
        model = cnn.SmallCNN().to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        loop(model, opt, steps, lambda step, m: plain_alloc.append(torch.cuda.memory_allocated()))
        torch.cuda.synchronize()
        t_plain = time.perf_counter() - t0
        mem["plain_peak_bytes"] = torch.cuda.max_memory_allocated()
        del model, opt
        torch.cuda.empty_cache()

    torch.manual_seed(0)
    model = cnn.SmallCNN().to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    copies, marks = {}, []
    early = min(20, steps - 1)
    settle = min(200, steps // 10)      # growth is judged from here (rules and statistics set up by then)
    counter = SyncCounter(torch, dev.type)

    def on_step(step, m):
        marks.append(counter.total)
        if step in compare_at:
            copies[step] = {("param", n): p.detach().cpu().clone() for n, p in m.named_parameters()}
            copies[step].update({("grad", n): p.grad.detach().cpu().clone() for n, p in m.named_parameters()})
        if cuda:
            alloc.append(torch.cuda.memory_allocated())
        if step == steps - 1:                       # what 'info memory' says at the last step
            from nndb.debugger.memory import report
            mem["info_memory"] = report(rec.session)

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    trace = os.path.join(tmp, "recording.h5")
    t0 = time.perf_counter()
    with nndb.record(trace, rules="default") as rec, counter:
        loop(model, opt, steps, on_step)
    if cuda:
        torch.cuda.synchronize()
        mem["recorded_peak_bytes"] = torch.cuda.max_memory_allocated()
        mem["nndb_extra_peak_bytes"] = mem["recorded_peak_bytes"] - mem["plain_peak_bytes"]
        mem.update(_growth(alloc, plain_alloc, early, settle))
    t_rec = time.perf_counter() - t0

    per_step = [b - a_ for a_, b in zip([0] + marks[:-1], marks)]
    steady = per_step[20:]
    if not cuda:
        mem = {"info_memory": mem.get("info_memory")}
    if mem.get("info_memory") is None or (cuda and not mem["info_memory"]["devices"]):
        raise Fail(f"'info memory' did not report the {'CUDA device' if cuda else 'process'}: {mem}")
    syncs = {"counted_on": dev.type, "stand_in": not cuda, "total": counter.total,
             "per_step_median": statistics.median(per_step), "per_step_max": max(per_step),
             "per_step_after_20_median": statistics.median(steady) if steady else None,
             "per_step_after_20_max": max(steady) if steady else None,
             "where": dict(counter.where.most_common())}
    if not cuda:
        syncs["note"] = "CPU run: no host transfer happens; calls on CPU tensors are counted as the stand-in"

    compared, worst = 0, 0.0
    with nndb.open(trace) as t:
        rows = {int(s): i for i, s in enumerate(t.steps)}
        for step in compare_at:
            if step not in rows:
                raise Fail(f"step {step} is not in the trace")
            got = t.stats(step)
            for (kind, name), host in copies[step].items():
                rec_stats = got[kind][name]
                h = host.double()
                want = {"norm": h.norm().item(), "mean": h.mean().item(), "min": h.min().item(),
                        "max": h.max().item()}
                for stat, w in want.items():
                    g = rec_stats.get(stat)
                    if g is None:                       # not measured at this step (not a full step)
                        continue
                    compared += 1
                    err = abs(g - w) / max(abs(w), 1e-6)
                    worst = max(worst, err)
                    if not math.isclose(g, w, rel_tol=1e-5, abs_tol=1e-6):
                        raise Fail(f"step {step} {kind} {name} {stat}: recorded {g!r}, host copy {w!r}")
    if compared == 0:
        raise Fail("compared nothing")
    failed = None
    if cuda and mem["growth_bytes"] > max(mem["plain_growth_bytes"], 0):
        failed = (f"GPU memory grew by {mem['growth_bytes']} bytes between step {settle} and the end "
                  f"(the plain loop: {mem['plain_growth_bytes']})")
    return {"_fail": failed, "steps": steps, "compared_values": compared, "worst_rel_error": worst,
            "findings": sorted({f["rule"] for f in rec.findings}),
            "compared_at_steps": compare_at, "syncs": syncs, "memory": mem,
            "in_process_ratio": (t_rec / t_plain) if t_plain else None}


def _growth(alloc, plain_alloc, early, settle):
    """The recorded loop's allocated memory at every step against the plain
    loop's: growth from ``settle`` to the end (judged), from ``early`` (said),
    and the steps after ``settle`` where it changed (the first 20)."""
    changes = [(i, alloc[i] - alloc[i - 1]) for i in range(settle + 1, len(alloc)) if alloc[i] != alloc[i - 1]]
    return {"allocated_early_bytes": alloc[early], "allocated_settled_bytes": alloc[settle],
            "allocated_end_bytes": alloc[-1], "settled_at_step": settle,
            "growth_bytes": alloc[-1] - alloc[settle], "growth_from_early_bytes": alloc[-1] - alloc[early],
            "plain_growth_bytes": plain_alloc[-1] - plain_alloc[settle],
            "plain_growth_from_early_bytes": plain_alloc[-1] - plain_alloc[early],
            "changes_after_settled": changes[:20], "changes_after_settled_count": len(changes)}


def check_catch_nan(a, tmp):
    with open(PLANTED) as f:
        line = next(i for i, s in enumerate(f, 1) if "# LOG LINE" in s)
    rep = os.path.join(tmp, "catch.json")
    p, _ = _run(_nndb("run", "--batch", "-q", "--rules", "none", "--trace", os.path.join(tmp, "catch.h5"),
                      "--report", rep, "-e", "catch nan", PLANTED, "--device", a.device), a.timeout)
    stops = _read_json(rep)["stops"]
    if not stops:
        raise Fail(f"catch nan did not stop (exit {p.returncode})")
    d = stops[0]["detail"]
    got = {"op": d.get("op"), "module": d.get("module"), "line": d.get("line"), "step": stops[0]["step"]}
    want = {"op": "log", "module": "head", "line": line, "step": 3}
    if got != want or stops[0]["reason"] != "catchpoint":
        raise Fail(f"catch nan stopped at {got}, expected {want}")
    return {"stop": got, "phase": d.get("phase"), "located": d.get("located")}


def check_nan_recorded(a, tmp):
    import nndb
    rep, trace = os.path.join(tmp, "nan.json"), os.path.join(tmp, "nan.h5")
    p, _ = _run(_nndb("run", "--batch", "-q", "--trace", trace, "--report", rep, PLANTED, "--device", a.device),
                a.timeout)
    printed = [line.split()[-1] for line in _losses(p.stdout)]
    if len(printed) != 6 or printed[3] != "nan":
        raise Fail(f"the script printed {printed}, expected 6 losses, NaN at step 3")
    with nndb.open(trace) as t:
        loss = t.stats(3)["loss"]["loss"]
        got = {"mean": loss.get("mean"), "nan_count": loss.get("nan_count")}
        first = {int(s): t.stats(int(s))["loss"]["loss"].get("mean") for s in t.steps if int(s) < 3}
    if not (got["mean"] is not None and math.isnan(got["mean"]) and got["nan_count"] == 1):
        raise Fail(f"the trace's step-3 loss is {got}, expected NaN with nan_count 1")
    if [repr(first[k]) for k in sorted(first)] != printed[:3]:
        raise Fail(f"the trace's losses of steps 0-2 {first} are not the printed {printed[:3]}")
    found = sorted({(f["rule"], f["step"]) for f in _read_json(rep)["findings"] if f["rule"] == "nonfinite"})
    if not found or found[0][1] != 3:
        raise Fail(f"nonfinite did not report step 3 first: {found}")
    return {"loss_step3": got, "nonfinite_first_step": found[0][1], "losses_0_2_equal_printed": True}


DROPOUT = os.path.join(ROOT, "tests", "scripts", "device_dropout.py")


def check_disk_checkpoint(a, tmp):
    """Disk checkpoints of a run whose fork checkpoints are off (CUDA) are
    written at every 10% of a known total and resume the script bit for bit:
    model, optimizer and RNG (dropout and the batches draw from the device's)."""
    trace = os.path.join(tmp, "disk.h5")
    p, _ = _run(_nndb("run", "--batch", "-q", "--rules", "none", "--total-steps", "20", "--trace", trace,
                      DROPOUT, "--steps", "20", "--device", a.device), a.timeout)
    ckdir = os.path.join(tmp, "disk.ckpt")
    names = sorted(os.listdir(ckdir)) if os.path.isdir(ckdir) else []
    want = [f"step_{s:08d}.pt" for s in range(2, 20, 2)]
    if names != want:
        raise Fail(f"{ckdir} holds {names}, expected {want[0]} .. {want[-1]}")
    recorded = _losses(p.stdout)
    r, _ = _run([sys.executable, DROPOUT, "--steps", "20", "--device", a.device, "--resume",
                 os.path.join(ckdir, "step_00000010.pt")], a.timeout)
    lines = r.stdout.splitlines()
    cuda_states = int(lines[0].rsplit(" ", 1)[1]) if lines and lines[0].startswith("resumed") else None
    if a.device == "cuda" and not cuda_states:
        raise Fail(f"the checkpoint holds no CUDA RNG state: {lines[:1]}")
    if _losses(r.stdout) != recorded[11:]:
        raise Fail(f"resumed after step 10 the script printed {_losses(r.stdout)[:2]}, the run {recorded[11:13]}")
    return {"files": len(names), "resumed_steps_equal": len(recorded) - 11, "cuda_rng_states": cuda_states}


def check_break_watch_replay(a, tmp):
    rep = os.path.join(tmp, "bwr.json")
    cmds = ["break step 5", "watch grad conv* norm > 0", "continue", "delete 2", "continue",
            "goto 2", "present", "replay --verify 0:6", "continue"]
    argv = ["run", "--batch", "-q", "--rules", "none", "--replica", "respawn", "--report", rep,
            "--trace", os.path.join(tmp, "bwr.h5")]
    for c in cmds:
        argv += ["-e", c]
    p, _ = _run(_nndb(*argv, os.path.join(EXAMPLES, "cnn.py"), "--steps", "8", "--deterministic",
                      "--device", a.device), a.timeout)
    r = _read_json(rep)
    stops = [(s["reason"], s["step"]) for s in r["stops"]]
    if r["exit"]["code"] != 0 or r["steps"] != 8:
        raise Fail(f"exit {r['exit']}, {r['steps']} steps")
    if stops != [("watchpoint", 0), ("breakpoint", 5)]:
        raise Fail(f"stops {stops}, expected a watchpoint at step 0 and the breakpoint at step 5")
    w = r["stops"][0]["detail"]
    if not w["tensor"].startswith("conv") or w["kind"] != "grad":
        raise Fail(f"the watchpoint named {w['kind']} {w['tensor']}")
    if not re.search(r"In the past \(timeline 0\): step 2 finished", p.stdout):
        raise Fail("goto 2 did not land: " + _first_error(p))
    m = re.search(r"replay --verify 0:6: 6 step\(s\) replayed .*: identical to the trace, bit for bit "
                  r"\((\d+) values\)", p.stdout)
    if not m:
        raise Fail("replay --verify 0:6 was not bit-exact: " + _first_error(p))
    return {"stops": stops, "replay": "bit-exact", "values_compared": int(m.group(1)),
            "replica": "respawn", "deterministic_algorithms": True}


def _first_error(p):
    lines = [s for s in (p.stdout + "\n" + p.stderr).splitlines()
             if "-e '" in s or "differ" in s or "nndb:" in s]
    return (lines[0] if lines else "no message")[:240]


def check_fork_refused(a, tmp):
    argv = ["run", "--batch", "-q", "--rules", "none", "--replica", "fork", "--trace", os.path.join(tmp, "fork.h5"),
            "-e", "break step 4", "-e", "continue", "-e", "goto 1", "-e", "present", "-e", "continue"]
    p, _ = _run(_nndb(*argv, os.path.join(EXAMPLES, "cnn.py"), "--steps", "6", "--device", a.device), a.timeout)
    said = [s for s in (p.stdout + p.stderr).splitlines() if "CUDA is initialised" in s]
    if not said:
        raise Fail("--replica fork on CUDA did not say that CUDA is initialised: " + _first_error(p))
    return {"message": said[0][:300]}


def check_nndb_check(a, tmp):
    p, _ = _run(_nndb("check", "--json", "--steps", "2", "--overfit-iters", str(a.overfit_iters),
                      os.path.join(EXAMPLES, "cnn.py"), "--device", a.device), a.timeout)
    try:
        r = json.loads(p.stdout)
    except ValueError:
        raise Fail(f"nndb check --json printed no JSON (exit {p.returncode})")
    status = {c["name"]: c["status"] for c in r["checks"]}
    failed = [n for n, s in status.items() if s == "FAIL"]
    if failed or p.returncode != 0:
        raise Fail(f"nndb check failed: {', '.join(failed) or 'exit ' + str(p.returncode)}")
    return {"checks": status}


# -- driver ------------------------------------------------------------------------------

def _device_name(a):
    import torch
    if a.device == "cuda":
        return torch.cuda.get_device_name(0)
    import platform
    return platform.processor() or platform.machine()


def _summary(name, res):
    if name.startswith("overhead"):
        return (f"loop {res['loop_ratio_median']:.3f}x ({res['loop_ratio_min']:.3f}-{res['loop_ratio_max']:.3f}), "
                f"plain step {statistics.median(res['loop_step_s']['plain']) * 1e3:.2f} ms; process "
                f"{res['ratio_median']:.3f}x ({statistics.median(res['plain_s']):.1f} s plain); "
                f"same numbers: {res['same_numbers']}{'' if res['same_numbers_judged'] else ' (not judged)'}")
    if name == "recording":
        s = res["syncs"]
        mem = res["memory"]
        memtxt = "memory n/a" if mem.get("nndb_extra_peak_bytes") is None else (f"nndb +{mem['nndb_extra_peak_bytes'] / 2**20:.1f} MiB peak, "
                                                   f"growth {mem['growth_bytes']} B after step "
                                                   f"{mem['settled_at_step']} (plain {mem['plain_growth_bytes']} B)")
        return (f"{res['compared_values']} values equal (worst rel {res['worst_rel_error']:.1e}); "
                f"syncs/step {s['per_step_median']} (max {s['per_step_max']}, after 20: "
                f"{s['per_step_after_20_median']}){' [cpu stand-in]' if s['stand_in'] else ''}; {memtxt}"
                + (f"; loop {res['in_process_ratio']:.3f}x in process" if res["in_process_ratio"] else ""))
    if name == "catch-nan":
        st = res["stop"]
        return f"{st['op']} in {st['module']} line {st['line']} step {st['step']} ({res['phase']})"
    if name == "nan-recorded":
        return f"step-3 loss {res['loss_step3']}, nonfinite at step {res['nonfinite_first_step']}"
    if name == "break-watch-replay":
        return f"stops {res['stops']}; replay {res['replay']} ({res['values_compared']} values)"
    if name == "fork-refused":
        return res["message"][:100]
    if name == "disk-checkpoint":
        return (f"{res['files']} files; resumed from step 10: {res['resumed_steps_equal']} losses bit-equal; "
                f"CUDA RNG states {res['cuda_rng_states']}")
    if name == "check":
        return ", ".join(f"{k} {v}" for k, v in res["checks"].items())
    return ""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--json", metavar="OUT", help="write the results here")
    ap.add_argument("--steps", type=int, default=300, help="steps of each timed example run (default 300)")
    ap.add_argument("--pairs", type=int, default=3, help="A/B pairs per example (default 3)")
    ap.add_argument("--record-steps", type=int, default=None,
                    help="steps of the in-process recording loop (default: 2000 on cuda, 40 on cpu)")
    ap.add_argument("--overfit-iters", type=int, default=300)
    ap.add_argument("--jobs", type=int, default=1,
                    help="run up to N checks at once (quicker; the ratios are then not measurements)")
    ap.add_argument("--only", metavar="NAME[,NAME]", help="run only these checks (a rerun of the failed ones)")
    ap.add_argument("--timeout", type=int, default=120, help="seconds allowed to each subprocess (default 120)")
    a = ap.parse_args(argv)
    if a.steps < 1 or a.pairs < 1 or a.jobs < 1:
        ap.error("--steps, --pairs and --jobs must be at least 1")
    if a.record_steps is None:
        a.record_steps = 2000 if a.device == "cuda" else 40
    if a.record_steps < 2:
        ap.error("--record-steps must be at least 2")
    checks = [("overhead:cnn", lambda tmp: check_overhead(a, tmp, "cnn")),
              ("overhead:transformer", lambda tmp: check_overhead(a, tmp, "transformer")),
              ("recording", lambda tmp: check_recording(a, tmp)),
              ("catch-nan", lambda tmp: check_catch_nan(a, tmp)),
              ("nan-recorded", lambda tmp: check_nan_recorded(a, tmp)),
              ("break-watch-replay", lambda tmp: check_break_watch_replay(a, tmp))]
    if a.device == "cuda":
        checks.append(("fork-refused", lambda tmp: check_fork_refused(a, tmp)))
    checks.append(("disk-checkpoint", lambda tmp: check_disk_checkpoint(a, tmp)))
    checks.append(("check", lambda tmp: check_nndb_check(a, tmp)))
    if a.only:
        wanted = a.only.split(",")
        unknown = sorted(set(wanted) - {n for n, _ in checks})
        if unknown:
            ap.error(f"--only: no check {', '.join(unknown)} (checks: {', '.join(n for n, _ in checks)})")
        checks = [c for c in checks if c[0] in wanted]
    import torch                                # (after the arguments: a bad one costs no torch import)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda but torch sees no CUDA device (torch.cuda.is_available() is False)",
              file=sys.stderr)
        return 2

    def one(item):
        name, fn = item
        t0 = time.perf_counter()
        try:
            res = fn(tmp)
            why = res.pop("_fail", None) or ""        # (a check that failed but measured: its data kept)
            ok = not why
        except Fail as e:
            res, ok, why = {}, False, str(e)
        except Exception as e:                  # a bug here is a failed check, one line
            res, ok, why = {}, False, f"{type(e).__name__}: {e}"
        print(f"  {name}: {'ok' if ok else 'FAIL'} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
        return {"name": name, "ok": ok, "reason": why, "seconds": round(time.perf_counter() - t0, 2),
                "measured": bool(res), **res}

    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="nndb-gpu-check-") as tmp:
        if a.jobs == 1:
            results = [one(c) for c in checks]
        else:                                   # the checks' processes side by side: quicker, timings void
            with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
                results = list(pool.map(one, checks))

    out = {"gpu_check": 1, "device": a.device, "device_name": _device_name(a), "torch": torch.__version__,
           "steps": a.steps, "pairs": a.pairs, "jobs": a.jobs,
           "timings_valid": a.jobs == 1, "record_steps": a.record_steps,
           "seconds": round(time.perf_counter() - t_all, 2), "ok": all(r["ok"] for r in results),
           "fork_refusal": ("checked (fork-refused)" if a.device == "cuda" else
                            "n/a on cpu (tests/test_timetravel_units.py simulates CUDA initialised)"),
           "checks": results}
    from tabulate import tabulate
    print(f"nndb gpu_check on {out['device']} ({out['device_name']}), torch {out['torch']}"
          + ("" if out["timings_valid"] else f"; {a.jobs} checks at once: the ratios are not measurements"))
    print(tabulate([[r["name"], "ok" if r["ok"] else "FAIL", r["seconds"],
                     "; ".join(x for x in (r["reason"], _summary(r["name"], r) if r["measured"] else "") if x)]
                    for r in results],
                   headers=["check", "result", "s", "what"]))
    if results and any(r["name"] == "recording" and "syncs" in r for r in results):
        rec = next(r for r in results if r["name"] == "recording")
        print("host reads from nndb (file:line call: count over the recording loop):")
        for where, n in rec["syncs"]["where"].items():
            print(f"  {where}: {n}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
