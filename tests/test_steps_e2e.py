"""Real example scripts through ``nndb run``: identical output, and the step
boundary on each loop shape (docs/steps.md)."""
import re

import numpy as np
import pytest

from conftest import ACCELERATE_WRAPPER, ROOT, example, nndb, plain_and_recorded, python, run_in_process, without_nndb_lines
from nndb.store.reader import TraceReader
from nndb.text import fmt

ALL_EXAMPLES = ["mlp", "cnn", "lstm", "transformer", "grad_accum", "gan", "lbfgs", "manual_sgd",
                "frozen_backbone", "dataloader", "nan_lr", "dead_relu", "no_zero_grad",
                "double_softmax", "raw_pixels"]


def run_example(name, trace, *args):
    r = nndb("run", "--trace", trace, example(f"{name}.py"), *args)
    assert r.returncode == 0, r.stderr
    return r, TraceReader(trace)


@pytest.mark.parametrize("name", ALL_EXAMPLES)
def test_output_bit_identical_with_and_without_nndb(name, trace):
    args = ["--steps", "12"]
    plain = python(example(f"{name}.py"), *args, forked=True)
    assert plain.returncode == 0, plain.stderr
    traced, t = run_example(name, trace, *args)
    assert traced.stdout == plain.stdout            # every printed loss, bit for bit
    assert without_nndb_lines(traced.stderr) == plain.stderr   # and no warning of nndb's leaks out
    assert plain.stdout.count("\n") >= 12
    with t:
        assert t.status == "finished" and t.n_steps >= 12


def kinds(t):
    return {(s.name, s.kind) for s in t.series()}


def test_plain_loop_one_step_per_optimizer_step(trace):
    _, t = run_example("mlp", trace, "--steps", "7")
    with t:
        assert list(t.steps) == list(range(7))
        assert list(t.optimizer_steps) == [1] * 7 and list(t.backward_count) == [1] * 7
        assert not t.partial.any()
        names = kinds(t)
        for kind in ("param", "grad", "update"):
            assert ("net.0.weight", kind) in names or ("0.weight", kind) in names or \
                any(k == kind for _, k in names)
        assert ("loss", "loss") in names
        assert any(k == "act" for _, k in names)


def test_grad_accumulation_is_one_step_per_optimizer_step(trace):
    r, t = run_example("grad_accum", trace, "--steps", "5", "--accum", "4")
    with t:
        assert list(t.steps) == list(range(5))
        assert list(t.backward_count) == [4] * 5
        loss = t.find("loss", "loss")[0]
        assert list(t.history(loss, "count")[1]) == [1] * 5    # one number: the step's objective
        # the sum of the four scaled micro-batch losses, added as torch adds float32 tensors (the
        # script adds their .item()s in Python floats: the same to float32's last bits)
        printed = [float(line.split()[-1]) for line in r.stdout.splitlines()]
        assert np.allclose(t.history(loss, "mean")[1], printed, rtol=4e-7, atol=0)
        assert all(float(np.float32(v)) == v for v in t.history(loss, "mean")[1])     # a float32 sum


def test_gan_step_is_one_iteration_of_both_optimizers(trace):
    r, t = run_example("gan", trace, "--steps", "6")
    with t:
        assert list(t.steps) == list(range(6))
        assert list(t.optimizer_steps) == [2] * 6
        names = kinds(t)
        assert ("loss/optimizerD", "loss") in names and ("loss/optimizerG", "loss") in names
        # names are qualified by the model they belong to
        assert any(n.startswith("netD.") and k == "update" for n, k in names)
        assert any(n.startswith("netG.") and k == "update" for n, k in names)
        assert not any(k == "param" and not (n.startswith("netD") or n.startswith("netG")) for n, k in names)
        # the printed lossG of each iteration is what the trace recorded for optimizerG's loss
        printed = [float(line.split("lossG ")[1]) for line in r.stdout.splitlines() if "lossG" in line]
        lossG = t.history(t.find("loss/optimizerG", "loss")[0], "mean")[1]
        np.testing.assert_array_equal(lossG, np.array(printed[:6], dtype=np.float32).astype(np.float64))


# An actor and a critic, each with its optimizer (PPO's shape): the actor's step, then the critic's.
ACTOR_CRITIC = """
import torch, torch.nn as nn
torch.manual_seed(0)
actor, critic = nn.Linear(4, 2), nn.Linear(4, 1)
aopt = torch.optim.SGD(actor.parameters(), lr=0.1)
copt = torch.optim.SGD(critic.parameters(), lr=0.1)
for k in range(4):
    x = torch.randn(8, 4)
    aopt.zero_grad()
    pl = actor(x).logsumexp(1).mean()
    pl.backward()
    aopt.step()
    copt.zero_grad()
    vl = critic(x).pow(2).mean()
    vl.backward()
    copt.step()
    print(k, repr(pl.item()), repr(actor.weight.grad.double().norm().item()))
"""


def test_step0_of_several_optimizers_stops_in_its_own_iteration(tmp_path):
    """Step 0 of an iteration of two optimizers ended inside the actor's step() of the
    next iteration (closed after the fact): a stop at step 0 showed iteration 1's frame
    (k 1) and `info params` the actor's gradient of step 1 (0.02989 in a PPO loop where the
    trace had 0.01243).  Both optimizers having stepped, it ends at the critic's return."""
    plain, _ = plain_and_recorded(tmp_path, ACTOR_CRITIC)
    rows = [line.split() for line in plain.stdout.splitlines()]
    r = nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "s.h5"), "-e", "break step 0",
             "-e", "break step 2", "-e", "continue", "-e", 'p ("AT", k, repr(pl.item()))', "-e", "info params",
             "-e", "continue", "-e", "goto 0", "-e", 'p ("AT", k, repr(pl.item()))', "-e", "info params",
             "-e", "present", "-e", "kill", str(tmp_path / "script.py"))
    assert r.returncode == 0, r.stderr
    assert re.findall(r"\('AT', (\d+), '([^']+)'\)", r.stdout) == [("0", rows[0][1])] * 2, r.stdout
    grads = re.findall(r"^actor\.weight\s+\(2, 4\)\s+float32\s+y\s+\S+\s+(\S+)$", r.stdout, re.M)
    assert grads == [fmt(float(rows[0][2]))] * 2, r.stdout
    assert "-> copt.step()" in r.stdout and "-> aopt.step()" not in r.stdout, r.stdout


# accelerate's loop (so the Hugging Face Trainer's): its optimizer wrapper subclasses
# torch.optim.Optimizer without Optimizer.__init__ and steps the script's; a warmup schedule on it,
# four micro-batches a step, each loss scaled by 1/4 as accelerator.backward scales it.
WRAPPED_ACCUMULATION = """
import torch, torch.nn as nn
""" + ACCELERATE_WRAPPER + """
torch.manual_seed(0)
model = nn.Linear(8, 1)
opt = Wrapped(torch.optim.AdamW(model.parameters(), lr=1e-3))
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / 3))
x = torch.randn(64, 8); y = x.sum(1, keepdim=True)
for micro in range(16):
    loss = ((model(x[micro * 4:micro * 4 + 4]) - y[micro * 4:micro * 4 + 4]) ** 2).mean()
    (loss / 4).backward()
    if micro % 4 == 3:
        print("step", micro // 4, "lr", repr(opt.param_groups[0]["lr"]))
        opt.step(); sched.step(); opt.zero_grad()
"""


