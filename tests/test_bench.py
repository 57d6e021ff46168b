"""scripts/bench.py's instruction counting: what it reads from valgrind, and
the one-line error without it (the timed benchmark itself is not a test:
timings are measured, never asserted)."""
import importlib.util
import os
import time

import numpy as np
import pytest
import torch

_PATH = os.path.join(os.path.dirname(__file__), "..", "scripts", "bench.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("nndb_bench", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_collected_is_the_first_process_count(bench):
    # a process the loop forked (a DataLoader worker) starts after the loop's
    # and may finish first: its count is not the loop's
    err = ("==100== Callgrind, a call-graph generating cache profiler\n"
           "==100== Command: python bench.py\n"
           "==200== Callgrind, a call-graph generating cache profiler\n"
           "==200== Collected : 0\n"
           "some output of the script\n"
           "==100== Events    : Ir\n"
           "==100== Collected : 1,493,120,044\n")
    assert bench.collected(err) == 1493120044
    assert bench.collected("==100== Callgrind\n==100== error: no such file\n") is None
    assert bench.collected("") is None


def test_cache_events_are_read_in_valgrind_order(bench):
    # --cache: callgrind's cache simulation reports nine events; the instructions are the first
    err = ("==100== Events    : Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw\n"
           "==100== Collected : 930,505,805 295,425,339 140,168,013 24,585,736 12,241,105 3,906,552 9,103 9,016 6,715\n")
    events = bench.collected_events(err)
    assert events[0] == bench.collected(err) == 930505805
    assert bench.misses(events) == (24585736 + 12241105 + 3906552, 9103 + 9016 + 6715)
    assert bench.collected_events("") is None


def test_cache_without_instructions_is_one_clear_error(bench):
    with pytest.raises(SystemExit, match=r"--cache goes with --instructions"):
        bench.main(["--cache", "--workload", "mlp"])


def test_instructions_without_valgrind_is_one_clear_error(bench, monkeypatch):
    monkeypatch.setattr(bench.shutil, "which", lambda tool: None)
    with pytest.raises(SystemExit, match=r"--instructions needs valgrind \(valgrind is not on PATH\)"):
        bench.instructions("mlp", [])


def _script(name):
    """A module of scripts/ beside bench.py (bench_phases, bench_floor)."""
    import importlib
    import sys
    sys.path.insert(0, os.path.dirname(_PATH))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


@pytest.fixture(scope="module")
def phases(bench):
    return _script("bench_phases")


def test_phase_split_adds_up_to_the_difference_of_the_means(phases):
    # plain steps of 100 us; recorded usual steps of 150 us but one of 450
    # (a writer's stall), and one observed step of 1,150 us in 10
    plain = [(10e-6, 20e-6, 10e-6, 30e-6, 30e-6)] * 10
    usual = (12e-6, 25e-6, 12e-6, 41e-6, 60e-6)
    recorded = [usual] * 8 + [(12e-6, 25e-6, 12e-6, 41e-6, 360e-6), (100e-6, 200e-6, 100e-6, 250e-6, 500e-6)]
    observed = [False] * 9 + [True]
    s = phases.split(plain, recorded, observed)
    assert s["phases"]["step"] == pytest.approx((30.0, 60.0))
    assert s["phases"]["forward"] == pytest.approx((20.0, 25.0))
    assert s["plain_median"] == pytest.approx(100.0) and s["usual_median"] == pytest.approx(150.0)
    assert s["usual_step"] == pytest.approx(50.0)
    assert s["observed"] == pytest.approx((1150 - 150) / 10)
    assert s["rest"] == pytest.approx((450 - 150) / 10)
    assert s["usual_step"] + s["observed"] + s["rest"] == pytest.approx(s["recorded_mean"] - s["plain_mean"])
    assert s["observed_steps"] == 1 and s["steps"] == 10


def test_phase_loop_times_every_phase_and_knows_the_observed_steps(bench, phases, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "REPLICA", "off")          # (no checkpoint to settle: a short loop)
    from nndb.run.config import RecordSchedule
    schedule = RecordSchedule.parse(None, None, None, None)
    build = bench.WORKLOADS["mlp"][0]
    times, observed, numbers = phases.phase_loop(build, 40, True, schedule, str(tmp_path), bench)
    assert len(times) == 40 and all(len(t) == len(phases.PHASES) and min(t) > 0 for t in times)
    # consecutive steps after the warm-up, each flagged as the cadence observes it (one in 32)
    assert numbers[0] >= bench.WARMUP and numbers == list(range(numbers[0], numbers[0] + 40))
    assert [n for n, o in zip(numbers, observed) if o] == [n for n in numbers if n % 32 == 0]
    assert sum(observed) in (1, 2)
    plain, none, no_numbers = phases.phase_loop(build, 5, False, schedule, str(tmp_path), bench)
    assert len(plain) == 5 and not any(none) and no_numbers == []


@pytest.fixture(scope="module")
def floor(bench):
    return _script("bench_floor")


def test_the_floor_captures_every_steps_loss_gradients_and_updates_and_changes_nothing(bench, floor):
    """--floor's hooks read what every recorded step must (the loss, each
    parameter's gradient and update), so its ratio is a floor only if they
    really do: checked against the loop's own values; the training is the
    plain loop's bit for bit, and the hooks leave with remove()."""
    build = bench.WORKLOADS["mlp"][0]
    model, opt, crit, data = build(0)
    hooks = floor.FloorHooks(opt, crit)
    losses, grads, updates = [], [], []
    for i in range(floor.RING):
        x, y = data[i % len(data)]
        before = [p.detach().clone() for p in model.parameters()]
        opt.zero_grad()
        loss = crit(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        grads.append([float(p.grad.norm()) for p in model.parameters()])
        updates.append([float((p.detach() - b).norm()) for p, b in zip(model.parameters(), before)])
    hooks.remove()
    assert hooks.losses == losses and len(hooks.norms) == 1
    k = len(list(model.parameters()))
    norms = np.sqrt(hooks.norms[0])                        # (RING steps, values | updates | gradients)
    assert norms.shape == (floor.RING, 3 * k)
    np.testing.assert_allclose(norms[:, 2 * k:], grads, rtol=1e-5)
    np.testing.assert_allclose(norms[:, k:2 * k], updates, rtol=1e-4)
    model2, opt2, crit2, _ = build(0)
    bench.train(model2, opt2, crit2, data, floor.RING)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters()))
    n = len(hooks.losses)
    bench.train(model, opt, crit, data, 2)                  # (removed: nothing more is captured)
    assert len(hooks.losses) == n


