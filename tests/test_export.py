"""nndb export: TensorBoard event files and MLflow runs read back with the
tools' own readers, value for value against the trace; the one-line message
without an extra."""
import math
import os
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import example, nndb
from nndb.cli import cli
from nndb.store.measured import measured
from nndb.store.reader import TraceReader


@pytest.fixture(scope="module")
def nan_trace(tmp_path_factory):
    """nan_lr.py recorded in this process: its loss goes Inf then NaN, and rules fire."""
    import gc
    from nndb.run.config import RunConfig
    from nndb.driver import DebugOptions, debug
    from nndb.frontends.batch import ScriptedFrontend
    from nndb.run.launcher import Target
    gc.collect()
    path = str(tmp_path_factory.mktemp("trace") / "nan.h5")
    debug(RunConfig(Target(path=example("nan_lr.py"), args=[]), path, quiet=True),
          DebugOptions(batch=True, no_rc=True), ScriptedFrontend([]))
    return path


def expected_values(path) -> dict:
    """{tag: {step: value}} straight from the trace: every measured statistic
    that is a number (a measured NaN and "not measured" are not exported); a
    partial row's (no whole step) under ``partial/``."""
    out = {}
    with TraceReader(path) as r:
        partial = set(r.steps[r.partial].tolist())
        for s in r.series():
            steps, block = r.history(s)
            ok = measured(block, r.columns)
            for j, stat in enumerate(r.columns):
                for prefix, rows in (("", lambda st: st not in partial), ("partial/", lambda st: st in partial)):
                    pts = {int(st): float(v) for st, v, m in zip(steps, block[:, j], ok[:, j])
                           if m and not math.isnan(v) and rows(int(st))}
                    if pts:
                        out[f"{prefix}{s.kind}/{s.name}/{stat}"] = pts
                        if s.kind == "loss" and stat == "mean":
                            out[f"{prefix}{s.name}/value"] = pts
        # each param group's learning rate (weight decay, momentum, betas: those it has) at every
        # recorded step: the last change at or before it
        rows = r.hyper() or []
        for opt, group in {(h["optimizer"], h["group"]) for h in rows}:
            mine = [h for h in rows if (h["optimizer"], h["group"]) == (opt, group)]
            for name, get in (("lr", lambda h: h["lr"]), ("weight_decay", lambda h: h.get("weight_decay")),
                              ("momentum", lambda h: h.get("momentum")),
                              ("beta1", lambda h: (h.get("betas") or [None])[0]),
                              ("beta2", lambda h: (h.get("betas") or [None, None])[1])):
                pts = {}
                for st in r.steps.tolist():
                    before = [h for h in mine if h["step"] <= st]
                    if before and get(max(before, key=lambda h: h["step"])) is not None:
                        pts[int(st)] = float(get(max(before, key=lambda h: h["step"])))
                if pts:
                    out[f"hyper/{opt}.group{group}/{name}"] = {st: v for st, v in pts.items() if st not in partial}
                if partial & set(pts):
                    out[f"partial/hyper/{opt}.group{group}/{name}"] = {st: v for st, v in pts.items() if st in partial}
    return out


def export(*args):
    return CliRunner().invoke(cli, ["export", *args], catch_exceptions=False)


def test_the_trace_has_what_the_export_must_skip(nan_trace):
    """(The fixture is the case that matters: NaN losses and unmeasured statistics.)"""
    with TraceReader(nan_trace) as r:
        (loss,) = r.find("loss", "loss")
        _, v = r.history(loss, "mean")
        assert np.isnan(v).any() and np.isinf(v).any()
        (g,) = r.find("0.weight", "grad")
        _, mean = r.history(g, "mean")
        assert np.isnan(mean).any()       # not measured between full steps


