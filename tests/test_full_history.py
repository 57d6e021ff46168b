"""Full-tensor history (``--record-full``): the precision codec's promise on
adversarial values, the bounded writer, and a real run read back at the
prompt (``p $full[...]``), through ``nndb.open(...).tensor`` and through
``nndb inspect --tensor ... --npy``, bit-identical to the script run alone."""
import importlib.util
import json
import re

import h5py
import numpy as np
import pytest
import torch

import nndb
from conftest import Ran, nndb as run_nndb, python, ROOT
from nndb.store import precision as P
from nndb.store.reader import TraceReader
from nndb.store.writer import TraceWriter
from nndb.tracer.recorder import StepRecord

SCRIPT = f"{ROOT}/tests/scripts/dying_relu_cnn.py"

ADVERSARIAL = [1e-8, 7e4, 1e30, -1e30, float("nan"), float("inf"), float("-inf"), 1e-40, -1e-45,
               -0.0, 0.0, 1.0, -3.3, 65504.0, 65520.0, 6e-8, 3.4028235e38, -1.1754944e-38]


def _check(original: np.ndarray, back: np.ndarray, used: str) -> float:
    """The codec's promise: NaN stays NaN, Inf and zeros (with their sign) as
    they were, every finite non-zero value within the stated relative error."""
    o = original.astype(np.float64)
    b = back.astype(np.float64)
    assert back.dtype == original.dtype
    assert np.array_equal(np.isnan(o), np.isnan(b))
    special = ~np.isnan(o) & (~np.isfinite(o) | (o == 0))
    assert np.array_equal(o[special], b[special])
    assert np.array_equal(np.signbit(o[o == 0]), np.signbit(b[o == 0]))
    fin = np.isfinite(o) & (o != 0)
    rel = np.abs(b[fin] - o[fin]) / np.abs(o[fin])
    worst = float(rel.max()) if rel.size else 0.0
    assert worst <= P.MAX_REL_ERROR[used], (used, worst)
    return worst


@pytest.mark.parametrize("asked", P.REQUESTABLE)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_round_trip_within_the_stated_error_on_adversarial_values(asked, dtype):
    rng = np.random.default_rng(0)
    with np.errstate(over="ignore"):
        cases = {
            "adversarial": np.array(ADVERSARIAL, dtype=dtype),
            "normal": rng.standard_normal(4096).astype(dtype),
            "wide": (rng.standard_normal(512) * 10.0 ** rng.integers(-20, 20, 512)).astype(dtype),
            "narrow": (1.0 + rng.random(512) * 1e-3).astype(dtype),
            "tiny": np.array([1e-8, 3e-7, -2e-8], dtype=dtype),
            "huge": np.array([7e4, -1.5e5, 1e30], dtype=dtype),
            "sparse grad": np.where(rng.random(1000) < 0.5, 0.0, rng.standard_normal(1000) * 1e-3).astype(dtype),
        }
    for what, a in cases.items():
        enc = P.encode(a, asked)
        # never narrower than asked (a float16 tensor: its own bits, exact), wider only where asked would lie
        if a.dtype == np.float16:
            assert enc.used == "fp16" and np.array_equal(enc.data, a.view(np.uint16)), what
        else:
            assert P.PRECISIONS.index(enc.used) >= P.PRECISIONS.index(asked), what
        _check(a, P.decode(enc.data, enc.used, enc.scale, str(a.dtype)), enc.used)


