"""The model rules (nndb.rules.probe_rules): each fires on a small buggy
script, at the step, on the tensor or module, with the evidence it should,
and stays quiet on the healthy look-alike."""
import textwrap

import pytest

from conftest import example, findings_of, run_in_process

HEADER = """\
import sys
import torch
import torch.nn as nn
import torch.nn.functional as F
torch.manual_seed(0)
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 8
FLAG = sys.argv[2] if len(sys.argv) > 2 else ""
"""


def write(tmp_path, name, body) -> str:
    path = tmp_path / name
    path.write_text(HEADER + textwrap.dedent(body))
    return str(path)


def run(tmp_path, script, *args):
    res = run_in_process(tmp_path, script, args)
    assert res.exit_code == 0
    assert all(r.enabled for r in res.session.rules.rules)       # no rule failed
    return res


def only(res, rule) -> list:
    return [f for f in res.session.log.findings if f["rule"] == rule]


# -- dead_relu --------------------------------------------------------------------------------
def test_dead_relu_names_the_dead_series(tmp_path):
    res = run(tmp_path, example("dead_relu.py"), "--steps", 8)
    [f] = only(res, "dead_relu")
    assert f["tensor"] == "act#2"          # the ReLU after fc2; its first use (after fc1) is alive
    assert f["step"] == 4                  # dead from step 0, reported after 5 steps running
    assert f["severity"] == "warning"
    ev = f["evidence"]
    assert ev["dead_units"] == 64 and ev["units"] == 64 and ev["dead_share"] == 1.0
    assert ev["module_type"] == "ReLU" and ev["unit"] == "features" and ev["steps"] == 5


BLOCKS_OF_A_PLAIN_CLASS = """
    # a model of the script's own class that is no nn.Module: a ModuleDict (FLAG 'dict') or a
    # ModuleList of blocks and a head; 24 of the second block's 32 ReLU units dead from the start
    class Model:
        def __init__(self):
            layers = [nn.Sequential(nn.Linear(8, 32), nn.ReLU()), nn.Sequential(nn.Linear(32, 32), nn.ReLU())]
            self.blocks = nn.ModuleDict({"first": layers[0], "second": layers[1]}) if FLAG == "dict" \\
                else nn.ModuleList(layers)
            self.head = nn.Linear(32, 1)
            with torch.no_grad():
                layers[1][0].bias[:24] = -100.0

        def parameters(self):
            return [*self.blocks.parameters(), *self.head.parameters()]

        def __call__(self, x):
            for m in (self.blocks.values() if FLAG == "dict" else self.blocks):
                x = m(x)
            return self.head(x)

    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        x = torch.randn(64, 8)
        loss = F.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


@pytest.mark.parametrize("form,name", [("dict", "blocks.second.1"), ("list", "blocks.1.1")])
def test_blocks_a_plain_class_calls_from_its_container_are_named_by_their_path(tmp_path, form, name):
    """The blocks were roots named by the loop's variable that held each in turn: 'm2.1' (and
    'm2.0.weight' for blocks.second.0.weight) in both forms."""
    res = run(tmp_path, write(tmp_path, "blocks.py", BLOCKS_OF_A_PLAIN_CLASS), 8, form)
    [f] = only(res, "dead_relu")
    assert (f["tensor"], f["step"]) == (name, 4)


MASKED = """
    # {what}: bias -10 on the first {dead} of {units} units / channels
    if FLAG == "conv":
        model = nn.Sequential(nn.Conv2d(1, {units}, 3, padding=1), nn.ReLU(), nn.Flatten(),
                              nn.Linear({units} * 8 * 8, 3))
        x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 3, (16,))
    elif FLAG == "seq":              # (N, L, F): a Linear on a sequence
        model = nn.Sequential(nn.Linear(8, {units}), nn.ReLU(), nn.Linear({units}, 3), nn.Flatten())
        x, y = torch.randn(16, 5, 8), torch.randint(0, 15, (16,))
    else:
        model = nn.Sequential(nn.Linear(8, {units}), nn.ReLU(), nn.Linear({units}, 3))
        x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    with torch.no_grad():
        model[0].bias[:{dead}] = -10.0
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    criterion = nn.CrossEntropyLoss()
    for step in range(STEPS):
        opt.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()
"""


BF16_DEAD = """
    # bias -10 on 6 of 8 units, the forward under CPU bfloat16 autocast: the probe's
    # reductions come back in bfloat16, which numpy has no type for
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    with torch.no_grad():
        model[0].bias[:6] = -10.0
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        F.cross_entropy(out.float(), y).backward()
        opt.step()
