"""The gradient rules: grad_none (a parameter in an optimizer that never gets a
gradient) and stale_grad (gradients not reset between optimizer steps).

The probes are tested directly on plain PyTorch loops (no nndb run: fast, and
every pattern is spelled out), the rules end to end on the example scripts."""
import os
import textwrap
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from conftest import ROOT, example, python, run_in_process
from nndb.rules.grad_rules import GradNone, GradPresence, GradReset, StaleGrad
from nndb.tracer.within import WithinStep

BRANCHES = textwrap.dedent('''
    import argparse
    import torch
    import torch.nn as nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 16)
            self.out = nn.Linear(16, 1)
            self.side = nn.Linear(16, 1)
            self.scale = nn.Parameter(torch.ones(16), requires_grad=False)   # frozen, in the optimizer
            self.g = torch.Generator().manual_seed(10)

        def forward(self, x, mode, step):
            h = torch.relu(self.fc(x)) * self.scale
            y = self.out(h)
            if mode == "detached":
                y = y + self.side(h).detach()
            elif mode == "alternating" and step % 2:
                y = y + self.side(h)
            elif mode == "random" and torch.rand((), generator=self.g) < 2 / 3:     # dynamic_net's shape
                y = y + self.side(h)
            elif mode == "stops" and (step < 30 or step % 3) and step < 60:   # skipped 1 step in 3, then for good
                y = y + self.side(h)
            return y           # mode "unused": self.side is never called

    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="unused")
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for step in range(args.steps):
        opt.zero_grad()
        loss = ((model(x, args.mode, step) - y) ** 2).mean()
        loss.backward()
        opt.step()
''')


def _of(res, rule):
    return [f for f in res.session.log.findings if f["rule"] == rule]


# -- grad_none, end to end ---------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["unused", "detached"])
def test_grad_none_names_the_parameters_cut_from_the_loss(tmp_path, mode):
    script = tmp_path / "branches.py"
    script.write_text(BRANCHES)
    res = run_in_process(tmp_path, str(script), ["--mode", mode])
    assert res.exit_code == 0
    found = _of(res, "grad_none")
    assert len(found) == 1, res.session.log.findings
    f = found[0]
    assert f["severity"] == "warning" and f["step"] == 4          # 5 consecutive steps: 0..4
    assert f["tensor"] == "side.weight" and f["evidence"]["params"] == ["side.weight", "side.bias"]
    assert "5 consecutive steps of opt" in f["message"]
    # the frozen parameter in the optimizer (requires_grad False) is not named
    assert "scale" not in f["message"]
    assert [x for x in res.session.log.findings if x["rule"] != "grad_none"] == []


def test_grad_none_quiet_for_a_branch_used_every_other_step(tmp_path):
    script = tmp_path / "branches.py"
    script.write_text(BRANCHES)
    res = run_in_process(tmp_path, str(script), ["--mode", "alternating", "--steps", "12"])
    assert res.exit_code == 0 and _of(res, "grad_none") == []


def test_grad_none_quiet_for_a_branch_taken_on_random_steps(tmp_path):
    """The dynamic_net tutorial's shape: a parameter used on a random 2/3 of the
    steps had a gradient before; runs of 5+ steps without one come by chance
    (here by step 34, where the rule used to say it was cut from the loss)."""
    script = tmp_path / "branches.py"
    script.write_text(BRANCHES)
    res = run_in_process(tmp_path, str(script), ["--mode", "random", "--steps", "300"])
    assert res.exit_code == 0 and _of(res, "grad_none") == []


def test_grad_none_names_a_parameter_that_stops_getting_gradients(tmp_path):
    """Used on 2 steps in 3 from step 30 (gaps of 1), never from step 60: named
    after 50 steps without a gradient (and 4x its longest gap), as no longer used."""
    script = tmp_path / "branches.py"
    script.write_text(BRANCHES)
    res = run_in_process(tmp_path, str(script), ["--mode", "stops", "--steps", "120"])
    assert res.exit_code == 0
    [f] = _of(res, "grad_none")
    assert f["step"] == 60 + 50 - 1 and f["evidence"]["params"] == ["side.weight", "side.bias"]
    assert f["evidence"]["longest_gap"] == 1 and f["evidence"]["steps"] == 50
    assert "had gradients at earlier steps of opt but none at the last 50 consecutive steps" in f["message"]
    assert "the longest it went without one before: 1 step(s)" in f["message"]


