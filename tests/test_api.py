"""The Python API (nndb.open, nndb.record): on a finished, a live and a killed
trace, in-process recording against ``nndb run --batch``, the optional
pandas, and the notebook HTML."""
import builtins
import json
import os
import re
import runpy
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import nndb
from conftest import ROOT, Ran, nndb as run_nndb, nndb_started, python
from nndb.errors import NndbError, TraceError, UsageError
from nndb.text import json_value
from nndb.store.reader import TraceReader

SCRIPTS = os.path.join(ROOT, "tests", "scripts")
LOOP = os.path.join(SCRIPTS, "api_loop.py")
STEPS = 12
sys.path.insert(0, SCRIPTS)
import api_loop  # noqa: E402


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """``nndb run --batch`` of tests/scripts/api_loop.py: its trace's path."""
    path = str(tmp_path_factory.mktemp("api") / "run.h5")
    r = Ran(run_nndb("run", "--batch", "-q", "--trace", path, LOOP, str(STEPS)))
    assert r.returncode == 0, r.stderr
    return path


def inspect_json(*args) -> dict:
    r = Ran(run_nndb("inspect", *args, "--json"))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _json_floats(values) -> list:
    """Values as ``nndb inspect --json`` writes them (None: not measured)."""
    return [None if v is None else float(v) for v in values]


# -- a finished trace -----------------------------------------------------------------------
def test_open_reads_what_nndb_inspect_reports(finished):
    summary = inspect_json(finished)
    with nndb.open(finished) as t:
        assert t.meta == summary["meta"] and t.status == summary["status"] == "finished"
        assert t.end == summary["end"]
        assert t.steps.dtype == np.int64 and t.steps.tolist() == list(range(STEPS)) == list(range(summary["steps"]))
        recorded = {(x["name"], x["kind"]) for x in summary["tensors"]}
        assert {(x.name, x.kind) for x in t.tensors} == recorded
        for name, kind, stat in (("loss", "loss", "mean"), ("0.weight", "grad", "norm"), ("2", "act", "zero_frac")):
            data = inspect_json(finished, "--series", name, "--kind", kind, "--stat", stat)
            [s] = data["series"]
            steps, values = t.history(name, kind, stat)
            measured = [(st, v) for st, v in zip(s["steps"], s["values"]) if v is not None]
            assert steps.tolist() == [st for st, _ in measured]
            assert values.tolist() == [v for _, v in measured]


def test_series_is_indexed_by_position_in_steps(finished):
    with nndb.open(finished) as t, TraceReader(finished) as reader:
        [info] = reader.find("0.weight", "grad")
        steps, block = reader.history(info)
        # (full steps: every 32nd recorded step, so 'mean' at step 0 only; 'norm' at every step)
        mean = t.series("0.weight", kind="grad", stat="mean")
        assert mean.shape == t.steps.shape and mean[0] == block[0, reader.columns.index("mean")]
        assert np.isnan(mean[1:]).all()
        norm = t.series("0.weight")                       # kind grad, stat norm by default
        assert norm.tolist() == block[:, reader.columns.index("norm")].tolist()
        assert t.history("0.weight", "grad", "mean")[0].tolist() == [0]


def test_stats_of_one_step_are_plain_data(finished):
    with nndb.open(finished) as t:
        s = t.stats(3)
        assert set(s) == {"loss", "param", "grad", "update", "act"}
        assert s["loss"]["loss"]["mean"] == t.series("loss", "loss", "mean")[3]
        assert s["grad"]["2.bias"]["norm"] == t.series("2.bias")[3]
        assert s["grad"]["2.bias"]["mean"] is None            # not measured between full steps
        json.dumps(s)                                          # plain: JSON takes it as it is
        [w] = [x for x in t.tensors if x.name == "2.weight" and x.kind == "grad"]
        assert w.shape == (1, 16) and w.module == "2"
        assert [x.module for x in t.tensors if x.kind == "loss"] == [None]


