"""The step's loss (issue 39, docs/steps.md): the sum of what its
backward() passes received, one per optimizer where several step on their
own objectives."""
import re

import pytest

from conftest import Ran, nndb, plain_and_recorded, python
from nndb.numbers import fmt
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
        total += loss.item()              # what this backward() received
    opt.step()
    if zero == "model":
        model.zero_grad()
    else:
        opt.zero_grad(set_to_none=True)
    # nanoGPT prints the last micro-step's loss times accum; the step's objective is the sum
    print(repr(total), repr(loss.item() * (accum if scaled else 1)))
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
    print(f"step {i} D {errD_real.item() + errD_fake.item()!r} G {errG.item()!r}")
"""


def test_a_gan_records_each_optimizers_loss_summed(tmp_path):
    """DCGAN's loop: optimizerD steps on errD_real + errD_fake (two backward()
    calls), optimizerG on errG.  Each optimizer's loss is recorded apart,
    the discriminator's as the sum of its two (it was their mean, Loss_D/2);
    a stop names both, ``$loss`` is the first (optimizerD's) and
    ``$losses`` has the other."""
    script = tmp_path / "gan.py"
    script.write_text(GAN)
    plain = python(str(script))
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
