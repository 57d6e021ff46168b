"""Distributions over time: the fixed histograms taken at full steps, what is
read from them (approximate quantiles with their bins, exact zero/NaN/Inf
counts, KS), ``compare`` on a planted dying layer, and the TensorBoard export."""
import re

import numpy as np
import pytest
import torch

import nndb
from conftest import Ran, nndb as run_nndb, ROOT
from nndb import histogram as H
from nndb.tracer.histogram import exact_zeros, of_tensor

SCRIPT = f"{ROOT}/tests/scripts/dying_relu_cnn.py"
ADVERSARIAL = np.array([1e-8, 7e4, 1e30, -1e30, np.nan, np.inf, -np.inf, 1e-40, -1e-45, -0.0, 0.0, 1.0,
                        -3.3, 2.0 ** 24, -2.0 ** 24, 2.0 ** -24, 1.5, 1.4999999, 3.4028235e38], dtype=np.float32)


# one bincount of all, folded; each element's bin looked up (few elements a segment); one a segment (large blocks)
@pytest.mark.parametrize("path", ["fold", "lookup", "by_segment"])
def test_bins_from_float32_bits_equal_the_value_by_value_histogram(path, monkeypatch):
    monkeypatch.setattr(H, "FEW_ELEMENTS", 1000 if path == "lookup" else 0)
    if path == "by_segment":
        monkeypatch.setattr(H, "LARGE_ELEMENTS", 1)
        monkeypatch.setattr(H, "LARGE_SEGMENT", 1)
    rng = np.random.default_rng(0)
    segs = [ADVERSARIAL, rng.standard_normal(5000).astype(np.float32),
            np.where(rng.random(300) < 0.7, 0, rng.standard_normal(300)).astype(np.float32),
            np.array([], dtype=np.float32), (rng.standard_normal(64) * 1e-30).astype(np.float32)]
    got = H.of_segments(np.concatenate(segs), [len(s) for s in segs])
    for g, s in zip(got, segs):
        want = H.exact(s)
        assert np.array_equal(g, want)
        assert g.sum() == len(s)
        assert np.array_equal(of_tensor(torch.from_numpy(s.copy())), want)
    h = H.exact(ADVERSARIAL)
    assert h[H.I_NAN] == 1 and h[H.I_POS_INF] == 1 and h[H.I_NEG_INF] == 1
    assert h[H.I_ZERO] == 2                                   # +0.0 and -0.0, exactly
    assert h[H.I_POS_UNDER] == 2 and h[H.I_NEG_UNDER] == 1    # 1e-8, 1e-40; -1e-45 (subnormals)
    assert h[H.I_POS_OVER] == 3 and h[H.I_NEG_OVER] == 2      # 2^24, 1e30, 3.4e38; -1e30, -2^24
    # float64 values float32 cannot hold keep their bins
    assert np.array_equal(of_tensor(torch.tensor([1e-300, 1e300, -0.0], dtype=torch.float64)),
                          H.exact(np.array([1e-300, 1e300, -0.0])))
    assert H.exact(np.array([1e-300]))[H.I_POS_UNDER] == 1 and H.exact(np.array([1e300]))[H.I_POS_OVER] == 1


def test_one_tensor_strided_half_or_with_a_signalling_nan_gets_the_exact_histogram():
    """of_tensor counts a tensor's float32 keys with torch.bincount and folds
    them: the same bins as value by value, for a view that is not contiguous,
    an fp16 tensor, a tensor with no zero or special value (no correction
    pass) and one with a signalling NaN (its keys read as Inf: corrected)."""
    rng = np.random.default_rng(1)
    plain = (rng.standard_normal(4000) * 10.0 ** rng.integers(-20, 20, 4000)).astype(np.float32)
    t = torch.from_numpy(plain)
    cases = [t, t.reshape(-1, 4)[:, 1], t.reshape(40, 100).t(), t.half(), torch.from_numpy(ADVERSARIAL.copy())]
    snan = plain.copy()
    snan.view(np.uint32)[7] = 0x7F800001                      # exponent 255, top mantissa bit clear
    cases.append(torch.from_numpy(snan))
    for c in cases:
        want = H.exact(c.double().numpy())
        got = of_tensor(c)
        assert np.array_equal(got, want), c.dtype
        assert got.sum() == c.numel()
    assert of_tensor(cases[-1])[H.I_NAN] == 1 and of_tensor(cases[-1])[H.I_POS_INF] == 0

