"""``nndb check`` (the checklist on a script's first steps) and the
``gradcheck`` debugger command.  Most tests call nndb.check in-process (no
torch import per test); a few run the CLI."""
import io
import math
import os
import json
import re
import runpy
import sys
import textwrap

import pytest

from conftest import ROOT, Transcript, example, nndb
from nndb.check import CHECK_STEPS, OVERFIT_ITERS, check
from nndb.run.launcher import Target
from nndb.render.check import text
from nndb.text import fmt


def run_check(script, *args, steps=CHECK_STEPS, overfit_iters=OVERFIT_ITERS):
    out = io.StringIO()
    report = check(Target(path=script, args=[str(a) for a in args]), steps=steps,
                   overfit_iters=overfit_iters, script_stdout=out, message=lambda m: None)
    return report, out.getvalue()


def by_name(report) -> dict:
    return {c.name: c for c in report.checks}


def status(report) -> dict:
    return {c.name: c.status for c in report.checks}


def write(tmp_path, name, body) -> str:
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return str(p)


REGRESSION = """
    import torch, torch.nn as nn
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = x @ torch.randn(8) {target_shape}
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    {extra}
    opt = torch.optim.Adam({params}, lr=1e-2)
    for step in range(20):
        idx = torch.randint(0, 256, (64,))
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item()!r}")
"""


def regression(tmp_path, name, target_shape=".unsqueeze(1)", extra="", params="model.parameters()"):
    body = REGRESSION.replace("{target_shape}", target_shape).replace("{extra}", extra).replace("{params}", params)
    return write(tmp_path, name, body)


# -- the healthy baseline ----------------------------------------------------------------------
def test_healthy_mlp_passes_every_check_and_keeps_the_scripts_numbers():
    report, out = run_check(example("mlp.py"))
    assert status(report) == {n: "PASS" for n in ("run", "data", "shapes", "initial-loss", "finite-loss",
                                                   "gradients", "zero-grad", "updates", "overfit")}, text(report)
    assert report.exit_code == 0 and report.steps == 2
    checks = by_name(report)
    assert "labels 0..9 (10 distinct of 64)" in checks["data"].evidence
    assert "prediction (64, 10) vs target (64,)" in checks["shapes"].evidence
    assert re.match(r"2\.\d+ vs ln\(10\) = 2\.3", checks["initial-loss"].evidence)
    assert "6/6" in checks["gradients"].evidence and "6/6" in checks["updates"].evidence
    assert checks["overfit"].numbers["last"] <= 0.05 * checks["overfit"].numbers["first"]
    assert report.context["loss"] == "CrossEntropyLoss" and report.context["optimizers"] == ["SGD"]
    # the script printed exactly what a plain run of its first two steps prints
    saved = sys.argv[:]
    plain = io.StringIO()
    try:
        sys.argv = [example("mlp.py"), "--steps", "2"]
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sys, "stdout", plain)
            runpy.run_path(example("mlp.py"), run_name="__main__")
    finally:
        sys.argv = saved
    assert out == plain.getvalue() and out.count("\n") == 2, (out, plain.getvalue())
    # the text: one line per check, and a summary
    lines = text(report).splitlines()
    assert len(lines) == 11 and lines[-1] == "9 passed, 0 failed, 0 skipped"
    assert re.match(r"PASS  overfit +32 sample\(s\), SGD\(lr=0\.1\): loss ", lines[-2])


# -- each check failing ---------------------------------------------------------------------------
def test_raw_pixels_fail_data_and_initial_loss():
    report, _ = run_check(example("raw_pixels.py"), overfit_iters=20)
    checks = by_name(report)
    assert checks["data"].status == "FAIL" and "raw 0-255 pixels" in checks["data"].cause
    assert "normalise" in checks["data"].cause and "in [0, 255]" in checks["data"].evidence
    assert checks["initial-loss"].status == "FAIL"
    assert re.match(r"2\d\.\d+ vs ln\(4\) = 1\.386", checks["initial-loss"].evidence)
    assert "output layer's init or a missing input normalisation" in checks["initial-loss"].cause
    assert status(report)["shapes"] == "PASS" and report.exit_code == 1


def test_data_describes_the_batch_a_training_forward_gets_not_an_action_choice():
    """A DQN's first calls of its Q-network pick actions under no_grad, one state each: the data
    check described that ('inputs (4,) float32'), not the (32, 4) replay batch the loss is of."""
    import os
    from conftest import ROOT
    report, _ = run_check(os.path.join(ROOT, "tests", "scripts", "loss_kinds.py"), "dqn", 100)
    data = by_name(report)["data"]
    assert data.status == "PASS" and data.evidence.startswith("inputs (32, 4) float32"), data.evidence


def test_data_describes_the_batch_a_backward_reached_not_an_action_choice_with_autograd(tmp_path):
    """cleanrl's dqn.py picks its actions with autograd on (q_network(obs), no no_grad; nothing is
    backed through them): the data check described the first such call, 'inputs (1, 4) float32',
    not the (32, 4) replay batch its loss is of.  The call whose output the backward reached is
    the training forward's."""
    script = write(tmp_path, "dqn_grad_picks.py", """
        import random
        import torch, torch.nn as nn, torch.nn.functional as F
        torch.manual_seed(0); random.seed(0)
        q = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
        target = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
        target.load_state_dict(q.state_dict())
        opt = torch.optim.Adam(q.parameters(), lr=1e-3)
        buf, obs = [], torch.randn(4)
        for t in range(60):
            a = int(torch.argmax(q(obs[None]), 1)) if random.random() > 0.5 else random.randrange(2)
            nxt = obs * 0.9 + 0.1 * torch.randn(4)
            buf.append((obs, a, float(-obs.abs().sum()), nxt)); obs = nxt
            if t >= 40 and t % 4 == 0:
                o, acts, r, o2 = zip(*random.sample(buf, 32))
                o, o2, acts, r = torch.stack(o), torch.stack(o2), torch.tensor(acts), torch.tensor(r)
                with torch.no_grad():
                    y = r + 0.99 * target(o2).max(1).values
                loss = F.mse_loss(q(o).gather(1, acts[:, None]).squeeze(1), y)
                opt.zero_grad(); loss.backward(); opt.step()
    """)
    report, _ = run_check(script)
    data = by_name(report)["data"]
    assert data.status == "PASS" and data.evidence.startswith("inputs (32, 4) float32"), data.evidence


def test_a_count_given_with_the_batch_is_no_data_to_scale(tmp_path):
    """The Hugging Face Trainer gives a causal LM the token count of the whole accumulated batch
    by keyword (model(input_ids=x, labels=y, num_items_in_batch=n), a 0-d float tensor) and the
    model divides its summed cross-entropy by it: every healthy Trainer run FAILed data, 'inputs[2]
    look like raw 0-255 pixels (whole numbers up to 128)' (and 'reach 512 (beyond +-100)' at
    longer batches).  One number with no dimension is said, not judged."""
    script = write(tmp_path, "hf_like.py", """
        import torch, torch.nn as nn, torch.nn.functional as F
        torch.manual_seed(0)
        class LM(nn.Module):
            def __init__(s):
                super().__init__(); s.emb = nn.Embedding(64, 32); s.head = nn.Linear(32, 64)
            def forward(s, input_ids, labels=None, num_items_in_batch=None):
                logits = s.head(s.emb(input_ids))
                loss = F.cross_entropy(logits.view(-1, 64), labels.view(-1), reduction="sum") / num_items_in_batch
                return logits, loss
        model = LM(); opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = torch.randint(0, 64, (64, 16))
        for step in range(4):
            micro = [data[(2 * step + i) * 4 % 64:][:4] for i in range(2)]
            n = torch.tensor(float(sum(m.numel() for m in micro)))      # 128 tokens over both
            for ids in micro:
                _, loss = model(input_ids=ids, labels=ids, num_items_in_batch=n)
                loss.backward()
            opt.step(); opt.zero_grad()
            print(f"step {step} loss {loss.item()!r}")
    """)
    report, _ = run_check(script, overfit_iters=20)
    data = by_name(report)["data"]
    assert data.status == "PASS", (data.evidence, data.cause)
    assert "inputs[2] () float32 128, one number: not judged" in data.evidence, data.evidence
    assert data.numbers["inputs"][2] == {"shape": [], "dtype": "float32", "scalar": True}


@pytest.mark.filterwarnings("ignore:Using a target size")      # the script's own warning
def test_silent_broadcasting_fails_shapes(tmp_path):
    report, _ = run_check(regression(tmp_path, "broadcast.py", target_shape=""), overfit_iters=5)
    shapes = by_name(report)["shapes"]
    assert shapes.status == "FAIL", text(report)
    assert shapes.evidence == "F.mse_loss: prediction (64, 1) vs target (64,): broadcast to (64, 64)"
    assert "silent broadcasting" in shapes.cause and report.exit_code == 1
    assert status(report)["initial-loss"] == "SKIP"          # a regression loss: no reference value
    # the same script with the target shaped right passes
    fixed, _ = run_check(regression(tmp_path, "fixed.py"), overfit_iters=5)
    assert by_name(fixed)["shapes"].status == "PASS"


def test_shapes_that_differ_only_by_dimensions_of_size_1_are_no_silent_broadcasting(tmp_path):
    """A prediction (64,) against a target (1, 64) broadcasts to (1, 64): nothing is repeated,
    each prediction meets its own target and the loss is that of equal shapes (checked here);
    the line said FAIL 'compares predictions and targets pairwise'."""
    script = write(tmp_path, "ones.py", """
        import torch, torch.nn as nn
        torch.manual_seed(0)
        x = torch.randn(256, 8); y = x @ torch.randn(8)
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        for step in range(2):
            out = model(x[:64]).squeeze(1)
            loss = nn.functional.huber_loss(out, y[:64].unsqueeze(0))
            assert loss.item() == nn.functional.huber_loss(out, y[:64]).item()
            opt.zero_grad(); loss.backward(); opt.step()
        """)
    report, _ = run_check(script, overfit_iters=5)
    shapes = by_name(report)["shapes"]
    assert shapes.status == "PASS" and status(report)["run"] == "PASS", text(report)
    assert shapes.evidence.startswith("F.huber_loss: prediction (64,) vs target (1, 64): broadcast to (1, 64), "
                                      "which repeats no element")


def test_silent_broadcasting_in_a_hand_written_loss_fails_shapes(tmp_path):
    """((out - y) ** 2).mean() with out (64, 1) and y (64,) compares every prediction with every
    target over (64, 64); the live loss_broadcast rule said so, but the checklist's shapes line was
    SKIP 'no torch.nn.functional loss was called' and nndb check exited 0."""
    bad = write(tmp_path, "hand.py", """
        import torch, torch.nn as nn
        torch.manual_seed(0)
        x = torch.randn(256, 8); y = x @ torch.randn(8)
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        for step in range(2):
            out = model(x[:64]).float()
            loss = ((out - y[:64]) ** 2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
        """)
    report, _ = run_check(bad, overfit_iters=5)
    shapes = by_name(report)["shapes"]
    assert shapes.status == "FAIL" and report.exit_code == 1, text(report)
    assert shapes.evidence == ("`-` at hand.py:9: (64, 1) - (64,), one of them the model's output, broadcast to "
                               "(64, 64), a new dimension out of the batch")
    # the same loss written right, a bias added and a per-sample weight: still SKIP (no loss function)
    good = write(tmp_path, "hand_ok.py", open(bad).read().replace(
        "loss = ((out - y[:64]) ** 2).mean()",
        "loss = (((out + torch.ones(1)).squeeze(1) - y[:64]) ** 2 * torch.ones(64)).mean()"))
    report, _ = run_check(good, overfit_iters=5)
    assert by_name(report)["shapes"].status == "SKIP" and report.exit_code == 0, text(report)
    # (the reason says what is true of a loss torch has but nndb does not recompute, F.ctc_loss:
    # it was "no torch.nn.functional loss was called")
    assert by_name(report)["shapes"].evidence.startswith(
        "no loss nndb recomputes was called (a hand-written loss, or one such as ctc_loss"), text(report)


def test_silent_broadcasting_of_a_siamese_pairs_distance_fails_shapes(tmp_path):
    """A contrastive loss on the distance of a Siamese network's two outputs, label (64, 1)
    against d (64,): shapes was SKIP 'no loss nndb recomputes was called' (d is no model output)
    and nndb check exited 0."""
    bad = write(tmp_path, "siamese.py", """
        import torch, torch.nn as nn, torch.nn.functional as F
        torch.manual_seed(0)
        enc = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        opt = torch.optim.Adam(enc.parameters(), lr=1e-3)
        for step in range(2):
            x1, x2, label = torch.randn(64, 8), torch.randn(64, 8), (torch.rand(64, 1) < 0.5).float()
            d = F.pairwise_distance(enc(x1), enc(x2))
            loss = (label * d ** 2 + (1 - label) * torch.clamp(1.0 - d, min=0) ** 2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
        """)
    report, _ = run_check(bad, overfit_iters=5)
    shapes = by_name(report)["shapes"]
    assert shapes.status == "FAIL" and report.exit_code == 1, text(report)
    assert shapes.evidence == ("`*` at siamese.py:9: (64, 1) * (64,), one of them the model's output or a "
                               "per-sample result of it, broadcast to (64, 64), a new dimension out of the batch")


def test_a_frozen_layer_the_optimizer_holds_is_named_not_hidden(tmp_path):
    """The optimizer holds 4 tensors, the first layer's weight frozen (requires_grad=False): the line
    said '3/3 parameter tensor(s) the optimizer holds got ...', as if it held 3."""
    script = regression(tmp_path, "frozen.py", extra="model[0].weight.requires_grad_(False)")
    report, _ = run_check(script, overfit_iters=5)
    g = by_name(report)["gradients"]
    assert g.status == "PASS" and g.evidence == (
        "3/3 parameter tensor(s) the optimizer holds got a non-zero, finite gradient; 1 more it holds frozen "
        "(requires_grad=False), not judged: 0.weight"), g.evidence
    assert g.numbers["frozen"] == ["0.weight"]


def test_diverging_loss_fails_finite_loss():
    report, _ = run_check(example("nan_lr.py"), steps=8, overfit_iters=5)
    finite = by_name(report)["finite-loss"]
    assert finite.status == "FAIL", text(report)
    assert re.match(r"the loss is (inf|nan) at step [5-7] ", finite.evidence)
    assert "diverged" in finite.cause and "(0.4) is likely too high" in finite.cause
    assert report.steps == 8 and report.exit_code == 1


def test_parameter_given_to_the_optimizer_but_unused_gets_no_gradient(tmp_path):
    script = regression(tmp_path, "unused.py", extra="scale = nn.Parameter(torch.ones(1))",
                        params="list(model.parameters()) + [scale]")
    report, _ = run_check(script, overfit_iters=5)
    grads = by_name(report)["gradients"]
    assert grads.status == "FAIL", text(report)
    assert "4/5" in grads.evidence and "no gradient: scale" in grads.evidence
    assert grads.cause.startswith("scale got no gradient: detached") and "unused" in grads.cause
    assert status(report)["updates"] == "PASS" and report.exit_code == 1


