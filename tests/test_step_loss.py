"""The step's loss and when a hand-written loop's step is seen (issue 39,
docs/steps.md): a step's loss is the sum of what its backward() passes
received, one per optimizer where several step on their own objectives;
in a loop with no optimizer a watch stops at the step whose value meets it,
and ``history`` holds that step."""
import json
import re

import numpy as np
import pytest

from conftest import Ran, nndb, plain_and_recorded, python
from nndb.text import fmt
from nndb.store.reader import TraceReader

ACCUMULATION = """
import sys
import torch
import torch.nn as nn
accum, scaled, zero = int(sys.argv[1]), sys.argv[2] == "scaled", sys.argv[3]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(1)
for step in range(5):
    total = 0.0
    for micro in range(accum):
        x = torch.randn(16, 8, generator=g)
        loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        if scaled:                        # nanoGPT: loss = loss / gradient_accumulation_steps
            loss = loss / accum
        loss.backward()
        total = total + loss.detach()     # what this backward() received, summed as torch sums it
    opt.step()
    if zero == "model":
        model.zero_grad()
    else:
        opt.zero_grad(set_to_none=True)
    # nanoGPT prints the last micro-step's loss times accum; the step's objective is the sum
    print(repr(total.item()), repr(loss.item() * (accum if scaled else 1)))
"""


@pytest.mark.parametrize("accum,scaled,zero", [(2, "scaled", "opt"), (4, "scaled", "model"),
                                               (2, "unscaled", "model"), (4, "unscaled", "opt")])
def test_accumulated_backward_passes_record_their_sum(tmp_path, accum, scaled, zero):
    """Gradient accumulation: the step's loss is the sum of the micro-batch
    losses each backward() received (scaled by 1/accum: the batch's mean
    loss), not their mean (1/accum of it: nanoGPT showed 1.111 for 4.458)."""
    plain, trace = plain_and_recorded(tmp_path, ACCUMULATION, str(accum), scaled, zero)
    printed = [[float(v) for v in line.split()] for line in plain.stdout.splitlines()]
    with TraceReader(trace) as t:
        assert list(t.steps) == list(range(5))
        assert list(t.backward_count) == [accum] * 5 and list(t.optimizer_steps) == [1] * 5
        loss = t.find("loss", "loss")[0]
        assert list(t.history(loss, "mean")[1]) == [total for total, _ in printed]
        assert list(t.history(loss, "count")[1]) == [1] * 5
        # the objective is not the last micro-batch's loss (what nanoGPT prints)
        assert any(total != last for total, last in printed)


GAN = """
import torch
import torch.nn as nn
torch.manual_seed(0)
netG = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
netD = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1), nn.Sigmoid())
criterion = nn.BCELoss()
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))
g = torch.Generator().manual_seed(1)
for i in range(5):
    netD.zero_grad()
    real = torch.randn(32, 2, generator=g) + 2
    label = torch.full((32, 1), 1.0)
    errD_real = criterion(netD(real), label)
    errD_real.backward()
    fake = netG(torch.randn(32, 4, generator=g))
    label.fill_(0.0)
    errD_fake = criterion(netD(fake.detach()), label)
    errD_fake.backward()
    optimizerD.step()
    netG.zero_grad()
    label.fill_(1.0)
    errG = criterion(netD(fake), label)
    errG.backward()
    optimizerG.step()
    errD = errD_real + errD_fake          # (dcgan's Loss_D: the two added as tensors, in float32)
    print(f"step {i} D {errD.item()!r} G {errG.item()!r}")
"""


