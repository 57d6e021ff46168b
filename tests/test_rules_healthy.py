"""Rules must not cry wolf: the healthy example scripts produce no finding of
severity warning or error with the default rules."""
import pytest

from conftest import example, findings_of, nndb, run_in_process

HEALTHY = {
    "mlp.py": [],
    "cnn.py": [],                 # batch norm, eval() for validation and back
    "lstm.py": [],                # gradient clipping
    "transformer.py": [],         # dropout and LR warmup
    "grad_accum.py": [],
    "gan.py": [],                 # two optimizers, detached generator output
    "lbfgs.py": [],               # a closure
    "manual_sgd.py": [],          # no torch.optim
    "frozen_backbone.py": [],     # only the head in the optimizer
    "dataloader.py": [],
}


@pytest.mark.parametrize("script", sorted(HEALTHY))
def test_healthy_scripts_have_no_findings(tmp_path, script, capsys):
    res = run_in_process(tmp_path, example(script), HEALTHY[script])
    assert res.exit_code == 0
    assert findings_of(res) == []
    # every built-in rule ran (none was switched off by an error of its own)
    assert all(r.enabled for r in res.session.rules.rules)


def test_the_dynamic_depth_tutorial_is_healthy(tmp_path):
    """The PyTorch tutorial dynamic_net.py (tests/scripts/healthy_dynamic_depth_polynomial.py,
    seed 0 is the tutorial's run): its loss jumps x205 at step 10 on a deep random draw and
    falls back at the next (loss_explodes said 'the run diverges' there), and its x^4 weight
    goes without a gradient on a random third of the steps, 5 in a row at step 554 (grad_none
    said it was cut from the loss).  It converges: no finding."""
    import os
    script = os.path.join(os.path.dirname(__file__), "scripts", "healthy_dynamic_depth_polynomial.py")
    res = run_in_process(tmp_path, script, ["--seed", "0", "--steps", "600"])
    assert res.exit_code == 0
    assert res.session.log.findings == []
    assert all(r.enabled for r in res.session.rules.rules)


SWEEP = """
import sys
import torch, torch.nn as nn
torch.manual_seed(0)
X = torch.randn(24, 6); y = torch.randint(0, 3, (24,))
for trial, gain in enumerate((0.5, 1.0, 2.0)):      # a sweep over the last layer's initial scale
    model = nn.Sequential(nn.Linear(6, 64), nn.Tanh(), nn.Linear(64, 3))
    nn.init.normal_(model[2].weight, std=gain)
    if sys.argv[1] == "diverges" and trial == 1:     # (planted: a learning rate far too high)
        opt = torch.optim.SGD(model.parameters(), lr=40.0, momentum=0.9)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=0.03)
    for i in range(80):
        loss = nn.functional.cross_entropy(model(X), y)
        opt.zero_grad(); loss.backward(); opt.step()
        print(trial, i, repr(loss.item()))
"""


def _live_and_offline(tmp_path, source: str, arg: str) -> tuple:
    """Run ``source`` (argv ``arg``) under nndb in this process, then check-trace its trace:
    the (rule, step, evidence) of the errors and warnings, live and offline."""
    from nndb.rules.catalog import load
    from nndb.rules.offline import check_trace
    from nndb.store.reader import TraceReader
    script = tmp_path / "script.py"
    script.write_text(source)
    res = run_in_process(tmp_path, str(script), [arg])
    assert res.exit_code == 0
    with TraceReader(str(tmp_path / "run.h5")) as reader:
        offline = check_trace(reader, load("default")).findings
    live = [(f["rule"], f["step"], f["evidence"]) for f in findings_of(res)]
    return live, [(f.rule, f.step, f.evidence) for f in offline if f.severity in ("error", "warning")]


