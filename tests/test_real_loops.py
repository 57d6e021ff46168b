"""Loop shapes met in public training scripts (pytorch/examples, nanoGPT)
run through ``nndb run``: the script prints what plain Python prints, and
what nndb answers (the trace's loss, ``p $loss`` after ``goto``,
``reverse-continue``...) is the loss the plain run printed at that step."""
import importlib.util
import os
import re
import sys
import textwrap

import numpy as np
import pytest
import torch

from conftest import ROOT, Ran, nndb, plain_and_recorded, python
from nndb.text import fmt

# dcgan's shape as it comes (--workers 2): a DataLoader with worker processes,
# so nndb takes no fork checkpoints and replays from the start (respawn).
WORKERS = textwrap.dedent('''
    import sys
    import torch, torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(48, 4), torch.randn(48, 1))
    loader = DataLoader(data, batch_size=8, shuffle=False, num_workers=1)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (x, y) in enumerate(loader):
        if len(sys.argv) > 1 and step == int(sys.argv[1]):      # (the plain run of predict's --set)
            opt.param_groups[0]["lr"] = 0.5
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        print("step", step, repr(loss.item()))
''')


def _printed(out: str) -> dict:
    return {int(m[1]): m[2] for m in re.finditer(r"^step (\d+) (\S+)$", out, re.M)}


def test_reverse_continue_replays_from_the_start_without_checkpoints(tmp_path):
    """With DataLoader workers alive there are no fork checkpoints: ``goto``
    replayed from the start in a new process, but ``reverse-continue`` only
    searched the checkpoints' segments and said "No earlier step where a
    breakpoint or watchpoint held" (dcgan --workers 2: break step 12 and 20,
    rc from 20 stayed at 20, loss 0.5782 instead of step 12's 0.8484)."""
    script = tmp_path / "workers.py"
    script.write_text(WORKERS)
    plain = python(str(script), forked=True)
    assert plain.returncode == 0, plain.stderr
    argv = ["run", "--batch", "-q", "--trace", str(tmp_path / "t.h5"),
            "-e", "break step 2", "-e", "break step 4", "-e", "continue", "-e", "continue",
            "-e", "reverse-continue", "-e", "p $step", "-e", "p $loss", "-e", "present", "-e", "continue"]
    r = Ran(nndb(*argv, str(script), cwd=str(tmp_path)), argv)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert _printed(r.stdout) == _printed(plain.stdout)       # the live run's own output, whole
    past = r.stdout.split("In the past (timeline 0): ")[1].split("Back in the present")[0]
    assert past.startswith("step 2 finished"), r.stdout
    lines = past.splitlines()
    assert lines[-2:] == ["2", _printed(plain.stdout)[2]]       # p $step, p $loss: step 2's printed loss


def test_predict_with_dataloader_workers_replays_instead_of_forking(tmp_path):
    """``predict`` forked its replicas at the stop even with DataLoader workers
    alive: the forked iterator failed at once and predict answered "No step
    finished ... the script ended (failed: AssertionError: can only test a
    child process)" (dcgan --workers 2, predict 3 from step 20).  It predicts
    on a replica replayed to the stop now, with and without the change."""
    script = tmp_path / "workers.py"
    script.write_text(WORKERS)
    plain = _printed(python(str(script), forked=True).stdout)
    changed = _printed(python(str(script), "4", forked=True).stdout)     # lr 0.5 from step 4 on
    argv = ["run", "--batch", "-q", "--trace", str(tmp_path / "t.h5"),
            "-e", "break step 3", "-e", "continue", "-e", "predict 2 --set lr=0.5", "-e", "continue"]
    r = Ran(nndb(*argv, str(script), cwd=str(tmp_path)), argv)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "ended early" not in r.stdout, r.stdout
    assert _printed(r.stdout) == plain
    rows = {int(m[1]): (m[2], m[3]) for m in re.finditer(r"^(\d+)\s+(\S+)\s+(\S+)\s", r.stdout, re.M)}
    assert rows == {st: (f"{float(plain[st]):.6g}", f"{float(changed[st]):.6g}") for st in (4, 5)}, r.stdout
    assert rows[5][0] != rows[5][1]                              # the change made a difference


# pytorch/examples mnist_forward_forward: every layer has its own optimizer, all made
# first; each layer is trained alone for its epochs, then the next one.
STAGES = textwrap.dedent('''
    import torch, torch.nn as nn
    torch.manual_seed(0)
    layers = [nn.Linear(6, 8), nn.Linear(8, 8)]
    opts = [torch.optim.Adam(l.parameters(), lr=0.03) for l in layers]
    h = torch.randn(32, 6)
    for layer, opt in zip(layers, opts):
        for i in range(4):
            loss = torch.log1p(torch.exp(1.0 - LAYER(h).pow(2).mean(1))).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            print("step", repr(loss.item()))
        h = layer(h).detach()
''')


def _stages(tmp_path, call):
    from nndb.store.reader import TraceReader
    plain, trace = plain_and_recorded(tmp_path, STAGES.replace("LAYER", call))
    printed = [float(v) for v in re.findall(r"^step (\S+)$", plain.stdout, re.M)]
    with TraceReader(trace) as t:
        whole = ~t.partial
        steps, loss = t.history(t.find("loss", "loss")[0], "mean")
        return printed, list(t.optimizer_steps[whole]), list(t.backward_count[whole]), \
            [float(v) for s, v in zip(steps, loss) if whole[list(t.steps).index(s)]]


def test_optimizers_of_later_stages_made_first_each_step_is_a_step(tmp_path):
    """Two optimizers alive at the first step, but only the first steps (then
    only the second): the clock learnt a one-optimizer iteration as a cycle,
    which no other optimizer could take over, and the second layer's 4 steps
    made one step (optimizer_steps 4, loss 4.2526, the sum of its 4 losses)."""
    printed, opt_steps, backward, loss = _stages(tmp_path, "layer")
    assert opt_steps == [1] * 8 and backward == [1] * 8
    assert loss == printed


def test_first_loss_of_modules_called_through_forward(tmp_path):
    """A model whose layers the script calls through ``layer.forward(h)`` (as
    mnist_forward_forward does): no module hook sees them, so no parameter hook
    was on their parameters until the optimizer's first step, and step 0 had no
    loss (backward_count 0).  The backward wrapper, in from the start, takes a
    backward the parameter hooks did not see where an optimizer will step."""
    printed, opt_steps, backward, loss = _stages(tmp_path, "layer.forward")
    assert backward == [1] * 8
    assert loss == printed


# pytorch/examples mnist_rnn: nn.Dropout2d on a 2-D input; PyTorch warns (stacklevel 2) from
# F.dropout2d, naming its caller, torch's Dropout2d.forward; once, whichever dropout called it.
DROPOUT2D = textwrap.dedent('''
    import torch, torch.nn as nn, torch.nn.functional as F
    torch.manual_seed(0)
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(6, 8), nn.Linear(8, 3)
            self.dropout1, self.dropout2 = nn.Dropout2d(0.25), nn.Dropout2d(0.5)
        def forward(self, x):
            x = self.dropout1(torch.relu(self.fc1(x)))
            return F.log_softmax(self.fc2(self.dropout2(x)), dim=1)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    for step in range(4):
        opt.zero_grad()
        loss = F.nll_loss(model(x), y)
        loss.backward()
        opt.step()
        print("step", step, repr(loss.item()))
''')


def test_warning_of_a_torch_function_called_by_torch_names_torchs_line(tmp_path):
    script = tmp_path / "rnn.py"
    script.write_text(DROPOUT2D)
    plain = python(str(script), cwd=str(tmp_path))
    r = nndb("run", "--batch", "-q", "--trace", str(tmp_path / "t.h5"), str(script), cwd=str(tmp_path))
    assert plain.returncode == r.returncode == 0, r.stderr
    assert r.stdout == plain.stdout
    assert plain.stderr.count("UserWarning: dropout2d") == 1 and "dropout.py" in plain.stderr
    assert "".join(l for l in r.stderr.splitlines(True) if not l.startswith("nndb: ")) == plain.stderr


RAW_TENSORS = textwrap.dedent('''
    import torch
    torch.manual_seed(0)
    w = torch.randn(3, requires_grad=True)
    for i in range(5):
        loss = (w ** 2).sum()
        loss.backward()
        with torch.no_grad():
            w -= 0.1 * w.grad
            w.grad.zero_()
        print(i, repr(loss.item()))
''')


def test_a_loop_of_raw_tensors_is_recorded_and_travelled(tmp_path):
    """Tensors trained by hand outside any nn.Module, no optimizer (``w -= lr * w.grad``):
    the leaves the first backward reaches are the run's parameters, named by the script's
    variable; every step recorded as the script computed it; a breakpoint, $loss and
    reverse-step work on it as on a module's loop."""
    import nndb as api
    script = tmp_path / "raw.py"
    script.write_text(RAW_TENSORS)
    plain = python(str(script), cwd=str(tmp_path), forked=True)
    r = nndb("run", "--batch", "-q", "--trace", str(tmp_path / "t.h5"), str(script), cwd=str(tmp_path))
    assert plain.returncode == r.returncode == 0, r.stderr
    assert r.stdout == plain.stdout and "no training step" not in r.stderr
    printed = [float(line.split()[1]) for line in plain.stdout.splitlines()]
    t = api.open(str(tmp_path / "t.h5"))
    assert list(t.steps) == [0, 1, 2, 3, 4]
    assert t.series("loss", kind="loss", stat="mean").tolist() == printed
    torch.manual_seed(0)
    w = torch.randn(3, dtype=torch.float64)
    grads, values = [], []
    for _ in range(5):                   # (the same loop in float64: the grad is 2w, the update -0.2w)
        grads.append(float((2 * w).norm()))
        w = w - 0.1 * 2 * w
        values.append(float(w.norm()))
    np.testing.assert_allclose(t.series("w", kind="grad", stat="norm"), grads, rtol=1e-5)
    np.testing.assert_allclose(t.series("w", kind="param", stat="norm"), values, rtol=1e-5)
    np.testing.assert_allclose(t.series("w", kind="update", stat="norm"), [0.2 * g / 2 for g in grads], rtol=1e-5)
    r = nndb("run", "--batch", "--trace", str(tmp_path / "d.h5"), "-e", "break step 3", "-e", "continue",
             "-e", "p $loss", "-e", "rs 1", "-e", "p $loss", "-e", "kill", str(script), cwd=str(tmp_path))
    assert f"\n{printed[3]!r}\n" in r.stdout and f"\n{printed[2]!r}\n" in r.stdout.split("In the past")[1], r.stdout


# nn_tutorial's first two loops: tensors ``weights`` and ``bias`` trained by hand, then a
# model whose parameters have those names, trained by hand too.
RAW_TENSORS_THEN_A_MODEL = textwrap.dedent('''
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    weights = torch.randn(4, 1).requires_grad_()
    bias = torch.zeros(1, requires_grad=True)
    for i in range(3):
        loss = ((x @ weights + bias - y) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            weights -= weights.grad * 0.1
            bias -= bias.grad * 0.1
            weights.grad.zero_()
            bias.grad.zero_()
    class Logistic(nn.Module):
        def __init__(self):
            super().__init__()
            self.weights = nn.Parameter(torch.randn(4, 1))
            self.bias = nn.Parameter(torch.zeros(1))
        def forward(self, xb):
            return xb @ self.weights + self.bias
    model = Logistic()
    for i in range(3):
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        print(repr(model.weights.grad.norm().item()))
        with torch.no_grad():
            for p in model.parameters():
                p -= p.grad * 0.1
            model.zero_grad()
        print(repr(model.weights.norm().item()))
''')


def test_a_model_after_raw_tensors_of_its_parameters_names_has_series_of_its_own(tmp_path):
    """A model first seen after step 0, after tensors trained outside any module, is named
    by its variable (``model.weights``), as any root with parameters first seen later is:
    unqualified, its 'weights' was the tensors' name, and its parameters had no series (the
    'weights' series held the tensor the first loop left, norm 0.3815 at steps 3-5)."""
    import nndb as api
    plain, trace = plain_and_recorded(tmp_path, RAW_TENSORS_THEN_A_MODEL)
    printed = [float(v) for v in plain.stdout.split()]
    t = api.open(trace)
    assert list(t.steps) == list(range(6))
    np.testing.assert_allclose(t.series("model.weights", kind="grad", stat="norm")[3:], printed[0::2], rtol=1e-6)
    np.testing.assert_allclose(t.series("model.weights", kind="param", stat="norm")[3:], printed[1::2], rtol=1e-6)
    assert np.isnan(t.series("model.weights", kind="param", stat="norm")[:3]).all()


