"""Rules must not cry wolf: the healthy example scripts produce no finding of
severity warning or error with the default rules."""
import pytest

from conftest import example, findings_of, run_in_process

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


@pytest.mark.parametrize("how", ["healthy", "diverges"])
def test_each_trial_of_a_sweep_is_judged_as_a_run_of_its_own(tmp_path, how):
    """A new model and optimizer per trial in one process: the loss of trial 1 starts at
    2.644, 421x trial 0's last loss (0.00628) and above its first (1.268), and falls.  Judged
    as one run, loss_explodes said 'the run diverges' at step 82, live and in check-trace;
    each trial is now judged from its own first step.  A trial that does diverge (SGD at lr
    40: 2.644, 18.5, 268) is still found, against its own start."""
    from nndb.rules.catalog import load
    from nndb.rules.offline import check_trace
    from nndb.store.reader import TraceReader
    script = tmp_path / "sweep.py"
    script.write_text(SWEEP)
    res = run_in_process(tmp_path, str(script), [how])
    assert res.exit_code == 0
    with TraceReader(str(tmp_path / "run.h5")) as reader:
        offline = check_trace(reader, load("default")).findings
    live = [(f["rule"], f["step"], f["evidence"]) for f in findings_of(res)]
    offline = [(f.rule, f.step, f.evidence) for f in offline if f.severity in ("error", "warning")]
    for found in (live, offline):
        if how == "healthy":
            assert found == []
        else:
            assert [(step, e["low"], e["jump_step"]) for rule, step, e in found if rule == "loss_explodes"] == \
                [(83, pytest.approx(2.6438348), 82)]
