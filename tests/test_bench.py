"""scripts/bench.py's instruction counting: what it reads from valgrind, and
the one-line error without it (the timed benchmark itself is not a test:
timings are measured, never asserted)."""
import importlib.util
import os

import pytest

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


@pytest.fixture(scope="module")
def phases(bench):
    import sys
    sys.path.insert(0, os.path.dirname(_PATH))
    try:
        import bench_phases
    finally:
        sys.path.pop(0)
    return bench_phases


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
    from nndb.config import RecordSchedule
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
