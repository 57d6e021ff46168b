"""``nndb check`` catches the classics it exists for in the loops users
write: a missing zero_grad in a plain loop, a nanoGPT-shaped loop (micro-step
accumulation, the lr set by the script, clipping, AdamW) and a DCGAN-shaped
one (two optimizers, the generator's backward through the discriminator),
with no false alarm on the same loops done right; a loss of exactly 0 (the
DDP tutorial's cross-entropy over one output) fails the checklist by name,
and no dead ReLU is blamed on a model without one."""
import io
import os

import pytest

from conftest import nndb
from nndb.check import check
from nndb.run.launcher import Target
from nndb.render.check import text

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "check_loop_shapes.py")


def run_check(*args, steps=2, overfit_iters=20):
    report = check(Target(path=SCRIPT, args=list(args)), steps=steps, overfit_iters=overfit_iters,
                   script_stdout=io.StringIO(), message=lambda m: None)
    return report, {c.name: c for c in report.checks}


@pytest.mark.parametrize("shape", ["plain", "nanogpt", "dcgan"])
def test_a_missing_zero_grad_fails_and_the_right_loop_passes(shape):
    report, checks = run_check("--shape", shape, "--no-zero-grad")
    c = checks["zero-grad"]
    assert c.status == "FAIL", text(report)
    assert c.evidence.startswith("at step 1, ") and ".grad held the last step's gradient plus the new one" in c.evidence
    assert "call optimizer.zero_grad() once per step" in c.cause and report.exit_code == 1
    fixed, checks = run_check("--shape", shape)
    assert checks["zero-grad"].status == "PASS", text(fixed)
    assert checks["zero-grad"].evidence.endswith("was reset between optimizer steps "
                                                 f"({2 if shape == 'dcgan' else 1} step(s) checked)")


def test_nanogpt_shape_without_zero_grad_fails_with_more_steps_too():
    report, checks = run_check("--shape", "nanogpt", "--no-zero-grad", steps=5)
    assert checks["zero-grad"].status == "FAIL", text(report)
    assert len(checks["zero-grad"].numbers["checked"]) == 4      # steps 1..4, each against the one before


def test_a_loss_of_exactly_zero_fails_by_name_and_blames_no_relu():
    report, checks = run_check("--shape", "ddp-tutorial")
    assert report.exit_code == 1, text(report)
    assert checks["finite-loss"].status == "FAIL"
    assert checks["finite-loss"].evidence == "the loss is exactly 0 at every step (2 backward() loss value(s) in 2 step(s))"
    assert checks["finite-loss"].cause.startswith("cross-entropy over a single class")
    assert checks["initial-loss"].status == "FAIL" and "one class, so the loss is 0" in checks["initial-loss"].evidence
    assert checks["gradients"].status == "FAIL" and "ReLU" not in checks["gradients"].cause
    assert checks["gradients"].cause.endswith("the loss is exactly 0 at every step (see finite-loss)")
    assert checks["overfit"].status == "SKIP" and "the loss is 0 before any training" in checks["overfit"].evidence


def test_cli_on_the_nanogpt_shape_without_zero_grad():
    r = nndb("check", SCRIPT, "--shape", "nanogpt", "--no-zero-grad")
    assert r.returncode == 1, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("FAIL  zero-grad"))
    assert "held the last step's gradient plus the new one" in line