"""


def test_dead_relu_under_bfloat16_autocast(tmp_path):
    """The rule read its probe's bfloat16 tensors with .numpy() and was
    disabled at the first observed step ('Got unsupported ScalarType BFloat16')."""
    [f] = only(run(tmp_path, write(tmp_path, "bf16.py", BF16_DEAD), 6), "dead_relu")
    assert f["tensor"] == "1" and f["step"] == 4 and f["evidence"]["dead_units"] == 6


@pytest.mark.parametrize("flag", ["linear", "conv", "seq"])
def test_dead_relu_counts_units_and_channels(tmp_path, flag):
    script = write(tmp_path, "dead.py", MASKED.format(what="most dead", dead=6, units=8))
    [f] = only(run(tmp_path, script, 6, flag), "dead_relu")
    assert f["tensor"] == "1" and f["step"] == 4
    assert f["evidence"]["dead_units"] == 6 and f["evidence"]["units"] == 8
    assert f["evidence"]["unit"] == ("channels" if flag == "conv" else "features")


def test_some_inactive_relu_units_are_healthy(tmp_path):
    script = write(tmp_path, "some.py", MASKED.format(what="a third dead", dead=10, units=32))
    assert only(run(tmp_path, script, 8, "linear"), "dead_relu") == []


# -- saturated_activation ---------------------------------------------------------------------
SATURATED = """
    # a hidden Tanh whose units sit at +1 (bias +10 on 12 of 16), and a Sigmoid head that is
    # confidently 0 for labels that are all 0 (a probability head: not judged)
    hidden = nn.Linear(8, 16)
    with torch.no_grad():
        hidden.bias[:12] = 10.0
    model = nn.Sequential(hidden, nn.Tanh(), nn.Linear(16, 4), nn.Sigmoid())
    with torch.no_grad():
        model[2].bias[:] = -9.0
    x, y = torch.randn(32, 8), torch.zeros(32, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    criterion = nn.BCELoss()
    for step in range(STEPS):
        opt.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()
"""


def test_saturated_tanh_fires_and_sigmoid_head_does_not(tmp_path):
    res = run(tmp_path, write(tmp_path, "sat.py", SATURATED), 7)
    [f] = only(res, "saturated_activation")
    assert f["tensor"] == "1" and f["step"] == 4
    ev = f["evidence"]
    assert ev["module_type"] == "Tanh" and ev["saturated_units"] == 12 and ev["units"] == 16


GENERATOR_OUTPUT = """
    # A GAN on MNIST-like images (8 x 8 in [-1, 1], background -1, a stroke of +1 on 12 pixels)
    # whose generator has learnt the images: its output Tanh (FLAG 'module': nn.Tanh, the last
    # layer of its nn.Sequential; 'functional': torch.tanh as forward returns; 'linear': none)
    # sits at -1 and +1 where the data does, 64 of 64 units.  A hidden Tanh of its has 12 of 16
    # units at +1.
    mask = torch.zeros(64, dtype=torch.bool)
    mask[torch.randperm(64)[:12]] = True
    real = torch.where(mask, 1.0, -1.0).expand(32, 64)

    class Generator(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 64),
                                     *([nn.Tanh()] if FLAG == "module" else []))
            with torch.no_grad():
                self.net[0].bias[:12] = 10.0
                self.net[2].weight.mul_(0.01)
                self.net[2].bias.copy_(torch.where(mask, 6.0, -6.0))

        def forward(self, z):
            y = self.net(z)
            return torch.tanh(y) if FLAG == "functional" else y

    netG, netD = Generator(), nn.Sequential(nn.Linear(64, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    criterion = nn.BCEWithLogitsLoss()
    optD = torch.optim.Adam(netD.parameters(), lr=1e-3, betas=(0.5, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=1e-3, betas=(0.5, 0.999))
    for step in range(STEPS):
        netD.zero_grad()
        fake = netG(torch.randn(32, 8))
        errD = criterion(netD(real), torch.ones(32, 1)) + criterion(netD(fake.detach()), torch.zeros(32, 1))
        errD.backward()
        optD.step()
        netG.zero_grad()
        errG = criterion(netD(fake), torch.ones(32, 1))
        errG.backward()
        optG.step()
        if step == 0 and FLAG != "linear":
            print("saturated output units:", int(((1 - fake.detach() ** 2).mean(0) < 0.1).sum()))
"""


def test_a_generators_hidden_tanh_module_is_read_once(tmp_path):
    """The generator's forward runs before the discriminator's backward, which does not go
    through it: its Tanh module's output was read again at the generator's backward, as a
    functional call: two findings of one layer, 'netG.net.1' and 'tanh(netG.net.0)'."""
    res = run(tmp_path, write(tmp_path, "gan.py", GENERATOR_OUTPUT), 7, "linear")
    [f] = only(res, "saturated_activation")
    assert (f["tensor"], f["step"], f["evidence"]["saturated_units"]) == ("netG.net.1", 4, 12)


@pytest.mark.parametrize("form", ["module", "functional"])
def test_a_generators_output_tanh_is_its_output_layer_not_a_saturated_hidden_one(tmp_path, capsys, form):
    """A model's output is no hidden layer: the generator's Tanh producing images at -1 and +1,
    as the data is, was 'saturated_activation at step 4: 64 of 64 units (100%) of Tanh layer
    netG.net.3' ('tanh(netG.net.2)' in the functional form) beside its hidden Tanh's; that one
    alone is found."""
    res = run(tmp_path, write(tmp_path, "gan.py", GENERATOR_OUTPUT), 7, form)
    assert "saturated output units: 64" in capsys.readouterr().out
    [f] = only(res, "saturated_activation")
    assert (f["tensor"], f["step"], f["evidence"]["saturated_units"]) == ("netG.net.1", 4, 12)


BOTH_SIDES = """
    # weights far too large: pre-activations of std ~SCALE, every unit at +-1 (tanh) or 0/1
    # (sigmoid), flipping with the sample: no unit sits at one asymptote for the whole batch
    seed, scale, act = int(FLAG.split(",")[0]), float(FLAG.split(",")[1]), FLAG.split(",")[2]
    torch.manual_seed(seed)
    width = 24 + 8 * seed
    hidden = nn.Linear(16, width)
    with torch.no_grad():
        hidden.weight.normal_(0, scale / 4)         # x ~ N(0, 1), 16 inputs: std of a unit = scale
        hidden.bias.zero_()
    model = nn.Sequential(hidden, nn.Tanh() if act == "tanh" else nn.Sigmoid(), nn.Linear(width, 3))
    x, y = torch.randn(48, 16), torch.randint(0, 3, (48,))
    opt = (torch.optim.Adam if seed % 2 else torch.optim.SGD)(model.parameters(), lr=0.01)
    for step in range(STEPS):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
"""


@pytest.mark.parametrize("act", ["tanh", "sigmoid"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_saturated_on_both_sides_fires(tmp_path, act, seed):
    """Issue 19: units at +1 for some samples and -1 for others pass no gradient either."""
    script = write(tmp_path, "both.py", BOTH_SIDES)
    [f] = only(run(tmp_path, script, 7, f"{seed},{20 if act == 'tanh' else 40},{act}"), "saturated_activation")
    assert f["tensor"] == "1" and f["step"] == 4
    assert f["evidence"]["saturated_share"] >= 0.9 and f["evidence"]["module_type"] == act.title()


@pytest.mark.parametrize("act", ["tanh", "sigmoid"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sane_init_is_not_saturated(tmp_path, act, seed):
    script = write(tmp_path, "sane.py", BOTH_SIDES)
    assert only(run(tmp_path, script, 7, f"{seed},{1.5 if act == 'tanh' else 3},{act}"),
                "saturated_activation") == []


# -- functional activations (the backward's graph) -------------------------------------------
FUNCTIONAL = """
    # pytorch/examples' style: activations called as functions in forward(), never as modules;
    # FLAG picks the layer that is broken: 'relu' (fc1's bias -100 on 48 of 64 units: dead),
    # 'tanh' (a Tanh module of the script's own after weights x40: saturated), 'healthy'
    class MyTanh(nn.Module):
        def forward(self, x):
            return torch.tanh(x)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.fc3 = nn.Linear(20, 64), nn.Linear(64, 32), nn.Linear(32, 1)
            self.squash = MyTanh()

        def forward(self, x):
            h = self.squash(self.fc2(F.relu(self.fc1(x))))
            return torch.sigmoid(self.fc3(h))         # a probability head into the loss: not judged

    model = Net()
    with torch.no_grad():
        if FLAG == "relu":
            model.fc1.bias[:48] = -100.0
        if FLAG == "tanh":
            model.fc2.weight.mul_(40.0)
        model.fc3.bias.fill_(-12.0)                   # the head confidently 0, as the labels
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 20), torch.zeros(32, 1)
    for step in range(STEPS):
        loss = F.binary_cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


@pytest.mark.parametrize("flag", ["relu", "tanh", "healthy"])
def test_functional_activations_are_judged_by_the_graph(tmp_path, flag):
    """F.relu and torch.tanh called in forward(), which no module hook sees (pytorch/examples'
    mnist style; a Tanh module of the script's own): read from the graph each backward
    differentiates, named after the module whose output they took, and judged as the module
    forms are, on the same step; the sigmoid straight into the loss is a head, not judged."""
    res = run(tmp_path, write(tmp_path, "functional.py", FUNCTIONAL), 7, flag)
    dead, sat = only(res, "dead_relu"), only(res, "saturated_activation")
    if flag == "healthy":
        assert dead == [] and sat == []
        return
    [f] = dead if flag == "relu" else sat
    assert (dead if flag == "tanh" else sat) == []
    assert f["step"] == 4 and f["tensor"] == ("relu(fc1)" if flag == "relu" else "tanh(fc2)")
    ev = f["evidence"]
    assert ev["module_type"] == f"functional {flag}"
    if flag == "relu":
        assert ev["dead_units"] == 48 and ev["units"] == 64
        assert "of ReLU layer relu(fc1) (functional relu) output 0 for every sample" in f["message"]
    else:
        assert ev["saturated_share"] >= 0.5 and ev["units"] == 32


def test_a_module_relu_is_judged_once(tmp_path):
    """An nn.ReLU module's output is the module probe's: the graph's node of it is not read
    again as a functional call (one finding, named after the module)."""
    res = run(tmp_path, write(tmp_path, "both.py", FUNCTIONAL.replace("F.relu(", "model_relu(").replace(
        "model = Net()", "model_relu = nn.ReLU()\n    model = Net()")), 7, "relu")
    # (model_relu is a module the script calls inside forward(): named as its variable)
    [f] = only(res, "dead_relu")
    assert f["evidence"]["module_type"] == "ReLU" and "relu(" not in f["tensor"]


RELU_FORMS = """
    # fc1's bias -100 on 24 of 32 units, its activation (FLAG) a ReLU in another form: nn.ReLU6,
    # F.relu6, h.clamp(min=0), h.clamp_min(0); or no ReLU: F.leaky_relu, F.hardtanh
    act = {"module_relu6": nn.ReLU6(), "relu6": F.relu6, "clamp": lambda h: h.clamp(min=0),
           "clamp_min": lambda h: h.clamp_min(0), "leaky": F.leaky_relu, "hardtanh": F.hardtanh}[FLAG]
    fc1, fc2 = nn.Linear(8, 32), nn.Linear(32, 3)
    with torch.no_grad():
        fc1.bias[:24] = -100.0
    model = nn.ModuleDict({"fc1": fc1, "fc2": fc2})
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
        loss = F.cross_entropy(fc2(act(fc1(x))), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


@pytest.mark.parametrize("form", ["module_relu6", "relu6", "clamp", "clamp_min", "leaky", "hardtanh"])
def test_a_relu_written_as_a_clamp_at_0_is_judged_as_its_module_form(tmp_path, form):
    """F.relu6, h.clamp(min=0) and clamp_min(0) (whose autograd nodes are a hardtanh's and a
    clamp's) went unjudged where nn.ReLU6 gave 'dead_relu at step 4: 24 of 32 units (75%)';
    a leaky ReLU has no dead units, and a Hardtanh is neither rule's (docs/rules.md)."""
    dead = only(run(tmp_path, write(tmp_path, "forms.py", RELU_FORMS), 7, form), "dead_relu")
    if form in ("leaky", "hardtanh"):
        assert dead == []
        return
    [f] = dead
    assert (f["step"], f["evidence"]["dead_units"], f["evidence"]["units"]) == (4, 24, 32)
    assert f["tensor"] == ("act" if form == "module_relu6" else "relu(fc1)"), f["tensor"]


INPUT_NEEDS_GRAD = """
    # adversarial training's shape: the input needs grad, so the graph holds a leaf of the
    # script's beside the conv's parameters; the relu is the conv's (6 of 8 channels dead)
    conv, head = nn.Conv2d(3, 8, 3), nn.Linear(8 * 6 * 6, 2)
    with torch.no_grad():
        conv.bias[:6] = -100.0
    model = nn.ModuleDict({"conv": conv, "head": head})
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        x = torch.randn(16, 3, 8, 8, requires_grad=True)
        loss = F.cross_entropy(model["head"](F.relu(model["conv"](x)).flatten(1)), torch.randint(0, 2, (16,)))
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_a_functional_relu_is_named_after_the_module_not_an_input_that_needs_grad(tmp_path):
    [f] = only(run(tmp_path, write(tmp_path, "adv.py", INPUT_NEEDS_GRAD), 9), "dead_relu")
    assert f["tensor"] == "relu(conv)" and f["evidence"]["dead_units"] == 6 and f["evidence"]["unit"] == "channels"


RECURRENT = """
    # FLAG 'gates': a GRU and an LSTMCell whose gates sit at 1 (their sigmoid gates' biases +20:
    # remember, read and write everything), which torch computes on the CPU as sigmoid and
    # tanh nodes multiplied into the state: gates, not layers (no finding); 'elman': a
    # recurrence written by hand whose hidden tanh saturates (weights x40): a layer (found)
    torch.manual_seed(0)
    x, y = torch.randn(16, 6, 8), torch.randint(0, 3, (16,))
    head = nn.Linear(32, 3)
    if FLAG == "gates":
        gru, cell = nn.GRU(8, 32, batch_first=True), nn.LSTMCell(32, 32)
        with torch.no_grad():
            gru.bias_ih_l0[:64] = 20.0            # the reset and update gates (r, z, n)
            cell.bias_ih[:64] = 20.0              # the input and forget gates (i, f, g, o)
            cell.bias_ih[96:] = 20.0              # the output gate
        params = [*gru.parameters(), *cell.parameters(), *head.parameters()]
    else:
        class Elman(nn.Module):
            def __init__(self):
                super().__init__()
                self.w_x, self.w_h = nn.Linear(8, 32), nn.Linear(32, 32)

            def forward(self, x):
                h = torch.zeros(x.shape[0], 32)
                for t in range(x.shape[1]):
                    h = torch.tanh(self.w_x(x[:, t]) + self.w_h(h))
                return h
        rnn = Elman()
        with torch.no_grad():
            rnn.w_x.weight.mul_(40.0)
        params = [*rnn.parameters(), *head.parameters()]
    opt = torch.optim.SGD(params, lr=0.01)
    for step in range(STEPS):
        if FLAG == "gates":
            out, _ = gru(x)
            h, c = torch.zeros(16, 32), torch.zeros(16, 32)
            for t in range(out.shape[1]):
                h, c = cell(out[:, t], (h, c))
        else:
            h = rnn(x)
        loss = F.cross_entropy(head(h), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


@pytest.mark.parametrize("flag", ["gates", "elman"])
def test_a_recurrences_gates_are_not_layers(tmp_path, flag):
    res = run(tmp_path, write(tmp_path, "rnn.py", RECURRENT), 7, flag)
    sat = only(res, "saturated_activation")
    if flag == "gates":
        assert sat == []
    else:
        [f] = sat
        assert f["step"] == 4 and f["evidence"]["units"] == 32
        # (the tanh of w_x(x) + w_h(h): the recurrence's, which holds both, not w_x's alone)
        assert f["tensor"] == "tanh(rnn)"
        assert f["evidence"]["saturated_share"] == 1.0


OF_PARAMETER = """
    # a weight kept non-negative by F.relu of a parameter (12 of its 16 input columns at -1:
    # pruned), an activation of no batch; the layer's own units (a tanh of it) are alive
    class NonNegative(nn.Module):
        def __init__(self, i, o):
            super().__init__()
            self.scale = nn.Parameter(torch.randn(o, i) / i ** 0.5)
            self.scores = nn.Parameter(torch.full((o, i), 5.0))

        def forward(self, x):
            return F.linear(x, self.scale * F.relu(self.scores))

    l1, l2 = NonNegative(16, 32), nn.Linear(32, 1)
    with torch.no_grad():
        l1.scores[:, :12] = -1.0
    model = nn.ModuleDict({"l1": l1, "l2": l2})
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    for step in range(STEPS):
        h = torch.tanh(l1(x))
        loss = F.mse_loss(l2(h), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(step, "dead units of l1:", int((h.detach().abs().amax(0) == 0).sum()))
"""


def test_a_relu_of_a_parameter_is_not_a_layer(tmp_path, capsys):
    """F.relu of a (32, 16) parameter was judged as a layer of 16 units over a batch of 32:
    '12 of 16 units (75%) of ReLU layer relu(l1) (functional relu) output 0 for every
    sample', where none of l1's 32 units is dead (the script's count)."""
    res = run(tmp_path, write(tmp_path, "of_param.py", OF_PARAMETER), 7)
    assert "6 dead units of l1: 0" in capsys.readouterr().out
    assert only(res, "dead_relu") == []


CHECKPOINTED = """
    # a relu inside a checkpointed block: its output is behind saved-tensor hooks, which would
    # run the block's forward again if read; nndb must not read it (the script's numbers, and
    # its count of forward calls, are the same with and without nndb)
    from torch.utils.checkpoint import checkpoint
    calls = [0]
    fc1, fc2 = nn.Linear(20, 64), nn.Linear(64, 1)
    with torch.no_grad():
        fc1.bias[:48] = -100.0

    def block(x):
        calls[0] += 1
        return F.relu(fc1(x))
    opt = torch.optim.SGD(list(fc1.parameters()) + list(fc2.parameters()), lr=0.01)
    x, y = torch.randn(32, 20), torch.randn(32, 1)
    for step in range(STEPS):
        loss = F.mse_loss(fc2(checkpoint(block, x, use_reentrant=False)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("calls", calls[0], "loss", f"{loss.item():.9f}")
"""


def test_a_checkpointed_activation_is_not_read(tmp_path, capsys):
    import subprocess
    import sys
    script = write(tmp_path, "ckpt.py", CHECKPOINTED)
    res = run(tmp_path, script, 7)
    assert only(res, "dead_relu") == []
    recorded = capsys.readouterr().out.strip().splitlines()[-1]
    plain = subprocess.run([sys.executable, script, "7"], capture_output=True, text=True, check=True).stdout
    assert plain.split()[:2] == ["calls", "14"]          # (the forward and its recomputation: 2 a step)
    assert recorded == plain.strip()


# -- eval_mode_training -----------------------------------------------------------------------
EVAL = """
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    criterion = nn.CrossEntropyLoss()
    if FLAG == "frozen_bn":          # BN statistics frozen on purpose; the model itself trains
        model[1].eval()
    for step in range(STEPS):
        opt.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()
        if step == 1:                # validation
            model.eval()
            with torch.no_grad():
                model(x)
            if FLAG != "forget_train":
                model.train()
            if FLAG == "frozen_bn":
                model[1].eval()
"""


def test_eval_mode_training_after_validation_without_train(tmp_path):
    res = run(tmp_path, write(tmp_path, "evalmode.py", EVAL), 6, "forget_train")
    [f] = only(res, "eval_mode_training")      # one model.eval(): one finding, its layers listed (it was one each)
    assert f["module"] == "model" and f["evidence"]["modules"] == ["1", "3"]    # the BatchNorm1d and the Dropout
    assert f["step"] == 3               # steps 2 and 3 train in eval mode
    assert f["evidence"]["root"] == "model" and f["evidence"]["steps"] == 2
    assert f["evidence"]["module_types"] == ["BatchNorm1d", "Dropout"]
    assert f["message"] == ("BatchNorm1d 1 ran in eval mode in 2 training steps running (model.training is False: "
                            "model.eval() without model.train() after it?): dropout is off and BatchNorm normalises "
                            "with frozen running statistics instead of the batch's; also Dropout 3"), f["message"]


@pytest.mark.parametrize("flag", ["", "frozen_bn"])
def test_validation_and_frozen_bn_are_not_eval_mode_training(tmp_path, flag):
    res = run(tmp_path, write(tmp_path, "evalmode.py", EVAL), 6, flag)
    assert only(res, "eval_mode_training") == []


def test_cnn_validation_under_eval_and_no_grad_is_healthy(tmp_path):
    res = run(tmp_path, example("cnn.py"), "--steps", 12, "--val-every", 4)
    assert only(res, "eval_mode_training") == []


# -- input_range, initial_loss ----------------------------------------------------------------
def test_raw_pixels_input_range_and_initial_loss(tmp_path):
    res = run(tmp_path, example("raw_pixels.py"), "--steps", 4)
    [f] = only(res, "input_range")
    assert f["module"] == "model" and f["step"] == 2     # 3 batches running
    ev = f["evidence"]
    assert ev["integer_valued"] is True and ev["min"] == 0 and ev["max"] == 255
    assert 90 < ev["mean"] < 130 and ev["shape"] == [64, 64]
    assert "raw pixels" in f["message"]
    [f] = only(res, "initial_loss")
    assert f["module"] == "criterion" and f["step"] == 0
    ev = f["evidence"]
    assert ev["classes"] == 4 and ev["loss"] > 20 and ev["chance_loss"] == pytest.approx(1.3863, abs=1e-4)


SCALED = """
    # 0-255 pixels scaled to [0, 1]; a model with a LayerNorm first takes raw values itself;
    # an NLLLoss after LogSoftmax at chance
    pixels = torch.randint(0, 256, (64, 16)).float()
    y = torch.randint(0, 5, (64,))
    if FLAG == "layernorm":
        model = nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 5), nn.LogSoftmax(dim=1))
        x = pixels
    else:
        model = nn.Sequential(nn.Linear(16, 5), nn.LogSoftmax(dim=1))
        x = pixels / 255
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    criterion = nn.NLLLoss()
    for step in range(STEPS):
        opt.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()
"""


@pytest.mark.parametrize("flag", ["scaled", "layernorm"])
def test_scaled_inputs_and_nll_at_chance_are_healthy(tmp_path, flag):
    res = run(tmp_path, write(tmp_path, "scaled.py", SCALED), 5, flag)
    assert findings_of(res) == []


# -- loss_broadcast ---------------------------------------------------------------------------
BROADCAST = """
    model = nn.Linear(4, 1)
    criterion = nn.MSELoss()
    x = torch.randn(16, 4)
    y = x.sum(dim=1) if FLAG == "flat" else x.sum(dim=1, keepdim=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(STEPS):
        opt.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()
"""


@pytest.mark.parametrize("flag", ["flat", "same"])
def test_loss_broadcast(tmp_path, flag):
    script = write(tmp_path, "bcast.py", BROADCAST)
    found = only(run(tmp_path, script, 3, flag), "loss_broadcast")
    if flag == "same":
        assert found == []
        return
    [f] = found
    assert f["module"] == "criterion" and f["step"] == 0 and f["severity"] == "error"
    ev = f["evidence"]
    assert ev["input_shape"] == [16, 1] and ev["target_shape"] == [16] and ev["broadcast_shape"] == [16, 16]
    assert "(16, 1)" in f["message"] and "(16,)" in f["message"]


# -- double_softmax ---------------------------------------------------------------------------
def test_double_softmax_module(tmp_path):
    res = run(tmp_path, example("double_softmax.py"), "--steps", 3)
    [f] = only(res, "double_softmax")
    assert f["module"] == "criterion" and f["step"] == 0 and f["severity"] == "error"
    ev = f["evidence"]
    assert ev["softmax_module"] == "5"          # the nn.Softmax, last of the Sequential
    assert ev["min"] >= 0 and ev["max"] <= 1 and ev["row_sum_error"] < 1e-5 and ev["classes"] == 10


PROBS = """
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 6)

        def forward(self, x):
            if FLAG == "function":
                return torch.softmax(self.fc(x), dim=1)
            if FLAG == "values":
                return F.softmax(self.fc(x), dim=1) * 1.0     # not the softmax's own output
            return self.fc(x)

    model = Net()
    x, y = torch.randn(32, 8), torch.randint(0, 6, (32,))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    criterion = nn.CrossEntropyLoss()
    for step in range(STEPS):
        opt.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()
"""


@pytest.mark.parametrize("flag,source", [("function", "softmax (a function call)"), ("values", None),
                                         ("logits", "-")])
def test_double_softmax_function_and_values(tmp_path, flag, source):
    res = run(tmp_path, write(tmp_path, "probs.py", PROBS), 3, flag)
    found = only(res, "double_softmax")
    if source == "-":
        assert findings_of(res) == []
        return
    [f] = found
    assert f["step"] == 0 and f["evidence"]["softmax_module"] == source and f["evidence"]["classes"] == 6


# -- stale_grad on full-batch training ------------------------------------------------------------
FULL_BATCH = """
    import math
    x = torch.linspace(-math.pi, math.pi, 2000)
    xx = x.unsqueeze(-1).pow(torch.tensor([1, 2, 3]))
    y = torch.sin(x)
    model = MODEL
    opt = torch.optim.OPT(model.parameters(), lr=LR)
    for t in range(40):
        loss = (model(xx).flatten() - y).pow(2).sum()
        ZERO
        loss.backward()
        opt.step()
"""
SCALARS = """torch.nn.Module()
    model.a, model.b = torch.nn.Parameter(torch.randn(())), torch.nn.Parameter(torch.randn(()))
    model.forward = lambda xx: model.a + model.b * xx[:, 0]"""


@pytest.mark.parametrize("model,opt,lr", [("torch.nn.Linear(3, 1)", "RMSprop", "1e-3"), (SCALARS, "SGD", "1e-6")],
                         ids=["linear-rmsprop", "scalars-sgd"])
def test_a_missing_zero_grad_in_full_batch_training_is_found(tmp_path, model, opt, lr):
    """Full-batch training (the PyTorch tutorials' polynomial_optim and polynomial_module
    without zero_grad): the last gradient and the new one are parallel, .grad = last + new
    is parallel to new alone, and the rule's direction test never fired; one-element
    parameters were never sampled.  Their sizes tell: .grad is exactly last + new."""
    body = FULL_BATCH.replace("MODEL", model).replace("OPT", opt).replace("LR", lr)
    stale = write(tmp_path, "stale.py", body.replace("ZERO", "pass"))
    healthy = write(tmp_path, "healthy.py", body.replace("ZERO", "opt.zero_grad()"))
    found = only(run(tmp_path, stale), "stale_grad")
    assert [f["step"] for f in found] == [2], found
    assert only(run(tmp_path, healthy), "stale_grad") == []


# -- a batch given by keyword (every Hugging Face model: model(input_ids=..., labels=...)) ---------
KEYWORD_BATCH = """
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(64, 1)
        def forward(self, x=None, y=None):
            return ((self.l(x) - y) ** 2).mean()
    m = M()
    opt = torch.optim.SGD(m.parameters(), lr=1e-7)
    X = torch.randint(0, 256, (512, 64)).float()          # raw 0-255 pixels
    Y = X.mean(1, keepdim=True)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=16, shuffle=True)
    for epoch in range(2):
        for x, y in loader:
            loss = m(x=x, y=y)
            opt.zero_grad(); loss.backward(); opt.step()
"""


def test_a_batch_given_by_keyword_is_the_steps_input(tmp_path):
    """A global forward pre-hook is given the positional arguments alone: a model called by
    keyword had no input, every step's checksum was the same, and duplicate_batches fired on
    every healthy shuffled run (the HF Trainer's, accelerate's); input_range and nndb check's
    data check missed what came by keyword."""
    res = run(tmp_path, write(tmp_path, "kw.py", KEYWORD_BATCH))
    assert only(res, "duplicate_batches") == [] and only(res, "epoch_repeats") == []
    ranges = only(res, "input_range")
    assert ranges and "range [0, 255]" in ranges[0]["message"], res.session.log.findings


# -- duplicate_batches: an IterableDataset read by every worker ---------------------------------
ITERABLE = """
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info, TensorDataset
    class Stream(IterableDataset):
        def __iter__(self):
            g = torch.Generator().manual_seed(0)
            rows = [(torch.randn(5, generator=g), torch.randn(1, generator=g)) for _ in range(40)]
            info = get_worker_info()
            SHARD
            return iter(rows)
    dl = DataLoader(DATASET, batch_size=4, num_workers=2)
    model = nn.Linear(5, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for ep in range(2):
        for x, y in dl:
            for _ in range(ECHO):
                opt.zero_grad(); loss = ((model(x) - y) ** 2).mean(); loss.backward(); opt.step()
"""


def test_duplicate_batches_iterable_dataset_every_worker_yields_it_all(tmp_path):
    """An IterableDataset with num_workers=2 and no get_worker_info() sharding: each worker yields
    all 10 batches, the loader takes one from each in turn, A A B B ...: 20 steps an epoch, each
    batch twice (PyTorch's documentation warns of it).  No rule fired.  Sharded, it is silent;
    so is a script that steps twice on each batch on purpose over a map-style dataset."""
    def script(shard="pass", dataset="Stream()", echo=1):
        return ITERABLE.replace("SHARD", shard).replace("DATASET", dataset).replace("ECHO", str(echo))
    [f] = only(run(tmp_path, write(tmp_path, "unsharded.py", script())), "duplicate_batches")
    assert f["step"] == 7 and f["evidence"]["repeats"] == 2 and f["evidence"]["steps"] == [0, 7], f
    assert "each input batch came 2 times running from step 0 to 7" in f["message"]
    assert "num_workers=2" in f["message"] and "get_worker_info()" in f["message"]
    sharded = script("if info is not None: rows = rows[info.id::info.num_workers]")
    assert only(run(tmp_path, write(tmp_path, "sharded.py", sharded)), "duplicate_batches") == []
    # data echoing on purpose: each batch twice, from a map-style dataset (two workers)
    echo = script(dataset="TensorDataset(torch.randn(40, 5), torch.randn(40, 1))", echo=2)
    assert only(run(tmp_path, write(tmp_path, "echo.py", echo)), "duplicate_batches") == []

# -- epoch_repeats: whose epoch repeated --------------------------------------------------------
TWO_LOADERS = """
    X, Y = torch.randn(32, 5), torch.randn(32, 1)
    g = torch.Generator()
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=8, SHUFFLE)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(12, 5), torch.randn(12, 1)),
                                      batch_size=6, VAL_SHUFFLE)
    model = nn.Linear(5, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(4):
        g.manual_seed(0)                                   # (the planted bug: the same order each epoch)
        for x, y in train:
            opt.zero_grad(); loss = ((model(x) - y) ** 2).mean(); loss.backward(); opt.step()
        with torch.no_grad():
            v = sum(((model(a) - b) ** 2).mean().item() for a, b in val)
"""


TINY_SHUFFLED = """
    torch.manual_seed(10)
    X, Y = torch.randn(SAMPLES, 8), torch.randn(SAMPLES, 1)       # (a row of 8 float32: 4 whole 64-bit words)
    g = torch.Generator()
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=BATCH, shuffle=True)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for ep in range(3):
        RESEED
        for x, y in dl:
            opt.zero_grad(); loss = ((model(x) - y) ** 2).mean(); loss.backward(); opt.step()
"""


def test_epoch_repeats_not_by_chance_of_a_tiny_loader(tmp_path):
    """4 samples in 2 shuffled batches: epoch 0 gave rows [0, 1], [3, 2], epoch 1 [0, 1], [2, 3],
    reshuffled as it should be.  The input checksum (a sum of 64-bit words) does not see the
    order of rows within a batch, and nndb said "the batches of steps 2-3 repeat those of steps
    0-1 exactly while the loader shuffles": the same samples in each batch, which a reshuffle of
    4 samples in batches of 2 gives once in 6.  The rule now speaks only where a reshuffle
    repeats them by chance less than once in a million, and says what it saw."""
    def script(samples, batch, reseed):
        body = TINY_SHUFFLED.replace("SAMPLES", str(samples)).replace("BATCH", str(batch))
        return body.replace("shuffle=True", "shuffle=True, generator=g").replace("RESEED", "g.manual_seed(0)") \
            if reseed else body.replace("RESEED", "pass")
    assert only(run(tmp_path, write(tmp_path, "tiny.py", script(4, 2, False))), "epoch_repeats") == []
    # the bug on a tiny loader: reseeded every epoch, but once in 6 is no evidence
    assert only(run(tmp_path, write(tmp_path, "tiny_reseeded.py", script(4, 2, True))), "epoch_repeats") == []
    # 16 samples in batches of 4: once in 6.306e+07 by chance
    small = script(16, 4, True)
    [f] = only(run(tmp_path, write(tmp_path, "small_reseeded.py", small)), "epoch_repeats")
    assert f["step"] == 7 and f["evidence"]["period"] == 4, f
    assert abs(f["evidence"]["chance"] * 63_063_000 - 1) < 1e-6, f
    assert "steps 4-7 repeat those of steps 0-3 (the same samples in each batch)" in f["message"]
    assert "once in 6.306e+07" in f["message"], f

def test_epoch_repeats_judges_the_loader_whose_epoch_repeated(tmp_path):
    """A training loader in order by design (shuffle=False: 4 batches, its epochs repeat) beside
    a shuffled validation loader (2 batches): until 2026-12 the rule asked whether any loader
    shuffles and said "the batches of steps 4-7 repeat those of steps 0-3 exactly while the loader
    shuffles" on this healthy script.  The loaders of as many batches as the repeated epoch's steps
    decide; a shuffled training loader reseeded each epoch still repeats beside an ordered one."""
    ordered = TWO_LOADERS.replace("VAL_SHUFFLE", "shuffle=True").replace("SHUFFLE)", "shuffle=False)")
    res = run(tmp_path, write(tmp_path, "ordered.py", ordered))
    assert only(res, "epoch_repeats") == [], res.session.log.findings
    reseeded = TWO_LOADERS.replace("VAL_SHUFFLE", "shuffle=False").replace("SHUFFLE)", "shuffle=True, generator=g)")
    found = only(run(tmp_path, write(tmp_path, "reseeded.py", reseeded)), "epoch_repeats")
    assert [(f["step"], f["evidence"]["period"]) for f in found] == [(7, 4)], found


def test_a_probe_joins_and_leaves_its_module_classes_in_one_call():
    """The rules arm their probes as the observed and sampled steps come and go, each
    with its module classes (ReLU, ReLU6...; Dropout, BatchNorm and their subclasses):
    one call into the tracer's listener lists each way, whatever their number (two a
    class were ~60 calls at each observed step's end and ~60 before the next one)."""
    import sys
    from types import SimpleNamespace
    from nndb.rules.model_probes import ReluUnits, TrainMode
    from nndb.tracer import within as within_module
    from nndb.tracer.within import WithinStep
    for cls in (ReluUnits, TrainMode):
        w = WithinStep()
        probe = cls(SimpleNamespace(tracer=SimpleNamespace(within=w), naming=None, recorder=None))
        calls = []

        def seen(frame, event, arg):
            if event == "call" and frame.f_code.co_filename == within_module.__file__:
                calls.append(frame.f_code.co_name)
        for on in (True, False):
            calls.clear()
            sys.setprofile(seen)
            try:
                probe.arm(on)
            finally:
                sys.setprofile(None)
            assert len(calls) == 1, (cls.name, on, calls)
            assert set(w.forward) == (set(cls.MODULE_TYPES) if on else set())
        # (its module classes, and the backward's start for the functional calls: ReluUnits)
        assert len(cls.MODULE_TYPES) >= 2 and w.version == 2 * len(probe._hooks())