def test_an_optimizer_wrapper_without_step_hooks_is_no_second_optimizer(tmp_path):
    """accelerate's AcceleratedOptimizer (every Hugging Face Trainer's) was counted as a
    second optimizer that never stepped: step 0 was closed after the fact, in step 1's
    optimizer step, so 'break step 0' stopped at micro-batch 7 with step 1's variables and the
    trace's lr of step 0 was step 1's (the Trainer's 0.000333 where it logged learning_rate
    0.0; accelerate's warmup 0.0005 for 0).  A wrapper whose step() fires no step hooks is
    not counted: step 0 ends as the wrapper returns."""
    plain, _ = plain_and_recorded(tmp_path, WRAPPED_ACCUMULATION)
    used = [float(v) for v in re.findall(r"^step \d+ lr (\S+)$", plain.stdout, re.M)]
    assert used == [0.0, 1e-3 / 3, 2e-3 / 3, 1e-3]
    r = nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "w.h5"), "-e", "break step 0",
             "-e", "continue", "-e", 'p ("AT", micro, opt.param_groups[0]["lr"])', "-e", "continue",
             str(tmp_path / "script.py"))
    assert r.returncode == 0, r.stderr
    assert "('AT', 3, 0.0)" in r.stdout and "closed after the fact" not in r.stdout, r.stdout
    with TraceReader(str(tmp_path / "w.h5")) as t:
        assert list(t.steps) == [0, 1, 2, 3] and list(t.backward_count) == [4] * 4
        (_, _, lrs), = t.learning_rates()
    assert list(lrs) == used                         # the lr each step stepped with


# A WGAN: the critic trained three times per generator step, so the generator's
# step falls into the critic step that follows it (steps 3, 6, ...).
N_CRITIC = """
import torch, torch.nn as nn
torch.manual_seed(0)
G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
D = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 1))
optG = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0., 0.9))
optD = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0., 0.9))
it = 0
for gstep in range(4):
    for _ in range(3):
        optD.zero_grad()
        lossD = D(G(torch.randn(32, 4)).detach()).mean() - D(torch.randn(32, 2) + 1).mean()
        lossD.backward()
        optD.step()
        print("D", it, repr(lossD.item()))
        it += 1
    optG.zero_grad()
    lossG = -D(G(torch.randn(32, 4))).mean()
    lossG.backward()
    optG.step()
    print("G", gstep, repr(lossG.item()))
"""


def test_a_critic_trained_n_times_keeps_its_loss_as_every_steps_loss(tmp_path):
    """$loss (the stop line's first loss, predict's Loss column) was the loss of the
    optimizer that stepped first in the step: the generator's at steps 3, 6, ...
    (predict 3 at step 4 read 6.93, -0.2687, 6.93 for three critic steps).  The
    closing optimizer's loss comes first now, the generator's after it."""
    plain, trace = plain_and_recorded(tmp_path, N_CRITIC)
    lossD = [line.split()[2] for line in plain.stdout.splitlines() if line.startswith("D ")]
    lossG = [line.split()[2] for line in plain.stdout.splitlines() if line.startswith("G ")]
    r = nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "s.h5"), "-e", "until 4",
             "-e", "predict 3", "-e", "goto 3", "-e", 'p ("AT", repr($loss))', "-e", "present", "-e", "kill",
             str(tmp_path / "script.py"))
    assert r.returncode == 0, r.stderr
    rows = re.findall(r"^(\d+)\s+(\S+)\s+\S+\s+-$", r.stdout, re.M)
    assert rows == [(str(s), f"{float(lossD[s]):g}") for s in (5, 6, 7)], r.stdout
    # the critic's loss is `loss` from step 0 to the end (it was `loss` at steps 0-2 and
    # `loss/optD` from step 3, where the generator's loss first came: two series, each cut)
    assert re.search(r"step 3 finished, loss \S+, loss/optG \S+", r.stdout), r.stdout
    assert re.findall(r"\('AT', '([^']+)'\)", r.stdout) == [lossD[3]], r.stdout
    with TraceReader(trace) as t:
        steps, values = t.history(t.find("loss/optG", "loss")[0], "mean")
        assert list(steps) == [3, 6, 9, 12] and list(values) == [np.float32(float(v)) for v in lossG]
        assert sorted(s.name for s in t.series() if s.kind == "loss") == ["loss", "loss/optG"]
        steps, values = t.history(t.find("loss", "loss")[0], "mean")
        assert list(steps) == list(range(12)) and list(values) == [np.float32(float(v)) for v in lossD]


# A dcgan loop whose generator's optimizer steps from the third iteration on (its loss and
# backward every iteration): its first step comes after iteration 2's step closed.
LATE_GENERATOR = """
import torch, torch.nn as nn
torch.manual_seed(0)
netG = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
netD = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
criterion = nn.BCEWithLogitsLoss()
optimizerD = torch.optim.Adam(netD.parameters(), lr=1e-2, betas=(0.5, 0.999))
optimizerG = torch.optim.Adam(netG.parameters(), lr=1e-2, betas=(0.5, 0.999))
for i in range(7):
    netD.zero_grad()
    errD_real = criterion(netD(torch.randn(32, 2) + 2), torch.ones(32, 1))
    errD_real.backward()
    fake = netG(torch.randn(32, 4))
    errD_fake = criterion(netD(fake.detach()), torch.zeros(32, 1))
    errD_fake.backward()
    errD = errD_real + errD_fake
    optimizerD.step()
    netG.zero_grad()
    errG = criterion(netD(fake), torch.ones(32, 1))
    errG.backward()
    if i >= 2:
        optimizerG.step()
    print("it", i, repr(errD.item()), repr(errG.item()))
"""


def test_a_generator_that_steps_from_a_later_iteration_on_is_paired_with_its_own_iteration(tmp_path):
    """The steps stayed the discriminator's, each with the generator's step of the iteration
    before: loss/optimizerG read 0.6166 (iteration 2's) at step 3, beside the discriminator's
    loss of iteration 3, where the script printed 0.6365.  Its first step, after iteration 2's
    step closed, is a step alone now, and a step is one iteration from then on; the run says
    so, at the stop too, and goto goes to the step's own end.  In the discriminator-only
    steps 1-2 the loss is the discriminator's: it was errD + the errG of the iteration before
    (1.7980 and 1.7511 where the script printed 1.2175 and 1.1560), whose gradient netD.zero_grad()
    threw away from netD's parameters before optimizerD stepped (and netG.zero_grad() from
    netG's before optimizerG first stepped)."""
    plain, trace = plain_and_recorded(tmp_path, LATE_GENERATOR)
    rows = re.findall(r"^it (\d+) (\S+) (\S+)$", plain.stdout, re.M)
    lossD, lossG = [np.float32(float(r[1])) for r in rows], [np.float32(float(r[2])) for r in rows]
    with TraceReader(trace) as t:
        steps, values = t.history(t.find("loss/optimizerG", "loss")[0], "mean")
        assert list(steps) == [3, 4, 5, 6, 7] and list(values) == lossG[2:]
        steps, values = t.history(t.find("loss", "loss")[0], "mean")
        assert list(steps) == [0, 1, 2, 4, 5, 6, 7] and list(values) == lossD, (list(values), lossD)
        assert not any(t.partial)
        joined, = [e for e in t.events() if e["kind"] == "steps_joined"]
        assert joined["step"] == 3 and "optimizerG's first step alone" in joined["message"], joined
    r = nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "s.h5"), "-e", "until 1",
             "-e", 'p ("LOSS", $loss)', "-e", "until 3",
             "-e", 'p ("AT", i)', "-e", "goto 3", "-e", 'p ("AT", i)', "-e", "kill", str(tmp_path / "script.py"))
    assert r.returncode == 0, r.stderr
    assert float(re.search(r"\('LOSS', (\S+)\)", r.stdout).group(1)) == float(lossD[1]), (r.stdout, lossD)
    assert "nndb: note: step 3 holds optimizerG's first step alone" in r.stderr, r.stderr
    assert re.search(r"step 3 finished, loss/optimizerG 0.6166\n  \(step 3 holds alone the first step of an "
                     r"optimizer that joined the iteration after step 2", r.stdout, re.I), r.stdout
    assert re.findall(r"\('AT', (\d+)\)", r.stdout) == ["3", "2"], r.stdout