def test_half_precision_never_silently_gives_inf_or_zero():
    """Values fp16 cannot hold (1e30, 1e-8 beside 7e4, subnormals) do not come
    back as Inf or 0: the tensor is stored wider, and the index says which."""
    a = np.array([1e-8, 7e4], dtype=np.float32)
    enc = P.encode(a, "fp16")
    assert enc.used == "bf16"                       # 7e4 / 1e-8: more than fp16's range with one scale
    assert (P.decode(enc.data, enc.used, enc.scale, "float32") != 0).all()
    enc = P.encode(np.array([1e30, 2e30], dtype=np.float32), "fp16")
    assert enc.used == "fp16" and enc.scale > 1     # one scale is enough there
    back = P.decode(enc.data, enc.used, enc.scale, "float32")
    assert np.isfinite(back).all() and np.allclose(back, [1e30, 2e30], rtol=P.MAX_REL_ERROR["fp16"])
    enc = P.encode(np.array([1e-40, 1.0], dtype=np.float32), "bf16")     # a float32 subnormal
    assert enc.used == "fp32"
    enc = P.encode(np.array([3.4028235e38], dtype=np.float32), "bf16")    # would round up to Inf
    assert enc.used == "fp32"
    # float16 scaled into range: a tensor of tiny gradients keeps fp16 and its digits
    g = (np.random.default_rng(1).standard_normal(100) * 1e-9).astype(np.float32)
    enc = P.encode(g, "fp16")
    assert enc.used == "fp16"
    _check(g, P.decode(enc.data, enc.used, enc.scale, "float32"), "fp16")


def test_writer_bounds_pending_tensors_and_reports_a_skip(tmp_path):
    """At most max_bytes of whole tensors wait: more makes the writer flush
    first; a tensor over the bound alone is skipped, said once, and every
    skipped step is an event in the trace."""
    path = str(tmp_path / "w.h5")
    said = []
    w = TraceWriter(path, {"x": 1}, flush_steps=1000, flush_secs=1e9, on_error=said.append,
                    full_max_bytes=4000)
    names = [("a", "grad")]
    for step in range(6):
        w.append(StepRecord(step, 0.1, 1, 1, names, np.zeros((1, 9))))
        small = np.full(250, step, dtype=np.float32)              # 1000 bytes: fits; 4 fill the bound
        assert w.full_tensor({"name": "a", "kind": "grad", "step": step, "shape": [250], "dtype": "float32",
                              "asked": "fp32"}, small.nbytes, lambda: small.copy())
        assert w.full.bytes <= 4000 and len(w.full.tensors) <= w.full.max_pending
        big = np.zeros(2000, dtype=np.float32)                    # 8000 bytes: over the bound alone
        assert not w.full_tensor({"name": "b", "kind": "grad", "step": step, "shape": [2000],
                                  "dtype": "float32", "asked": "fp32"}, big.nbytes, lambda: big)
    w.close("finished", 0)
    assert len(said) == 1 and "skipped" in said[0] and "--full-tensors-buffer" in said[0]
    r = TraceReader(path)
    skipped = [e for e in r.events() if e["kind"] == "full_tensors_skipped"]
    assert [e["step"] for e in skipped] == list(range(6))
    for step in range(6):
        assert np.array_equal(r.tensor("a", "grad", step), np.full(250, step, dtype=np.float32))
        assert r.tensor("b", "grad", step) is None
    # reading it back says it was skipped, not that it was never asked for (it said 'the trace
    # keeps no whole tensor of grad b (kept: grad a; nndb run --record-full grad:GLOB)')
    from nndb.store import distributions as D
    with pytest.raises(nndb.errors.UsageError) as e:
        D.full_tensor(r, "b", "grad", 3)
    assert str(e.value) == ("the trace keeps no whole tensor of grad b (kept: grad a; grad b was skipped at step(s) "
                            "0, 1, 2, 3, 4, 5: it needs 8000 bytes, over the 4000-byte bound on pending full "
                            "tensors (nndb run --full-tensors-buffer))")


def test_old_traces_read_without_full_tensors(tmp_path):
    """A trace written before full/ and hist/ existed reads as having none."""
    path = str(tmp_path / "old.h5")
    w = TraceWriter(path, {}, flush_steps=1)
    w.append(StepRecord(0, 0.1, 1, 1, [("a", "grad")], np.zeros((1, 9))))
    w.close("finished", 0)
    with h5py.File(path, "a") as f:
        del f["full"], f["hist"]
    r = TraceReader(path)
    assert r.full_index() == [] and r.tensor("a", "grad", 0) is None
    assert r.histogram("a", "grad", 0) is None and r.histogram_steps("a", "grad") == []


