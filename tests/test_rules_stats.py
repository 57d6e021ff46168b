"""The statistics rules (nndb.rules.stats_rules, gradient_norms, bn_probe): each
fires on a small planted bug with the expected tensor, step and evidence, and
stays quiet on the look-alikes that are not bugs.  Runs are in-process
(conftest.run_in_process); the cry-wolf cases are fed to the rules directly
as synthetic steps."""
import json
import re
import math
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import example, run_in_process

from nndb.rules import stats_rules
from nndb.rules.base import STAT_INDEX, StepContext

# A configurable MLP classifier to plant bugs in (written to tmp_path).
BUGGY = '''
import argparse
import torch
import torch.nn as nn

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--depth", type=int, default=3)
ap.add_argument("--act", default="relu")
ap.add_argument("--lr", type=float, default=0.05)
ap.add_argument("--exclude", default="")
ap.add_argument("--bn", action="store_true")
ap.add_argument("--input-scale", type=float, default=1.0)
args = ap.parse_args()

torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
x = torch.randn(512, 16, generator=g)
y = (x @ torch.randn(16, 4, generator=g)).argmax(dim=1)
act = {"relu": nn.ReLU, "sigmoid": nn.Sigmoid}[args.act]
layers, d = [], 16
for i in range(args.depth):
    layers.append(nn.Linear(d, 32))
    if i == 0 and args.bn:
        layers.append(nn.BatchNorm1d(32))
    layers.append(act())
    d = 32
model = nn.Sequential(*layers, nn.Linear(d, 4))
opt = torch.optim.SGD([p for n, p in model.named_parameters() if n != args.exclude], lr=args.lr)
crit = nn.CrossEntropyLoss()
for step in range(args.steps):
    idx = torch.randint(0, 512, (64,))
    opt.zero_grad()
    loss = crit(model(x[idx] * args.input_scale), y[idx])
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item()!r}")
'''


def run(tmp_path, script, *args):
    if script == "buggy":
        path = tmp_path / "buggy.py"
        path.write_text(BUGGY)
        script = str(path)
    res = run_in_process(tmp_path, script, args)
    assert res.exit_code == 0
    assert all(r.enabled for r in res.session.rules.rules)
    mine = {cls.id for cls in stats_rules.RULES}
    json.dumps([f for f in res.session.log.findings if f["rule"] in mine], allow_nan=False)   # strict JSON
    return res.session.log.findings


def of(findings, rule):
    return [f for f in findings if f["rule"] == rule]


# -- planted bugs -----------------------------------------------------------------------------------

def test_nan_lr_explodes_then_goes_nonfinite(tmp_path):
    """lr 0.4: gradients grow geometrically (3.5, 11, 55, 1.5e3, 1.7e8, 1.2e23), the
    last layer's output overflows to Inf at step 6, NaN everywhere from step 7."""
    found = run(tmp_path, example("nan_lr.py"), "--steps", 9)
    [nf] = of(found, "nonfinite")                     # once: not again for what the NaN spreads to
    assert (nf["step"], nf["tensor"], nf["evidence"]["kind"]) == (6, "2", "act")
    assert nf["evidence"]["inf_count"] == 30 and nf["evidence"]["nan_count"] == 0
    assert nf["evidence"]["previous_norm"] > 1e15      # it overflowed: step 5 was finite and huge
    assert "Inf first appeared in act 2" in nf["message"]

    [ex] = of(found, "exploding_gradient")
    assert (ex["step"], ex["tensor"]) == (5, "0.weight") and ex["step"] < nf["step"]
    ev = ex["evidence"]
    assert ev["steps"] == [3, 5] and ev["grad_norm"] > 1e20
    assert {"absolute", "relative"} <= set(ev["criteria"])
    assert ev["ratio_to_early"] > 1e4 and ev["early_median"] < 100
    norms = ev["recent_norms"]
    assert len(norms) == 3 and norms[0] < norms[1] < norms[2]

    [ur] = of(found, "update_ratio")                   # SGD at lr 0.4 rewrites the weights each step:
    # an update as large as the weight is reported at once (before issue 44: at step 5, after a
    # warm-up of 3 steps and 3 in a row)
    assert (ur["step"], ur["tensor"], ur["evidence"]["side"]) == (2, "0.weight", "high")
    assert ur["evidence"]["ratio"] >= 0.9 and ur["evidence"]["lr"] == pytest.approx(0.4)
    assert "far too high" in ur["message"]
    [le] = of(found, "loss_explodes")                 # 18.6, 18.9, 60.3, 7238: x390 at step 3, 2.2e10 at 4
    assert (le["step"], le["tensor"]) == (4, "loss") and le["evidence"]["factor"] > 100 and le["step"] < nf["step"]
    assert le["evidence"]["jump_step"] == 3 and "in 3 recorded step(s) by step 3," in le["message"] and "rose further" in le["message"]
    assert of(found, "vanishing_gradient") == [] and of(found, "param_not_updated") == []


INF_LOSS = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.0)
x = torch.randn(8, 4)
extra = [0.0, 0.0, 0.0, 0.0, 0.0, 2.997, float("inf"), 0.0]
for step in range(8):
    opt.zero_grad()
    loss = model(x).mean() * 0 + extra[step]
    loss.backward()
    opt.step()
"""


def test_nonfinite_names_the_loss_once_and_its_norm_to_four_digits(tmp_path):
    """The loss is 2.997 at step 5 and Inf at step 6: nonfinite said 'Inf first appeared in loss loss
    (1 element(s)); its norm at step 5 was 3' (three significant digits made 2.997 a round 3)."""
    (tmp_path / "inf_loss.py").write_text(INF_LOSS)
    [nf] = of(run(tmp_path, str(tmp_path / "inf_loss.py")), "nonfinite")
    assert nf["step"] == 6 and nf["message"].endswith(
        "Inf first appeared in loss (1 element(s)); its norm at step 5 was 2.997"), nf["message"]


