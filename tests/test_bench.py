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


def test_second_core_helper_takes_the_share_of_a_core_it_asks_for_and_is_gone_after(bench):
    """--second-core's helper really keeps a core busy for the share it asks
    (else "the plain step beside it" measures nothing), reports it, and is
    stopped when the measured code returns."""
    second = _script("bench_second_core")
    seen, before = {}, set(_children())        # (other tests of this worker may have left some)

    def measured():
        time.sleep(0.6)
        seen["children"] = set(_children()) - before
        return "done"
    out, share = second._with_helper(1000, 0, 0, measured)
    assert out == "done"
    assert 0.5 < share < 1.3                    # a whole core asked, at nice 0 (one of two cores)
    assert len(seen["children"]) == 1
    assert set(_children()) - before == set()
    out, share = second._with_helper(100, 900, 0, lambda: time.sleep(0.6))
    assert share < 0.5                          # a tenth of a core asked


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
