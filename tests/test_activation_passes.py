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
