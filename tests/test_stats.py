import math

import numpy as np
import pytest
import torch

from nndb.tracer import stats as S


def reference(t: torch.Tensor) -> dict:
    """The statistics computed the slow, obvious way, in float64."""
    x = t.detach().double().reshape(-1)
    fin = x[torch.isfinite(x)]
    out = {"count": x.numel(), "nan_count": int(torch.isnan(x).sum()), "inf_count": int(torch.isinf(x).sum()),
           "zero_frac": float((x == 0).sum()) / x.numel() if x.numel() else math.nan}
    if fin.numel():
        out.update(mean=float(fin.mean()), std=float(fin.std()) if fin.numel() > 1 else 0.0,
                   norm=float(fin.norm()), mean_abs=float(fin.abs().mean()))
    values = x[~torch.isnan(x)]          # the extremes: of what is not NaN, an Inf included
    if values.numel():
        out.update(min=float(values.min()), max=float(values.max()))
    return out


def assert_close(got: dict, want: dict, rel=1e-5):
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=rel, abs=1e-6), k


@pytest.mark.parametrize("n", [1, 2, 7, 4096, S.HOST_MAX_ELEMENTS + 1, 300_000])
def test_stats_match_reference(n):
    g = torch.Generator().manual_seed(n)
    t = torch.randn(n, generator=g) * 3 + 0.5
    t[: n // 5] = 0
    assert_close(S.stats_of(t), reference(t))


@pytest.mark.parametrize("n", [10, 200_000])
def test_nonfinite_counted_and_excluded(n):
    t = torch.randn(n)
    t[1] = float("nan")
    t[2] = float("inf")
    t[3] = -float("inf")
    t[4] = 0.0
    got = S.stats_of(t)
    assert got["nan_count"] == 1 and got["inf_count"] == 2
    assert got["count"] == n
    assert math.isfinite(got["norm"]) and math.isfinite(got["mean"])
    assert_close(got, reference(t))


def test_all_nan_tensor():
    got = S.stats_of(torch.full((5,), float("nan")))
    assert got["nan_count"] == 5
    assert math.isnan(got["mean"]) and math.isnan(got["norm"])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_dtypes(dtype):
    t = torch.randn(1000).to(dtype)
    assert_close(S.stats_of(t), reference(t), rel=1e-3)


def test_noncontiguous_tensor():
    t = torch.randn(64, 32).t()
    assert not t.is_contiguous()
    assert_close(S.stats_of(t), reference(t))


def test_batch_equals_one_by_one():
    tensors = [torch.randn(n) for n in (3, 0, 100, 5000, 70_000)]
    tensors[2][7] = float("nan")
    batch = S.raw_many(tensors)
    for t, raw in zip(tensors, batch):
        one = S.raw_now(t)
        np.testing.assert_allclose(S.finalize(raw), S.finalize(one), rtol=1e-6, equal_nan=True)


def test_merge_equals_stats_of_concatenation():
    a, b = torch.randn(300), torch.randn(500) * 2 + 1
    merged = S.finalize(S.merge_raw(S.raw_now(a), S.raw_now(b)))
    whole = S.finalize(S.raw_now(torch.cat([a, b])))
    np.testing.assert_allclose(merged, whole, rtol=1e-9)


@pytest.mark.parametrize("n", [1000, 262_144])
def test_std_precision_with_large_mean(n):
    # A one-pass float32 variance would lose this; the host path sums in float64, the
    # large one (torch's float32 reductions) sums the squares again about the mean
    # (an activation of 1000 +- 0.0055 read std 0.0, norm 511,987.94 for 512,000.0)
    t = torch.full((n,), 1000.0) + torch.linspace(-1e-2, 1e-2, n)
    got = S.stats_of(t)
    assert got["std"] == pytest.approx(float(t.double().std()), rel=1e-3)
    assert got["norm"] == pytest.approx(float(t.double().norm()), rel=1e-7)


def test_statistics_do_not_touch_the_tensor_or_rng():
    t = torch.randn(100, requires_grad=True)
    before = t.detach().clone()
    state = torch.get_rng_state()
    S.stats_of(t)
    S.raw_many([t, t * 2])
    assert torch.equal(t.detach(), before)
    assert torch.equal(torch.get_rng_state(), state)


def test_one_column_equals_that_column_of_finalize_many():
    rows = np.array([S.raw_now(torch.randn(100)) for _ in range(4)]
                    + [S.raw_now(torch.tensor([1.0, float("nan"), 0.0, float("inf")])),
                       S.raw_now(torch.zeros(3))])
    full = S.finalize_many(rows)
    for i, name in enumerate(S.STAT_NAMES):
        np.testing.assert_array_equal(S.finalize_column(rows, name), full[:, i])


def test_parameter_block_equals_the_general_path():
    """The optimizer's small parameters read as one float32 block: the same rows
    as reducing each value, update and gradient on its own."""
    from torch import nn
    from nndb.tracer.params import ParamPlan
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    model(torch.randn(8, 5)).sum().backward()
    params = list(model.parameters())
    plan = ParamPlan(params)
    before = plan.values_before()                 # (in the plan's buffer: the block writes the update there)
    saved = before.copy()
    old = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p in params:
            p.add_(p.grad, alpha=-0.1)
    tensors = [p.detach() for p in params] + [p.detach() - o for p, o in zip(params, old)] + [p.grad for p in params]
    want = S.finalize_many(S.raw_many(tensors, True))

    def block(full, grads=True):
        before[:] = saved
        return plan.block(before, full, grads)
    with_grads, rows, hists = block(True)
    assert with_grads
    np.testing.assert_allclose(S.finalize_many(rows), want, rtol=1e-6, atol=1e-7)
    from nndb import histogram as Hs
    assert np.array_equal(hists, np.stack([Hs.exact(t.detach().numpy()) for t in tensors]))   # full step: histograms
    _, norm_rows, no_hists = block(False)
    assert no_hists is None
    norms = S.finalize_column(norm_rows, "norm")
    np.testing.assert_allclose(norms, want[:, S.STAT_NAMES.index("norm")], rtol=1e-6)
    assert np.isnan(S.finalize_column(norm_rows, "mean")).all()
    _, no_grads, _ = block(False, False)               # hand-written updates: values and updates only
    assert len(no_grads) == 2 * len(params)
    # the general path takes what the block cannot read, with ``before`` intact
    params[0].grad = None
    assert block(False) is None and np.array_equal(before, saved)
    params[0].grad = torch.zeros_like(params[0]).to_sparse()
    assert block(False) is None and np.array_equal(before, saved)
    assert plan.block(saved, False, True) is None                  # not the plan's own buffer
    double = ParamPlan([p.detach().double() for p in params])
    assert double.block(double.values_before(), False, False) is None


def test_a_large_float32_block_has_the_rows_of_its_float64_copy(monkeypatch):
    """A float32 block past DOT_MIN_ELEMENTS has its extremes read in float32: the
    same full rows, zeros, extremes and a NaN's segment included."""
    rng = np.random.default_rng(3)
    sizes = [4096, 7, 1, 300, 2048]
    flat = (rng.standard_normal(sum(sizes)) * 0.02).astype(np.float32)
    flat[::11] = 0
    flat[4100] = np.nan
    want = S.host_raw_segments(flat.astype(np.float64), sizes)
    monkeypatch.setattr(S, "DOT_MIN_ELEMENTS", 8)
    got = S.host_raw_segments(flat, sizes)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert got[1, S.RAW_NAN] == 1 and got[0, S.RAW_ZERO] == np.count_nonzero(flat[:4096] == 0)


def test_a_large_blocks_norms_read_each_tensor_where_it_lies(monkeypatch):
    """A block past DOT_MIN_ELEMENTS (a GPT's) between full steps: each value, update and
    gradient dotted where it lies (no copy into the buffer), the same norms as the small
    block's and as float64; a NaN counted, a gradient too small for float32 squares not
    read as zero; what it cannot read goes to the general path with ``before`` intact."""
    from torch import nn
    from nndb.tracer.params import ParamPlan
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    model(torch.randn(8, 6)).sum().backward()
    params = list(model.parameters())
    plan = ParamPlan(params)
    before = plan.values_before()
    saved = before.copy()
    old = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p in params:
            p.add_(p.grad, alpha=-0.1)

    def norms(large):
        before[:] = saved
        done = plan._block_large(before, True) if large else plan.block(before, False, True)
        return done if done is None else (S.finalize_column(done[1], "norm"), S.finalize_column(done[1], "nan_count"))
    tensors = [p.detach() for p in params] + [p.detach() - o for p, o in zip(params, old)] + [p.grad for p in params]
    want = [float(t.double().norm()) for t in tensors]
    large = norms(True)
    updates = np.concatenate([t.reshape(-1).numpy() for t in tensors[len(params):2 * len(params)]])
    np.testing.assert_array_equal(before, updates)              # (made in place of the values before)
    small = norms(False)
    np.testing.assert_array_equal(before, saved)                # (the small block's: into its buffer)
    np.testing.assert_allclose(large[0], want, rtol=1e-6)
    np.testing.assert_allclose(large[0], small[0], rtol=1e-6)
    params[1].grad[0] = float("nan")
    params[2].grad.fill_(1e-21)                 # (squares of 1e-21 are 0 in float32)
    # an update of 1e-21 too: the small block squares its buffer in place, and reads such a
    # segment again for its exact path (ParamPlan._segment), the update from the values before
    # (abs=0: pytest.approx's default absolute tolerance, 1e-12, took 3.9e-42 for 3.9e-21)
    bias = sum(p.numel() for p in params[:3])
    with torch.no_grad():
        params[3].fill_(1e-21)
    saved[bias:bias + params[3].numel()] = 0.0
    k = len(params)
    for got in (norms(True), norms(False)):
        assert got[1][2 * k + 1] == 1 and got[1].sum() == 1
        assert got[0][2 * k + 2] == pytest.approx(1e-21 * math.sqrt(params[2].numel()), rel=1e-6, abs=0)
        assert got[0][k + 3] == pytest.approx(1e-21 * math.sqrt(params[3].numel()), rel=1e-6, abs=0)
        assert got[0][3] == pytest.approx(1e-21 * math.sqrt(params[3].numel()), rel=1e-6, abs=0)
        np.testing.assert_allclose(np.delete(got[0], [3, k + 3, 2 * k + 1, 2 * k + 2]),
                                   np.delete(small[0], [3, k + 3, 2 * k + 1, 2 * k + 2]), rtol=1e-6)
    for bad in (None, torch.zeros(6, 5).t()):    # no gradient; one not contiguous
        params[0].grad = bad
        assert norms(True) is None and np.array_equal(before, saved)
    # a step's record takes that way past DOT_MIN_ELEMENTS, between full steps only

    class Bucket:
        params, param_hists, covered = {}, {}, set()
    monkeypatch.setattr(S, "DOT_MIN_ELEMENTS", plan.n)
    params[0].grad = torch.ones_like(params[0])
    taken = []
    real = plan._block_large
    monkeypatch.setattr(plan, "_block_large", lambda *a: taken.append(a) or real(*a))
    for full in (False, True):
        plan.snapshot().record(Bucket, full=full)
        assert len(taken) == 1 and len(Bucket.params[plan][1]) == 3 * len(params)


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph")     # (torch's note on the cycle)
def test_parameter_block_reads_gradients_of_a_create_graph_backward():
    """A gradient that itself needs grad (backward(create_graph=True)) is read
    like any other; the block's buffer joins no graph and grad mode is back."""
    from nndb.tracer.params import ParamPlan
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2)
    (lin(torch.randn(4, 3)) ** 2).sum().backward(create_graph=True)
    params = list(lin.parameters())
    assert all(p.grad.requires_grad for p in params)
    plan = ParamPlan(params)
    _, rows, _ = plan.block(plan.values_before(), False, True)
    want = [p.grad.detach().double().norm().item() for p in params]
    np.testing.assert_allclose(S.finalize_column(rows, "norm")[-2:], want, rtol=1e-6)
    assert torch.is_grad_enabled() and not any(v.requires_grad for v in plan._grad_dst)
    for p in params:
        p.grad = None                   # (the cycle torch warns of)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])     # the float32 block, the general path