def test_tensorboard_holds_every_value_of_the_trace(nan_trace, tmp_path):
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    out = tmp_path / "tb"
    res = export(nan_trace, "--tensorboard", str(out))
    assert res.exit_code == 0, res.output
    acc = ea.EventAccumulator(str(out), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0, ea.HISTOGRAMS: 0})
    acc.Reload()
    want = expected_values(nan_trace)
    assert set(acc.Tags()["scalars"]) == set(want)
    with TraceReader(nan_trace) as r:           # the trace's histograms (full steps), each series' own tag
        want_hists = {f"{s.kind}/{s.name}/hist" for s in r.series() if r.histogram_steps(s.name, s.kind)}
    assert want_hists and set(acc.Tags()["histograms"]) <= want_hists
    n = 0
    for tag, pts in want.items():
        got = {e.step: e.value for e in acc.Scalars(tag)}
        assert got.keys() == pts.keys(), tag        # the real steps; NaN and unmeasured ones left out
        for step, v in pts.items():                 # TensorBoard keeps float32 (past its range: inf)
            with np.errstate(over="ignore"):
                assert got[step] == float(np.float32(v)), (tag, step)
            n += 1
    hists = sum(len(acc.Histograms(t)) for t in acc.Tags()["histograms"])
    assert hists > 0
    assert f"exported {n} value(s) in {len(want)} tag(s), {hists} histogram(s) and 4 finding(s)" in res.output
    assert math.isinf(dict((e.step, e.value) for e in acc.Scalars("loss/value"))[6])
    # the findings, as text at their steps
    texts = {e.step: e.tensor_proto.string_val[0].decode() for e in acc.Tensors("findings/text_summary")}
    assert sorted(texts) == [2, 4, 5, 6]          # (loss_explodes: the x390 jump of step 3, rising on at 4)
    assert "update" in texts[2] and "loss went from" in texts[4] and "exploding" in texts[5] and "nonfinite" in texts[6]


def test_mlflow_run_holds_every_value_params_findings_and_the_trace(nan_trace, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from nndb.export.mlflow import key
    monkeypatch.chdir(tmp_path)
    res = export(nan_trace, "--mlflow", "--experiment", "exp1", "--run-name", "nan run")
    assert res.exit_code == 0, res.output
    uri = "file:" + str(tmp_path / "mlruns")        # the default: ./mlruns
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("exp1")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == "nan run" and run.info.status == "FINISHED"
    want = expected_values(nan_trace)
    assert set(run.data.metrics) == {key(t) for t in want}
    for tag, pts in want.items():
        got = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key(tag))}
        assert got == pts, tag                      # float64, exactly
    p = run.data.params
    assert p["script"].endswith("nan_lr.py") and not any(k.endswith(".lr") for k in p)     # (a metric now)
    with TraceReader(nan_trace) as r:                       # the learning rate at every recorded step
        assert sorted(want["hyper/optimizer.group0/lr"]) == r.steps.tolist() and len(r.steps) == 30
    assert "argv" in p and p["nndb_version"]
    findings = [v for k, v in sorted(run.data.tags.items()) if k.startswith("nndb.finding.")]
    assert len(findings) == 4 and findings[0].startswith("step 2: warning: update_ratio")
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["nan.h5"]


def test_mlflow_batches_stay_within_the_per_call_limits(nan_trace, tmp_path):
    pytest.importorskip("mlflow")
    from nndb.export import mlflow as M
    calls = []

    class Client:
        def log_batch(self, run_id, metrics=(), params=(), tags=()):
            calls.append((len(metrics), len(params) + len(tags)))

    sink = M.MlflowSink.__new__(M.MlflowSink)
    from mlflow.entities import Metric, Param, RunTag
    sink._Metric, sink._Param, sink._RunTag = Metric, Param, RunTag
    sink.client, sink.run_id, sink._metrics, sink._others, sink._findings, sink.metrics_logged = \
        Client(), "r", [], [], 0, 0
    from nndb.export.scalars import trace_scalars
    with TraceReader(nan_trace) as r:
        for s in trace_scalars(r):
            sink.scalars(s)
    sink.params({f"p{i}": "v" for i in range(250)})
    sink.findings(3, [f"f{i}" for i in range(120)])
    sink.flush()
    assert max(m for m, _ in calls) == M.MAX_METRICS and all(o <= M.MAX_PARAMS_TAGS for _, o in calls)
    assert sum(m for m, _ in calls) == sum(len(v) for v in expected_values(nan_trace).values())
    assert sum(o for _, o in calls) == 370


@pytest.mark.parametrize("flag,extra,modules", [
    (["--tensorboard", "DIR"], "tensorboard", ("tensorboard", "torch.utils.tensorboard")),
    (["--mlflow"], "mlflow", ("mlflow",)),
])
def test_a_missing_extra_is_one_line_and_exit_2(nan_trace, tmp_path, monkeypatch, flag, extra, modules):
    for m in modules:
        monkeypatch.setitem(sys.modules, m, None)      # import fails as if not installed
    flag = [str(tmp_path / "tb") if a == "DIR" else a for a in flag]
    res = CliRunner().invoke(cli, ["export", nan_trace, *flag])
    assert res.exit_code == 2
    assert res.output == (f"nndb: error: nndb export {flag[0]} needs the {extra} extra: "
                          f"pip install 'nndb[{extra}]'\n")
    assert not os.path.exists(tmp_path / "tb")