def test_numbers_rounded_short_keep_their_zeros():
    """fmt's 4 significant digits: a value that rounds to a shorter text keeps the zeros that say
    it was rounded (2.99999 read '3', 0.0099996 '0.01'), and one held as float32 is not padded."""
    from nndb.text import fmt
    assert [fmt(v) for v in (2.99999, 0.0099996, 389.96, 29999.7, 7237.56)] == \
        ["3.000", "0.01000", "390.0", "3.000e+04", "7238"]
    assert [fmt(v) for v in (3.0, float(np.float32(0.3)), 0.5, 2.997, float("inf"))] == ["3", "0.3", "0.5", "2.997", "inf"]
    # a whole float of more digits than float32 holds is a magnitude, not a count: nan_lr.py's loss at
    # step 4 is 21943189504.0 on one CPU and 21943160832.0 on an AVX-512 one ('rose further (...) since')
    assert [fmt(v) for v in (21943189504.0, 21943160832.0, 1179648.0, 10000000.0, 123456789.0)] == \
        ["2.194e+10", "2.194e+10", "1179648", "10000000", "1.235e+08"]


@pytest.mark.parametrize("every, steps, want", [
    (4, None, (8, "NaN first appeared in act 0", [5, 7], "(steps 5-7 were not recorded (--every, --steps): "
                                                        "it may have appeared there)")),
    (None, "7:", (7, "NaN first appeared in act 0", [0, 6], "(steps 0-6 were not recorded")),
    (None, None, (6, "Inf first appeared in act 2", None, None)),
])
def test_nonfinite_says_when_the_steps_before_were_not_recorded(tmp_path, every, steps, want):
    """nan_lr.py's first non-finite value is an Inf in act 2 at step 6.  Recorded every 4th step, nonfinite
    said 'NaN first appeared in act 0' at step 8, naming another tensor and kind, with nothing to tell that
    steps 5-7, where it began, were never looked at."""
    import gc
    from nndb.run.config import RecordSchedule, RunConfig
    from nndb.driver import DebugOptions, debug
    from nndb.frontends.batch import ScriptedFrontend
    from nndb.run.launcher import Target
    gc.collect()
    cfg = RunConfig(Target(path=example("nan_lr.py"), args=["--steps", "10"]), str(tmp_path / "run.h5"),
                    RecordSchedule.parse(every, steps), quiet=True)
    res = debug(cfg, DebugOptions(batch=True, no_rc=True), ScriptedFrontend([]))
    [nf] = of(res.session.log.findings, "nonfinite")
    step, first, gap, said = want
    assert nf["step"] == step and first in nf["message"]
    assert nf["evidence"].get("not_recorded") == gap
    assert (said in nf["message"]) if said else ("not recorded" not in nf["message"])


def test_nonfinite_switched_off_and_on_does_not_call_the_steps_it_missed_unrecorded(tmp_path):
    res = run_in_process(tmp_path, example("nan_lr.py"), ["--steps", "9"],
                         commands=("rule disable nonfinite", "until 3", "rule enable nonfinite"))
    [nf] = of(res.session.log.findings, "nonfinite")
    assert nf["step"] == 6 and "not recorded" not in nf["message"] and nf["evidence"]["previous_step"] == 5


def test_deep_sigmoid_vanishes(tmp_path):
    """12 sigmoid layers: the first layer's gradient is ~1e-11, 1e10x below the last's."""
    found = run(tmp_path, "buggy", "--depth", 12, "--act", "sigmoid")
    [va] = of(found, "vanishing_gradient")            # one per optimizer: the earliest layer
    assert (va["step"], va["tensor"]) == (2, "0.weight")
    ev = va["evidence"]
    assert ev["steps"] == [0, 2] and ev["grad_norm"] < 1e-9
    assert {"absolute", "cross_layer"} <= set(ev["criteria"])
    assert ev["layer_spread"]["ratio"] > 1e6 and ev["layer_spread"]["largest"] == "24.weight"
    assert ev["layer_spread"]["smallest"] == "0.weight"
    assert "2.weight" in ev["also"] and ev["loss"] > 1.0
    assert of(found, "exploding_gradient") == []
    # the early layers barely move: update/weight ~1e-11 (after 3 warm-up steps, 3 in a row)
    low = of(found, "update_ratio")
    assert low and low[0]["step"] == 5 and low[0]["evidence"]["side"] == "low"
    assert low[0]["evidence"]["ratio"] < 1e-6


def test_param_left_out_of_the_optimizer(tmp_path):
    found = run(tmp_path, "buggy", "--exclude", "2.weight")
    [pn] = of(found, "param_not_updated")
    assert (pn["step"], pn["tensor"]) == (5, "2.weight")      # param rows compared from step 0 on
    assert pn["evidence"]["in_optimizer"] is False and pn["evidence"]["grad_norm"] > 0
    assert pn["evidence"]["steps"] == [1, 5]
    assert "no optimizer that has stepped holds it" in pn["message"]


