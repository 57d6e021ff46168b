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
