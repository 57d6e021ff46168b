"""nndb run --export: each step streamed to TensorBoard / MLflow from a
background thread; a store that refuses connections costs one warning line
and changes nothing of the run or its trace."""
import os
import socket
import threading

import numpy as np
import pytest

from conftest import example, nndb
from nndb.export.live import LiveExport
from nndb.store.reader import TraceReader
from test_export import expected_values


def run_with_exports(tmp_path, targets, script="nan_lr.py"):
    import gc
    from nndb.run.config import RunConfig
    from nndb.driver import DebugOptions, debug
    from nndb.frontends.batch import ScriptedFrontend
    from nndb.run.launcher import Target
    gc.collect()
    path = str(tmp_path / "run.h5")
    messages = []
    result = debug(RunConfig(Target(path=example(script), args=[]), path, quiet=True),
                   DebugOptions(batch=True, no_rc=True, exports=tuple(targets)), ScriptedFrontend([]),
                   message=messages.append)
    return path, result, messages


def test_live_tensorboard_holds_every_value_of_the_trace(tmp_path):
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    from nndb.export.targets import tensorboard_target
    tb = tmp_path / "tb"
    path, result, messages = run_with_exports(tmp_path, [tensorboard_target(str(tb), "test")])
    assert result.exit_code == 0 and not [m for m in messages if "export" in m]
    acc = ea.EventAccumulator(str(tb), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    want = expected_values(path)
    assert set(acc.Tags()["scalars"]) == set(want)
    for tag, pts in want.items():
        got = {e.step: e.value for e in acc.Scalars(tag)}
        assert got.keys() == pts.keys(), tag
        with np.errstate(over="ignore"):
            assert all(got[s] == float(np.float32(v)) for s, v in pts.items()), tag
    texts = {e.step: e.tensor_proto.string_val[0].decode() for e in acc.Tensors("findings/text_summary")}
    assert sorted(texts) == [2, 4, 5, 6] and "nonfinite" in texts[6]     # (loss_explodes confirmed at 4)


def test_live_mlflow_file_store_holds_every_value_and_the_trace(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from nndb.export.mlflow import key
    from nndb.export.targets import mlflow_target
    uri = "file:" + str(tmp_path / "mlruns")
    path, result, messages = run_with_exports(tmp_path, [mlflow_target(uri, "test", "live")])
    assert result.exit_code == 0 and not [m for m in messages if "export" in m]
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("live").experiment_id])
    assert run.info.run_name == "nan_lr" and run.info.status == "FINISHED"
    want = expected_values(path)
    assert set(run.data.metrics) == {key(t) for t in want}
    for tag, pts in want.items():
        assert {m.step: m.value for m in client.get_metric_history(run.info.run_id, key(tag))} == pts, tag
    assert sum(k.startswith("nndb.finding.") for k in run.data.tags) == 4
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["run.h5"]
    with TraceReader(path) as r:          # the parameters nndb export gives (the learning rate: a metric)
        from nndb.export.scalars import run_params
        assert run.data.params == {key(k): v for k, v in run_params(r.meta).items()}
        assert key("hyper/optimizer.group0/lr") in run.data.metrics


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stats_of(path):
    with TraceReader(path) as r:
        return r.steps.copy(), [(s.name, s.kind) for s in r.series()], r.all_stats(), r.status


def test_an_unreachable_mlflow_server_changes_nothing_but_one_line(tmp_path):
    pytest.importorskip("mlflow")
    a, b = str(tmp_path / "a.h5"), str(tmp_path / "b.h5")
    plain = nndb("run", "--batch", "--trace", a, example("nan_lr.py"))
    port = closed_port()
    exported = nndb("run", "--batch", "--trace", b, "--export", f"mlflow:http://127.0.0.1:{port}",
                    example("nan_lr.py"))
    assert exported.returncode == plain.returncode == 0
    assert exported.stdout == plain.stdout
    extra = [l for l in exported.stderr.splitlines() if l not in plain.stderr.replace(a, b).splitlines()]
    assert len(extra) == 1 and extra[0].startswith(f"nndb: warning: cannot export to mlflow:http://127.0.0.1:{port} "
                                                   f"(ConnectionRefusedError")
    sa, sb = stats_of(a), stats_of(b)
    assert (sa[0] == sb[0]).all() and sa[1] == sb[1] and sa[3] == sb[3]
    np.testing.assert_array_equal(sa[2], sb[2])


