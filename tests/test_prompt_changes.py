"""Changes made at the prompt (issue 39, items 3 and 4): a ``set lr`` that
the script sets back is said at the next step end, ``set lr X --hold`` holds
until ``unset``, and a change made at a stop of the live run is part of its
history: kept in the trace and made again by every replay after it (goto,
reverse-step, catch points), so time travel lands on the values the live run
had; a replay that diverges for a change it could not make where it was made
says so, never randomness."""
import os
import re

import pytest

from conftest import Ran, nndb, python
from nndb.store.reader import TraceReader

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork replicas need fork()")

# A warmup loop that sets the learning rate itself at every iteration (as
# nanoGPT's get_lr() does), and prints what it set and the loss.
WARMUP = '''
import sys
import torch, torch.nn as nn
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
x, y = torch.randn(32, 4), torch.randn(32, 1)
held = [float(a) for a in sys.argv[1:]]       # (the plain run of the held lr: lr from to)
def get_lr(it):
    if held and held[1] <= it <= held[2]:
        return held[0]
    return 0.05 * min(1.0, (it + 1) / 4)
for it in range(12):
    lr = get_lr(it)
    for g in opt.param_groups:
        g["lr"] = lr
    opt.zero_grad()
    loss = ((m(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    print(f"it {it} lr {lr} loss {loss.item()!r}")
'''

# A loop that leaves its learning rate alone; ``scale`` is a variable of its frame.
STEADY = '''
import torch, torch.nn as nn
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(m.parameters(), lr=0.05)
x, y = torch.randn(32, 4), torch.randn(32, 1)
scale = 1.0
for it in range(12):
    opt.zero_grad()
    loss = ((m(x) * scale - y) ** 2).mean()
    loss.backward()
    opt.step()
    print(f"it {it} loss {loss.item()!r}")
'''


def _run(tmp_path, text, commands, *extra):
    (tmp_path / "s.py").write_text(text)
    argv = ["run", "--batch", "--nx", "--rules", "none", "--trace", str(tmp_path / "t.h5"), "--force", *extra]
    for c in commands:
        argv += ["-e", c]
    r = Ran(nndb(*argv, "s.py", cwd=str(tmp_path)), argv + ["s.py"])
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    return r


def _each(at: str, commands: list) -> list:
    """Each command from a breakpoint's commands of its own at ``at`` (``break step 2``): a failed
    -e line ends a batch run, and an error in a breakpoint's commands the rest of its list (gdb)."""
    return [c for cmd in commands for c in (at, "commands", cmd, "end")]


def _printed(out: str) -> dict:
    return {int(i): float(v) for i, v in re.findall(r"^it (\d+) .*loss (\S+)$", out, re.M)}


def _said(out: str, tag: str) -> list:
    return re.findall(rf"^\('{tag}', (.*)\)$", out, re.M)


def test_a_set_lr_the_script_sets_back_is_said_at_the_next_step_end(tmp_path):
    r = _run(tmp_path, WARMUP, ["until 3", "set lr 1e-5", "next", 'p ("LR", opt.param_groups[0]["lr"])', "continue"])
    assert "nndb: warning: 'set lr 1e-5' did not hold: opt stepped with lr 0.05 in group 0 at step 4: the " \
           "script sets it itself after the stop (a warmup or schedule in its loop: param_group['lr'] = ..., at " \
           "each step or each epoch's start); " \
           "'set lr 1e-5 --hold' sets it again before each step of opt, until 'unset lr'" in r.stderr, r.stderr
    assert _said(r.stdout, "LR") == ["0.05"]
    # a change that holds says nothing
    r = _run(tmp_path, STEADY, ["until 3", "set lr 0.5", "next", "continue"])
    assert "did not hold" not in r.stderr, r.stderr
    assert re.search(r"opt\s+0\s+lr\s+0.05\s+0.5", r.stdout), r.stdout