def test_grad_none_names_a_module_never_called_by_the_scripts_variable(tmp_path):
    """A module given to the optimizer and never called (no forward names it): its parameters
    were named by their place in the optimizer, 'opt.group0.3, opt.group0.4 got no gradient';
    now as the script holds them, extra.weight and extra.bias."""
    script = tmp_path / "unused.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.nn as nn
        torch.manual_seed(0)
        emb, head = nn.Embedding(200, 8), nn.Linear(8, 2)
        extra = nn.Linear(8, 8)
        opt = torch.optim.Adam([*emb.parameters(), *head.parameters(), *extra.parameters()], lr=1e-2)
        tok, y = torch.randint(0, 200, (64,)), torch.randint(0, 2, (64,))
        for step in range(8):
            opt.zero_grad()
            nn.functional.cross_entropy(head(emb(tok)), y).backward()
            opt.step()
        """))
    res = run_in_process(tmp_path, str(script))
    [f] = _of(res, "grad_none")
    assert f["evidence"]["params"] == ["extra.weight", "extra.bias"], f


def test_grad_none_quiet_for_a_last_layer_frozen_by_dropping_its_gradient(tmp_path):
    """DINO's first epoch: backward() gives the last layer its gradient and the script sets
    p.grad = None before optimizer.step() (8 steps here; thousands in DINO).  grad_none said
    at step 4 that student.head.last_layer.weight 'got no gradient ... is it used in the
    forward pass, or cut from the loss by detach()?'; nothing is said now, and the run has no
    other finding (the teacher, updated by EMA outside any optimizer, and its forward pass
    included)."""
    res = run_in_process(tmp_path, os.path.join(ROOT, "tests", "scripts", "self_distillation.py"))
    assert res.exit_code == 0 and res.session.log.findings == [], res.session.log.findings


def test_grad_none_says_every_gradient_was_dropped_before_the_step(tmp_path):
    """zero_grad() between backward() and step(): every gradient backward() made is gone
    when the optimizer steps.  Still found, and said as it is (it was 'cut from the loss')."""
    res = run_in_process(tmp_path, os.path.join(ROOT, "tests", "scripts", "self_distillation.py"),
                         ["--late-zero-grad"])
    [f] = _of(res, "grad_none")
    assert f["step"] == 4 and len(f["evidence"]["params"]) == 9 and f["tensor"] == "student.backbone.1.weight", f
    assert f["message"].endswith("backward() gave it one, and the script set .grad to None before optimizer.step() "
                                 "(every parameter's: optimizer updates nothing; a zero_grad() between backward() "
                                 "and step()?)"), f["message"]


def test_a_loop_variable_holding_each_layer_in_turn_names_no_two_tensors_alike(tmp_path):
    """Layers trained one after the other through a loop variable (mnist_forward_forward's
    ``for layer in layers: layer.forward(x)``, no module call nndb sees): both layers' weights
    were named by the variable, 'layer.weight', one series of two tensors (80 steps of updates
    where each had 40), and update_ratio took the second layer's first updates for the first's."""
    script = tmp_path / "layers.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.nn as nn
        torch.manual_seed(0)
        layers = [nn.Linear(8, 16), nn.Linear(16, 16)]
        opts = [torch.optim.Adam(l.parameters(), lr=0.03) for l in layers]
        x = torch.randn(32, 8)
        for layer, opt in zip(layers, opts):
            for i in range(6):
                loss = torch.relu(layer.forward(x)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            x = torch.relu(layer.forward(x)).detach()
        """))
    res = run_in_process(tmp_path, str(script))
    assert res.exit_code == 0
    import nndb
    t = nndb.open(str(tmp_path / "run.h5"))
    names = [x.name for x in t.tensors if x.kind == "update"]
    assert len(names) == 4 and len(set(names)) == 4, names
    assert sorted(len(t.history(n, "update", "norm")[0]) for n in names) == [6, 6, 6, 6]