def test_lbfgs_closure_many_backwards_in_one_step(trace):
    _, t = run_example("lbfgs", trace, "--steps", "4", "--max-iter", "5")
    with t:
        assert list(t.steps) == list(range(4))
        assert list(t.optimizer_steps) == [1] * 4
        assert all(b > 1 for b in t.backward_count)
        # parameters are named by module path even though LBFGS steps before the first forward
        assert any(n.endswith("weight") and k == "update" for n, k in kinds(t))


def test_manual_sgd_step_ends_at_each_backward_and_update_is_lr_times_grad(trace):
    _, t = run_example("manual_sgd", trace, "--steps", "6", "--lr", "0.05")
    with t:
        assert list(t.steps) == list(range(6))
        assert list(t.optimizer_steps) == [0] * 6 and list(t.backward_count) == [1] * 6
        weights = [s for s in t.series() if s.kind == "update"]
        assert weights
        for s in weights:
            grad = t.find(s.name, "grad")[0]
            _, upd = t.history(s, "norm")
            _, g = t.history(grad, "norm")
            np.testing.assert_allclose(upd, 0.05 * g, rtol=1e-4)   # p -= lr * grad, recorded on its own step


def test_frozen_backbone_records_head_updates_only(trace):
    _, t = run_example("frozen_backbone", trace, "--steps", "4")
    with t:
        updates = {s.name for s in t.series() if s.kind == "update"}
        params = {s.name for s in t.series() if s.kind == "param"}
        grads = {s.name for s in t.series() if s.kind == "grad"}
        assert updates and updates < params                   # the backbone is recorded, not updated
        assert grads == updates                               # frozen weights get no gradient
        for name in params - updates:                          # and its values never change
            _, norms = t.history(t.find(name, "param")[0], "norm")
            assert len(set(norms)) == 1


def test_nan_lr_records_nonfinite_loss(trace):
    _, t = run_example("nan_lr", trace, "--steps", "30")
    with t:
        loss = t.find("loss", "loss")[0]
        steps, bad = t.history(loss, "nan_count")
        _, inf = t.history(loss, "inf_count")
        assert (bad + inf > 0).any()                          # the planted bug is visible
        first = int(steps[np.argmax(bad + inf > 0)])
        assert 0 < first < 30


def test_dead_relu_layer_shows_all_zero_activations(trace):
    r = nndb("run", "--full-every", "1", "--trace", trace, example("dead_relu.py"), "--steps", "5")
    assert r.returncode == 0, r.stderr
    t = TraceReader(trace)
    with t:
        # one ReLU module used after fc1 and after fc2: a series per use
        _, first = t.history(t.find("act", "act")[0], "zero_frac")
        _, second = t.history(t.find("act#2", "act")[0], "zero_frac")
        assert (second == 1.0).all()                          # the dead layer
        assert (first < 0.9).all()                            # the healthy one
        _, fc2_grad = t.history(t.find("fc2.weight", "grad")[0], "norm")
        assert (fc2_grad == 0).all()


def test_schedule_every_and_steps(tmp_path):
    a = str(tmp_path / "a.h5")
    run_example("mlp", a, "--steps", "10")
    r = nndb("run", "--every", "3", "--trace", str(tmp_path / "b.h5"), example("mlp.py"), "--steps", "10")
    assert r.returncode == 0, r.stderr
    r = nndb("run", "--steps", "4:7", "--trace", str(tmp_path / "c.h5"), example("mlp.py"), "--steps", "10")
    assert r.returncode == 0, r.stderr
    with TraceReader(a) as full, TraceReader(str(tmp_path / "b.h5")) as every, \
            TraceReader(str(tmp_path / "c.h5")) as window:
        assert list(every.steps) == [0, 3, 6, 9]
        assert list(window.steps) == [4, 5, 6]
        s = full.find("loss", "loss")[0]
        _, all_loss = full.history(s, "mean")
        _, some = every.history(every.find("loss", "loss")[0], "mean")
        np.testing.assert_array_equal(some, all_loss[[0, 3, 6, 9]])   # same numbers, fewer rows
        # updates of a recorded step are right even when the step before was skipped (step 4 is a
        # full step of the window, summed in float64, and a norm-only step of the full run, in float32)
        w = [x for x in full.series() if x.kind == "update"][0]
        np.testing.assert_allclose(window.history(window.find(w.name, "update")[0], "norm")[1],
                                   full.history(w, "norm")[1][4:7], rtol=1e-6)


@pytest.mark.parametrize("bad", [["--every", "0"], ["--steps", "7"], ["--steps", "5:2"], ["--steps", "a:b"]])
def test_bad_schedule_is_usage_error(bad, trace):
    r = nndb("run", *bad, "--trace", trace, example("mlp.py"))
    assert r.returncode == 2 and r.stderr.startswith("nndb: error: ") and "Traceback" not in r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("extra", [False, True])