@pytest.mark.parametrize("args,message", [
    (["NOPE.h5", "--tensorboard", "x"], "nndb: error: no such trace: NOPE.h5\n"),
    (["TRACE"], "nndb: error: export where? --tensorboard DIR and/or --mlflow [TRACKING_URI]\n"),
    (["TRACE", "--tensorboard", "FILE"], "nndb: error: cannot export to FILE: it is a file, not a directory\n"),
])
def test_bad_input_is_one_line_and_exit_2(nan_trace, tmp_path, monkeypatch, args, message):
    pytest.importorskip("tensorboard")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "FILE").write_text("x")
    res = CliRunner().invoke(cli, ["export", *[nan_trace if a == "TRACE" else a for a in args]])
    assert (res.exit_code, res.output) == (2, message)


def test_not_a_trace_is_one_line(tmp_path):
    pytest.importorskip("tensorboard")
    bad = tmp_path / "x.h5"
    bad.write_bytes(b"not hdf5")
    res = CliRunner().invoke(cli, ["export", str(bad), "--tensorboard", str(tmp_path / "tb")])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "not an nndb trace" in res.output


def test_an_unreachable_mlflow_server_is_one_line_at_once(nan_trace):
    pytest.importorskip("mlflow")
    import socket
    import time
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]          # released: nothing listens there
    t0 = time.monotonic()
    res = CliRunner().invoke(cli, ["export", nan_trace, "--mlflow", f"http://127.0.0.1:{port}"])
    assert time.monotonic() - t0 < 30       # (not the client's minutes of retries)
    assert res.exit_code == 2 and res.output.count("\n") == 1
    assert res.output.startswith(f"nndb: error: cannot export to mlflow:http://127.0.0.1:{port}: "
                                 f"ConnectionRefusedError")


LONG_NAMES = """
import torch, torch.nn as nn
torch.manual_seed(0)
m = nn.Linear(4, 1)
for i in range(7):                      # a deep model's path: 290 characters
    w = nn.Module()
    w.add_module("encoder_stack_wrapper_at_level_%d_of_seven" % i, m)
    m = w
net = nn.Sequential(m)
layer = net[0]
while not isinstance(layer, nn.Linear):
    layer = next(iter(layer.children()))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
x = torch.randn(16, 4); y = x.sum(1, keepdim=True)
for it in range(4):
    opt.zero_grad(); loss = ((layer(x) - y) ** 2).mean(); loss.backward(); opt.step()
    print(it, f"{layer.weight.grad.norm().item():.9g}", f"{layer.bias.grad.norm().item():.9g}")
"""