# The PyTorch tutorial's polynomial_autograd: four scalar tensors trained by hand.
POLYNOMIAL = textwrap.dedent('''
    import math
    import torch
    torch.manual_seed(0)
    x = torch.linspace(-math.pi, math.pi, 2000)
    y = torch.sin(x)
    a = torch.randn((), requires_grad=True)
    b = torch.randn((), requires_grad=True)
    c = torch.randn((), requires_grad=True)
    d = torch.randn((), requires_grad=True)
    for t in range(20):
        y_pred = a + b * x + c * x ** 2 + d * x ** 3
        loss = (y_pred - y).pow(2).sum()
        loss.backward()
        with torch.no_grad():
            for p in (a, b, c, d):
                p -= 1e-6 * p.grad
                p.grad = None
        print(t, repr(loss.item()))
''')


def test_watches_and_info_params_see_the_tensors_a_script_trains_outside_any_module(tmp_path):
    """The run's parameters of a raw-tensor loop (a, b, c, d) were recorded but not known
    to the watches' names nor to 'info params': 'watch weight a norm > 1.7' before the
    run failed with "no param tensor matches 'a'" (exit 2) where it stays pending, and at
    step 3 'watch weight *' and 'watch update a' were refused, 'info params' said "No
    parameters seen yet.".  The watch fires at the step whose norm the trace has over 1.7."""
    import nndb as api
    plain, _ = plain_and_recorded(tmp_path, POLYNOMIAL)
    argv = ["run", "--batch", "-q", "--trace", str(tmp_path / "t.h5"), "--force",
            "-e", "watch weight a norm > 1.7", "-e", "break step 3", "-e", "commands 2", "-e", "info params",
            "-e", "watch weight *", "-e", "watch update a", "-e", "end"]
    r = Ran(nndb(*argv, "script.py", cwd=str(tmp_path)), argv + ["script.py"])
    assert r.returncode == 0 and "matches" not in r.stderr, r.stderr
    assert re.findall(r"^\d+ \S+$", r.stdout, re.M) == plain.stdout.splitlines()
    listed = r.stdout.split("-> loss.backward()")[1]
    assert re.findall(r"^(\w) +\(\) +float32 +y ", listed, re.M) == ["a", "b", "c", "d"], r.stdout
    assert "Watchpoint 3: weight * norm" in r.stdout and "Watchpoint 4: update a norm" in r.stdout
    norms = api.open(str(tmp_path / "t.h5")).series("a", kind="param", stat="norm")
    first = int(np.flatnonzero(norms > 1.7)[0])
    m = re.search(r"Watchpoint 1: param a norm = ([\d.]+) \(> 1.7\) at step (\d+)", r.stdout)
    assert m and int(m[2]) == first and float(m[1]) == pytest.approx(norms[first], rel=1e-3), r.stdout



# A notebook's lectures trained by hand (no nn.Module, no optimizer): a first model of loose
# tensors, then a second made anew of the script's own layer classes while the first's
# tensors live on in the script's variables.
TWO_HAND_TRAINED_MODELS = textwrap.dedent('''
    import torch
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(42)
    x = torch.randn(64, 6, generator=g)
    y = torch.randint(0, 5, (64,), generator=g)
    W1 = (torch.randn((6, 16), generator=g) / 6**0.5).requires_grad_()
    W2 = (torch.randn((16, 5), generator=g) * 0.1).requires_grad_()
    parameters = [W1, W2]
    for i in range(4):
        loss = F.cross_entropy(torch.tanh(x @ W1) @ W2, y)
        print("a", i, repr(loss.item()))
        loss.backward()
        for p in parameters:
            p.data += -(0.5 if i < 2 else 0.1) * p.grad
            p.grad = None
    class Linear:
        def __init__(self, fan_in, fan_out):
            self.weight = torch.randn((fan_in, fan_out), generator=g) / fan_in**0.5
        def __call__(self, x):
            return x @ self.weight
    layers = [Linear(6, 16), Linear(16, 5)]
    parameters = [layer.weight for layer in layers]
    for p in parameters:
        p.requires_grad = True
    for i in range(5):
        loss = F.cross_entropy(layers[1](torch.tanh(layers[0](x))), y)
        for p in parameters:
            p.grad = None
        loss.backward()
        for p in parameters:
            p.data += -0.1 * p.grad
        print("b", i, repr(loss.item()), repr(layers[0].weight.grad.norm().item()))
''')


def test_a_second_model_trained_by_hand_after_the_first_is_recorded(tmp_path):
    """Tensors made anew after a loop that trained others by hand (a notebook's next lecture,
    an init cell run again): each backward of the new ones ends a step, as the first loop's
    did.  Their steps went unseen: the trace ended at step 3 of the 9 the script trained
    (makemore's part 3 notebook: 300 of 600).  The first model's tensors, alive in the
    script's W1 and W2, are no part of the later steps: no gradient their backward did not
    make, no update of 0 (param_not_updated named W1 and W2 at every step of the second)."""
    import nndb as api
    plain, trace = plain_and_recorded(tmp_path, TWO_HAND_TRAINED_MODELS)
    rows = [line.split() for line in plain.stdout.splitlines()]
    t = api.open(trace)
    assert list(t.steps) == list(range(9))
    assert t.series("loss", kind="loss", stat="mean").tolist() == [float(r[2]) for r in rows]
    assert [f["rule"] for f in t.findings] == []
    assert np.isnan(t.series("W1", kind="update", stat="norm")[4:]).all()
    assert np.isnan(t.series("W1", kind="grad", stat="norm")[4:]).all()
    assert not np.isnan(t.series("W1", kind="update", stat="norm")[:4]).any()
    np.testing.assert_allclose(t.series("layers.0.weight", kind="grad", stat="norm")[4:],
                               [float(r[3]) for r in rows[4:]], rtol=1e-6)
    assert np.isnan(t.series("layers.0.weight", kind="grad", stat="norm")[:4]).all()


# Tensors trained by hand, named as the script names them: a W trained once, made anew and
# trained again (a notebook's cell run twice); then a model of the script's own classes whose
# parameters are a list it loops over (``for p in parameters``).
HAND_TRAINED_NAMES = textwrap.dedent('''
    import torch
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(3)
    x = torch.randn(32, 4, generator=g)
    y = torch.randint(0, 3, (32,), generator=g)
    W = torch.randn((4, 3), generator=g, requires_grad=True)
    loss = F.cross_entropy(x @ W, y)
    W.grad = None
    loss.backward()
    W.data += -0.1 * W.grad
    print("once", repr(loss.item()))
    W = torch.randn((4, 3), generator=g, requires_grad=True)
    for k in range(3):
        loss = F.cross_entropy(x @ W, y)
        W.grad = None
        loss.backward()
        W.data += -1.0 * W.grad
        print("W", k, repr(loss.item()), repr(W.grad.norm().item()))
    class Linear:
        def __init__(self, fan_in, fan_out):
            self.weight = torch.randn((fan_in, fan_out), generator=g) / fan_in**0.5
            self.bias = torch.zeros(fan_out)
        def __call__(self, x):
            self.out = x @ self.weight + self.bias
            return self.out
        def parameters(self):
            return [self.weight, self.bias]
    class Tanh:
        def __call__(self, x):
            self.out = torch.tanh(x)
            return self.out
        def parameters(self):
            return []
    class Sequential:
        def __init__(self, layers):
            self.layers = layers
        def __call__(self, x):
            for layer in self.layers:
                x = layer(x)
            return x
        def parameters(self):
            return [p for layer in self.layers for p in layer.parameters()]
    model = Sequential([Linear(4, 8), Tanh(), Linear(8, 3)])
    parameters = model.parameters()
    for p in parameters:
        p.requires_grad = True
    for i in range(4):
        loss = F.cross_entropy(model(x), y)
        for p in parameters:
            p.grad = None
        loss.backward()
        lr = 0.5 if i < 2 else 0.05
        for p in parameters:
            p.data += -lr * p.grad
        print("model", i, repr(loss.item()), repr(model.layers[2].bias.grad.norm().item()))
''')


def test_tensors_trained_by_hand_are_named_as_the_script_names_them(tmp_path):
    """A tensor no module holds is named by the script's variable, but not a ``for`` loop's
    (``p`` named the last tensor of the list, and the others were ``tensor``, ``tensor2``...:
    makemore's wavenet notebook), else by its path through the script's objects
    (``model.layers.2.bias``), so that a watch can name it.  A W made anew goes on as ``W``
    (it was ``tensor2``)."""
    import nndb as api
    plain, trace = plain_and_recorded(tmp_path, HAND_TRAINED_NAMES)
    rows = [line.split() for line in plain.stdout.splitlines()]
    t = api.open(trace)
    assert list(t.steps) == list(range(8))
    assert sorted(s.name for s in t.tensors if s.kind == "grad") == [
        "W", "model.layers.0.bias", "model.layers.0.weight", "model.layers.2.bias", "model.layers.2.weight"]
    np.testing.assert_allclose(t.series("W", kind="grad", stat="norm")[1:4], [float(r[3]) for r in rows[1:4]],
                               rtol=1e-6)
    np.testing.assert_allclose(t.series("model.layers.2.bias", kind="grad", stat="norm")[4:],
                               [float(r[3]) for r in rows[4:]], rtol=1e-6)
    r = nndb("run", "--batch", "-q", "--trace", str(tmp_path / "w.h5"), "-e", "break step 4", "-e", "continue",
             "-e", "watch grad model.layers.2.bias norm < 0.08", "-e", "continue", "-e", "p $step", "-e", "kill",
             str(tmp_path / "script.py"), cwd=str(tmp_path))
    assert "Watchpoint 2: grad model.layers.2.bias norm = 0.07242 (< 0.08) at step 6" in r.stdout, r.stdout + r.stderr


# LBFGS over a tensor outside any module through a frozen model (neural style transfer's
# ``optimizer = optim.LBFGS([input_img])``, feature visualisation, adversarial inputs).
OPTIMIZED_INPUT = textwrap.dedent("""
    import torch, torch.nn as nn
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).eval()
    for p in net.parameters():
        p.requires_grad_(False)
    target = torch.randn(1, 2)
    image = torch.randn(1, 4, requires_grad=True)
    opt = torch.optim.LBFGS([image], lr=0.5, max_iter=5)
    for step in range(4):
        def closure():
            opt.zero_grad()
            loss = ((net(image) - target) ** 2).sum()
            loss.backward()
            return loss
        opt.step(closure)
        print("norms", step, repr(image.norm().item()), repr(image.grad.norm().item()))
""")


def test_info_params_lists_the_tensor_an_optimizer_trains_outside_any_module(tmp_path):
    """'info params' listed the frozen model's four parameters alone (grad n): the one tensor
    the optimizer trains, 'image' (norm 11.48, grad norm 0.0302 at step 2), was not in it."""
    plain, _ = plain_and_recorded(tmp_path, OPTIMIZED_INPUT)
    norms = {int(m[1]): (float(m[2]), float(m[3]))
             for m in re.finditer(r"^norms (\d+) (\S+) (\S+)$", plain.stdout, re.M)}
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "s.h5"), "-e", "break step 2",
                 "-e", "continue", "-e", "info params", "-e", "continue", "script.py", cwd=str(tmp_path)), [])
    rows = dict((m[0], m[1:]) for m in re.findall(r"^(\S+) +\(([\d, ]+)\) +float32 +(y|n) +(\S+) +(\S+)$",
                                                  r.stdout, re.M))
    assert set(rows) == {"0.weight", "0.bias", "2.weight", "2.bias", "image"}, r.stdout
    _, grad, norm, gnorm = rows["image"]
    assert grad == "y" and float(norm) == pytest.approx(norms[2][0], rel=1e-3) \
        and float(gnorm) == pytest.approx(norms[2][1], rel=1e-3), r.stdout

THROUGH_FORWARD = textwrap.dedent('''
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    x = torch.randn(32, 4)
    y = x.sum(1, keepdim=True)
    for step in range(5):
        h = x
        for layer in model:
            h = layer.forward(h)            # (no module hook sees these calls)
        loss = ((h - y) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.05 * p.grad
                p.grad = None
        print(step, repr(loss.item()))
''')


