"""initial_loss and loss_broadcast see torch.nn.functional losses and
hand-written ones (issue 19), through the TorchFunctionMode of
nndb.rules.loss_watch; legit broadcasts stay silent; the mode is off the
stack after the probe's steps and changes no number."""
import textwrap

import pytest
import torch

from conftest import findings_of, nndb, python, run_in_process

HEADER = """\
import sys
import torch
import torch.nn as nn
import torch.nn.functional as F
SEED, STEPS, FLAG = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.manual_seed(SEED)
N = 16 + 8 * SEED
OPT = [torch.optim.SGD, torch.optim.Adam, torch.optim.RMSprop][SEED % 3]
"""


def write(tmp_path, name, body) -> str:
    path = tmp_path / name
    path.write_text(HEADER + textwrap.dedent(body))
    return str(path)


def line_of(script: str, text: str) -> int:
    """The line of the script that holds ``text`` (where a finding must point)."""
    [n] = [i for i, line in enumerate(open(script).read().splitlines(), 1) if text in line]
    return n


def rule(res, rule_id) -> list:
    assert res.exit_code == 0
    assert all(r.enabled for r in res.session.rules.rules)       # no rule failed
    return [f for f in res.session.log.findings if f["rule"] == rule_id]


# -- initial_loss with F.cross_entropy ---------------------------------------------------------
CLASSIFIER = """
    C = 5 + 3 * SEED
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, C))
    with torch.no_grad():
        model[2].weight.normal_(0, 3.0 if FLAG.startswith("bad") else 0.05)
    x, y = torch.randn(N, 12), torch.randint(0, C, (N,))
    opt = OPT(model.parameters(), lr=1e-3)
    for step in range(STEPS):
        opt.zero_grad()
        if FLAG.endswith("nll"):
            loss = F.nll_loss(F.log_softmax(model(x), dim=1), y)
        else:
            loss = F.cross_entropy(model(x), y, reduction="sum")     # the rule recomputes the mean
        loss.backward()
        opt.step()
"""


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kind", ["ce", "nll"])
def test_initial_loss_of_functional_cross_entropy(tmp_path, seed, kind):
    script = write(tmp_path, "cls.py", CLASSIFIER)
    [f] = rule(run_in_process(tmp_path, script, (seed, 3, f"bad_{kind}")), "initial_loss")
    assert f["step"] == 0
    fn = "cross_entropy" if kind == "ce" else "nll_loss"
    assert f["module"] == f"F.{fn} at cls.py:{line_of(script, f'loss = F.{fn}(')}"
    ev = f["evidence"]
    assert ev["classes"] == 5 + 3 * seed and ev["ratio"] > 2


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_functional_cross_entropy_at_chance_is_healthy(tmp_path, seed):
    script = write(tmp_path, "cls.py", CLASSIFIER)
    assert findings_of(run_in_process(tmp_path, script, (seed, 3, "good_ce"))) == []


# -- loss_broadcast in hand-written and functional losses --------------------------------------
REGRESSION = """
    model = nn.Sequential(nn.Linear(6, 24), nn.Tanh(), nn.Linear(24, 1))
    x = torch.randn(N, 6)
    y = x[:, 0] - 0.5 * x[:, 1]                       # (N,)
    opt = OPT(model.parameters(), lr=1e-2)
    w = torch.rand(N, 1)
    for step in range(STEPS):
        opt.zero_grad()
        pred = model(x)                               # (N, 1)
        if FLAG == "hand":
            loss = ((pred - y) ** 2).mean()
        elif FLAG == "hand_reversed":
            loss = (y - pred * 1.0).abs().mean()     # what is made of the output counts too
        elif FLAG == "functional":
            loss = F.l1_loss(pred, y)
        elif FLAG == "matching":
            loss = ((pred.squeeze(1) - y) ** 2).mean() + F.mse_loss(pred, y[:, None])
        elif FLAG == "legit":                         # per-sample weights, a bias, a normalisation
            z = (pred - y[:, None]) * w
            pairwise = (x[:, None, :] - x[None, :, :]).norm(dim=-1)      # an outer difference of inputs
            scores = torch.cat([pred, pred], 1) + torch.tensor([0.5, -0.5])
            centred = scores - scores.mean(0)
            emb = pred.unsqueeze(1) - pred.unsqueeze(0)                 # on purpose, reshaped first
            loss = (z ** 2).mean() + 0 * pairwise.mean() + 0 * centred.mean() + 0 * emb.mean()
        loss.backward()
        opt.step()
"""


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("flag,op,text", [("hand", "`-`", "((pred - y) ** 2)"), ("hand_reversed", "`-`", "(y - pred"),
                                          ("functional", "F.l1_loss", "F.l1_loss(pred, y)")])