def test_optimizer_made_before_recording_keeps_steps_in_order(tmp_path, extra):
    """An optimizer alive when the tracer goes in (a notebook, scripts/bench.py)
    that holds the parameters the first backward reaches is the loop's: step
    0 ends at its first step(), one step per optimizer step (the first
    backward had ended step 0 as a hand-written update: five iterations
    made six steps, each record the loss of the one before); the records
    come in step order.  ``extra``: the backward first reaches parameters
    the optimizer does not hold (a last layer trained by no one): any
    parameter it reaches decides, not the first."""
    import gc

    import torch
    import torch.nn as nn

    from nndb.run import meta as runmeta
    from nndb.run.config import RecordSchedule, RunConfig
    from nndb.run.launcher import Target
    from nndb.run.runner import Recording
    gc.collect()
    torch.manual_seed(0)
    body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    model = nn.Sequential(body, nn.Linear(3, 3)) if extra else body
    opt = torch.optim.SGD(body.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    path = str(tmp_path / "early.h5")
    target = Target(path="loop.py")
    rec = Recording(path, runmeta.collect(target, ""), RunConfig(target, path, RecordSchedule.parse(None, None, None)))
    seen = []
    sink = rec.recorder.sink
    rec.recorder.sink = lambda r: (seen.append((r.step, r.backward_count, r.optimizer_steps)), sink(r))
    with rec:
        for _ in range(5):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    rec.close()
    # (step, backward passes, optimizer steps): five iterations, five steps
    assert seen == [(k, 1, 1) for k in range(5)]
    with TraceReader(path) as t:
        assert list(t.steps) == [0, 1, 2, 3, 4]


RESTARTED_HELPER = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
opt = torch.optim.Adam(model.parameters(), 1e-2)
"""
RESTARTED_MAIN = """
import torch
from helper import model, opt
g = torch.Generator().manual_seed(1)
data = [(torch.randn(32, 8, generator=g), torch.randint(0, 3, (32,), generator=g)) for _ in range(3)]
for i in range(6):
    x, y = data[i % 3]
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    print(f"{i} {loss.item()!r}", flush=True)
"""


def test_a_restarted_run_whose_optimizer_comes_from_an_imported_module_keeps_its_steps(tmp_path):
    """'run' restarts the script in the same process: a module it imports
    (model and optimizer made at import) comes from sys.modules, so the
    second run's optimizer was made before its recording started.  Its
    steps are still one an optimizer step, each with its own loss (the
    first backward had ended step 0 as a hand-written update: the trace had
    7 steps for 6, a NaN loss at step 1 and each later step the loss of the
    one before)."""
    (tmp_path / "helper.py").write_text(RESTARTED_HELPER)
    (tmp_path / "main.py").write_text(RESTARTED_MAIN)
    r = nndb("run", "--batch", "-q", "--trace", str(tmp_path / "t.h5"), "-e", "break step 2", "-e", "run",
             "-e", "delete", "-e", "continue", str(tmp_path / "main.py"), cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    printed = [float(line.split()[1]) for line in r.stdout.splitlines() if line[:1].isdigit()]
    second = printed[-6:]
    assert len(second) == 6 and (tmp_path / "t.h5").exists()
    with TraceReader(str(tmp_path / "t-run2.h5")) as t:
        assert list(t.steps) == list(range(6))
        assert t.backward_count.tolist() == t.optimizer_steps.tolist() == [1] * 6
        loss = next(s for s in t.series() if s.kind == "loss")
        mean = t.columns.index("mean")
        np.testing.assert_array_equal(t.column(loss)[:, mean], second)


REPLACED_OPTIMIZER = """
import sys
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
def stage(opt, start, n):
    for i in range(start, start + n):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        g = model[0].weight.grad.norm().item()
        opt.step()
        print(f"{i} {loss.item()!r} {g!r}", flush=True)
opt = torch.optim.Adam(model.parameters(), 1e-2)
stage(opt, 0, 5)
if sys.argv[1] == "rebind":           # a second stage: a new optimizer over the same parameters
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    stage(opt, 5, 5)
else:                                 # the same, the first one let go inside a function
    stage(torch.optim.SGD(model.parameters(), lr=0.1), 5, 5)
"""


@pytest.mark.parametrize("how", ["rebind", "call"])
def test_an_optimizer_replaced_mid_run_hands_the_steps_over(tmp_path, how):
    """A second stage with a new optimizer over the same parameters: one step
    per optimizer step on, each with its own loss and gradient.  The recorder's
    caches had kept the first optimizer alive (keyed by the object), so it
    stayed the step clock's closer and the whole second stage went into one
    partial step with the mean of its losses."""
    plain, trace = plain_and_recorded(tmp_path, REPLACED_OPTIMIZER, how)
    printed = [line.split() for line in plain.stdout.splitlines()]
    with TraceReader(trace) as t:
        assert list(t.steps) == list(range(10))
        assert list(t.backward_count) == [1] * 10 and list(t.optimizer_steps) == [1] * 10
        assert not t.partial.any()
        loss = t.find("loss", "loss")[0]
        assert list(t.history(loss, "mean")[1]) == [np.float32(float(p[1])) for p in printed]
        grad = t.find("0.weight", "grad")[0]
        np.testing.assert_allclose(t.history(grad, "norm")[1], [float(p[2]) for p in printed], rtol=1e-6)


K_FOLD = """
import weakref
import torch, torch.nn as nn
torch.manual_seed(0)
X = torch.randn(120, 8); y = (X[:, :2].sum(1) > 0).long()
folds = torch.arange(120).chunk(3)
last = None
for k, val in enumerate(folds):
    train = torch.cat([f for j, f in enumerate(folds) if j != k])
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for i in range(4):
        batch = train[i * 20:(i + 1) * 20]
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(X[batch]), y[batch])
        loss.backward()
        opt.step()
        print(k, i, repr(loss.item()), repr(model[0].weight.norm().item()),
              "last fold's model alive:", last is not None and last() is not None, flush=True)
    model.eval()
    with torch.no_grad():
        print(k, "val", repr(nn.functional.cross_entropy(model(X[val]), y[val]).item()))
    last = weakref.ref(model[0].weight)
"""


def test_a_k_fold_loop_lets_each_fold_s_model_go(tmp_path):
    """A new model and optimizer for each fold, validated under no_grad between folds: the
    last fold's model is gone in the next, as under python, and each model's series hold its
    fold's steps alone.  The recorder's cache of the parameters no optimizer steps held them
    (a whole fold: 'last fold's model alive: True', and 0.weight's param rows went on at
    steps 4-7, 2.259 each step), and the input probe held the validated model into the next
    fold's first step, whose rows took its .grad of the last step for theirs."""
    plain, trace = plain_and_recorded(tmp_path, K_FOLD)
    rows = [line.split() for line in plain.stdout.splitlines() if "val" not in line]
    assert len(rows) == 12 and {r[-1] for r in rows} == {"False"}
    with TraceReader(trace) as t:
        assert list(t.steps) == list(range(12))
        loss = t.find("loss", "loss")[0]
        assert list(t.history(loss, "mean")[1]) == [np.float32(float(r[2])) for r in rows]
        for k, name in enumerate(("0.weight", "model2.0.weight", "model3.0.weight")):
            for kind in ("param", "grad", "update"):
                steps, norms = t.history(t.find(name, kind)[0], "norm")
                assert list(steps) == list(range(4 * k, 4 * k + 4)), (name, kind)
                if kind == "param":
                    np.testing.assert_allclose(norms, [float(r[3]) for r in rows[4 * k:4 * k + 4]], rtol=1e-6)


TRAINER_PER_FOLD = """
import torch, torch.nn as nn
torch.manual_seed(0)
X = torch.randn(64, 10); Y = (X[:, :3].sum(1) > 0).long()

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(10, 8)
        self.l2 = nn.Linear(8, 2)
    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))

class Trainer:                       # (a fit() that builds its model and optimizer: skorch's shape)
    def fit(self, fold, steps):
        self.module_ = Net()
        self.optimizer_ = torch.optim.SGD(self.module_.parameters(), lr=0.1)
        for i in range(steps):
            self.optimizer_.zero_grad()
            loss = nn.functional.cross_entropy(self.module_(X), Y)
            loss.backward()
            self.optimizer_.step()
            print(fold, i, repr(loss.item()), repr(self.module_.l1.weight.norm().item()))

for fold in range(6):
    Trainer().fit(fold, 4)
"""


def test_a_model_first_called_at_a_step_without_activations_is_named_as_the_others(tmp_path):
    """A trainer object that makes a new model and optimizer at each fit() (a grid search's
    folds): each fold's model is named by the trainer's attribute, ``module_<k>``.  The sixth,
    whose first step (20) records no activations, so that no module hook saw it called, had
    its parameters named by their place in the optimizer, 'optimizer_6.group0.0', a series
    apart from every other fold's names."""
    plain, trace = plain_and_recorded(tmp_path, TRAINER_PER_FOLD)
    rows = [line.split() for line in plain.stdout.splitlines()]
    with TraceReader(trace) as t:
        assert list(t.steps) == list(range(24))
        for k in range(6):
            name = "l1.weight" if k == 0 else f"module_{k + 1}.l1.weight"
            steps, norms = t.history(t.find(name, "param")[0], "norm")
            assert list(steps) == list(range(4 * k, 4 * k + 4)), name
            np.testing.assert_allclose(norms, [float(r[3]) for r in rows[4 * k:4 * k + 4]], rtol=1e-6)
        assert not [s.name for s in t.series() if "group0" in s.name]