@pytest.mark.parametrize("call, message", [
    (lambda t: t.stats(99), "step 99 was not recorded"),
    (lambda t: t.series("nope"), "no grad series 'nope'"),
    (lambda t: t.series("2", kind="grad"), "it is recorded as act"),
    (lambda t: t.series("loss", kind="loss", stat="median"), "unknown statistic 'median'"),
    (lambda t: t.series("loss", kind="weights"), "unknown kind 'weights'"),
])
def test_bad_questions_get_one_line(finished, call, message):
    with nndb.open(finished) as t:
        with pytest.raises(UsageError) as e:
            call(t)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_closed_trace_says_it_was_closed(finished):
    """After close() (or its 'with' block) a read said the file was corrupted ("cannot read trace
    ...: it is corrupted (Unable to synchronously open object ...)"), and the readers of the optional
    groups answered as if the trace kept nothing: histogram() None, histogram_steps() [], lineage_steps
    [], full_tensors() [] (h5py's closed File answers get() with None)."""
    with nndb.open(finished) as t:
        kept = t.histogram_steps("2.weight", "grad")
        assert kept and t.histogram("2.weight", "grad", kept[0]) is not None
    for call in (lambda: t.series("loss", "loss"), lambda: t.stats(3), lambda: t.histogram_steps("2.weight", "grad"),
                 lambda: t.histogram("2.weight", "grad", kept[0]), lambda: t.full_tensors(),
                 lambda: t.lineage_steps, lambda: t.tensor("2.weight", "grad", 0)):
        with pytest.raises(UsageError) as e:
            call()
        assert not isinstance(e.value, TraceError)
        assert str(e.value).startswith(f"trace {finished} was closed") and "\n" not in str(e.value)
    t.close()                                               # (again: nothing to do)
    assert t.steps[0] == 0 and t.status == "finished"      # what open() read stays
    assert t.refresh().series("loss", "loss")[3] > 0        # refresh() opens the file again
    t.close()


def test_what_is_not_a_trace_is_one_error(tmp_path):
    (tmp_path / "x.h5").write_text("hello")
    for path in (tmp_path / "x.h5", tmp_path / "missing.h5"):
        with pytest.raises(TraceError):
            nndb.open(path)


# -- live and killed ---------------------------------------------------------------------------
def _paused_run(tmp_path, pause_at: int, *extra):
    """``nndb run --batch`` of the loop, which waits after step ``pause_at``
    until the test lets it go; (process, trace, go file)."""
    trace, ready, go = (str(tmp_path / n) for n in ("run.h5", "ready", "go"))
    env = {"NNDB_TEST_API_PAUSE_AT": str(pause_at), "NNDB_TEST_API_READY": ready, "NNDB_TEST_API_GO": go}
    proc = nndb_started("run", "--batch", "-q", "--flush-every", "1", "--trace", trace, *extra, LOOP, str(STEPS),
                        env=env)
    deadline = time.monotonic() + 120
    while not os.path.exists(ready):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never reached its pause"
        time.sleep(0.05)
    return proc, trace, go


def test_a_live_trace_opens_and_grows(tmp_path):
    report = str(tmp_path / "report.json")
    proc, trace, go = _paused_run(tmp_path, 5, "--report", report, "-e", "break step 2")
    try:
        with nndb.open(trace) as t:
            assert t.status == "incomplete" and t.end is None
            live_steps = t.steps.tolist()
            assert live_steps == list(range(len(live_steps))) and len(live_steps) >= 5
            loss = t.series("loss", "loss", "mean")
            assert len(loss) == len(live_steps) and np.isfinite(loss).all()
            assert [s["step"] for s in t.stops] == [2]          # the stop at step 2, flushed
            open(go, "w").close()
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            t.refresh()
            assert t.status == "finished" and t.steps.tolist() == list(range(STEPS))
            assert t.series("loss", "loss", "mean")[:len(loss)].tolist() == loss.tolist()
            assert t.stops == json.load(open(report))["stops"]  # the trace keeps what the report says
            from nndb.api.inspect import summary
            assert summary(t.reader)["events"] == []             # nndb inspect lists warnings only, as before
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_killed_run_s_trace_opens(tmp_path):
    proc, trace, _ = _paused_run(tmp_path, 6, "-e", "break step 1")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    with nndb.open(trace) as t:
        assert t.status == "incomplete" and t.end is None
        n = len(t.steps)
        assert t.steps.tolist() == list(range(n)) and n >= 6
        assert np.isfinite(t.series("0.weight", "param", "norm")).all()
        assert [s["step"] for s in t.stops] == [1]
        assert t.stats(n - 1)["loss"]["loss"]["count"] == 1