# style transfer's shape: a fixed feature extractor (eval mode) computes the features of an image
# that is the one tensor trained; its parameters still require grad unless told not to.
FIXED_EXTRACTOR = """
import sys
import torch, torch.nn as nn
torch.manual_seed(0)
features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1)).eval()
if sys.argv[1] == "frozen":
    features.requires_grad_(False)
content, style = torch.rand(1, 3, 12, 12), torch.rand(1, 3, 12, 12)
image = content.clone().requires_grad_(True)
opt = torch.optim.Adam([image], lr=0.01)
for step in range(8):
    f, fs = features(image), features(style)
    loss = (f - features(content)).pow(2).mean() + (f.flatten(2) @ f.flatten(2).mT - fs.flatten(2) @ fs.flatten(2).mT).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.mark.parametrize("how", ["requires_grad", "frozen"])
def test_a_fixed_feature_extractor_is_said_to_be_held_by_no_optimizer_not_to_have_missed_updates(tmp_path, how):
    """A style transfer's VGG, kept fixed while the image trains: 'features.0.weight has a
    gradient (norm ...) but was not updated for 5 observed steps ...', as if an update had been
    due.  None was asked for: it was left out of the optimizer, or is not meant to train and
    computes its gradients for nothing, and the finding says both.  Frozen
    (requires_grad_(False)) it has no gradient, and no finding."""
    path = tmp_path / "style.py"
    path.write_text(FIXED_EXTRACTOR)
    found = of(run(tmp_path, str(path), how), "param_not_updated")
    if how == "frozen":
        assert found == []
        return
    [pn] = found
    assert (pn["tensor"], pn["evidence"]["in_optimizer"]) == ("0.weight", False), pn
    assert "not updated" not in pn["message"], pn["message"]
    assert pn["message"].endswith("and its value has not changed for 5 observed steps in a row since step 1: no "
                                  "optimizer that has stepped holds it; also 0.bias, 2.weight, 2.bias; either they "
                                  "were left out of the optimizer, or they are kept fixed (a feature extractor, a loss "
                                  "network) and their gradients are computed for nothing (requires_grad_(False) "
                                  "spares them)"), pn["message"]


BODY_LEFT_OUT = """
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 3))
opt = torch.optim.SGD(model[4].parameters(), lr=0.05)      # meant: model.parameters()
x, y = torch.randn(128, 64), torch.randint(0, 3, (128,))
for step in range(40):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_a_body_left_out_of_the_optimizer_is_one_finding_from_step_1(tmp_path):
    """The value of a parameter no optimizer holds is judged unchanged by its norm, which a
    full step (0, 32, ...) sums in float64 and the others in float32: 0.weight's read
    9.245893236894252 at step 0 and 9.245892851918873 after, a 'change' at step 1 (and at
    32 and 33).  So the weights' streaks began at step 2, the biases' (exact in both) at
    step 1: two findings of one cause, at steps 5 and 6.  A norm summed the other way is
    the same value to float32's precision."""
    path = tmp_path / "body.py"
    path.write_text(BODY_LEFT_OUT)
    [pn] = of(run(tmp_path, str(path)), "param_not_updated")
    assert (pn["step"], pn["evidence"]["steps"]) == (5, [1, 5]), pn
    assert {pn["tensor"], *pn["evidence"]["also"]} == {"0.weight", "0.bias", "2.weight", "2.bias"}


UNFROZEN_NOT_GIVEN = """
import torch, torch.nn as nn
torch.manual_seed(0)
backbone = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
head = nn.Linear(32, 4)
model = nn.Sequential(backbone, head)
backbone.requires_grad_(False)
opt = torch.optim.AdamW(head.parameters(), lr=1e-2)
X = torch.randn(256, 8); Y = (X[:, 0] > 0).long() + 2 * (X[:, 1] > 0).long()
for step in range(14):
    if step == 6:
        backbone.requires_grad_(True)        # (and never opt.add_param_group: the bug)
    i = step % 8
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(X[i * 32:(i + 1) * 32]), Y[i * 32:(i + 1) * 32])
    loss.backward()
    opt.step()
"""


def test_a_backbone_unfrozen_but_never_given_to_the_optimizer(tmp_path):
    """Progressive unfreezing that forgets add_param_group: the backbone's gradients come from
    step 6 and its values never change.  The streak counts from step 6, where the first
    gradient came to the unchanged value (it said 'since step 7' and fired at step 11: the
    value before the first gradient was not kept)."""
    path = tmp_path / "unfreeze.py"
    path.write_text(UNFROZEN_NOT_GIVEN)
    [pn] = of(run(tmp_path, str(path)), "param_not_updated")
    assert (pn["step"], pn["tensor"]) == (10, "0.0.weight"), pn
    assert pn["evidence"]["steps"] == [6, 10] and pn["evidence"]["in_optimizer"] is False
    assert set(pn["evidence"]["also"]) == {"0.0.bias", "0.2.weight", "0.2.bias"}


def test_lr_zero(tmp_path):
    found = run(tmp_path, "buggy", "--lr", 0)
    [pn] = of(found, "param_not_updated")               # one cause, one finding: the others listed
    assert (pn["step"], pn["tensor"]) == (4, "0.weight")
    assert pn["evidence"]["lr"] == 0 and pn["evidence"]["in_optimizer"] is True
    assert len(pn["evidence"]["also"]) == 7 and "learning rate 0" in pn["message"]
    assert of(found, "update_ratio") == []               # a zero update is not a ratio


LBFGS_CONVERGES = """
import sys
import torch, torch.nn as nn
torch.manual_seed(0)
x = torch.randn(64, 4, dtype=torch.double)
y = torch.sin(x.sum(1, keepdim=True))
model = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 1)).double()
opt = torch.optim.LBFGS(model.parameters(), lr=float(sys.argv[1]))
def closure():
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss
for i in range(30):
    before = [p.detach().clone() for p in model.parameters()]
    opt.step(closure)
    print(i, all(torch.equal(b, p) for b, p in zip(before, model.parameters())))
"""