def test_a_large_tensors_histogram_takes_its_zero_count_from_the_full_row():
    """At a full step a large tensor's raw row has counted its zeros exactly;
    of_tensor takes that count instead of counting again, and the bins stay
    exact: zeros beside subnormals (both have exponent 0), a row of another
    element count or one that did not measure zeros (a usual step) ignored."""
    from nndb.tracer import stats as S
    rng = np.random.default_rng(3)
    relu = np.maximum(rng.standard_normal(20000), 0).astype(np.float32)
    sub = relu.copy()
    sub[::97] = np.float32(1e-41)                               # subnormals: exponent 0, not zero
    for a in (relu, sub):
        t = torch.from_numpy(a)
        want = H.exact(a.astype(np.float64))
        raw = S.raw_now(t, True)
        assert exact_zeros(raw, t.numel()) == np.count_nonzero(a == 0)
        assert np.array_equal(of_tensor(t, raw), want)
        assert exact_zeros(S.raw_now(t, False), t.numel()) is None      # (a usual step's row: not measured)
        assert np.array_equal(of_tensor(t, S.raw_now(t, False)), want)
        assert exact_zeros(raw, t.numel() + 1) is None
        assert np.array_equal(of_tensor(t[:-1], raw), H.exact(a[:-1].astype(np.float64)))
    big = np.array([float(1 << 25), 0, 0, 0, 0, 0, 7, 0, 0])    # (n, ..., nzero, ...): past float32's exact counts
    assert exact_zeros(big, 1 << 25) is None


def test_quantiles_lie_in_their_bins_and_ks_measures_the_shift():
    rng = np.random.default_rng(1)
    a = rng.standard_normal(20000).astype(np.float32)
    a[::4] = 0
    h = H.exact(a)
    for q in (0.01, 0.1, 0.3, 0.5, 0.7, 0.99):
        lo, est, hi = H.quantile_bounds(h, q)
        true = float(np.quantile(a, q, method="inverted_cdf"))
        assert lo <= true <= hi and lo <= est <= hi, q
        assert hi == lo or (lo > 0 and hi / lo <= 1.5 + 1e-9) or (hi < 0 and lo / hi <= 1.5 + 1e-9)
    assert H.zero_share(h) == np.count_nonzero(a == 0) / a.size
    assert H.ks(h, h) == 0.0
    b = a * 4
    ks = H.ks(h, H.exact(b))
    # at the bin edges: a lower bound of the samples' KS statistic, and near it here
    xs = np.sort(np.concatenate([a, b]))
    true_ks = np.max(np.abs(np.searchsorted(np.sort(a), xs, "right") / a.size
                            - np.searchsorted(np.sort(b), xs, "right") / b.size))
    assert 0.5 * true_ks < ks <= true_ks + 1e-12


# -- a planted dying layer -------------------------------------------------------------------

COMMANDS = ["break step 35", "continue",
            "compare act relu1 0 30",
            "compare act relu1 --checkpoints 3 --png {png}",
            "delete", "continue"]


@pytest.fixture(scope="module")
def dying(tmp_path_factory):
    d = tmp_path_factory.mktemp("dying")
    trace, png = str(d / "run.h5"), str(d / "cmp.png")
    argv = ["run", "--batch", "-q", "--nx", "--trace", trace, "--full-every", "10", "--checkpoint-every", "10",
            "--record-full", "act:fc2", "--full-tensors-buffer", "0.0001",
            *[x for c in COMMANDS for x in ("-e", c.format(png=png))], SCRIPT, "--steps", "40"]
    return d, trace, png, Ran(run_nndb(*argv, cwd=str(d)), argv)


def _zeros(block: str) -> tuple:
    m = re.search(r"^zeros\s+\d+ \(([\d.]+)%\)\s+\d+ \(([\d.]+)%\)", block, re.M)
    return float(m.group(1)), float(m.group(2))