# A loop that sets its learning rate at each epoch's start (4 steps an epoch), as
# adjust_learning_rate(optimizer, epoch) loops do, and a StepLR one (the schedule, followed).
EPOCHS = '''
import torch, torch.nn as nn
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
sched = torch.optim.lr_scheduler.StepLR(opt, 3, 0.5) if KIND == "steplr" else None
x, y = torch.randn(32, 4), torch.randn(32, 1)
for epoch in range(4):
    if sched is None:
        for g in opt.param_groups:
            g["lr"] = 0.1 * 0.5 ** epoch
    for i in range(4):
        opt.zero_grad()
        loss = ((m(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        print(f"it {epoch * 4 + i} lr {opt.param_groups[0]['lr']} loss {loss.item()!r}")
'''


def test_a_set_lr_the_script_sets_back_at_the_next_epoch_is_said_then(tmp_path):
    """'set lr 0.001' at step 5 held for steps 6 and 7, and the loop set 0.025 at the next
    epoch's start (step 8): nndb looked at the next step only and never said it; every later
    step is looked at now, and the warning names step 8.  A StepLR schedule followed from the
    change (halving it every 3 steps) is not the change undone, at any step; a second 'set'
    replaces the first's check (no warning for the value the first set)."""
    r = _run(tmp_path, EPOCHS.replace("KIND", '"epochs"'), ["until 5", "set lr 0.001", "continue"])
    assert "nndb: warning: 'set lr 0.001' did not hold: opt stepped with lr 0.025 in group 0 at step 8" in r.stderr, \
        r.stderr
    assert r.stderr.count("did not hold") == 1, r.stderr
    assert re.findall(r"^it (\d+) lr (\S+) ", r.stdout, re.M)[5:9] == [("5", "0.001"), ("6", "0.001"), ("7", "0.001"),
                                                                        ("8", "0.025")]
    r = _run(tmp_path, EPOCHS.replace("KIND", '"steplr"'), ["until 5", "set lr 0.001", "continue"])
    assert "did not hold" not in r.stderr, r.stderr
    assert "lr 0.00025 " in r.stdout, r.stdout          # (0.001 halved twice: the schedule went on, scaled)
    # (a second set replaces the first's check: 0.04 is no undoing of 'set lr 0.001', and the
    # epoch's 0.025 is nearer 0.04 than the 0.001 before it)
    r = _run(tmp_path, EPOCHS.replace("KIND", '"epochs"'), ["until 5", "set lr 0.001", "next", "set lr 0.04",
                                                            "continue"])
    assert "did not hold" not in r.stderr, r.stderr
    assert re.findall(r"^it (\d+) lr (\S+) ", r.stdout, re.M)[5:9] == [("5", "0.001"), ("6", "0.04"), ("7", "0.04"),
                                                                        ("8", "0.025")]


# ReduceLROnPlateau stepped on a validation loss at each epoch's end (3 steps an epoch), one
# that never improves: the lr is halved after every epoch (and, with KIND "reset", a loop that
# also sets the lr at each epoch's start, which undoes a change).
PLATEAU = '''
import torch, torch.nn as nn
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
x, y = torch.randn(32, 4), torch.randn(32, 1)
for epoch in range(3):
    if KIND == "reset":
        opt.param_groups[0]["lr"] = 0.1
    for i in range(3):
        opt.zero_grad()
        ((m(x) - y) ** 2).mean().backward()
        opt.step()
        print(f"it {epoch * 3 + i} lr {opt.param_groups[0]['lr']}")
    sched.step(1.0)
'''


def test_a_set_lr_that_reduce_lr_on_plateau_halves_held(tmp_path):
    """'set lr 0.12' at step 5, an epoch's last (lr 0.1), then ReduceLROnPlateau halved it:
    step 6 ran at 0.06, the change followed (plain Python: 0.05), but nndb warned "'set lr
    0.12' did not hold: opt stepped with lr 0.06 ... the script or its LR scheduler set it
    back", after a note that the scheduler's 'next step() may set the lr again'.  The plateau
    multiplies the lr the group holds: the value set, reduced by its steps or not, held; a
    loop that sets the lr itself is still said."""
    r = _run(tmp_path, PLATEAU.replace("KIND", '"plateau"'), ["until 5", "set lr 0.12", "continue"])
    assert re.findall(r"^it (\d+) lr (\S+)$", r.stdout, re.M)[4:8] == [("4", "0.1"), ("5", "0.12"), ("6", "0.06"),
                                                                       ("7", "0.06")]
    assert "ReduceLROnPlateau multiplies the lr a group holds by 0.5 when its metric stops improving: it goes " \
           "on from the new lr" in r.stdout, r.stdout
    assert "did not hold" not in r.stderr and "set the lr again" not in r.stdout, (r.stdout, r.stderr)
    r = _run(tmp_path, PLATEAU.replace("KIND", '"reset"'), ["until 5", "set lr 0.12", "continue"])
    assert "nndb: warning: 'set lr 0.12' did not hold: opt stepped with lr 0.1 in group 0 at step 6" in r.stderr, \
        r.stderr