# -- stale_grad, end to end ------------------------------------------------------------------------
def test_stale_grad_fires_on_the_missing_zero_grad(tmp_path):
    res = run_in_process(tmp_path, example("no_zero_grad.py"), ["--steps", "6"])
    assert res.exit_code == 0
    found = _of(res, "stale_grad")
    assert len(found) == 1
    f = found[0]
    # step 0's gradient is the reference; steps 1 and 2 are the two stale steps in a row
    assert f["severity"] == "error" and f["step"] == 2
    assert f["message"].startswith("gradients are not reset between the steps of optimizer (2 in a row: 0.bias.grad")
    assert "zero_grad()" in f["message"]
    assert f["evidence"]["optimizer"] == "optimizer" and f["evidence"]["r_stale"] < 1e-3
    assert _of(res, "grad_none") == []


def test_stale_grad_of_lora_adapters_is_found_at_the_second_stale_step(tmp_path):
    """The probe's sample tensor was LoRA's A (the smallest), whose gradient is exactly 0 at
    step 0 (B starts at 0): step 1 told nothing and the missing zero_grad() was found at
    step 3, one step late.  A tensor with a non-zero gradient (B) is watched now: step 2."""
    script = os.path.join(ROOT, "tests", "scripts", "lora_adapters.py")
    res = run_in_process(tmp_path, script, ["--no-zero-grad", "--steps", "6"])
    assert res.exit_code == 0
    [f] = _of(res, "stale_grad")
    assert f["step"] == 2 and f["tensor"] == "0.B", f
    assert _of(run_in_process(tmp_path, script, ["--steps", "6"]), "stale_grad") == []


# MAML: the inner loop's gradients of the parameters by torch.autograd.grad (never in
# .grad), the meta-gradient by backward(); "forget" leaves out the meta zero_grad().
MAML = textwrap.dedent('''
    import sys
    import torch, torch.nn as nn
    from torch.func import functional_call
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))
    meta = torch.optim.Adam(model.parameters(), lr=1e-3)
    for it in range(6):
        if sys.argv[1] != "forget":
            meta.zero_grad()
        xs, xq = torch.rand(8, 1) * 10 - 5, torch.rand(8, 1) * 10 - 5
        fast = dict(model.named_parameters())
        l = ((functional_call(model, fast, (xs,)) - torch.sin(xs)) ** 2).mean()
        gs = torch.autograd.grad(l, list(fast.values()), create_graph=True)
        fast = {n: w - 0.05 * g for (n, w), g in zip(fast.items(), gs)}
        ((functional_call(model, fast, (xq,)) - torch.sin(xq)) ** 2).mean().backward()
        meta.step()
''')


@pytest.mark.parametrize("how", ["forget", "reset"])
def test_stale_grad_of_a_maml_loop_that_forgets_its_meta_zero_grad(tmp_path, how):
    """The inner loop's torch.autograd.grad gradients were summed as if added to .grad:
    the planted loop got no finding (nor a FAIL from nndb check)."""
    script = tmp_path / "maml.py"
    script.write_text(MAML)
    res = run_in_process(tmp_path, str(script), [how])
    assert res.exit_code == 0
    found = [(f["step"], f["evidence"]["optimizer"]) for f in _of(res, "stale_grad")]
    assert found == ([(2, "meta")] if how == "forget" else [])


SPARSE_EMBEDDINGS = """
import sys
import torch, torch.nn as nn
torch.manual_seed(0)
emb = nn.Embedding(200, 8, sparse=True)
head = nn.Linear(8, 2)
sopt = torch.optim.SparseAdam(emb.parameters(), lr=1e-2)
dopt = torch.optim.Adam(head.parameters(), lr=1e-2)
tok, y = torch.randint(0, 200, (256,)), torch.randint(0, 2, (256,))
for step in range(6):
    if sys.argv[1] == "reset":
        sopt.zero_grad()
    dopt.zero_grad()
    loss = nn.functional.cross_entropy(head(emb(tok[step * 32:(step + 1) * 32])), y[step * 32:(step + 1) * 32])
    loss.backward()
    sopt.step(); dopt.step()
"""