def test_lbfgs_that_converged_is_not_stuck_and_one_at_lr_zero_is(tmp_path, capsys):
    """From step ~24 LBFGS makes no move (its tolerance_change test: the loss at
    6.2e-07, gradients ~1e-5, above the rule's min_grad_rms): its convergence,
    not a parameter left out (param_not_updated said 'not updated for 5 observed
    steps'); at lr 0 the same script is reported, as SGD's is."""
    path = tmp_path / "lbfgs.py"
    path.write_text(LBFGS_CONVERGES)
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    found = run(tmp_path / "a", str(path), "0.8")
    still = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.endswith(" True")]
    assert len(still) >= 5                                   # (it did stop moving, for 5 steps or more)
    assert of(found, "param_not_updated") == []
    found = run(tmp_path / "b", str(path), "0")
    [pn] = of(found, "param_not_updated")
    assert pn["evidence"]["lr"] == 0 and "learning rate 0" in pn["message"]


CONVERGED = """
import torch
import torch.nn as nn
torch.manual_seed(0)
x = torch.randn(256, 4)
y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(256, 1)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.3)
for i in range(60):
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
"""


def test_a_converged_model_whose_last_steps_round_away_is_not_stuck(tmp_path):
    """A linear regression at its minimum: gradients ~3e-7, so 0.3 x gradient is
    under half a float32 ulp of weights of 1-3 and the update is exactly 0.  That
    is convergence, not a parameter the optimizer misses (which lr 0, above,
    still is)."""
    path = tmp_path / "converged.py"
    path.write_text(CONVERGED)
    assert of(run(tmp_path, str(path)), "param_not_updated") == []


def test_bn_fed_huge_inputs(tmp_path):
    found = run(tmp_path, "buggy", "--bn", "--input-scale", 1e4, "--steps", 3)
    [bn] = of(found, "bn_stats")
    assert (bn["step"], bn["module"]) == (0, "1")
    assert bn["evidence"]["var_max"] > 1e6 and bn["evidence"]["channels"] == 32
    assert "running_var reaches" in bn["message"]


def test_loss_not_decreasing_on_dead_relu(tmp_path):
    found = run(tmp_path, example("dead_relu.py"), "--steps", 70)
    [ln] = of(found, "loss_not_decreasing")
    assert (ln["step"], ln["tensor"]) == (64, "loss")
    ev = ln["evidence"]
    assert ev["recorded_steps"] == 65 and ev["drop"] < ev["needed"] and ev["max_drop"] < ev["needed"]
    assert abs(ev["first_median"] - 2.30) < 0.05


# -- synthetic steps: what must not fire ------------------------------------------------------------

def feed(rule, steps, optimizers=()):
    """Run one rule over synthetic steps: each a dict {(name, kind): {stat: value}}."""
    rule.reset()
    return [(i, f) for i, series in enumerate(steps) for f in feed_one(rule, i, series, optimizers)]


def feed_one(rule, i, series, optimizers=(), facts=None):
    rec = SimpleNamespace(step=i, names=list(series), raw=None)
    return list(rule.check(StepContext(rec, _stats_of(series), facts or {}, {}, optimizers)) or ())


def _stats_of(series):
    names = list(series)
    stats = np.full((len(names), len(STAT_INDEX)), np.nan)
    stats[:, STAT_INDEX["nan_count"]] = stats[:, STAT_INDEX["inf_count"]] = 0
    stats[:, STAT_INDEX["count"]] = 1024
    for r, key in enumerate(names):
        for stat, v in series[key].items():
            stats[r, STAT_INDEX[stat]] = v
    return stats


def model_step(w=1.0, g=0.1, u=0.001, loss=2.3, grad=True, update=True, name="fc.weight"):
    s = {("loss", "loss"): {"mean": loss, "count": 1}, (name, "param"): {"norm": w, "mean": w / 100}}
    if update:
        s[(name, "update")] = {"norm": u}
    if grad:
        s[(name, "grad")] = {"norm": g}
    return s


def test_frozen_and_stale_gradients_are_not_not_updated():
    rule = stats_rules.ParamNotUpdated()
    # frozen (requires_grad False): param rows only
    assert feed(rule, [model_step(grad=False, update=False) for _ in range(10)]) == []
    # no optimizer holds it, its value never changes, but its .grad is stale (a GAN's generator
    # between its own steps): the same gradient norm every step
    assert feed(rule, [model_step(update=False) for _ in range(10)]) == []
    # a fresh gradient every step and the value never changes: reported after 5 steps
    found = feed(rule, [model_step(g=0.1 + i / 100, update=False) for i in range(10)])
    assert [(i, f.tensor) for i, f in found] == [(5, "fc.weight")]
    # updated every step (an optimizer, or hand-written updates): nothing
    assert feed(rule, [model_step(w=1 + i / 100) for i in range(10)]) == []
    # an lr of 0 for the first step of a warmup: nothing
    assert feed(rule, [model_step(u=0.0 if i == 0 else 0.001) for i in range(10)]) == []