def test_set_lr_hold_holds_until_unset_is_recorded_and_replayed(tmp_path):
    r = _run(tmp_path, WARMUP, ["until 3", "set lr 0.01 --hold", "until 7", "info optimizer", "goto 5",
                                'p ("PAST", $step, repr($loss), opt.param_groups[0]["lr"])', "present",
                                "unset lr", "continue"])
    assert "Held: opt's lr is set to 0.01 again before each of its steps" in r.stdout, r.stdout
    assert re.search(r"opt\s+0\s+lr\s+0.01\s+set lr 0.01 --hold", r.stdout), r.stdout        # info optimizer
    assert "Let go of opt's lr in group 0 (held at 0.01)" in r.stdout
    # the script printed what it set; the optimizer stepped with the held value from step 4 to step 7:
    # the losses are those of a plain run whose lr is 0.01 at those iterations, bit for bit
    plain = python(str(tmp_path / "s.py"), "0.01", "4", "7", cwd=str(tmp_path), forked=True)
    assert plain.returncode == 0, plain.stderr
    assert _printed(r.stdout) == _printed(plain.stdout) and len(_printed(plain.stdout)) == 12
    assert re.search(r"^it 5 lr 0.05 loss", r.stdout, re.M)
    with TraceReader(str(tmp_path / "t.h5")) as t:
        lrs = {row["step"]: row["lr"] for row in t.hyper()}
        changes = t.records("change")
    held = {s: lr for s, lr in sorted(lrs.items())}
    assert held.get(4) == 0.01 and held.get(8) == 0.05, held
    assert changes == [{"line": "set lr 0.01 --hold", "step": 3, "place": "end"},
                       {"line": "unset lr", "step": 7, "place": "end"}]
    # time travel replays the hold (from the checkpoint at step 3, taken before it was made)
    step, loss, lr = _said(r.stdout, "PAST")[0].split(", ")
    assert (int(step), float(loss.strip("'")), float(lr)) == (5, _printed(r.stdout)[5], 0.01)


def test_set_takes_gdbs_equals_sign(tmp_path):
    """gdb's 'set var NAME = VALUE' (its only form) was "syntax error in '= 2.0'", and
    'set lr = 0.01' "'= 0.01' is not a number or tuple of numbers"; 'set lr=0.01', predict's
    '--set lr=0.01' form, "set needs a hyper-parameter and a value"."""
    r = _run(tmp_path, STEADY, ["until 2", "set var scale = 2.0", "set variable scale=3.0", "set lr = 0.01",
                                "set momentum=0.5", 'p ("NOW", scale, opt.param_groups[0]["lr"], '
                                'opt.param_groups[0]["momentum"])', "continue"])
    assert "scale (in <module>()): was 1.0, now 2.0" in r.stdout and "was 2.0, now 3.0" in r.stdout, r.stdout
    assert _said(r.stdout, "NOW") == ["3.0, 0.01, 0.5"], r.stdout


@pytest.mark.parametrize("replica", ["fork", "respawn"])
def test_time_travel_after_changes_gives_the_values_the_live_run_had(tmp_path, replica):
    # two changes at two stops; goto 7 resumes from the stop checkpoint at step 5, which holds the
    # first change and not the second (a respawned replay makes both)
    r = _run(tmp_path, STEADY, ["until 3", "set lr 0.5", "until 5", "set var scale 2.0", "until 9", "goto 7",
                                'p ("AT", $step, repr($loss))', "rs", 'p ("AT", $step, repr($loss))', "present",
                                "continue"], "--replica", replica)
    live = _printed(r.stdout)
    at = [(int(s), float(v.strip("'"))) for s, v in (x.split(", ") for x in _said(r.stdout, "AT"))]
    assert at == [(7, live[7]), (6, live[6])], (at, r.stderr)
    assert "diverged" not in r.stderr