def test_a_models_layers_called_through_forward_without_an_optimizer_are_named_by_their_paths(tmp_path):
    """No optimizer, a model whose layers the script calls through ``.forward()``: the
    leaves its first backward reaches are the model's parameters, named by their paths in
    the script's ``model`` (not ``layer``, the loop's variable inside it), as a module hook
    would have named them; every step recorded, with the printed loss."""
    import nndb as api
    plain, trace = plain_and_recorded(tmp_path, THROUGH_FORWARD)     # (the same output, both exit 0)
    assert plain.returncode == 0
    t = api.open(trace)
    assert list(t.steps) == [0, 1, 2, 3, 4]
    assert t.series("loss", kind="loss", stat="mean").tolist() == [float(l.split()[1]) for l in plain.stdout.splitlines()]
    assert {x.name for x in t.tensors if x.kind == "grad"} == {"0.weight", "0.bias", "2.weight", "2.bias"}


RAW_TWO_ROOTS = textwrap.dedent('''
    import torch
    torch.manual_seed(0)
    x = torch.randn(64, 3)
    y = x @ torch.tensor([1.0, -2.0, 0.5])
    w = torch.zeros(3, requires_grad=True)
    for step in range(4):
        fit = ((x @ w - y) ** 2).mean()
        decay = 0.01 * (w ** 2).sum()
        torch.autograd.backward([fit, decay])
        with torch.no_grad():
            w -= 0.1 * w.grad
            w.grad = None
        print(step, repr((fit + decay).item()))
''')


def test_a_raw_tensor_loops_first_step_of_several_roots_has_their_sum_as_its_loss(tmp_path):
    """The backward that finds the leaves ends step 0 with the loss the later steps get:
    the objective of its roots (their sum), not none."""
    import nndb as api
    plain, trace = plain_and_recorded(tmp_path, RAW_TWO_ROOTS)       # (the same output, both exit 0)
    assert plain.returncode == 0
    printed = [float(line.split()[1]) for line in plain.stdout.splitlines()]
    np.testing.assert_allclose(api.open(trace).series("loss", kind="loss", stat="mean"), printed, rtol=1e-6)


NO_LEAF = textwrap.dedent('''
    import torch
    torch.manual_seed(0)
    x = torch.randn(3, requires_grad=True)
    for i in range(4):
        h = x * 2
        (h ** 2).sum().backward(inputs=[h])       # (a gradient of an intermediate only)
        print(i, float(h.grad.sum()))
''')


def test_backwards_that_reach_no_parameter_say_that_no_step_was_recorded(tmp_path):
    """No optimizer, no module, no leaf that the backward fills: no step is seen, and the
    run's end says so."""
    from nndb.store.reader import TraceReader
    script = tmp_path / "noleaf.py"
    script.write_text(NO_LEAF)
    plain = python(str(script), cwd=str(tmp_path), forked=True)
    r = nndb("run", "--batch", "-q", "--trace", str(tmp_path / "t.h5"), str(script), cwd=str(tmp_path))
    assert plain.returncode == r.returncode == 0, r.stderr
    assert r.stdout == plain.stdout
    assert "nndb: no training step was recorded: 4 backward() call(s) reached no parameter" in r.stderr
    with TraceReader(str(tmp_path / "t.h5")) as t:
        assert t.n_steps == 0


# gcn's shape (pytorch/examples): the features and the adjacency given as sparse tensors.
SPARSE_INPUT = textwrap.dedent('''
    import sys
    import torch, torch.nn as nn
    torch.manual_seed(0)
    N, F = 200, 32
    feat = (torch.rand(N, F) < 0.1).float() * 255      # raw pixel-like counts, not scaled
    adj = (torch.rand(N, N) < 0.05).float().to_sparse()
    y = torch.randint(0, 3, (N,))
    if sys.argv[1] == "sparse":
        feat = feat.to_sparse()

    class GCN(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = nn.Parameter(torch.randn(F, 16) * 0.1)
            self.w2 = nn.Parameter(torch.randn(16, 3) * 0.1)
        def forward(self, x, a):
            h = torch.relu(torch.spmm(a, torch.mm(x, self.w1)))
            return torch.spmm(a, h @ self.w2)

    model = GCN()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(4):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(feat, adj), y)
        loss.backward()
        opt.step()
        print("step", step, repr(loss.item()))
''')


def test_a_sparse_model_input_is_checksummed_and_probed_as_a_dense_one(tmp_path):
    """The cross-rank input checksum and the input probe failed on a sparse input ("reshape is not
    implemented for sparse tensors"): the probe went off, and input_range said nothing."""
    script = tmp_path / "gcn.py"
    script.write_text(SPARSE_INPUT)
    said = {}
    for layout in ("dense", "sparse"):
        plain = python(str(script), layout, cwd=str(tmp_path), forked=True)
        r = nndb("run", "--batch", "--trace", str(tmp_path / f"{layout}.h5"), str(script), layout,
                 cwd=str(tmp_path))
        assert r.returncode == plain.returncode == 0 and r.stdout == plain.stdout, r.stderr
        assert "failed" not in r.stderr and "internal error" not in r.stderr and " off " not in r.stderr, r.stderr
        said[layout] = re.findall(r"nndb: \w+: (input_range) at step (\d+): .*?range \[([-\d.e+]+), ([-\d.e+]+)\]",
                                  r.stderr)
    assert said["sparse"] and said["sparse"] == said["dense"], said


# dcgan's discriminator step (two backward() calls, the printed loss their float32 sum) and
# FGSM adversarial training (a backward for the input's gradient, then zero_grad(): the step
# trains on the second loss alone).
TWO_BACKWARDS = textwrap.dedent('''
    import sys
    import torch, torch.nn as nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(8):
        model.zero_grad()
        x = (torch.randn(16, 16) + 1).requires_grad_(True)
        first = model(x).pow(2).mean()
        first.backward()
        if sys.argv[1] in ("fgsm", "fgsm_clip"):
            x = (x + 0.1 * x.grad.sign()).detach()
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            if sys.argv[1] == "fgsm_clip":      # (in place: the last backward's gradients, scaled)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
        elif sys.argv[1] in ("pcgrad", "microbatch", "pcgrad_copy", "pcgrad_data"):
            # gradients of each backward kept by the script, zero_grad() between, and what it
            # applies written by hand: PCGrad's projection, DP-SGD's clipped per-micro-batch sum
            if sys.argv[1] == "pcgrad_copy":      # (the first pass's gradients clipped, in place)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 100.0)
            kept = [p.grad.clone() for p in model.parameters()]
            opt.zero_grad()
            second = (model(torch.randn(16, 16)) - 1).pow(2).mean()
            second.backward()
            for p, g in zip(model.parameters(), kept):
                if sys.argv[1].startswith("pcgrad"):
                    dot = (g * p.grad).sum()
                    new = g + p.grad - (dot / p.grad.pow(2).sum() * p.grad if dot < 0 else 0)
                    if sys.argv[1] == "pcgrad_copy":      # written into the last backward's tensor
                        p.grad.copy_(new)
                    elif sys.argv[1] == "pcgrad_data":    # new storage under the same tensor
                        p.grad.data = new
                    else:
                        p.grad = new
                else:
                    p.grad = (g / max(1.0, float(g.norm())) + p.grad / max(1.0, float(p.grad.norm()))) / 2
            loss = first + second
        else:
            second = (model(torch.randn(16, 16)) - 1).pow(2).mean()
            second.backward()
            loss = first + second
        opt.step()
        print("step", step, repr(loss.item()))
''')


@pytest.mark.parametrize("shape", ["sum", "fgsm", "fgsm_clip", "pcgrad", "microbatch", "pcgrad_copy", "pcgrad_data"])
def test_a_steps_loss_is_the_objective_its_optimizer_applies_as_the_script_prints_it(tmp_path, shape):
    """sum: the two losses added in float32, as the script adds them (the trace had their float64
    sum, 4 of 6 steps off in the last bits); fgsm: the loss before zero_grad() is no part of it
    (the trace had adv_loss + loss, ~2x the printed loss), clipped in place too (fgsm_clip);
    pcgrad, microbatch: zero_grad() came between the backward passes too, but the gradients
    applied are the script's own, made of both: the objective is the sum (the trace had the
    second loss alone), written into the last backward's gradient tensors too (pcgrad_copy:
    p.grad.copy_(...); pcgrad_data: p.grad.data = ...; $loss was the second loss alone)."""
    from nndb.store.reader import TraceReader
    plain, trace = plain_and_recorded(tmp_path, TWO_BACKWARDS, shape)
    printed = _printed(plain.stdout)
    with TraceReader(trace) as t:
        steps, losses = t.history(t.find("loss", "loss")[0], "mean")
    assert {int(s): repr(float(v)) for s, v in zip(steps, losses)} == printed
    script = tmp_path / "script.py"
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "s.h5"), "-e", "until 3",
                 "-e", 'p ("AT", repr($loss))', "-e", "info step", "-e", "continue", str(script), shape,
                 cwd=str(tmp_path)), [])
    assert re.search(r"\('AT', '([^']+)'\)", r.stdout).group(1) == printed[3], r.stdout
    assert re.search(r"^backward passes\s+2$", r.stdout, re.M), r.stdout



@pytest.mark.parametrize("shape", ["assign", "clip", "dict", "tasks", "scaled", "probe"])
def test_a_steps_loss_by_torch_autograd_grad_is_the_loss_it_differentiated(tmp_path, shape):
    """tests/scripts/autograd_grad_loops.py: gradients by torch.autograd.grad of the parameters,
    written to p.grad by hand, then optimizer.step(), no backward(): the trace had no loss
    series at all (every stop 'no loss recorded', $loss 'not measured', the loss rules and
    'watch loss' blind) where the script's loss at step 3 was 0.6013 (assign).  The loss of
    such calls is the step's where no backward() gave one (tasks: the two tasks' sum; scaled: the
    loss a GradScaler scaled, not that times 65536); a call before the step's own backward (probe:
    SAM's ascent) is no part of it."""
    script = os.path.join(ROOT, "tests", "scripts", "autograd_grad_loops.py")
    trace = str(tmp_path / "t.h5")
    r = nndb("run", "--batch", "-q", "--trace", trace, script, shape)
    assert r.returncode == 0, r.stderr
    printed = [line.split() for line in r.stdout.splitlines()]
    import nndb as api
    with api.open(trace) as t:
        steps, losses = t.history("loss", "loss", "mean")
        assert list(steps) == list(range(8)) and [repr(float(v)) for v in losses] == [p[2] for p in printed]
        np.testing.assert_allclose(t.history("0.weight", "grad")[1], [float(p[3]) for p in printed], rtol=1e-6)
    if shape == "assign":
        r = Ran(nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "s.h5"), "-e", "until 3",
                     "-e", 'p ("AT", repr($loss))', "-e", "kill", script, shape), [])
        assert f"('AT', '{printed[3][2]}')" in r.stdout, r.stdout


# A WGAN-GP whose critic's gradients come from torch.autograd.grad, written to p.grad (no
# backward()), two critic steps to a generator step: each critic step is a step, the
# generator's in the critic step after it; steps 1 and 3 close steps 0 and 2 after the fact.
WGAN_GRAD = textwrap.dedent('''
    import torch, torch.nn as nn
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    D = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 1))
    optG = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.9))
    optD = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.9))
    for it in range(3):
        for _ in range(2):
            real, fake = torch.randn(32, 2) + 1.0, G(torch.randn(32, 4)).detach()
            eps = torch.rand(32, 1)
            xh = (eps * real + (1 - eps) * fake).requires_grad_(True)
            g, = torch.autograd.grad(D(xh).sum(), xh, create_graph=True)
            lossD = D(fake).mean() - D(real).mean() + 10 * ((g.norm(2, dim=1) - 1) ** 2).mean()
            for p, gr in zip(D.parameters(), torch.autograd.grad(lossD, list(D.parameters()))):
                p.grad = gr
            optD.step()
            print("D", repr(lossD.item()))
        lossG = -D(G(torch.randn(32, 4))).mean()
        optG.zero_grad(); lossG.backward(); optG.step()
        print("G", repr(lossG.item()))
''')


