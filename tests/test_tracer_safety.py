"""A hook nndb puts into the user's program never crashes the training."""
import torch

from nndb.run.config import RecordSchedule, RunConfig
from nndb.run.launcher import Target
from nndb.run.runner import Recording
from nndb.store.reader import TraceReader

from conftest import ROOT, nndb, python


def train(steps=4):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), 0.1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(torch.randn(16, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()]


def test_internal_error_is_reported_once_and_training_goes_on(tmp_path, monkeypatch):
    expected_losses, expected_params = train()
    path = str(tmp_path / "t.h5")
    messages = []
    rec = Recording(path, {}, RunConfig(Target(path="x.py"), path, RecordSchedule()), message=messages.append)
    calls = {"n": 0}

    def broken(key, output):
        calls["n"] += 1
        if calls["n"] > 5:
            raise ValueError("boom")
    monkeypatch.setattr(rec.recorder, "activation", broken)
    with rec:
        losses, params = train()
    rec.close()
    assert losses == expected_losses                                # same numbers, bit for bit
    assert all(torch.equal(a, b) for a, b in zip(params, expected_params))
    assert len(messages) == 1 and "internal error in the tracer" in messages[0] and "boom" in messages[0]
    assert torch.nn.modules.module._global_forward_hooks == {}     # the hooks were removed
    with TraceReader(path) as t:
        assert t.status == "finished"
        [e] = t.events()                                            # the recording that stopped is an event
    assert e["kind"] == "recording_stopped" and e["message"] == messages[0] and isinstance(e["step"], int)


def test_hooks_are_removed_on_exit(tmp_path):
    path = str(tmp_path / "t.h5")
    rec = Recording(path, {}, RunConfig(Target(path="x.py"), path, RecordSchedule()), message=print)
    with rec:
        train(2)
    rec.close()
    from torch.optim import optimizer
    assert torch.nn.modules.module._global_forward_hooks == {}
    assert torch.nn.modules.module._global_forward_pre_hooks == {}
    assert len(optimizer._global_optimizer_pre_hooks) == 0 and len(optimizer._global_optimizer_post_hooks) == 0
    with TraceReader(path) as t:
        assert list(t.steps) == [0, 1]


FORKED_WORKERS = """
import torch
from torch.utils.data import DataLoader, Dataset
torch.manual_seed(0)
feat = torch.nn.Linear(4, 4)          # a module the workers run
class D(Dataset):
    def __len__(self): return 32
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        with torch.enable_grad():
            return feat(torch.randn(4, generator=g)).detach(), torch.randn(1, generator=g)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step, (x, y) in enumerate(DataLoader(D(), batch_size=8, num_workers=2)):
    loss = (model(x) - y).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    print(step, loss.item())
"""


def test_forked_dataloader_workers_neither_record_nor_stop(tmp_path, trace):
    script = tmp_path / "workers.py"
    script.write_text(FORKED_WORKERS)
    plain = python(str(script), forked=True)
    run = nndb("run", "--trace", trace, "-e", "break module feat", "-e", "continue", str(script))
    assert run.returncode == 0, run.stderr
    # the breakpoint is pending (feat never runs in this process) and never hits in a worker
    lines = run.stdout.splitlines(True)
    assert lines[0].startswith("No module matches 'feat' yet")
    assert lines[1] == "Breakpoint 1: module feat forward\n"
    assert "".join(lines[2:]) == plain.stdout              # no stop, same numbers
    with TraceReader(trace) as r:
        names = {s.name for s in r.series()}
        assert r.n_steps == 4 and "model" in names and "feat" not in names


def test_an_optimizer_alive_before_the_run_does_not_change_how_steps_end(tmp_path):
    # (a notebook, or an earlier run in this process, may hold one)
    from conftest import example, run_in_process
    leftover = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    res = run_in_process(tmp_path, example("mlp.py"), ["--steps", "5"], rules="none")
    with TraceReader(res.run.trace_path) as r:
        assert list(r.steps) == [0, 1, 2, 3, 4]
        assert list(r.optimizer_steps) == [1, 1, 1, 1, 1]
    # one optimizer steps: steps end at its step() from the first one on (not
    # learnt after the fact, as with a GAN's two optimizers)
    assert res.session.rec.tracer.clock.mode.name == "SINGLE"
    assert leftover.param_groups[0]["lr"] == 0.1


def test_a_rule_or_probe_switched_off_is_an_event_in_the_trace(tmp_path):
    from nndb.rules.base import Rule
    from nndb.rules.engine import RuleEngine

    class Broken(Rule):
        id = "broken"
        EVERY_STEP = True

        def check(self, ctx):
            raise RuntimeError("bad rule")
    path = str(tmp_path / "t.h5")
    rec = Recording(path, {}, RunConfig(Target(path="x.py"), path, RecordSchedule()), message=print)
    engine = RuleEngine([Broken()])
    engine.attach(rec)
    with rec:
        train(1)
    engine.on_record(rec.recorder.last)
    [msg] = engine.take_errors()
    engine.detach()
    rec.close()
    with TraceReader(path) as t:
        assert [(e["kind"], e["message"]) for e in t.events()] == [("rule_disabled", msg)]


FOLDS = """
import gc, torch
torch.manual_seed(0)
def criterion_of_the_epoch():
    return torch.nn.CrossEntropyLoss()
for fold in range(3):
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    criterion = criterion_of_the_epoch()
    for i in range(3):
        x = torch.randn(8, 4); y = torch.randint(0, 3, (8,))
        loss = criterion(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
    del model, opt, criterion
    gc.collect()
    print("fold", fold, "models alive:", sum(1 for o in gc.get_objects() if type(o) is torch.nn.Sequential),
          "criteria alive:", sum(1 for o in gc.get_objects() if type(o) is torch.nn.CrossEntropyLoss))
"""


def test_a_model_the_script_lets_go_is_freed_as_under_python(tmp_path):
    """A k-fold loop (a new model each fold, the last one deleted): under nndb every fold's
    model stayed alive (models alive: 1, 2, 3 where python prints 0, 0, 0): the module
    names' weak dictionaries held their roots in their values, and the tracer's per-pass
    call counts the last pass's modules.  A whole model per fold, on an accelerator too."""
    from conftest import plain_and_recorded
    plain, _ = plain_and_recorded(tmp_path, FOLDS)
    assert "models alive: 0 criteria alive: 0" in plain.stdout.splitlines()[-1], plain.stdout


PROFILED = '''
import torch, torch.nn as nn
from torch.profiler import profile, ProfilerActivity, schedule
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
sched = torch.optim.lr_scheduler.StepLR(opt, 10)
scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
data = [(torch.randn(16, 8), torch.randint(0, 2, (16,))) for _ in range(2)]

def one_step():
    opt.zero_grad()
    for x, y in data:                  # two micro-batches a step
        loss = nn.functional.cross_entropy(model(x), y) / 2
        scaler.scale(loss).backward()
    scaler.unscale_(opt)
    total = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    sched.step()
    return loss + 0 * total

def table(p):
    return sorted((e.key, e.count) for e in p.key_averages())

# the first steps (step 0, the probes' steps: activations, the loss watch, the input checksum)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(4):
        loss = one_step()
print(table(prof))
# a scheduled profile later on, over observed and usual steps
tables = []
with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
             schedule=schedule(wait=20, warmup=2, active=16),
             on_trace_ready=lambda p: tables.append(table(p))) as prof:
    for _ in range(40):
        loss = one_step()
        prof.step()
print(tables)
print(loss.item())
'''


def test_the_scripts_profile_lists_its_own_ops_alone(tmp_path):
    # (under nndb the script's torch.profiler table listed nndb's ops as the script's:
    # aten::aminmax, cat, stack, linalg_vector_norm, matmul and 20 more, and 148
    # as_strided where the script makes 55)
    from conftest import plain_and_recorded
    plain, _ = plain_and_recorded(tmp_path, PROFILED)
    assert "aten::addmm" in plain.stdout and "aten::linalg_vector_norm" in plain.stdout   # (the script's clip)


def test_a_functional_the_script_wrapped_runs_its_wrapper_once(tmp_path):
    """A script that puts a counting wrapper in the place of F.relu, F.mse_loss and
    F.dropout (a FLOP counter's way): torch hands nndb's function watch the module's
    attribute, the wrapper, and calling it ran the wrapper again inside the script's
    call: 'calls {'mse_loss': 2, 'relu': 2, 'dropout': 2}' after step 0 under nndb, 1 each
    under python.  The watch also saw no loss in it (nndb check: 'no loss function seen')."""
    script = f"{ROOT}/tests/scripts/wrapped_functionals.py"
    plain = python(script, forked=True)
    assert plain.returncode == 0 and "'relu': 1," in plain.stdout.splitlines()[0], plain.stdout
    r = nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "t.h5"), script)
    assert r.returncode == 0 and r.stdout == plain.stdout, r.stdout
    r = nndb("check", script)
    assert "loss: F.mse_loss" in r.stdout and "PASS  shapes        F.mse_loss:" in r.stdout, r.stdout