def test_catch_after_a_change_replays_the_step_with_it(tmp_path):
    script = '''
import torch, torch.nn as nn
torch.manual_seed(0)
m = nn.Linear(4, 1)
opt = torch.optim.SGD(m.parameters(), lr=0.05)
x, y = torch.randn(16, 4), torch.randn(16, 1)
floor = 2.0
for it in range(10):
    opt.zero_grad()
    out = m(x)
    margin = floor - 0.1 * it + 0.0 * out.mean()
    loss = ((out - y) ** 2).mean() - 0.01 * torch.log(margin)
    loss.backward()
    opt.step()
    print(f"it {it} loss {loss.item()!r}")
'''
    # with floor 0.5 the margin is 0 at step 5: the step-end catch replays step 5 from the checkpoint of
    # the stop at step 2, taken before the change
    r = _run(tmp_path, script, ["catch nonfinite", "until 2", "set var floor 0.5", "continue", 'p ("AT", $step)',
                                "continue"])
    assert "Catchpoint 1 (catch nonfinite): log made Inf in the forward pass of step 5 (s.py:12)" in r.stdout, \
        r.stdout + r.stderr
    assert _said(r.stdout, "AT") == ["5"] and "diverged" not in r.stderr


RESET_EACH_STEP = STEADY.replace("    opt.zero_grad()", "    scale = 1.0\n    opt.zero_grad()")


def test_a_change_inside_a_step_that_a_replay_cannot_make_there_is_named_not_randomness(tmp_path):
    # the script sets scale at the top of each iteration: the change made at the module's breakpoint
    # inside step 4 counts there; a replay makes it at the end of step 3, where the script sets it back
    r = _run(tmp_path, RESET_EACH_STEP, ["break module 0 forward if $step == 4", "commands", "set var scale 2.0",
                                         "end"] + _each("break step 8", ["goto 6", 'p ("AT", $step)']) + ["continue"])
    assert re.search(r"the replay diverged from the recorded run at step 4: loss recorded [\d.e-]+, replayed "
                     r"[\d.e-]+ \(likely cause: the change made at the prompt 'set var scale 2.0' \(made inside step 4; "
                     r"a replay makes it at the end of step 3\): a replay runs from step end to step end",
                     r.stderr), r.stderr
    assert "randomness" not in r.stderr
    assert _said(r.stdout, "AT") == ["8"]                # the user stays where they were
    with TraceReader(str(tmp_path / "t.h5")) as t:
        assert t.records("change") == [{"line": "set var scale 2.0", "step": 4, "place": "inside"}]


def test_unset_and_hold_refuse_what_they_cannot_do(tmp_path):
    r = _run(tmp_path, STEADY, _each("break step 2", ["unset lr", "set scale 3 --hold", "set lr 0.1 --hold",
                                                      "unset lr group 1", "unset momentum"]) + ["continue"])
    assert "lr is not held: 'set lr VALUE --hold' holds it" in r.stderr, r.stderr
    assert "'scale' is a variable of the script's frame: --hold holds an optimizer's hyper-parameter" in r.stderr
    assert "lr is not held (held: opt's lr in group 0)" in r.stderr      # no group 1 held
    assert "momentum is not held (held: opt's lr in group 0)" in r.stderr
    with TraceReader(str(tmp_path / "t.h5")) as t:
        assert [c["line"] for c in t.records("change")] == ["set lr 0.1 --hold"]


