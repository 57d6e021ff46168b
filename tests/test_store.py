"""The trace store: writer/reader round trip, SWMR, and every way a trace can be bad."""
import json
import os
import shutil

import h5py
import numpy as np
import pytest

from conftest import nndb
from nndb.errors import TraceError, TraceWriteError
from nndb import schema
from nndb.store.reader import TraceReader
from nndb.store.writer import TraceWriter
from nndb.tracer.recorder import StepRecord


def rec(step, names, value=1.0):
    """Every series: ten elements all equal to ``value``."""
    row = [10, 10 * value, 10 * value * value, value, value, 10 * abs(value), 0, 0, 0]
    return StepRecord(step, step * 0.1, 1, 1, names, np.array([row] * len(names), dtype=float))


def make_trace(path, steps=5, **kw):
    w = TraceWriter(path, {"script": "x.py", "argv": ["x.py"]}, **kw)
    for i in range(steps):
        names = [("a", "act"), ("w", "param")] + ([("late", "grad")] if i >= 3 else [])
        w.append(rec(i, names, value=float(i)))
    w.close("finished", 0)
    return w


def test_round_trip_with_a_series_that_appears_late(tmp_path):
    p = str(tmp_path / "t.h5")
    make_trace(p, flush_steps=2)
    with TraceReader(p) as t:
        assert t.n_steps == 5 and list(t.steps) == [0, 1, 2, 3, 4]
        assert t.status == "finished" and t.end["exit_code"] == 0
        assert t.meta["script"] == "x.py"
        assert [(s.name, s.kind) for s in t.series()] == [("a", "act"), ("w", "param"), ("late", "grad")]
        steps, mean = t.history(t.find("late", "grad")[0], "mean")
        assert list(steps) == [3, 4] and list(mean) == [3.0, 4.0]
        assert list(t.history(t.find("a")[0], "mean")[1]) == [0, 1, 2, 3, 4]


def test_writes_are_batched(tmp_path, monkeypatch):
    p = str(tmp_path / "t.h5")
    w = TraceWriter(p, {}, flush_steps=10, flush_secs=1e9)
    flushes = []
    orig = w._write_block
    monkeypatch.setattr(w, "_write_block", lambda b: (flushes.append(len(b.rows)), orig(b))[1])
    for i in range(25):
        w.append(rec(i, [("a", "act")]))
    w.wait()
    assert flushes == [10, 10]                   # one block write per 10 steps, not one per step
    w.close("finished", 0)
    assert flushes[-1] == 5


def test_a_flush_on_time_writes_whole_stats_chunks_and_holds_the_rest_with_their_histograms(tmp_path):
    """--flush-secs: the rows of whole chunks (schema.STATS_CHUNK: 16 steps) are
    written, the last ones wait with their histograms; a reader in the process
    and the run's end see every step."""
    from nndb.schema import HIST_BINS
    from nndb.tracer.recorder import StepRecord
    p = str(tmp_path / "t.h5")
    w = TraceWriter(p, {}, flush_steps=1000, flush_secs=0)      # (every append is a flush on time)
    per = schema.STATS_CHUNK[0]
    n = 2 * per + per // 2
    names = [("a", "act")]
    for i in range(n):
        r = rec(i, names, value=float(i))
        w.append(StepRecord(r.step, r.time, 1, 1, names, r.raw, hist=np.full((1, HIST_BINS), i, dtype=np.int64)))
        w.wait()
        assert w.steps_written == (i + 1) // per * per        # whole chunks only
        assert [h[0] for h in w.full.hists] == list(range(w.steps_written, i + 1))   # the rest wait, histograms too
    with TraceReader(p) as t:                                # (the file as another reader sees it)
        assert list(t.steps) == list(range(2 * per))
        assert t.histogram_steps("a", "act") == list(range(2 * per))
    reader = TraceReader.from_writer(w)                      # (in the process: every step)
    assert list(reader.steps) == list(range(n))
    w.close("finished", 0)
    with TraceReader(p) as t:
        assert list(t.steps) == list(range(n)) and t.histogram_steps("a", "act") == list(range(n))
        assert list(t.history(t.find("a")[0], "mean")[1]) == [float(i) for i in range(n)]