TEACHER_THEN_STUDENT = """
import sys
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
X = torch.randn(64, 10); y = (X[:, 0] * X[:, 1] > 0).long()
teacher = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2))
opt = torch.optim.Adam(teacher.parameters(), lr=1e-2)
for i in range(4):
    loss = F.cross_entropy(teacher(X), y)
    opt.zero_grad(); loss.backward(); opt.step()
    print("teacher", i, repr(loss.item()), repr(teacher[0].weight.grad.norm().item()))
student = nn.Sequential(nn.Linear(10, 8), nn.ReLU(), nn.Linear(8, 2))
if sys.argv[1] == "frozen":            # distillation: the teacher's last .grad stays as it was
    teacher.requires_grad_(False)
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
else:                                  # the teacher trained on by the loss, stepped by no optimizer
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
for i in range(4, 8):
    logits = teacher(X)
    s = student(X)
    loss = F.kl_div(F.log_softmax(s, 1), F.softmax(logits, 1), reduction="batchmean") + F.cross_entropy(s, y)
    opt.zero_grad(); loss.backward(); opt.step()
    print("student", i, repr(loss.item()), repr(teacher[0].weight.grad.norm().item()))
"""


def _assert_a_step_per_printed_loss(t, printed: list) -> None:
    """Steps 0..N-1 for the N losses the script printed, each its step's loss bit for bit."""
    assert list(t.steps) == list(range(len(printed)))
    loss = t.find("loss", "loss")[0]
    assert list(t.history(loss, "mean")[1]) == [np.float32(float(v)) for v in printed]


@pytest.mark.parametrize("how", ["frozen", "trained"])
def test_a_stage_s_last_gradient_is_no_later_step_s(tmp_path, how):
    """A teacher trained with its optimizer, then a student with another made later: the
    teacher's .grad, as its last step left it, is no step of the student's.  The marks that
    tell a finished stage's gradient from a new one were kept only when several optimizers
    were counted, which a second one made later is not until it steps: the teacher's 0.weight
    grad of step 3 was recorded as step 4's too.  A teacher the loss still reaches (its
    .grad accumulated by every step, stepped by no optimizer) has a gradient at every step."""
    plain, trace = plain_and_recorded(tmp_path, TEACHER_THEN_STUDENT, how)
    rows = [line.split() for line in plain.stdout.splitlines()]
    with TraceReader(trace) as t:
        _assert_a_step_per_printed_loss(t, [r[2] for r in rows])
        steps, norms = t.history(t.find("0.weight", "grad")[0], "norm")
        until = 4 if how == "frozen" else 8
        assert list(steps) == list(range(until))
        np.testing.assert_allclose(norms, [float(r[3]) for r in rows[:until]], rtol=1e-6)


CHECKPOINTED = """
import sys
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint
torch.manual_seed(0)
block = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
head = nn.Linear(16, 1)
opt = torch.optim.SGD([*block.parameters(), *head.parameters()], lr=0.05)
x = torch.randn(64, 8, requires_grad=sys.argv[1] == "reentrant")
y = x.detach().sum(1, keepdim=True)
for i in range(3):
    opt.zero_grad()
    h = block(x) if sys.argv[1] == "plain" else checkpoint(block, x, use_reentrant=sys.argv[1] == "reentrant")
    nn.functional.mse_loss(head(h), y).backward()
    opt.step()
"""


@pytest.mark.parametrize("how", ["reentrant", "non-reentrant"])
def test_a_checkpointed_block_is_recorded_once_per_forward(tmp_path, how):
    """Activation checkpointing runs the block's forward again in the backward;
    without reentrancy that recomputation went into the same series, so every
    activation in the block counted its elements twice (norm sqrt(2) too large).
    The recorded activations equal those of the same loop without checkpointing."""
    acts = {}
    for mode in ("plain", how):
        _, trace = plain_and_recorded(tmp_path, CHECKPOINTED, mode)
        with TraceReader(trace) as t:
            acts[mode] = {s.name: (list(t.history(s, "count")[1]), list(t.history(s, "norm")[1]))
                          for s in t.series() if s.kind == "act"}
    assert acts[how]["block.1"][0] == [64 * 16] * 3         # the ReLU in the block, each step's forward once
    for name, (count, norm) in acts["plain"].items():
        assert acts[how][name][0] == count
        np.testing.assert_allclose(acts[how][name][1], norm, rtol=1e-6)


SEVERAL_ROOTS = """
import sys
import torch
import torch.nn as nn
torch.manual_seed(0)
enc, dec, head = nn.Linear(8, 16), nn.Linear(16, 8), nn.Linear(16, 1)
opt = torch.optim.Adam([*enc.parameters(), *dec.parameters(), *head.parameters()], lr=1e-2)
x = torch.randn(32, 8)
y = x.sum(1, keepdim=True)
for i in range(4):
    opt.zero_grad()
    z = torch.tanh(enc(x))
    rec, sup = nn.functional.mse_loss(dec(z), x), nn.functional.mse_loss(head(z), y)
    if sys.argv[1] == "weighted":
        torch.autograd.backward([rec, sup], [torch.tensor(1.0), torch.tensor(0.5)])
        print(repr((rec + sup * 0.5).item()))
    else:
        torch.autograd.backward([rec, sup])
        print(repr((rec + sup).item()))
    opt.step()
"""


@pytest.mark.parametrize("how", ["sum", "weighted"])
def test_a_backward_of_several_losses_records_their_objective(tmp_path, how):
    """torch.autograd.backward([rec, sup]) differentiates rec + sup (with
    gradients given: their weighted sum); the trace's loss was rec alone."""
    plain, trace = plain_and_recorded(tmp_path, SEVERAL_ROOTS, how)
    with TraceReader(trace) as t:
        loss = t.find("loss", "loss")[0]
        assert list(t.history(loss, "mean")[1]) == [np.float32(float(v)) for v in plain.stdout.split()]
        assert list(t.history(loss, "count")[1]) == [1] * 4


# The original WGAN and WGAN-GP loops: the critic's two terms each given its
# sign as backward()'s gradient (``errD_real.backward(mone)``), or the sign
# given to torch.autograd.backward; "hand" updates without an optimizer.
SIGNED_BACKWARDS = """
import sys
import torch
import torch.nn as nn
torch.manual_seed(0)
D = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0., 0.9)) if sys.argv[1] != "hand" else None
one = torch.tensor(1.0)
mone = -one
for i in range(4):
    real, fake = torch.randn(32, 2) + 1, torch.randn(32, 2)
    D.zero_grad()
    d_real, d_fake = D(real).mean(), D(fake).mean()
    if sys.argv[1] == "grad_tensors":
        torch.autograd.backward(d_real, grad_tensors=mone)
        torch.autograd.backward(d_fake, grad_tensors=(one,))
    else:
        d_real.backward(mone)
        d_fake.backward(one)
    print(repr((d_real * mone + d_fake).item()), repr((d_real * mone).item()), repr(d_fake.item()))
    if opt is not None:
        opt.step()
    else:
        with torch.no_grad():
            for p in D.parameters():
                p -= 1e-2 * p.grad
"""


@pytest.mark.parametrize("how", ["tensor", "grad_tensors", "hand"])
def test_a_backward_given_a_gradient_records_gradient_times_loss(tmp_path, how):
    """d_real.backward(mone) differentiates -d_real: the critic's objective is
    d_fake - d_real.  The gradient was left out, so the step's loss was
    d_real + d_fake (a WGAN-GP critic's 8.2676 where the script printed its
    loss 7.4361).  Updated by hand, each backward() is a step of its own."""
    plain, trace = plain_and_recorded(tmp_path, SIGNED_BACKWARDS, how)
    printed = [line.split() for line in plain.stdout.splitlines()]
    want = [p[1 + k] for p in printed for k in (0, 1)] if how == "hand" else [p[0] for p in printed]
    with TraceReader(trace) as t:
        loss = t.find("loss", "loss")[0]
        assert list(t.history(loss, "mean")[1]) == [np.float32(float(v)) for v in want]