def test_a_missing_extra_stops_the_run_before_the_script(tmp_path):
    fake = tmp_path / "fake" / "mlflow"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('simulated: not installed')\n")
    trace = tmp_path / "t.h5"
    res = nndb("run", "--batch", "--trace", str(trace), "--export", "mlflow", example("mlp.py"),
               env={"PYTHONPATH": str(tmp_path / "fake")})
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == ("nndb: error: nndb run --export mlflow needs the mlflow extra: "
                          "pip install 'nndb[mlflow]'\n")
    assert not trace.exists()
    bad = nndb("run", "--batch", "--export", "wandb:x", example("mlp.py"))
    assert bad.returncode == 2 and bad.stderr == ("nndb: error: unknown export 'wandb:x': "
                                                  "tensorboard:DIR or mlflow[:TRACKING_URI]\n")


class _Target:
    kind, label, where = "tensorboard", "tensorboard:test", None

    def __init__(self, gate):
        self.gate = gate
        self.sink = _Sink()

    def open(self):
        self.gate.wait(10)
        return self.sink


class _Sink:
    def __init__(self):
        self.steps, self.closed = [], None

    def params(self, p, step=0): pass
    def scalars(self, s): self.steps.extend(s.steps.tolist()) if s.tag == "loss/loss/count" else None
    def findings(self, step, lines): pass
    def flush(self): pass
    def artifact(self, path): pass
    def close(self, status): self.closed = status


class _Record:
    def __init__(self, step):
        self.step, self.time, self.names, self.partial = step, 0.0, [("loss", "loss")], False
        self.stats = np.array([[1.0, 2.0, 0.0, 2.0, 2.0, 2.0, 2.0, 0.0, 0.0, 0.0]])


class _End:
    def __init__(self, step):
        self.records = (_Record(step),)


def test_a_full_queue_drops_the_oldest_and_says_so_once():
    gate = threading.Event()
    said = []
    target = _Target(gate)
    x = LiveExport(target, 0.0, {}, message=said.append, capacity=3)
    for step in range(10):                 # the sink is not open yet: the queue fills
        x.on_step(_End(step))
    assert x.dropped == 7 and len(said) == 1 and "dropping the oldest steps" in said[0]
    gate.set()
    x.close("finished")
    assert target.sink.steps == [7, 8, 9] and target.sink.closed == "finished"


def test_a_forked_replica_exports_nothing(monkeypatch):
    gate = threading.Event()
    target = _Target(gate)
    x = LiveExport(target, 0.0, {}, message=lambda m: None)
    monkeypatch.setattr(os, "getpid", lambda: -1)
    x.on_step(_End(1))
    monkeypatch.undo()
    gate.set()
    x.close("finished")
    assert target.sink.steps == []


def test_run_at_the_prompt_exports_the_new_run_to_a_directory_of_its_own(tmp_path):
    """`run` starts the script again: the second run's steps stream to
    DIR-run2 (next to its trace run-run2.h5), each directory holding exactly
    its own run's values."""
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    import gc
    from nndb.run.config import RunConfig
    from nndb.driver import DebugOptions, debug
    from nndb.frontends.batch import ScriptedFrontend
    from nndb.export.targets import tensorboard_target
    from nndb.run.launcher import Target
    gc.collect()
    tb = tmp_path / "tb"
    fe = ScriptedFrontend(["break step 3", "continue", "run", "y", "continue", "continue"])
    result = debug(RunConfig(Target(path=example("nan_lr.py"), args=[]), str(tmp_path / "run.h5"), quiet=True),
                   DebugOptions(no_rc=True, exports=(tensorboard_target(str(tb), "test"),)), fe)
    assert result.exit_code == 0, fe.text
    assert sorted(os.listdir(tmp_path)) == ["run-run2.h5", "run.h5", "tb", "tb-run2"]
    for trace, directory in (("run.h5", "tb"), ("run-run2.h5", "tb-run2")):
        acc = ea.EventAccumulator(str(tmp_path / directory), size_guidance={ea.SCALARS: 0})
        acc.Reload()
        want = expected_values(str(tmp_path / trace))
        assert set(acc.Tags()["scalars"]) == set(want)
        for tag, pts in want.items():
            assert {e.step for e in acc.Scalars(tag)} == set(pts), (directory, tag)