def test_the_recorded_loop_is_recorded_step_for_step_and_trains_as_the_plain_one(bench, tmp_path, monkeypatch):
    """The benchmark makes its model and optimizer before the recording (as a
    notebook does): the trace holds each step's own loss (its first step was
    once taken for a hand-written update, and every later record held the
    step before's), and the warm-up's extra steps go on cycling the batches
    (they had repeated the first one until the model overfitted it and its
    loss rose to ~3.5 on the others: the rules judged another run)."""
    from nndb.api.trace import Trace
    from nndb.run.config import RecordSchedule
    monkeypatch.setattr(bench, "REPLICA", "off")
    build = bench.WORKLOADS["mlp"][0]
    model, opt, crit, data = build(0)
    rec, session, path = bench._recording(RecordSchedule.parse(None, None, None, None), str(tmp_path))
    rec.__enter__()
    losses = []
    for i in range(12):
        x, y = data[i % len(data)]
        opt.zero_grad()
        loss = crit(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    rec.__exit__(None, None, None)
    rec.close()
    session.run_ended("finished", 0, "")
    session.machine.close()
    t = Trace(path)
    assert list(t.steps) == list(range(12))
    np.testing.assert_allclose(t.series("loss", "loss", "mean"), losses, rtol=1e-6)

    class Settling:                                      # (time travel still measuring its first checkpoint)
        def __init__(self, n):
            self.n = n

        @property
        def settling(self):
            self.n -= 1
            return self.n >= 0

    class Session:
        machine = Settling(5)

    warmed = build(0)
    extra = bench.warm_up(*warmed, Session())
    straight = build(0)
    bench.train(*straight, bench.WARMUP + extra)
    assert extra == 5
    assert all(torch.equal(a, b) for a, b in zip(warmed[0].parameters(), straight[0].parameters()))


def test_second_core_helper_works_as_asked_reports_its_share_and_is_gone_after(bench):
    """--second-core's helper keeps busy as it is asked (a whole core: never
    resting; a tenth of one: resting between its slices), is one child process
    while the measured code runs, reports the share of a core it got, and is
    stopped when the measured code returns.  What share it gets is the
    machine's (scripts/bench.py --second-core measures it): no figure is
    asserted, the measured code waits for what the helper did instead."""
    second = _script("bench_second_core")
    before = set(_children())        # (other tests of this worker may have left some)

    def measured(enough):
        def fn():
            (helper,) = set(_children()) - before
            cpu0, rests0 = second._cpu_seconds(helper), _rests(helper)
            end = time.time() + 120
            while not enough(second._cpu_seconds(helper) - cpu0, _rests(helper) - rests0):
                assert time.time() < end, "the helper did not do its work"
                time.sleep(0.02)
            return helper, second._cpu_seconds(helper) - cpu0, _rests(helper) - rests0
        return fn

    # a whole core asked: 0.2 s of CPU time, and no rest in it
    (helper, cpu, rests), share = second._with_helper(1000, 0, 0, measured(lambda cpu, rests: cpu >= 0.2))
    assert isinstance(share, float) and share > 0
    assert rests < 5                            # (a pure busy loop: no sleep, no I/O)
    assert helper not in _children() and set(_children()) - before == set()
    # a tenth of a core asked: it rests after each 0.1 ms slice
    (helper, cpu, rests), share = second._with_helper(100, 900, 0, measured(lambda cpu, rests: rests >= 50))
    assert isinstance(share, float) and share >= 0
    assert set(_children()) - before == set()


def _rests(pid: int) -> int:
    """Times process ``pid`` gave up its core of its own accord (slept, waited): Linux /proc."""
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("voluntary_ctxt_switches:"))