REPLACED_PARAMETERS = """
import sys
import torch
import torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
for i in range(12):
    if i == 6 and sys.argv[1] == "head":        # a new head, given to the optimizer
        model[2] = nn.Linear(16, 3)
        opt.add_param_group({"params": model[2].parameters()})
    if i == 6 and sys.argv[1] == "assign":      # weights loaded as new tensors: the optimizer keeps the old
        model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()}, assign=True)
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    print(repr(loss.item()), repr(model[2].weight.grad.norm().item()))
    opt.step()
"""


@pytest.mark.parametrize("how", ["head", "assign"])
def test_parameters_replaced_mid_run_are_recorded_under_their_names(tmp_path, how):
    """A head replaced (and added to the optimizer), or weights loaded with
    assign=True: the new tensors were never hooked nor named, so the trace's
    loss (assign: no hooked parameter reached) and '2.weight' went NaN from
    step 6, the new ones appeared as 'tensor7f...'.  Now '2.weight' is the
    tensor the model holds there, the one it replaced is 'replaced.2.weight',
    and with assign=True the rules say what is wrong: the model's weights
    get gradients no optimizer applies."""
    plain, trace = plain_and_recorded(tmp_path, REPLACED_PARAMETERS, how)
    printed = [line.split() for line in plain.stdout.splitlines()]
    with TraceReader(trace) as t:
        assert list(t.steps) == list(range(12))
        names = {s.name for s in t.series()}
        assert not any(n.startswith("tensor") for n in names)
        assert "replaced.2.weight" in names
        loss = t.find("loss", "loss")[0]
        assert list(t.history(loss, "mean")[1]) == [np.float32(float(p[0])) for p in printed]
        grad = t.find("2.weight", "grad")[0]
        np.testing.assert_allclose(t.history(grad, "norm")[1], [float(p[1]) for p in printed], rtol=1e-6)
    import nndb
    with nndb.open(trace) as t:
        rules = {(f["rule"], f.get("tensor")) for f in t.findings}
    if how == "assign":
        assert ("param_not_updated", "0.weight") in rules


PRUNED = """
import torch
import torch.nn as nn
import torch.nn.utils.prune as prune
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
x, y = torch.randn(64, 8), torch.randint(0, 4, (64,))
for i in range(12):
    if i == 3:
        prune.l1_unstructured(model[0], "weight", amount=0.5)
    if i == 8:
        prune.remove(model[0], "weight")
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    names = dict(model.named_parameters())
    w = names["0.weight_orig" if "0.weight_orig" in names else "0.weight"]
    print(repr(loss.item()), repr(w.norm().item()), repr(w.grad.norm().item()))
"""


def test_a_parameter_the_model_holds_at_another_path_is_named_by_it(tmp_path):
    """Pruning moves the parameter '0.weight' to '0.weight_orig' (the model's 'weight' is then
    weight_orig x mask, no parameter) and prune.remove moves it back: the trace kept the name it
    was first seen under, so '0.weight' at steps 3-7 was weight_orig's norm (2.335 where
    model[0].weight's was 2.165), and a model pruned before step 0 kept '0.weight_orig' after
    prune.remove ($grad['0.weight']: 'no grad tensor named 0.weight').  Now each step names the
    tensor by its path in the model then, as named_parameters() does."""
    plain, trace = plain_and_recorded(tmp_path, PRUNED)
    printed = [[float(v) for v in line.split()] for line in plain.stdout.splitlines()]
    with TraceReader(trace) as t:
        orig, weight = t.find("0.weight_orig", "param")[0], t.find("0.weight", "param")[0]
        assert list(t.history(orig, "norm")[0]) == [3, 4, 5, 6, 7]
        assert list(t.history(weight, "norm")[0]) == [0, 1, 2, 8, 9, 10, 11]
        for name, steps in (("0.weight_orig", range(3, 8)), ("0.weight", [0, 1, 2, 8, 9, 10, 11])):
            norms = t.history(t.find(name, "param")[0], "norm")[1]
            grads = t.history(t.find(name, "grad")[0], "norm")[1]
            np.testing.assert_allclose(norms, [printed[i][1] for i in steps], rtol=1e-6)
            np.testing.assert_allclose(grads, [printed[i][2] for i in steps], rtol=1e-6)


SPARSE = """
import torch
import torch.nn as nn
torch.manual_seed(0)
emb = nn.Embedding(5000, 16, sparse=True)                   # (a large one: read on its own)
bag = nn.EmbeddingBag(200, 8, mode="mean", sparse=True)     # (a small one: in the host block)
head = nn.Linear(24, 2)
sopt = torch.optim.SparseAdam(list(emb.parameters()) + list(bag.parameters()), lr=1e-2)
dopt = torch.optim.Adam(head.parameters(), lr=1e-2)
tok, y = torch.randint(0, 200, (32, 6)), torch.randint(0, 2, (32,))
for i in range(6):
    sopt.zero_grad(); dopt.zero_grad()
    loss = nn.functional.cross_entropy(head(torch.cat([emb(tok[:, 0] * 20 + i), bag(tok[:, 1:])], 1)), y)
    loss.backward()
    sopt.step(); dopt.step()
    print(repr(emb.weight.grad.coalesce().values().norm().item()), repr(bag.weight.grad.coalesce().values().norm().item()))
"""


def test_sparse_gradients_are_recorded_as_the_dense_tensors_they_stand_for(tmp_path):
    """nn.Embedding(sparse=True) / EmbeddingBag under SparseAdam: their gradients were never
    recorded (no 'grad' series: 'watch grad emb.weight' stayed pending for good, $grad a row of
    'not measured', info params' grad norm '-'), where the script's own norm was 0.02366."""
    plain, trace = plain_and_recorded(tmp_path, SPARSE)
    printed = [[float(v) for v in line.split()] for line in plain.stdout.splitlines()]
    with TraceReader(trace) as t:
        for j, (name, numel) in enumerate((("emb.weight", 5000 * 16), ("bag.weight", 200 * 8))):
            grad = t.find(name, "grad")[0]
            np.testing.assert_allclose(t.history(grad, "norm")[1], [p[j] for p in printed], rtol=1e-6)
            assert list(t.history(grad, "count")[1]) == [numel] * 6


SPECTRAL = """
import torch
import torch.nn as nn
from torch.nn.utils.parametrizations import spectral_norm
torch.manual_seed(0)
netD = nn.Sequential(spectral_norm(nn.Linear(8, 16)), nn.LeakyReLU(0.2), spectral_norm(nn.Linear(16, 1)))
netG = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
optD, optG = torch.optim.Adam(netD.parameters(), 1e-3), torch.optim.Adam(netG.parameters(), 1e-3)
x = torch.randn(32, 8)
for i in range(3):
    optD.zero_grad()
    (netD(netG(torch.randn(32, 4)).detach()).mean() - netD(x).mean()).backward()
    optD.step()
    optG.zero_grad()
    (-netD(netG(torch.randn(32, 4))).mean()).backward()
    optG.step()
"""


def test_spectral_norm_parameters_are_named_by_their_path_in_the_model(tmp_path):
    """spectral_norm's ParametrizationList calls itself as it is made, before
    the model's first forward: it was taken for a model of its own, and the
    discriminator's weights were 'parametrization_list.original',
    'parametrization_list2.original'."""
    _, trace = plain_and_recorded(tmp_path, SPECTRAL)
    with TraceReader(trace) as t:
        params = {s.name for s in t.series() if s.kind == "param"}
    assert {"netD.0.parametrizations.weight.original", "netD.2.parametrizations.weight.original",
            "netD.0.bias", "netG.0.weight"} <= params
    assert not any(n.startswith("parametrization_list") for n in params)