# -- a real run ---------------------------------------------------------------------------------

COMMANDS = ["break step 12", "continue",
            "p $full['conv1.weight', 10].shape",
            "p 'SUM', float($full['grad:conv1.weight', 10].double().sum())",
            "record full param fc2.weight --every 4 --precision bf16",
            "record full",
            "delete", "continue"]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("full")
    trace = str(d / "run.h5")
    argv = ["run", "--batch", "-q", "--nx", "--trace", trace, "--record-full", "grad:conv*",
            "--record-full", "act:relu1", "--full-tensors-every", "5", "--precision", "fp16",
            *[x for c in COMMANDS for x in ("-e", c)], SCRIPT, "--steps", "20"]
    ran = Ran(run_nndb(*argv, cwd=str(d)), argv)
    plain = python(SCRIPT, "--steps", "20", forked=True)
    return d, trace, ran, plain


def test_recording_whole_tensors_leaves_the_run_bit_identical(full_run):
    _, _, ran, plain = full_run
    assert ran.returncode == 0, ran.stderr
    digest = re.search(r"^digest (\w+)$", plain.stdout, re.M).group(1)
    assert re.search(r"^digest (\w+)$", ran.stdout, re.M).group(1) == digest


def test_the_prompt_reads_a_kept_tensor_back(full_run):
    _, trace, ran, _ = full_run
    out = ran.stdout
    assert "torch.Size([4, 1, 3, 3])" in out
    with TraceReader(trace) as r:
        want = float(r.tensor("conv1.weight", "grad", 10).astype(np.float64).sum())
    got = float(re.search(r"^\('SUM', (\S+)\)$", out, re.M).group(1))
    assert got == want
    assert "param:fc2.weight every 4 step(s) in bf16" in out
    assert "Traceback" not in ran.stderr


def test_kept_gradients_are_the_gradients_before_the_update(full_run):
    """The gradient kept at step S is the one the optimizer used at S (after
    backward, before the update): the script's loop run again in this
    process, its gradients at steps 0, 5 and 10 copied before opt.step(),
    equal the kept ones within fp16's stated error."""
    _, trace, _, _ = full_run
    torch.manual_seed(0)
    import importlib.util
    spec = importlib.util.spec_from_file_location("dying", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    x = torch.randn(256, 1, 8, 8)
    y = torch.randint(0, 10, (256,))
    model = mod.Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    kept = {}
    for step in range(11):
        i = torch.randint(0, 256, (32,))
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[i]), y[i]) + 0.2 * model.fc1.bias.sum()
        loss.backward()
        if step in (0, 5, 10):
            kept[step] = model.conv1.weight.grad.detach().clone().numpy()
        opt.step()
    with TraceReader(trace) as r:
        for step, g in kept.items():
            back = r.tensor("conv1.weight", "grad", step)
            e = r.full_entry("conv1.weight", "grad", step)
            assert e["used"] == "fp16"
            np.testing.assert_allclose(back, g, rtol=P.MAX_REL_ERROR["fp16"], atol=0)