def test_a_value_torch_optim_refuses_is_refused_and_nothing_changes(tmp_path):
    """'set lr -1' was taken (torch.optim's constructors refuse it: 'Invalid learning rate'),
    and the run ascended its loss from there; so was a negative momentum."""
    r = _run(tmp_path, STEADY, _each("break step 2", ["set lr -1", "set lr nan", "set momentum -0.5",
                                                      "predict 2 --set lr=-0.01", 'p ("LR", opt.param_groups[0]["lr"])'])
             + ["continue"])
    assert "lr must be >= 0, not -1 (torch.optim builds no optimizer with it)" in r.stderr, r.stderr
    assert "'nan' is not a number" in r.stderr and "--set lr=-0.01: lr must be >= 0, not -0.01" in r.stderr
    assert "opt has no hyper-parameter 'momentum'" in r.stderr or "momentum must be >= 0" in r.stderr, r.stderr
    assert _said(r.stdout, "LR") == ["0.05"]
    assert _printed(r.stdout) == _printed(python(str(tmp_path / "s.py"), forked=True).stdout)
    with TraceReader(str(tmp_path / "t.h5")) as t:
        assert [c["line"] for c in t.records("change")] == []


def test_a_hold_that_cannot_be_applied_is_let_go_and_said_not_raised():
    import torch
    from nndb.debugger.hyperparams import Holds
    m = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD([{"params": [m.weight]}, {"params": [m.bias]}], lr=0.1)
    holds = Holds()
    holds.hold("opt", opt, "lr", 0.5, [1], "set lr 0.5 group 1 --hold")
    holds.hold("opt", opt, "lr", 0.5, [5], "set lr 0.5 group 5 --hold")      # (no group 5: fails at the step)
    for g in opt.param_groups:
        g["lr"] = 0.1
    m(torch.ones(2)).sum().backward()
    opt.step()                                                                 # the training goes on
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.5]
    assert holds.problems == ["nndb: 'set lr 0.5 group 5 --hold' let go of opt's lr in group 5: IndexError: "
                              "list index out of range"]
    assert holds.held() == [("opt", 1, "lr", 0.5, "set lr 0.5 group 1 --hold")]
    assert holds.release("lr") == [("opt", 1, 0.5)] and not opt._optimizer_step_pre_hooks


def test_where_a_replay_makes_each_change():
    from nndb.debugger.changes import Change, due, kept_before, not_as_made
    end, inside, first, start = Change("a", 3), Change("b", 5, "inside"), Change("c", 0, "inside"), \
        Change("d", 0, "start")
    changes = [start, first, end, inside]
    assert due(changes, 3) == [end] and due(changes, 4) == [inside] and due(changes, None) == [start, first]
    assert kept_before(changes, 4) == [start, first, end] and kept_before(changes, 5) == changes
    assert not_as_made(changes, 3, has_start=True) == [first]
    assert not_as_made(changes, 4, has_start=False) == [start, first, inside]
    assert Change.from_dict(inside.as_dict()) == inside
    assert inside.describe() == "'b' (made inside step 5; a replay makes it at the end of step 4)"


def test_a_change_is_data_the_trace_keeps_its_line_and_a_replica_gets_its_edit():
    import json

    from nndb.commands import TABLE
    from nndb.debugger.changes import Change, HyperChange, Release, Statement, VarChange, edit_of
    assert edit_of(TABLE, "set betas (0.9, 0.99) group 1 optimizer Adam --hold") == \
        HyperChange("Adam", 1, "betas", (0.9, 0.99), hold=True)
    assert edit_of(TABLE, "set var x 2*3") == VarChange("x", "2*3")
    assert edit_of(TABLE, "unset lr group 0") == Release("lr", 0)
    assert edit_of(TABLE, "!x = 1") == Statement("x = 1") and edit_of(TABLE, "echo hi") is None
    for line in ("set lr 0.5 rank 0", "set betas (0.9, 0.99) --hold", "set var x 2*3", "py x = 1", "unset lr"):
        change = Change(line, 3, "end", edit_of(TABLE, line))
        assert change.as_dict() == {"line": line, "step": 3, "place": "end"}       # (the trace's event, as before)
        back = Change.from_dict(json.loads(json.dumps(change.message())))
        assert back == change and back.edit == change.edit


def test_predict_reads_one_request_for_one_process_and_a_job():
    from nndb.errors import CommandError
    from nndb.timetravel.predict import Prediction, PredictRequest, Setting, parse_request
    assert parse_request("3 --set lr=1e-4 --set=SGD.momentum=0.5") == \
        PredictRequest(3, (Setting("lr", "1e-4"), Setting("SGD.momentum", "0.5")))
    assert parse_request("").steps == 1
    for bad in ("0", "--set lr", "--set lr=", "--set 1x=2"):
        with pytest.raises(CommandError):
            parse_request(bad)
    p = Prediction.from_message({"op": "predicted", "rows": [{"step": 4, "loss": 1.0, "grad_norm": None,
                                                              "findings": []}], "stopped": None})
    assert p.rows[0]["step"] == 4 and p.error is None and p.undone == []
    assert Prediction.from_message(None) == Prediction()