def test_a_bias_the_loss_does_not_depend_on_is_no_failure(tmp_path):
    """A WGAN critic's loss D(fake).mean() - D(real).mean() (+ its gradient penalty) does not
    depend on the last layer's bias: its gradient is exactly 0 while the layer's weight's is
    not.  The check failed ('all-zero gradient: D.2.bias -- likely cause: dead ReLUs')
    on this healthy loop; a dead layer (weight and bias at 0) still fails."""
    script = write(tmp_path, "critic.py", """
        import torch, torch.nn as nn
        torch.manual_seed(0)
        D = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 1))
        opt = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0., 0.9))
        for it in range(3):
            real, fake = torch.randn(32, 2) + 1, torch.randn(32, 2)
            opt.zero_grad()
            eps = torch.rand(32, 1)
            xh = (eps * real + (1 - eps) * fake).requires_grad_(True)
            g, = torch.autograd.grad(D(xh).sum(), xh, create_graph=True)
            loss = D(fake).mean() - D(real).mean() + 10 * ((g.norm(2, dim=1) - 1) ** 2).mean()
            loss.backward()
            opt.step()
        """)
    report, _ = run_check(script, overfit_iters=5)
    grads = by_name(report)["gradients"]
    assert grads.status == "PASS", text(report)
    assert "3/4" in grads.evidence and "the loss does not depend on it: 2.bias" in grads.evidence
    assert grads.numbers["zero_grad"] == [] and grads.numbers["zero_grad_bias_unused"] == ["2.bias"]

def test_zero_learning_rate_leaves_the_parameters_unchanged():
    report, _ = run_check(example("mlp.py"), "--lr", 0, overfit_iters=5)
    updates = by_name(report)["updates"]
    assert updates.status == "FAIL", text(report)
    assert updates.evidence.startswith("6/6 parameter tensor(s) with a gradient did not change")
    assert updates.evidence.endswith("(lr 0)") and updates.cause.startswith("the learning rate is 0")
    assert status(report)["gradients"] == "PASS" and report.exit_code == 1


@pytest.mark.parametrize("lr,step,rewritten", [("1000", 0, 3), ("30", 1, 3), ("0.1", None, 0)])
def test_a_learning_rate_that_rewrites_the_weights_fails_updates(lr, step, rewritten):
    """pytorch/examples' mnist_rnn at Adadelta lr 1000 PASSed updates with every weight changed by
    0.994..1.069 of its norm in one step, where nndb run's update_ratio said at step 0 that the
    update (1.002x the weight it leaves) rewrites the weights.  updates now FAILs at the rule's
    'rewrite' (0.9), on the weights the rule judges (mlp.py at SGD lr 30: 1.020 at step 1; the
    rule 0.9674 at step 0), and not at the healthy lr (0.004..0.1)."""
    report, _ = run_check(example("mlp.py"), "--lr", lr, overfit_iters=5)
    updates = by_name(report)["updates"]
    if not rewritten:
        assert updates.status == "PASS" and "rewritten" not in updates.numbers, updates.evidence
        return
    assert updates.status == "FAIL", updates.evidence
    assert updates.evidence.startswith(f"{rewritten}/6 parameter tensor(s) rewritten by optimizer.step(): "), \
        updates.evidence
    assert f"update at step {step} is " in updates.evidence and updates.evidence.endswith(f"(lr {lr})")
    assert updates.cause.startswith("the learning rate is far too high")
    assert len(updates.numbers["rewritten"]) == rewritten
    assert all(r >= 0.9 for r in updates.numbers["rewritten"].values())

def test_dead_relus_cannot_overfit_one_batch():
    report, _ = run_check(example("dead_relu.py"))
    checks = by_name(report)
    assert checks["overfit"].status == "FAIL", text(report)
    assert checks["overfit"].numbers["iterations"] == OVERFIT_ITERS
    assert checks["overfit"].numbers["best"] > 0.5 * checks["overfit"].numbers["first"]
    assert "cannot fit one small batch" in checks["overfit"].cause and "dead units" in checks["overfit"].cause
    assert checks["gradients"].status == "FAIL" and "all-zero gradient: fc1.weight" in checks["gradients"].evidence
    assert "dead ReLUs" in checks["gradients"].cause
    assert [checks[n].status for n in ("data", "shapes", "initial-loss", "finite-loss")] == ["PASS"] * 4


def test_softmax_before_cross_entropy_is_caught_and_cannot_overfit():
    report, _ = run_check(example("double_softmax.py"), overfit_iters=100)
    checks = by_name(report)
    assert checks["initial-loss"].status == "FAIL" and "drop the softmax" in checks["initial-loss"].cause
    assert checks["overfit"].status == "FAIL" and checks["overfit"].numbers["best"] > 1.0


def test_the_scripts_exception_is_a_fail_line_and_the_rest_is_skipped_or_checked():
    report, _ = run_check(example("raises.py"), "--fail-at", 0)
    ran = by_name(report)["run"]
    assert ran.status == "FAIL" and report.exit_code == 1
    assert ran.evidence == ("after 0 step(s): RuntimeError: planted failure at step 0 at raises.py:15 "
                            "in check_batch")
    assert status(report)["data"] == "PASS"                       # seen before it raised
    assert by_name(report)["gradients"].evidence == "the script stopped before any optimizer step"
    assert status(report)["overfit"] == "SKIP"


def test_hand_written_updates_and_loss_are_skipped_not_failed():
    report, _ = run_check(example("manual_sgd.py"))
    assert status(report) == {"run": "PASS", "data": "PASS", "shapes": "SKIP", "initial-loss": "SKIP",
                              "finite-loss": "PASS", "gradients": "SKIP", "zero-grad": "SKIP", "updates": "SKIP",
                              "overfit": "SKIP"}
    assert report.exit_code == 0
    assert "hand-written" in by_name(report)["gradients"].evidence


def test_a_loop_of_bare_tensors_runs_only_the_checked_steps(tmp_path):
    """No module call or optimizer step to be unwound at: the whole script ran (30 steps of
    the PyTorch tutorial's polynomial_autograd), and 'last' was step 1's loss."""
    script = write(tmp_path, "poly.py", """
        import math, torch
        torch.manual_seed(0)
        x = torch.linspace(-math.pi, math.pi, 2000)
        y = torch.sin(x)
        a, b, c, d = (torch.randn((), requires_grad=True) for _ in range(4))
        for t in range(30):
            y_pred = a + b * x + c * x ** 2 + d * x ** 3
            loss = (y_pred - y).pow(2).sum()
            print(t, repr(loss.item()))
            loss.backward()
            with torch.no_grad():
                for w in (a, b, c, d):
                    w -= 1e-6 * w.grad
                    w.grad = None
        print("Result", a.item())
        """)
    report, out = run_check(script, steps=2)
    printed = [line.split() for line in out.splitlines()]
    assert [p[0] for p in printed] == ["0", "1"], out              # (not "Result": unwound at step 2's forward)
    fl = by_name(report)["finite-loss"]
    assert fl.status == "PASS" and "in 2 step(s)" in fl.evidence, fl.evidence
    assert f"last {fmt(float(printed[1][1]))}" in fl.evidence and by_name(report)["run"].evidence == "2 step(s) ran"


def test_the_initial_loss_line_quotes_the_loss_the_script_saw(tmp_path):
    """reduction='sum' divided by the target's size was quoted as 'the first loss' (107.9
    where the script printed 215799.875)."""
    script = write(tmp_path, "sum.py", """
        import torch
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=1e-6)
        x, y = torch.randn(200, 3), torch.randn(200, 1)
        for t in range(4):
            loss = torch.nn.functional.mse_loss(model(x), y, reduction="sum")
            print(repr(loss.item()))
            opt.zero_grad(); loss.backward(); opt.step()
        """)
    report, out = run_check(script, steps=2)
    first = float(out.split()[0])
    ev = by_name(report)["initial-loss"].evidence
    assert f"the first loss was {fmt(first)}, {fmt(first / 200)} a target element (reduction='sum' over 200)" in ev, ev


@pytest.mark.parametrize("targets,loss,n", [
    # a causal LM's labels padded with ignore_index at the last position, as Hugging Face's loss shifts them
    ("y = torch.cat([x[:, 1:], torch.full((8, 1), -100)], 1)",
     "F.cross_entropy(out.view(-1, 64), y.view(-1), ignore_index=-100, reduction='sum')", 8 * 15),
    # class probabilities: one loss element per row, not one per class
    ("y = torch.softmax(torch.randn(8 * 16, 64), 1)", "F.cross_entropy(out.view(-1, 64), y, reduction='sum')",
     8 * 16),
])
def test_a_summed_classification_loss_is_quoted_per_loss_element(tmp_path, targets, loss, n):
    """A summed cross-entropy was divided by the target's size: the Hugging Face causal LM's (its
    labels shifted, the last position ignore_index) '3.9 a target element' at init, where each of
    the 60 it sums is 4.16 = ln(64) (64 counted); with probability targets, by rows x classes.
    The loss elements it added: the targets but ignore_index's, one per row of probabilities."""
    script = write(tmp_path, "lm_sum.py", f"""
        import torch, torch.nn as nn, torch.nn.functional as F
        torch.manual_seed(0)
        model = nn.Sequential(nn.Embedding(64, 32), nn.Linear(32, 64))
        nn.init.zeros_(model[1].weight); nn.init.zeros_(model[1].bias)     # uniform: ln(64) a target
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.randint(0, 64, (8, 16))
        {targets}
        for t in range(3):
            out = model(x)
            loss = {loss}
            print(repr(loss.item()))
            opt.zero_grad(); loss.backward(); opt.step()
        """)
    report, out = run_check(script, steps=2, overfit_iters=5)
    first = float(out.split()[0])
    c = by_name(report)["initial-loss"]
    assert c.numbers["loss"] == pytest.approx(first / n, rel=1e-12) == pytest.approx(math.log(64), rel=1e-6), c.evidence
    assert c.evidence.startswith(f"{fmt(first / n)} vs ln(64) = 4.159 (a uniform prediction) (the first loss was "
                                 f"{fmt(first)}, {fmt(first / n)} a target element (reduction='sum' over {n}))"), c.evidence


def test_a_loss_still_falling_when_overfit_runs_out_is_inconclusive_not_failed(tmp_path, monkeypatch):
    """A healthy MLP under plain SGD at lr 0.05 overfits slowly: 1.496 -> 0.1446 in 300
    iterations (goal 0.0748), 41% of it in the last 75.  It FAILed 'cannot fit one small batch'.
    At 10x the lr it fits (PASS, both runs said); where that diverges too, inconclusive."""
    script = write(tmp_path, "slow.py", """
        import torch
        from torch import nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        crit = nn.CrossEntropyLoss()
        for step in range(4):
            x = torch.randn(32, 16); y = torch.randint(0, 4, (32,))
            loss = crit(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
        """)
    report, _ = run_check(script, steps=2, overfit_iters=300)
    c = by_name(report)["overfit"]
    assert c.status == "PASS" and c.evidence.startswith("32 sample(s), SGD(lr=0.05): loss 1.496 -> 0.1446 after 300 "
                                                        "iteration(s); at 10x the lr (0.5) 1.496 -> "), c.evidence
    assert c.numbers["faster_last"] <= c.numbers["goal"] < c.numbers["last"] and c.numbers["faster_iterations"] < 300
    from nndb.check import overfit
    monkeypatch.setattr(overfit, "FASTER", 1000)          # (a retry that diverges: what the script's lr gave)
    report, _ = run_check(script, steps=2, overfit_iters=300)
    c = by_name(report)["overfit"]
    assert c.status == "SKIP" and "still falling" in c.evidence and "--overfit-iters N" in c.evidence, c.evidence
    assert "; at 1000x the lr (50) 1.496 -> " in c.evidence, c.evidence
    assert c.numbers["last"] <= 0.2 * c.numbers["first"] and report.exit_code == 0
    monkeypatch.undo()
    report, _ = run_check(script, steps=2, overfit_iters=1500)
    assert by_name(report)["overfit"].status == "PASS"       # (more iterations: it does fit)


@pytest.mark.parametrize("loss,floor", [
    ("F.binary_cross_entropy_with_logits(out, x)",                 # an autoencoder of gray pixels
     "F.binary_cross_entropy(x[:32], x[:32])"),
    ("F.cross_entropy(out, F.softmax(5 * x, 1))",                  # probability targets (distillation)
     "(-(F.softmax(5 * x[:32], 1) * F.log_softmax(5 * x[:32], 1)).sum(1)).mean()"),
    ("F.cross_entropy(out, (8 * x[:, 0]).long(), label_smoothing=0.2)",
     "-(0.8 + 0.2 / 16) * math.log(0.8 + 0.2 / 16) - 15 * (0.2 / 16) * math.log(0.2 / 16)"),
])
def test_overfit_aims_at_the_least_the_loss_can_be_not_at_zero(tmp_path, loss, floor):
    """Binary cross-entropy on targets between 0 and 1, cross-entropy on probability targets or
    with label smoothing cannot go below the targets' entropy: the goal, 5% of the first loss,
    was below it (an autoencoder of gray pixels: 0.6964 -> 0.4251 with Adam, goal 0.0348, its
    least 0.4139), and every such healthy model FAILed 'cannot fit one small batch'."""
    script = write(tmp_path, "soft.py", f"""
        import torch, torch.nn as nn, torch.nn.functional as F
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 16))
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        data = torch.rand(256, 16) ** 2
        for step in range(2):
            x = data[32 * step:32 * (step + 1)]
            out = model(x)
            loss = {loss}
            opt.zero_grad(); loss.backward(); opt.step()
        """)
    report, _ = run_check(script, steps=2, overfit_iters=300)
    c = by_name(report)["overfit"]
    import math
    import torch
    import torch.nn.functional as F
    torch.manual_seed(0)
    torch.nn.Sequential(torch.nn.Linear(16, 128), torch.nn.ReLU(), torch.nn.Linear(128, 16))
    x = torch.rand(256, 16) ** 2
    truth = float(eval(floor, {"F": F, "math": math, "x": x}))
    assert c.numbers["floor"] == pytest.approx(truth, rel=1e-5)
    assert c.status == "PASS" and "the targets' entropy, the least the loss can be" in c.evidence, c.evidence
    assert c.numbers["floor"] < c.numbers["last"] <= c.numbers["goal"]