def test_a_critic_step_by_torch_autograd_grad_that_closes_the_last_step_after_the_fact_has_its_loss(tmp_path):
    """The critic's second step of each of the first two iterations (steps 1 and 3) had no loss
    ('$losses' {}, 'no loss recorded' at its stop) where the script's lossD was 7.137 at step 1:
    its optimizer's step() closes the step before it after the fact, and the close dropped the
    torch.autograd.grad loss made since, the next step's."""
    import nndb as api
    (tmp_path / "wgan.py").write_text(WGAN_GRAD)
    trace = str(tmp_path / "t.h5")
    r = nndb("run", "--batch", "-q", "--nx", "--trace", trace, "wgan.py", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    d = [float(line.split()[1]) for line in r.stdout.splitlines() if line.startswith("D ")]
    g = [float(line.split()[1]) for line in r.stdout.splitlines() if line.startswith("G ")]
    with api.open(trace) as t:
        steps, losses = t.history("loss", "loss", "mean")
        assert list(steps)[:6] == list(range(6)) and [float(v) for v in losses][:6] == d, (steps, losses, d)
        steps, losses = t.history("loss/optG", "loss", "mean")
        assert list(steps)[:2] == [2, 4] and [float(v) for v in losses][:2] == g[:2], (steps, losses, g)


def test_a_micro_batch_whose_parameters_are_frozen_later_in_the_step_keeps_its_loss(tmp_path):
    """tests/scripts/toggle_accumulation.py: Lightning's toggle_optimizer with gradient
    accumulation.  The second micro-batch's backward found every parameter that needs a
    gradient without one (the first half frozen by then, holding its gradient), took the
    first micro-batch's loss for one zero_grad() had thrown away, and dropped it: $loss
    and the trace read 0.4868 at step 3, the script 1.5617."""
    from nndb.store.reader import TraceReader
    script = os.path.join(ROOT, "tests", "scripts", "toggle_accumulation.py")
    plain = python(script, forked=True)
    printed = _printed(plain.stdout)
    trace = str(tmp_path / "t.h5")
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--trace", trace, "-e", "until 3", "-e", 'p ("AT", repr($loss))',
                 "-e", "continue", script, cwd=str(tmp_path)), [])
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert re.search(r"\('AT', '([^']+)'\)", r.stdout).group(1) == printed[3], (r.stdout, printed)
    with TraceReader(trace) as t:
        steps, losses = t.history(t.find("loss", "loss")[0], "mean")
    assert {int(s): repr(float(v)) for s, v in zip(steps, losses)} == printed


@pytest.mark.parametrize("shape", [("interleaved", "--toggle"), ("sequential", "--toggle"), ("sequential",)])
def test_a_gan_whose_optimizers_both_accumulate_credits_each_loss_to_the_optimizer_it_reached(tmp_path, shape):
    """tests/scripts/gan_accumulation.py: a GAN whose two optimizers accumulate over two
    micro-batches each.  Where D's and G's micro-batches alternate (Lightning's
    toggle_optimizer with accumulate_grad_batches), every backward's loss went to the
    optimizer that stepped next: loss/optD was D1 + G1 + D2 (-0.9724 at step 0, the
    script's -0.6984) and loss/optG G2 alone (-0.2722 for -0.5462).  Each loss goes to the
    optimizer whose parameters its gradient reached; the sequential shape stays as it was."""
    from nndb.store.reader import TraceReader
    script = os.path.join(ROOT, "tests", "scripts", "gan_accumulation.py")
    args = ["--shape", *shape]
    plain = python(script, *args, forked=True)
    printed = {int(m[1]): (m[2], m[3]) for m in re.finditer(r"^step (\d+) (\S+) (\S+)$", plain.stdout, re.M)}
    trace = str(tmp_path / "t.h5")
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--trace", trace, "-e", "until 2", "-e", 'p ("AT", repr($loss))',
                 "-e", "p ('G', repr($losses['loss/optG'].mean))", "-e", "continue", script, *args,
                 cwd=str(tmp_path)), [])
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert re.search(r"\('AT', '([^']+)'\)", r.stdout).group(1) == printed[2][0], (r.stdout, printed)
    assert re.search(r"\('G', '([^']+)'\)", r.stdout).group(1) == printed[2][1], (r.stdout, printed)
    with TraceReader(trace) as t:
        assert list(t.backward_count) == [4] * 4 and list(t.optimizer_steps) == [2] * 4
        for i, name in enumerate(("loss/optD", "loss/optG")):
            steps, losses = t.history(t.find(name, "loss")[0], "mean")
            assert {int(s): repr(float(v)) for s, v in zip(steps, losses)} == \
                {s: v[i] for s, v in printed.items()}, (name, printed)


def test_a_gan_micro_batch_before_the_others_skipped_step_keeps_its_loss(tmp_path):
    """gan_accumulation.py --scaler: D's and G's micro-batches alternate under a GradScaler
    whose first scale overflows D's gradients only, so scaler.step(optD) skips D's first 3
    steps.  The skip took every loss pending then, G's first micro-batch with D's: G's loss
    (``loss``, first seen alone) read G2 alone at steps 0-2 (-0.2737 where the script's is
    -0.5477).  Its D rows are the steps D took (3 on), their loss D's micro-batches'."""
    from nndb.store.reader import TraceReader
    script = os.path.join(ROOT, "tests", "scripts", "gan_accumulation.py")
    args = ["--shape", "interleaved", "--toggle", "--scaler", "--steps", "6"]
    plain = python(script, *args, forked=True)
    printed = {int(m[1]): (m[2], m[3]) for m in re.finditer(r"^step (\d+) (\S+) (\S+)$", plain.stdout, re.M)}
    trace = str(tmp_path / "t.h5")
    r = nndb("run", "--batch", "-q", "--trace", trace, script, *args, cwd=str(tmp_path))
    assert r.returncode == 0 and r.stdout == plain.stdout, r.stderr
    with TraceReader(trace) as t:
        assert list(t.optimizer_steps) == [1, 1, 1, 2, 2, 2]
        history = {name: t.history(t.find(name, "loss")[0], "mean") for name in ("loss", "loss/optD")}
    assert {int(s): repr(float(v)) for s, v in zip(*history["loss"])} == {s: v[1] for s, v in printed.items()}
    assert {int(s): repr(float(v)) for s, v in zip(*history["loss/optD"])} == \
        {s: v[0] for s, v in printed.items() if s >= 3}


# An installed package that runs a model's training_step over the batches, with each optimizer
# wrapped and stepped in a function of its own whose argument is 'optimizer', the model its
# 'pl_module' (Lightning's Trainer, LightningOptimizer and precision plugin have this shape)
TRAINER_PACKAGE = textwrap.dedent("""
    def _step(optimizer):
        optimizer.step()

    class Wrapped:
        def __init__(self, optimizer):
            self._optimizer = optimizer
        def step(self):
            _step(self._optimizer)
        def zero_grad(self):
            self._optimizer.zero_grad()

    def fit(pl_module, batches):
        pl_module.wrapped = [Wrapped(o) for o in pl_module.configure_optimizers()]
        for i, batch in enumerate(batches):
            pl_module.training_step(batch, i)
""")

TRAINER_GAN = textwrap.dedent("""
    import torch, torch.nn as nn, torch.nn.functional as F
    from trainerlib import fit

    class GAN(nn.Module):
        def __init__(self):
            super().__init__()
            self.generator = nn.Sequential(nn.Linear(8, 16), nn.Tanh())
            self.discriminator = nn.Linear(16, 1)
        def forward(self, z):
            return self.generator(z)
        def configure_optimizers(self):
            return [torch.optim.Adam(self.generator.parameters(), 1e-3),
                    torch.optim.Adam(self.discriminator.parameters(), 1e-3)]
        def training_step(self, z, i):
            opt_g, opt_d = self.wrapped
            g_loss = F.binary_cross_entropy_with_logits(self.discriminator(self(z)), torch.ones(16, 1))
            opt_g.zero_grad(); g_loss.backward(); opt_g.step()
            d_loss = F.binary_cross_entropy_with_logits(self.discriminator(self(z).detach()), torch.zeros(16, 1))
            opt_d.zero_grad(); d_loss.backward(); opt_d.step()
            print(f"step {i} g {g_loss.item():.4f} d {d_loss.item():.4f}")

    torch.manual_seed(1)
    model = GAN()
    fit(model, [torch.randn(16, 8) for _ in range(3)])
""")


@pytest.mark.real_subprocess
def test_a_model_and_optimizers_an_installed_trainer_runs_are_named_by_the_scripts_variables(tmp_path):
    """A LightningModule-shaped GAN that an installed package trains: it calls the model's
    training_step, which steps the package's wrappers of its optimizers (``opt_g, opt_d =
    self.optimizers()``).  The optimizers were named by the package's own variable,
    'optimizer' and 'optimizer2' (in 'info optimizer', 'loss/optimizer', 'set lr ...
    optimizer NAME'), and the model by the method's 'self' (its output the series 'self';
    looking past it, the package's 'pl_module'), not by the script's 'opt_g', 'opt_d' (which
    hold the wrappers) and 'model'."""
    from nndb.store.reader import TraceReader
    userbase = tmp_path / "userbase"
    site_dir = userbase / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    site_dir.mkdir(parents=True)
    (site_dir / "trainerlib.py").write_text(TRAINER_PACKAGE)
    script = tmp_path / "gan.py"
    script.write_text(TRAINER_GAN)
    env = {"PYTHONUSERBASE": str(userbase), "PYTHONPATH": os.pathsep.join([str(site_dir), ROOT])}
    r = nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "t.h5"), "-e", "until 1",
             "-e", "info optimizer", "-e", "continue", str(script), cwd=str(tmp_path), env=env)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert re.findall(r"^(opt\S*)\s+Adam", r.stdout, re.M) == ["opt_d", "opt_g"], r.stdout
    with TraceReader(str(tmp_path / "t.h5")) as t:
        series = {(s.name, s.kind) for s in t.series()}
    assert {n for n, k in series if k == "loss"} == {"loss/opt_d", "loss/opt_g"}, series
    assert ("model", "act") in series and not {n for n, _ in series} & {"self", "pl_module"}, series


# A loss taken before optimizer.step(closure) whose gradients the step throws away before its
# closure runs: SAM's step(closure) (zero_grad, perturb, the closure at the perturbed weights,
# restore, the base optimizer's step: a step nested in the step) after the first pass, and a
# script that calls its closure once to print the loss, then LBFGS's step(closure).
LOSS_BEFORE_CLOSURE = textwrap.dedent("""
    import sys
    import torch, torch.nn as nn
    torch.manual_seed(0)

    class SAM(torch.optim.Optimizer):
        def __init__(self, params, rho=0.05, **kw):
            super().__init__(params, dict(rho=rho, **kw))
            self.base = torch.optim.SGD(self.param_groups, **kw)
            self.param_groups = self.base.param_groups

        @torch.no_grad()
        def step(self, closure):
            ps = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
            scale = self.param_groups[0]["rho"] / torch.stack([p.grad.norm() for p in ps]).norm()
            old = [p.clone() for p in ps]
            for p in ps:
                p.add_(p.grad * scale)
            self.zero_grad()
            with torch.enable_grad():
                closure()
            for p, o in zip(ps, old):
                p.copy_(o)
            self.base.step()

    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    def closure():
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        closure.loss = loss
        return loss
    if sys.argv[1] == "sam":
        opt = SAM(model.parameters(), lr=0.05, momentum=0.9)
    else:
        opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    for step in range(6):
        first = closure()
        opt.step(closure)
        # SAM: the loss at the perturbed weights, whose gradient the base optimizer applies;
        # LBFGS: the first call in step(), the one it returns (the same number as 'first')
        print("step", step, repr((closure.loss if sys.argv[1] == "sam" else first).item()))
""")


@pytest.mark.parametrize("shape", ["sam", "lbfgs"])
def test_a_loss_before_a_closure_step_that_resets_the_gradients_is_no_part_of_it(tmp_path, shape):
    """The first backward in optimizer.step(closure) was never asked whether zero_grad() had
    thrown the earlier loss's gradients away: that loss was added in (SAM: $loss 1.8331, the
    unperturbed 0.8791 + the perturbed 0.9541; LBFGS: 2 x the printed loss)."""
    from nndb.store.reader import TraceReader
    plain, trace = plain_and_recorded(tmp_path, LOSS_BEFORE_CLOSURE, shape)
    printed = _printed(plain.stdout)
    with TraceReader(trace) as t:
        steps, losses = t.history(t.find("loss", "loss")[0], "mean")
    assert {int(s): repr(float(v)) for s, v in zip(steps, losses)} == printed
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "s.h5"), "-e", "until 3",
                 "-e", 'p ("AT", repr($loss))', "-e", "rs", "-e", 'p ("BACK", repr($loss))', "-e", "continue",
                 str(tmp_path / "script.py"), shape, cwd=str(tmp_path)), [])
    assert re.search(r"\('AT', '([^']+)'\)", r.stdout).group(1) == printed[3], r.stdout
    assert re.search(r"\('BACK', '([^']+)'\)", r.stdout).group(1) == printed[2], r.stdout

