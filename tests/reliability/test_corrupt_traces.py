"""Any file given as a trace: a TraceError (one line; nndb inspect and
check-trace exit 2), never another exception.  Named kinds of damage through
the CLI, and the reader fuzzed with hypothesis (truncations, bit flips,
deleted datasets, wrong dtypes and versions)."""
import os
import random
import shutil

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import nndb
from nndb import api as nndb_api
from nndb.api import inspect as queries
from nndb.errors import TraceError
from nndb.store.reader import TraceReader
from nndb.store.writer import TraceWriter
from nndb.tracer.recorder import StepRecord


def _write_good(path: str, steps: int = 40) -> None:
    w = TraceWriter(path, {"script": "x.py", "argv": ["x.py"]}, flush_steps=7, flush_secs=1e9)
    for i in range(steps):
        names = [("a", "act"), ("w", "param"), ("w", "grad"), ("loss", "loss")]
        row = [10, 10.0 * i, 10.0 * i * i, i, i, 10.0 * i, 0, 0, 0]
        w.append(StepRecord(i, i * 0.1, 1, 1, names, np.array([row] * len(names), dtype=float)))
        if i % 9 == 0:
            w.event("rule_disabled", f"at {i}", i)
            w.event("finding", "m", i, {"rule": "r", "severity": "error", "step": i, "message": "m", "evidence": {}})
            w.event("stop", "watchpoint", i, {"step": i, "reason": "watchpoint", "id": 1, "detail": {}})
    w.hyper(0, "opt", 0, 0.1)
    w.close("finished", 0)


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("good") / "good.h5")
    _write_good(path)
    return path


def _read_everything(path: str) -> None:
    """What inspect, inspect --series and check-trace read."""
    with TraceReader(path) as t:
        queries.summary(t)
        for s in t.series():
            t.history(s, "norm")
        t.all_stats()
        for i in range(t.n_steps):
            t.row(i)
        t.optimizers(), t.hyper(), t.events(), t.lineage_steps()
    _read_through_the_api(path)


def _read_through_the_api(path: str) -> None:
    """What nndb.open(PATH) gives a notebook: the same reader, so the same one error."""
    with nndb_api.open(path) as t:
        t._repr_html_(), t.findings._repr_html_(), t.stops, t.meta, t.end
        for x in t.tensors:
            t.series(x.name, x.kind, "mean"), t.history(x.name, x.kind, "norm")
        for step in set(t.steps.tolist()):
            t.stats(step)


def _edit(good, where, fn):
    path = str(where)
    shutil.copy(good, path)
    fn(path)
    return path


def _h5(fn):
    def edit(path):
        with h5py.File(path, "r+") as f:
            fn(f)
    return edit


def _bytes(fn):
    def edit(path):
        data = bytearray(open(path, "rb").read())
        data = fn(data)
        with open(path, "wb") as fh:
            fh.write(bytes(data))
    return edit


def _flips(n, seed):
    def flip(data):
        rng = random.Random(seed)
        for _ in range(n):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        return data
    return flip


def _replace(name, **kw):
    def edit(f):
        del f[name]
        f.create_dataset(name, **kw)
    return _h5(edit)


def _nan_steps(f, value=float("nan")):
    step = np.asarray(f["steps/step"][()], dtype=np.float64)
    step[1] = value
    del f["steps/step"]
    f.create_dataset("steps/step", data=step, maxshape=(None,))