def test_api_and_inspect_read_kept_tensors(full_run):
    d, trace, _, _ = full_run
    t = nndb.open(trace)
    a = t.tensor("relu1", "act", 15)
    assert a.shape == (32, 32) and a.dtype == np.float32
    infos = t.full_tensors()
    assert {(i["kind"], i["name"]) for i in infos} >= {("grad", "conv1.weight"), ("grad", "conv2.bias"),
                                                       ("act", "relu1"), ("param", "fc2.weight")}
    assert sorted({i["step"] for i in infos if i["name"] == "fc2.weight"}) == [16]   # from step 13 on, every 4
    assert all(i["stored"] == "bf16" for i in infos if i["name"] == "fc2.weight")
    with pytest.raises(nndb.errors.UsageError, match="keeps act relu1 at steps 0, 5, 10, 15"):
        t.tensor("relu1", "act", 3)
    t.close()
    out = str(d / "relu1.npy")
    argv = ["inspect", trace, "--tensor", "act:relu1", "--step", "15", "--npy", out, "--json"]
    ran = Ran(run_nndb(*argv), argv, "nndb inspect")
    assert ran.returncode == 0, ran.stderr
    info = json.loads(ran.stdout)
    assert info["tensor"]["stored"] == "fp16" and info["tensor"]["max_rel_error"] == 2 ** -11
    assert np.array_equal(np.load(out, allow_pickle=False), a)
    bad = run_nndb("inspect", trace, "--tensor", "grad:fc1.weight", "--step", "15", "--npy", out)
    assert bad.returncode == 2 and "keeps no whole tensor of grad fc1.weight" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_trace_layout_is_plain_hdf5(full_run):
    """Chunked, gzip-compressed datasets any HDF5 tool reads; the index is JSON."""
    _, trace, _, _ = full_run
    with h5py.File(trace, "r") as f:
        for name in ("u16", "f32", "f64"):
            ds = f["full"][name]
            assert ds.chunks is not None and ds.compression == "gzip"
        lines = bytes(f["full/index"][:]).decode().splitlines()
        first = json.loads(lines[0])
        raw = f["full"][first["store"]][first["offset"]:first["offset"] + first["count"]]
        assert raw.size == int(np.prod(first["shape"]))


def test_bad_record_full_flags_are_one_line_and_exit_2(tmp_path):
    from click.testing import CliRunner
    from nndb.cli import cli
    script = str(tmp_path / "s.py")
    open(script, "w").write("print('ran')\n")
    for args, msg in ((["--record-full", "update:fc*"], "whole tensors are kept of param, grad, act"),
                      (["--record-full", "grad"], "takes KIND:GLOB"),
                      (["--precision", "fp16"], "go with --record-full"),
                      (["--record-full", "grad:*", "--full-tensors-every", "0"], "positive number of steps")):
        res = CliRunner().invoke(cli, ["run", "--batch", "--trace", str(tmp_path / "t.h5"), *args, script])
        assert res.exit_code == 2 and msg in res.output, (args, res.output)
        assert "Traceback" not in res.output and "ran" not in res.output


@pytest.mark.parametrize("script,args", [(SCRIPT, ["--steps", "10"]),
                                         (f"{ROOT}/tests/scripts/manual_sgd_full.py", ["10"])])
def test_whole_tensors_are_kept_only_at_recorded_steps(tmp_path, script, args):
    """``--steps 2:8 --every 2`` records steps 2, 4, 6: whole tensors are kept
    there only (they were kept at every step 0-9, outside the range the
    user bounded the trace to), with an optimizer and with a hand-written update."""
    trace = str(tmp_path / "s.h5")
    argv = ["run", "--batch", "-q", "--trace", trace, "--steps", "2:8", "--every", "2",
            "--record-full", "grad:*", "--record-full", "param:*", "--record-full", "act:*", script, *args]
    ran = Ran(run_nndb(*argv), argv)
    assert ran.returncode == 0, ran.stderr
    t = nndb.open(trace)
    recorded = sorted(int(s) for s in t.steps[~t.partial])
    assert recorded == [2, 4, 6]
    by_kind = {}
    for e in t.full_tensors():
        by_kind.setdefault(e["kind"], set()).add(e["step"])
    t.close()
    assert by_kind and all(sorted(steps) == recorded for steps in by_kind.values()), by_kind