# A loss that goes below zero (a Gaussian negative log-likelihood; a policy gradient's, a WGAN
# critic's): pytorch/examples reinforce.py's.
NEGATIVE_LOSS = textwrap.dedent('''
    import torch, torch.nn as nn
    torch.manual_seed(0)
    model = nn.Linear(4, 2)          # the mean and log-variance of a Gaussian
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    X = torch.randn(64, 4); Y = X.sum(1, keepdim=True)
    for step in range(90):
        opt.zero_grad()
        mu, logvar = model(X).chunk(2, dim=1)
        loss = (0.5 * (logvar + (Y - mu) ** 2 / logvar.exp())).mean()
        loss.backward()
        opt.step()
        print("step", step, repr(loss.item()))
''')


def test_a_negative_loss_is_shown_and_watched_with_its_sign(tmp_path):
    """The loss was shown (inspect --series, history) and watched as its norm, |loss|: -2.16 read
    2.16, and 'watch loss * < -0.5' never fired."""
    plain, trace = plain_and_recorded(tmp_path, NEGATIVE_LOSS)
    printed = {k: float(v) for k, v in _printed(plain.stdout).items()}
    first = min(k for k, v in printed.items() if v < -0.5)
    r = nndb("inspect", trace, "--series", "loss", "--json")
    import json
    got = json.loads(r.stdout)
    assert got["stat"] == "mean" and got["series"][0]["values"] == [printed[k] for k in range(90)]
    script = tmp_path / "script.py"
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "w.h5"), "-e", "watch loss * < -0.5",
                 "-e", "continue", "-e", "history loss --last 2", "-e", "kill", str(script), cwd=str(tmp_path)), [])
    assert re.search(rf"Watchpoint 1: loss mean = \S+ \(< -0.5\) at step {first}\b", r.stdout), r.stdout
    rows = re.findall(r"^(\d+)\s+(-?[\d.]+)$", r.stdout, re.M)
    assert [int(s) for s, _ in rows] == [first - 1, first] and float(rows[-1][1]) < -0.5, r.stdout


HOGWILD = textwrap.dedent('''
    import torch, torch.nn as nn
    import torch.multiprocessing as mp

    def train(rank, model):
        torch.manual_seed(rank)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(3):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()

    if __name__ == "__main__":
        model = nn.Linear(4, 1)
        model.share_memory()
        ps = [mp.Process(target=train, args=(r, model)) for r in range(2)]
        for p in ps:
            p.start()
        for p in ps:
            p.join()
        print("done")
''')


def test_training_in_other_processes_says_that_nothing_was_recorded(tmp_path):
    """mnist_hogwild: the model trains in torch.multiprocessing's processes; the run recorded 0
    steps and said nothing."""
    plain, trace = plain_and_recorded(tmp_path, HOGWILD)
    r = nndb("run", "--batch", "-q", "--trace", str(tmp_path / "h.h5"), str(tmp_path / "script.py"),
             cwd=str(tmp_path))
    assert r.returncode == 0 and r.stdout == plain.stdout == "done\n"
    assert "nndb: no training step was recorded: the script called no backward() and stepped no optimizer " \
           "in this process" in r.stderr, r.stderr


FUNC_ONLY = textwrap.dedent('''
    import torch, torch.nn as nn
    from torch.func import functional_call, grad_and_value
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    params = {k: v.detach() for k, v in model.named_parameters()}
    def loss_fn(p, x, y):
        return ((functional_call(model, p, (x,)) - y) ** 2).mean()
    for step in range(5):
        x = torch.randn(32, 8); y = x.sum(1, keepdim=True)
        g, loss = grad_and_value(loss_fn)(params, x, y)
        params = {k: params[k] - 0.05 * g[k] for k in params}
        print(step, repr(loss.item()))
''')


def test_gradients_of_torch_func_alone_say_why_nothing_was_recorded(tmp_path):
    """torch.func.grad's gradients applied by hand to a dict of tensors: no backward(), no
    optimizer, no step.  The run's end named only training in other processes as the cause."""
    plain, _ = plain_and_recorded(tmp_path, FUNC_ONLY)
    r = nndb("run", "--batch", "-q", "--trace", str(tmp_path / "f.h5"), str(tmp_path / "script.py"),
             cwd=str(tmp_path))
    assert r.returncode == 0 and r.stdout == plain.stdout and len(r.stdout.splitlines()) == 5
    assert "nor are gradients taken only by torch.func.grad or torch.autograd.grad and applied by hand" \
        in r.stderr, r.stderr


def test_a_launcher_that_runs_the_script_in_processes_of_its_own_is_named_with_what_to_run(tmp_path):
    """'nndb run -m torch.distributed.run ... SCRIPT' (and accelerate launch's module): the
    script trained in the launcher's child process and nndb said only that training in other
    processes is not traced; it names the launcher and what to run instead."""
    (tmp_path / "script.py").write_text(FUNC_ONLY.replace("grad_and_value(loss_fn)(params, x, y)",
                                                          "grad_and_value(loss_fn)(params, x, y)  # (any loop)"))
    r = nndb("run", "--batch", "-q", "--trace", str(tmp_path / "l.h5"), "-m", "torch.distributed.run",
             "--nproc-per-node", "1", "script.py", cwd=str(tmp_path))
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 5, r.stderr
    assert "; torchrun runs the script in processes of its own: run the script itself under nndb ('nndb run " \
           "SCRIPT ARGS', one process), or its ranks with 'nndb run --nproc-per-node N SCRIPT ARGS'" in r.stderr, r.stderr


SKIPPED_NAN = textwrap.dedent('''
    import torch, torch.nn as nn
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    X = torch.randn(32, 4); Y = X.sum(1, keepdim=True)
    for it in range(12):
        loss = nn.functional.mse_loss(model(X), Y)
        if it == 7:
            loss = loss * float("nan")           # a bad batch ...
        opt.zero_grad()
        loss.backward()
        if it != 7:                              # ... whose step the script skips
            opt.step()
        print("it", it, repr(loss.item()))
''')


def test_a_nan_loss_whose_step_the_script_skips_is_still_found(tmp_path):
    """The next zero_grad() throws the NaN backward's gradients away; its loss left the step's
    loss with them, and nothing (nonfinite, catch nan) said a NaN had come."""
    plain, trace = plain_and_recorded(tmp_path, SKIPPED_NAN)
    r = nndb("run", "--batch", "--trace", str(tmp_path / "n.h5"), str(tmp_path / "script.py"), cwd=str(tmp_path))
    assert "nndb: error: nonfinite at step 7: NaN first appeared in loss" in r.stderr, r.stderr


COMPILED = textwrap.dedent('''
    import torch, torch.nn as nn, torch._dynamo.testing
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    cnt = torch._dynamo.testing.CompileCounter()
    cmodel = torch.compile(model, backend=cnt)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    X = torch.randn(64, 8); Y = X.sum(1, keepdim=True)
    for step in range(12):
        opt.zero_grad()
        loss = nn.functional.mse_loss(cmodel(X), Y)
        loss.backward()
        opt.step()
        print("step", step, repr(loss.item()))
    print("graphs", cnt.frame_count, "ops", cnt.op_count // cnt.frame_count)
''')


COMPILED_HOOKED = textwrap.dedent('''
    import torch, torch.nn as nn, torch.nn.functional as F, torch._dynamo.testing
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2))
    acc = {}
    def hook(mod, args, out):                        # a user's hook, a graph break: .item()
        with torch.no_grad():
            n, s = acc.get(mod, (0, 0.0))
            acc[mod] = (n + out.numel(), s + out.detach().double().pow(2).sum().item())
    for layer in (model[0], model[2]):
        layer.register_forward_hook(hook)
    cnt = torch._dynamo.testing.CompileCounter()
    cmodel = torch.compile(model, backend=cnt)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    X, Y = torch.randn(32, 8), torch.randint(0, 2, (32,))
    for step in range(22):
        opt.zero_grad()
        loss = F.cross_entropy(cmodel(X[step % 4 * 8:(step % 4 + 1) * 8]), Y[step % 4 * 8:(step % 4 + 1) * 8])
        loss.backward()
        opt.step()
        print("step", step, repr(loss.item()), [s for _, s in acc.values()])
''')


def test_a_compiled_model_whose_hook_breaks_the_graph_runs_as_under_python(tmp_path):
    """A compiled model with a user's forward hook that calls .item() (a graph break): under
    nndb the script died at step 0 in Dynamo's resumed frame of the hook ('NoneType' object
    has no attribute 'item'; an acts helper's finding), where python ran it: the loss rules'
    function watch, a TorchFunctionMode, was on the mode stack, which Dynamo traces and
    guards (with Inductor, it also changed the hook's sums in their last digits).  The watch
    stays off the stack once torch.compile is in use."""
    plain, trace = plain_and_recorded(tmp_path, COMPILED_HOOKED)
    assert len(plain.stdout.splitlines()) == 22


def test_a_compiled_model_is_recorded_from_outside_and_never_crashed_into(tmp_path):
    """torch.compile'd: Dynamo traced nndb's module hooks (21 graphs where 1,
    31 lines of Dynamo's on stderr) and a module breakpoint or `step` killed
    the script (AssertionError from Dynamo).  Now the hooks do nothing while
    it traces: the compiled graph is the script's own (its ops, compiled once),
    stderr is the script's, the parameters are named as the script names
    them (``2.weight``, not ``_orig_mod.2.weight``), a watch on them fires,
    and a breakpoint or an activation watch inside the compiled model says
    why it never stopped (the watch said nothing: its module's activations
    were never recorded, so it never hit, as on a healthy module)."""
    script = tmp_path / "compiled.py"
    script.write_text(COMPILED)
    plain = python(str(script))
    assert plain.returncode == 0 and plain.stderr == "", plain.stderr
    r = nndb("run", "--batch", "--trace", str(tmp_path / "t.h5"), "-e", "step", "-e", "break module 2 forward",
             "-e", "watch grad 2.weight norm < 100", "-e", "watch act 0 norm > 0", "-e", "continue", "-e", "continue",
             str(script))
    assert r.returncode == 0, r.stderr
    steps = [line for line in r.stdout.splitlines() if line.startswith("step ")]
    assert steps == [line for line in plain.stdout.splitlines() if line.startswith("step ")]
    assert plain.stdout.splitlines()[-1] == "graphs 1 ops 3"
    assert r.stdout.splitlines()[-1] == "graphs 1 ops 3"        # (the same graph, compiled once)
    assert "Step 0, module cmodel backward" in r.stdout                   # (`step`: into the compiled model's call)
    assert "Watchpoint 2: grad 2.weight norm = " in r.stdout
    lines = [s for s in r.stderr.splitlines() if s.strip() and not s.startswith("nndb: recording to ")]
    assert lines == ["nndb: breakpoint 1 (module 2 forward) never stopped: 2 runs inside cmodel, compiled by "
                     "torch.compile, where nndb's module hooks do not look (break on the compiled module, or run "
                     "the model uncompiled)",
                     # (an activation watch there never hit either: it said nothing, as if they were fine)
                     "nndb: watchpoint 3 (act 0 norm > 0) never stopped: 0 runs inside cmodel, compiled by "
                     "torch.compile, where nndb's module hooks do not look (watch the compiled module's output, or "
                     "run the model uncompiled)"], r.stderr
    import nndb as api
    with api.open(str(tmp_path / "t.h5")) as t:
        assert sorted(t.stats(3)["param"]) == ["0.bias", "0.weight", "2.bias", "2.weight"]
        assert float(t.stats(3)["loss"]["loss"]["mean"]) == float(_printed(plain.stdout)[3])
        # (the compiled module's output, once: not again as its _orig_mod's, whose hooks run as Python)
        assert sorted({i.name for i in t.tensors if i.kind == "act"}) == ["cmodel"]



