"""A trace at scale: 2000 small Linear layers (14,000 series) store what is
measured, compressed (docs/inspect.md and docs/performance.md state the bytes per step)."""
import os

import h5py
import numpy as np

from conftest import ROOT, nndb
from nndb.store.reader import TraceReader
from nndb.store.writer import TraceWriter
from nndb.tracer.recorder import StepRecord

MANY = os.path.join(ROOT, "tests", "scripts", "store_many_layers.py")


def test_a_2000_layer_model_stores_a_fraction_of_its_float64_statistics(tmp_path):
    path = str(tmp_path / "many.h5")
    r = nndb("run", "--batch", "--quiet", "--trace", path, MANY, "--layers", "2000", "--steps", "6", timeout=900)
    assert r.returncode == 0, r.stderr
    with TraceReader(path) as t:
        n, s = t.n_steps, len(t.series())
        assert n == 6 and s == 14002          # weight and bias: param, grad, update; 2000 acts; the loss
        stats = t.all_stats()
    with h5py.File(path, "r") as f:
        stored = f["stats"].id.get_storage_size()
    dense = n * s * 10 * 8                     # every column as float64: 1.12 MB a step
    assert stored < dense / 4, (stored, dense)
    assert np.isfinite(stats[:, :, 5]).sum() > 0.9 * n * s - 2000 * (n - 1)   # the norms are all there


def _slow_run(path, n_series=4000, steps=48):
    """A large model's steps outlast --flush-secs: a flush at every step's append."""
    w = TraceWriter(path, {}, flush_secs=0)
    names = [(f"l{j}.weight", "param") for j in range(n_series)]
    rng = np.random.default_rng(0)
    for step in range(steps):
        raw = np.full((n_series, 9), np.nan)
        raw[:, 0] = 16
        raw[:, 2] = rng.random(n_series)        # the norm's sum of squares: 8 random bytes per series
        raw[:, 7:9] = 0
        w.append(StepRecord(step, step * 0.1, 1, 1, names, raw))
    w.close("finished", 0)
    with TraceReader(path) as t:
        assert t.n_steps == steps
        np.testing.assert_array_equal(t.steps, np.arange(steps))
        np.testing.assert_array_equal(t.all_stats()[:, :, 0], 16)
    return os.path.getsize(path) / steps


def test_a_flush_every_step_writes_each_chunk_once(tmp_path):
    """The file must not grow by rewritten chunks: steps wait for their stats chunk to fill."""
    per_step = _slow_run(str(tmp_path / "w.h5"))
    assert per_step < 3 * 8 * 4000, per_step       # dense float64 would be 10 * 8 * n_series


def test_steps_held_past_hold_secs_are_written_with_their_chunk_part_full_once(tmp_path, monkeypatch):
    from nndb.store import writer as W
    once = _slow_run(str(tmp_path / "once.h5"))
    monkeypatch.setattr(W, "HOLD_SECS", 0.0)       # (a step longer than that: every chunk written part-full)
    part_full = _slow_run(str(tmp_path / "part.h5"))
    assert once < part_full < 1.6 * once, (once, part_full)     # (each chunk: its first step, then whole)