# -- in-process recording ----------------------------------------------------------------------
def test_record_gives_the_trace_nndb_run_batch_gives(tmp_path, finished):
    path = str(tmp_path / "inproc.h5")
    with nndb.record(path) as rec:
        model, opt, x, y = api_loop.build()
        api_loop.loop(model, opt, x, y, 5)
        live = rec.open()
        assert live.steps.tolist() == list(range(5)) and live.status == "incomplete"  # through the writer
        api_loop.loop(model, opt, x, y, STEPS - 5)
        assert live.refresh().steps.tolist() == list(range(STEPS))
    assert rec.status == "finished" and rec.findings == []
    assert live.refresh().status == "finished"                 # the writer closed: the file
    t, run = rec.trace, nndb.open(finished)
    assert t.steps.tolist() == run.steps.tolist()
    assert [(x.name, x.kind, x.shape) for x in t.tensors] == [(x.name, x.kind, x.shape) for x in run.tensors]
    for stat in run.columns:
        a, b = t.series("loss", "loss", stat), run.series("loss", "loss", stat)
        assert a.tobytes() == b.tobytes(), stat                   # bit for bit
    assert np.array_equal(t.reader.all_stats(), run.reader.all_stats(), equal_nan=True)
    assert t.meta["in_process"] is True and t.meta["script"] == os.path.abspath(__file__)
    run.close()


def test_record_around_a_model_made_before_the_block(tmp_path, finished):
    """A notebook's usual order: model and optimizer in one cell, the loop in another."""
    stale = api_loop.build()                        # an earlier cell's optimizer, still alive
    model, opt, x, y = api_loop.build()
    with nndb.record(tmp_path / "t.h5") as rec:
        api_loop.loop(model, opt, x, y, STEPS)
    t, run = rec.trace, nndb.open(finished)
    assert t.steps.tolist() == list(range(STEPS))
    assert t.reader.backward_count.tolist() == t.reader.optimizer_steps.tolist() == [1] * STEPS
    assert np.array_equal(t.reader.all_stats(), run.reader.all_stats(), equal_nan=True)
    run.close()
    del stale


def test_record_a_gan_whose_optimizers_were_made_before_the_block(tmp_path):
    """A notebook's GAN: both optimizers made in an earlier cell.  Only the
    discriminator's was counted at its first step (an optimizer alive before
    the block counted once it stepped), so step 0 ended after it alone: 9
    steps for 8 iterations, each step holding one iteration's discriminator
    loss and the iteration before's generator loss (step 3's loss/optG
    0.6911, iteration 2's), the first series named 'loss'.  An earlier
    optimizer over a model the block calls is the block's."""
    import torch
    torch.manual_seed(0)
    G, D = torch.nn.Linear(4, 2), torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optD, optG = torch.optim.Adam(D.parameters(), 1e-3), torch.optim.Adam(G.parameters(), 2e-3)
    bce = torch.nn.BCEWithLogitsLoss()
    printed = []
    with nndb.record(tmp_path / "t.h5") as rec:
        for _ in range(8):
            fake = G(torch.randn(16, 4))
            optD.zero_grad()
            errD = bce(D(torch.randn(16, 2) + 3), torch.ones(16, 1)) + bce(D(fake.detach()), torch.zeros(16, 1))
            errD.backward()
            optD.step()
            optG.zero_grad()
            errG = bce(D(fake), torch.ones(16, 1))
            errG.backward()
            optG.step()
            printed.append((errD.item(), errG.item()))
    t = rec.trace
    assert t.steps.tolist() == list(range(8)) and not t.partial.any()
    assert sorted(x.name for x in t.tensors if x.kind == "loss") == ["loss/optD", "loss/optG"]
    assert t.series("loss/optD", "loss", "mean").tolist() == [d for d, _ in printed]
    assert t.series("loss/optG", "loss", "mean").tolist() == [g for _, g in printed]


HAND_WRITTEN = """
import json, sys
import torch
import nndb
sys.path.insert(0, sys.argv[2])
import api_loop
earlier = api_loop.build() if sys.argv[3] == "earlier" else None
torch.manual_seed(0)
w, x = torch.nn.Linear(4, 1), torch.randn(16, 4)
holds = torch.optim.SGD(w.parameters(), 0.1) if sys.argv[3] == "holds" else None
losses = []
with nndb.record(sys.argv[1]) as rec:
    for _ in range(4):
        loss = w(x).pow(2).mean()
        loss.backward()
        losses.append(loss.item())
        with torch.no_grad():
            for p in w.parameters():
                p -= 0.1 * p.grad
                p.grad = None
t = rec.trace
print(json.dumps([t.reader.backward_count.tolist(), t.series("loss", "loss", "mean").tolist(), losses]))
"""