BAD = {
    "empty file": _bytes(lambda d: bytearray()),
    "truncated to 8 bytes": _bytes(lambda d: d[:8]),
    "truncated to a third": _bytes(lambda d: d[:len(d) // 3]),
    "signature then garbage": _bytes(lambda d: d[:8] + bytearray(random.Random(1).randbytes(len(d) - 8))),
    "superblock wiped": _bytes(lambda d: bytearray(64) + d[64:]),
    "50 bit flips": _bytes(_flips(50, 2)),
    "50 other bit flips": _bytes(_flips(50, 3)),
    "stats deleted": _h5(lambda f: f.__delitem__("stats")),
    "steps/step deleted": _h5(lambda f: f["steps"].__delitem__("step")),
    "series deleted": _h5(lambda f: f.__delitem__("series")),
    "stats of integers": _replace("stats", data=np.zeros((3, 2, 10), dtype="i4")),
    "stats of two dimensions": _replace("stats", data=np.zeros((3, 2))),
    "series of floats": _replace("series", data=np.zeros(5)),
    "meta not JSON": _replace("meta", data=np.frombuffer(b"{nope", dtype=np.uint8)),
    "meta a JSON list": _replace("meta", data=np.frombuffer(b"[1, 2]", dtype=np.uint8)),
    "series line not the schema's": _replace("series", data=np.frombuffer(b'{"id": 5, "name": 1}\n', dtype=np.uint8)),
    "schema version 0": _h5(lambda f: f.attrs.__setitem__("schema_version", 0)),
    "schema version 99": _h5(lambda f: f.attrs.__setitem__("schema_version", 99)),
    "schema version a string": _h5(lambda f: f.attrs.__setitem__("schema_version", "one")),
    "schema version 1.5": _h5(lambda f: f.attrs.__setitem__("schema_version", 1.5)),
    "schema version 0.5": _h5(lambda f: f.attrs.__setitem__("schema_version", 0.5)),
    "steps/step NaN": _h5(lambda f: _nan_steps(f)),
    "steps/step fractional": _h5(lambda f: _nan_steps(f, 0.5)),
    "columns attribute wrong": _h5(lambda f: f["stats"].attrs.__setitem__("columns", '["x"]')),
    "committed counts negative": _h5(lambda f: f["committed"].__setitem__(0, -5)),
    "end not an object": _replace("end", data=np.frombuffer(b'"done"', dtype=np.uint8), maxshape=(None,)),
}


@pytest.mark.parametrize("what", sorted(BAD))
def test_a_damaged_trace_is_one_trace_error(good, tmp_path, what):
    path = _edit(good, tmp_path / "bad.h5", BAD[what])
    with pytest.raises(TraceError) as e:
        _read_everything(path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("what", ["truncated to 8 bytes", "signature then garbage", "50 bit flips",
                                  "stats of integers", "schema version 0", "meta a JSON list"])
def test_inspect_and_check_trace_say_one_line_and_exit_2(good, tmp_path, what):
    path = _edit(good, tmp_path / "bad.h5", BAD[what])
    for args in (["inspect", path], ["inspect", path, "--series", "w"], ["check-trace", path]):
        r = nndb(*args, timeout=600)
        assert r.returncode == 2, (what, args, r.stderr)
        assert r.stderr.startswith("nndb: error: ") and r.stderr.count("\n") == 1, r.stderr
        assert path in r.stderr and "upgrade" not in r.stderr


def test_steps_of_nan_are_one_line_in_every_reader(good, tmp_path):
    """Issue 41: NaN step numbers were exit 3 'internal error' in inspect,
    check-trace, plot and export, and nndb.open gave them back as steps."""
    path = _edit(good, tmp_path / "bad.h5", BAD["steps/step NaN"])
    for args in (["inspect", path], ["check-trace", path], ["plot", path, "-o", str(tmp_path / "p.png")],
                 ["export", path, "--tensorboard", str(tmp_path / "tb")]):
        r = nndb(*args, timeout=600)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.startswith("nndb: error: ") and r.stderr.count("\n") == 1, r.stderr
        assert "steps/step holds a value that is not a whole number" in r.stderr
    import nndb as api
    with pytest.raises(TraceError, match="not a whole number"):
        api.open(path)


def test_a_newer_fractional_schema_version_is_refused_as_newer(good, tmp_path):
    path = _edit(good, tmp_path / "v15.h5", BAD["schema version 1.5"])
    with pytest.raises(TraceError, match=r"has trace schema version 1.5; this nndb reads version 1 \(upgrade"):
        TraceReader(path)


def test_schema_version_0_is_not_told_to_upgrade(good, tmp_path):
    path = _edit(good, tmp_path / "v0.h5", BAD["schema version 0"])
    with pytest.raises(TraceError) as e:
        TraceReader(path)
    assert "upgrade" not in str(e.value) and "version 0" in str(e.value)


def test_the_good_trace_reads(good):
    _read_everything(good)          # (the damage above is what fails, not the reading)


_FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


@_FUZZ
@given(data=st.data())
def test_fuzzed_traces_read_or_raise_trace_error(good, tmp_path_factory, data):
    raw = bytearray(open(good, "rb").read())
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(raw))), label="truncate at")
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(0, 7)), max_size=60),
                      label="bit flips")
    for i, bit in flips:
        raw[i] ^= 1 << bit
    if cut is not None:
        raw = raw[:cut]
    path = str(tmp_path_factory.mktemp("fuzz") / "t.h5")
    with open(path, "wb") as fh:
        fh.write(bytes(raw))
    try:
        _read_everything(path)
    except TraceError as e:
        assert "\n" not in str(e)


_EDITS = {
    "delete": lambda f, name: f.__delitem__(name),
    "as int8": lambda f, name: _swap(f, name, "i1"),
    "as float32": lambda f, name: _swap(f, name, "f4"),
    "as 2-D": lambda f, name: _swap(f, name, None, ndim=2),
    "empty": lambda f, name: _swap(f, name, None, empty=True),
}
_NAMES = ["meta", "series", "events", "end", "stats", "committed", "optimizers", "hyper", "steps/step",
          "steps/time", "steps/partial", "lineage/step", "lineage/sequences", "steps"]


def _swap(f, name, dtype, ndim=1, empty=False):
    old = f[name]
    if not isinstance(old, h5py.Dataset):
        del f[name]
        f[name] = np.zeros(3)
        return
    data = np.asarray(old[()])
    if empty:
        data = data[:0] if data.ndim else data
    if dtype is not None:
        data = data.astype(dtype)
    if ndim == 2:
        data = data.reshape(1, -1)
    del f[name]
    f.create_dataset(name, data=data)


@_FUZZ
@given(edits=st.lists(st.tuples(st.sampled_from(sorted(_EDITS)), st.sampled_from(_NAMES)), min_size=1, max_size=3),
       version=st.sampled_from([None, 0, -1, 1, 2, 99]))
def test_edited_traces_read_or_raise_trace_error(good, tmp_path_factory, edits, version):
    path = str(tmp_path_factory.mktemp("edit") / "t.h5")
    shutil.copy(good, path)
    with h5py.File(path, "r+") as f:
        for what, name in edits:
            if name in f:
                _EDITS[what](f, name)
        if version is not None:
            f.attrs["schema_version"] = version
    try:
        _read_everything(path)
    except TraceError as e:
        assert "\n" not in str(e)