def test_a_steps_block_is_written_in_the_writers_thread_and_read_back_whole(tmp_path, monkeypatch):
    """The block an append starts is written in the writer's own thread (the
    training thread goes on); a reader in this process waits for it, so it
    sees every step appended, and a fork waits for it too."""
    import threading
    from nndb.store import writer as W
    p = str(tmp_path / "t.h5")
    w = TraceWriter(p, {}, flush_steps=10, flush_secs=1e9)
    threads, gate, started = [], threading.Event(), threading.Event()
    orig = w._write_block

    def slow(b):
        threads.append(threading.current_thread().name)
        started.set()
        gate.wait(10)                           # (held until the test has appended past it)
        orig(b)
    monkeypatch.setattr(w, "_write_block", slow)
    for i in range(12):
        w.append(rec(i, [("a", "act")]))
    assert started.wait(10)
    assert threads == ["nndb-trace-writer"] and w.steps_written == 0      # in flight, training went on
    assert w in W._LIVE
    gate.set()
    reader = TraceReader.from_writer(w)
    assert list(reader.steps) == list(range(12))
    assert threads == ["nndb-trace-writer", "MainThread"]     # (the reader's flush: in the caller's thread)
    for i in range(12, 25):
        w.append(rec(i, [("a", "act")]))
    W._before_fork()                                           # what os.fork runs first
    assert w._thread is None and w.steps_written == 22
    w.close("finished", 0)
    assert list(TraceReader(p).steps) == list(range(25))