def test_an_update_from_inf_to_inf_warns_nothing(recwarn, dtype):
    from nndb.tracer.params import ParamPlan
    p = torch.nn.Parameter(torch.tensor([float("inf"), 1.0, 2.0], dtype=dtype))
    p.grad = torch.ones(3, dtype=dtype)
    plan = ParamPlan([p])
    snap = plan.snapshot()

    class Bucket:
        params, covered = {}, set()
    snap.record(Bucket, full=False)
    rows = Bucket.params[plan][1]
    assert S.finalize_column(rows, "nan_count")[1] == 1           # the update inf - inf is NaN
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_quiet_silences_numpy_and_gives_the_users_error_state_back():
    """nndb's own numpy calls run with warnings off (Quiet, quiet: cheaper than
    np.errstate); the script's error state is untouched before and after."""
    from nndb.tracer.quiet import Quiet, quiet

    @quiet
    def divide(a, b):
        return np.divide(a, b)
    one = np.ones(2)
    with np.errstate(all="raise"):                       # what a script may have set
        with Quiet():
            assert np.isinf(one / 0).all() and np.geterr()["divide"] == "ignore"
            with Quiet():                                # (nested: the hooks call decorated functions)
                assert np.isnan(np.zeros(1) / 0).all()
            assert np.geterr()["invalid"] == "ignore"
        assert np.isinf(divide(one, 0)).all()
        assert np.geterr() == {"divide": "raise", "over": "raise", "under": "raise", "invalid": "raise"}
        with pytest.raises(FloatingPointError):
            one / 0
        with pytest.raises(ZeroDivisionError):
            with Quiet():
                1 / 0                                    # (an exception inside: the state still comes back)
        assert np.geterr()["divide"] == "raise"