def _hand_written_updates(path, earlier: str):
    """In a process of its own: no optimizer of another test is alive there
    (a child of the zygote, which made none)."""
    script = os.path.join(os.path.dirname(str(path)), f"hand_written_{earlier}.py")
    with open(script, "w") as fh:
        fh.write(HAND_WRITTEN)
    out = python(script, str(path), SCRIPTS, earlier, forked=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_record_hand_written_updates(tmp_path):
    """Each backward is a step, as under nndb run, with each its own loss;
    also with an optimizer made before the block alive that holds none of
    the loop's parameters (it had made the first two iterations step 0).
    Only an earlier optimizer over the loop's own parameters that never
    steps leaves the first two iterations as step 0 (docs/steps.md)."""
    for earlier in ("none", "earlier"):
        counts, recorded, losses = _hand_written_updates(tmp_path / f"{earlier}.h5", earlier)
        assert counts == [1, 1, 1, 1]
        np.testing.assert_allclose(recorded, losses, rtol=1e-6)
    counts, recorded, losses = _hand_written_updates(tmp_path / "holds.h5", "holds")
    assert counts == [2, 1, 1]
    np.testing.assert_allclose(recorded[1:], losses[2:], rtol=1e-6)


def test_docs_example_runs(tmp_path, monkeypatch, capsys):
    text = open(os.path.join(ROOT, "docs", "api.md")).read()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/api.md", "exec"), {"__name__": "docs_api"})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[]" and out[1] == "<nndb.Trace 'run.h5': 40 step(s), finished, 17 series>"
    assert out[3] == "[ 0 32]"


def test_record_keeps_the_findings_of_a_planted_bug(tmp_path, monkeypatch, capsys):
    script = os.path.join(SCRIPTS, "planted_dead_relu_negative_bias.py")
    monkeypatch.setattr(sys, "argv", [script])
    with nndb.record(tmp_path / "t.h5") as rec:
        runpy.run_path(script, run_name="__main__")
    rules = {f["rule"] for f in rec.findings}
    assert "dead_relu" in rules                                  # a probe's rule: only a live run has it
    assert ": dead_relu at step" in capsys.readouterr().err     # printed as nndb run prints it
    assert rec.trace.findings == json_value(rec.findings)         # as the report writes them
    html = rec.findings._repr_html_()
    assert html.startswith("<table>") and "dead_relu" in html


def test_lineage_of_a_step(tmp_path):
    with nndb.record(tmp_path / "t.h5", lineage="1") as rec:
        api_loop.train(3)
    t = rec.trace
    assert t.lineage_steps == [1] and t.lineage(0) is None
    ops = t.lineage(1)["ops"]
    assert t.lineage(1)["step"] == 1 and {op[6] for op in ops} >= {"0", "2"}   # the Linear layers' ops
    assert any(op[1] == "backward" for op in ops)


def test_record_refuses_to_overwrite(tmp_path):
    other = tmp_path / "notes.h5"
    other.write_text("mine")
    for force in (False, True):
        with pytest.raises(UsageError, match="not an nndb trace"):
            nndb.record(other, force=force)
    assert other.read_text() == "mine"
    path = tmp_path / "t.h5"
    with nndb.record(path):
        api_loop.train(2)
    with pytest.raises(UsageError, match=r"force=True to overwrite"):
        nndb.record(path)
    with nndb.record(path, force=True):
        api_loop.train(3)
    assert len(nndb.open(path).steps) == 3


def test_record_closes_the_trace_when_the_loop_raises(tmp_path):
    path = str(tmp_path / "t.h5")
    with pytest.raises(RuntimeError, match="planted"):
        with nndb.record(path) as rec:
            api_loop.train(3)
            raise RuntimeError("planted failure")
    t = rec.trace
    assert t.status == "failed" and t.end["reason"] == "RuntimeError: planted failure"
    assert t.steps.tolist() == [0, 1, 2]
    assert [(s["step"], s["reason"], s["detail"]) for s in t.stops] == \
        [(3, "exception", {"exception": "RuntimeError", "message": "planted failure"})]   # during step 3
    import h5py
    with h5py.File(path, "r"):                  # closed: a plain (not SWMR) open works
        pass


def test_record_never_breaks_the_loop(tmp_path, monkeypatch):
    expected = api_loop.train(4)
    from nndb.tracer.recorder import StepRecorder

    def broken(self, *a, **kw):
        raise ValueError("boom")
    monkeypatch.setattr(StepRecorder, "activation", broken)
    with nndb.record(tmp_path / "t.h5") as rec:
        loss = api_loop.train(4)
    assert loss == expected
    assert [e["kind"] for e in rec.trace.events] == ["recording_stopped"]


def test_nndb_failing_to_end_the_recording_is_one_line(tmp_path, monkeypatch, capsys):
    from nndb.run.runner import Recording

    def broken(self, *a):
        raise OSError("disk gone")
    monkeypatch.setattr(Recording, "close", broken)
    with nndb.record(tmp_path / "t.h5"):
        loss = api_loop.train(2)
    assert loss == api_loop.train(2)               # the block's own outcome: it returned
    err = capsys.readouterr().err
    assert "nndb: internal error while ending the recording: OSError: disk gone" in err
    with pytest.raises(ValueError, match="mine"):   # and an exception of the block stays the block's
        with nndb.record(tmp_path / "u.h5"):
            raise ValueError("mine")


def test_steps_cannot_be_changed_through_the_api(finished):
    with nndb.open(finished) as t:
        with pytest.raises(ValueError):
            t.steps[0] = 5
        assert t.steps[0] == 0


def test_record_bad_options_fail_before_recording(tmp_path):
    with pytest.raises(UsageError, match="--every"):
        nndb.record(tmp_path / "t.h5", every=0)
    with pytest.raises(NndbError):
        nndb.record(tmp_path / "t.h5", rules=str(tmp_path / "missing.yaml"))
    assert not (tmp_path / "t.h5").exists()


# -- pandas, HTML, import cost -------------------------------------------------------------------
def test_to_pandas(finished):
    pd = pytest.importorskip("pandas")
    with nndb.open(finished) as t:
        df = t.to_pandas()
        assert isinstance(df, pd.DataFrame) and df.index.tolist() == t.steps.tolist()
        assert np.array_equal(df[("grad", "0.weight", "norm")].to_numpy(), t.series("0.weight"), equal_nan=True)
        assert df.shape[1] == len(t.tensors) * len(t.columns)


def test_to_pandas_without_pandas_says_what_to_install(finished, monkeypatch):
    real_import = builtins.__import__

    def no_pandas(name, *args, **kw):
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("No module named 'pandas'")
        return real_import(name, *args, **kw)
    monkeypatch.delitem(sys.modules, "pandas", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_pandas)
    with nndb.open(finished) as t:
        with pytest.raises(UsageError) as e:
            t.to_pandas()
    assert str(e.value) == "to_pandas() needs pandas: pip install 'nndb[pandas]'"


def test_html_escapes_what_came_from_the_trace(tmp_path):
    from nndb.store.writer import TraceWriter
    from nndb.tracer.recorder import StepRecord
    hostile = "<script>alert('x')</script>"
    path = str(tmp_path / "t.h5")
    w = TraceWriter(path, {"script": f"<img src=x onerror=alert(1)>.py", "argv": []})
    row = [4, 4.0, 4.0, 1, 1, 2.0, 0, 0, 0]
    w.append(StepRecord(0, 0.1, 1, 1, [(hostile, "act"), ("loss", "loss")], np.array([row, row], dtype=float)))
    w.event("finding", hostile, 0, {"rule": hostile, "severity": "error", "step": 0, "tensor": hostile,
                                    "message": hostile, "evidence": {}})
    w.close("finished", 0)
    with nndb.open(path) as t:
        for html in (t._repr_html_(), t.findings._repr_html_()):
            assert "<script>" not in html and "<img" not in html
            assert "&lt;script&gt;" in html
        assert "1 finding(s)" in t._repr_html_() and [x.name for x in t.tensors if x.kind == "act"] == [hostile]


def test_a_finding_without_its_detail_is_a_corrupted_trace(tmp_path):
    from nndb.store.writer import TraceWriter
    path = str(tmp_path / "t.h5")
    w = TraceWriter(path, {"script": "x.py", "argv": []})
    w.event("finding", "no detail", 0)
    w.close("finished", 0)
    with nndb.open(path) as t:
        assert t.events == []                    # not a warning either
        with pytest.raises(TraceError, match="corrupted"):
            t.findings


def test_a_trace_whose_recording_stopped_says_so_beside_the_runs_status(tmp_path):
    from nndb.store.writer import TraceWriter
    path = str(tmp_path / "t.h5")
    w = TraceWriter(path, {"script": "x.py", "argv": []})
    w.event("recording_stopped", "nndb: internal error in the tracer; recording stopped, training goes on", 3)
    w.close("finished", 0)
    with nndb.open(path) as t:
        assert repr(t).endswith(": 0 step(s), finished, recording stopped at step 3, 0 series>"), repr(t)


def test_import_nndb_is_cheap():
    code = "import sys, nndb; print(sorted(m for m in ('torch', 'h5py', 'numpy', 'nndb.api') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def test_record_keeps_the_findings_of_the_last_steps_in_the_trace(tmp_path, monkeypatch, capsys):
    """The every-step rules judge the steps between observed ones in blocks
    (nndb.rules.block): the findings of a block the run ends in are judged
    before the trace closes, and rec.findings inside the block judges what waits."""
    script = os.path.join(SCRIPTS, "planted_warmup_explodes.py")
    monkeypatch.setattr(sys, "argv", [script, "--steps", "52"])
    with nndb.record(tmp_path / "t.h5") as rec:
        runpy.run_path(script, run_name="__main__")
    late = [f for f in rec.findings if f["step"] > 33]          # (after the last observed step, 32)
    assert "exploding_gradient" in {f["rule"] for f in late}
    assert rec.trace.findings == json_value(rec.findings)


def test_kill_at_a_stop_in_a_recorded_block_ends_the_block_only(tmp_path):
    """`kill` among a point's commands ended a %%nndb cell with KillRun's
    traceback in the notebook; it ends the recorded block (the script's rest
    runs), as it ends a script under nndb run, and the trace says so."""
    import torch

    import nndb
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(64, 8)
    done = []
    with nndb.record(str(tmp_path / "k.h5"), commands=("break step 2", "commands 1", "kill", "end")) as rec:
        for step in range(10):
            opt.zero_grad()
            ((model(x) - x.sum(1, keepdim=True)) ** 2).mean().backward()
            opt.step()
            done.append(step)
    assert done == [0, 1]                         # (step 2 stopped in its optimizer step: killed there)
    assert (rec.status, rec.trace.end["exit_code"], rec.trace.end["reason"]) == ("killed", 0, "killed from the debugger")


@pytest.fixture(scope="module")
def ends_with_a_partial_row(tmp_path_factory):
    """A loop of 4 steps that ends with one more backward() and no step after it: its trace."""
    tmp_path = tmp_path_factory.mktemp("ends")
    script = tmp_path / "ends.py"
    script.write_text("import torch\nm = torch.nn.Linear(3, 1)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                      "for step in range(4):\n    opt.zero_grad()\n    m(torch.randn(5, 3)).pow(2).mean().backward()\n"
                      "    opt.step()\nm(torch.randn(5, 3)).pow(2).mean().backward()     # no step after it\n")
    path = str(tmp_path / "t.h5")
    r = Ran(run_nndb("run", "--batch", "-q", "--trace", path, str(script)))
    assert r.returncode == 0, r.stderr
    return path


def test_partial_marks_the_row_after_the_last_step_end(ends_with_a_partial_row, finished):
    """A script that ends between backward() and step() (word_language_model's evaluation after
    its last step, a loop that raises) leaves that work as one more row: ``steps`` listed it
    with nothing to tell it from a whole step (62 rows for 61 steps)."""
    with nndb.open(ends_with_a_partial_row) as t:
        assert t.steps.tolist() == [0, 1, 2, 3, 4] and t.partial.tolist() == [False] * 4 + [True]
        assert t.steps[~t.partial].tolist() == [0, 1, 2, 3]
        with pytest.raises(ValueError):
            t.partial[0] = True                     # (read-only, as steps)
    with nndb.open(finished) as t:
        assert not t.partial.any() and len(t.partial) == len(t.steps)


def test_stats_history_and_repr_say_a_row_is_partial(ends_with_a_partial_row, finished):
    """t.stats(4) of that evaluation's row gave its gradients as step 4's with nothing to say
    it was no step (the prompt's stats says 'step 4 (partial)'), t.history('weight') gave
    them as step 4's gradient, and repr(t) said '5 step(s)'."""
    with nndb.open(ends_with_a_partial_row) as t:
        at4, at3 = t.stats(4), t.stats(3)
        assert at4.partial and at4.step == 4 and not at3.partial
        assert repr(at4).startswith("StepStats(step 4 (partial), {'loss'") and repr(at3) == repr(dict(at3))
        assert at4["grad"]["weight"]["norm"] == t.series("weight")[4] != at3["grad"]["weight"]["norm"]
        assert "5 step(s) (step 4 partial), finished" in repr(t)
        steps, norms = t.history("weight")             # (the steps' gradients: the evaluation's left off)
        assert steps.tolist() == [0, 1, 2, 3] and norms.tolist() == t.series("weight")[:4].tolist()
        assert t.history("weight", partial=True)[0].tolist() == [0, 1, 2, 3, 4]
    with nndb.open(finished) as t:
        assert f"{STEPS} step(s), finished" in repr(t)


def test_to_pandas_leaves_a_partial_row_off_the_steps(ends_with_a_partial_row):
    """to_pandas() gave the evaluation's row as step 4, its loss and gradients the last
    point of every curve (df.loss.plot(), df.tail(1)), where the exports put that row under
    partial/ and the plots draw it apart."""
    pytest.importorskip("pandas")
    with nndb.open(ends_with_a_partial_row) as t:
        df, every = t.to_pandas(), t.to_pandas(partial=True)
        assert df.index.tolist() == [0, 1, 2, 3] and df.attrs["partial_steps"] == [4]
        assert every.index.tolist() == t.steps.tolist() and every.attrs["partial_steps"] == [4]
        assert np.array_equal(every[("loss", "loss", "mean")].to_numpy(), t.series("loss", "loss"))
        assert np.array_equal(df[("grad", "weight", "norm")].to_numpy(), t.series("weight")[:4])


def test_a_step_between_recorded_ones_is_named_with_its_neighbours(tmp_path):
    """With every=5 the recorded steps are 0, 5, 10, 15: the error for step 3 said
    'recorded steps: 0..15', which reads as if step 3 were among them."""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    with nndb.record(tmp_path / "t.h5", every=5) as rec:
        for _ in range(20):
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
    with nndb.open(tmp_path / "t.h5") as t:
        assert t.steps.tolist() == [0, 5, 10, 15]
        for step, said in ((3, "(recorded steps: 0..15, one in 5; the nearest 0 and 5)"),
                           (99, "(recorded steps: 0..15, one in 5)")):
            with pytest.raises(UsageError) as e:
                t.stats(step)
            assert str(e.value) == f"step {step} was not recorded in {tmp_path / 't.h5'} {said}"


TWO_GROUPS_STEPLR = """
import torch
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD([{"params": m[0].parameters(), "lr": 0.05},
                       {"params": m[2].parameters(), "lr": 0.01, "momentum": 0.9}])
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
x = torch.randn(32, 4)
for step in range(8):
    used = [g["lr"] for g in opt.param_groups]
    opt.zero_grad(); m(x).pow(2).mean().backward(); opt.step(); sched.step()
    print(*used)
"""


def test_the_learning_rates_the_steps_used_are_read_as_inspect_reads_them(tmp_path):
    """`nndb inspect --series lr`, `history lr` at the prompt and the exports' hyper/OPT.groupG/lr
    have each param group's learning rate; the Python API had no way to it (t.series('lr'):
    "no grad series 'lr'").  Trace.learning_rates() gives the same columns."""
    script = tmp_path / "twogroups.py"
    script.write_text(TWO_GROUPS_STEPLR)
    trace = str(tmp_path / "t.h5")
    r = run_nndb("run", "--batch", "-q", "--trace", trace, str(script))
    assert r.returncode == 0, r.stderr
    used = np.array([[float(v) for v in line.split()] for line in r.stdout.splitlines()])
    inspected = json.loads(run_nndb("inspect", trace, "--series", "lr", "--json").stdout)["series"]
    with nndb.open(trace) as t:
        lrs = t.learning_rates()
        assert list(lrs) == ["opt.group0", "opt.group1"] == [s["kind"] for s in inspected]
        assert lrs["opt.group0"].tolist() == used[:, 0].tolist() == [0.05] * 3 + [0.025] * 3 + [0.0125] * 2
        assert lrs["opt.group1"].tolist() == used[:, 1].tolist()
        assert all(lrs[s["kind"]].tolist() == s["values"] and t.steps.tolist() == s["steps"] for s in inspected)
        with pytest.raises(UsageError, match=r"trace.learning_rates\(\)"):
            t.series("lr")


WEIGHT_DECAY_SCHEDULE = """
import torch
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.AdamW([{"params": m[0].parameters()}, {"params": m[2].parameters(), "weight_decay": 0.0}],
                        lr=0.01, weight_decay=0.04)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=6)     # (cycles beta1 too)
x = torch.randn(32, 4)
for step in range(6):
    opt.param_groups[0]["weight_decay"] = 0.04 + 0.02 * step        # DINO's way: a schedule into the group
    used = [g["weight_decay"] for g in opt.param_groups] + [g["betas"][0] for g in opt.param_groups]
    opt.zero_grad(); m(x).pow(2).mean().backward(); opt.step(); sched.step()
    print("used", *used)
"""


def test_a_weight_decay_and_beta1_schedule_is_read_as_the_steps_used_it(tmp_path):
    """The trace kept each param group's learning rate alone: a weight-decay schedule (DINO's,
    0.04 -> 0.14 here) and OneCycleLR's beta1 (0.95 -> 0.85 -> 0.95) could not be read back by
    any reader ('history weight_decay': "no tensor named 'weight_decay' has been recorded"),
    nor a 'set weight_decay' at the prompt, while the update norms moved with them."""
    from nndb.export.scalars import hyper_scalars
    script = tmp_path / "wd.py"
    script.write_text(WEIGHT_DECAY_SCHEDULE)
    trace = str(tmp_path / "t.h5")
    r = run_nndb("run", "--batch", "-q", "--trace", trace, "-e", "break step 2", "-e", "continue",
                 "-e", "history weight_decay", "-e", "continue", str(script))
    assert r.returncode == 0, r.stderr
    used = np.array([[float(v) for v in line.split()[1:]] for line in r.stdout.splitlines() if line.startswith("used ")])
    assert "weight_decay, 3 recorded step(s) 0..2, a column a param group" in r.stdout, r.stdout
    assert re.search(r"^2 +0\.08 +0$", r.stdout, re.M), r.stdout
    inspected = json.loads(run_nndb("inspect", trace, "--series", "weight_decay", "--json").stdout)["series"]
    with nndb.open(trace) as t:
        wd, beta1 = t.hyperparameters("weight_decay"), t.hyperparameters("beta1")
        assert wd["opt.group0"].tolist() == used[:, 0].tolist() == [0.04 + 0.02 * s for s in range(6)]
        assert wd["opt.group1"].tolist() == used[:, 1].tolist() == [0.0] * 6
        assert [s["values"] for s in inspected] == [wd["opt.group0"].tolist(), wd["opt.group1"].tolist()]
        assert beta1["opt.group0"].tolist() == used[:, 2].tolist() and used[0, 2] == 0.95 > used[3, 2]
        assert t.hyperparameters("beta2")["opt.group1"].tolist() == [0.999] * 6
        assert t.hyperparameters("momentum") == {}                  # (AdamW's groups have none)
        with pytest.raises(UsageError, match="unknown hyper-parameter 'eps'"):
            t.hyperparameters("eps")
        tags = {s.tag: s.values.tolist() for s in hyper_scalars(t.reader)}
        assert tags["hyper/opt.group0/weight_decay"] == wd["opt.group0"].tolist()
        assert tags["hyper/opt.group1/beta1"] == beta1["opt.group1"].tolist() and "hyper/opt.group0/momentum" not in tags
    bad = run_nndb("inspect", trace, "--series", "momentum")
    assert bad.returncode == 2 and bad.stderr.strip() == (f"nndb: error: no momentum in {trace} (no param group of an "
                                                         "optimizer that stepped has one, or a trace written before "
                                                         "nndb kept it)")