def _children():
    """Live child processes of this one (Linux /proc)."""
    me, out = str(os.getpid()), []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me and fields[0] != "Z":
                out.append(int(pid))
    return out


def _env():
    root = os.path.dirname(os.path.dirname(os.path.abspath(_PATH)))
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
                NNDB_NO_PRELOAD="1")          # (no second start with Intel's OpenMP: no checkpoints here)


def test_the_table_and_json_carry_wall_and_cpu_ratios_and_calls_per_step(tmp_path):
    """The smallest run of the script itself (24 MLP steps a loop, one pair, no
    checkpoints): each workload's JSON has both ratios with their spread and
    the Python calls per step, nndb's own and net of the plain loop."""
    import json
    import subprocess
    import sys
    out = tmp_path / "bench.json"
    got = subprocess.run([sys.executable, _PATH, "--workload", "mlp", "--pairs", "1", "--scale", "0.01",
                          "--replica", "off", "--count-steps", "4", "--json", str(out)],
                         capture_output=True, text=True, timeout=300, env=_env())
    assert got.returncode == 0, got.stderr[-2000:]
    assert "ratio CPU" in got.stdout and "nndb calls/step" in got.stdout
    (r,) = json.loads(out.read_text())["results"]
    assert r["workload"] == "mlp" and r["pairs"] == 1
    for key in ("ratio_wall", "ratio_cpu"):
        assert r[key] > 0 and r[key + "_min"] <= r[key] <= r[key + "_max"]
    assert r["ratio_median"] == r["ratio_wall"]                 # (--clock wall, the default)
    assert r["plain_wall_ms"] > 0 and r["plain_cpu_ms"] > 0 and r["recorded_cpu_ms"] > 0
    assert r["calls_steps"] == 4
    assert r["calls_per_step"] > 0 and r["calls_per_step_mean"] > 0
    assert r["plain_calls_per_step"] > 0
    assert r["calls_net_per_step"] >= r["calls_per_step"]       # (nndb's own calls are among the net ones)
    assert "against" not in r