def test_quiet_falls_back_to_errstate_without_numpy_2s_context_variable(monkeypatch):
    """(numpy 1.x has no numpy._core: Quiet and quiet are np.errstate there.)"""
    from nndb.tracer import quiet as Q
    monkeypatch.setattr(Q, "_ERRSTATE", None)
    half = Q.quiet(lambda a: np.divide(a, 0))
    with np.errstate(all="raise"):
        with Q.Quiet():
            assert np.isinf(np.ones(1) / 0).all()
        assert np.isinf(half(np.ones(1))).all()
        assert np.geterr()["divide"] == "raise"


def test_float16_norms_between_full_steps_are_exact_to_float32():
    """A CPU float16 model's gradients are read between full steps by norm
    rows only: their squares were summed in float16, where a square under
    6e-8 is 0 (a gradient norm of 0.002 read 0.0) and a sum over 65504 inf."""
    from nndb.tracer import stats as S
    g = np.random.default_rng(0)
    small = (g.standard_normal(4096) * 3e-5).astype(np.float16)
    large = (g.standard_normal(4096) * 300).astype(np.float16)
    rows = S.host_norm_segments(np.concatenate([small, large]), [4096, 4096])
    for row, x in zip(rows, (small, large)):
        want = np.sqrt(np.dot(x.astype(np.float64), x.astype(np.float64)))
        assert np.sqrt(row[S.RAW_SQ]) == pytest.approx(want, rel=1e-6)