def test_gradient_spikes_and_converged_runs_are_not_reported():
    ex, va = stats_rules.ExplodingGradient(), stats_rules.VanishingGradient()
    spike = [model_step(g=5e4 if i in (6, 9) else 0.5) for i in range(12)]     # two lone spikes
    assert feed(ex, spike) == []
    # gradients fall 1e5x because the loss went to ~0: converged, not vanishing
    done = [model_step(g=0.5 * 10 ** -(i / 2), loss=2.3 * 10 ** -(i / 2)) for i in range(12)]
    assert feed(va, done) == []
    # the same fall while the loss stays where it started: vanishing (relative), after 3 steps
    stuck = [model_step(g=0.5 * 10 ** -(i / 2)) for i in range(12)]
    found = feed(va, stuck)
    assert len(found) == 1 and "relative" in found[0][1].evidence["criteria"]
    # zero gradients (a frozen or dead layer) are neither
    assert feed(va, [model_step(g=0.0) for _ in range(12)]) == []
    # biases / tiny tensors are left out
    assert feed(ex, [model_step(g=1e6, name="fc.bias") for _ in range(12)]) == []


def test_update_ratio_leaves_zero_init_and_warmup_alone():
    rule = stats_rules.UpdateRatio()
    # a zero-initialised weight: ratio 1, 1/2, 1/3 ... (Adam at any lr)
    zero = [model_step(w=0.01 * (i + 1), u=0.01) for i in range(12)]
    assert feed(rule, zero) == []
    # a steady ratio of 0.5 is reported once, after the warm-up steps plus 3 in a row, once 10
    # losses tell the loss's trend (here flat: a warning)
    found = feed(rule, [model_step(w=1.0 + i, u=0.5 * (1.0 + i)) for i in range(12)])
    assert [(i, f.evidence["side"], f.severity) for i, f in found] == [(9, "high", "warning")]
    # a tiny ratio while the learning rate ramps up (warmup) is not judged
    opt = SimpleNamespace(param_groups=[{"params": [], "lr": 0.0}])
    steps = [model_step(u=1e-9) for _ in range(12)]
    found = []
    rule.reset()
    for i, s in enumerate(steps):
        opt.param_groups[0]["lr"] = 1e-6 * (i + 1)
        found += feed_one(rule, i, s, [("optimizer", opt)])
    assert found == []



# spatial_transformer_tutorial's shape: a branch (its localization net) whose way to the loss
# goes through a layer initialised to 0 for the identity (there fc_loc's last Linear, here a
# scale), trained with the rest of the model by one SGD.
GATED_BRANCH = """
import sys
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.loc = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
        self.scale = nn.Linear(16, 1)
        self.scale.weight.data.zero_()             # the identity to start with: x * 1
        self.scale.bias.data.fill_(1.0)
        self.head = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    def forward(self, x):
        return F.log_softmax(self.head(x * self.scale(self.loc(x))), dim=1)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=float(sys.argv[1]))
X = torch.randn(64, 16); y = (X[:, 0] > 0).long() + 2 * (X[:, 1] > 0).long()
for step in range(12):
    i = (step * 16) % 64
    loss = F.nll_loss(model(X[i:i + 16]), y[i:i + 16])
    opt.zero_grad(); loss.backward(); opt.step()
    print(step, repr(loss.item()))
"""


def test_update_ratio_low_behind_a_zero_initialised_layer_is_no_learning_rate_too_low(tmp_path):
    """The localization branch moves at ratios of 6e-7 (loc.0.weight, step 6) while the head,
    under the same SGD at lr 0.01, moves at 1.2e-3 to 5.7e-3: update_ratio said 'the learning
    rate is probably far too low', which, raised, would rewrite the head.  It now names the
    weight that moves at that learning rate and the gradient as the cause.  A learning rate
    far too low for every weight (1e-7) is still said to be one."""
    script = tmp_path / "gated.py"
    script.write_text(GATED_BRANCH)
    [ur] = of(run(tmp_path, str(script), "0.01"), "update_ratio")
    assert (ur["step"], ur["tensor"], ur["evidence"]["side"]) == (6, "loc.0.weight", "low")
    assert ur["evidence"]["peer"] == ["head.2.weight", pytest.approx(0.005706, rel=1e-3)]
    assert "far too low" not in ur["message"] and "not the learning rate" in ur["message"]
    [ur] = of(run(tmp_path, str(script), "1e-7"), "update_ratio")
    assert ur["evidence"]["side"] == "low" and ur["evidence"]["peer"] is None
    assert "the learning rate is probably far too low" in ur["message"]


def test_update_ratio_leaves_the_end_of_an_annealed_schedule_alone():
    """A cosine (or OneCycle) schedule ends with its lr near 0: the last steps of healthy
    1000-step runs (SGD under LambdaLR cosine, AdamW under OneCycleLR and under SequentialLR
    warmup + cosine) had ratios of 1e-7 to 7e-7 and were told 'the learning rate is probably
    far too low'.  A ratio low only by the decay from the peak lr is the schedule's; one low
    at the peak lr too (a learning rate far too low from the start) is still reported."""
    weight = SimpleNamespace(dim=lambda: 2)
    naming = SimpleNamespace(param_name=lambda p: "fc.weight", root_params=lambda: [weight])

    def judge(lrs, ratios):
        rule = stats_rules.UpdateRatio()
        rule.reset()
        opt = SimpleNamespace(param_groups=[{"params": [weight], "lr": 0.0}])
        found = []
        for i, (lr, r) in enumerate(zip(lrs, ratios)):
            opt.param_groups[0]["lr"] = lr
            series = model_step(u=r)
            rec = SimpleNamespace(step=i, names=list(series), raw=None)
            found += list(rule.check(StepContext(rec, _stats_of(series), {}, {}, [("optimizer", opt)], naming))
                          or ())
        return [(f.step, f.evidence["side"]) for f in found]

    n = 200
    cosine = [0.1 * 0.5 * (1 + math.cos(math.pi * i / n)) for i in range(n)]
    assert judge(cosine, [1e-3 * lr / 0.1 for lr in cosine]) == []
    # the same decay, with ratios 1000x too low from the start: reported
    assert judge(cosine, [1e-9 * lr / 0.1 for lr in cosine]) == [(5, "low")]
    # a constant learning rate far too low: reported
    assert judge([1e-9] * 12, [1e-9] * 12) == [(5, "low")]