def test_gpt_and_resnet_workloads_have_the_tensors_of_the_issue_and_train(bench):
    for name, tensors in (("gpt", 53), ("resnet", 47)):
        model, opt, crit, data = bench.WORKLOADS[name][0](0)
        assert len(list(model.parameters())) == tensors
        before = [p.detach().clone() for p in model.parameters()]
        assert np.isfinite(bench.train(model, opt, crit, data, 2))
        assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    from nndb.tracer.params import ParamPlan
    model, opt, crit, data = bench.WORKLOADS["wide"][0](0)       # (its matrices past the host block)
    assert len(ParamPlan(list(model.parameters())).large) == 2
    assert np.isfinite(bench.train(model, opt, crit, data, 1))
    model, _, _, data = bench.WORKLOADS["gpt"][0](0)
    x, y = data[0]
    assert torch.equal(x[:, 1:].reshape(-1), y.view(x.shape)[:, :-1].reshape(-1))   # (y: the next tokens)
    assert model(x).shape == (y.numel(), 128)            # (logits flattened for CrossEntropyLoss)
    # causal: a token's logits do not depend on later tokens
    x2 = x.clone()
    x2[:, -1] = (x2[:, -1] + 1) % 128
    with torch.no_grad():
        a, b = model(x).view(*x.shape, -1), model(x2).view(*x.shape, -1)
    assert torch.equal(a[:, :-1], b[:, :-1]) and not torch.equal(a[:, -1], b[:, -1])


def test_calls_are_counted_per_step_and_only_nndb_s_code_as_its_own(bench, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "REPLICA", "off")
    from nndb.run.config import RecordSchedule
    build = bench.WORKLOADS["mlp"][0]
    model, opt, crit, data = build(0)
    plain = bench.count_calls(model, opt, crit, data, 3)
    assert plain["own"] == [0, 0, 0] and min(plain["all"]) > 0
    rec, session, path = bench._recording(RecordSchedule.parse(None, None, None, None), str(tmp_path))
    rec.__enter__()
    bench.train(model, opt, crit, data, bench.WARMUP)
    counted = bench.count_calls(model, opt, crit, data, 3, start=bench.WARMUP)
    bench.end_recording(rec, session, path)
    assert len(counted["own"]) == 3 and min(counted["own"]) > 0
    assert all(a > p for a, p in zip(counted["all"], plain["all"]))
    assert bench.NNDB_DIR.endswith(os.path.join("nndb", "")) and os.path.isdir(bench.NNDB_DIR)


def test_a_usual_step_makes_the_same_few_calls_of_nndb_whatever_the_model(bench, tmp_path, monkeypatch):
    """Issue 43's design: a constant number of nndb's own Python calls on a usual step, the same
    for 6 parameter tensors (mlp) as for 14 (cnn), at most 25.  Two stops let it slip to 51
    unnoticed (a probe that armed every step; a per-step renumbering): bench.py measured it, no
    test did.  A count of calls, not a time: it does not depend on the machine's load (the rules'
    block, which also ends after BLOCK_SECONDS, is held to its steps: under sys.setprofile on a
    loaded machine, 11 of the 32 steps were usual ones, the others flushing a block)."""
    import statistics
    from nndb.rules import engine
    monkeypatch.setattr(bench, "REPLICA", "off")
    monkeypatch.setattr(engine, "BLOCK_SECONDS", float("inf"))
    from nndb.run.config import RecordSchedule
    medians = {}      # (the usual step's count, the commonest)
    for name in ("mlp", "cnn"):
        model, opt, crit, data = bench.WORKLOADS[name][0](0)
        rec, session, path = bench._recording(RecordSchedule.parse(None, None, None, None), str(tmp_path))
        rec.__enter__()
        bench.train(model, opt, crit, data, 40)         # (past the first steps, where every step is observed)
        # (48 steps: 13 of 32 observe or arm by design, and a loaded machine took 4 more once, where
        # the usual step's count was asked of 16 of 32)
        counted = bench.count_calls(model, opt, crit, data, 48, start=40)
        bench.end_recording(rec, session, path)
        usual = statistics.mode(counted["own"])           # (the usual step's: the others observe or arm)
        assert counted["own"].count(usual) >= 20, counted
        medians[name] = usual
    assert medians["mlp"] == medians["cnn"] <= 25, medians