@pytest.mark.parametrize("reset", ["reset", "forgotten"])
def test_stale_grad_sees_a_sparse_embeddings_missing_zero_grad(tmp_path, reset):
    """SparseAdam's embeddings without sopt.zero_grad(): the probe sampled only parameters with
    a dense gradient, so the optimizer of sparse ones was never checked (no finding; nndb
    check's zero-grad PASSed 'dopt: .grad was reset').  A sparse gradient is compared as the
    dense tensor it stands for."""
    script = tmp_path / "sparse.py"
    script.write_text(SPARSE_EMBEDDINGS)
    res = run_in_process(tmp_path, str(script), [reset])
    assert res.exit_code == 0
    found = _of(res, "stale_grad")
    if reset == "reset":
        assert found == []
    else:
        assert len(found) == 1 and found[0]["step"] == 2 and found[0]["evidence"]["optimizer"] == "sopt"


@pytest.mark.parametrize("reset", ["reset", "forgotten"])
def test_stale_grad_checks_an_optimizer_that_steps_every_few_steps(tmp_path, reset):
    """The generator's optimizer steps once in 5 critic steps, at steps 5, 10, 15, ...: the
    gradient's reset was checked at the run's steps 0-5 and then at two in 50 (50 and 51,
    100 and 101 ...), never at two of the generator's steps in a row, so its missing
    zero_grad() was never found (none in 60 steps, nor with 3 critic steps in 160).  Each optimizer's own
    first steps are checked now: found at its third step (step 15)."""
    # (tests/scripts/wgan_gp.py: 12 iterations of 5 critic steps and a generator step)
    script = os.path.join(ROOT, "tests", "scripts", "wgan_gp.py")
    plain = python(script, "12", "5", reset, forked=True)
    norms = [float(line.split()[2]) for line in plain.stdout.splitlines() if line.startswith("G ")]
    assert (norms[-1] > 3 * norms[0]) == (reset == "forgotten")        # (the sum of all its gradients)
    res = run_in_process(tmp_path, script, ["12", "5", reset])
    assert res.exit_code == 0
    found = [(f["step"], f["evidence"]["optimizer"]) for f in _of(res, "stale_grad")]
    assert found == ([] if reset == "reset" else [(15, "optG")])


def test_stale_grad_names_the_parameter_as_the_trace_does(tmp_path):
    """Two models called on their own (emb, head): names are qualified when step 0 ends, after
    the probe picked its sample at the first optimizer step; the finding said 'weight.grad held
    the last step's gradient' where the trace's series is 'emb.weight'."""
    script = tmp_path / "dense.py"
    script.write_text(SPARSE_EMBEDDINGS.replace(", sparse=True", "").replace("SparseAdam", "Adam"))
    res = run_in_process(tmp_path, str(script), ["forgotten"])
    [f] = _of(res, "stale_grad")
    assert f["tensor"] == "emb.weight" and "(2 in a row: emb.weight.grad held" in f["message"]


@pytest.mark.parametrize("script", ["grad_accum.py", "gan.py", "lbfgs.py"])
def test_no_gradient_rule_fires_on_accumulation_gan_or_closures(tmp_path, script):
    res = run_in_process(tmp_path, example(script), ["--steps", "10"])
    assert res.exit_code == 0
    assert _of(res, "stale_grad") == [] and _of(res, "grad_none") == []
    assert all(r.enabled for r in res.session.rules.rules)


# An LBFGS closure: one that forgets zero_grad() (each of LBFGS's calls adds its gradient to the
# calls' before it), or that leaves it to the loop (once a step), one that resets and accumulates
# two micro-batches (set_to_none or zeros).
LBFGS_CLOSURE = textwrap.dedent("""
    import sys
    import torch, torch.nn as nn
    torch.manual_seed(0)
    x = torch.randn(64, 4); y = torch.sin(x.sum(1, keepdim=True))
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.LBFGS(model.parameters())                 # lr 1, max_iter 20
    for step in range(4):
        if sys.argv[1] == "outside":
            opt.zero_grad()                 # once a step, not once a call
        def closure():
            if sys.argv[1] not in ("forgets", "outside"):
                opt.zero_grad(set_to_none=sys.argv[1] == "none")
            total = 0
            for xb, yb in zip(x.chunk(2), y.chunk(2)):
                loss = ((model(xb) - yb) ** 2).mean() / 2
                loss.backward()
                total = total + loss.detach()
            return total
        print("step", step, opt.step(closure).item())
""")