# fgsm_tutorial's test() over several epsilons: a model nothing trains, a backward per example
# for its input's gradient (each one a hand-written step), more than loss_not_decreasing's 50
# steps; or ("flat_by_hand") a loop that does update by hand, at a learning rate too small to
# move its loss.
ATTACK_EPSILONS = """
import sys
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
nn.init.normal_(model[2].weight, std=0.01)   # (an untrained head: near-uniform outputs, a loss near log 4)
X = torch.rand(20, 8)
with torch.no_grad():
    y = model(X).argmax(1)                  # (every example is attacked: its prediction is right)
if sys.argv[1] == "attack":
    model.eval()
for eps in (0.0, 0.05, 0.1, 0.2):
    correct = 0
    for i in range(20):
        data = X[i:i + 1].clone()
        data.requires_grad = True
        loss = F.nll_loss(F.log_softmax(model(data), 1), y[i:i + 1])
        model.zero_grad()
        loss.backward()
        if sys.argv[1] == "attack":
            adv = torch.clamp(data + eps * data.grad.sign(), 0, 1)
            correct += int(model(adv).argmax().item() == y[i].item())
        else:
            with torch.no_grad():
                for p in model.parameters():
                    p -= 1e-6 * p.grad
    print(eps, correct)
"""


@pytest.mark.parametrize("how", ["attack", "flat_by_hand"])
def test_an_attack_over_many_examples_is_no_loss_that_fails_to_go_down(tmp_path, how):
    """FGSM's test() at 4 epsilons, 20 examples each: 80 backward passes, each a hand-written
    step that changes no parameter.  loss_not_decreasing said 'loss has not gone down in 50
    recorded steps: median 2.084 over the last 10 vs 2.083 over the first 10' at step 49 of
    the tutorial's shape (its 50 steps are the attack's examples, not training).  A loop that
    does update by hand, too little to move its loss, is still found (and its learning rate,
    1e-6, by update_ratio)."""
    live, offline = _live_and_offline(tmp_path, ATTACK_EPSILONS, how)
    for found in (live, offline):
        if how == "attack":
            assert found == []
        else:
            assert [(rule, step) for rule, step, _ in found] == [("update_ratio", 5), ("loss_not_decreasing", 49)]


@pytest.mark.parametrize("how", ["healthy", "diverges"])
def test_each_trial_of_a_sweep_is_judged_as_a_run_of_its_own(tmp_path, how):
    """A new model and optimizer per trial in one process: the loss of trial 1 starts at
    2.644, 421x trial 0's last loss (0.00628) and above its first (1.268), and falls.  Judged
    as one run, loss_explodes said 'the run diverges' at step 82, live and in check-trace;
    each trial is now judged from its own first step.  A trial that does diverge (SGD at lr
    40: 2.644, 18.5, 268) is still found, against its own start."""
    live, offline = _live_and_offline(tmp_path, SWEEP, how)
    for found in (live, offline):
        if how == "healthy":
            assert found == []
        else:
            assert [(step, e["low"], e["jump_step"]) for rule, step, e in found if rule == "loss_explodes"] == \
                [(83, pytest.approx(2.6438348), 82)]


ONE_MODEL = """
import sys
import torch, torch.nn as nn
torch.manual_seed(0)
X = torch.randn(24, 6); y = torch.randint(0, 3, (24,))
model = nn.Sequential(nn.Linear(6, 64), nn.Tanh(), nn.Linear(64, 3))      # one model for the whole run
how = sys.argv[1]
def train(opt, n, tag):
    for i in range(n):
        loss = nn.functional.cross_entropy(model(X), y)
        opt.zero_grad(); loss.backward(); opt.step()
        print(tag, i, repr(loss.item()))
if how.startswith("sweep"):             # re-initialised in place, a new optimizer per trial
    for trial in range(4):
        model.apply(lambda m: m.reset_parameters() if isinstance(m, nn.Linear) else None)
        if how == "sweep_diverges" and trial == 2:      # (planted: a learning rate far too high)
            opt = torch.optim.SGD(model.parameters(), lr=40.0, momentum=0.9)
        else:
            opt = torch.optim.Adam(model.parameters(), lr=0.03)
        train(opt, 80, trial)
elif how.startswith("stage2"):          # fine-tuning goes on with a new optimizer over the same model
    opt = torch.optim.Adam(model.parameters(), lr=0.03)
    train(opt, 80, "s1")
    opt = torch.optim.Adam(model.parameters(), lr=5.0 if how == "stage2_diverges" else 0.003)
    train(opt, 80, "s2")
else:                                   # an optimizer made anew at every step, diverging from step 40
    for i in range(80):
        opt = torch.optim.SGD(model.parameters(), lr=0.1 if i < 40 else 60.0)
        loss = nn.functional.cross_entropy(model(X), y)
        opt.zero_grad(); loss.backward(); opt.step()
        print(i, repr(loss.item()))
"""