def test_a_gan_records_each_optimizers_loss_summed(tmp_path):
    """DCGAN's loop: optimizerD steps on errD_real + errD_fake (two backward()
    calls), optimizerG on errG.  Each optimizer's loss is recorded apart,
    the discriminator's as the sum of its two (it was their mean, Loss_D/2);
    a stop names both, ``$loss`` is the first (optimizerD's) and
    ``$losses`` has the other."""
    script = tmp_path / "gan.py"
    script.write_text(GAN)
    plain = python(str(script), forked=True)
    printed = {int(m[1]): (float(m[2]), float(m[3]))
               for m in re.finditer(r"^step (\d+) D (\S+) G (\S+)$", plain.stdout, re.M)}
    trace = str(tmp_path / "gan.h5")
    argv = ["run", "--batch", "--trace", trace, "-e", "break step 2", "-e", "commands 1",
            "-e", "p 'LOSS', $loss", "-e", "p 'G', $losses['loss/optimizerG'].mean", "-e", "end", str(script)]
    r = Ran(nndb(*argv), argv)
    assert r.returncode == 0, r.stderr
    with TraceReader(trace) as t:
        assert list(t.steps) == list(range(5))
        assert list(t.backward_count) == [3] * 5 and list(t.optimizer_steps) == [2] * 5
        d = t.history(t.find("loss/optimizerD", "loss")[0], "mean")[1]
        g = t.history(t.find("loss/optimizerG", "loss")[0], "mean")[1]
    assert list(d) == [printed[i][0] for i in range(5)]
    assert list(g) == [printed[i][1] for i in range(5)]
    d2, g2 = printed[2]
    assert f"step 2 finished, loss/optimizerD {fmt(d2)}, loss/optimizerG {fmt(g2)}" in r.stdout
    assert f"('LOSS', {d2!r})" in r.stdout and f"('G', {g2!r})" in r.stdout
    r = nndb("inspect", trace, "--series", "loss")              # (no series 'loss': it says which there are)
    assert r.returncode == 2 and r.stderr.strip().endswith(
        "its losses are loss/optimizerD, loss/optimizerG (one per optimizer)"), r.stderr


REGRESSION = """
import sys
import torch
import torch.nn.functional as F
how = sys.argv[1]
torch.manual_seed(0)
W, b = torch.randn(4, 1) * 5, torch.randn(1) * 5
fc = torch.nn.Linear(4, 1)
for step in range(40):
    r = torch.randn(32)
    x = torch.stack([r ** i for i in range(1, 5)], 1)
    y = x.mm(W) + b.item()
    fc.zero_grad()
    out = F.smooth_l1_loss(fc(x), y)
    out.backward()
    g = fc.weight.grad.norm().item()
    if how == "data":                # pytorch/examples regression: through .data, outside autograd
        for p in fc.parameters():
            p.data.add_(-0.1 * p.grad)
    else:                            # under no_grad, the gradients let go
        with torch.no_grad():
            for p in fc.parameters():
                p.add_(p.grad, alpha=-0.1)
                p.grad = None
    print(f"step {step} loss {out.item()!r} grad {g!r}")
"""


def _first_steps(values: list, holds) -> list:
    """The steps where a watch hits: its condition holds there and did not
    at the step before (edge-triggered)."""
    return [i for i, v in enumerate(values) if holds(v) and (i == 0 or not holds(values[i - 1]))]


def _between(values: list, k: int) -> float:
    """A threshold between the k-th and (k+1)-th smallest values (no value near it)."""
    s = sorted(set(values))
    return (s[k] + s[k + 1]) / 2