def test_loss_broadcast_wherever_the_loss_is_written(tmp_path, seed, flag, op, text):
    script = write(tmp_path, "reg.py", REGRESSION)
    [f] = rule(run_in_process(tmp_path, script, (seed, 3, flag)), "loss_broadcast")
    n = 16 + 8 * seed
    assert f["step"] == 0 and f["severity"] == "error"
    assert f["module"] == f"{op} at reg.py:{line_of(script, text)}"
    assert f["evidence"]["broadcast_shape"] == [n, n]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("flag", ["matching", "legit"])
def test_broadcasts_that_create_no_batch_dimension_are_silent(tmp_path, seed, flag):
    script = write(tmp_path, "reg.py", REGRESSION)
    assert findings_of(run_in_process(tmp_path, script, (seed, 4, flag))) == []


# A Siamese network's contrastive loss, hand-written on the distance of its two outputs, and
# a DQN's TD error on the action's Q-value: neither is the model's output itself.
PAIRS = """
    enc = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = OPT(enc.parameters(), lr=1e-3)
    protos = torch.randn(4, 10)
    for step in range(STEPS):
        c1, c2 = torch.randint(0, 4, (N,)), torch.randint(0, 4, (N,))
        x1, x2 = protos[c1] + 0.3 * torch.randn(N, 10), protos[c2] + 0.3 * torch.randn(N, 10)
        label = (c1 == c2).float()
        if FLAG == "siamese":
            label = label.unsqueeze(1)                     # (N, 1) against the distance's (N,)
        d = F.pairwise_distance(enc(x1), enc(x2))          # (N,)
        loss = (label * d ** 2 + (1 - label) * torch.clamp(1.0 - d, min=0) ** 2).mean()
        if FLAG == "dqn":
            q = enc(x1).gather(1, c1[:, None])             # (N, 1)
            with torch.no_grad():
                target = 0.9 * enc(x2).max(1)[0]           # (N,)
            loss = loss + ((q - target) ** 2).mean()
        if FLAG == "ranking":                              # every pair's score difference, on purpose
            s = enc(x1)[:, 0]
            loss = loss + F.binary_cross_entropy_with_logits(s - s[:, None], (c1 - c1[:, None] > 0).float())
        opt.zero_grad(); loss.backward(); opt.step()
"""


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("flag,op,text,shape", [("siamese", "`*`", "loss = (label * d", "(N,)"),
                                                ("dqn", "`-`", "((q - target) ** 2)", "(N, 1)")])
def test_loss_broadcast_of_a_per_sample_result_of_the_output(tmp_path, seed, flag, op, text, shape):
    """label (N, 1) * d (N,), d the pairwise distance of a Siamese network's two outputs, made an
    (N, N) loss, and so did a DQN's q (N, 1) - target (N,): loss_broadcast said nothing, as it
    looked only at the model's outputs and same-shape results made of them (nndb check's shapes
    line: SKIP, 'a hand-written loss'); a pairwise ranking's ``s - s[:, None]`` of scores that
    both need a gradient is made on purpose and stays silent."""
    script = write(tmp_path, "pairs.py", PAIRS)
    [f] = rule(run_in_process(tmp_path, script, (seed, 3, flag)), "loss_broadcast")
    n = 16 + 8 * seed
    assert f["step"] == 0 and f["module"] == f"{op} at pairs.py:{line_of(script, text)}"
    assert f["evidence"]["broadcast_shape"] == [n, n]
    assert f"a per-sample result of the model's output, of shape {shape.replace('N', str(n))}," in f["message"]
    assert findings_of(run_in_process(tmp_path, script, (seed, 3, "ranking"))) == []


def test_new_batch_dimension_unit():
    from nndb.rules.loss_watch import new_batch_dimension as new
    t = torch.zeros
    assert new(t(8, 1), t(8), (8, 8))
    assert new(t(8), t(8, 1), (8, 8))
    assert new(t(8, 1, 3), t(8, 3), (8, 8, 3))
    assert not new(t(8, 3), t(3), (8, 3))                 # a bias
    assert not new(t(8, 1), t(8, 3), (8, 3))              # per-sample weights
    assert not new(t(8, 1), t(1, 5), (8, 5))              # bigger, but the batch is not spread
    assert not new(t(1, 1), t(1), (1, 1))                 # a batch of one
    assert not new(t(8, 8), t(8), (8, 8))                 # (C = N by chance): nothing new


