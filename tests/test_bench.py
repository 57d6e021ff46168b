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