@pytest.mark.parametrize("how, found", [
    ("sweep", []),
    ("sweep_diverges", [(163, pytest.approx(1.19874, rel=1e-4), 162)]),
    ("stage2", []),
    ("stage2_diverges", [(82, pytest.approx(0.00160515, rel=1e-4), 81)]),
    ("every_step_diverges", [(43, pytest.approx(0.600512, rel=1e-4), 42)]),
])
def test_a_trial_that_reinitialises_one_model_is_judged_as_a_run_of_its_own(tmp_path, how, found):
    """One model re-initialised in place per trial (reset_parameters), a new optimizer each: the
    same parameters every step, so only the optimizers say a trial starts.  Trial 1's first loss
    (1.185) is 761x trial 0's last (0.00156): loss_explodes said 'the run diverges' at step 82,
    live and in check-trace, and so missed trial 2's real divergence (SGD at lr 40, from 1.199 to
    212 by step 162).  A new stage that goes on training the model with a new optimizer is
    judged from its own first loss, measured before the new optimizer acted: its divergence
    (Adam at lr 5 after convergence: 0.0016 to 35.3) is still found, as is one under an optimizer
    made anew at every step (no new run: each steps once)."""
    live, offline = _live_and_offline(tmp_path, ONE_MODEL, how)
    for got in (live, offline):
        assert [(step, e["low"], e["jump_step"]) for rule, step, e in got if rule == "loss_explodes"] == found
        if not found:
            assert [rule for rule, _, _ in got if rule.startswith("loss_")] == []


KFOLD_CONVERGES = """
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
X = torch.randn(300, 5); Y = X @ torch.randn(5, 1)
for fold in range(3):
    m = nn.Linear(5, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
    idx = torch.arange(300) % 3 != fold
    for i in range(200):
        loss = F.mse_loss(m(X[idx]), Y[idx]); opt.zero_grad(); loss.backward(); opt.step()
    print(fold, repr(loss.item()))
"""


def test_a_fold_that_converges_to_float32_resolution_is_healthy_after_its_model_is_gone(tmp_path):
    """A k-fold loop fitting a linear map exactly: each fold's last steps have gradients
    (norm 5.5e-7) that lr 0.1 rounds away against the weights (norm 1.886), which
    param_not_updated leaves alone where it knows the learning rate.  The rules judge a step
    some steps after the script made it: fold 1's model was gone by then, and its parameters
    (alive in the optimizer) were named 'weight', not 'm2.weight' as recorded, so no learning
    rate was found for them: 'warning: param_not_updated at step 389: m2.weight has a gradient
    (norm 5.55e-07) but was not updated ... its update is exactly 0'.  A gone model's
    parameters keep the names they had."""
    script = tmp_path / "kfold.py"
    script.write_text(KFOLD_CONVERGES)
    res = run_in_process(tmp_path, str(script), [])
    assert res.exit_code == 0
    assert findings_of(res) == []


# fgsm_tutorial's shape: a model nothing trains (eval(), no optimizer), a backward per example
# for the gradient of its input; or ("forgot_bias") a hand-written loop that updates the
# weight and leaves the bias out.
INPUT_GRADIENTS = """
import sys
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
X = torch.rand(12, 8); y = torch.randint(0, 4, (12,))
if sys.argv[1] == "attack":
    model.eval()
for i in range(12):
    data = X[i:i + 1].clone()
    data.requires_grad = True
    loss = F.cross_entropy(model(data), y[i:i + 1])
    model.zero_grad()
    loss.backward()
    if sys.argv[1] == "attack":
        adv = torch.clamp(data + 0.1 * data.grad.sign(), 0, 1)
        print(i, model(adv).argmax().item())
    else:
        with torch.no_grad():
            for layer in (model[0], model[2]):
                layer.weight -= 0.1 * layer.weight.grad
        print(i, repr(loss.item()))
"""