def test_stale_grad_finds_a_closure_that_forgets_zero_grad_at_its_first_step(tmp_path):
    """At LBFGS's defaults the run diverged within two steps and the step-to-step comparison
    never judged (0.bias's gradients were all 0 by step 1, then NaN): nndb said only
    'loss_explodes ... a learning rate far too high? no gradient clipping?'."""
    script = tmp_path / "lbfgs.py"
    script.write_text(LBFGS_CLOSURE)
    for bug in ("forgets", "outside"):    # (outside: reset between steps, main found nothing at all)
        res = run_in_process(tmp_path, str(script), [bug])
        [f] = _of(res, "stale_grad")
        assert f["step"] == 0 and "between the calls of opt's closure (20 calls in the step" in f["message"], f
    for healthy in ("none", "zeros"):
        res = run_in_process(tmp_path, str(script), [healthy])
        assert res.exit_code == 0 and _of(res, "stale_grad") == [], healthy
        assert all(r.enabled for r in res.session.rules.rules)


# -- the probes on plain loops -----------------------------------------------------------------------
class _Naming:
    def __init__(self, model):
        self.names = {id(p): n for n, p in model.named_parameters()}

    def param_name(self, p):
        return self.names[id(p)]

    def optimizer_name(self, opt):
        return "opt"


def _probe(cls, model):
    rec = SimpleNamespace(tracer=SimpleNamespace(within=WithinStep()), naming=_Naming(model),
                          recorder=SimpleNamespace(step=0))
    probe = cls(rec)
    probe.install()
    return probe


def _post(probe, opt, step):
    """What the tracer does after opt.step() at ``step``: the probe is called
    only on the steps it wants (the rule engine arms it for those)."""
    probe.rec.recorder.step = step
    if probe.wants(step):
        probe.optimizer(opt, "post")


def _stale_loop(train_step, steps=5, rule=None):
    """Run ``train_step(model, opt, i)`` then opt.step() ``steps`` times under the
    grad_reset probe and the stale_grad rule; returns the findings per step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 20), nn.Tanh(), nn.Linear(20, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = _probe(GradReset, model)
    rule = rule or StaleGrad()
    out = []
    for i in range(steps):
        train_step(model, opt, i)
        opt.step()
        _post(probe, opt, i)
        ctx = SimpleNamespace(step=i, facts={"grad_reset": probe.take(i)})
        out.append([f.message for f in rule.check(ctx)])
    probe.uninstall()
    assert probe.error is None
    return out, model


def _backward(model, scale=1.0):
    x = torch.randn(16, 6)
    (model(x).pow(2).mean() * scale).backward()


def test_stale_probe_sees_a_missing_zero_grad_also_when_clipped():
    def plain(model, opt, i):
        _backward(model)

    def clipped(model, opt, i):
        _backward(model)                                              # a gradient norm of ~1
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.8)      # rescales .grad in place

    for step_fn in (plain, clipped):
        out, _ = _stale_loop(step_fn)
        # step 0: the reference; 1: stale once; 2: twice in a row -> reported (and again later)
        assert [bool(m) for m in out] == [False, False, True, True, True], step_fn.__name__


def test_stale_probe_sees_a_zero_grad_that_goes_missing_later():
    """After its first steps the probe checks one step pair in EVERY, with its
    tensor hook on the parameter only around that pair."""
    def step_fn(model, opt, i):
        if i < 30:
            opt.zero_grad()
        _backward(model)

    out, model = _stale_loop(step_fn, steps=60)
    first = min(i for i, m in enumerate(out) if m)
    assert first == GradReset.EVERY + 1                  # the pair (50, 51): stale twice in a row
    assert all(not m for m in out[:30])
    hooked = [p for p in model.parameters() if p._backward_hooks]
    assert hooked == []                                  # (uninstalled)


@pytest.mark.parametrize("zero_grad", [False, True])
def test_stale_probe_counts_only_the_gradients_a_backward_adds(zero_grad):
    """A gradient penalty (or MAML's inner loop) takes the parameters' gradients with
    torch.autograd.grad(create_graph=True), which the probe's tensor hook saw too,
    though they never reach .grad: its sum of the incoming gradients held them, .grad
    matched neither last + new nor new alone, and a missing zero_grad() was never found."""
    def step_fn(model, opt, i):
        if zero_grad:
            opt.zero_grad()
        loss = model(torch.randn(16, 6)).pow(2).mean()
        gs = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
        (loss + 0.1 * sum(g.pow(2).sum() for g in gs)).backward()

    out, _ = _stale_loop(step_fn)
    assert [bool(m) for m in out] == ([False] * 5 if zero_grad else [False, False, True, True, True])


@pytest.mark.parametrize("zero_grad", [False, True])
def test_stale_probe_sees_an_optimizer_stepped_in_the_backward(zero_grad):
    """PyTorch's "optimizer in backward": one optimizer per parameter, stepped (and
    zeroed) by the parameter's post-accumulate-grad hook, which runs before the probe's
    own: the backward's gradient is in .grad already when the probe checks."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 20), nn.Tanh(), nn.Linear(20, 1))
    opts = {p: torch.optim.SGD([p], lr=0.01) for p in model.parameters()}
    probe, rule, step = _probe(GradReset, model), StaleGrad(), [0]
    found = []

    def hook(p):
        opts[p].step()
        _post(probe, opts[p], step[0])
        if zero_grad:
            opts[p].zero_grad()
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)
    for i in range(5):
        step[0] = i
        _backward(model)
        found.append([f.message for f in rule.check(SimpleNamespace(step=i, facts={"grad_reset": probe.take(i)}))])
    probe.uninstall()
    assert probe.error is None
    # (the four optimizers share the stub's name "opt": their stale steps count as one run)
    assert [bool(m) for m in found] == ([False] * 5 if zero_grad else [False, True, True, True, True])