def test_an_activation_of_several_calls_a_step_is_all_of_them(tmp_path):
    """Gradient accumulation: the first layer runs three times a step (2x5x8,
    2x5x8 and 2x3x8 outputs).  Its statistics and histogram count all 208
    elements; the whole tensor was the last call's 48 alone (the other two
    unreachable, and full_tensors() listed the step three times).  Now it is
    the three calls joined (flat: their second dimensions differ), each value
    within fp16's error of the script's own."""
    script = f"{ROOT}/tests/scripts/accumulation_full_acts.py"
    trace = str(tmp_path / "a.h5")
    argv = ["run", "--batch", "-q", "--trace", trace, "--record-full", "act:0", "--full-every", "1", script, "3"]
    ran = Ran(run_nndb(*argv), argv)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == python(script, "3", forked=True).stdout
    spec = importlib.util.spec_from_file_location("accumulation_full_acts", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    seen = {}
    mod.train(3, lambda step, outs: seen.__setitem__(step, outs))
    t = nndb.open(trace)
    infos = t.full_tensors()
    assert [(i["step"], i["shape"], i["calls"]) for i in infos] == [(s, [208], 3) for s in range(3)]
    for step, outs in seen.items():
        want = np.concatenate([o.numpy().reshape(-1) for o in outs])
        got = t.tensor("0", "act", step)
        assert got.shape == want.shape and t.histogram("0", "act", step).sum() == want.size
        np.testing.assert_allclose(got, want, rtol=P.MAX_REL_ERROR["fp16"], atol=0)
    t.close()
    argv = ["inspect", trace, "--tensor", "act:0", "--step", "1"]
    ran = Ran(run_nndb(*argv), argv, "nndb inspect")
    assert ran.returncode == 0 and "shape [208] (3 calls in the step, joined)" in ran.stdout, ran.stdout


def test_whole_tensors_of_step_0_have_their_series_names(tmp_path):
    """Two models: at step 0 (the critic's first step()) nndb named the
    critic's parameters 'weight' and 'bias', and qualified them as
    'critic.weight' when step 0 ended: the series are 'critic.weight' at every
    step, the whole tensors of step 0 were kept as 'weight' (the API said
    'keeps grad critic.weight at steps 1, 2, ..., not at step 0')."""
    script = f"{ROOT}/tests/scripts/two_models_critic_steps.py"
    trace = str(tmp_path / "c.h5")
    argv = ["run", "--batch", "-q", "--trace", trace, "--record-full", "grad:*", "--record-full", "param:*",
            "--record-full", "act:*", "--precision", "fp32", script]
    ran = Ran(run_nndb(*argv), argv)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == python(script, forked=True).stdout
    first = float(re.search(r"^first (\S+)$", ran.stdout, re.M).group(1))
    t = nndb.open(trace)
    series = {(i.kind, i.name) for i in t.tensors}
    kept = {(e["kind"], e["name"]) for e in t.full_tensors()}
    assert ("grad", "critic.weight") in kept and kept <= series, kept - series
    assert float(t.tensor("critic.weight", "grad", 0).astype(np.float64).sum()) == first
    t.close()


def test_whole_tensors_of_step_0_wait_for_their_names(tmp_path):
    """A GAN whose two models both hold ``main`` (DCGAN's layout), with
    ``--record-full 'act:*'``: the generator's 20 activations and then the
    discriminator's passed the 32 tensors a flush waits for before step 0
    ended, and were written under the names they had then, 'main.0' (either
    model's), where every later step kept 'netG.main.0' ('history netG.main.0'
    had no step 0).  Step 0's tensors now wait, unwritten, until their names
    settle."""
    script = f"{ROOT}/tests/scripts/gan_shared_names.py"
    trace = str(tmp_path / "g.h5")
    argv = ["run", "--batch", "-q", "--trace", trace, "--record-full", "act:*", "--precision", "fp32", script]
    ran = Ran(run_nndb(*argv), argv)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == python(script, forked=True).stdout
    first = float(re.search(r"^first (\S+)$", ran.stdout, re.M).group(1))
    t = nndb.open(trace)
    kept: dict = {}
    for e in t.full_tensors():
        kept.setdefault(e["step"], []).append(e["name"])
    assert len(kept[0]) > 32, kept[0]
    assert sorted(kept[0]) == sorted(kept[1]) == sorted(kept[2]), set(kept[0]) ^ set(kept[1])
    assert "netG.main.0" in kept[0] and "main.0" not in kept[0]
    assert float(t.tensor("netG.main.0", "act", 0).astype(np.float64).sum()) == first
    t.close()