@pytest.mark.parametrize("how", ["attack", "forgot_bias"])
def test_a_backward_for_an_inputs_gradient_through_a_model_nothing_trains_is_healthy(tmp_path, how):
    """FGSM's attack: no optimizer, and no parameter changes at any step: it trains nothing.
    param_not_updated said 'fc1.weight has a gradient (norm 12.15) but was not updated for
    5 observed steps ...; also conv1.weight, conv1.bias, conv2.weight and 4 more' at step 4.
    A hand-written loop that leaves the biases out of its update still has them found."""
    live, offline = _live_and_offline(tmp_path, INPUT_GRADIENTS, how)
    for found in (live, offline):
        if how == "attack":
            assert found == []
        else:
            assert [(rule, step, e["steps"], e["also"]) for rule, step, e in found] == \
                [("param_not_updated", 4, [0, 4], ["2.bias"])]       # (0.bias, and 2.bias with it)


def test_a_tensor_lr_annealed_to_zero_is_healthy_and_recorded(tmp_path):
    """The compiled-optimizer recipe's tensor lr (AdamW(lr=torch.tensor(1e-3)), a cosine
    schedule annealed to 0 over 300 steps, tests/scripts/tensor_lr_cosine.py): the rules read
    no tensor lr, so update_ratio did not see the schedule end and said 'the learning rate is
    probably far too low' at step 299 (0.weight's ratio 7.6e-08), where the same run with a
    float lr has no finding; and the trace held no learning rate at all ('nndb inspect
    --series lr' an empty table).  The lr is read as the number the tensor holds."""
    import os

    import nndb
    script = os.path.join(os.path.dirname(__file__), "scripts", "tensor_lr_cosine.py")
    res = run_in_process(tmp_path, script)
    assert res.exit_code == 0
    assert res.session.log.findings == [], res.session.log.findings
    with nndb.open(str(tmp_path / "run.h5")) as t:
        (opt, group, lrs), = t.reader.learning_rates()
    torch = pytest.importorskip("torch")
    want = torch.tensor(1e-3)                 # (the schedule's values, as the tensor holds them)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(torch.optim.AdamW([torch.zeros(1)], lr=want), T_max=300)
    for step in range(300):
        assert lrs[step] == float(want), (step, lrs[step], float(want))
        sched.optimizer.step()
        sched.step()


def test_a_large_sparse_embedding_table_is_judged_by_the_rows_it_moves(tmp_path):
    """A 200,000-row nn.Embedding(sparse=True) under SparseAdam at lr 3e-5
    (tests/scripts/sparse_embedding_table.py): each step moves the 32 rows its batch used by
    ~3e-5 of their norm, but update_ratio took the whole table's ratio (4e-7) and said 'the
    learning rate is probably far too low' at step 5.  The low side is judged over the rows
    the update moves (the gradient's share of nonzero entries, as vanishing_gradient judges
    its RMS); a table at lr 1e-9 is still far too low."""
    import os
    script = os.path.join(os.path.dirname(__file__), "scripts", "sparse_embedding_table.py")
    res = run_in_process(tmp_path, script)
    assert res.exit_code == 0
    assert res.session.log.findings == [], res.session.log.findings
    r = nndb("check-trace", str(tmp_path / "run.h5"))             # (the same judgement on the trace)
    assert r.returncode == 0 and " 0 findings " in r.stdout + r.stderr, r
    res = run_in_process(tmp_path, script, ["--lr", "1e-9"])
    low = [f for f in res.session.log.findings if f["rule"] == "update_ratio"]
    assert len(low) == 1 and low[0]["tensor"] == "emb.weight" and "far too low" in low[0]["message"], low