COMPILED_STEP_HOOKED = textwrap.dedent('''
    import torch, torch.nn as nn, torch._dynamo.testing
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    sums = []
    model[1].register_forward_hook(lambda m, a, out: sums.append(out.sum().item()))   # a graph break
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    cnt = torch._dynamo.testing.CompileCounter()
    X, Y = torch.randn(32, 8), torch.randint(0, 2, (32,))

    @torch.compile(backend=cnt)
    def train_step(x, y):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss

    for step in range(24):
        opt.zero_grad()
        loss = train_step(X, Y)
        opt.step()
        print("step", step, repr(loss.item()), repr(sums[-1]))
    print("graphs", cnt.frame_count)
''')


def test_a_compiled_train_step_is_compiled_as_under_python(tmp_path):
    """A compiled train step (a function, not a module) whose user hook breaks the graph:
    Dynamo compiled 14 graphs where python compiles 10.  The loss rules' function watch, a
    TorchFunctionMode, was on the mode stack as the step was first compiled: Dynamo traced
    into nndb's __torch_function__ (three of its frames compiled and recompiled), and
    recompiled the step, the model's ReLU, the hook and the resumed frame when the watch
    left the stack.  The watch now leaves as Dynamo starts compiling anything (its
    compile-start callback), and is not pushed again."""
    plain, trace = plain_and_recorded(tmp_path, COMPILED_STEP_HOOKED)
    assert plain.stdout.splitlines()[-1] == "graphs 10", plain.stdout


COMPILED_STEPS = textwrap.dedent('''
    import sys
    import torch, torch.nn as nn, torch._dynamo.testing
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    X = torch.randn(32, 8); Y = X.sum(1, keepdim=True)
    cnt = torch._dynamo.testing.CompileCounter()

    def train_step(x, y):                # the whole step compiled (graph breaks at backward, step)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    def opt_step():                      # PyTorch's compiled-optimizer recipe
        opt.step()

    if sys.argv[1] == "step":
        train_step = torch.compile(train_step, backend=cnt)
    else:
        opt_step = torch.compile(opt_step, backend=cnt)

        def train_step(x, y):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt_step()
            return loss
    for step in range(8):
        loss = train_step(X, Y)
        print("step", step, repr(loss.item()))
    print("graphs", cnt.frame_count, "ops", cnt.op_count)
''')


@pytest.mark.parametrize("shape", ["step", "optimizer"])
def test_a_compiled_step_or_optimizer_step_runs_nndb_s_hooks_as_python(tmp_path, shape):
    """torch.compile compiled nndb's own frames where its hooks ran inside a
    compiled function (the optimizer hooks of a compiled train step or of a
    compiled ``optimizer.step``): 32 graphs where the script has 3, Dynamo's
    warnings on stderr (``sys._getframe``...), a rule failed (its numpy
    traced as tensors), and "internal error in the tracer; recording stopped":
    no step recorded, `break step 5` never stopped.  Now the hooks run as
    Python, as around an uncompiled step: the script's graphs (the same
    count), its stderr, every step recorded with its printed loss."""
    script = tmp_path / "compiled_steps.py"
    script.write_text(COMPILED_STEPS)
    plain = python(str(script), shape)
    assert plain.returncode == 0, plain.stderr
    trace = str(tmp_path / "t.h5")
    r = nndb("run", "--batch", "--trace", trace, "-e", "break step 5", "-e", "continue", "-e", "p $loss",
             "-e", "info params", "-e", "reverse-step", "-e", "p $loss", "-e", "present", "-e", "continue",
             str(script), shape)
    assert r.returncode == 0, r.stderr
    printed = _printed(plain.stdout)
    assert [s for s in r.stdout.splitlines() if s.startswith(("step ", "graphs "))] == \
        [s for s in plain.stdout.splitlines() if s.startswith(("step ", "graphs "))]
    assert f"\n{printed[5]}\n" in r.stdout and f"\n{printed[4]}\n" in r.stdout, r.stdout
    # (torch's log names its file relative to the first sys.path entry holding
    # it: nndb's runs here get the checkout on PYTHONPATH, the plain run not,
    # so a venv inside the checkout reads ".venv/lib/.../torch/...": CI's)
    def frames(err): return [re.sub(r"^\S+ \S+ \d+ \S*?(?=torch/)|\[\d+/\d+\] ", "", s) for s in err.splitlines()
                             if s.strip() and not s.startswith("nndb: recording to ")]
    assert frames(r.stderr) == frames(plain.stderr), r.stderr
    import nndb as api
    with api.open(trace) as t:
        steps, losses = t.history("loss", "loss", "mean")
        assert list(steps) == list(range(8))
        assert [float(v) for v in losses] == [float(printed[i]) for i in range(8)]
        # (the model runs inside the compiled step, where no module hook sees it: its parameters
        # are its own, as uncompiled, not loose tensors 'model.0.weight' that `info params` left out)
        assert sorted({i.name for i in t.tensors if i.kind == "grad"}) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert re.search(r"^0\.weight +\(16, 8\) +float32 +y ", r.stdout, re.M), r.stdout

LAYER_BY_LAYER = textwrap.dedent('''
    import sys
    import torch, torch.nn as nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(4):
        x, y = torch.randn(16, 4), torch.randn(16, 1)
        if sys.argv[1] == "loop":
            h = x
            for layer in model:                  # each layer in turn, by a loop variable
                h = layer(h)
        else:
            h = model[2](model[1](model[0](x)))  # each layer called on its own
        loss = nn.functional.mse_loss(h, y)
        opt.zero_grad(); loss.backward(); opt.step()
        print("step", step, repr(loss.item()))
''')


@pytest.mark.parametrize("shape", ["loop", "index"])
def test_layers_called_one_by_one_are_named_by_their_path_in_the_model(tmp_path, shape):
    """They were named by their class or the loop's variable ('linear.weight',
    'layer3.weight'), so `watch grad 0.weight` stayed pending; now by their
    path in the model a variable holds, as model.named_parameters() names them."""
    plain, trace = plain_and_recorded(tmp_path, LAYER_BY_LAYER, shape)
    import nndb as api
    with api.open(trace) as t:
        assert sorted({i.name for i in t.tensors if i.kind == "grad"}) == ["0.bias", "0.weight", "2.bias", "2.weight"]
        assert sorted({i.name for i in t.tensors if i.kind == "act"}) == ["0", "1", "2"]


SLICES = textwrap.dedent('''
    import torch, torch.nn as nn
    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
    for p in cnn.parameters():
        p.requires_grad_(False)                  # a frozen feature extractor (a perceptual loss's)
    head = nn.Linear(16, 2)
    opt = torch.optim.Adam(head.parameters(), lr=1e-2)
    x, y = torch.randn(32, 8), torch.randint(0, 2, (32,))
    for step in range(30):
        feats = cnn[:2](x)                       # a slice: a new nn.Sequential at every call
        loss = nn.functional.cross_entropy(head(cnn[2:](feats)), y)
        opt.zero_grad(); loss.backward(); opt.step()
        print("step", step, repr(loss.item()))
''')


def test_slices_of_a_model_are_named_in_it_and_make_no_series_of_their_own(tmp_path):
    """``cnn[:2](x)`` makes a new container at every call: each was a new root, 'sequential',
    'sequential2' ... 'sequential42', an activation series a call without end, and cnn's
    layers were named 'sequential.0.weight' and 'sequential2.2.weight' in info params."""
    plain, trace = plain_and_recorded(tmp_path, SLICES)
    import nndb as api
    with api.open(trace) as t:
        assert sorted({i.name for i in t.tensors if i.kind == "act"}) == ["cnn.0", "cnn.1", "cnn.2", "cnn.3", "head"]
        assert sorted({i.name for i in t.tensors if i.kind == "param"}) == \
            ["cnn.0.bias", "cnn.0.weight", "cnn.2.bias", "cnn.2.weight", "head.bias", "head.weight"]
        losses = t.history("loss", "loss", "mean")[1]
    assert [repr(float(v)) for v in losses] == [line.split()[2] for line in plain.stdout.splitlines()]
    r = nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "i.h5"), "-e", "break step 3",
             "-e", "continue", "-e", "info params", "-e", "kill", str(tmp_path / "script.py"))
    names = re.findall(r"^(\S+)\s+\(", r.stdout, re.M)
    assert names == ["cnn.0.weight", "cnn.0.bias", "cnn.2.weight", "cnn.2.bias", "head.weight", "head.bias"], r.stdout


WARNS_AND_WRAPS = textwrap.dedent('''
    import warnings
    import torch, torch.nn as nn

    class Wrapper(nn.Module):                    # DDP's shape: the model as .module, nothing else
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, x):
            return self.module(x)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    wrapped = Wrapper(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(70):
        warnings.warn("the script's own warning")   # shown once: Python's once-per-line default
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
    print("done")
''')


def test_the_scripts_warnings_show_once_and_a_wrapped_model_keeps_its_names(tmp_path):
    """nndb added its warnings filter each time its module hooks went in (every
    observed step), and each change of the filters made Python show a
    once-per-line warning again (3 times in 70 steps); a model a wrapper also
    holds (DDP's shape) is named as the model, not as the wrapper's 'module.'."""
    script = tmp_path / "w.py"
    script.write_text(WARNS_AND_WRAPS)
    plain = python(str(script))
    r = nndb("run", "--batch", "-q", "--trace", str(tmp_path / "t.h5"), str(script))
    assert r.returncode == 0, r.stderr
    assert plain.stderr.count("UserWarning: the script's own warning") == 1
    assert r.stderr.count("UserWarning: the script's own warning") == 1, r.stderr
    import nndb as api
    with api.open(str(tmp_path / "t.h5")) as t:
        assert sorted({i.name for i in t.tensors if i.kind == "grad"}) == ["0.bias", "0.weight", "2.bias", "2.weight"]



DATA_PARALLEL = textwrap.dedent('''
    import torch, torch.nn as nn
    torch.manual_seed(0)
    model = nn.DataParallel(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(6):
        x = torch.randn(16, 4)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        print("step", step, repr(loss.item()))
''')


def test_globs_written_for_the_model_select_its_tensors_inside_a_dp_sgd_wrapper(tmp_path):
    """Opacus's make_private wraps the model in a GradSampleModule that holds it as ``_module``:
    its tensors are '_module.0.weight', and ``watch grad 0.weight norm > 0.33`` stayed pending
    for the whole run ('no grad tensor matched '0.weight'') where '_module.0.weight' had norm
    0.3387 at step 13; ``$grad['0.weight']`` was 'no grad tensor named'.  The glob matches
    the name inside that wrapper too (tests/scripts/dp_sgd_hooks.py: its shape, torch alone)."""
    script = os.path.join(ROOT, "tests", "scripts", "dp_sgd_hooks.py")
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--rules", "none", "--trace", str(tmp_path / "t.h5"),
                 "-e", "watch grad 0.weight norm > 0", "-e", "continue", "-e", "p ('AT', $grad['0.weight'].norm)",
                 "-e", "p ('HAS', model._module[0].weight.grad.norm().item())", "-e", "kill", script), [])
    out = r.stdout + r.stderr
    assert "Watchpoint 1: grad _module.0.weight norm = " in out and "pending" not in out, out
    at = float(re.search(r"\('AT', (\S+)\)", r.stdout).group(1))
    assert at == pytest.approx(float(re.search(r"\('HAS', (\S+)\)", r.stdout).group(1)), rel=1e-6), out