def test_a_divergence_that_is_not_the_change_is_still_said_as_before(tmp_path):
    # the script reads a file that it changes at step 6: a replay after the change made at step 2 (made
    # again exactly, at its step end) diverges for the file, and says so
    (tmp_path / "scale.txt").write_text("1.0")
    script = STEADY.replace("    opt.zero_grad()", "    scale = float(open('scale.txt').read())\n    opt.zero_grad()") \
        .replace('    print(f"it {it}', '    if it == 6:\n        open("scale.txt", "w").write("3.0")\n'
                                        '    print(f"it {it}')
    r = _run(tmp_path, script, ["until 2", "set lr 0.2"] + _each("break step 8", ["goto 4", 'p ("AT", $step)'])
             + ["continue"], "--replica", "fork")
    assert re.search(r"the replay diverged from the recorded run at step 3: loss recorded [\d.e-]+, replayed "
                     r"[\d.e-]+ \(likely cause: randomness the checkpoint does not hold, a file that changed since, "
                     r"or threads\)", r.stderr), r.stderr
    assert "made at the prompt" not in r.stderr and _said(r.stdout, "AT") == ["8"]


WARNS_WITH_SCHEDULER = '''
import warnings
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
for step in range(8):
    warnings.warn("the script's own warning")
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step(); sched.step()
    print("lr", opt.param_groups[0]["lr"])
'''


def test_set_lr_with_a_scheduler_leaves_the_scripts_once_per_line_warnings_shown_once(tmp_path):
    """'set lr' copies the script's schedulers (to tell what the lr becomes) with their
    warnings off: ``warnings.catch_warnings`` marked the filters changed, which emptied
    Python's once-per-line registries, and the script's own warning showed 3 times in
    8 steps where plain python shows it once."""
    script = tmp_path / "w.py"
    script.write_text(WARNS_WITH_SCHEDULER)
    plain = python(str(script))
    r = Ran(nndb("run", "--batch", "-q", "--trace", str(tmp_path / "t.h5"), "-e", "break step 2",
                 "-e", "continue", "-e", "set lr 0.01", "-e", "continue", str(script), cwd=str(tmp_path)))
    assert r.returncode == 0, r
    assert plain.stderr.count("UserWarning: the script's own warning") == 1
    assert r.stderr.count("UserWarning: the script's own warning") == 1, r
    assert "StepLR follows: group 0 base_lrs 0.1 -> 0.01" in r.stdout, r
    assert r.stdout.splitlines()[-6:] == ["lr 0.005"] * 3 + ["lr 0.0025"] * 3, r


# A CosineAnnealingLR driven as an engine's handler drives it (ignite's LRScheduler): at each
# iteration's start the lrs from get_lr(), then last_epoch moved on by hand; no sched.step().
BY_HAND_SCHEDULE = '''
import torch, torch.nn as nn
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(m.parameters(), lr=0.05)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10, eta_min=0.001)
x, y = torch.randn(32, 4), torch.randn(32, 1)
for it in range(10):
    sched._get_lr_called_within_step = True
    for g, lr in zip(opt.param_groups, sched.get_lr()):
        g["lr"] = lr
    sched._get_lr_called_within_step = False
    sched.last_epoch += 1
    opt.zero_grad()
    loss = ((m(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    print(f"it {it} lr {opt.param_groups[0]['lr']!r} loss {loss.item()!r}")
'''