def test_compare_shows_the_share_of_zeros_growing(dying):
    _, _, png, ran = dying
    assert ran.returncode == 0, ran.stderr
    out = ran.stdout
    first, second = out.split("act relu1: step ")[1:3]
    a, b = _zeros(first)
    assert first.startswith("0 against step 30") and a < 60 and b > 90 and b > a + 30
    ks = float(re.search(r"^KS statistic\s+([\d.]+)", first, re.M).group(1))
    assert ks > 0.3
    assert re.search(r"^q0\.5 \(approx\.\)\s+~\S+ \[\S+, \S+\]", first, re.M)
    assert "approximate" in first and "█" in first
    # the last 3 checkpoints: 20, 30 (full steps: from the trace) and the stop's at 35 (none
    # there: measured on a replica resumed from it, in the step after it)
    assert second.startswith("20 against step 36")
    assert "checkpoints at steps 20, 30, 35\n  measured on replicas (not in the trace): checkpoint 35 -> step 36" \
        in second
    c, d = _zeros(second)
    assert d >= c > a
    assert f"wrote {png}" in out
    with open(png, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_step_over_the_bound_of_pending_tensors_is_skipped_and_said(dying):
    _, trace, _, ran = dying
    said = [line for line in ran.stderr.splitlines() if "skipped" in line]
    assert len(said) == 1 and "act fc2 needs 1280 bytes" in said[0]
    t = nndb.open(trace)
    skipped = [e for e in t.events if e["kind"] == "full_tensors_skipped"]
    assert [e["step"] for e in skipped] == list(range(40))
    assert t.full_tensors() == []


def test_histograms_through_the_api_and_inspect(dying):
    _, trace, _, _ = dying
    t = nndb.open(trace)
    assert t.histogram_steps("relu1", "act") == [0, 10, 20, 30]
    h0, h30 = t.histogram("relu1", "act", 0), t.histogram("relu1", "act", 30)
    assert h0.sum() == h30.sum() == 32 * 32
    assert H.zero_share(h30) > H.zero_share(h0)
    # every recorded tensor has one at a full step: parameters, gradients, updates, activations, the loss
    kinds = {s.kind for s in t.tensors if t.histogram_steps(s.name, s.kind) == [0, 10, 20, 30]}
    assert kinds == {"param", "grad", "update", "act", "loss"}
    # the histogram's zero count is the statistics' zero_frac, exactly
    zf = t.stats(30)["act"]["relu1"]["zero_frac"]
    assert h30[H.I_ZERO] == round(zf * 1024)
    with pytest.raises(nndb.errors.UsageError, match="histograms at steps 0, 10, 20, 30, not at step 5"):
        t.histogram("relu1", "act", 5)
    t.close()
    ran = run_nndb("inspect", trace, "--tensor", "act:relu1", "--step", "30")
    assert ran.returncode == 0, ran.stderr
    assert "no whole tensor kept at step 30" in ran.stdout and re.search(r"zeros \d+ \(9\d\.\d%\)", ran.stdout)


def test_histograms_go_to_tensorboard(dying, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing import event_accumulator as ea
    _, trace, _, _ = dying
    out = str(tmp_path / "tb")
    ran = run_nndb("export", trace, "--tensorboard", out, "--rules", "none")
    assert ran.returncode == 0, ran.stderr
    assert re.search(r"\d+ histogram\(s\)", ran.stdout)
    acc = ea.EventAccumulator(out, size_guidance={ea.HISTOGRAMS: 0})
    acc.Reload()
    assert "act/relu1/hist" in acc.Tags()["histograms"]
    t = nndb.open(trace)
    for ev in acc.Histograms("act/relu1/hist"):
        h = t.histogram("relu1", "act", ev.step)
        v = ev.histogram_value
        assert v.num == h.sum() - h[H.I_NAN] - h[H.I_POS_INF] - h[H.I_NEG_INF]
        assert sum(v.bucket) == v.num
        zero_bucket = list(v.bucket_limit).index(0.0)
        assert v.bucket[zero_bucket] == h[H.I_ZERO]


def test_a_containers_output_that_is_its_last_childs_is_measured_once(tmp_path, monkeypatch):
    """A Sequential's output is its last child's tensor (nested twice here),
    large enough for the one-by-one path: its row and histogram are the
    child's, measured once a step, not once per module that returns it."""
    import nndb
    from nndb.tracer import histogram as TH
    from nndb.tracer import recorder as R

    calls = {"hist": 0, "row": 0}
    real_hist, real_row = TH.of_tensor, R.S.raw_now

    def hist(t, raw=None):
        calls["hist"] += 1
        return real_hist(t, raw)

    def row(t, full=True):
        calls["row"] += 1
        return real_row(t, full)
    monkeypatch.setattr(R.H, "of_tensor", hist)
    monkeypatch.setattr(R.S, "raw_now", row)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(8, 128), torch.nn.ReLU()))
    opt = torch.optim.SGD(model.parameters(), 0.1)
    x = torch.randn(64, 8)                          # outputs of 64 x 128 = 8,192 elements (> HOST_MAX_ELEMENTS)
    with nndb.record(tmp_path / "t.h5") as rec:
        for _ in range(3):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    # each step's activations: the Linear's and the ReLU's (2 more modules return the ReLU's);
    # histograms at the full step, step 0
    assert calls["row"] == 3 * 2 and calls["hist"] == 2
    t = rec.trace
    names = {s.name for s in t.tensors if s.kind == "act"}
    assert {"0.0", "0.1", "0", "model"} <= names, names
    for stat in t.columns:
        relu = t.series("0.1", "act", stat)
        for same in ("0", "model"):
            assert np.array_equal(t.series(same, "act", stat), relu, equal_nan=True), (same, stat)
    assert not np.array_equal(t.series("0.0", "act", "min"), t.series("0.1", "act", "min"))
    assert np.array_equal(t.histogram("model", "act", 0), t.histogram("0.1", "act", 0))
    assert np.array_equal(t.histogram("0", "act", 0), t.histogram("0.1", "act", 0))
    assert t.histogram("0.1", "act", 0).sum() == 64 * 128