BACKWARD_SHAPES = """
import sys
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint
torch.manual_seed(0)
block = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh())
head = nn.Linear(16, 1)
opt = torch.optim.SGD([*block.parameters(), *head.parameters()], lr=0.05)
x = torch.randn(64, 8, requires_grad=True)
y = x.detach().sum(1, keepdim=True)
for i in range(6):
    opt.zero_grad()
    h = checkpoint(block, x, use_reentrant=True) if sys.argv[1] == "reentrant" else block(x)
    loss = nn.functional.mse_loss(head(h), y)
    if sys.argv[1] == "inputs":
        # a saliency pass first: differentiates the input only, no parameter
        (saliency,) = [g.abs().mean() for g in torch.autograd.grad(loss, x, retain_graph=True)]
        loss.backward(inputs=[x], retain_graph=True)
    loss.backward()
    print(repr(loss.item()))
    opt.step()
"""


@pytest.mark.parametrize("how", ["plain", "reentrant", "inputs"])
def test_a_backward_is_seen_once_per_call_that_reaches_the_parameters(tmp_path, how):
    """From the first optimizer step on, backward() is seen through one wrapper of
    torch.autograd.backward (issue 43), not a hook per parameter: a reentrant
    checkpoint's inner backward (run inside the outer one) is not a second
    backward, and ``loss.backward(inputs=[x])`` that reaches no parameter is not
    the step's; the loss and the backward count are those of the hooks' way
    (one backward a step, the printed loss) on every step."""
    plain, trace = plain_and_recorded(tmp_path, BACKWARD_SHAPES, how)
    printed = [float(line.split()[0]) for line in plain.stdout.splitlines()]
    with TraceReader(trace) as t:
        assert list(t.steps) == list(range(6))
        assert list(t.backward_count) == [1] * 6
        loss = t.find("loss", "loss")[0]
        assert list(t.history(loss, "mean")[1]) == [np.float32(v) for v in printed]


def test_the_backward_wrapper_is_gone_after_the_run(tmp_path):
    """torch.autograd.backward is torch's own again once the recording ends."""
    script = tmp_path / "train.py"
    script.write_text(BACKWARD_SHAPES)
    import torch
    original = torch.autograd.backward
    run_in_process(tmp_path, str(script), args=["plain"])
    assert torch.autograd.backward is original



KEPT_BACKWARD = """
import torch
from torch.autograd import backward        # taken while nndb records: its wrapper
torch.manual_seed(0)
lin = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(lin.parameters(), lr=0.1)
for i in range(3):
    opt.zero_grad()
    backward(lin(torch.randn(8, 4)).pow(2).mean())
    opt.step()
torch.kept_backward, torch.kept_linear = backward, lin
"""


def test_a_reference_to_the_wrapper_kept_past_the_run_calls_torch_s_backward(tmp_path):
    """The wrapper is in place from install on, so a script's ``from torch.autograd import
    backward`` takes it; once the recording ended (nndb.record's block, a tracer that
    failed and uninstalled while training goes on) calling it raised TypeError ('NoneType'
    object is not callable): the original it calls was let go.  It calls torch's own."""
    import torch
    script = tmp_path / "train.py"
    script.write_text(KEPT_BACKWARD)
    try:
        run_in_process(tmp_path, str(script))
        kept, lin = torch.kept_backward, torch.kept_linear
        assert kept is not torch.autograd.backward         # (the wrapper, put back)
        lin.zero_grad()
        kept(lin(torch.ones(2, 4)).sum())
        assert lin.bias.grad.item() == 2.0
    finally:
        for name in ("kept_backward", "kept_linear"):
            if hasattr(torch, name):
                delattr(torch, name)

LATER_STAGE = """
import torch
import torch.nn as nn
torch.manual_seed(0)
first, second = nn.Linear(32, 64), nn.Linear(64, 64)
opts = [torch.optim.Adam(first.parameters(), lr=0.03), torch.optim.Adam(second.parameters(), lr=0.03)]
pos, neg = torch.randn(128, 32), 0.5 * torch.randn(128, 32)
for layer, opt in zip((first, second), opts):    # each layer trained alone, the second from step 30
    for i in range(30):
        gp, gn = torch.relu(layer(pos)).pow(2).mean(1), torch.relu(layer(neg)).pow(2).mean(1)
        loss = torch.log1p(torch.exp(torch.cat([2.0 - gp, gn - 2.0]))).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(repr(loss.item()))
    pos, neg = torch.relu(layer(pos)).detach(), torch.relu(layer(neg)).detach()
"""


def test_a_model_first_called_after_step_0_is_recorded_under_the_names_the_rules_read(tmp_path):
    """The second layer is first called at step 30, between observed steps (module hooks
    off), so its optimizer's first step names its parameters 'opt2.group0.0'; at step 32
    the model is seen and named.  The series kept the optimizer's names (the parameter
    block cached them) while the trace's optimizer rows and the rules used 'layer2.bias':
    the rules took the bias for a weight matrix (a name without 'bias', no dimension
    known), and update_ratio reported its Adam warmup.  From step 32 on the series are
    named as the rules read them."""
    plain, trace = plain_and_recorded(tmp_path, LATER_STAGE)
    printed = [float(line) for line in plain.stdout.splitlines()]
    with TraceReader(trace) as t:
        assert list(t.steps) == list(range(60))
        assert list(t.history(t.find("loss", "loss")[0], "mean")[1]) == [np.float32(v) for v in printed]
        last = t.optimizers()[-1]
        assert last["step"] <= 32
        shapes = {}
        for opt, end in zip(last["optimizers"], (29, 59)):
            for group in opt["groups"]:
                for name in group:
                    (grad,) = t.find(name, "grad")
                    steps, _ = t.history(grad, "norm")
                    # the series the rules read is the one recorded (the first layer's gradients end
                    # with its stage: its .grad of step 29, left as it was, is no later step's)
                    assert steps[-1] == end, name
                    shapes[name] = grad.shape
        assert sorted(len(s) for s in shapes.values()) == [1, 1, 2, 2]
    import nndb
    with nndb.open(trace) as t:
        assert [f for f in t.findings if f["rule"] == "update_ratio" and len(shapes.get(f["tensor"], "xx")) == 1] == []


_WRAPPER = '''
import sys, torch, torch.nn as nn


class Lookahead:                    # (a user's: no torch.optim.Optimizer, no step hooks)
    def __init__(self, optimizer, k=3, alpha=0.5):
        self.optimizer, self.k, self.alpha, self.n = optimizer, k, alpha, 0
        self.param_groups = optimizer.param_groups
        self.slow = [p.detach().clone() for g in self.param_groups for p in g["params"]]

    def zero_grad(self):
        self.optimizer.zero_grad()

    def step(self):
        self.optimizer.step()
        self.n += 1
        with torch.no_grad():
            ps = [p for g in self.param_groups for p in g["params"]]
            if sys.argv[1] == "clamp":              # (a projection after every step)
                for p in ps:
                    p.clamp_(-0.3, 0.3)
            elif self.n % self.k == 0:              # (the slow weights every k steps)
                for p, s in zip(ps, self.slow):
                    s.add_(p - s, alpha=self.alpha)
                    p.copy_(s)


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1))
opt = Lookahead(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
g = torch.Generator().manual_seed(1)
for step in range(6):
    x = torch.randn(16, 5, generator=g)
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), x[:, :1] * 2)
    loss.backward()
    opt.step()
    print(f"step {step} w0 {model[0].weight.norm().item()!r}")
'''