def test_globs_written_for_the_model_select_its_tensors_inside_a_data_parallel_wrapper(tmp_path):
    """DDP and DataParallel name the model's tensors from the wrapper ('module.0.weight'):
    ``watch grad 0.weight norm > 0`` under torchrun stayed pending for the whole run
    ('no grad tensor matched') where the same -x file hit at step 0 in one process, and
    ``break module 0``, ``$grad['0.bias']``, ``--record-full grad:2.*`` and ``nndb plot
    --glob`` likewise found nothing.  The glob matches the name inside the wrapper too
    (DataParallel on the CPU names them as DDP does, in one process)."""
    script = tmp_path / "dp.py"
    script.write_text(DATA_PARALLEL)
    plain = python(str(script))
    t = str(tmp_path / "t.h5")
    r = Ran(nndb("run", "--batch", "--trace", t, "--record-full", "grad:2.*",
                 "-e", "watch grad 2.weight norm > 0", "-e", "break module 0", "-e", "continue",
                 "-e", "continue", "-e", "p $grad['0.bias'].norm", "-e", "delete", "-e", "continue",
                 str(script), cwd=str(tmp_path)))
    out = r.stdout + r.stderr
    assert r.returncode == 0 and plain.stdout in r.stdout, r
    assert "Breakpoint 2, module module.0 forward (step 0)" in out, r
    assert "Watchpoint 1: grad module.2.weight norm = " in out and "pending" not in out, r
    import nndb as api
    with api.open(t) as tr:
        norm = tr.series("module.0.bias", "grad", "norm")[0]
        assert {(f["name"], f["step"]) for f in tr.full_tensors()} >= {("module.2.weight", 0), ("module.2.bias", 5)}
    shown = re.search(r"\(step 0 finished, loss [^)]*\)\n.*\n.*\n(\S+)\n", out)
    assert shown and float(shown[1]) == pytest.approx(float(norm), rel=1e-6), r
    if importlib.util.find_spec("matplotlib"):
        pic = nndb("plot", t, "--what", "history", "--glob", "2.weight", "-o", str(tmp_path / "h.png"))
        assert pic.returncode == 0 and os.path.getsize(tmp_path / "h.png") > 1000, pic.stderr


PER_SAMPLE = '''
import torch
from torch import nn
from torch.func import functional_call, grad, vmap
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)

def sample_loss(p, x, y):
    return ((functional_call(model, p, (x.unsqueeze(0),)) - y) ** 2).mean()

for step in range(24):
    x = torch.randn(32, 8); y = x.sum(1, keepdim=True)
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    if step % 4 == 3:       # per-sample gradient norms (the torch.func recipe), now and then
        p = {k: v.detach() for k, v in model.named_parameters()}
        g = vmap(grad(sample_loss), in_dims=(None, 0, 0))(p, x, y)
        print("per-sample grad norm", g["0.weight"].flatten(1).norm(dim=1).max().item())
    print("step", step, repr(loss.item()))
'''


def test_a_torch_func_transform_of_the_model_leaves_the_recording_running(tmp_path):
    """vmap(grad(...)) over the model ran nndb's module hooks on functorch's wrapped tensors,
    which have no storage: 'internal error in the tracer; recording stopped' at step 3, the
    trace 4 steps long of 24.  The transform's module calls are not the step's forward."""
    plain, trace = plain_and_recorded(tmp_path, PER_SAMPLE)
    import nndb
    t = nndb.open(trace)
    steps, losses = t.history("loss", "loss", "mean")
    printed = [float(m) for m in re.findall(r"^step \d+ (\S+)$", plain.stdout, re.M)]
    assert list(steps) == list(range(24)) and list(losses) == printed
    acts = {s.name for s in t.tensors if s.kind == "act"}
    assert {"0", "1", "2"} <= acts                       # the training forward's, as before


# MAML: an inner loop of fast weights (non-leaf tensors: the parameters minus
# lr x their create_graph gradients) run through the model by functional_call,
# an outer loss's backward through them, a meta-optimizer's step.
MAML = """
import torch, torch.nn as nn
from torch.func import functional_call
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))
meta = torch.optim.Adam(model.parameters(), lr=1e-3)
for it in range(6):
    meta.zero_grad()
    outer = 0.
    for t in range(2):
        xs, xq = torch.rand(8, 1) * 10 - 5, torch.rand(8, 1) * 10 - 5
        a = torch.rand(1) * 4 + 0.1
        fast = dict(model.named_parameters())
        for k in range(2):
            l = ((functional_call(model, fast, (xs,)) - a * torch.sin(xs)) ** 2).mean()
            gs = torch.autograd.grad(l, list(fast.values()), create_graph=True)
            fast = {n: w - 0.05 * g for (n, w), g in zip(fast.items(), gs)}
        outer = outer + ((functional_call(model, fast, (xq,)) - a * torch.sin(xq)) ** 2).mean()
    outer = outer / 2
    outer.backward()
    meta.step()
    print("step", it, repr(outer.item()), repr(model[0].weight.grad.norm().item()))
"""


def test_maml_fast_weights_through_functional_call_are_recorded(tmp_path):
    """functional_call puts the fast weights (non-leaf tensors) in the model's places
    while it runs: nndb's forward hook took them for new parameters and registered a
    post-accumulate-grad hook on them, which torch refuses for a non-leaf: 'internal error
    in the tracer; recording stopped' at step 0, and then 'the script called no
    backward()'.  Now every step is recorded with the printed meta-loss and gradients."""
    plain, trace = plain_and_recorded(tmp_path, MAML)
    import nndb
    t = nndb.open(trace)
    assert not any(e["kind"] == "recording_stopped" for e in t.events)
    printed = [line.split() for line in plain.stdout.splitlines()]
    steps, losses = t.history("loss", "loss", "mean")
    assert list(steps) == list(range(6))
    assert list(losses) == [np.float32(float(p[2])) for p in printed]
    np.testing.assert_allclose(t.history("0.weight", "grad")[1], [float(p[3]) for p in printed], rtol=1e-6)
    assert {x.name for x in t.tensors if x.kind == "param"} == {"0.weight", "0.bias", "2.weight", "2.bias"}

# PyTorch's "optimizer in backward" recipe: an optimizer per parameter, stepped
# (and zeroed) by the parameter's post-accumulate-grad hook; no step() after
# backward().
OPTIMIZER_IN_BACKWARD = """
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
X, Y = torch.randn(256, 8), torch.randint(0, 4, (256,))
opts = {p: torch.optim.AdamW([p], lr=1e-2) for p in model.parameters()}
norms = {}
def hook(p):
    norms[p] = p.grad.norm().item()
    opts[p].step()
    opts[p].zero_grad()
for p in model.parameters():
    p.register_post_accumulate_grad_hook(hook)
for it in range(8):
    idx = torch.randint(0, 256, (32,))
    loss = nn.functional.cross_entropy(model(X[idx]), Y[idx])
    loss.backward()
    print("step", it, repr(loss.item()), repr(norms[model[0].weight]))
"""


def test_optimizer_in_backward_records_each_steps_loss(tmp_path):
    """The optimizers step inside the backward, so the step ended there, before the
    backward returned and gave its loss: the loss went to the next step, whose
    zero_grad (in the hooks) then dropped it.  The trace had one loss, at a partial
    step after the last, and every stop said 'no loss recorded'.  Now each step has
    its backward's loss, as printed, and its gradients."""
    plain, trace = plain_and_recorded(tmp_path, OPTIMIZER_IN_BACKWARD)
    import nndb as api
    t = api.open(trace)
    printed = [line.split() for line in plain.stdout.splitlines()]
    steps, losses = t.history("loss", "loss", "mean")
    assert list(steps) == list(range(8)) and list(t.steps) == list(range(8))
    assert list(losses) == [np.float32(float(p[2])) for p in printed]
    np.testing.assert_allclose(t.history("0.weight", "grad")[1], [float(p[3]) for p in printed], rtol=1e-6)
    assert t.findings == []
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "s.h5"), "-e", "until 3",
                 "-e", 'p ("AT", repr($loss))', "-e", "rs 1", "-e", 'p ("AT", repr($loss))', "-e", "present",
                 "-e", "kill", str(tmp_path / "script.py"), cwd=str(tmp_path)), [])
    assert re.findall(r"\('AT', '([^']+)'\)", r.stdout) == [printed[3][2], printed[2][2]], r.stdout

# The optimizer-in-backward recipe without torch.optim: each parameter updated by hand in
# its post-accumulate-grad hook, which then drops the gradient (no step() at all).
UPDATE_IN_BACKWARD = OPTIMIZER_IN_BACKWARD.split("opts = ")[0] + """def hook(p):
    with torch.no_grad():
        p -= 0.1 * p.grad
    p.grad = None
for p in model.parameters():
    p.register_post_accumulate_grad_hook(hook)
for it in range(6):
    idx = torch.randint(0, 256, (32,))
    loss = nn.functional.cross_entropy(model(X[idx]), Y[idx])
    loss.backward()
    print("step", it, repr(loss.item()), repr(model[0].weight.sum().item()))
"""


def test_updates_by_hand_inside_the_backward_are_recorded(tmp_path):
    """Each backward's gradients were all dropped by the script's hooks before the step ended,
    and the tracer stopped at step 1: 'internal error in the tracer; recording stopped ...
    ValueError: need at least one array to concatenate', an empty trace, and 'no training step
    was recorded'.  Each step has its loss and the parameters' values (their gradients, gone
    as the backward returns, are not seen)."""
    plain, trace = plain_and_recorded(tmp_path, UPDATE_IN_BACKWARD)
    import nndb as api
    t = api.open(trace)
    printed = [line.split() for line in plain.stdout.splitlines()]
    assert not any(e["kind"] == "recording_stopped" for e in t.events)
    steps, losses = t.history("loss", "loss", "mean")
    assert list(steps) == list(range(6)) and list(losses) == [np.float32(float(p[2])) for p in printed]
    assert len(t.history("0.weight", "param")[0]) == 6


# A fresh optimizer each epoch, made inside the function that trains it (the
# script keeps weak references to see which are still alive).
PER_EPOCH_OPTIMIZER = '''
import weakref
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
X = torch.randn(96, 8); Y = X.sum(1, keepdim=True)
refs = []
def train_epoch(lr):
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    refs.append(weakref.ref(opt))
    for _ in range(8):
        for i in range(0, 96, 32):
            opt.zero_grad()
            loss = ((model(X[i:i+32]) - Y[i:i+32]) ** 2).mean()
            loss.backward()
            opt.step()
for epoch in range(4):
    train_epoch(1e-2 / (epoch + 1))
    print("epoch", epoch, "alive", [r() is not None for r in refs])
'''


def test_an_optimizer_the_script_lets_go_is_gone_and_set_lr_changes_the_live_one(tmp_path):
    """Each epoch's optimizer dies as its function returns, as in plain Python: nndb
    kept the latest alive past its function (a kept StepContext held the rules'
    [(name, optimizer)], the stop position the step end's frames) and one from a
    stop for good; 'info optimizer' then listed the dead one beside the live one and
    'set lr' at a stop was refused ("2 optimizers: say which").  The rules judge the
    steps as before (blocks included: 24 steps an epoch)."""
    plain, _ = plain_and_recorded(tmp_path, PER_EPOCH_OPTIMIZER)
    argv = ["run", "--batch", "-q", "--trace", str(tmp_path / "t.h5"), "--force",
            "-e", "break step 60", "-e", "commands 1", "-e", "info optimizer", "-e", "set lr 0.5",
            "-e", 'p ("LR", opt.param_groups[0]["lr"], [r() is not None for r in refs])', "-e", "end"]
    r = Ran(nndb(*argv, "script.py", cwd=str(tmp_path)), argv + ["script.py"])
    assert r.returncode == 0 and "internal error" not in r.stderr, r.stderr
    alive = re.findall(r"^epoch \d alive .*$", r.stdout, re.M)
    assert alive == plain.stdout.splitlines() and alive[-1].endswith("[False, False, False, False]")
    assert "say which" not in r.stdout + r.stderr
    assert re.findall(r"^(\w+) +Adam ", r.stdout, re.M) == ["opt3"], r.stdout    # the live one alone: epoch 2's
    assert "('LR', 0.5, [False, False, True])" in r.stdout, r.stdout


HOLDER = '''
import torch, torch.nn as nn

class Task(nn.Module):            # (a LightningModule's shape: the network a part of it, called as self.net)
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    def training_step(self, x, y):
        return nn.functional.mse_loss(self.net(x), y)

torch.manual_seed(0)
task = Task()
opt = torch.optim.SGD(task.parameters(), lr=0.05)
for step in range(6):
    x = torch.randn(16, 8)
    loss = task.training_step(x, x.sum(1, keepdim=True))
    opt.zero_grad(); loss.backward(); opt.step()
    print("step", step, repr(loss.item()))
'''


def test_a_network_held_by_a_module_with_no_other_parameters_is_named_by_its_path(tmp_path):
    """The holder's parameters are the network's: it was taken for a wrapper (DDP's shape),
    and the network named on its own ('0.weight', 'sequential'), where the optimizer, built
    on the holder's parameters, and the user say 'net.0.weight': 'watch grad net.0.weight'
    stayed pending for the whole run (every Lightning module calling self.net)."""
    plain, trace = plain_and_recorded(tmp_path, HOLDER)
    import nndb
    names = {s.name for s in nndb.open(trace).tensors}
    assert {"net.0.weight", "net.2.bias", "net.0"} <= names and "0.weight" not in names, names