def test_the_accelerator_path_reads_counts_and_zeros_in_one_transfer_and_stays_exact():
    """histogram.device_counts, the path of a CUDA tensor (scripts/gpu_check.py
    runs it there), run here on CPU tensors: the fine counts and the zero count
    come back together (or the count from the full row), and a subnormal, an
    Inf or a signalling NaN still sends the tensor to the exact count."""
    from nndb.tracer import histogram as TH
    rng = np.random.default_rng(5)
    relu = np.maximum(rng.standard_normal(5000), 0).astype(np.float32)
    sub = relu.copy()
    sub[::61] = np.float32(1e-41)
    inf = relu.copy()
    inf[3] = np.inf
    snan = relu.copy()
    snan.view(np.uint32)[9] = 0x7F800001
    for a in (relu, sub, inf, snan):
        f = torch.from_numpy(a)
        fine = torch.bincount((f.view(torch.int32) >> 22).bitwise_and_(H.FINE - 1), minlength=H.FINE)
        with np.errstate(invalid="ignore"):                    # (a signalling NaN's cast)
            want = H.exact(a.astype(np.float64))
        assert np.array_equal(TH.device_counts(f, fine, None), want)
        assert np.array_equal(TH.device_counts(f, fine, int(np.count_nonzero(a == 0))), want)


@pytest.mark.parametrize("path", ["offsets", "by_segment"])
def test_full_segments_rows_and_histograms_equal_the_separate_passes(path, monkeypatch):
    """A full step's rows and histograms made together (``full_segments``: the histograms
    counted by torch.bincount, the rows' zero counts read from their zero bins, one float64
    copy reduced in place) are the rows ``host_raw_segments`` counts on its own and the
    value-by-value histograms, bit for bit: zeros of both signs, subnormals, NaN, Inf, empty
    segments, a block large enough to be counted a segment at a time."""
    from nndb.tracer import histogram as TH
    from nndb.tracer import stats as S
    if path == "by_segment":
        monkeypatch.setattr(H, "LARGE_ELEMENTS", 1)
        monkeypatch.setattr(H, "LARGE_SEGMENT", 1)
        monkeypatch.setattr(TH, "TORCH_COUNT_MIN", 64)
    rng = np.random.default_rng(5)
    segs = [ADVERSARIAL, rng.standard_normal(5000).astype(np.float32),
            np.where(rng.random(3000) < 0.5, 0, rng.standard_normal(3000)).astype(np.float32),
            np.array([], dtype=np.float32), (rng.standard_normal(640) * 1e-30).astype(np.float32),
            np.where(rng.random(700) < 0.5, -0.0, 0.0).astype(np.float32), rng.standard_normal(4096).astype(np.float32)]
    flat, sizes = np.concatenate(segs), [len(s) for s in segs]
    assert TH.fine_counts(flat.view(np.uint32), sizes) is not None          # (torch counted them)
    rows, hists = TH.full_segments(flat.copy(), sizes)
    assert rows.tobytes() == S.host_raw_segments(flat.copy(), sizes).tobytes()
    for h, s in zip(hists, segs):
        assert np.array_equal(h, H.exact(s))
    assert rows[5, S.RAW_ZERO] == 700 and rows[0, S.RAW_NAN] == 1


def test_fold_puts_each_fine_key_in_its_bin():
    """``fold`` (slices and one reduceat) is the lookup table's map, key by key."""
    one_each = np.eye(H.FINE, dtype=np.int64)
    folded = H.fold(one_each)
    assert (folded.sum(axis=1) == 1).all() and np.array_equal(folded.argmax(axis=1), H.LUT)