# -- the mode: off after the probe's steps, the numbers unchanged -------------------------------
def test_mode_is_off_the_stack_after_the_probe_steps(tmp_path):
    """The loss probe's mode is on for the first 20 steps (and one in 64), off at step 20 on."""
    script = write(tmp_path, "stack.py", """
        from torch.overrides import _get_current_function_mode_stack as stack
        model = nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        for step in range(STEPS):
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            print("modes", step, len(stack()))
            loss.backward()
            opt.step()
    """)
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        res = run_in_process(tmp_path, script, (0, 23, ""))
    assert res.exit_code == 0
    counts = {int(s): int(n) for _, s, n in (line.split() for line in out.getvalue().splitlines()
                                            if line.startswith("modes"))}
    assert [counts[s] for s in range(23)] == [1] * 20 + [0] * 3
    assert len(torch.overrides._get_current_function_mode_stack()) == 0


def test_mode_leaves_the_stack_when_the_step_ends_inside_backward(tmp_path):
    """A hand-written update: the step ends in backward(), a call the mode sees,
    during which PyTorch has popped it; it used to think it was gone and stay on
    the stack for the rest of the run (and of the process)."""
    import contextlib
    import io
    script = write(tmp_path, "manual.py", """
        from torch.overrides import _get_current_function_mode_stack as stack
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        for step in range(STEPS):
            model.zero_grad()
            print("modes", step, len(stack()))
            loss = F.mse_loss(model(x), y)
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(p.grad, alpha=-0.05)
    """)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        res = run_in_process(tmp_path, script, (0, 24, ""))
    assert res.exit_code == 0
    counts = [int(n) for _, _, n in (line.split() for line in out.getvalue().splitlines()
                                     if line.startswith("modes"))]
    assert len(counts) == 24 and counts[:20] == [1] * 20 and counts[21:] == [0] * 3, counts
    assert len(torch.overrides._get_current_function_mode_stack()) == 0


def test_numbers_and_warnings_count_unchanged_under_the_mode(tmp_path):
    script = write(tmp_path, "same.py", REGRESSION + """
        print(step, repr(loss.item()), [repr(float(p.sum())) for p in model.parameters()])
    """)
    plain = python(script, "1", "25", "hand", forked=True)
    ran = nndb("run", "--batch", "--trace", str(tmp_path / "t.h5"), script, "1", "25", "hand")
    assert plain.returncode == 0 and ran.returncode == 0
    assert ran.stdout == plain.stdout and plain.stdout.count("\n") == 25
    assert "loss_broadcast" in ran.stderr


WARNS_THEN_RAISES = """
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
m = nn.Linear(3, 1)
opt = torch.optim.SGD(m.parameters(), lr=0.01)
for step in range(3):
    x, y = torch.randn(8, 3), torch.randn(8)
    loss = F.mse_loss(m(x), y)                  # PyTorch warns: target size differs
    opt.zero_grad(); loss.backward(); opt.step()
    print(step, float(loss))                    # PyTorch warns: a tensor that requires grad to a scalar
y = torch.randint(0, 4, (5,))
F.cross_entropy(torch.randn(8, 4), y)           # raises: batch sizes differ
"""


def test_warnings_and_tracebacks_from_calls_under_the_mode_are_pythons(tmp_path):
    # The mode is on during the probe's first steps: PyTorch's warnings (stacklevel
    # 2, and those its C++ code raises) named nndb's mode as their line, and a loss
    # that raised showed torch.overrides and nndb's frames in its traceback.
    script = tmp_path / "same.py"
    script.write_text(WARNS_THEN_RAISES)
    plain = python(str(script), cwd=str(tmp_path))
    ran = nndb("run", "--batch", "--nx", "--trace", str(tmp_path / "t.h5"), str(script), cwd=str(tmp_path))
    assert plain.returncode == ran.returncode == 1
    assert ran.stdout == plain.stdout
    nndb_lines = [l for l in ran.stderr.splitlines(True) if l.startswith("nndb: ")]
    assert "".join(l for l in ran.stderr.splitlines(True) if l not in nndb_lines) == plain.stderr
    assert plain.stderr.count("UserWarning") == 2 and 'same.py", line 12' in plain.stderr