def test_mlflow_keeps_long_names_apart(tmp_path, monkeypatch):
    """A tag over MLflow's 250 characters gets a key of its own: cut at 250,
    every statistic of a 269-character parameter name, its weight's and its
    bias's, went into one metric (20 values at step 0, the UI showing the last)."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from conftest import plain_and_recorded
    from nndb.export.mlflow import key, MAX_KEY
    plain, trace = plain_and_recorded(tmp_path, LONG_NAMES)
    res = export(trace, "--mlflow", "file:" + str(tmp_path / "ml"))
    assert res.exit_code == 0, res.output
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri="file:" + str(tmp_path / "ml"))
    (run,) = client.search_runs([client.get_experiment_by_name("nndb").experiment_id])
    want = expected_values(trace)
    assert max(map(len, want)) > MAX_KEY
    assert len({key(t) for t in want}) == len(want) and set(run.data.metrics) == {key(t) for t in want}
    assert all(len(key(t)) <= MAX_KEY and key(t).endswith(t.rsplit("/", 1)[1]) for t in want)
    for tag, pts in want.items():
        got = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key(tag))}
        assert got == pts, tag
    # the gradients' norms are the script's own (nndb sums in float64: within float32's rounding)
    weight = next(t for t in want if t.startswith("grad/") and t.endswith(".weight/norm"))
    bias = next(t for t in want if t.startswith("grad/") and t.endswith(".bias/norm"))
    rows = [line.split() for line in plain.stdout.splitlines()]
    for name, col in ((weight, 1), (bias, 2)):
        got = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key(name))}
        assert [got[i] for i in range(4)] == pytest.approx([float(r[col]) for r in rows], rel=1e-6)


def test_a_partial_last_row_is_exported_apart_from_the_steps(tmp_path, monkeypatch):
    """An evaluation's backward() after the last step leaves a partial row (step 4 after
    steps 0-3, two param groups under a cosine schedule).  Both exports, offline and live,
    wrote it on the training curves as step 4: loss/value went 0.03217 -> 1.126 there, the
    lr 0 (the schedule's end, used by no step), where inspect says '4 (partial)' and the
    loss plot draws a point of its own.  Its values are under partial/ now."""
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from nndb.export.mlflow import key
    script = tmp_path / "evalbw.py"
    script.write_text(
        "import torch\ntorch.manual_seed(0)\nm = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))\n"
        "opt = torch.optim.SGD([{'params': m[0].parameters(), 'lr': 0.1}, {'params': m[1].parameters(), 'lr': 0.01}])\n"
        "sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4)\nx = torch.randn(8, 3)\n"
        "for step in range(4):\n    opt.zero_grad()\n    loss = m(x).pow(2).mean()\n"
        "    loss.backward()\n    opt.step()\n    sched.step()\n    print(repr(loss.item()))\n"
        "ev = (m(x) - 1).pow(2).mean()\nev.backward()\nprint(repr(ev.item()))\n")
    path, live = str(tmp_path / "t.h5"), tmp_path / "live"
    r = nndb("run", "--batch", "-q", "--trace", path, "--export", f"tensorboard:{live}", str(script))
    assert r.returncode == 0, r.stderr
    *losses, ev = [float(x) for x in r.stdout.split()]
    want = expected_values(path)
    assert want["loss/value"] == pytest.approx(dict(enumerate(losses)), rel=1e-7)
    assert want["partial/loss/value"] == pytest.approx({4: ev}, rel=1e-7)
    assert sorted(want["hyper/opt.group1/lr"]) == [0, 1, 2, 3] and want["partial/hyper/opt.group1/lr"] == {4: 0.0}
    offline = tmp_path / "tb"
    assert export(path, "--tensorboard", str(offline)).exit_code == 0
    for d in (offline, live):
        acc = ea.EventAccumulator(str(d), size_guidance={ea.SCALARS: 0})
        acc.Reload()
        assert set(acc.Tags()["scalars"]) == set(want), d
        for tag, pts in want.items():
            got = {e.step: e.value for e in acc.Scalars(tag)}
            assert got == {st: float(np.float32(v)) for st, v in pts.items()}, (d, tag)
    monkeypatch.chdir(tmp_path)
    assert export(path, "--mlflow", "--experiment", "e").exit_code == 0
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri="file:" + str(tmp_path / "mlruns"))
    (run,) = client.search_runs([client.get_experiment_by_name("e").experiment_id])
    assert set(run.data.metrics) == {key(t) for t in want}
    assert {m.step: m.value for m in client.get_metric_history(run.info.run_id, "loss/value")} == want["loss/value"]


TWO_CALLS_AND_A_NAMESAKE = """
import torch, torch.nn as nn
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.act, self.act_2, self.out = nn.Linear(4, 8), nn.Tanh(), nn.Sigmoid(), nn.Linear(8, 1)
    def forward(self, x):                       # act twice (act, act#2), then the module act_2
        return self.out(self.act_2(self.act(self.act(self.fc(x)))))
torch.manual_seed(0)
m = Net()
opt = torch.optim.SGD(m.parameters(), lr=0.1)
x = torch.randn(16, 4)
for step in range(3):
    opt.zero_grad(); loss = m(x).pow(2).mean(); loss.backward(); opt.step()
"""


def test_mlflow_keeps_a_second_call_apart_from_a_module_of_that_name(tmp_path, monkeypatch):
    """A module called twice has the activations act and act#2; MLflow's key for act#2 was
    act/act_2/norm, that of a module named act_2 too: one metric held both layers' values,
    two at each step (4.761 and 5.504 at step 0).  A key whose characters had to change
    takes a digest of its tag, as a long one does: every tag its own metric."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from nndb.export.mlflow import key
    script = tmp_path / "twice.py"
    script.write_text(TWO_CALLS_AND_A_NAMESAKE)
    trace = str(tmp_path / "t.h5")
    assert nndb("run", "--batch", "-q", "--trace", trace, str(script)).returncode == 0
    want = expected_values(trace)
    assert {"act/act#2/norm", "act/act_2/norm"} <= set(want)
    assert export(trace, "--mlflow", "file:" + str(tmp_path / "ml")).exit_code == 0
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri="file:" + str(tmp_path / "ml"))
    (run,) = client.search_runs([client.get_experiment_by_name("nndb").experiment_id])
    assert len(run.data.metrics) == len(want) and set(run.data.metrics) == {key(t) for t in want}
    assert key("act/act_2/norm") == "act/act_2/norm" and key("grad/fc.weight/norm") == "grad/fc.weight/norm"
    for tag, pts in want.items():
        got = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key(tag))]
        assert sorted(got) == sorted(pts.items()), tag