def test_a_head_over_a_backbone_is_overfit_together_from_the_data(tmp_path):
    """head(backbone(x)), two modules and one optimizer: the check took the head for the model,
    described the backbone's features as the data, and trained the head alone on them (1.089 ->
    0.49 after 300 iterations), FAILing 'the model cannot fit one small batch' on a healthy
    script.  Two models' outputs combined are not rebuilt: SKIP, with the reason."""
    body = """
        import torch, torch.nn as nn
        torch.manual_seed(0)
        backbone = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        head = nn.Linear(32, 3)
        other = nn.Linear(10, 32)
        opt = torch.optim.Adam(list(backbone.parameters()) + list(head.parameters()) + list(other.parameters()),
                               lr=3e-3)
        X = torch.randn(128, 10) * 3; Y = (X[:, 0] > 0).long() + (X[:, 1] > 0).long()
        for step in range(4):
            i = torch.arange(step * 16 % 128, step * 16 % 128 + 16)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(head(FEATURES), Y[i])
            loss.backward()
            opt.step()
            print(f"step {step} loss {loss.item()!r}")
        """
    report, _ = run_check(write(tmp_path, "chain.py", body.replace("FEATURES", "backbone(X[i])")))
    checks = by_name(report)
    assert report.context["model"] == "backbone (Sequential) -> head (Linear)", report.context
    assert checks["data"].status == "PASS" and checks["data"].evidence.startswith("inputs (16, 10) float32")
    over = checks["overfit"]
    assert over.status == "PASS" and over.numbers["last"] <= 0.05 * over.numbers["first"], over.evidence
    report, _ = run_check(write(tmp_path, "sum.py", body.replace("FEATURES", "backbone(X[i]) + other(X[i])")))
    over = by_name(report)["overfit"]
    assert over.status == "SKIP" and "cannot rebuild the forward pass on a copy" in over.evidence, over.evidence


def test_a_model_evaluated_before_training_is_overfit_in_its_training_mode(tmp_path):
    """A CNN with BatchNorm that the script evaluates first (model.eval() and a validation pass
    under no_grad, then model.train(): Lightning's sanity check has this shape): the copy taken
    at that first forward stayed in eval mode, and overfit trained it so, from 2.403 where the
    step's loss was 2.493 (SKIP 'still falling'; FAIL 'cannot fit' on Lightning's CNN).  The
    copy takes the modes of the model's first forward with autograd on."""
    script = write(tmp_path, "eval_first.py", """
        import torch, torch.nn as nn
        torch.manual_seed(3)
        X = torch.randn(320, 1, 12, 12); Y = torch.randint(0, 10, (320,))
        X += Y.view(-1, 1, 1, 1) * 0.3
        model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

        def evaluate():
            model.eval()
            with torch.no_grad():
                loss = nn.functional.cross_entropy(model(X[256:]), Y[256:])
            model.train()
            return loss.item()

        print("val loss before training", evaluate())
        for step in range(4):
            i = torch.arange(step * 32, step * 32 + 32)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(X[i]), Y[i])
            loss.backward()
            opt.step()
            print(f"step {step} loss {loss.item()!r}")
        """)
    report, out = run_check(script)
    first = float(re.search(r"step 0 loss (\S+)", out).group(1))
    over = by_name(report)["overfit"]
    assert over.numbers["first"] == pytest.approx(first, rel=1e-6), (first, over.evidence)
    assert over.status == "PASS", over.evidence


def test_a_bias_before_batch_norm_is_not_a_parameter_that_fails_to_update(tmp_path):
    """Linear -> BatchNorm1d under SGD: the Linear's bias gets a gradient of RMS ~3e-9 (batch
    norm removes its effect), which the update rounds away; 'updates' FAILed '0.bias did not
    change' on a healthy script.  Below param_not_updated's min_grad_rms it counts as zero."""
    script = write(tmp_path, "bn.py", """
        import torch, torch.nn as nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(10, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 3))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        X = torch.randn(256, 10); Y = (X[:, 0] > 0).long() + (X[:, 1] > 0).long()
        for step in range(4):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(X[step * 32:(step + 1) * 32]), Y[step * 32:(step + 1) * 32])
            loss.backward()
            opt.step()
        """)
    report, _ = run_check(script, overfit_iters=20)
    up = by_name(report)["updates"]
    assert up.status == "PASS" and up.numbers["tiny_grad"] == ["0.bias"], up.evidence
    assert "5/5 parameter tensor(s) changed" in up.evidence and "not judged: 0.bias" in up.evidence
    assert "a bias the loss barely depends on by construction, as one before a BatchNorm" in up.evidence


def test_a_one_cycle_schedule_is_overfit_at_its_peak_not_its_warm_start(tmp_path):
    """OneCycleLR's initial_lr is its warm start (max_lr / 25): the replica trained at lr 4e-4
    where the script trains at up to 1e-2 (sq(model(x)) with weight_norm, spectral_norm and
    orthogonal layers: FAIL 1.117 -> 0.3164, 'the model cannot fit one small batch'; this MLP:
    SKIP, still falling after 300 iterations)."""
    script = write(tmp_path, "onecycle.py", """
        import torch, torch.nn as nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=40)
        X = torch.randn(128, 10); Y = (X[:, 0] > 0).long() + (X[:, 1] > 0).long()
        for step in range(4):
            i = torch.arange(step * 16, step * 16 + 16)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(X[i]), Y[i])
            loss.backward()
            opt.step(); sched.step()
        """)
    report, _ = run_check(script)
    over = by_name(report)["overfit"]
    assert over.status == "PASS" and "Adam(lr=0.01, its schedule's max_lr)" in over.evidence, over.evidence


@pytest.mark.parametrize("loss, target, floor, why", [
    # torchvision's classification recipe: CrossEntropyLoss(label_smoothing=0.1); 4 classes:
    # -(0.925 ln 0.925 + 3 x 0.025 ln 0.025)
    ("nn.CrossEntropyLoss(label_smoothing=0.1)", "y", 0.34878, "label smoothing 0.1"),
    # mixup at lambda 0.6 with the batch rolled by one: (0.6, 0.4) rows, one-hot where y repeats
    ("nn.CrossEntropyLoss()", "0.6 * t + 0.4 * t.roll(1, 0)", None, "soft targets"),
    ("nn.BCEWithLogitsLoss()", "0.9 * t + 0.05", None, "soft targets"),
])
def test_overfit_comes_down_to_the_least_the_loss_can_be_not_to_0(tmp_path, loss, target, floor, why):
    """A loss over smoothed or soft targets can come down only to their entropy: a model that
    fitted its batch exactly FAILed 'cannot fit one small batch' (label smoothing 0.1 over 4
    classes: 1.424 -> 0.3496, the floor 0.3488, against a goal of 0.0712, 5% of the first loss)."""
    script = write(tmp_path, "smooth.py", f"""
        import torch, torch.nn as nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
        crit = {loss}
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        X = torch.randn(64, 8); Y = torch.randint(0, 4, (64,))
        for step in range(2):
            x, y = X[step * 32:(step + 1) * 32], Y[step * 32:(step + 1) * 32]
            t = nn.functional.one_hot(y, 4).float()
            opt.zero_grad()
            loss = crit(model(x), {target})
            loss.backward()
            opt.step()
        """)
    report, _ = run_check(script)
    over = by_name(report)["overfit"]
    assert over.status == "PASS", over.evidence
    low = over.numbers["floor"]
    if floor is None:           # the targets' entropy, as free outputs trained to their least loss give it
        ns = runpy.run_path(script)
        t = eval(target, {}, {"t": ns["nn"].functional.one_hot(ns["Y"][:32], 4).double(), "y": ns["Y"][:32]})
        z = ns["torch"].zeros(32, 4, dtype=ns["torch"].float64, requires_grad=True)
        lbfgs = ns["torch"].optim.LBFGS([z], max_iter=500, tolerance_grad=1e-12, tolerance_change=1e-15)

        def closure():
            lbfgs.zero_grad()
            v = ns["crit"](z, t)
            v.backward()
            return v
        for _ in range(5):
            lbfgs.step(closure)
        floor = float(closure().detach())
    assert low == pytest.approx(floor, rel=1e-5), (low, floor)
    assert over.numbers["goal"] == pytest.approx(low + 0.05 * (over.numbers["first"] - low))
    assert over.numbers["last"] <= over.numbers["goal"] and over.numbers["last"] > low - 1e-6
    assert f"goal < {fmt(over.numbers['goal'])}: {fmt(low)}, the targets' entropy, the least the loss can be" \
        in over.evidence, (why, over.evidence)


@pytest.mark.filterwarnings("ignore:.*weight_norm is deprecated")     # the script's own warning
def test_a_model_pruned_before_training_is_overfit_through_its_masks(tmp_path):
    """torch.nn.utils.prune's module.weight is weight_orig x mask, a tensor computed with
    autograd, which deepcopy refuses: the overfit was SKIP 'Sequential cannot be deep-copied:
    RuntimeError: Only Tensors created explicitly by the user (graph leaves) support the deepcopy
    protocol' for every pruned model (the old weight_norm's too).  It is copied detached (the
    pruning hook computes it again from the copied weight_orig and mask at each call)."""
    script = write(tmp_path, "pruned.py", """
        import torch, torch.nn as nn, torch.nn.utils.prune as prune
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))
        for m in (model[0], model[4]):
            prune.l1_unstructured(m, "weight", amount=0.8)
        model[2] = torch.nn.utils.weight_norm(model[2])      # (the old one: its weight is computed too)
        X = torch.randn(256, 20); Y = X[:, :5].argmax(1)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        for step in range(4):
            i = torch.arange(step * 32, step * 32 + 32)
            opt.zero_grad()
            loss = nn.CrossEntropyLoss()(model(X[i]), Y[i])
            loss.backward()
            opt.step()
        """)
    report, _ = run_check(script)
    over = by_name(report)["overfit"]
    assert over.status == "PASS", over.evidence


