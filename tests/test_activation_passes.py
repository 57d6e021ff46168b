"""A step's activations are those of the forward passes its backward went through
(nndb.tracer.recorder, "forward passes"): a pass with autograd on that no backward
reaches (validation under model.eval() without no_grad(), a target network, rollouts
collected with autograd on) is no part of the step; passes a backward does reach
(two passes of one loss, micro-batches, a GAN's generator output used by both
optimizers' losses) all are.  The script prints its first layer's output over the
step's training inputs (computed under no_grad(), which nndb does not record): the
trace's activation row of that layer must equal it."""
import os
import re

import pytest

import nndb
from conftest import ROOT, nndb as run_nndb, python

SCRIPT = os.path.join(ROOT, "tests", "scripts", "activation_passes.py")
LINE = re.compile(r"step (\d+) acts (\d+) norm (\S+) loss")


def _printed(stdout: str) -> dict:
    return {int(s): (int(n), float(norm)) for s, n, norm in LINE.findall(stdout)}


@pytest.mark.parametrize("mode,layer,absent", [
    ("validate", "net.0", None),         # merged: 9,216 elements at steps 5, 10, 15 (the validation batch's 8,192)
    ("target", "model.net.0", "target"),  # the target network's rows, a pass no backward went through
    ("rollout", "net.0", None),          # merged: 1,120 (six acting passes of one row each)
    ("raised", "net.0", None),           # lost: no rows at steps 1, 5, 9, 13, 17 (the depth stayed up)
    ("fallback", "net.0", None),         # lost: no rows at all
    ("adapt", "model.net.0", None),      # lost: no rows at all (its pass ended after its step closed)
    ("saliency", "net.0", None),         # merged: 2,176 elements at steps 5, 10, 15 (the validation batch's 1,152)
    ("twopass", "net.0", None),
    ("accum", "net.0", None),
    ("gan", "G.net.0", None),
    ("gradapply", "net.0", None),        # (its gradients by torch.autograd.grad: the step's pass all the same)
])
def test_a_steps_activations_are_the_passes_its_backward_went_through(tmp_path, mode, layer, absent):
    trace = str(tmp_path / f"{mode}.h5")
    plain = python(SCRIPT, mode, "24", forked=True)
    assert plain.returncode == 0, plain.stderr
    r = run_nndb("run", "--batch", "-q", "--trace", trace, SCRIPT, mode, "24")
    assert r.returncode == 0, r.stderr
    assert r.stdout == plain.stdout                  # (the script's numbers, bit for bit)
    truth = _printed(plain.stdout)
    t = nndb.open(trace)
    acts = [x.name for x in t.tensors if x.kind == "act"]
    assert layer in acts, acts
    if absent is not None:
        assert not [a for a in acts if a == absent or a.startswith(absent + ".")], acts
    steps, counts = t.history(layer, "act", "count")
    _, norms = t.history(layer, "act", "norm")
    assert list(steps) == list(range(20)), steps     # (activations: the first 20 steps, then one in 32)
    for s, n, norm in zip(steps, counts, norms):
        assert (int(n), norm) == pytest.approx(truth[int(s)], rel=1e-6), (mode, int(s))