def test_against_extracts_the_revision_s_nndb_and_a_child_imports_it(bench, tmp_path):
    """--against REV: REV's nndb package alone, extracted where a child of the
    script (NNDB_BENCH_TREE) imports it rather than this tree's; an unknown
    revision is one clear error."""
    import subprocess
    import sys
    commit = bench.checkout("HEAD", str(tmp_path))
    assert len(commit) == 40 and sorted(os.listdir(tmp_path)) == ["nndb"]
    assert os.path.isfile(tmp_path / "nndb" / "__init__.py")
    got = subprocess.run([sys.executable, "-c", "import nndb; print(nndb.__file__)"], capture_output=True,
                         text=True, env=bench._tree_env(str(tmp_path)), cwd=str(tmp_path.parent), timeout=120)
    assert got.stdout.strip() == str(tmp_path / "nndb" / "__init__.py")
    with pytest.raises(SystemExit, match="not a revision"):
        bench.checkout("no-such-revision-xyz", str(tmp_path / "other"))


def test_figures_are_each_tree_s_against_the_plain_loop_of_its_round(bench):
    def loop(wall, cpu, own=None, every=None):
        calls = {"own": own, "all": every} if own is not None else None
        return [wall, 0.0, 100.0, 0.5, {"wall": wall, "cpu": cpu, "calls": calls}]
    rounds = [{"plain": loop(1.0, 2.0), "this": loop(1.5, 2.2), "against": loop(2.0, 3.0)},
              {"plain": loop(2.0, 2.0, [0, 0], [100, 100]), "this": loop(2.4, 3.0, [20, 40], [150, 170]),
               "against": loop(3.0, 4.0, [50, 50], [200, 200])}]
    r = bench.summary("mlp", 10, rounds, against={"rev": "old", "commit": "c" * 40})
    assert r["ratio_wall"] == pytest.approx(1.35) and (r["ratio_wall_min"], r["ratio_wall_max"]) == (1.2, 1.5)
    assert r["ratio_cpu"] == pytest.approx(1.3) and r["ratio_cpu_max"] == pytest.approx(1.5)
    assert r["calls_per_step"] == 30 and r["calls_net_per_step"] == 60 and r["plain_calls_per_step"] == 100
    a = r["against"]
    assert a["rev"] == "old" and a["ratio_wall"] == pytest.approx(1.75) and a["ratio_cpu"] == pytest.approx(1.75)
    assert a["calls_per_step"] == 50 and a["calls_net_per_step"] == 100


def test_split_takes_the_switches_off_and_gives_each_kind_of_step_its_count(bench):
    """--split: 600 steps of which 19 observed (1,000 instructions each) and 581 usual (100
    each); the usual run switched on over 19 stretches and off after them (38 switches, one
    pair 50 instructions), the switch-only run made 19 pairs around no step."""
    steps, usual_steps, pairs = 600, 581, 19
    recorded = (usual_steps * 100 + 19 * 1000) / steps
    per_step = {"plain": 80.0, "recorded": recorded,
                "usual": (usual_steps * 100 + pairs * 50) / steps, "switch": pairs * 50 / steps}
    got = bench.split_counts(per_step, {"usual": (usual_steps, 2 * pairs), "switch": (0, pairs)}, steps)
    assert got["observed_steps"] == 19 and got["switch_instructions"] == pytest.approx(50)
    assert got["usual_instructions"] == pytest.approx(100) and got["observed_instructions"] == pytest.approx(1000)
    assert got["usual_ratio"] == pytest.approx(1.25)
    assert got["observed_added"] == pytest.approx((recorded - 100) / 80)
    # a loop that ends in a stretch of usual steps switched on (an odd count: the last off is
    # made without a line) is the same number of pairs
    odd = bench.split_counts(per_step, {"usual": (usual_steps, 2 * pairs - 1), "switch": (0, pairs)}, steps)
    assert odd["usual_instructions"] == pytest.approx(100)
