"""``nndb export`` on long traces: each param group's learning rate at every
step, the same things live (``nndb run --export``) as offline, a progress
line on a terminal, and Ctrl-C: exit 130 with no partial event file left."""
import os
import pty
import signal
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, nndb
from nndb.store.writer import TraceWriter
from nndb.tracer import stats as S
from nndb.tracer.recorder import StepRecord

ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")


def events(logdir) -> "ea.EventAccumulator":
    acc = ea.EventAccumulator(str(logdir), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0, ea.HISTOGRAMS: 0})
    acc.Reload()
    return acc


def write_trace(path, steps, n_series, lr_changes=((0, 0.1),)):
    """A trace of ``steps`` steps of ``n_series`` gradients and a loss, with
    the learning rate rows ``lr_changes`` ((step, lr), ...)."""
    rng = np.random.default_rng(0)
    names = [(f"layer{i}.weight", "grad") for i in range(n_series)] + [("loss", "loss")]
    w = TraceWriter(path, {"script": "x.py", "argv": ["x.py"], "start_time": 1.0e9}, flush_steps=500)
    changes = dict(lr_changes)
    for i in range(steps):
        if i in changes:
            w.hyper(i, "opt", 0, changes[i])
        grads = rng.normal(size=8 * n_series).astype(np.float32)     # (n_series arrays of 8, one draw)
        raw = np.concatenate([S.host_raw_segments(grads, np.full(n_series, 8)), [S.scalar_raw(2.0 - 0.001 * i)]])
        w.append(StepRecord(i, 0.01 * i, 1, 1, names, raw))
    w.close("finished", 0)
    return path


def test_the_learning_rate_is_exported_at_every_step(tmp_path):
    trace = write_trace(str(tmp_path / "t.h5"), 30, 2, lr_changes=((0, 0.1), (10, 0.05), (20, 0.025)))
    p = nndb("export", trace, "--tensorboard", str(tmp_path / "tb"))
    assert p.returncode == 0, p.stderr
    lr = {e.step: e.value for e in events(tmp_path / "tb").Scalars("hyper/opt.group0/lr")}
    assert sorted(lr) == list(range(30))
    assert [lr[s] for s in (0, 9, 10, 19, 20, 29)] == [np.float32(x) for x in (0.1, 0.1, 0.05, 0.05, 0.025, 0.025)]


def test_live_and_offline_exports_carry_the_same_tags(tmp_path):
    script = os.path.join(SCRIPTS, "watches_lr_jump.py")
    trace, live = str(tmp_path / "t.h5"), tmp_path / "live"
    p = nndb("run", "--batch", "--rules", "none", "--full-every", "4", "--trace", trace,
             "--export", f"tensorboard:{live}", script, "--steps", "24")
    assert p.returncode == 0, p.stderr
    assert nndb("export", trace, "--tensorboard", str(tmp_path / "off"), "--rules", "none").returncode == 0
    on, off = events(live), events(tmp_path / "off")
    assert set(on.Tags()["scalars"]) == set(off.Tags()["scalars"])
    assert set(on.Tags()["histograms"]) == set(off.Tags()["histograms"]) != set()
    lr = {e.step: e.value for e in on.Scalars("hyper/optimizer.group0/lr")}
    assert sorted(lr) == list(range(24)) and lr[19] == np.float32(0.05) and lr[20] == np.float32(5.0)


@pytest.mark.real_subprocess
def test_ctrl_c_ends_an_export_with_130_and_leaves_no_partial_event_file(tmp_path):
    trace = write_trace(str(tmp_path / "big.h5"), 4000, 120)
    out = tmp_path / "tb"
    out.mkdir()
    (out / "keep.txt").write_text("not nndb's")
    master, slave = pty.openpty()          # stderr a terminal: the progress line shows
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen([sys.executable, "-m", "nndb", "export", trace, "--tensorboard", str(out),
                             "--rules", "none"], stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL,
                            env=env, text=True)
    os.close(slave)
    seen = b""
    try:
        while b"nndb: exporting to tensorboard:" not in seen:     # the first progress line: mid-export
            chunk = os.read(master, 4096)
            assert chunk, seen
            seen += chunk
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=120)
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    text = seen.decode(errors="replace")
    assert rc == 130, text
    assert "nndb: export interrupted (Ctrl-C)" in text and "Aborted!" not in text and "Traceback" not in text
    assert " series and histograms (" in text
    assert sorted(os.listdir(out)) == ["keep.txt"]          # the partial event file removed, nothing else
    assert proc.stdout.read() == ""                          # (no "exported" line)


def test_the_count_line_waits_a_second_then_draws_four_times_a_second_at_most():
    from nndb.debugger.progress import CLEAR, CountLine
    now, out = [100.0], []
    line = CountLine("nndb: exporting to tensorboard:/x", "series and histograms", write=out.append,
                     clock=lambda: now[0])
    line.update(1, 40)                       # (the first second: nothing)
    now[0] += 1.0
    line.update(10, 40)
    line.update(11, 40)                      # (within the interval: nothing)
    now[0] += 0.25
    line.update(30, 40)
    assert out == [f"{CLEAR}nndb: exporting to tensorboard:/x: 10/40 series and histograms (25%)\r",
                   f"{CLEAR}nndb: exporting to tensorboard:/x: 30/40 series and histograms (75%)\r"]
    line.clear()
    assert out[-1] == CLEAR and not line.shown


def test_the_runs_nndb_options_are_kept_and_exported(tmp_path):
    trace = str(tmp_path / "t.h5")
    p = nndb("run", "--batch", "-q", "--rules", "none", "--every", "2", "--trace", trace,
             os.path.join(SCRIPTS, "watches_lr_jump.py"), "--steps", "4")
    assert p.returncode == 0, p.stderr
    from nndb.store.reader import TraceReader
    with TraceReader(trace) as r:
        assert r.meta["nndb_argv"] == ["--trace", trace, "--every", "2", "--quiet", "--batch", "--rules", "none"]
        assert r.meta["argv"][1:] == ["--steps", "4"]
    assert nndb("export", trace, "--tensorboard", str(tmp_path / "tb")).returncode == 0
    (run,) = events(tmp_path / "tb").Tensors("run/text_summary")
    table = run.tensor_proto.string_val[0].decode().replace("\\", "")
    assert f"| nndb_argv | --trace {trace} --every 2 --quiet --batch --rules none |" in table
    assert "| argv | " in table and "--steps 4 |" in table