# char_rnn_classification's shape: the model's forward called as ``rnn.forward(x)``, so that
# each of its layers is a pass of its own, and an RNN whose outputs the loss does not use
# (its last hidden state only).  "named": the model is called and named ``rnn``, as its layer.
HIDDEN_STATE_ONLY = """
import sys
import torch, torch.nn as nn
torch.manual_seed(0)
class CharRNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.RNN(5, 8)
        self.h2o = nn.Linear(8, 3)
    def forward(self, x):
        out, hidden = self.rnn(x)
        return self.h2o(hidden[0])
rnn = CharRNN()
opt = torch.optim.SGD(rnn.parameters(), lr=0.1)
for i in range(3):
    loss = 0
    for length in (4, 6):
        x, y = torch.randn(length, 1, 5), torch.randint(0, 3, (1,))
        loss = loss + nn.functional.cross_entropy(rnn(x) if sys.argv[1] == "named" else rnn.forward(x), y)
        with torch.no_grad():
            out, hidden = rnn.rnn(x)
            print(i, out.numel(), repr(out.norm().item()), repr(rnn(x).norm().item()))
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.mark.parametrize("how", ["forward", "named"])
def test_an_rnn_whose_hidden_state_alone_is_used_has_its_activations(tmp_path, how):
    """forward: the RNN's pass, hooked on its first output only (out, which the loss does not
    use), was taken for one no backward went through: the rnn row was missing at every step.
    named: the layer ``rnn`` of the model the script names ``rnn``: one series, the model's
    output; the layer's is rnn.rnn.  So too under forward (the model was named by its
    forward's ``self``, the layer 'rnn')."""
    script = tmp_path / "char.py"
    script.write_text(HIDDEN_STATE_ONLY)
    trace = str(tmp_path / "t.h5")
    plain = python(str(script), how, forked=True)
    r = run_nndb("run", "--batch", "-q", "--trace", trace, str(script), how)
    assert r.returncode == 0 and r.stdout == plain.stdout, r.stderr
    rows = [line.split() for line in plain.stdout.splitlines()]
    layer = "rnn.rnn"
    t = nndb.open(trace)
    steps, counts = t.history(layer, "act", "count")
    _, norms = t.history(layer, "act", "norm")
    assert list(steps) == [0, 1, 2] and list(counts) == [80, 80, 80]     # (4 + 6 time steps of 8)
    for k, norm in enumerate(norms):
        a, b = (float(rows[2 * k + j][2]) for j in (0, 1))
        assert norm == pytest.approx((a * a + b * b) ** 0.5, rel=1e-5)
    if how == "named":
        _, model_norms = t.history("rnn", "act", "norm")
        for k, norm in enumerate(model_norms):
            a, b = (float(rows[2 * k + j][3]) for j in (0, 1))
            assert norm == pytest.approx((a * a + b * b) ** 0.5, rel=1e-5)


# char_rnn_classification's end: the model evaluated example by example with autograd on (no
# no_grad()) after the last step, on a step that records activations (the run's first 20, then
# one in 32: its 100,000 iterations end on one); a Tanh model, which the saturation probe reads.
EVALUATE_AFTER_TRAINING = """
import tracemalloc
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
opt = torch.optim.Adam(model.parameters())
x, y = torch.randn(32, 8), torch.randint(0, 4, (32,))
for step in range(4):                           # (trained: 4 steps)
    opt.zero_grad(); torch.nn.functional.cross_entropy(model(x), y).backward(); opt.step()
tracemalloc.start()
right = 0
for i in range(1000):
    out = model(x[i % 32:i % 32 + 1])           # (its graph goes as the next one comes)
    right += int(out.argmax().item() == y[i % 32].item())
grew = tracemalloc.get_traced_memory()[0]
print("right", right, "grew under 1 MB", grew < 1 << 20)
"""


def test_evaluations_with_autograd_on_after_the_last_step_are_let_go(tmp_path):
    """Each evaluation's forward pass waited for a backward that never came, with its
    activations, and the saturation probe kept every Tanh output's autograd node, and so its
    graph: the script's own measure of its memory grew by 4 MB over 1,000 evaluations under
    nndb (2 kB under python; char_rnn_classification's 16,000: 498 MB of resident memory for
    238).  A pass whose graph is gone can meet no backward: it leaves."""
    script = tmp_path / "evaluate.py"
    script.write_text(EVALUATE_AFTER_TRAINING)
    plain = python(str(script), forked=True)
    r = run_nndb("run", "--batch", "-q", "--trace", str(tmp_path / "t.h5"), str(script))
    assert r.returncode == 0, r.stderr
    assert r.stdout == plain.stdout and "grew under 1 MB True" in r.stdout, r.stdout