LAYER_BY_LAYER = """
import torch, torch.nn as nn
torch.manual_seed(0)
layers = [nn.Linear(64, 256), nn.Linear(256, 256)]
opts = [torch.optim.Adam(l.parameters(), lr=0.03) for l in layers]
pos, neg = torch.randn(256, 64), 0.5 * torch.randn(256, 64)
for layer, opt in zip(layers, opts):       # each layer trained alone, its own Adam from its first step
    for i in range(40):
        gp, gn = torch.relu(layer.forward(pos)).pow(2).mean(1), torch.relu(layer.forward(neg)).pow(2).mean(1)
        loss = torch.log1p(torch.exp(torch.cat([2.0 - gp, gn - 2.0]))).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(repr(loss.item()))
    pos, neg = torch.relu(layer.forward(pos)).detach(), torch.relu(layer.forward(neg)).detach()
"""


def test_update_ratio_warms_up_each_stage_s_optimizer(tmp_path):
    """A network trained layer by layer (pytorch/examples mnist_forward_forward): the second
    layer's Adam starts at step 40, and its first updates are as large as the first layer's
    were at step 0 (ratios 0.64, 0.33, 0.42), which the warmup left alone there but not at
    step 40: 'update_ratio ... since step 40 ... while the loss goes down steadily (0.2462 ->
    1.176)' (the first layer's converged loss against the second's first).  Each weight's
    first updates are its warmup; a steady high ratio is still reported after them."""
    script = tmp_path / "layers.py"
    script.write_text(LAYER_BY_LAYER)
    assert of(run(tmp_path, str(script)), "update_ratio") == []
    rule = stats_rules.UpdateRatio()
    late = [model_step(u=0.0) if i < 10 else model_step(w=1.0 + i, u=0.5 * (1.0 + i)) for i in range(22)]
    # (updates from step 10 on: the warm-up's 3 steps, then 3 in a row)
    assert [(i, f.evidence["side"]) for i, f in feed(rule, late)] == [(15, "high")]


def test_loss_rule_needs_a_long_single_loss():
    rule = stats_rules.LossNotDecreasing()
    flat = [model_step(loss=2.3 + 0.01 * math.sin(i)) for i in range(70)]
    assert [i for i, _ in feed(rule, flat)] == [49]
    assert feed(rule, flat[:49]) == []                          # too short to judge
    gan = [{**s, ("loss/optimizerG", "loss"): {"mean": 0.7 + i / 50}} for i, s in enumerate(flat)]
    assert feed(rule, gan) == []                                # two adversarial losses
    falling = [model_step(loss=2.3 * 0.97 ** i + 0.3 * (i % 2)) for i in range(40)]
    assert feed(rule, falling) == []                            # noisy, but going down


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_loss_rule_judges_a_trend_over_a_horizon_that_grows_with_the_noise(seed):
    """A slow learner (4.6% in its first 30 steps, the fine-tuned head of
    issue 19) is not flat, however noisy (the noisier, the wider the trend's
    bound); a flat loss is."""
    rule = stats_rules.LossNotDecreasing()
    rng = np.random.default_rng(seed)
    for noise in (0.01, 0.05, 0.1):
        slow = [model_step(loss=2.3 * (1 - 0.0016 * i) + noise * rng.standard_normal()) for i in range(300)]
        assert feed(rule, slow) == [], noise
    flat = feed(rule, [model_step(loss=2.3 + 0.01 * rng.standard_normal()) for i in range(100)])
    assert [i for i, _ in flat] == [49] and flat[0][1].evidence["max_drop"] < flat[0][1].evidence["needed"]
    # a loss that fell and then stayed (converged) is not flat
    done = [model_step(loss=max(2.3 * 0.9 ** i, 0.5) + 0.02 * rng.standard_normal()) for i in range(400)]
    assert feed(rule, done) == []


def test_nonfinite_reports_backward_order_once_per_incident():
    rule = stats_rules.NonFinite()
    ok = {("fc1", "act"): {}, ("loss", "loss"): {}, ("fc1.weight", "param"): {}, ("fc2.weight", "param"): {},
          ("fc1.weight", "grad"): {}, ("fc2.weight", "grad"): {}}
    nan_grads = {k: ({"nan_count": 3} if k[1] in ("grad", "param") else {}) for k in ok}
    found = feed(rule, [ok, nan_grads, nan_grads, ok, nan_grads])
    # the gradient nearest the loss (the last layer: first in backward order), before the params it spoiled
    assert [(i, f.tensor, f.evidence["kind"]) for i, f in found] == [(1, "fc2.weight", "grad"),
                                                                   (4, "fc2.weight", "grad")]
    assert found[0][1].evidence["nonfinite_tensors"] == {"param": 2, "grad": 2}