@pytest.mark.parametrize("pattern", ["zero_first", "set_to_zero", "clipped"])
def test_stale_probe_quiet_when_gradients_are_reset_before_backward(pattern):
    def step_fn(model, opt, i):
        opt.zero_grad(set_to_none=pattern != "set_to_zero")
        _backward(model)
        if pattern == "clipped":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)

    out, _ = _stale_loop(step_fn, steps=6)
    assert all(m == [] for m in out)


@pytest.mark.parametrize("pattern", ["zero_after", "accumulate"])
def test_stale_probe_quiet_when_zeroed_after_the_step(pattern):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 20), nn.Tanh(), nn.Linear(20, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    probe, rule = _probe(GradReset, model), StaleGrad()
    found = []
    for i in range(6):
        for _ in range(4 if pattern == "accumulate" else 1):
            _backward(model, 0.25)
        opt.step()
        _post(probe, opt, i)
        found += rule.check(SimpleNamespace(step=i, facts={"grad_reset": probe.take(i)}))
        opt.zero_grad()
    assert found == []


def test_stale_probe_quiet_for_the_gan_pattern():
    """netD gets gradient from the generator's backward after optimizerD
    stepped, and is zeroed before optimizerD's next step."""
    torch.manual_seed(0)
    netG, netD = nn.Linear(4, 8), nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    both = nn.ModuleDict({"G": netG, "D": netD})
    optD = torch.optim.Adam(netD.parameters(), lr=1e-3)
    optG = torch.optim.Adam(netG.parameters(), lr=1e-3)
    probe, rule = _probe(GradReset, both), StaleGrad()
    found = []
    for i in range(6):
        netD.zero_grad()
        fake = netG(torch.randn(16, 4))
        (netD(torch.randn(16, 8)).mean() - netD(fake.detach()).mean()).backward()
        optD.step()
        _post(probe, optD, i)
        netG.zero_grad()
        netD(fake).mean().backward()           # also reaches netD's .grad
        optG.step()
        _post(probe, optG, i)
        found += rule.check(SimpleNamespace(step=i, facts={"grad_reset": probe.take(i)}))
    probe.uninstall()
    assert found == []


def test_stale_probe_removes_its_hooks():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 20), nn.Tanh(), nn.Linear(20, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = _probe(GradReset, model)
    assert probe.tracer.within.optimizer
    _backward(model)
    opt.step()
    probe.optimizer(opt, "post")
    hooked = [n for n, p in model.named_parameters() if p._backward_hooks]
    assert hooked == ["0.bias"]               # the first smallest parameter with >= 16 elements
    sample = model[0].bias
    assert sample._post_accumulate_grad_hooks
    probe.uninstall()
    assert not sample._backward_hooks and not sample._post_accumulate_grad_hooks
    assert not probe.tracer.within.optimizer


def test_grad_none_probe_skips_steps_while_every_gradient_is_there():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 20), nn.Tanh(), nn.Linear(20, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe, rule = _probe(GradPresence, model), GradNone()
    checks, found = 0, []
    for i in range(70):
        opt.zero_grad()
        if i < 12:
            _backward(model)
        opt.step()
        _post(probe, opt, i)
        facts = probe.take(i)
        checks += len(facts.get("checks", ()))
        found += [(i, f.tensor, f.message) for f in rule.check(SimpleNamespace(step=i, facts={"grad_presence": facts}))]
    # checked at 0, 10 (all there), then 20 (none), then every step: 20..69 make 50 in a row of
    # parameters that had gradients at the checks before (5 in a row: for one that never had any)
    assert checks == 3 + 49
    assert [(i, t) for i, t, _ in found][:1] == [(69, "0.weight")]
    assert "had gradients at earlier steps of opt but none at the last 50 consecutive steps" in found[0][2]
    assert "it had one at every step checked before" in found[0][2]


def test_gradient_probes_are_called_only_on_the_steps_they_check():
    """The rule engine puts a probe's optimizer callback into the tracer only
    for the steps it wants: one pair in 25 (and the step before) for
    grad_reset, one step in 10 for grad_presence while nothing is missing."""
    model = nn.Linear(3, 2)
    reset, presence = _probe(GradReset, model), _probe(GradPresence, model)
    assert [s for s in range(160) if reset.wants(s)] == [0, 1, 2, 3, 4, 5, 49, 50, 51, 99, 100, 101, 149, 150, 151]
    assert [s for s in range(35) if presence.wants(s)] == [0, 10, 20, 30]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _post(presence, opt, 30)                          # no gradient at all: looked at every step now
    assert presence.wants(31) and presence.wants(32)
    model(torch.randn(4, 3)).sum().backward()
    _post(presence, opt, 31)
    assert not presence.wants(32) and presence.wants(40)


# fast_neural_style's shape: a loss weighted by a large constant (style_weight 1e10), a healthy
# run whose gradient norms are ~1e4 from the first step and shrink as the loss falls.
SCALED_LOSS = textwrap.dedent('''
    import sys
    import torch, torch.nn as nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3) if sys.argv[1] == "adam" else \\
        torch.optim.SGD(model.parameters(), lr=1e-7)
    X, Y = torch.randn(256, 64), torch.randn(256, 64)
    for step in range(30):
        opt.zero_grad()
        loss = 1e5 * nn.functional.mse_loss(model(X), Y)
        loss.backward()
        opt.step()
        print(step, loss.item(), model[2].weight.grad.norm().item())
''')


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_exploding_gradient_ceiling_is_not_applied_under_adams_family(tmp_path, optimizer, capsys):
    """Under Adam a constant loss weight scales the gradients and not the updates: the absolute
    ceiling (1000) said 'exploding' at step 2 of fast_neural_style while the norms shrank.  Under
    SGD the same gradients move the weights by lr x 1e4: the ceiling still holds."""
    script = tmp_path / "scaled.py"
    script.write_text(SCALED_LOSS)
    res = run_in_process(tmp_path, str(script), [optimizer])
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line[:1].isdigit()]
    norms = [float(r[2]) for r in rows]
    assert len(norms) == 30 and min(norms) > 1e3
    found = _of(res, "exploding_gradient")
    if optimizer == "adam":
        assert norms[-1] < norms[0] and float(rows[-1][1]) < float(rows[0][1])       # healthy: both fall
        assert found == []
    else:
        assert found and "above 1000" in found[0]["message"]