def test_large_parameters_norms_in_bulk_equal_the_exact_ones_step_after_step(monkeypatch):
    """Parameters too large for the host block: value, update and gradient norms
    of all of them between full steps (stats.norm_rows_bulk: on the CPU by rows of
    squares, not by torch's float64 norm, 10-50x slower there), agreeing with float64
    sums; the values before reuse the plan's buffers from step to step; a non-finite
    one is counted exactly."""
    from nndb.tracer.params import ParamPlan
    monkeypatch.setattr(S, "HOST_MAX_PARAM_ELEMENTS", 8)
    monkeypatch.setattr(S, "HOST_MAX_ELEMENTS", 8)
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, 5)), torch.nn.Parameter(torch.randn(9, dtype=torch.float64)),
              torch.nn.Parameter(torch.randn(30).half())]
    plan = ParamPlan(params)
    assert [id(p) for p in plan.large] == [id(p) for p in params] and not plan.host

    class Bucket:
        def __init__(self):
            self.rows, self.covered = {}, set()

        def add(self, key, raw):
            self.rows[key] = raw
    calls = []
    real = torch._foreach_norm
    monkeypatch.setattr(torch, "_foreach_norm", lambda *a, **k: (calls.append(len(a[0])), real(*a, **k))[1])
    buffers = None
    for step in range(3):
        for p in params:
            p.grad = torch.randn_like(p)
        if step == 2:
            params[0].grad[1, 2] = float("nan")
        snap = plan.snapshot()
        if buffers is not None:
            assert all(a is b for a, b in zip(snap.large_before, buffers))      # (no new tensors a step)
        old = [p.detach().clone() for p in params]
        with torch.no_grad():
            for p in params:
                p.add_(p.grad.nan_to_num(), alpha=-0.1)
            if step == 2:
                params[1][3] = float("inf")       # (an update of +inf: its row's sums, the update's)
        b = Bucket()
        calls.clear()
        snap.record(b, full=False)
        assert calls == []                    # (the CPU's: no float64 norm)
        buffers = plan._large_spare
        for p, o in zip(params, old):
            for kind, t in (("param", p.detach()), ("update", p.detach() - o), ("grad", p.grad)):
                raw = b.rows[("param", p, kind)]
                want = S.raw_now(t, True)
                assert raw[0] == t.numel() and raw[7] == want[7] and raw[8] == want[8]
                x = t.detach().double()
                np.testing.assert_allclose(S.finalize(raw)[S.STAT_NAMES.index("norm")],
                                           float(x[x.isfinite()].norm()),
                                           rtol=1e-12 if p.dtype == torch.float64 else 1e-6)
                if not t.isfinite().all():
                    np.testing.assert_array_equal(raw, want)             # (the exact path's whole row)
    assert b.rows[("param", params[0], "grad")][7] == 1           # the NaN, counted
    upd = b.rows[("param", params[1], "update")]
    assert upd[S.RAW_INF] == 1 and upd[S.RAW_MAX] == math.inf and upd[S.RAW_MIN] > -math.inf