# -- the command line -----------------------------------------------------------------------------
def test_cli_text_and_exit_code_for_a_healthy_script():
    r = nndb("check", example("mlp.py"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:2] == ["step 0 loss " + lines[0].split()[-1], "step 1 loss " + lines[1].split()[-1]]
    assert [l.split()[0] for l in lines[3:12]] == ["PASS"] * 9 and lines[-1] == "9 passed, 0 failed, 0 skipped"
    assert "Traceback" not in r.stderr


def test_cli_json_and_usage_errors(tmp_path):
    r = nndb("check", "--json", "--overfit-iters", "5", example("raw_pixels.py"), "--steps", "3")
    assert r.returncode == 1, r.stderr
    data = json.loads(r.stdout)                                   # the script's prints went to stderr
    assert data["exit_code"] == 1 and data["steps"] == 2 and "step 0 loss" in r.stderr
    fails = {c["name"]: c for c in data["checks"] if c["status"] == "FAIL"}
    assert {"data", "initial-loss"} <= set(fails) and fails["initial-loss"]["numbers"]["expected"] == pytest.approx(1.386, abs=1e-3)
    r = nndb("check", str(tmp_path / "missing.py"))
    assert r.returncode == 2 and r.stderr.startswith("nndb: error: no such file") and "Traceback" not in r.stderr
    r = nndb("check", "--steps", "0", example("mlp.py"))
    assert r.returncode == 2 and "Traceback" not in r.stderr


EXITS = """
import os, torch
m = torch.nn.Linear(2, 1)
o = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(5):
    o.zero_grad(); torch.nn.functional.mse_loss(m(torch.ones(4, 2)), torch.zeros(4, 1)).backward(); o.step()
    if i == 0:
        os._exit(5)
"""


def test_a_script_that_ends_its_process_is_not_said_to_have_no_optimizer(tmp_path):
    """The header said 'no model seen, no optimizer stepped, no loss function seen' of a script whose
    SGD had stepped once (and whose model and MSE loss had run) before os._exit(5): what the child process
    knew died with it, and the header must say that, not that there was none."""
    r = nndb("check", write(tmp_path, "exits.py", EXITS))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    head, run = r.stdout.splitlines()[:2]
    assert "no optimizer stepped" not in head and "no model seen" not in head
    assert head.endswith("1 step(s); model, optimizer and loss not known: the script ended its process "
                         "before nndb could report them")
    assert run.startswith("FAIL  run") and "status 5" in run


def test_cli_defaults_are_the_modules():
    from nndb.cli import cli
    opts = {p.name: p.default for p in cli.commands["check"].params}
    assert opts["steps"] == CHECK_STEPS and opts["overfit_iters"] == OVERFIT_ITERS


# -- gradcheck ------------------------------------------------------------------------------------
BAD_GRAD = """
    import torch, torch.nn as nn

    class BadSquare(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * x              # wrong: d(x*x)/dx = 2x

    class Square(nn.Module):
        def forward(self, x):
            return BadSquare.apply(x)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)
            self.sq = Square()
            self.drop = nn.Dropout(0.5)

        def forward(self, x):
            return self.drop(self.sq(self.fc(x)))

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 4)
    for step in range(3):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
"""


@pytest.fixture(scope="module")
def gradcheck_session(tmp_path_factory) -> Transcript:
    """gradcheck before any stop, then at forward stops in fc, sq (a wrong
    backward) and drop, then at a step end."""
    import gc
    from nndb.run.config import RunConfig
    from nndb.driver import DebugOptions, debug
    from nndb.frontends.batch import ScriptedFrontend
    gc.collect()
    tmp_path = tmp_path_factory.mktemp("gradcheck")
    script = write(tmp_path, "bad_grad.py", BAD_GRAD)
    fe = ScriptedFrontend([
        "gradcheck fc", "gradcheck nope", "gradcheck fc 1 +",
        "break module fc", "break module sq", "break module drop", "c",
        "p $module.weight.sum().item()", "gradcheck", "p $module.weight.sum().item()", "p $module.weight.grad",
        "c", "gradcheck sq", "gradcheck fc x[:2]", "gradcheck sq 'text'",
        "c", "gradcheck drop",
        "delete", "next", "info modules", "gradcheck fc x", "info modules", "quit",
    ])
    res = debug(RunConfig(Target(path=script), str(tmp_path / "t.h5"), quiet=True),
                DebugOptions(no_rc=True, rules="none"), fe)
    return Transcript(fe.text, res)


def _printed(t: Transcript, cmd: str, nth: int = 1) -> str:
    return t.after(cmd, nth).strip()


GRADCHECK_PASSED = re.compile(
    r"gradcheck (\w+) \((\w+), float64 copy\): PASS: max abs error ([\d.e+-]+), max rel error "
    r"([\d.e+-]+) over (\d+) of (\d+) input/parameter element\(s\); torch.autograd.gradcheck passed")


def test_gradcheck_session_ends_cleanly(gradcheck_session):
    t = gradcheck_session
    assert "Traceback" not in t and "internal error" not in t
    assert t.result.exit_code == 0


def test_gradcheck_before_the_modules_forward_says_where_to_stop(gradcheck_session):
    assert _printed(gradcheck_session, "gradcheck fc").startswith(
        "no input for fc: stop in its forward first ('break module fc'")


def test_gradcheck_of_an_unknown_module_says_so(gradcheck_session):
    assert _printed(gradcheck_session, "gradcheck nope") == "no module named 'nope' ('info modules' lists them)"


def test_gradcheck_of_a_bad_expression_is_a_syntax_error(gradcheck_session):
    assert _printed(gradcheck_session, "gradcheck fc 1 +").startswith("syntax error")


def test_gradcheck_at_a_forward_stop_checks_the_module_on_its_inputs(gradcheck_session):
    m = GRADCHECK_PASSED.match(_printed(gradcheck_session, "gradcheck"))       # stopped in fc's forward
    assert m and m.group(1, 2) == ("fc", "Linear") and float(m.group(3)) < 1e-6 and m.group(5) == m.group(6) == "47"


def test_gradcheck_leaves_the_live_module_untouched(gradcheck_session):
    t = gradcheck_session
    assert _printed(t, "p $module.weight.sum().item()") == _printed(t, "p $module.weight.sum().item()", 2)
    assert _printed(t, "p $module.weight.grad") == "None"


def test_gradcheck_fails_a_wrong_backward(gradcheck_session):
    bad = _printed(gradcheck_session, "gradcheck sq")
    assert bad.startswith("gradcheck sq (Square, float64 copy): FAIL: max abs error "), bad
    assert "max rel error 0.5 " in bad and "torch.autograd.gradcheck failed" in bad


def test_gradcheck_of_given_inputs_checks_those(gradcheck_session):
    assert GRADCHECK_PASSED.match(_printed(gradcheck_session, "gradcheck fc x[:2]")).group(6) == "23"


def test_gradcheck_of_a_non_tensor_input_has_nothing_to_differentiate(gradcheck_session):
    assert _printed(gradcheck_session, "gradcheck sq 'text'").startswith("nothing to differentiate")


def test_gradcheck_passes_dropout_with_one_mask_for_every_evaluation(gradcheck_session):
    assert GRADCHECK_PASSED.match(_printed(gradcheck_session, "gradcheck drop"))


def test_gradcheck_at_a_step_end_checks_given_inputs_outside_the_run(gradcheck_session):
    # no module running: the copy's forward calls are not counted as the run's
    t = gradcheck_session
    assert _printed(t, "info modules") == _printed(t, "info modules", 2)
    assert GRADCHECK_PASSED.match(_printed(t, "gradcheck fc x"))


def test_gradcheck_module_passes_a_linear_layer_and_leaves_it_untouched():
    import torch
    from nndb.check.gradcheck import gradcheck_module
    torch.manual_seed(0)
    fc = torch.nn.Linear(4, 3)
    before = fc.weight.detach().clone()
    res = gradcheck_module(fc, (torch.randn(2, 4),))
    assert res["ok"] and res["gradcheck"] and not res["fast_mode"]
    assert res["elements"] == res["sampled"] == 2 * 4 + 3 * 4 + 3
    assert res["max_abs"] < 1e-6
    assert torch.equal(fc.weight, before) and fc.weight.grad is None and fc.weight.dtype == torch.float32


def test_gradcheck_module_fails_a_wrong_backward():
    import torch
    from nndb.check.gradcheck import gradcheck_module

    class Half(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * x

        @staticmethod
        def backward(ctx, g):
            return g                  # wrong: d(x*x)/dx = 2x

    class Sq(torch.nn.Module):
        def forward(self, x):
            return Half.apply(x)

    res = gradcheck_module(Sq(), (torch.ones(3),))
    assert not res["ok"] and not res["gradcheck"] and res["max_rel"] == pytest.approx(0.5)


def test_gradcheck_module_needs_something_to_differentiate():
    import torch
    from nndb.check.gradcheck import gradcheck_module
    from nndb.errors import CommandError
    with pytest.raises(CommandError, match="nothing to differentiate"):
        gradcheck_module(torch.nn.ReLU(), (torch.arange(3),))


def test_tracer_quiet_restores_the_tracers_guard_and_depth():
    from types import SimpleNamespace
    from nndb.check.gradcheck import tracer_quiet
    tracer = SimpleNamespace(in_hook=False, module_depth=2)
    with tracer_quiet(tracer):
        assert tracer.in_hook
        tracer.module_depth = -5
    assert (tracer.in_hook, tracer.module_depth) == (False, 2)


def test_sparse_inputs_are_checked_as_the_dense_tensors_they_stand_for(tmp_path):
    """gcn's sparse features and adjacency: the data check said 'could not run this check' with
    a 150-line kernel table of torch's ('ne.Scalar' on SparseCPU), the overfit check likewise
    (a batch cut with t[:16]); now the data are described (and the raw counts found), and the
    graph's nodes, which are no batch to cut, are overfit whole."""
    from test_real_loops import SPARSE_INPUT          # (gcn's shape: sparse features and adjacency)
    report, _ = run_check(write(tmp_path, "gcn.py", SPARSE_INPUT), "sparse", overfit_iters=5)
    checks = by_name(report)
    data = checks["data"]
    assert data.status == "FAIL" and "(sparse_coo) in [0, 255]" in data.evidence and "255" in data.cause, data
    assert checks["overfit"].status in ("PASS", "FAIL") and "200 sample(s)" in checks["overfit"].evidence
    assert all("\n" not in c.evidence for c in report.checks)


CAUSAL_MASK = """
    import torch, torch.nn as nn
    torch.manual_seed(0)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0)
            self.enc = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
            self.head = nn.Linear(16, 5)
        def forward(self, x, mask):
            return self.head(self.enc(x, mask=mask))

    model = Model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(6, 4, 16)
    y = torch.randint(0, 5, (6, 4))
    {plant}
    mask = nn.Transformer.generate_square_subsequent_mask(6)
    for step in range(4):
        opt.zero_grad()
        out = model(x, mask)
        loss = nn.functional.cross_entropy(out.reshape(-1, 5), y.reshape(-1))
        loss.backward()
        opt.step()
"""


def test_a_causal_attention_mask_is_not_corrupt_data_but_nan_or_inf_in_the_data_is(tmp_path):
    """pytorch/examples language_translation: generate_square_subsequent_mask (0 on and below the
    diagonal, -inf above) given to the model FAILed data ('inputs[1] hold 15 NaN/Inf value(s)',
    described as 'in [0, 0], mean 0, std 0'); an additive mask is now noted and not judged, and
    a NaN or -inf in the real input still FAILs, the non-finite values counted by kind."""
    # (the default iterations: its loss on out.reshape(-1, 5), a view, is overfit, 1.773 -> 0.0882 in 152)
    r = nndb("check", write(tmp_path, "causal.py", CAUSAL_MASK.replace("{plant}", "")))
    data = next(l for l in r.stdout.splitlines() if l.startswith(("PASS  data", "FAIL  data")))
    assert data.startswith("PASS  data") and r.returncode == 0, r.stdout
    assert "inputs[1] (6, 6) float32 is an additive attention mask (21 x 0, 15 x -inf): not judged" in data
    for value, kind in (("float('nan')", "NaN"), ("float('-inf')", "-inf")):
        script = write(tmp_path, f"planted_{kind}.py", CAUSAL_MASK.replace("{plant}", f"x[2, 1, 3] = {value}"))
        report, _ = run_check(script, overfit_iters=5)
        data = by_name(report)["data"]
        assert data.status == "FAIL" and report.exit_code == 1, data
        assert data.evidence.startswith(f"inputs[0] hold 1 NaN/Inf value(s) (1 {kind}) [inputs[0] (6, 4, 16) "
                                        f"float32 1 {kind} and 383 finite in ["), data.evidence
        assert "inputs[1] (6, 6) float32 is an additive attention mask" in data.evidence
        assert data.numbers["inputs"][0]["nonfinite"] == 1 and data.numbers["inputs"][1]["additive_mask"]


def test_only_a_later_input_of_one_finite_value_and_minus_inf_reads_as_a_mask():
    import torch
    from nndb.check.checks import _describe_input
    inf = float("inf")
    mask = torch.tensor([[0.0, -inf], [0.0, 0.0]])
    assert _describe_input(mask, mask_ok=True)[1] == ""
    assert _describe_input(mask, mask_ok=False)[1] == "hold 1 NaN/Inf value(s) (1 -inf)"    # the first input: data
    for bad in (torch.tensor([[0.0, -inf], [0.5, 0.0]]),           # finite values differ: data with a -inf
                torch.tensor([[0.0, -inf], [float("nan"), 0.0]]), torch.tensor([[0.0, -inf], [inf, 0.0]]),
                torch.tensor([[-inf, -inf]])):
        assert _describe_input(bad, mask_ok=True)[1], bad


def test_a_check_that_raises_is_skipped_on_one_line():
    from nndb.check import _safely

    def kernel_table():
        raise NotImplementedError("Could not run 'aten::ne.Scalar' with arguments from the 'SparseCPU' backend."
                                  + "\n\nCPU: registered at RegisterCPU.cpp:5541 [kernel]" * 40)
    c = _safely("data", kernel_table)
    assert c.status == "SKIP" and "\n" not in c.evidence and len(c.evidence) < 300
    assert c.evidence.startswith("nndb could not run this check: NotImplementedError: Could not run 'aten::ne")


LBFGS_FORGETS = """
    import torch, torch.nn as nn
    torch.manual_seed(0)
    x = torch.randn(64, 4); y = torch.sin(x.sum(1, keepdim=True))
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.LBFGS(model.parameters())                 # lr 1, max_iter 20
    for step in range(4):
        def closure():
            loss = ((model(x) - y) ** 2).mean()                 # no opt.zero_grad()
            loss.backward()
            return loss
        opt.step(closure)
"""


def test_zero_grad_fails_a_closure_that_forgets_it_from_the_first_step(tmp_path):
    """(It said SKIP, 'the gradients' reset is seen from an optimizer's second step on, with a
    non-zero gradient: none was': the run's gradients were 0 or NaN by step 1.)"""
    report, _ = run_check(write(tmp_path, "lbfgs.py", LBFGS_FORGETS))
    c = by_name(report)["zero-grad"]
    assert c.status == "FAIL" and "at step 0, 0.bias.grad held the gradient of the calls of opt's closure before " \
        "each of its 20 calls" in c.evidence, text(report)
    report, _ = run_check(write(tmp_path, "ok.py", LBFGS_FORGETS.replace("            loss = ((model(x)",
                                                                          "            opt.zero_grad()\n"
                                                                          "            loss = ((model(x)")))
    assert by_name(report)["zero-grad"].status == "PASS", text(report)


def test_zero_grad_fails_lora_adapters_that_forget_it(tmp_path):
    """LoRA's A has a gradient of exactly 0 at step 0 (B starts at 0), and the probe watched the
    smallest tensor, A: step 1 told nothing, and zero-grad said SKIP ('with a non-zero
    gradient: none was') with every other check PASS, though zero_grad() was missing.  The
    probe watches a tensor whose gradient is not all 0 now (B)."""
    script = os.path.join(ROOT, "tests", "scripts", "lora_adapters.py")
    report, _ = run_check(script, "--no-zero-grad")
    c = by_name(report)["zero-grad"]
    assert c.status == "FAIL" and c.evidence.startswith("at step 1, 0.B.grad held the last step's gradient plus "
                                                        "the new one"), text(report)
    report, _ = run_check(script)
    assert by_name(report)["zero-grad"].status == "PASS", text(report)


def test_overfit_names_every_param_groups_lr_and_the_tensors_it_leaves_at_lr_0(tmp_path):
    """Two layers frozen at lr 0 in their param groups, the head at 0.05: the overfit line read
    'SGD(lr=0): loss 1.633 -> 0.3607', group 0's lr alone (the replica trained the head at
    0.05), and its hints did not say that the frozen layers stayed as they were."""
    script = os.path.join(ROOT, "tests", "scripts", "param_groups_lr_zero.py")
    report, _ = run_check(script)
    c = by_name(report)["overfit"]
    assert c.status == "FAIL" and c.evidence.startswith("32 sample(s), SGD(lr=0, 0.05): loss 1.633 -> "), text(report)
    assert "parameters in a param group at lr 0 stay as they are: 0.weight, 0.bias, 2.weight, 2.bias (see " \
           "updates)" in c.cause, text(report)


LM_SCRIPT = """
    import sys, torch, torch.nn as nn, torch.nn.functional as F
    torch.manual_seed(0)
    V, T = 9, 7
    # names of 2..6 letters, many starting alike: a next-token loss cannot reach 0 on them
    lengths = torch.randint(2, 7, (96,))
    X = torch.zeros(96, T, dtype=torch.long); Y = torch.full((96, T), -1)
    for i, n in enumerate(lengths.tolist()):
        word = torch.randint(1, V, (n,)); word[0] = 1 + i % 3
        X[i, 1:n + 1] = word; Y[i, :n] = word; Y[i, n] = 0
    class LM(nn.Module):
        def __init__(self):
            super().__init__(); self.emb = nn.Embedding(V, 16); self.rnn = nn.GRU(16, 48, batch_first=True)
            self.head = nn.Linear(48, V)
        def forward(self, input_ids, attention_mask=None, labels=None):
            h = self.rnn(self.emb(input_ids))[0]
            if attention_mask is not None:
                h = h * attention_mask.unsqueeze(-1)
            logits = self.head(h * 0 if BROKEN else h)
            loss = None
            if labels is not None:
                loss = F.cross_entropy(logits.view(-1, V), labels.view(-1), ignore_index=-1, label_smoothing=SMOOTH)
            return logits, loss
    model = LM()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(2):
        x, y = X[48 * step:48 * (step + 1)], Y[48 * step:48 * (step + 1)]
        LOSS
        opt.zero_grad(); loss.backward(); opt.step()
        print(f"step {step} loss {loss.item()!r}")
    """


def _next_token_floor(smooth: float, n: int) -> float:
    """The least mean cross-entropy on the check's batch (the first n names of step 0): at
    each prefix, the mix of the next tokens that follow it in the batch, by torch's own loss."""
    import torch
    import torch.nn.functional as F
    ns = {}
    exec(textwrap.dedent(LM_SCRIPT).split("class LM")[0].replace("sys, ", ""), ns)
    x, y, v = ns["X"][:n], ns["Y"][:n], ns["V"]
    groups = {}
    for b in range(n):
        for t in range(x.shape[1]):
            if y[b, t] != -1:
                groups.setdefault(tuple(x[b, :t + 1].tolist()), []).append(int(y[b, t]))
    logq, tgt = [], []
    for nxt in groups.values():
        mix = F.one_hot(torch.tensor(nxt), v).double().mean(0) * (1 - smooth) + smooth / v
        logq += [mix.log()] * len(nxt)
        tgt += nxt
    return float(F.cross_entropy(torch.stack(logq), torch.tensor(tgt), label_smoothing=smooth))


@pytest.mark.parametrize("loss,smooth,n", [
    ("logits, loss = model(x, None, y)", 0.0, 32),                    # makemore / minGPT: the loss inside
    ("out = model(input_ids=x, labels=y); loss = out[1]", 0.1, 32),   # by keyword, as Hugging Face's
    # a view of the logits; (B*T, V) rows mix the samples: the whole batch
    ("logits, _ = model(x); loss = F.cross_entropy(logits.view(-1, V), y.view(-1), ignore_index=-1, "
     "label_smoothing=SMOOTH)", 0.1, 48),
    ("logits, _ = model(x); loss = F.cross_entropy(logits.transpose(1, 2), y, ignore_index=-1, "
     "label_smoothing=SMOOTH)", 0.0, 32),
])
def test_a_language_model_is_overfit_whether_it_computes_its_loss_or_the_loss_reshapes_its_logits(
        tmp_path, loss, smooth, n):
    """A model returning (logits, loss) (minGPT's, makemore's, a Hugging Face model's) and a
    cross-entropy on logits.view(-1, V) were SKIP 'F.cross_entropy was not called on the
    model's output itself': no language model was ever overfit.  The copy's loss is now the one
    the model returns (called with the script's keywords: model(input_ids=x, labels=y)), or the
    same view of its logits; and next tokens that follow the same prefix in the batch put the
    goal above 0: at the targets' entropy given their prefixes (a healthy GRU came to 0.64 on
    names, 5% of its first loss was 0.165)."""
    body = LM_SCRIPT.replace("LOSS", loss).replace("SMOOTH", repr(smooth))
    report, _ = run_check(write(tmp_path, "lm.py", body.replace("BROKEN", "False")), overfit_iters=300)
    c = by_name(report)["overfit"]
    assert c.status == "PASS", c.evidence
    assert c.evidence.startswith(f"{n} sample(s), Adam(lr=0.01)"), c.evidence
    assert "the targets' entropy given their prefixes in the batch" in c.evidence, c.evidence
    assert c.numbers["floor"] == pytest.approx(_next_token_floor(smooth, n), rel=1e-9)
    assert c.numbers["floor"] < c.numbers["last"] <= c.numbers["goal"]
    report, _ = run_check(write(tmp_path, "broken.py", body.replace("BROKEN", "True")), overfit_iters=100)
    c = by_name(report)["overfit"]
    assert c.status == "FAIL" and "cannot fit one small batch" in c.cause, (c.evidence, c.cause)



GRAPH_SCRIPT = """
    import torch, torch.nn as nn, torch.nn.functional as F
    torch.manual_seed(0)
    n, c = 300, 5
    labels = torch.randint(0, c, (n,))
    features = (torch.rand(n, 40) < 0.05).float() + (torch.rand(c, 40) < 0.2).float()[labels]
    features = features / features.sum(1, keepdim=True)
    adj = torch.eye(n) + (torch.rand(n, n) < 0.01).float()
    adj = adj / adj.sum(1, keepdim=True)


    class GraphNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.l2, self.drop = nn.Linear(40, 16), nn.Linear(16, c), nn.Dropout(0.5)

        def forward(self, x, a):
            h = self.drop(F.relu(a @ self.l1(x)))
            if BROKEN:
                h = h.detach()
            return F.log_softmax(a @ self.l2(h), dim=1)


    model = GraphNet()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    idx = torch.randperm(n)
    idx_train, idx_val = INDEX, idx[100:]
    for epoch in range(4):
        model.train()
        opt.zero_grad()
        output = model(features, adj)
        loss = nn.NLLLoss()(output[idx_train], labels[idx_train])
        loss.backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            val = F.nll_loss(model(features, adj)[idx_val], labels[idx_val])
        print(f"epoch {epoch} loss {loss.item()!r} val {val.item()!r}")
"""


@pytest.mark.parametrize("index", ["idx[:100]", "torch.isin(torch.arange(n), idx[:100])"])
def test_a_full_batch_graph_network_is_overfit_on_its_loss_over_the_indexed_training_nodes(tmp_path, index):
    """pytorch/examples' gcn and gat take their loss on output[idx_train], the training nodes'
    rows of the whole graph's output: overfit was SKIP 'NLLLoss was not called on the model's
    output itself (nor on a view of it ...)', so a graph network was never overfit (gcn's layer
    detached after its first ReLU PASSed all but gradients).  The copy's output is indexed as
    the script's was (a tensor of indices or a mask), on the whole graph."""
    body = GRAPH_SCRIPT.replace("INDEX", index)
    report, _ = run_check(write(tmp_path, "graph.py", body.replace("BROKEN", "False")), overfit_iters=300)
    c = by_name(report)["overfit"]
    assert c.status == "PASS", c.evidence
    assert c.evidence.startswith("300 sample(s) (the loss on (100, 5) of the output's (300, 5), indexed as the "
                                 "script did), Adam(lr=0.01), dropout off"), c.evidence
    report, _ = run_check(write(tmp_path, "broken.py", body.replace("BROKEN", "True")), overfit_iters=100)
    c = by_name(report)["overfit"]
    assert c.status == "FAIL" and "cannot fit one small batch" in c.cause, (c.evidence, c.cause)


@pytest.mark.parametrize("batch,ga,items,n", [
    (16, 1, False, 16),      # model(input_ids=x, labels=x): the model shifts its labels inside
    (48, 1, False, 32),      # a batch larger than the check's: its first 32 rows
    (16, 2, True, 16),       # the Trainer's num_items_in_batch: the sum over the accumulated batch's tokens
])
def test_a_causal_lm_given_its_input_ids_as_labels_is_overfit_down_to_their_entropy(batch, ga, items, n):
    """A Hugging Face causal LM is given its input ids as labels (``model(input_ids=x,
    labels=x)``) and shifts them inside: the goal was 5% of the first loss, below the
    targets' entropy given their prefixes, and overfit FAILed 'cannot fit one small batch' on a
    healthy GPT-2 (a batch of sequences alike in their first 3 of 6 tokens: 4.180 -> 0.4213,
    at the floor 0.4159, goal 0.2090); under the Trainer, whose num_items_in_batch the model
    divides its summed loss by, no floor was found at all (the loss function's call was not
    the model's loss, a multiple of it).  The floor is now the shifted targets' entropy, in
    the units of the loss the model returns."""
    args = [batch, ga] + (["items"] if items else [])
    report, _ = run_check(os.path.join(ROOT, "tests", "scripts", "hf_shaped_causal_lm.py"), *args, overfit_iters=300)
    c = by_name(report)["overfit"]
    assert c.status == "PASS", (c.evidence, c.cause)
    assert c.evidence.startswith(f"{n} sample(s), AdamW(lr=0.01)"), c.evidence
    assert "the targets' entropy given their prefixes in the batch" in c.evidence, c.evidence
    # (the model's loss over its loss call's: float32's quotient by num_items_in_batch)
    assert c.numbers["floor"] == pytest.approx(_shifted_labels_floor(n, batch * ga if items else 0),
                                               rel=1e-6 if items else 1e-9)
    assert c.numbers["floor"] < c.numbers["last"] <= c.numbers["goal"]


def _shifted_labels_floor(n: int, accumulated: int) -> float:
    """hf_shaped_causal_lm.py's least loss on its first n rows: at each prefix x[:t+1], the mix
    of the labels at t+1 that follow it; their mean, or (``accumulated`` rows a step) their sum
    over the step's target tokens, as num_items_in_batch divides it."""
    src = open(os.path.join(ROOT, "tests", "scripts", "hf_shaped_causal_lm.py")).read()
    ns = {}
    exec(src.split("class CausalLM")[0].replace("BATCH, GA = int(sys.argv[1]), int(sys.argv[2])", "")
         .replace("ITEMS = sys.argv[3:] == [\"items\"]", ""), ns)
    x, labels = ns["X"], ns["LABELS"]
    groups = {}
    for b in range(n):
        for t in range(x.shape[1] - 1):
            if labels[b, t + 1] != -100:
                groups.setdefault(tuple(x[b, :t + 1].tolist()), []).append(int(labels[b, t + 1]))
    total = sum(-sum(c * math.log(c / len(nxt)) for c in (nxt.count(k) for k in set(nxt))) for nxt in groups.values())
    kept = sum(len(nxt) for nxt in groups.values())
    if accumulated:
        return total / int((labels[:accumulated, 1:] != -100).sum())
    return total / kept


OWN_LOSS_ACCUMULATED = """
    import torch, torch.nn as nn, torch.nn.functional as F
    torch.manual_seed(0)
    GA = 4
    class LM(nn.Module):
        def __init__(s):
            super().__init__(); s.emb = nn.Embedding(16, 32); s.head = nn.Linear(32, 16)
        def forward(s, x, y=None):
            logits = s.head(torch.relu(s.emb(x)))
            return logits, OWN
    model = LM(); opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.randint(0, 16, (64, 8))
    for step in range(4):
        for micro in range(GA):
            x = data[(step * GA + micro) * 4 % 64:][:4]
            logits, loss = model(x, y=(x * 3 + 1) % 16)
            BACKWARD
        opt.step(); opt.zero_grad()
        print(f"step {step} loss {loss.item()!r}")
"""


@pytest.mark.parametrize("own,backward", [
    ("F.cross_entropy(logits.view(-1, 16), y.view(-1))", "(loss / GA).backward()"),      # nanoGPT's
    # accelerate's accelerator.backward (loss / GA), under the Hugging Face Trainer's (loss * 1 / GA),
    # of a model that scales its loss itself (BERT's loss_fct(...) * 1.0)
    ("F.cross_entropy(logits.view(-1, 16), y.view(-1)) * 1.0", "(loss * 1 / GA).backward()"),
])
def test_a_model_that_returns_its_loss_is_overfit_when_the_script_scales_it(tmp_path, own, backward):
    """A model returning its loss (minGPT's, every Hugging Face model's out.loss) was overfit only
    where the script's backward() was of that very tensor: with gradient accumulation's
    `loss / GA` (nanoGPT, accelerate's accelerator.backward, so every HF Trainer and accelerate
    loop) overfit was SKIP 'F.cross_entropy was not called on the model's output itself (nor on
    a view of it ...)'.  A one-number multiple of it is the loss the model returned."""
    script = write(tmp_path, "own.py", OWN_LOSS_ACCUMULATED.replace("OWN", own).replace("BACKWARD", backward))
    report, _ = run_check(script, overfit_iters=100)
    c = by_name(report)["overfit"]
    assert c.status == "PASS", (c.evidence, c.cause)
    assert c.evidence.startswith("4 sample(s), AdamW(lr=0.01): loss 2.8"), c.evidence

def test_the_label_smoothing_floor_holds_where_the_logits_are_not_the_first_output(tmp_path):
    """model(x) -> (features, logits), cross_entropy(logits, y, label_smoothing=0.2): the floor
    was computed on the first output leaf's index of a bare tensor (an IndexError, swallowed:
    floor 0), and the goal was 5% of the first loss, 0.0802, under the least the loss can be,
    0.6615: a healthy model FAILed 'cannot fit one small batch' at 0.6625."""
    script = write(tmp_path, "two.py", """
        import torch, torch.nn as nn, torch.nn.functional as F
        torch.manual_seed(0)
        class M(nn.Module):
            def __init__(s):
                super().__init__(); s.body = nn.Sequential(nn.Linear(10, 64), nn.ReLU()); s.head = nn.Linear(64, 5)
            def forward(s, x):
                f = s.body(x); return f, s.head(f)
        m = M(); opt = torch.optim.Adam(m.parameters(), lr=3e-3)
        X = torch.randn(128, 10); Y = torch.randint(0, 5, (128,))
        for step in range(2):
            feat, logits = m(X[:64])
            loss = F.cross_entropy(logits, Y[:64], label_smoothing=0.2)
            opt.zero_grad(); loss.backward(); opt.step()
        """)
    report, _ = run_check(script, overfit_iters=300)
    c = by_name(report)["overfit"]
    import math
    assert c.numbers["floor"] == pytest.approx(-(0.84 * math.log(0.84) + 4 * 0.04 * math.log(0.04)), rel=1e-6)
    assert c.status == "PASS" and c.numbers["floor"] < c.numbers["last"] <= c.numbers["goal"], c.evidence


def test_a_decoder_called_once_per_time_step_is_not_overfit_on_one_step_s_loss(tmp_path):
    """A seq2seq decoder looped over 4 time steps, one cross-entropy per step summed into one
    backward: the check overfit the first step's loss alone (main: 'loss 2.534 -> 0.1177', the
    script's loss was 2.477, the mean of the 4), a PASS that says nothing of the other steps.
    SKIP, with the reason; one call per backward (gradient accumulation) is still overfit."""
    script = write(tmp_path, "s2s.py", """
        import torch, torch.nn as nn
        torch.manual_seed(0)
        enc, dec = nn.GRUCell(8, 16), nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 5))
        opt = torch.optim.Adam(list(enc.parameters()) + list(dec.parameters()), lr=3e-3)
        x, y = torch.randn(24, 8), torch.randint(0, 5, (24, 4))
        for step in range(2):
            h = enc(x); loss = 0
            for t in range(4):
                loss = loss + nn.functional.cross_entropy(dec(h), y[:, t])
                h = h + 0.1 * torch.tanh(h)
            opt.zero_grad(); (loss / 4).backward(); opt.step()
        """)
    report, _ = run_check(script, overfit_iters=20)
    c = by_name(report)["overfit"]
    assert c.status == "SKIP" and "dec (Sequential) was called 4 times with autograd on before one backward, 4 loss " \
        "calls on its outputs in the first step (F.cross_entropy, " in c.evidence, c.evidence
    report, _ = run_check(example("grad_accum.py"), overfit_iters=300)
    assert by_name(report)["overfit"].status == "PASS"


def test_a_gans_discriminator_on_real_and_fake_is_skipped_for_what_it_is_not_a_decoder(tmp_path):
    """A DCGAN-style loop whose D loss sums BCE on D(real) and on D(fake.detach()): the overfit SKIPped
    guessing 'a decoder's loop over time steps?'.  It says what it saw: D called twice before one
    backward, its loss calls, the two optimizers."""
    script = write(tmp_path, "gan.py", """
        import torch, torch.nn as nn
        torch.manual_seed(0)
        G = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16), nn.Tanh())
        D = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
        crit = nn.BCEWithLogitsLoss()
        optD = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
        optG = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
        data = torch.randn(64, 16).tanh()
        for i in range(2):
            real, fake = data[i * 32:(i + 1) * 32], G(torch.randn(32, 8))
            D.zero_grad()
            (crit(D(real), torch.ones(32, 1)) + crit(D(fake.detach()), torch.zeros(32, 1))).backward()
            optD.step()
            G.zero_grad()
            crit(D(fake), torch.ones(32, 1)).backward()
            optG.step()
        """)
    report, _ = run_check(script, overfit_iters=20)
    c = by_name(report)["overfit"]
    assert c.status == "SKIP" and "decoder" not in c.evidence, c.evidence
    assert c.evidence.startswith("D (Sequential) was called 2 times with autograd on before one backward, 3 loss calls "
                                 "on its outputs in the first step (BCEWithLogitsLoss, BCEWithLogitsLoss, "
                                 "BCEWithLogitsLoss); 2 optimizers stepped: "), c.evidence


def test_the_floor_of_a_weighted_label_smoothed_cross_entropy_is_not_0(tmp_path):
    """CrossEntropyLoss(weight=..., label_smoothing=0.05) on a padded tagger's logits.transpose(1, 2):
    a class weight made the floor 0 and the goal 5% of the first loss, 0.0847, under the least the
    loss can be (0.1972): a tagger that fit its batch FAILed 'cannot fit one small batch' at 0.1974.
    The least is at the prediction proportional to weight x smoothed target; free logits trained on
    the loss itself come down to it."""
    script = write(tmp_path, "wls.py", """
        import torch, torch.nn as nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 64), nn.Tanh(), nn.Linear(64, 5))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        X = torch.randn(64, 6); Y = torch.randint(0, 5, (64,)); Y[::7] = -100
        crit = nn.CrossEntropyLoss(weight=torch.tensor([1., 2., 3., 1., .5]), label_smoothing=0.05)
        for step in range(2):
            loss = crit(model(X[:48]), Y[:48])
            opt.zero_grad(); loss.backward(); opt.step()
        """)
    report, _ = run_check(script, overfit_iters=300)
    c = by_name(report)["overfit"]
    import torch
    torch.manual_seed(0)
    torch.nn.Sequential(torch.nn.Linear(6, 64), torch.nn.Tanh(), torch.nn.Linear(64, 5))
    torch.randn(64, 6)
    y = torch.randint(0, 5, (64,))
    y[::7] = -100
    crit = torch.nn.CrossEntropyLoss(weight=torch.tensor([1., 2., 3., 1., .5], dtype=torch.float64),
                                     label_smoothing=0.05)
    free = torch.zeros(32, 5, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([free], max_iter=500, tolerance_grad=1e-12, tolerance_change=1e-15)

    def closure():
        opt.zero_grad()
        loss = crit(free, y[:32])
        loss.backward()
        return loss
    opt.step(closure)
    assert c.numbers["floor"] == pytest.approx(float(crit(free, y[:32])), rel=1e-6)
    assert c.status == "PASS" and c.numbers["floor"] < c.numbers["last"] <= c.numbers["goal"], c.evidence


def test_the_replica_overfits_with_dropout_off(tmp_path):
    """A healthy LSTM classifier with dropout (between its LSTM's layers, an nn.Dropout, an
    F.dropout in forward; 0.7): the replica trained with it on FAILed 'cannot fit one small batch'
    (2.306 -> 0.7499 in 300 iterations, best 0.6332; pytorch/examples' mnist_rnn: 2.351 -> 0.6272).
    Dropout is off while the replica trains, as practitioners overfit one batch (0.1114 in 47),
    and the line says so; the script's model keeps its dropout."""
    script = write(tmp_path, "drop.py", """
        import torch, torch.nn as nn, torch.nn.functional as F
        torch.manual_seed(0)
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = nn.LSTM(6, 32, num_layers=2, dropout=0.7, batch_first=True)
                self.drop = nn.Dropout(0.7)
                self.fc1, self.fc2 = nn.Linear(32, 32), nn.Linear(32, 10)
            def forward(self, x):
                h = self.rnn(x)[0][:, -1]
                h = F.relu(self.fc1(self.drop(h)))
                return self.fc2(F.dropout(h, 0.7, training=self.training))
        model = Net()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        X, Y = torch.randn(64, 8, 6), torch.randint(0, 10, (64,))
        for step in range(2):
            loss = F.cross_entropy(model(X), Y)
            opt.zero_grad(); loss.backward(); opt.step()
        assert model.rnn.dropout == 0.7 and model.training
        """)
    report, _ = run_check(script, overfit_iters=300)
    c = by_name(report)["overfit"]
    assert c.status == "PASS" and "dropout off" in c.evidence and c.numbers["iterations"] < 100, c.evidence
    # (without dropout nothing is said)
    report, _ = run_check(regression(tmp_path, "reg.py"), overfit_iters=300)
    assert "dropout off" not in by_name(report)["overfit"].evidence


def test_a_sigmoid_before_a_with_logits_loss_fails_the_initial_loss(tmp_path):
    """BCEWithLogitsLoss on torch.sigmoid(model(x)) (a multi-label head, 12 labels, 10% positive):
    the initial loss 0.9217 was within the limit of ln(2) = 0.693 and PASSed, the overfit SKIPped,
    so the planted double sigmoid went unsaid.  An input that is a sigmoid's output (by its
    autograd graph, through views) now FAILs it; the same head on its logits (0.7058) still
    PASSes, and so does a small GAN discriminator whose fresh logits all lie in [0, 1]."""
    body = """
        import torch, torch.nn as nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 12))
        opt = torch.optim.Adam(model.parameters(), 1e-3)
        X, Y = torch.randn(256, 20), (torch.rand(256, 12) < 0.1).float()
        crit = nn.BCEWithLogitsLoss()
        for s in range(2):
            i = torch.randint(0, 256, (64,)); loss = crit(OUT, Y[i])
            opt.zero_grad(); loss.backward(); opt.step()
        """
    report, _ = run_check(write(tmp_path, "sig.py", body.replace("OUT", "torch.sigmoid(model(X[i]))")),
                          overfit_iters=1)
    c = by_name(report)["initial-loss"]
    assert c.status == "FAIL" and "input is a sigmoid's output" in c.evidence and "sigmoid" in c.cause, c.evidence
    assert c.numbers["loss"] == pytest.approx(0.9217, abs=1e-4)
    report, _ = run_check(write(tmp_path, "logits.py", body.replace("OUT", "model(X[i])")), overfit_iters=1)
    c = by_name(report)["initial-loss"]
    assert c.status == "PASS" and c.numbers["loss"] == pytest.approx(0.7058, abs=1e-4), c.evidence
    report, _ = run_check(write(tmp_path, "view.py", body.replace("OUT", "torch.sigmoid(model(X[i])).view(64, 12)")),
                          overfit_iters=1)
    assert by_name(report)["initial-loss"].status == "FAIL"
    report, _ = run_check(write(tmp_path, "d.py", """
        import torch, torch.nn as nn, torch.nn.functional as F
        torch.manual_seed(0)
        D = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
        with torch.no_grad():
            D[2].bias.fill_(0.5)
        opt = torch.optim.Adam(D.parameters(), 2e-3)
        x = torch.randn(32, 2) * 0.1
        assert ((D(x) >= 0) & (D(x) <= 1)).all()
        for s in range(2):
            loss = F.binary_cross_entropy_with_logits(D(x), torch.ones(32, 1))
            opt.zero_grad(); loss.backward(); opt.step()
        """), overfit_iters=1)
    assert by_name(report)["initial-loss"].status == "PASS", by_name(report)["initial-loss"].evidence


@pytest.mark.parametrize("seed, first, exp_sum", [(1, 0.1022, 4.734), (0, -0.03278, None)])
def test_nll_loss_on_raw_logits_fails_the_initial_loss_whatever_its_sign(tmp_path, seed, first, exp_sum):
    """F.nll_loss on a segmentation net's raw (N, 5, H, W) logits (log_softmax missing): the loss
    is near 0, above it as often as below.  Above (seed 1: 0.1022 against ln(5) = 1.61) it PASSed
    initial-loss as 'a pretrained model?' and PASSed overfit as the loss went negative
    (0.1022 -> -0.01664 in 3 iterations); below (seed 0) overfit PASSed at iteration 1.  exp of an
    input row sums to ~5, not 1: initial-loss FAILs; the overfit SKIPs (no least value)."""
    script = write(tmp_path, "nll.py", f"""
        import torch, torch.nn as nn, torch.nn.functional as F
        torch.manual_seed({seed})
        model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 5, 1))
        opt = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9)
        X, Y = torch.randn(32, 3, 16, 16), torch.randint(0, 5, (32, 16, 16))
        for s in range(2):
            loss = F.nll_loss(model(X[:8]), Y[:8]); opt.zero_grad(); loss.backward(); opt.step()
        """)
    report, _ = run_check(script, overfit_iters=50)
    c = by_name(report)
    assert c["initial-loss"].status == "FAIL" and "log_softmax" in c["initial-loss"].cause, c["initial-loss"].evidence
    assert c["initial-loss"].numbers["loss"] == pytest.approx(first, abs=1e-4)
    if exp_sum is not None:
        assert c["initial-loss"].numbers["exp_sum"] == pytest.approx(exp_sum, abs=1e-3)
    assert c["overfit"].status == "SKIP" and "below 0" in c["overfit"].evidence, c["overfit"].evidence
    # (the same net through log_softmax: both PASS)
    good = write(tmp_path, "lsm.py", open(script).read().replace("F.nll_loss(model(X[:8])",
                                                                  "F.nll_loss(F.log_softmax(model(X[:8]), 1)"))
    report, _ = run_check(good, overfit_iters=1)
    assert by_name(report)["initial-loss"].status == "PASS", by_name(report)["initial-loss"].evidence


@pytest.mark.parametrize("zero_grad", ["opt.zero_grad()", "opt.zero_grad(set_to_none=False)"])
def test_a_zero_grad_between_backward_and_step_is_named_not_called_detached(tmp_path, zero_grad):
    """loss.backward(); opt.zero_grad(); opt.step(): every parameter got its gradient in backward()
    and it was gone at step().  The gradients check FAILed with 'got no gradient: detached (.detach(),
    .data, no_grad, a numpy round trip) or unused in the forward pass' (and with set_to_none=False,
    'all-zero gradient ... dead ReLUs'), a cause the script does not have.  A hook on each held
    parameter's gradient accumulation now tells a cleared gradient from one backward never gave;
    a model whose output is detached still reads 'detached'."""
    body = """
        import torch, torch.nn as nn, torch.nn.functional as F
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 7))
        opt = torch.optim.Adam(model.parameters(), 1e-3)
        X, Y = torch.randn(256, 20), torch.randint(0, 7, (256,))
        for s in range(2):
            loss = F.cross_entropy(OUT, Y[:64])
            LOOP
        """
    script = write(tmp_path, "order.py", body.replace("OUT", "model(X[:64])").replace(
        "LOOP", f"loss.backward(); {zero_grad}; opt.step()"))
    report, _ = run_check(script, overfit_iters=1)
    c = by_name(report)["gradients"]
    assert c.status == "FAIL" and "zero_grad() between loss.backward() and optimizer.step()" in c.cause, c.evidence
    assert "detached" not in c.cause and "ReLU" not in c.cause
    assert c.numbers["cleared_grad"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    script = write(tmp_path, "det.py", body.replace("OUT", "model(X[:64]).detach().requires_grad_()").replace(
        "LOOP", "opt.zero_grad(); loss.backward(); opt.step()"))
    report, _ = run_check(script, overfit_iters=1)
    c = by_name(report)["gradients"]
    assert c.status == "FAIL" and "detached" in c.cause and "cleared_grad" not in c.numbers, c.evidence


def test_a_layer_frozen_by_dropping_its_gradient_is_said_not_failed():
    """DINO's loop drops its last layer's gradient after backward() for the first epoch
    (p.grad = None) while the rest trains: gradients FAILed 'a gradient from backward() but none
    left at optimizer.step(): student.module.head.last_layer.weight_v -- likely cause: ... a
    zero_grad() between loss.backward() and optimizer.step()', a bug the script does not have.
    Said now, not judged; every gradient dropped (the planted zero_grad) still FAILs."""
    script = os.path.join(ROOT, "tests", "scripts", "self_distillation.py")
    c = by_name(run_check(script, overfit_iters=1)[0])["gradients"]
    assert c.status == "PASS" and c.numbers["dropped_grad"] == ["student.head.last_layer.weight"], c.evidence
    assert c.evidence.endswith("1 more got a gradient from backward() that the script dropped before "
                               "optimizer.step() while the others kept theirs (frozen for now), not judged: "
                               "student.head.last_layer.weight"), c.evidence
    c = by_name(run_check(script, "--late-zero-grad", overfit_iters=1)[0])["gradients"]
    assert c.status == "FAIL" and "zero_grad() between loss.backward() and optimizer.step()" in c.cause, c.evidence
    assert len(c.numbers["cleared_grad"]) == 9 and "dropped_grad" not in c.numbers


def test_a_layer_left_out_of_the_optimizer_is_said(tmp_path):
    """Adam(model[0].parameters()) for a 2-layer MLP: the last layer gets a gradient in every
    backward() and never changes.  gradients and updates PASSed ('2/2 parameter tensor(s) the
    optimizer holds'), and the overfit FAILed with only the generic hints.  updates now names the
    parameters backward() gives a gradient that no optimizer holds (said, not failed: a fine-tune
    may pass only its head), and the overfit's hint names them; a frozen backbone (requires_grad
    False) is not named."""
    body = """
        import torch, torch.nn as nn, torch.nn.functional as F
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 7))
        FREEZE
        opt = torch.optim.Adam(model[0].parameters(), 1e-3)
        X, Y = torch.randn(256, 20), torch.randint(0, 7, (256,))
        for s in range(2):
            loss = F.cross_entropy(model(X[:64]), Y[:64])
            opt.zero_grad(); loss.backward(); opt.step()
        """
    report, _ = run_check(write(tmp_path, "part.py", body.replace("FREEZE", "")), overfit_iters=30)
    c = by_name(report)
    assert c["updates"].status == "PASS" and c["updates"].numbers["unheld_with_grad"] == ["2.weight", "2.bias"]
    assert "no optimizer holds 2.weight, 2.bias, though backward() gives them a gradient" in c["updates"].evidence
    assert c["overfit"].status == "FAIL" and "no optimizer holds stay as they are: 2.weight, 2.bias" in c["overfit"].cause
    report, _ = run_check(write(tmp_path, "frozen.py", body.replace(
        "FREEZE", "model[2].requires_grad_(False)")), overfit_iters=1)
    assert "unheld_with_grad" not in by_name(report)["updates"].numbers


@pytest.mark.parametrize("shape", ["dcgan", "classifier"])
def test_a_learning_rate_too_small_for_300_iterations_is_no_model_that_cannot_fit(tmp_path, shape):
    """A DCGAN-shaped loop (D stepped on a real and a fake backward, then G) at Adam's 0.0002,
    and a classifier at the same lr, FAILed 'the model cannot fit one small batch' (0.6092 ->
    0.3460 and 0.6841 -> 0.4352 after 300 iterations): at 10x the lr both fit it."""
    body = {"dcgan": """
        G = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16), nn.Tanh())
        D = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1), nn.Sigmoid())
        optD = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
        optG = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
        bce = nn.BCELoss()
        data = torch.randn(256, 16).tanh()
        for i in range(4):
            real = data[i * 32:(i + 1) * 32]
            D.zero_grad()
            bce(D(real).view(-1), torch.ones(32)).backward()
            fake = G(torch.randn(32, 8))
            bce(D(fake.detach()).view(-1), torch.zeros(32)).backward()
            optD.step()
            G.zero_grad()
            bce(D(fake).view(-1), torch.ones(32)).backward()
            optG.step()
        """, "classifier": """
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1), nn.Sigmoid())
        opt = torch.optim.Adam(model.parameters(), lr=2e-4, betas=(0.5, 0.999))
        x = torch.randn(256, 16); y = (x[:, 0] > 0).float()
        for i in range(4):
            opt.zero_grad()
            loss = nn.BCELoss()(model(x[i * 32:(i + 1) * 32]).view(-1), y[i * 32:(i + 1) * 32])
            loss.backward(); opt.step()
        """}[shape]
    script = write(tmp_path, f"{shape}.py", "import torch\nfrom torch import nn\ntorch.manual_seed(0)\n"
                   + textwrap.dedent(body))
    report, _ = run_check(script, steps=2, overfit_iters=300)
    c = by_name(report)["overfit"]
    assert c.status == "PASS" and report.exit_code == 0, c.evidence
    assert re.match(r"32 sample\(s\), Adam\(lr=0\.0002\): loss \S+ -> \S+ after 300 iteration\(s\); at 10x the lr "
                    r"\(0\.002\) \S+ -> \S+ in \d+: the model fits one batch", c.evidence), c.evidence
    assert c.numbers["last"] > 2 * c.numbers["goal"] and c.numbers["faster_last"] <= c.numbers["goal"]


SEQ_FIRST = """
import torch, torch.nn as nn
torch.manual_seed(0)
V = 20
class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, 16)
        self.body = BODY
        self.out = nn.Linear(16, V)
    def forward(self, x):
        h = self.body(self.emb(x))
        return self.out(h[0] if isinstance(h, tuple) else h)
model = LM()
opt = torch.optim.Adam(model.parameters(), lr=0.01)
data = torch.randint(0, V, (9 * 4 + 1, 16))            # (time, batch): word_language_model's layout
for i in range(3):
    x, y = data[i * 9:(i + 1) * 9], data[i * 9 + 1:(i + 1) * 9 + 1]
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x).view(-1, V), y.reshape(-1))
    loss.backward(); opt.step()
"""

CRNN = """
import torch, torch.nn as nn
torch.manual_seed(0)
class CRNN(nn.Module):                 # images batch first, the LSTM over their columns time first
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.rnn = nn.LSTM(8 * 4, 16)
        self.head = nn.Linear(16, 5)
    def forward(self, x):
        f = self.conv(x)                                   # (B, 8, 4, W)
        seq = f.permute(3, 0, 1, 2).flatten(2)             # (W, B, 32)
        out, _ = self.rnn(seq)
        return self.head(out[-1])
model = CRNN()
opt = torch.optim.Adam(model.parameters(), lr=0.01)
for i in range(3):
    x, y = torch.randn(12, 1, 4, 10), torch.randint(0, 5, (12,))
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward(); opt.step()
"""


@pytest.mark.parametrize("body,said", [
    ("nn.LSTM(16, 16)", "16 sample(s) (9 time steps each, time first)"),
    ("nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0), 1)",
     "16 sample(s) (9 time steps each, time first)"),
    ("nn.LSTM(16, 16, batch_first=True)", "9 sample(s)"),          # (as the script has it: its batch is 9 long)
    (None, "12 sample(s)"),
])
def test_a_time_first_batch_is_counted_in_sequences_not_time_steps(tmp_path, body, said):
    """word_language_model's layout, (time, batch) tokens into an LSTM or a transformer without
    batch_first: the overfit line said '9 sample(s)' for 16 sequences of 9 tokens.  A CRNN's
    images (batch first, its LSTM over their columns time first) keep their count."""
    source = CRNN if body is None else SEQ_FIRST.replace("BODY", body)
    report, _ = run_check(write(tmp_path, "seq.py", source), steps=2, overfit_iters=5)
    c = by_name(report)["overfit"]
    assert c.evidence.startswith(said + ", Adam(lr=0.01): loss "), c.evidence


LORA = """
import torch, torch.nn as nn
torch.manual_seed(0)
class LoRALinear(nn.Module):
    def __init__(self, base, r=4):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.A = nn.Parameter(torch.randn(r, base.in_features) * 0.01)
        self.B = nn.Parameter(torch.zeros(base.out_features, r))         # (LoRA's init: the adapter starts at 0)
    def forward(self, x):
        return self.base(x) + x @ self.A.t() @ self.B.t()
model = nn.Sequential(LoRALinear(nn.Linear(16, 32)), nn.ReLU(), LoRALinear(nn.Linear(32, 4)))
A = [m.A for m in model if hasattr(m, "A")]
B = [m.B for m in model if hasattr(m, "B")]
opt = torch.optim.AdamW([{"params": A}, {"params": B, "lr": B_LR}], lr=1e-2)
x = torch.randn(128, 16); y = torch.randint(0, 4, (128,))
for i in range(4):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x[i * 32:(i + 1) * 32]), y[i * 32:(i + 1) * 32])
    loss.backward(); opt.step()
"""


def test_a_factor_that_starts_at_zero_is_no_dead_unit_in_one_step(tmp_path):
    """`nndb check --steps 1` on a healthy LoRA fine-tune FAILed gradients: 'all-zero gradient:
    0.A, 2.A -- dead ReLUs or a saturated activation upstream': B starts at 0, so A's gradient
    (through B) is 0 at the first step.  Said and not judged in one step; with two steps judged,
    and where B never moves (its group at lr 0) A's zero gradient is a FAIL."""
    script = write(tmp_path, "lora.py", LORA.replace("B_LR", "1e-2"))
    report, _ = run_check(script, steps=1, overfit_iters=5)
    c = by_name(report)["gradients"]
    assert c.status == "PASS", (c.evidence, c.cause)
    assert "all-zero gradient behind a factor that starts at zero, not judged in one step: 0.A, 2.A (0.B, 2.B " \
        "start all zeros" in c.evidence, c.evidence
    assert c.numbers["zero_grad_behind_zero_factor"] == ["0.A", "2.A"]
    report, _ = run_check(script, steps=2, overfit_iters=5)
    assert by_name(report)["gradients"].status == "PASS" and "behind" not in by_name(report)["gradients"].evidence
    stuck = write(tmp_path, "stuck.py", LORA.replace("B_LR", "0.0"))
    report, _ = run_check(stuck, steps=2, overfit_iters=5)
    c = by_name(report)["gradients"]
    assert c.status == "FAIL" and "all-zero gradient: 0.A, 2.A" in c.evidence, c.evidence


NGRAM = """
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
V = 12
class Bigram(nn.Module):                       # makemore's: a table of next-token logits
    def __init__(self):
        super().__init__()
        self.logits = nn.Parameter(torch.zeros(V, V))
    def forward(self, idx, targets):
        logits = self.logits[idx]
        return logits, F.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=-1)
class Causal(nn.Module):                       # a causal convolution: the last K tokens
    def __init__(self):
        super().__init__()
        self.emb, self.conv, self.out = nn.Embedding(V, 16), nn.Conv1d(16, 32, K), nn.Linear(32, V)
    def forward(self, idx, targets):
        h = F.pad(self.emb(idx).transpose(1, 2), (K - 1, 0))
        logits = self.out(torch.relu(self.conv(h)).transpose(1, 2))
        return logits, F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
class Attn(nn.Module):                         # one head of causal self-attention, by hand
    def __init__(self, mask):
        super().__init__()
        self.emb, self.pos = nn.Embedding(V, 32), nn.Parameter(torch.randn(9, 32) * 0.1)
        self.qkv, self.out = nn.Linear(32, 96), nn.Linear(32, V)
        self.mlp = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 32))
        self.register_buffer("mask", mask)
    def forward(self, idx, targets):
        h = self.emb(idx) + self.pos[:idx.shape[1]]
        q, k, v = self.qkv(h).split(32, dim=2)
        w = (q @ k.transpose(1, 2) / 32 ** 0.5).masked_fill(self.mask == 0, float("-inf")).softmax(-1)
        h = h + w @ v
        logits = self.out(h + self.mlp(h))
        return logits, F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
model = MODEL
opt = torch.optim.AdamW(model.parameters(), lr=5e-2)
words = torch.randint(1, V, (64, 9))
for i in range(4):
    y = words[i * 16:(i + 1) * 16]
    x = torch.cat([torch.zeros(16, 1, dtype=torch.long), y[:, :-1]], 1)
    logits, loss = model(x, y)
    opt.zero_grad(); loss.backward(); opt.step()
"""


@pytest.mark.parametrize("model,back", [("Bigram()", 1), ("Causal()", 3)])
def test_a_model_that_looks_back_a_few_tokens_is_overfit_to_what_it_can_know(tmp_path, model, back):
    """A healthy bigram FAILed overfit (2.485 -> 1.892 at either lr; goal < 0.4169): its goal was
    the targets' entropy given whole prefixes (0.3081), where a model of one token can reach
    1.890 at best.  The copy's outputs are probed for how far back they look (the batch's first
    tokens changed, the parameters nudged: a bigram's table starts at zero), and the floor is the
    entropy given that many tokens."""
    script = write(tmp_path, "ngram.py", NGRAM.replace("MODEL", model).replace("K)", "3)").replace("K -", "3 -"))
    report, _ = run_check(script, steps=2, overfit_iters=300)
    c = by_name(report)["overfit"]
    assert c.status == "PASS", c.evidence
    assert f"the targets' entropy given the last {back} token(s) before each in the batch, as far back as the " \
        "model's outputs look" in c.evidence, c.evidence
    assert c.numbers["floor"] > (1.0 if back == 1 else 0.3081)       # (the whole prefixes' entropy is 0.3081)
@pytest.mark.parametrize("mask", ["torch.tril(torch.ones(9, 9))", "torch.eye(9)"])
def test_an_attention_whose_mask_hides_the_context_fails_overfit_and_says_so(tmp_path, mask):
    """A causal self-attention whose mask kept only the diagonal (``eye`` where ``tril`` was
    meant: each position sees itself alone) PASSed overfit at 'the targets' entropy given the
    last 1 token(s)', the lookback probe taking the bug for a bigram's design; it FAILs now,
    the cut context named, and the same model with its tril mask PASSes at whole prefixes."""
    script = write(tmp_path, "attn.py", NGRAM.replace("MODEL", f"Attn({mask})"))
    report, _ = run_check(script, steps=2, overfit_iters=300)
    c = by_name(report)["overfit"]
    if "tril" in mask:
        assert c.status == "PASS", (c.evidence, c.cause)
        assert "given their prefixes in the batch" in c.evidence, c.evidence
        return
    assert c.status == "FAIL", (c.evidence, c.cause)
    assert "given their prefixes in the batch" in c.evidence, c.evidence
    assert c.cause.startswith("the model cannot fit one small batch: its outputs at a position depend on the last "
                              "1 token(s) only, though it has an attention (a softmax of position against position) "
                              "over the 9 positions: a mask or state that cuts the context short"), c.cause


def test_a_warmup_written_by_hand_is_overfit_at_the_optimizers_lr_not_its_warm_start(tmp_path):
    """A warmup by hand (``param_group["lr"] = lr`` at each step, as LLMs from scratch's
    appendix D writes it) starts 1000x below the optimizer's lr: the replica trained at that
    first lr, 1e-05, and 'overfit' FAILed a healthy script ('loss 11.04 -> 10.80 after 300
    iteration(s)', likely cause 'a learning rate far too small'); at the optimizer's own lr,
    0.001, the same batch fell below its goal in 159."""
    script = write(tmp_path, "warmup.py", """
        import torch, torch.nn as nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))
        peak_lr, initial_lr, warmup_steps = 1e-2, 1e-5, 100
        opt = torch.optim.Adam(model.parameters(), lr=peak_lr)
        X = torch.randn(128, 10); Y = (X[:, 0] > 0).long() + (X[:, 1] > 0).long()
        for step in range(4):
            lr = initial_lr + step * (peak_lr - initial_lr) / warmup_steps
            for param_group in opt.param_groups:
                param_group["lr"] = lr
            i = torch.arange(step * 16, step * 16 + 16)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(X[i]), Y[i])
            loss.backward()
            opt.step()
        """)
    report, _ = run_check(script)
    over = by_name(report)["overfit"]
    assert over.status == "PASS", over.evidence
    assert "Adam(lr=0.01, the optimizer's own: the script's warmup by hand set 1e-05 at its first step)" \
        in over.evidence, over.evidence


def test_a_loss_of_several_calls_names_whose_first_value_it_gives(tmp_path):
    """Neural style transfer (an image optimised for a content loss, 0 at the start, plus a style
    loss): initial-loss said '(the first loss was 0)' where the step's loss was 2.803e-06; and
    'F.mse_loss is not a classification loss', where an MSE alone is judged against predicting 0:
    what the check cannot judge is one call's part of the step's loss (pytorch/examples'
    actor_critic: smooth_l1_loss 0.9839 of a backward() loss of 15.51 read the same)."""
    script = write(tmp_path, "style.py", """
        import torch, torch.nn as nn, torch.nn.functional as F
        torch.manual_seed(0)
        net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()).eval().requires_grad_(False)
        content, style = torch.rand(1, 3, 8, 8), torch.rand(1, 3, 8, 8)
        gram = lambda f: f.flatten(2) @ f.flatten(2).transpose(1, 2) / f[0].numel()
        target_c, target_s = net(content), gram(net(style))
        img = content.clone().requires_grad_(True)
        opt = torch.optim.Adam([img], lr=0.01)
        for step in range(3):
            f = net(img)
            loss = F.mse_loss(f, target_c) + 1000 * F.mse_loss(gram(f), target_s)
            opt.zero_grad(); loss.backward(); opt.step()
        """)
    report, _ = run_check(script, steps=2, overfit_iters=5)
    c = by_name(report)["initial-loss"]
    assert re.fullmatch(r"F\.mse_loss's reference, the loss of predicting 0 on its targets, is one call's, and "
                        r"the loss backward\(\) was given is not that call's alone \(its first value was 0; "
                        r"the first backward\(\) loss [0-9.e+-]+\): no reference value", c.evidence), c.evidence


def test_a_retry_still_falling_fast_is_inconclusive_unless_a_cause_was_seen(tmp_path):
    """makemore's bigram at its own AdamW lr 0.0005 FAILed 'cannot fit' after the retry at 10x
    (3.296 -> 2.191 in 300 iterations, goal 1.964, reached in 585): a retry most of the way down
    and still falling fast is inconclusive, as a first run that is (more iterations tell)."""
    script = write(tmp_path, "slow_bigram.py", NGRAM.replace("MODEL", "Bigram()").replace("lr=5e-2", "lr=5e-4"))
    report, _ = run_check(script, steps=2, overfit_iters=300)
    c = by_name(report)["overfit"]
    assert c.status == "SKIP" and report.exit_code == 0, c.evidence
    assert re.search(r"; at 10x the lr \(0\.005\) \S+ -> \S+ after 300 iteration\(s\), still falling \(\d+% in the "
                     r"last 75\): more iterations tell \(--overfit-iters N\)$", c.evidence), c.evidence
    assert c.numbers["faster_last"] > c.numbers["goal"]


# A DDPM's training step, the common tutorial shape: fresh noise and timesteps each step, the
# prediction given to the loss second (F.l1_loss(noise, noise_pred)).
DDPM = """
    import math, torch, torch.nn as nn, torch.nn.functional as F
    torch.manual_seed(0)
    T = 50
    alphas_cumprod = torch.cumprod(1 - torch.linspace(1e-4, 0.05, T), 0)

    class Denoiser(nn.Module):
        def __init__(self):
            super().__init__()
            self.time = nn.Linear(8, 32)
            self.net = nn.Sequential(nn.Linear(16, 32), nn.SiLU(), nn.Linear(32, 32), nn.SiLU(), nn.Linear(32, 16))
            BROKEN
        def forward(self, x, t):
            half = torch.exp(torch.arange(4) * -math.log(10000) / 3)
            emb = t[:, None].float() * half[None]
            h = self.net[0](x) + self.time(torch.cat([emb.sin(), emb.cos()], -1))
            return self.net[3:](self.net[2](self.net[1](h)))

    model = Denoiser()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.rand(64, 16) * 2 - 1
    for step in range(3):
        x0 = data[step * 16:(step + 1) * 16]
        t = torch.randint(0, T, (16,)).long()
        noise = torch.randn_like(x0)
        a = alphas_cumprod[t][:, None]
        x_noisy = a.sqrt() * x0 + (1 - a).sqrt() * noise
        noise_pred = model(x_noisy, t)
        loss = F.LOSS(noise, noise_pred)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item()!r}")
"""


@pytest.mark.parametrize("loss", ["mse_loss", "l1_loss"])
def test_a_loss_given_the_prediction_second_is_overfit_on_the_models_output(tmp_path, loss):
    """F.mse_loss(noise, noise_pred), as DDPM tutorials write it: overfit was SKIP 'F.mse_loss was not
    called on the model's output itself' (the prediction was taken to be the first argument).  The
    losses of |input - target| are the same either way round: the model's output is the prediction,
    and a model that cannot fit (its SiLU layer fed -100s, so the output is one vector) FAILs."""
    healthy = DDPM.replace("LOSS", loss).replace("BROKEN", "pass")
    report, out = run_check(write(tmp_path, "ddpm.py", healthy))
    checks = by_name(report)
    assert checks["shapes"].status == "PASS" and checks["shapes"].evidence == \
        f"F.{loss}: prediction (16, 16) vs target (16, 16)"
    over = checks["overfit"]
    assert over.status == "PASS", over.evidence
    assert over.evidence.startswith(f"16 sample(s), Adam(lr=0.001): loss {fmt(over.numbers['first'])}")
    assert re.search(r"step 0 loss (\S+)", out).group(1) == repr(over.numbers["first"])    # (the script's)
    broken = DDPM.replace("LOSS", loss).replace(
        "BROKEN", "nn.init.zeros_(self.net[2].weight); nn.init.constant_(self.net[2].bias, -100.0)")
    report, _ = run_check(write(tmp_path, "ddpm_dead.py", broken))
    assert by_name(report)["overfit"].status == "FAIL", by_name(report)["overfit"].evidence


@pytest.mark.parametrize("loss", ["mse_loss", "l1_loss"])
def test_a_regression_loss_starts_near_the_loss_of_predicting_0(tmp_path, loss):
    """An MSE on fresh unit noise starts near 1, its targets' mean square: initial-loss was SKIP
    ('not a classification loss: no reference value').  Now the reference is the loss of a zero
    prediction on the step's targets; outputs far larger than the targets (the last layer's weight
    x100: 42.09 against 0.8193 for MSE, 5.168 against 0.7062 for L1) FAIL."""
    report, out = run_check(write(tmp_path, "ddpm.py", DDPM.replace("LOSS", loss).replace("BROKEN", "pass")),
                            overfit_iters=5)
    c = by_name(report)["initial-loss"]
    first = float(re.search(r"step 0 loss (\S+)", out).group(1))
    assert c.status == "PASS" and c.numbers["loss"] == first, c.evidence
    assert c.evidence == f"{fmt(first)} vs {fmt(c.numbers['expected'])}, the loss of predicting 0 on these targets"
    assert 0.5 < c.numbers["expected"] < 1.5 and c.numbers["loss"] < 1.5 * c.numbers["expected"]
    report, _ = run_check(write(tmp_path, "loud.py", DDPM.replace("LOSS", loss).replace(
        "BROKEN", "self.net[4].weight.data *= 100")), overfit_iters=5)
    c = by_name(report)["initial-loss"]
    assert c.status == "FAIL" and "far larger than the targets" in c.cause, c.evidence


def test_a_warmup_from_0_is_no_cause_of_an_overfit_the_replica_ran_at_its_base_lr(tmp_path):
    """diffusers' get_cosine_schedule_with_warmup starts at lr 0: the replica is overfit at the base
    lr (Adam(lr=0.001)), yet a model that could not fit was said to fail for 'the learning rate is
    0', the script's first step's."""
    body = DDPM.replace("LOSS", "mse_loss").replace(
        "BROKEN", "nn.init.zeros_(self.net[2].weight); nn.init.constant_(self.net[2].bias, -100.0)").replace(
        "opt = torch.optim.Adam(model.parameters(), lr=1e-3)",
        "opt = torch.optim.Adam(model.parameters(), lr=1e-3)\n"
        "    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / 2))").replace(
        "opt.step()", "opt.step(); sched.step()")
    report, _ = run_check(write(tmp_path, "warm.py", body), overfit_iters=30)
    c = by_name(report)["overfit"]
    assert c.status == "FAIL" and c.evidence.startswith("16 sample(s), Adam(lr=0.001"), c.evidence
    assert "the learning rate is 0" not in c.cause, c.cause
    assert by_name(report)["updates"].status == "PASS"        # (its second step ran at 0.0005)


def test_zero_grad_of_gradients_the_script_writes_says_no_backward_ran():
    """Gradients by torch.autograd.grad written to .grad, no backward(): zero-grad said SKIP
    '... with a non-zero gradient: none was (more steps: --steps N)', of two steps whose
    gradients were not 0, and more steps said the same.  Nothing accumulates there: it says so."""
    script = os.path.join(ROOT, "tests", "scripts", "autograd_grad_loops.py")
    report, _ = run_check(script, "assign", overfit_iters=1)
    c = by_name(report)["zero-grad"]
    assert c.status == "SKIP" and c.evidence.startswith("no backward() ran: the script wrote .grad itself"), \
        text(report)
    assert by_name(report)["gradients"].status == "PASS", text(report)


HOOKED_GRADIENTS = """
    import torch, torch.nn as nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2))
    model[0].weight.register_hook(lambda g: torch.zeros_like(g))      # a gradient hook that zeroes it
    def drop(p):
        p.grad = None                                                  # one that drops it once made
    model[2].bias.register_post_accumulate_grad_hook(drop)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 10), torch.randint(0, 2, (64,))
    for step in range(2):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
"""


def test_gradients_made_none_or_zero_by_the_scripts_hook_name_the_hook(tmp_path):
    """The script's own hooks on a gradient zeroed the first layer's weight's and dropped the last
    bias's: the likely causes read 'dead ReLUs or a saturated activation upstream' (of the first
    layer: nothing is upstream) and 'detached ... or unused in the forward pass' (it was used, and
    backward() made its gradient).  They name the script's hook now."""
    report, _ = run_check(write(tmp_path, "hooked.py", HOOKED_GRADIENTS), overfit_iters=1)
    c = by_name(report)["gradients"]
    assert c.status == "FAIL" and "no gradient: 2.bias" in c.evidence and "all-zero gradient: 0.weight" in c.evidence
    assert c.cause.startswith("2.bias, 0.weight: the script's own hook on its gradient"), text(report)
    assert "dead ReLUs" not in c.cause and "detached" not in c.cause, text(report)


CHECKPOINT_WITHOUT_GRAD_INPUT = """
    import sys
    import torch, torch.nn as nn
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    head = nn.Linear(8, 1)
    opt = torch.optim.SGD([*block.parameters(), *head.parameters()], lr=0.1)
    for step in range(2):
        x = torch.randn(4, 8)          # (the data: no gradient)
        loss = head(checkpoint(block, x, use_reentrant=sys.argv[1] == "reentrant")).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
"""


def test_a_reentrant_checkpoint_given_no_input_that_requires_grad_is_named(tmp_path):
    """torch.utils.checkpoint(block, x, use_reentrant=True) with a batch that needs no gradient:
    the block runs under no_grad and its recomputation never comes, so its parameters get no
    gradient; the likely cause read 'detached (.detach(), .data, no_grad, a numpy round trip)
    or unused in the forward pass'.  It names a model that ran only without autograd, and the
    checkpoint; use_reentrant=False PASSes."""
    script = write(tmp_path, "ckpt.py", CHECKPOINT_WITHOUT_GRAD_INPUT)
    c = by_name(run_check(script, "reentrant", overfit_iters=1)[0])["gradients"]
    assert c.status == "FAIL" and "no gradient: block.0.weight, block.0.bias, block.2.weight, block.2.bias" \
        in c.evidence, c
    assert "the model holding them ran only without autograd" in c.cause and "use_reentrant=True" in c.cause, c
    assert by_name(run_check(script, "plain", overfit_iters=1)[0])["gradients"].status == "PASS"


def test_the_scripts_numbers_under_check_are_a_plain_runs_with_transformers_fused_paths():
    """nn.TransformerEncoder under no_grad in eval mode with a padding mask takes PyTorch's
    nested-tensor path (padded outputs exactly 0) only where no torch function mode is on
    the stack: check's loss watch stayed on it (entered as a TorchFunctionMode, unknown to
    the tracer's hooks), and the script printed 'loss 1.794581651687622 ... padded
    194.79522705078125' at step 0 where python prints 'loss 1.909196376800537 ... padded 0.0'."""
    from conftest import python
    script = os.path.join(ROOT, "tests", "scripts", "transformer_fast_paths.py")
    _, out = run_check(script)
    plain = python(script, "--steps", "2", forked=True).stdout
    assert "padded 0.0" in plain and out == plain


@pytest.mark.parametrize("shape, made", [("moco", "returned by Momentum"),
                                         ("simclr", "made by torch.zeros at contrastive_queue.py:64")])
def test_data_leaves_a_contrastive_losss_label_0_made_in_code_alone(shape, made):
    """MoCo's forward returns (logits, labels) with labels = torch.zeros(N): each row's positive
    is its logit 0; SimCLR's NT-Xent makes them so outside the model.  data said FAIL 'all 16
    targets are label 0 ... check the label pipeline' on both healthy loops: no data made them."""
    script = os.path.join(ROOT, "tests", "scripts", "contrastive_queue.py")
    report, _ = run_check(script, *(["--simclr"] if shape == "simclr" else []))
    c = by_name(report)["data"]
    n = 32 if shape == "simclr" else 16
    assert c.status == "PASS" and c.evidence.endswith(f"labels 0..0 (1 distinct of {n}), {made}: not data, "
                                                      "not judged"), text(report)


def test_overfit_skips_a_model_whose_forward_writes_its_own_queue_and_momentum_encoder():
    """MoCo's forward updates its key encoder (a momentum copy of the trained one, frozen) and
    writes its keys into a queue of negatives: trained on one batch, the queue fills with that
    batch's keys, and the loss cannot go down (0.9456 -> 1.726 in 300 iterations, 1.732 at 10x
    the lr).  overfit said FAIL 'the model cannot fit one small batch' on this healthy loop."""
    script = os.path.join(ROOT, "tests", "scripts", "contrastive_queue.py")
    report, _ = run_check(script)
    c = by_name(report)["overfit"]
    assert c.status == "SKIP" and "; but Momentum's forward changes its own state besides what the optimizer " \
        "trains (queue, encoder_k.1.weight, encoder_k.1.bias, encoder_k.2.weight and 3 more: a queue, a momentum " \
        "encoder, as MoCo's)" in c.evidence, text(report)


def test_data_leaves_the_range_of_a_diffusion_models_float_timesteps_alone():
    """A rectified-flow loop (diffusers' SD3 scripts' shape) gives its denoiser the timesteps as
    floats in [0, 1000), one a sample, for a sinusoidal embedding: data said FAIL 'inputs[1]
    reach 936.9 (beyond +-100) ... inputs are not normalised', and overfit named 'unnormalised
    inputs (see data)' as its likely cause."""
    script = os.path.join(ROOT, "tests", "scripts", "flow_matching_timesteps.py")
    report, _ = run_check(script)
    c = by_name(report)["data"]
    assert c.status == "PASS" and c.evidence.endswith("inputs[1] (8,) float32 in [160.6, 936.9], mean 556.0, std "
                                                      "273.1, one number a sample (a timestep, a noise level): its "
                                                      "range not judged"), text(report)
    assert "unnormalised" not in by_name(report)["overfit"].evidence, text(report)


@pytest.mark.parametrize("loop", ["handed_back", "written_into"])
def test_one_label_the_data_gave_is_still_judged_where_a_model_or_a_fill_touched_it(tmp_path, loop):
    """Labels a model is given and hands back (``return self.fc(x), y``), and a label buffer made
    by torch.zeros and then written from the data, are the data's: one label for every target
    stays FAIL there (dae672a's exception is for labels made in code, a contrastive loss's)."""
    body = {"handed_back": """
        class Net(nn.Module):
            def __init__(self):
                super().__init__(); self.fc = nn.Linear(8, 4)
            def forward(self, x, y):
                return self.fc(x), y
        model = Net(); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(64, 8), torch.zeros(64, dtype=torch.long)
        for step in range(3):
            out, t = model(x[:32], y[:32])
            loss = F.cross_entropy(out, t)
            opt.zero_grad(); loss.backward(); opt.step()
        """, "written_into": """
        model = nn.Linear(8, 4); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, column = torch.randn(32, 8), [2] * 32
        for step in range(3):
            y = torch.zeros(32, dtype=torch.long)
            for i in range(32):
                y[i] = column[i]
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
        """}[loop]
    script = write(tmp_path, "t.py", "import torch, torch.nn as nn, torch.nn.functional as F\n"
                   "torch.manual_seed(0)\n" + textwrap.dedent(body))
    report, _ = run_check(script)
    c = by_name(report)["data"]
    label = 0 if loop == "handed_back" else 2
    assert c.status == "FAIL" and c.evidence.startswith(f"all 32 targets are label {label}"), text(report)