def test_bn_rule_reads_the_probe_summary():
    rule = stats_rules.BatchNormStats()
    rule.reset()

    def bn(**kw):
        f = {"modules": ["bn1", "bn2"], "channels": np.array([16, 16]), "mean_absmax": np.array([0.5, 0.5]),
             "var_min": np.array([0.5, 0.5]), "var_max": np.array([2.0, 2.0]), "nonfinite": np.array([0, 0]),
             "var_zero_frac": np.array([0.0, 0.0])}
        for k, v in kw.items():
            f[k] = np.array(v)
        return feed_one(rule, 0, model_step(), facts={"bn_stats": f})
    assert bn() == [] and bn(var_zero_frac=[0.1, 0.2]) == []        # a few dead channels happen
    [f] = bn(var_zero_frac=[0.0, 0.75])                               # most of bn2 collapsed
    assert f.module == "bn2" and "~0 in 75% of 16 channels" in f.message
    [f] = bn(nonfinite=[3, 0])
    assert f.module == "bn1" and f.evidence["nonfinite_channels"] == 3
    assert bn(nonfinite=[3, 0]) == []                                 # once per module


def test_update_ratio_names_the_loss_trend_by_its_fitted_line():
    """The loss's trend words and its numbers agree: 'goes down steadily (0.6935 ->
    1.046)' once came from the medians of the window's first and last three losses
    where the level jumped inside it; the numbers are the Theil-Sen line's ends now."""
    rule = stats_rules.UpdateRatio()
    v = np.array([0.5, 0.5, 0.6] + list(np.linspace(3.0, 0.9, 27)))     # a jump up, then a long fall
    rule._losses = np.full(v.size, np.nan)
    rule._losses[:] = v
    rule._steps = v.size
    trend, first, last, n = rule._loss_trend()
    assert n == v.size and np.median(v[:3]) < np.median(v[-3:])        # (the old numbers: rising)
    assert trend == "falling" and first > last
    slope = (last - first) / (n - 1)
    assert np.median(v - (first + slope * np.arange(n))) == pytest.approx(0.0, abs=1e-9)


LBFGS_FIT = """
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
with torch.no_grad():
    for p in model.parameters():
        p.mul_(0.05)
x = torch.randn(64, 8)
y = (x @ torch.randn(8, 1)) * 3.0
opt = torch.optim.LBFGS(model.parameters(), lr=0.8)
for step in range(8):
    def closure():
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        return loss
    loss = opt.step(closure)
    print("step", step, repr(loss.item()))
"""


def test_update_ratio_leaves_lbfgs_alone_live_and_on_its_trace(tmp_path):
    """LBFGS's one step() is up to 20 curvature-scaled iterations: its first
    update here is as large as the small weights it leaves (ratio 0.995) while
    the loss falls from 9 to 2e-8.  'the learning rate is far too high' was a
    false finding (pytorch/examples time_sequence_prediction: 0.929 at step 0).
    The trace records each optimizer's class, so nndb check-trace agrees."""
    from nndb.rules.catalog import load
    from nndb.rules.offline import check_trace
    from nndb.store.reader import TraceReader
    script = tmp_path / "lbfgs.py"
    script.write_text(LBFGS_FIT)
    assert of(run(tmp_path, str(script)), "update_ratio") == []
    with TraceReader(str(tmp_path / "run.h5")) as reader:
        assert [o["family"] for o in reader.optimizers()[0]["optimizers"]] == ["LBFGS"]
        offline = check_trace(reader, load("default"))
    assert "update_ratio" in offline.rules_run and not [f for f in offline.findings if f.rule == "update_ratio"]
    # (the same updates under SGD's name: judged, and found)
    rule = stats_rules.UpdateRatio()
    assert [f.evidence["side"] for _, f in feed(rule, [model_step(w=1.0, u=0.995)])] == ["high"]


def test_loss_explodes_counts_the_steps_since_the_low_point_in_a_full_window():
    """0.5 at step 7, 100 at step 10: three recorded steps, also once the
    10-step window is full (it said 2: the window had dropped its first)."""
    losses = [1.0, 1.1, 0.9, 1.0, 1.2, 1.0, 0.95, 0.5, 1.0, 1.1, 100.0, 90.0, 95.0]
    found = feed(stats_rules.LossExplodes(), _losses(losses))
    [(step, f)] = found                               # (confirmed by the 2 steps after the jump)
    assert step == 12 and f.evidence["jump_step"] == 10 and f.evidence["after"] == [90.0, 95.0]
    assert f.evidence["steps_back"] == 3 and f.evidence["low"] == 0.5
    assert "in 3 recorded step(s) by step 10," in f.message and "stayed up (90, 95 since)" in f.message
    short = feed(stats_rules.LossExplodes(), _losses([1.0, 0.5, 80.0, 70.0, 60.0]))
    assert [(s, f.evidence["steps_back"]) for s, f in short] == [(4, 1)]       # (a window not full yet)


def _losses(values):
    return [{("loss", "loss"): {"mean": v, "count": 1}} for v in values]


def test_loss_explodes_waits_for_the_jump_to_stay_up():
    """A jump x100 above anything before is a divergence only if the loss
    stays up: the dynamic_net tutorial's random-depth polynomial (x^4, x^5
    terms on a random third of the steps each) went x205 at step 10 and fell
    back the next step, and converged.  A loss that rises further is
    confirmed at the next step; one that goes non-finite, then."""
    rule = stats_rules.LossExplodes()
    base = [1.0e5, 2.0e5, 1.5e5, 3.0e5, 1.2e5, 2.5e5, 1.8e5]
    # a spike, back under 100x the low at once / back under the window's largest the next step but one
    assert feed(rule, _losses(base + [3.0e7, 1.6e5] + base)) == []
    assert feed(rule, _losses(base + [3.0e7, 2.0e7, 2.0e5] + base)) == []
    # ... and one that lands above the low x100 but at the run's own earlier level: not up
    assert feed(rule, _losses([1e7, 1e5] + base + [3.0e7, 5e6, 8e6])) == []
    # higher still: confirmed at once
    [(step, f)] = feed(rule, _losses(base + [3.0e7, 5.0e7]))
    assert step == len(base) + 1 and f.evidence["jump_step"] == len(base) and "rose further (50000000 since)" in f.message
    # stays up, lower than the jump: after 2 steps
    [(step, f)] = feed(rule, _losses(base + [3.0e7, 2.5e7, 2.9e7, 1.0e5]))
    assert step == len(base) + 2 and f.evidence["after"] == [2.5e7, 2.9e7]
    # goes non-finite right after the jump: that step
    [(step, f)] = feed(rule, _losses(base + [3.0e7, float("inf")]))
    assert step == len(base) + 1 and "then inf 1 recorded step(s) later" in f.message
    # confirm 0: at the jump, as before
    rule.set_threshold("confirm", 0)
    [(step, f)] = feed(rule, _losses(base + [3.0e7, 1.6e5]))
    assert step == len(base) and f.evidence["after"] == []