# makemore's bigram (karpathy/makemore, its defaults: a zero-initialised table of next-character
# logits, AdamW at lr 5e-4): the loss falls steadily but slowly, ~0.0004 a step from ln(27).
SLOW_BIGRAM = textwrap.dedent('''
    import sys
    import torch, torch.nn as nn, torch.nn.functional as F
    torch.manual_seed(0)
    true = torch.randn(27, 27) * 1.5                      # the data's next-character logits
    logits = nn.Parameter(torch.zeros(27, 27))
    opt = torch.optim.AdamW([logits], lr=float(sys.argv[1]), weight_decay=0.01, betas=(0.9, 0.99))
    for step in range(70):
        x = torch.randint(0, 27, (32 * 11,))
        y = torch.multinomial(F.softmax(true[x], dim=1), 1)[:, 0]
        loss = F.cross_entropy(logits[x], y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        print("step", step, repr(loss.item()))
''')


@pytest.mark.parametrize("lr", ["5e-4", "5e-8"])
def test_a_loss_that_falls_slowly_and_steadily_is_not_a_flat_loss(tmp_path, lr):
    """loss_not_decreasing warned on makemore's bigram at its own lr, 5e-4: 'loss has gone
    down only 0.5% in 50 recorded steps', though it falls at every block of steps, as
    steadily (Sen's bound on the slope within 1% of the slope), and by 3% by step ~200.
    A loss that falls steadily, at a pace that reaches the rule's 3% within 10 times the
    steps run so far, is going down.  At lr 5e-8 it falls as steadily by 0.00005%: that
    would take a million steps, and is said, as what it is."""
    script = tmp_path / "bigram.py"
    script.write_text(SLOW_BIGRAM)
    r = Ran(nndb("run", "--batch", "--nx", "--trace", str(tmp_path / "t.h5"), str(script), lr,
                 cwd=str(tmp_path)), [])
    printed = {k: float(v) for k, v in _printed(r.stdout).items()}
    first, last = np.median([printed[k] for k in range(10)]), np.median([printed[k] for k in range(40, 50)])
    assert last < first and (first - last) / first < 0.015, printed      # down, by less than half the margin
    m = re.search(r"loss_not_decreasing at step 49: loss (.*?): median (\S+) over the last 10 vs (\S+) over",
                  r.stderr)
    if lr == "5e-4":
        assert "loss_not_decreasing" not in r.stderr and r.returncode == 0, r.stderr
        return
    assert m, r.stderr
    assert m[1] == f"has gone down only {100 * (first - last) / first:.1f}% in 50 recorded steps", m[1]
    assert (m[2], m[3]) == (fmt(last), fmt(first))


LOSS_MODULE_MADE_IN_FORWARD = """
import torch
torch.manual_seed(0)
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
    def forward(self, x, y):
        logits = self.fc(x)
        loss_fct = torch.nn.CrossEntropyLoss()      # made at each call, as Hugging Face models do
        return loss_fct(logits, y)
m = Net()
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for step in range(3):
    losses = []
    for micro in range(2):
        x = torch.randn(8, 4); y = torch.randint(0, 3, (8,))
        loss = m(x, y)
        (loss / 2).backward()
        losses.append(loss.item())
    opt.step(); opt.zero_grad()
    print(step, repr(losses[0]), repr(losses[1]))
"""


def test_a_loss_module_made_in_each_forward_is_one_series_of_every_micro_batch(tmp_path):
    """A module the model's forward makes at each call (BertForSequenceClassification's
    ``loss_fct = CrossEntropyLoss()``) was a series per object under one name: with two
    micro-batches a step, act cross_entropy_loss kept one (count 1, 1.1542 at step 0 of
    0.9661 and 1.1542), and replay --verify, whose replay kept the other, said 'first
    divergence at step 0' on a run it reproduced.  It is one series of both calls now."""
    script = tmp_path / "made.py"
    script.write_text(LOSS_MODULE_MADE_IN_FORWARD)
    r = nndb("run", "--batch", "-q", "--trace", str(tmp_path / "t.h5"), "--force",
             "-e", "break step 2", "-e", "continue", "-e", "replay --verify 0:2", "-e", "continue",
             str(script), cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "identical to the trace, bit for bit" in r.stdout, r.stdout
    printed = [line.split() for line in python(str(script), forked=True).stdout.splitlines()]
    import nndb as api
    t = api.open(str(tmp_path / "t.h5"))
    assert "cross_entropy_loss" in {s.name for s in t.tensors if s.kind == "act"}
    steps, counts = t.history("cross_entropy_loss", "act", "count")
    assert [float(c) for c in counts] == [2.0, 2.0, 2.0]
    _, lo = t.history("cross_entropy_loss", "act", "min")
    _, hi = t.history("cross_entropy_loss", "act", "max")
    assert (float(lo[0]), float(hi[0])) == tuple(sorted(float(v) for v in printed[0][1:]))


CRITERION_MADE_AGAIN = """
import torch
torch.manual_seed(0)
m = torch.nn.Linear(4, 3)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
def train(epoch):
    criterion = torch.nn.CrossEntropyLoss()       # made in each epoch (pytorch/examples' siamese_network)
    for i in range(3):
        x = torch.randn(8, 4); y = torch.randint(0, 3, (8,))
        loss = criterion(m(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        print(3 * epoch + i, repr(loss.item()))
for epoch in range(2):
    train(epoch)
for i in range(6, 9):
    x = torch.randn(8, 4); y = torch.randint(0, 3, (8,))
    loss = torch.nn.CrossEntropyLoss()(m(x), y)   # made at each step, no variable
    opt.zero_grad(); loss.backward(); opt.step()
    print(i, repr(loss.item()))
"""


def test_a_criterion_made_again_each_epoch_or_step_is_one_series(tmp_path):
    """A loss module made again (in each epoch's train(), or inline at each step) was a new
    root each time, named 'criterion', 'criterion2', ... and 'cross_entropy_loss',
    'cross_entropy_loss2', ...: a series per epoch or per step, 'history criterion' only
    the first epoch's.  A parameterless module takes the name of one that is gone."""
    script = tmp_path / "again.py"
    script.write_text(CRITERION_MADE_AGAIN)
    r = nndb("run", "--batch", "-q", "--trace", str(tmp_path / "t.h5"), "--force", str(script), cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    plain = python(str(script), forked=True).stdout
    printed = {int(a): float(b) for a, b in (line.split() for line in plain.splitlines())}
    import nndb as api
    t = api.open(str(tmp_path / "t.h5"))
    assert sorted(s.name for s in t.tensors if s.kind == "act") == ["criterion", "cross_entropy_loss", "m"]
    steps, _ = t.history("criterion", "act", "count")
    assert [int(s) for s in steps] == [0, 1, 2, 3, 4, 5]
    steps, counts = t.history("cross_entropy_loss", "act", "count")
    assert [int(s) for s in steps] == [6, 7, 8] and [float(c) for c in counts] == [1.0] * 3
    steps, losses = t.history("loss", "loss")
    assert {int(s): float(v) for s, v in zip(steps, losses)} == printed


# chatbot_tutorial's shape: one embedding shared by an encoder and a decoder, each trained by an
# optimizer over its own parameters() (the decoder's at 5x the learning rate), one backward.
SHARED_EMBEDDING = """
import torch, torch.nn as nn
torch.manual_seed(0)
embedding = nn.Embedding(VOCAB, 6)
encoder = nn.ModuleDict({"embedding": embedding, "rnn": nn.GRU(6, 6)})
decoder = nn.ModuleDict({"embedding": embedding, "out": nn.Linear(6, 12)})
enc_opt = torch.optim.Adam(encoder.parameters(), lr=0.01)
dec_opt = torch.optim.Adam(decoder.parameters(), lr=0.05)
for it in range(3):
    x, y = torch.randint(0, 12, (5, 2)), torch.randint(0, 12, (2,))
    _, h = encoder["rnn"](encoder["embedding"](x))
    logits = decoder["out"](h[0] + decoder["embedding"](y).mean(0))
    loss = nn.functional.cross_entropy(logits, y)
    enc_opt.zero_grad(); dec_opt.zero_grad()
    before = embedding.weight.detach().clone()
    loss.backward()
    enc_opt.step(); dec_opt.step()
    print(it, repr(loss.item()), repr((embedding.weight.detach() - before).norm().item()))
"""


@pytest.mark.parametrize("vocab", [12, 12000])      # (72 elements: the host block; 72,000: a large one)
def test_a_parameter_two_optimizers_step_is_recorded_with_the_step_s_whole_update(tmp_path, vocab):
    """The embedding both optimizers hold was recorded twice in each step, each optimizer's
    step apart, and the trace kept the decoder's: an update of 0.8366 at the chatbot's step 0
    where the step changed it by 1.0039, said nowhere.  The update the trace keeps is the
    step's whole change now (the script's own norm of after - before, every step; a full step,
    0, and usual ones), and the run says once what 'stats' lists besides."""
    script = tmp_path / "shared.py"
    script.write_text(SHARED_EMBEDDING.replace("VOCAB", str(vocab)))
    plain = python(str(script), forked=True)
    r = nndb("run", "--batch", "-q", "--trace", str(tmp_path / "t.h5"), str(script))
    assert r.returncode == 0 and r.stdout == plain.stdout, r.stderr
    said = [line for line in r.stderr.splitlines() if "stepped by several optimizers" in line]
    # (a large parameter's rows are the last optimizer's alone: nothing more to say)
    assert said == ["nndb: note: encoder.embedding.weight is stepped by several optimizers in step 0: "
                    "the trace, 'history' and $update keep the step's whole change; 'stats' also lists "
                    "each earlier optimizer's value, update and gradient rows, its update its own part "
                    "(docs/steps.md)"] * (vocab == 12), r.stderr
    printed = {int(a): float(c) for a, _, c in (line.split() for line in plain.stdout.splitlines())}
    import nndb as api
    t = api.open(str(tmp_path / "t.h5"))
    steps, norms = t.history("encoder.embedding.weight", "update")
    assert [int(s) for s in steps] == [0, 1, 2]
    for s, v in zip(steps, norms):
        assert float(v) == pytest.approx(printed[int(s)], rel=1e-5), (int(s), float(v), printed)


FAST_PATHS = os.path.join(ROOT, "tests", "scripts", "transformer_fast_paths.py")


def test_a_frozen_transformer_teachers_nested_tensors_leave_the_recording_on(tmp_path):
    """A frozen nn.TransformerEncoder in eval mode, called with autograd on and a padding
    mask, runs its layers on nested tensors (PyTorch's fused path), and its layers' outputs
    are nested: at step 32, the first step past 20 that records activations, measuring one
    raised "NestedTensorImpl doesn't support sizes" and the tracer stopped recording for the
    rest of the run.  A nested output has no rows; the teacher's own (a padded tensor) has."""
    import nndb as api
    trace = str(tmp_path / "run.h5")
    r = nndb("run", "--batch", "--trace", trace, FAST_PATHS)
    assert r.returncode == 0 and "internal error" not in r.stderr, r.stderr
    t = api.open(trace)
    assert list(t.steps) == list(range(34))
    teacher = t.series("teacher", kind="act", stat="norm")
    assert np.isfinite(teacher[list(t.steps).index(32)]), teacher


def test_transformers_fused_paths_give_what_they_give_without_nndb(tmp_path):
    """nn.TransformerEncoder evaluated under no_grad in eval mode with a padding mask
    takes PyTorch's nested-tensor path, whose padded positions' outputs are exactly 0,
    only where no torch function mode is on the stack: with the loss rules' function
    watch on it (the first 20 steps), the padded outputs summed to 194.8 where plain
    Python prints 0.0 at step 0, and the frozen teacher's targets, so every loss, differed
    (1.7946 at step 0 where plain Python prints 1.9092)."""
    plain = python(FAST_PATHS, forked=True)
    r = nndb("run", "--batch", "--trace", str(tmp_path / "run.h5"), FAST_PATHS)
    assert r.returncode == 0 and "internal error" not in r.stderr, r.stderr
    assert "padded 0.0" in plain.stdout and r.stdout == plain.stdout