def test_a_large_cpu_tensors_norm_is_its_float64_norm_to_float32_precision():
    """A large CPU tensor's norm between full steps (an activation's, a large parameter's,
    gradient's or update's): one float32 dot over 2 M values of 0.1 read a norm 5e-5 off
    (6.4 M: 4e-4), a float64 norm took 10-50x a dot's time; its squares' rows summed in
    float64 (stats.cpu_sumsq) agree with float64 to 1e-6.  Squares that underflow float32
    (a vanishing gradient's 1e-24) are summed again in float64, not read as 0."""
    n = (1 << 21) + 5                                   # (rows of SQ_ROW and a tail)
    tensors = {"equal": torch.full((n,), 0.1), "normal": torch.randn(n, generator=torch.Generator().manual_seed(0)),
               "tiny": torch.full((n,), 1e-24), "zero": torch.zeros(n), "half": torch.full((n,), 0.1).half()}
    norm = S.STAT_NAMES.index("norm")
    for name, t in tensors.items():
        x = t.double().numpy()
        want = math.sqrt(float(np.dot(x, x)))
        got = [S.finalize(S.norm_rows_bulk([t])[0])[norm], S.finalize(S.cpu_raw_large(t, False))[norm],
               S.finalize(S.cpu_raw_large(t, True))[norm]]
        if want == 0:
            assert got == [0.0, 0.0, 0.0], name
        else:
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=name)