def test_a_set_lr_that_a_schedule_driven_by_hand_follows_is_not_said_undone(tmp_path):
    """'set lr 0.01' at step 2 (lr 0.04532), the schedule followed from it (every later lr the
    plain run's times 0.01 / 0.04532: 0.008804 at step 3 for 0.03990): nndb said it did not
    hold, having taken the scheduler's closed form (0.007297 at step 3) for what it gives,
    where its lrs are its get_lr()'s chained from the last."""
    (tmp_path / "s.py").write_text(BY_HAND_SCHEDULE)
    plain = {int(i): float(lr) for i, lr in re.findall(r"^it (\d+) lr (\S+) ", python(str(tmp_path / "s.py")).stdout,
                                                        re.M)}
    r = _run(tmp_path, BY_HAND_SCHEDULE, ["until 2", "set lr 0.01", "continue"])
    assert "CosineAnnealingLR follows: group 0 base_lrs 0.05 -> 0.0110324" in r.stdout, r.stdout
    assert "did not hold" not in r.stderr, r.stderr
    got = {int(i): float(lr) for i, lr in re.findall(r"^it (\d+) lr (\S+) ", r.stdout, re.M)}
    for it in range(3, 10):
        assert got[it] == pytest.approx(plain[it] * 0.01 / plain[2], rel=1e-9), it


# A scheduler that keeps each group's lrs in values of its own, numpy arrays (skorch's
# WarmRestartLR's min_lr and max_lr), stepped at each epoch's end (4 steps an epoch).
OWN_LRS_SCHEDULE = '''
import numpy as np
import torch, torch.nn as nn
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(m.parameters(), lr=0.05)

class Restarts(torch.optim.lr_scheduler.LRScheduler):
    def __init__(self, optimizer, low, high, period):
        self.low = np.full(len(optimizer.param_groups), low)
        self.high = np.full(len(optimizer.param_groups), high)
        self.period = period
        super().__init__(optimizer)
    def get_lr(self):
        t = (self.last_epoch % self.period) / self.period
        return list(self.low + 0.5 * (self.high - self.low) * (1 + np.cos(np.pi * t)))

sched = Restarts(opt, 0.001, 0.05, 3)
x, y = torch.randn(32, 4), torch.randn(32, 1)
for epoch in range(3):
    for i in range(4):
        opt.zero_grad()
        loss = ((m(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        print(f"it {epoch * 4 + i} lr {opt.param_groups[0]['lr']!r} loss {loss.item()!r}")
    sched.step()
'''


def test_a_set_lr_that_a_schedule_of_its_own_lrs_sets_back_is_said(tmp_path):
    """'set lr 0.2' at step 5 under a scheduler whose lrs come from values of its own: nndb
    scaled base_lrs, which it never reads, said 'Restarts follows: group 0 base_lrs 0.05 ->
    0.264901 (the schedule goes on from the new lr)', and the epoch's end set 0.01325 (step 8,
    where the schedule followed from 0.2 gives 0.0702) without a word.  A dry run of the schedulers' next step on copies now tells: nndb says the
    schedule does not follow, and the step that set the lr back is said."""
    r = _run(tmp_path, OWN_LRS_SCHEDULE, ["until 5", "set lr 0.2", "continue"])
    assert "follows:" not in r.stdout, r.stdout
    assert re.search(r"Restarts does not follow the change: its next step\(\) sets lr 0\.0132\d* in group 0, where "
                     r"the schedule followed from the new lr gives 0\.\d+", r.stdout), r.stdout
    assert re.search(r"nndb: warning: 'set lr 0.2' did not hold: opt stepped with lr 0\.0132\d* in group 0 at step 8",
                     r.stderr), r.stderr
    got = re.findall(r"^it (\d+) lr (\S+) ", r.stdout, re.M)
    assert [lr for _, lr in got[5:8]] == ["0.2"] * 3, got


def test_predict_says_a_set_lr_that_a_schedule_of_its_own_lrs_sets_back(tmp_path):
    """'predict 4 --set lr=0.2' at step 5 under the same scheduler: its epoch's end set the
    lr back to 0.01325 at step 8, and the prediction said nothing (under a scheduler it looked
    at the first predicted step only)."""
    r = _run(tmp_path, OWN_LRS_SCHEDULE, ["until 5", "predict 4 --set lr=0.2", "kill"])
    assert re.search(r"Warning: the change lr=0.2 did not hold: it was \[0\.0132\d*\] after step 8 \(before the "
                     r"change \[0\.03775\d*\]\)", r.stdout), r.stdout