def test_embedding_tables_are_left_out_of_the_layer_spread():
    """A healthy tiny BERT got exploding_gradient at step 16: 2.67e4x between the RMS gradients
    of bert.embeddings.token_type_embeddings.weight (one row used, summed over every token) and
    the last layer's attention query (a classifier reads one position): a spread of structure,
    not of backprop.  Embedding tables are no layer of that product."""
    from nndb.rules.gradient_norms import _embedding
    assert _embedding("bert.embeddings.token_type_embeddings.weight", {})           # (by name)
    assert _embedding("wte.weight", {"wte": "Embedding"}) and _embedding("e.weight", {"e": nn.Embedding})
    assert not _embedding("bert.encoder.layer.1.attention.self.query.weight", {})
    assert not _embedding("embedder.proj.weight", {"embedder.proj": "Linear"})       # (the class decides)


# Neural style transfer's loop (the PyTorch tutorials'): Adam steps the image, a fixed conv
# network (its weights left requiring grad, as the tutorials' VGG) gives the features.
IMAGE_OPTIMIZATION = textwrap.dedent('''
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    layers, c = [], 3
    for i, width in enumerate((16, 16, 32, 32, 64, 64, 128, 128)):
        layers += [nn.Conv2d(c, width, 3, padding=1), nn.ReLU()]
        if i % 2 == 1:
            layers.append(nn.MaxPool2d(2))
        c = width
    features = nn.Sequential(*layers)
    for m in features:
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            nn.init.zeros_(m.bias)
    picked = {"0", "5", "10", "15", "17"}
    content, style = torch.rand(1, 3, 32, 32), torch.rand(1, 3, 32, 32)
    target = content.clone().requires_grad_(True)
    opt = torch.optim.Adam([target], lr=0.003, betas=(0.5, 0.999))

    def maps(x):
        out = []
        for name, layer in features._modules.items():
            x = layer(x)
            if name in picked:
                out.append(x)
        return out

    for step in range(8):
        content_loss = style_loss = 0
        for f1, f2, f3 in zip(maps(target), maps(content), maps(style)):
            content_loss += torch.mean((f1 - f2) ** 2)
            _, ch, h, w = f1.size()
            g1, g3 = f1.view(ch, h * w), f3.view(ch, h * w)
            style_loss += torch.mean((g1 @ g1.t() - g3 @ g3.t()) ** 2) / (ch * h * w)
        loss = content_loss + 100 * style_loss
        opt.zero_grad()
        loss.backward()
        spread = [p.grad.norm().item() / p.grad.numel() ** 0.5 for p in features.parameters() if p.dim() > 1]
        opt.step()
        print(step, loss.item(), max(spread) / min(spread))
''')