# -- the mode is off the stack while an optimizer steps, unless the step takes a closure -------
LBFGS_REGRESSION = """
    model = nn.Sequential(nn.Linear(6, 24), nn.Tanh(), nn.Linear(24, 1))
    x = torch.randn(N, 6)
    y = x[:, 0] - 0.5 * x[:, 1]                       # (N,)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)

    def closure():
        opt.zero_grad()
        pred = model(x)                               # (N, 1)
        loss = ((pred - y) ** 2).mean() if FLAG == "bad" else ((pred.squeeze(1) - y) ** 2).mean()
        loss.backward()
        return loss
    for step in range(STEPS):
        opt.step(closure)
"""


@pytest.mark.parametrize("seed", [0, 1])
def test_a_loss_computed_in_an_optimizers_closure_is_seen(tmp_path, seed):
    script = write(tmp_path, "lbfgs.py", LBFGS_REGRESSION)
    [f] = rule(run_in_process(tmp_path, script, (seed, 3, "bad")), "loss_broadcast")
    assert f["step"] == 0 and f["module"] == f"`-` at lbfgs.py:{line_of(script, '((pred - y) ** 2)')}"
    assert findings_of(run_in_process(tmp_path, script, (seed, 3, "good"))) == []


def test_the_optimizers_own_arithmetic_is_not_watched(tmp_path, monkeypatch):
    """Adam's ~200 calls a step were most of what the loss probe's steps cost:
    none of them reaches the mode now; the model's and the loss's calls do."""
    from nndb.tracer import funcmode
    seen = []
    real = funcmode._call_from_caller

    def spy(func, args, kwargs):
        seen.append(getattr(func, "__name__", repr(func)))
        import sys
        f = sys._getframe(2)
        while f is not None and f.f_code.co_filename == funcmode.__file__:
            f = f.f_back
        seen[-1] = (seen[-1], f.f_code.co_filename if f is not None else "")
        return real(func, args, kwargs)
    monkeypatch.setattr(funcmode, "_call_from_caller", spy)
    script = write(tmp_path, "reg.py", REGRESSION.replace("opt = OPT(", "opt = torch.optim.Adam("))
    res = run_in_process(tmp_path, script, (0, 3, "hand"))
    assert [f["rule"] for f in findings_of(res)] == ["loss_broadcast"]
    names = {n for n, _ in seen}
    assert {"linear", "mean"} <= names                          # the model and the loss were watched
    stepping = [(n, where) for n, where in seen if where.endswith(("adam.py", "_functional.py"))]
    assert stepping == []                                       # Adam's arithmetic was not


def test_nndbs_own_tensor_work_does_not_go_through_the_watch(tmp_path, monkeypatch):
    """The loss probe's steps: the mode sees the script's calls, not those of nndb's
    hooks (activations, statistics, histograms, the probes, the parameters' hooks),
    which take it off the stack while they work; PyTorch's dispatch to a mode cost
    ~3 us a call, seen or not (a sampled MLP step: ~140 of nndb's calls; GPT's ~1,600).
    The same for a model of 2 layers and of 8."""
    import os
    import sys
    import nndb
    from nndb.tracer import funcmode
    own = os.path.dirname(nndb.__file__) + os.sep
    calls = {"script": 0, "nndb": 0}
    real = funcmode.FunctionWatch.__torch_function__

    def spy(self, func, types, args=(), kwargs=None):
        f = sys._getframe(1)
        while f is not None and (f.f_code.co_filename.startswith(os.path.dirname(torch.__file__))
                                 or f.f_code.co_filename == funcmode.__file__):
            f = f.f_back
        calls["nndb" if f is not None and f.f_code.co_filename.startswith(own) else "script"] += 1
        return real(self, func, types, args, kwargs)
    monkeypatch.setattr(funcmode.FunctionWatch, "__torch_function__", spy)
    for depth in (1, 4):
        body = CLASSIFIER.replace("nn.Linear(12, 32), nn.ReLU(),",
                                  "nn.Linear(12, 32), nn.ReLU(), " + "nn.Linear(32, 32), nn.ReLU(), " * (depth - 1))
        body = body.replace("model[2]", "model[-1]")
        script = write(tmp_path, f"cls{depth}.py", body)
        calls.update(script=0, nndb=0)
        res = run_in_process(tmp_path, script, (0, 3, "bad_ce"))
        assert res.exit_code == 0
        assert calls["script"] > 0 and calls["nndb"] == 0, (depth, calls)