def _history_is_the_scripts(tmp_path, source, how, kind, printed, n, rtol) -> list:
    """``source`` run by python and recorded: 0.weight's ``kind`` norm at each of its ``n``
    steps is what the script printed (``printed``: a regex of the number); those numbers."""
    plain, tr = plain_and_recorded(tmp_path, source, how)
    truth = [float(v) for v in re.findall(printed, plain.stdout)]
    import nndb as api
    steps, values = api.open(tr).history("0.weight", kind, "norm")
    assert list(steps) == list(range(n))
    assert np.allclose(values, truth, rtol=rtol, atol=0), (list(values), truth)
    return truth


@pytest.mark.parametrize("how", ["lookahead", "clamp"])
def test_a_wrapper_s_step_ends_the_step_when_it_returns(tmp_path, how):
    """An object whose step() calls the optimizer's and then changes the parameters (a
    Lookahead's slow weights every 3 steps; a projection after every step; torch's
    PostLocalSGDOptimizer averages so), with no step hooks of its own: the step ends as
    its step() returns.  It ended as the inner SGD's returned: at step 2 ``p`` and ``info
    params`` gave 2.068 and the trace's param norm 2.0676949 where the script's weight
    was 1.7583169 (clamped: 1.6431248 at step 0 for 1.4209134)."""
    truth = _history_is_the_scripts(tmp_path, _WRAPPER, how, "param", r"w0 (\S+)", 6, 1e-6)
    r = nndb("run", "--batch", "-q", "--trace", str(tmp_path / "b.h5"), "-e", "break step 2", "-e", "c",
             "-e", "p model[0].weight.norm().item()", "-e", "c", str(tmp_path / "script.py"), how)
    assert r.returncode == 0, r.stderr
    assert repr(truth[2]) in r.stdout.split("step 2 finished")[1].split("step 2 w0")[0], r.stdout


ZERO_SHARD = '''
import os, sys, tempfile
import torch, torch.distributed as dist, torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer

dist.init_process_group("gloo", init_method="file://" + os.path.join(tempfile.mkdtemp(), "pg"), rank=0, world_size=1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))
if sys.argv[1] == "zero":
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
else:                                   # (timm's Lookahead's shape: an Optimizer, hooks and all)
    class Lookahead(torch.optim.Optimizer):
        def __init__(self, base):
            self.base = base
            super().__init__(base.param_groups, {})
            self.param_groups = base.param_groups
        def step(self, closure=None):
            self.base.step()
            with torch.no_grad():
                for g in self.param_groups:
                    for p in g["params"]:
                        p.mul_(0.5)
    opt = Lookahead(torch.optim.Adam(model.parameters(), lr=0.01))
x = torch.randn(16, 6); y = x[:, :2].sum(1, keepdim=True)
for step in range(4):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    before = model[0].weight.detach().clone()
    opt.step()
    print("step", step, "update", repr((model[0].weight - before).norm().item()))
dist.destroy_process_group()
'''


@pytest.mark.parametrize("how", ["zero", "lookahead"])
def test_an_optimizer_stepped_inside_another_s_step_is_that_step(tmp_path, how):
    """torch's ZeroRedundancyOptimizer steps its rank's shard through an Adam of its own (its
    ``.optim``) inside its own ``step()``, both with step hooks (so does a Lookahead that is a
    torch.optim.Optimizer around its base): each parameter was recorded twice, the shard's
    rows and the wrapper's, and nndb said 'nndb: note: 0.weight, 0.bias, 2.weight and 1 more
    are stepped by several optimizers in step 0', with 'stats' listing 0.weight's value,
    update and gradient rows twice, where the script has one optimizer.  The wrapper's rows
    are the step's, its update the script's (the Lookahead's halving included)."""
    _history_is_the_scripts(tmp_path, ZERO_SHARD, how, "update", r"update (\S+)", 4, 1e-5)
    r = nndb("run", "--batch", "-q", "--trace", str(tmp_path / "b.h5"), "-e", "break step 2", "-e", "c",
             "-e", "stats", "-e", "c", str(tmp_path / "script.py"), how)
    assert r.returncode == 0, r.stderr
    assert "several optimizers" not in r.stdout + r.stderr, r.stderr
    table = r.stdout.split("step 2 finished")[1]
    for kind in ("param", "update", "grad"):
        assert len(re.findall(rf"^0\.weight\s+{kind}\s", table, re.M)) == 1, table


# nn_tutorial's shape: a model trained by hand (``p -= p.grad * lr``), then an optimizer's
# loop (on the same model, or on a new one): the first backward of the optimizer's loop ends
# a hand-written step, whose update is the optimizer's first step.
HAND_THEN_OPTIMIZER = """
import sys
import torch
import torch.nn as nn
torch.manual_seed(0)
x, y = torch.randn(16, 4), torch.randn(16, 1)
model = nn.Linear(4, 1)
for i in range(3):
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    print(repr(loss.item()), repr(model.weight.grad.norm().item()))
    with torch.no_grad():
        for p in model.parameters():
            p -= p.grad * 0.1
        model.zero_grad()
if sys.argv[1] == "new":
    model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(3):
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    print(repr(loss.item()), repr(model.weight.grad.norm().item()))
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.parametrize("how", ["same", "new"])
def test_an_optimizer_after_hand_written_updates_makes_no_step_of_its_own(tmp_path, how):
    """The optimizer's first step() applies the gradients of the backward that ended the
    last hand-written step: it is that step's update.  It was a step of its own (six
    iterations made seven steps; step 4 had no loss, the gradients of step 3 again, 1.185,
    and step 3 an update of 0), so every later step was one ahead of the script's."""
    plain, trace = plain_and_recorded(tmp_path, HAND_THEN_OPTIMIZER, how)
    printed = [line.split() for line in plain.stdout.splitlines()]
    with TraceReader(trace) as t:
        _assert_a_step_per_printed_loss(t, [p[0] for p in printed])
        name = "weight" if how == "same" else "model2.weight"
        steps, grads = t.history(t.find(name, "grad")[0], "norm")
        assert list(steps) == ([0, 1, 2, 3, 4, 5] if how == "same" else [3, 4, 5])
        assert list(grads) == pytest.approx([float(p[1]) for p in printed][-len(steps):], rel=1e-6)
        ups = dict(zip(*t.history(t.find(name, "update")[0], "norm")))
        assert ups[3] == pytest.approx(0.1 * float(printed[3][1]), rel=1e-5)    # SGD's first step: lr x grad


def test_a_hand_written_loop_that_raises_before_backward_keeps_its_steps_and_the_partial_one(trace):
    """pytorch/examples' regression shape: ``model.zero_grad()`` (gradients None), a forward,
    then the script's own guard raises before backward().  The run's close read the gradients
    of no parameter (ValueError: need at least one array to concatenate): 'internal error in
    the tracer; recording stopped', the raising step's forward passes lost."""
    script = f"{ROOT}/tests/scripts/loss_guard_raises.py"
    plain = python(script, "--by-hand", forked=True)
    r = nndb("run", "--batch", "--nx", "-q", "--trace", trace, script, "--by-hand")
    assert r.returncode == 1 == plain.returncode and r.stdout == plain.stdout
    assert "internal error" not in r.stderr, r.stderr
    assert r.stderr.rstrip().endswith("FloatingPointError: loss is nan at step 3")
    with TraceReader(trace) as t:
        assert t.status == "failed" and list(t.steps) == [0, 1, 2, 3]
        assert list(t.partial) == [False, False, False, True] and not t.events()
        losses = [float(line.split()[-1]) for line in plain.stdout.splitlines()]
        _, loss = t.history(t.find("loss", "loss")[0], "mean")
        np.testing.assert_array_equal(loss, np.float32(losses))      # steps 0-2, as the script printed
        acts = [s for s in t.series() if s.kind == "act"]
        assert acts and all(list(t.history(a, "norm")[0]) == [0, 1, 2, 3] for a in acts)