def test_the_gradients_of_a_network_nothing_trains_are_not_judged(tmp_path, capsys):
    """Neural style transfer optimizes the image through a fixed VGG whose weights get
    gradients: exploding_gradient said 'exploding gradient in vgg.0.weight ... 2.103e+05x
    between the RMS gradients of vgg.0.weight and vgg.28.weight' at step 2 (the first conv's
    gradient comes from five losses, the last's from one), live and on the trace, of weights
    no optimizer holds and nothing changes.  Only what the step trains is judged."""
    from nndb.rules.catalog import load
    from nndb.rules.offline import check_trace
    from nndb.store.reader import TraceReader
    script = tmp_path / "style.py"
    script.write_text(IMAGE_OPTIMIZATION)
    res = run_in_process(tmp_path, str(script))
    spreads = [float(line.split()[2]) for line in capsys.readouterr().out.splitlines() if line[:1].isdigit()]
    assert len(spreads) == 8 and min(spreads) > 1e5         # (the network's own, far past 'spread')
    with TraceReader(str(tmp_path / "run.h5")) as reader:
        offline = [f.rule for f in check_trace(reader, load("default")).findings]
    live = [f["rule"] for f in res.session.log.findings]
    for rule in ("exploding_gradient", "vanishing_gradient"):
        assert rule not in live and rule not in offline, (live, offline)