def test_loss_explodes_says_an_unconfirmed_jump_when_the_script_raises_there():
    rule = stats_rules.LossExplodes()
    rule.reset()
    found = []
    for i, v in enumerate([1.0, 1.1, 0.9, 300.0]):
        rec = SimpleNamespace(step=i, names=[("loss", "loss")], raw=None)
        ctx = StepContext(rec, _stats_of({("loss", "loss"): {"mean": v, "count": 1}}), {}, {}, ())
        ctx.ending = i == 3
        found += list(rule.check(ctx))
    [f] = found
    assert f.step == 3 and "(and the script raised at this step)" in f.message


SMALL_THEN_LARGE = '''
import torch, torch.nn as nn
torch.manual_seed(0)
# a GPT's shape: small hidden outputs (8 x 16), then a head whose output is large (8 x 6000,
# above stats.HOST_MAX_ELEMENTS: measured as it runs, where the small ones wait for the step's end)
model = nn.Sequential(nn.Linear(4, 16), nn.LayerNorm(16), nn.Linear(16, 6000))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(8, 4), torch.randint(0, 6000, (8,))
for step in range(5):
    if step == 3:
        with torch.no_grad():
            model[0].weight[0, 0] = float("inf")      # the first layer's output: Inf, then LayerNorm's NaN
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
'''


def test_nonfinite_names_the_first_module_that_ran_when_a_later_one_s_output_is_large(tmp_path):
    """llm.c's train_gpt2.py at lr 1e30: the first LayerNorm made the NaN (catch nan said so), and
    nonfinite said 'NaN first appeared in act lm_head': the head's output, the one above 4096
    elements, went into the step's rows as it ran and the small ones after it, at the step's end."""
    path = tmp_path / "s.py"
    path.write_text(SMALL_THEN_LARGE)
    [nf] = of(run(tmp_path, str(path)), "nonfinite")
    assert (nf["step"], nf["tensor"], nf["evidence"]["kind"]) == (3, "0", "act"), nf["message"]
    assert "Inf first appeared in act 0 " in nf["message"]
    from nndb.store.reader import TraceReader
    with TraceReader(str(tmp_path / "run.h5")) as t:        # (the trace's series: in the order the modules ran)
        assert [s.name for s in t.series() if s.kind == "act"][:3] == ["0", "1", "2"]


GRAD_REMADE = """
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model[2].parameters(), lr=0.05)      # (the bug: the first layer left out)
data, labels = torch.randn(512, 16), torch.randint(0, 4, (512,))
for it in range(12):
    model.zero_grad(set_to_none=True)                         # (every .grad freed, made anew by backward)
    loss = F.cross_entropy(model(data[it * 16:it * 16 + 16]), labels[it * 16:it * 16 + 16])
    loss.backward()
    opt.step()
    print("it", it, repr(model[0].weight.grad.norm().item()))
"""


def test_a_grad_made_anew_with_the_id_of_the_last_one_is_this_steps(tmp_path):
    """A parameter no optimizer holds has its gradient recorded where the step's backward
    made it, told by the .grad's id() and version: a .grad freed by zero_grad(set_to_none)
    and made anew often has the old one's id (and version 0, as the old one): 0.weight's
    gradient was missing at steps 2 and 9 of 12, and param_not_updated came at step 7
    ('since step 3'), not 5."""
    from conftest import plain_and_recorded
    from nndb.store.reader import TraceReader
    plain, trace = plain_and_recorded(tmp_path, GRAD_REMADE)
    truth = [float(v) for v in re.findall(r"^it \d+ (\S+)$", plain.stdout, re.M)]
    with TraceReader(trace) as t:
        steps, norms = t.history(t.find("0.weight", "grad")[0], "norm")
        found = [f for f in t.records("finding") if f["rule"] == "param_not_updated"]
    assert list(steps) == list(range(12)), steps
    np.testing.assert_allclose(norms, truth, rtol=1e-6)
    assert [(f["step"], f["evidence"]["steps"]) for f in found] == [(5, [1, 5])], found


def test_a_grad_mark_is_of_the_tensor_not_of_its_id():
    """(the case above, made sure of: a new tensor that takes a freed one's id, version 0 as
    the freed one's, is not the gradient the mark saw)"""
    import torch
    from nndb.tracer.recorder import _grad_mark, _same_grad
    g = torch.zeros(3)
    mark, old = _grad_mark(g), id(g)
    assert _same_grad(mark, g)
    g.add_(1)
    assert not _same_grad(mark, g)                # (changed in place: its version moved)
    del g
    for _ in range(1000):
        new = torch.zeros(3)
        if id(new) == old:
            break
        del new
    else:
        pytest.skip("no new tensor took the freed one's id")
    assert new._version == 0 and not _same_grad(mark, new)