def test_a_block_that_fails_in_the_writers_thread_is_said_once_by_the_training_thread(tmp_path, monkeypatch):
    errors, said_in = [], []
    import threading
    p = str(tmp_path / "t.h5")
    w = TraceWriter(p, {}, flush_steps=5, flush_secs=1e9,
                    on_error=lambda m: (errors.append(m), said_in.append(threading.current_thread().name)))
    for i in range(5):
        w.append(rec(i, [("a", "act")]))
    w.wait()                                                  # the first block: written
    monkeypatch.setattr(w, "_write_block", lambda b: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    for i in range(5, 10):
        w.append(rec(i, [("a", "act")]))
    w.wait()
    w.append(rec(10, [("a", "act")]))
    assert len(errors) == 1 and "No space left on device" in errors[0] and "keeps the 5 steps" in errors[0]
    assert said_in == ["MainThread"]
    w.close("finished", 0)
    assert list(TraceReader(p).steps) == list(range(5))


def test_schema_version_and_format_attrs(tmp_path):
    p = str(tmp_path / "t.h5")
    make_trace(p)
    with h5py.File(p, "r") as f:
        assert f.attrs["nndb_format"] == schema.FORMAT
        assert f.attrs["schema_version"] == schema.SCHEMA_VERSION
        assert json.loads(f["stats"].attrs["columns"])[0] == "count"
        assert f["stats"].chunks is not None and f["stats"].maxshape[0] is None


def test_disk_full_reports_once_keeps_flushed_data_and_training_goes_on(tmp_path, monkeypatch):
    p = str(tmp_path / "t.h5")
    errors = []
    w = TraceWriter(p, {}, flush_steps=2, flush_secs=1e9, on_error=errors.append)
    w.append(rec(0, [("a", "act")]))
    w.append(rec(1, [("a", "act")]))             # flushed (in the writer's thread)
    w.wait()

    def full(block):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(w, "_write_block", full)
    w.append(rec(2, [("a", "act")]))
    w.append(rec(3, [("a", "act")]))             # this flush fails
    w.append(rec(4, [("a", "act")]))             # ignored, no exception
    w.close("finished", 0)
    assert len(errors) == 1
    assert "No space left on device" in errors[0] and p in errors[0]
    with TraceReader(p) as t:
        assert list(t.steps) == [0, 1]            # what was flushed before stays readable


def test_unwritable_path(tmp_path):
    blocker = tmp_path / "f"
    blocker.write_text("")
    with pytest.raises(TraceWriteError) as e:
        TraceWriter(str(blocker / "t.h5"), {})
    assert str(blocker / "t.h5") in str(e.value)


# -- bad traces: one line, exit 2 ------------------------------------------------

def _bad_traces(tmp_path):
    good = str(tmp_path / "good.h5")
    make_trace(good, steps=40)
    size = os.path.getsize(good)
    truncated = str(tmp_path / "truncated.h5")
    with open(good, "rb") as src, open(truncated, "wb") as dst:
        dst.write(src.read(size // 3))
    corrupted = str(tmp_path / "corrupted.h5")
    shutil.copy(good, corrupted)
    with open(corrupted, "r+b") as fh:
        fh.seek(0)
        fh.write(b"\0" * 64)                      # wipe the superblock
    other = str(tmp_path / "other.h5")
    with h5py.File(other, "w") as f:
        f["x"] = np.arange(3)
    text = str(tmp_path / "notes.txt")
    with open(text, "w") as fh:
        fh.write("hello\n")
    newer = str(tmp_path / "newer.h5")
    shutil.copy(good, newer)
    with h5py.File(newer, "r+") as f:
        f.attrs["schema_version"] = 99
    return {"truncated": truncated, "corrupted": corrupted, "not nndb": other, "text": text,
            "missing": str(tmp_path / "missing.h5"), "directory": str(tmp_path), "newer": newer}


def test_bad_traces_raise_trace_error(tmp_path):
    for what, path in _bad_traces(tmp_path).items():
        with pytest.raises(TraceError):
            TraceReader(path)


@pytest.mark.parametrize("what", ["truncated", "corrupted", "not nndb", "text", "missing", "directory", "newer"])
def test_inspect_bad_trace_is_one_line_exit_2(tmp_path, what):
    path = _bad_traces(tmp_path)[what]
    for extra in ([], ["--json"], ["--series", "a"]):
        r = nndb("inspect", path, *extra)
        assert r.returncode == 2, (what, r.stdout, r.stderr)
        assert r.stderr.startswith("nndb: error: ") and r.stderr.count("\n") == 1, r.stderr
        assert "Traceback" not in r.stderr and r.stdout == ""


# -- the vocabulary, the reader over a live writer, events, statuses ------------------

def test_the_schema_is_a_leaf_that_owns_the_vocabulary():
    import subprocess
    import sys
    code = ("import sys, nndb.schema as s; "
            "print(sorted(m for m in sys.modules if m.startswith('nndb') or m in ('h5py', 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.stdout.split("\n")[0] == "['nndb', 'nndb.run', 'nndb.run.startup', 'nndb.schema', 'nndb.version']", \
        out.stderr
    from nndb import cli
    from nndb.debugger import points
    from nndb.rules.base import STAT_INDEX
    from nndb.tracer import recorder, stats
    assert stats.STAT_NAMES is schema.STAT_NAMES and points.STATS is schema.STAT_NAMES
    assert cli.STAT_CHOICES is schema.STAT_NAMES and list(STAT_INDEX) == list(schema.STAT_NAMES)
    assert recorder.KINDS is schema.KINDS and cli.KIND_CHOICES is schema.KINDS
    assert set(schema.KIND_WORDS.values()) == set(schema.KINDS)


def test_a_reader_over_a_live_writer_sees_the_steps_not_flushed_yet(tmp_path):
    p = str(tmp_path / "t.h5")
    w = TraceWriter(p, {"script": "x.py"}, flush_steps=3, flush_secs=1e9)
    for i in range(5):                              # 3 flushed, 2 in the buffer
        w.append(rec(i, [("a", "act")] + ([("late", "grad")] if i >= 4 else []), value=float(i)))
    w.lineage(4, {"ops": [["add"]], "labels": {}, "nonfinite": []})
    with TraceReader.from_writer(w) as t:
        assert list(t.steps) == [0, 1, 2, 3, 4] and t.n_steps == 5 and t.status == "incomplete"
        assert [(s.name, s.kind) for s in t.series()] == [("a", "act"), ("late", "grad")]
        assert list(t.history(t.find("a")[0], "mean")[1]) == [0, 1, 2, 3, 4]
        steps, mean = t.history(t.find("late", "grad")[0], "mean")
        assert list(steps) == [4] and list(mean) == [4.0]
        assert t.lineage(4)["ops"] == [["add"]] and t.lineage_steps() == [4]
        assert set(t.row(4)) == {("a", "act"), ("late", "grad")}
    assert w.file is not None                       # closing that reader left the writer's file open
    w.append(rec(5, [("a", "act")], value=5.0))
    with TraceReader.from_writer(w) as t:
        assert list(t.steps) == [0, 1, 2, 3, 4, 5]
    w.close("finished", 0)
    assert w.file is None
    with pytest.raises(TraceError):
        TraceReader.from_writer(w)
    with TraceReader(p) as t:
        assert list(t.steps) == [0, 1, 2, 3, 4, 5] and t.lineage(4)["ops"] == [["add"]]


def test_a_reader_over_a_detached_writer_reads_its_buffer(tmp_path):
    # (a replica's writer never writes the shared file again: its steps stay in memory)
    p = str(tmp_path / "t.h5")
    w = TraceWriter(p, {}, flush_steps=2, flush_secs=1e9)
    for i in range(2):
        w.append(rec(i, [("a", "act")], value=float(i)))
    w.detach()
    for i in range(2, 5):
        w.append(rec(i, [("a", "act"), ("new", "grad")], value=float(i)))
    w.lineage(3, {"ops": [["mul"]], "labels": {}, "nonfinite": []})
    w.event("probe_disabled", "probe x failed and is off", 3)
    with TraceReader.from_writer(w) as t:
        assert list(t.steps) == [0, 1, 2, 3, 4]
        assert list(t.history(t.find("new", "grad")[0], "mean")[0]) == [2, 3, 4]
        assert t.all_stats().shape == (5, 2, len(schema.STAT_NAMES))
        assert t.lineage(3)["ops"] == [["mul"]] and [e["kind"] for e in t.events()] == ["probe_disabled"]
    with TraceReader(p) as t:                       # the file has only what was flushed before
        assert list(t.steps) == [0, 1] and t.events() == []


def test_events_are_written_and_read_back(tmp_path):
    p = str(tmp_path / "t.h5")
    w = TraceWriter(p, {}, flush_steps=100, flush_secs=1e9)
    w.append(rec(0, [("a", "act")]))
    w.event("recording_stopped", "nndb: internal error in the tracer; recording stopped", 1)
    w.close("finished", 0)
    with TraceReader(p) as t:
        [e] = t.events()
        assert (e["kind"], e["step"], e["message"]) == \
            ("recording_stopped", 1, "nndb: internal error in the tracer; recording stopped")
        assert e["kind"] in schema.EVENT_KINDS and isinstance(e["time"], float)
        t.events().clear()                          # a copy: the reader's own list stays
        assert len(t.events()) == 1
    r = nndb("inspect", p)
    assert r.returncode == 0 and "event      step 1: recording_stopped: nndb: internal error" in r.stdout
    assert json.loads(nndb("inspect", p, "--json").stdout)["events"][0]["kind"] == "recording_stopped"


def test_a_killed_run_reads_with_its_status(tmp_path):
    assert "killed" in schema.STATUSES
    p = str(tmp_path / "t.h5")
    w = TraceWriter(p, {}, flush_steps=100, flush_secs=1e9)
    w.append(rec(0, [("a", "act")]))
    w.close("killed", 0, "killed from the debugger")
    with TraceReader(p) as t:
        assert t.status == "killed" and t.end["reason"] == "killed from the debugger"
    r = nndb("inspect", p)
    assert r.returncode == 0 and "status     killed, exit 0 (killed from the debugger)" in r.stdout


def _with_optimizers(p, flush_steps=100):
    w = TraceWriter(p, {}, flush_steps=flush_steps, flush_secs=1e9)
    w.shape_of = lambda name, kind: {"w": [3, 4], "b": [4]}.get(name) if kind != "act" else None
    w.optimizers(0, [{"name": "opt", "groups": [["w"], ["b"]]}])
    w.hyper(0, "opt", 0, 0.1)
    w.hyper(0, "opt", 1, None)
    w.append(rec(0, [("a", "act"), ("w", "param"), ("b", "grad")]))
    w.hyper(1, "opt", 0, 0.01)
    w.append(rec(1, [("a", "act"), ("w", "param"), ("b", "grad")]))
    return w


def test_shapes_optimizers_and_learning_rates_read_back(tmp_path):
    p = str(tmp_path / "t.h5")
    w = _with_optimizers(p)
    w.close("finished", 0)
    with TraceReader(p) as t:
        assert [(s.name, s.shape) for s in t.series()] == [("a", None), ("w", (3, 4)), ("b", (4,))]
        assert t.optimizers() == [{"step": 0, "optimizers": [{"name": "opt", "groups": [["w"], ["b"]]}]}]
        assert t.hyper() == [{"step": 0, "optimizer": "opt", "group": 0, "lr": 0.1},
                             {"step": 0, "optimizer": "opt", "group": 1, "lr": None},
                             {"step": 1, "optimizer": "opt", "group": 0, "lr": 0.01}]
        t.hyper()[0]["lr"] = 5.0                    # (each call a copy)
        assert t.hyper()[0]["lr"] == 0.1


def test_optimizer_rows_of_a_live_and_of_a_detached_writer(tmp_path):
    p = str(tmp_path / "t.h5")
    w = _with_optimizers(p, flush_steps=1)
    w.detach()
    w.hyper(2, "opt", 0, 0.5)
    with TraceReader.from_writer(w) as t:
        assert [r["lr"] for r in t.hyper()] == [0.1, None, 0.01, 0.5] and len(t.optimizers()) == 1
    with TraceReader(p) as t:                       # the file: what was flushed before
        assert [r["lr"] for r in t.hyper()] == [0.1, None, 0.01]


def test_a_trace_written_before_shapes_and_optimizers_reads_without_them(tmp_path):
    p = str(tmp_path / "t.h5")
    w = _with_optimizers(p)
    w.close("finished", 0)
    _as_written_before_optimizers(p)
    with TraceReader(p) as t:
        assert [(s.name, s.shape) for s in t.series()] == [("a", None), ("w", None), ("b", None)]
        assert t.optimizers() is None and t.hyper() is None and t.n_steps == 2


def _as_written_before_optimizers(p):
    """Make a trace look as a writer before shapes, optimizers and hyper wrote it."""
    with h5py.File(p, "a") as f:
        del f["optimizers"], f["hyper"]
        lines = bytes(f["series"][:]).decode().splitlines()
        text = "".join(json.dumps({k: d[k] for k in ("id", "name", "kind")}) + "\n"
                       for d in map(json.loads, lines)).encode()
        f["series"].resize((len(text),))
        f["series"][:] = np.frombuffer(text, dtype=np.uint8)