@pytest.mark.parametrize("how", ["data", "no_grad"])
def test_a_hand_written_loop_stops_at_the_step_that_meets_the_watch(tmp_path, how):
    """No optimizer (p.data.add_(-lr * p.grad) after backward): the watch
    said 'at step 22' and stopped at the end of step 23 (its loss, which does
    not meet the condition; $step 23), and 'history' ended at step 22.  Now
    a loss or gradient watch stops at the end of the step whose value meets
    it, with $step, $loss and history at that step; an update watch, whose
    value comes at the next step's end, stops there and names its step."""
    script = tmp_path / "reg.py"
    script.write_text(REGRESSION)
    plain = python(str(script), how, forked=True)
    rows = [(int(m[1]), float(m[2]), float(m[3]))
            for m in re.finditer(r"^step (\d+) loss (\S+) grad (\S+)$", plain.stdout, re.M)]
    assert [s for s, _, _ in rows] == list(range(40))
    losses, grads = [v for _, v, _ in rows], [v for _, _, v in rows]
    lt, gt = _between(losses, 3), _between(grads, 3)
    ut = 0.1 * _between(grads, 36)                 # the update is lr x grad: a large one
    trace, report = str(tmp_path / "t.h5"), str(tmp_path / "r.json")
    argv = ["run", "--batch", "--trace", trace, "--report", report,
            "-e", f"watch loss mean < {lt!r}", "-e", f"watch grad weight norm < {gt!r}",
            "-e", f"watch update weight norm > {ut!r}",
            "-e", "commands 1", "-e", "p 'AT', $step, $loss", "-e", "history loss --last 1", "-e", "end",
            str(script), how]
    r = Ran(nndb(*argv), argv)
    assert r.returncode == 0, r.stderr
    assert "".join(m[0] + "\n" for m in re.finditer(r"^step \d+ loss .*$", r.stdout, re.M)) == plain.stdout
    with open(report, encoding="utf-8") as fh:
        stops = json.load(fh)["stops"]
    hits = {n: [(s["step"], s["detail"]["step"], s["detail"]["value"]) for s in stops if s["id"] == n]
            for n in (1, 2, 3)}
    want_loss = _first_steps(losses, lambda v: v < lt)
    assert want_loss and hits[1] == [(k, k, losses[k]) for k in want_loss]
    want_grad = _first_steps(grads, lambda v: v < gt)
    assert want_grad and [(s, k) for s, k, _ in hits[2]] == [(k, k) for k in want_grad]
    np.testing.assert_allclose([v for _, _, v in hits[2]], [grads[k] for k in want_grad], rtol=1e-6)
    # the update of step k is known at the end of step k + 1 (it is made after k's backward)
    want_update = [k for k in _first_steps(grads, lambda v: 0.1 * v > ut) if k < 39]   # (39's: at the run's end)
    assert want_update and [(s, k) for s, k, _ in hits[3]] == [(k + 1, k) for k in want_update]
    # at each loss stop: $step and $loss are the step's, and history ends there
    for k in want_loss:
        assert f"('AT', {k}, {losses[k]!r})" in r.stdout
    ends = [int(m) for m in re.findall(r"^loss mean, \d+ recorded step\(s\) 0\.\.(\d+)", r.stdout, re.M)]
    assert ends == want_loss


# An optimizer whose step() refuses gradients above a bound, raising; the script catches it
# and goes on (iteration 2).  The targets lose their last dimension from iteration 3 on.
RAISING_STEP = """
import torch, torch.nn as nn
torch.manual_seed(0)


class Checked(torch.optim.SGD):
    def step(self, closure=None):
        norm = torch.sqrt(sum((p.grad ** 2).sum() for g in self.param_groups for p in g["params"]))
        if norm > self.bound:
            raise RuntimeError(f"gradient norm {norm.item():.4f} above {self.bound}")
        return super().step(closure)


model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = Checked(model.parameters(), lr=0.05)
for i in range(6):
    opt.zero_grad()
    a = nn.functional.mse_loss(model(torch.randn(16, 4)), torch.randn(16, 1))
    a.backward()
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    if i >= 3:
        y = y.view(16)
    b = ((model(x) - y) ** 2).mean()
    b.backward()
    opt.bound = 1e-3 if i == 2 else 1e9
    try:
        opt.step()
        print("it", i, repr((a + b).item()))
    except RuntimeError as e:
        print("it", i, "skipped:", e)
"""


def test_an_optimizer_step_that_raised_leaves_the_next_steps_loss_and_loss_rules_whole(tmp_path):
    """A step() that raised (caught by the script) never ran its post hook: the recorder took
    the next losses as a closure's later calls, and kept only the first backward's (step 2's
    loss read 3.459 where the script's a + b is 3.4895), and the loss rules' watch stayed off
    the mode stack until the next step returned (the broadcast of iteration 3, in step 2, was
    found at step 3)."""
    plain, trace = plain_and_recorded(tmp_path, RAISING_STEP)
    printed = dict(re.findall(r"^it (\d+) (\S+)$", plain.stdout, re.M))
    assert "it 2 skipped" in plain.stdout
    with TraceReader(trace) as t:
        steps, values = t.history(t.find("loss", "loss")[0], "mean")
        findings = [f for f in t.records("finding") if f["rule"] == "loss_broadcast"]
    # step 2 is iterations 2 (its loss dropped by the zero_grad after it) and 3
    assert list(steps) == [0, 1, 2, 3, 4]
    assert list(values) == [np.float32(float(printed[i])) for i in ("0", "1", "3", "4", "5")]
    assert [f["step"] for f in findings] == [2], findings
