"""Tensor lineage end to end: catch nan at the operation that made it, origin
of a NaN parameter, lineage asked after the fact equal to lineage recorded
live, the module graph of a small CNN, and the trace's de-duplication."""
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT, Ran, example, nndb
from nndb.lineage.graph import StepGraph
from nndb.store.reader import TraceReader
from nndb.text import fmt

LOG_LOSS = textwrap.dedent('''
    import torch, torch.nn as nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3), nn.Softmax(dim=1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def my_loss(p, y):
        onehot = nn.functional.one_hot(y, 3).float()
        if step == 3:
            p = p * onehot                       # the other classes get a probability of exactly 0
        logp = torch.log(p)                      # LOG LINE
        return -(onehot * logp).sum(1).mean()    # 0 * -inf = NaN

    for step in range(6):
        x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
        loss = my_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("done")
''')

CNN = textwrap.dedent('''
    import torch, torch.nn as nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(4 * 4 * 4, 5))
    criterion = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(6):
        x, y = torch.randn(8, 3, 8, 8), torch.randint(0, 5, (8,))
        loss = criterion(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
''')


def _script(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def _argv(tmp_path, script, *args, trace="t.h5") -> list:
    return ["run", "--batch", "--nx", "--rules", "none", "--trace", str(tmp_path / trace), *args, script]


def _run(tmp_path, script, *args, trace="t.h5"):
    r = nndb(*_argv(tmp_path, script, *args, trace=trace), cwd=str(tmp_path))
    assert "Traceback" not in r.stderr, r.stderr
    return r


CHECKPOINTED = textwrap.dedent('''
    import sys, torch, torch.nn as nn
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0)
    REENTRANT = sys.argv[1] == "reentrant"
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.bad = nn.Linear(16, 16), False
        def forward(self, x):
            h = self.fc(x)
            if self.bad:
                h = torch.log(h)               # LOG LINE: NaN where h < 0
            return torch.relu(h)
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(8, 16), Block(), nn.Linear(16, 1)
        def forward(self, x):
            return self.c(checkpoint(self.b, self.a(x), use_reentrant=REENTRANT))
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x, y = torch.randn(32, 8, requires_grad=REENTRANT), torch.randn(32, 1)
    for step in range(4):
        net.b.bad = step == 2
        loss = ((net(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
''')


@pytest.mark.parametrize("mode,flags", [("plain", ["--eager"]), ("reentrant", [])])
def test_catch_nan_names_a_checkpointed_op_once_not_again_at_its_recomputation(tmp_path, mode, flags):
    """Activation checkpointing runs a block's forward again in the backward: the
    log that made the NaN was a second catch, 'log made NaN in the backward pass
    of step 2 (module net, CheckpointFunctionBackward)' (reentrant; 'module b,
    ReluBackward0' otherwise), a second source where there is one: with the
    replay's catch, a second line at the stop; with --eager, a second stop."""
    script = _script(tmp_path, "ck.py", CHECKPOINTED)
    log_line = 1 + CHECKPOINTED.splitlines().index(next(l for l in CHECKPOINTED.splitlines() if "LOG LINE" in l))
    r = nndb(*_argv(tmp_path, script, "-e", " ".join(["catch nan", *flags]), "-e", "continue", "-e", "continue")[:-1],
             script, mode, cwd=str(tmp_path))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    catches = [l for l in r.stdout.splitlines() if l.startswith("Catchpoint 1 (catch nan")]
    assert len(catches) == 1, r.stdout
    assert catches[0].endswith(f"log made NaN in the forward pass of step 2 (module b, ck.py:{log_line})"), r.stdout


# DDP's reducer's shape: as the backward ends (autograd's final callback, no node running) the
# gradients are copied out of a flat bucket that a collective filled: another rank's NaN comes in there
FINAL_CALLBACK = textwrap.dedent('''
    import torch, torch.nn as nn
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    bucket = torch.zeros(5)
    filled = torch.tensor([float("nan"), 0., 0., 0., 0.])
    def finish():
        flat = bucket.as_strided((5,), (1,))   # BUCKET LINE
        model.weight.grad.copy_(flat[:4].view(1, 4)); model.bias.grad.copy_(flat[4:])
    def hook(g):
        torch.autograd.Variable._execution_engine.queue_callback(finish)
        return g
    model.weight.register_hook(hook)
    for step in range(4):
        if step == 2:
            bucket = filled
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
''')


@pytest.mark.parametrize("flags", [["--eager"], []], ids=["eager", "replayed"])
def test_catch_nan_in_a_backward_s_final_callback_is_in_the_backward_pass(tmp_path, flags):
    """An operation of a backward that runs in no autograd node (DDP's reducer copying the
    all-reduced gradient buckets back, where a NaN of another rank comes in) was said to be
    'in the forward pass' (the last phase seen), its NaN from 'the batch, or a tensor kept
    from before it' (a 2-rank job's rank 0: 'NaN came into step 2 in input 0 of as_strided
    ... in the forward pass (train.py:50)', its line loss.backward())."""
    script = _script(tmp_path, "cb.py", FINAL_CALLBACK)
    line = 1 + FINAL_CALLBACK.splitlines().index(next(l for l in FINAL_CALLBACK.splitlines() if "BUCKET LINE" in l))
    r = _run(tmp_path, script, "-e", " ".join(["catch nan", *flags]), "-e", "continue", "-e", "kill")
    (catch,) = [l for l in r.stdout.splitlines() if l.startswith("Catchpoint 1 (catch nan")]
    assert catch.endswith("NaN came into step 2 in input 0 of as_strided (made by no operation of the step: the "
                          "batch, or a tensor kept from before it, or one a collective filled: DDP's all-reduce of "
                          f"the ranks' gradients), in the backward pass (cb.py:{line})"), r.stdout


def test_catch_nan_stops_at_the_log_that_made_it_with_its_source_line(tmp_path):
    script = _script(tmp_path, "train.py", LOG_LOSS)
    log_line = 1 + LOG_LOSS.splitlines().index(next(l for l in LOG_LOSS.splitlines() if "LOG LINE" in l))
    r = _run(tmp_path, script, "--report", str(tmp_path / "r.json"), "-e", "catch nan", "-e", "continue",
             "-e", "p step", "-e", "kill")
    assert re.search(rf"Catchpoint 1 \(catch nan\): log made Inf in the forward pass of step 3 "
                     rf"\(train.py:{log_line}\)", r.stdout), r.stdout
    assert "then mul turned it into NaN" in r.stdout
    assert "input 0 of mul: float32 (16, 3)" in r.stdout
    assert "\n3\n" in r.stdout                        # stopped inside step 3, in the script's frame
    stop = json.loads((tmp_path / "r.json").read_text())["stops"][0]
    assert stop["reason"] == "catchpoint" and stop["step"] == 3
    d = stop["detail"]
    assert d["op"] == "log" and d["file"].endswith("train.py") and d["line"] == log_line
    assert d["module"] is None and d["via"]["op"] == "mul"


# A causal attention as GPTs write it: the mask's -inf is made every step and the softmax
# absorbs it.  At step 3 the values' path goes Inf ('made': a gain overflows in the step;
# 'param': the value weight holds an Inf when the step starts) and the weights' zeros from the
# mask turn it into NaN in w @ v.
CAUSAL = textwrap.dedent('''
    import sys, torch, torch.nn as nn

    class Attention(nn.Module):
        def __init__(self, d, t):
            super().__init__()
            self.q, self.k, self.v = (nn.Linear(d, d, bias=False) for _ in range(3))
            self.register_buffer("mask", torch.triu(torch.ones(t, t), diagonal=1).bool())
            self.gain = 1.0

        def forward(self, x):
            q, k, v = self.q(x), self.k(x), self.v(x)                # V LINE
            v = v * self.gain                                        # GAIN LINE
            scores = q @ k.transpose(1, 2)
            scores.masked_fill_(self.mask, -torch.inf)               # MASK LINE
            w = torch.softmax(scores / k.shape[-1] ** 0.5, dim=-1)
            return w @ v                                             # BMM LINE

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), Attention(8, 6), Attention(8, 6), nn.Flatten(), nn.Linear(48, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(5, 6, 4), torch.randint(0, 3, (5,))
    for step in range(5):
        if step == 3:
            if sys.argv[1] == "made":
                model[1].gain = 1e39                     # past float32: Inf
            elif sys.argv[1] == "param":
                with torch.no_grad():
                    model[1].v.weight[0, 0] = float("inf")
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
''')


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("how", ["made", "param"])
def test_catch_nan_from_an_inf_follows_the_inf_not_a_causal_masks_absorbed_inf(tmp_path, how, eager):
    """The NaN made in w @ v from the values' Inf was said to come from the causal mask:
    'masked_fill_ made Inf in the forward pass of step 3 ... then bmm turned it into NaN'
    (the latest operation that made an Inf among all of bmm's ancestors, through the
    softmax whose output was finite); the Inf that bmm got came from v."""
    script = _script(tmp_path, "attn.py", CAUSAL)
    lines = CAUSAL.splitlines()
    at = {k: 1 + lines.index(next(l for l in lines if k in l)) for k in ("V LINE", "GAIN LINE", "BMM LINE")}
    r = nndb(*_argv(tmp_path, script, "--report", str(tmp_path / "r.json"), "-e", "catch nan" + " --eager" * eager,
                    "-e", "continue", "-e", "kill"), how, cwd=str(tmp_path))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "masked_fill_" not in r.stdout, r.stdout
    if how == "made":
        head = f"mul made Inf in the forward pass of step 3 (module 1, attn.py:{at['GAIN LINE']})"
    else:
        head = (f"Inf came into step 3 in input 0 of t (param 1.v.weight), in the forward pass "
                f"(module 1.v, attn.py:{at['V LINE']})")
    # (the lines of the Inf's maker's inputs, where it has them, come between)
    assert re.search(re.escape(f"Catchpoint 1 (catch nan{' --eager' * eager}): {head}\n") + r"(  (input|other) .*\n)*"
                     + re.escape(f"  then bmm turned it into NaN (forward, module 1, attn.py:{at['BMM LINE']})"),
                     r.stdout), r.stdout
    d = json.loads((tmp_path / "r.json").read_text())["stops"][0]["detail"]
    assert d["step"] == 3 and d["via"]["op"] == "bmm" and d["nan"] is False
    assert (d["op"], d.get("label")) == (("mul", None) if how == "made" else ("t", "param 1.v.weight"))


def test_the_step_end_catch_passes_over_a_causal_masks_inf_that_the_softmax_absorbs(tmp_path):
    """Every step's masked_fill_(mask, -inf) makes an Inf from finite inputs, which the
    softmax takes back to finite: 'catch nonfinite' named it at the step the values went Inf,
    a second line after the mul that did (and a third, the second block's: 'masked_fill_ made
    Inf in the forward pass of step 3 (module 1, attn.py:16)'); in LLMs-from-scratch's GPT,
    an Inf that came into block 2's values read as both blocks' masks and nothing else.  The
    step-end catch names what reached the step's record."""
    script = _script(tmp_path, "attn.py", CAUSAL)
    r = nndb(*_argv(tmp_path, script, "-e", "catch nonfinite", "-e", "continue", "-e", "kill"), "made",
             cwd=str(tmp_path))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    catches = [line for line in r.stdout.splitlines() if line.startswith("Catchpoint 1 (catch nonfinite)")]
    assert len(catches) == 1 and "mul made Inf in the forward pass of step 3 (module 1," in catches[0], r.stdout
    assert "masked_fill_" not in r.stdout, r.stdout


@pytest.mark.parametrize("kind", ["nan", "nonfinite"])
def test_a_nan_that_came_in_after_a_causal_mask_is_named_where_it_came_in(tmp_path, kind):
    """A NaN put into block 2's value weight at a stop came into step 3 there; the first
    block's causal mask had made its -inf before it in the step, and a NaN coming in was
    looked for only in a step with no event yet: 'step 3 made NaN (...), but the operation
    could not be located'."""
    script = _script(tmp_path, "attn.py", CAUSAL)
    r = nndb(*_argv(tmp_path, script, "-e", "break step 2", "-e", "continue",
                    "-e", "!model[2].v.weight.data[0, 0] = float('nan')", "-e", f"catch {kind}",
                    "-e", "continue", "-e", "kill"), "none", cwd=str(tmp_path))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert f"Catchpoint 2 (catch {kind}): NaN came into step 3 in input 0 of t (param 2.v.weight), " \
           f"in the forward pass (module 2.v, attn.py:" in r.stdout, r.stdout


def test_catch_nan_under_every_says_the_steps_it_did_not_look_at(tmp_path):
    """--every 2 records steps 0, 2, 4: the log made Inf in step 3, which no record holds, and the
    catch stopped at step 4 saying the NaN "came into step 4" from a parameter, with nothing
    said of step 3; 'goto 2' then 'continue' (eager in the past) finds the log."""
    script = _script(tmp_path, "train.py", LOG_LOSS)
    r = _run(tmp_path, script, "--every", "2", "-e", "catch nan", "-e", "continue", "-e", "goto 2",
             "-e", "continue", "-e", 'p ("AT", step)', "-e", "present", "-e", "kill")
    first = r.stdout.split("In the past")[0]
    assert "Catchpoint 1 (catch nan)" in first and "step 4" in first, r.stdout
    assert ("(step 3 before it was not recorded (--every 2) and not looked at: a NaN or Inf made there is "
            "found first at step 4; 'goto 2' then 'continue' checks them operation by operation)") in first, first
    past = r.stdout.split("In the past")[1]
    assert re.search(r"Catchpoint 1 \(catch nan\): log made Inf in the forward pass of step 3 ", past), past
    assert "('AT', 3)" in past and "not recorded" not in past.split("('AT'")[0].split("\n", 1)[1]
    r = _run(tmp_path, script, "-e", "catch nan", "-e", "continue", "-e", "kill", trace="every1.h5")
    assert "not recorded" not in r.stdout and "log made Inf in the forward pass of step 3" in r.stdout


# A NaN at step 0, and before it a tensor made with torch.empty where NaN bits lie (the
# memory of one freed just before: nn.Linear's weights are made so, then initialised).
EMPTY_FIRST = textwrap.dedent('''
    import torch, torch.nn as nn
    torch.manual_seed(0)
    junk = torch.full((4096,), -1, dtype=torch.int32)     # (0xffffffff: a float32 NaN's bits)
    del junk
    w = torch.empty(4096)                        # EMPTY LINE: NaN bits, no value yet
    nn.init.uniform_(w)
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        loss = model(torch.randn(8, 4)).sum() * w.sum() + torch.log(torch.tensor(-1.0))   # LOG LINE
        opt.zero_grad()
        loss.backward()
        opt.step()
''')


RAISES_AT_ITS_NAN = textwrap.dedent('''
    import torch
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        x = torch.randn(8, 4)
        if step == 2:
            x[0, 0] = float("nan")
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)   # raises at the NaN
        opt.step()
''')


def _says_it_missed(tmp_path, script, rules, error, series):
    """Runs ``script`` under 'catch nan': it raises ``error`` in step 2, and the
    catch point's one line says the step went non-finite in ``series``."""
    r = nndb("run", "--batch", "--nx", "-q", "--trace", str(tmp_path / "t.h5"), *rules, "-e", "catch nan", script,
             cwd=str(tmp_path))
    assert r.returncode == 1 and error in r.stderr
    said = [l for l in r.stderr.splitlines() if l.startswith("nndb: catchpoint")]
    assert said == [f"nndb: catchpoint 1 (catch nan): step 2 went non-finite ({series}), but the script raised in "
                    "it, before the step's end where the catch looks, and a step that raised cannot be replayed: "
                    "'catch nan --eager', then 'run', stops inside the operation"], r.stderr
    return r


@pytest.mark.parametrize("rules", [[], ["--rules", "none"]])
def test_catch_nan_at_the_step_end_says_it_missed_a_step_the_script_raised_in(tmp_path, rules):
    """The script raised in the step that went NaN (its own check, here
    clip_grad_norm_'s error_if_nonfinite): the step never ended, where a step-end
    catch looks, and no replay reaches into a step that raised ('goto 1' then
    'continue' says the past ends there), so 'catch nan' said nothing at all."""
    script = _script(tmp_path, "train.py", RAISES_AT_ITS_NAN)
    _says_it_missed(tmp_path, script, rules, "RuntimeError: The total norm of order 2.0",
                    "act model, grad weight, grad bias, loss")
    eager = nndb("run", "--batch", "--nx", "-q", "--trace", str(tmp_path / "e.h5"), *rules, "-e",
                 "catch nan --eager", script, cwd=str(tmp_path))
    assert "nndb: catchpoint" not in eager.stderr                  # (it stopped inside the operation)
    assert "NaN came into step 2 in input 0 of lift_fresh" in eager.stdout


def test_a_script_that_exits_on_its_nan_loss_keeps_the_steps_forward_passes(tmp_path):
    """DINO's loop: 'if not math.isfinite(loss.item()): sys.exit(1)', before backward().  Only
    an Exception counted as the script raising in the step: on SystemExit(1) the step's forward
    passes, which no backward would claim, were dropped (its NaN activations not in the trace),
    catch nan said nothing and nonfinite found nothing (main_dino.py with a NaN crop at step 3:
    'Loss is nan, stopping training', and nndb silent)."""
    script = os.path.join(ROOT, "tests", "scripts", "self_distillation.py")
    r = nndb("run", "--batch", "--nx", "-q", "--trace", str(tmp_path / "t.h5"), "-e", "catch nan", script,
             "--nan-at", "3", cwd=str(tmp_path))
    assert r.returncode == 1 and "loss is nan, stopping" in r.stdout
    said = [line for line in r.stderr.splitlines() if line.startswith("nndb: ")]
    assert said[0].startswith("nndb: catchpoint 1 (catch nan): step 3 went non-finite (act student.backbone.0#3, "), said
    assert said[1] == ("nndb: error: nonfinite at step 3 (judged as the script raised): NaN first appeared in act "
                       "student.backbone.0#3 (1536 element(s)); its norm at step 2 was 39.72"), said
    with TraceReader(str(tmp_path / "t.h5")) as t:
        steps, nans = t.history(t.find("student.backbone.0#3", "act")[0], "nan_count")
    assert steps.tolist() == [0, 1, 2, 3] and nans.tolist() == [0, 0, 0, 1536]    # (step 3, partial)


INF_THEN_NAN = textwrap.dedent('''
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Flatten(), torch.nn.Linear(8, 16),
                                torch.nn.Tanh(), torch.nn.Linear(16, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e30, weight_decay=0.01)
    for step in range(4):
        x = torch.randint(0, 10, (8, 2))
        y = torch.randint(0, 10, (8,))
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print("step", step, loss.item(), int(logits.isinf().sum()), int(logits.isnan().sum()))
''')


@pytest.mark.parametrize("eager", [[], ["--eager"]])
def test_catch_nan_names_the_inf_an_earlier_step_made(tmp_path, eager):
    """An lr of 1e30: step 1's update (AdamW's weight decay, mul_) made the
    weights Inf, and step 2's addmm a NaN from them; the stop named step 2's
    addmm alone ("addmm made NaN ... step 2"), eager or at the step end (whose
    replay of step 1 had found the Inf and thrown it away), where the docs
    promise the operation that made the Inf.  (Step 1's forward made an Inf
    too, in module 2's output, which the tanh after it took back to finite
    values: absorbed, no NaN's beginning.)"""
    script = _script(tmp_path, "train.py", INF_THEN_NAN)
    plain = subprocess.run([sys.executable, script], capture_output=True, text=True, cwd=str(tmp_path))
    # (step 1: a loss far past float32's usual range, finite; its digits differ between CPUs)
    assert re.search(r"^step 1 [0-9.]+e\+(2[0-9]|3[0-8]) 0 0$", plain.stdout, re.M), plain.stdout
    assert "step 2 nan" in plain.stdout, plain.stdout
    r = nndb("run", "--batch", "--nx", "-q", "--trace", str(tmp_path / "t.h5"), "--rules", "none",
             "-e", " ".join(["catch nan"] + eager), script,
             cwd=str(tmp_path))
    out = r.stdout
    assert "Catchpoint 1 (catch nan" in out and "mul_ made Inf in the optimizer pass of step 1 (train.py:14)" \
        in out, out
    assert "the run's first Inf; then, in step 2, addmm turned Inf into NaN (forward, module 2, " \
        "train.py:10)" in out, out
    assert "made NaN" not in out
    assert plain.stdout.splitlines() == [l for l in out.splitlines() if l.startswith("step ")]


# the same loop with the usual guard, which raises at step 2's NaN loss, before backward()
RAISES_BEFORE_BACKWARD = INF_THEN_NAN.replace("    opt.zero_grad()\n", "    if not torch.isfinite(loss):\n"
                                              "        raise ValueError(f'loss is {loss.item()} at step {step}')\n"
                                              "    opt.zero_grad()\n", 1)


@pytest.mark.parametrize("rules", [[], ["--rules", "none"]])
def test_catch_nan_says_it_missed_a_step_the_script_raised_in_before_backward(tmp_path, rules):
    """The script's own guard (``if not torch.isfinite(loss): raise``) raised
    before backward() at step 2's NaN: the step's forward passes waited for a
    backward that never came and were dropped, the step left no record, and
    'catch nan' said nothing."""
    script = _script(tmp_path, "train.py", RAISES_BEFORE_BACKWARD)
    _says_it_missed(tmp_path, script, rules, "ValueError: loss is nan at step 2",
                    "act 0, act 1, act 2, act 3 and 2 more")
    with TraceReader(str(tmp_path / "t.h5")) as t:
        steps, nans = t.history(t.find("model", "act")[0], "nan_count")
    assert steps.tolist() == [0, 1, 2] and nans.tolist() == [0, 0, 80]    # (step 2, partial: logits.isnan().sum())


EXP_OVERFLOW = textwrap.dedent('''
    import torch
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, x in enumerate(torch.randn(3, 8, 4)):
        opt.zero_grad()
        y = model(x)
        z = y
        if step == 1:
            a = y * 1000
            print("exp input", a.min().item(), a.max().item())
            big = torch.exp(a)                                   # EXP LINE
            z = 0 * big                                          # MUL LINE
        loss = z.pow(2).mean()
        loss.backward()
        opt.step()
        print("step", step, loss.item())
''')


@pytest.mark.parametrize("eager", [False, True])
def test_catch_nan_from_an_inf_lists_each_operations_own_inputs(tmp_path, eager):
    """exp overflowed (an input of max 138.1) and 0 * inf made the NaN: the stop named exp and
    listed under it "input 0 of mul: ... inf 1", mul's inputs, which the report's detail gave as
    exp's (``op`` exp, ``inputs`` mul's); nothing said the Inf in mul's input was exp's, nor
    that mul's other factor was the number 0 (no tensor: not listed at all)."""
    script = _script(tmp_path, "train.py", EXP_OVERFLOW)
    lines = EXP_OVERFLOW.splitlines()
    exp_line, mul_line = (1 + lines.index(next(l for l in lines if k in l)) for k in ("EXP LINE", "MUL LINE"))
    plain = subprocess.run([sys.executable, script], capture_output=True, text=True, cwd=str(tmp_path))
    lo, hi = (float(v) for v in plain.stdout.splitlines()[1].split()[2:4])
    r = _run(tmp_path, script, "--report", str(tmp_path / "r.json"), "-e", "catch nan" + " --eager" * eager,
             "-e", "continue", "-e", "kill")
    assert f"exp made Inf in the forward pass of step 1 (train.py:{exp_line})\n" \
           f"  input 0 of exp: float32 (8, 3): min {fmt(lo)}, max {fmt(hi)}, mean" in r.stdout, r.stdout
    assert f"  then mul turned it into NaN (forward, train.py:{mul_line})\n" \
           f"  input 0 of mul: float32 (8, 3): min 0, max inf, mean inf, nan 0, inf 1 (its Inf made by exp in " \
           f"the forward pass, train.py:{exp_line})\n  other of mul: the number 0\n" in r.stdout, r.stdout
    d = json.loads((tmp_path / "r.json").read_text())["stops"][0]["detail"]
    assert d["op"] == "exp" and [(x["min"], x["max"], x["inf"]) for x in d["inputs"]] == [(lo, hi, 0)], d
    v = d["via"]
    assert v["op"] == "mul" and v["numbers"] == [["other", 0]], v
    assert [(x["inf"], x["from"]["op"], x["from"]["line"]) for x in v["inputs"]] == [(1, "exp", exp_line)], v


def test_catch_nan_is_not_the_uninitialised_memory_of_torch_empty(tmp_path):
    """A replay of step 0 checks every operation from the script's start: the output of
    torch.empty (nn.Linear's weight before its init) held NaN bits, and catch nan said
    'empty made NaN in the forward pass of step 0' at the model's line."""
    script = _script(tmp_path, "train.py", EMPTY_FIRST)
    log_line = 1 + EMPTY_FIRST.splitlines().index(next(l for l in EMPTY_FIRST.splitlines() if "LOG LINE" in l))
    r = _run(tmp_path, script, "-e", "catch nan", "-e", "continue", "-e", "kill")
    hits = re.findall(r"Catchpoint 1 \(catch nan\): (\w+) made NaN in the forward pass of step (\d+) \(train.py:(\d+)\)",
                      r.stdout)
    assert hits and hits[0] == ("log", "0", str(log_line)), r.stdout


def test_a_disabled_catch_point_catches_nothing_until_enabled_again(tmp_path):
    """What a step end reads of the catch points follows ``disable`` and ``enable`` at
    the prompt (the list is kept while the points stand: Points.version)."""
    script = _script(tmp_path, "train.py", LOG_LOSS)
    r = _run(tmp_path, script, "-e", "catch nan", "-e", "disable 1", "-e", "continue")
    assert "Catchpoint 1 (catch nan)" not in r.stdout and r.returncode == 0, r.stdout
    r = _run(tmp_path, script, "-e", "catch nan", "-e", "disable 1", "-e", "break step 2", "-e", "continue",
             "-e", "enable 1", "-e", "continue", "-e", "p step", "-e", "kill", trace="t2.h5")
    assert "Breakpoint 2, step 2" in r.stdout and "Catchpoint 1 (catch nan): log made Inf" in r.stdout, r.stdout
    assert r.stdout.index("Breakpoint 2,") < r.stdout.index("Catchpoint 1 (") and "\n3\n" in r.stdout


SQRT_OF_ZERO = textwrap.dedent('''
    import torch, torch.nn as nn
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):
        x = torch.randn(16, 4) * (0.0 if step == 3 else 1.0)
        d = model(x) - model.bias                  # exactly 0 at step 3
        loss = d.pow(2).sum(1).sqrt().mean()       # sqrt(0) is 0; its gradient is not finite
        opt.zero_grad()
        loss.backward()
        opt.step()
''')


def test_catch_nonfinite_in_the_backward_pass(tmp_path):
    """A forward pass all finite whose backward makes an Inf: the gradient of sqrt at 0."""
    script = _script(tmp_path, "train.py", SQRT_OF_ZERO)
    r = _run(tmp_path, script, "-e", "catch nonfinite", "-e", "continue", "-e", "kill")
    hits = re.findall(r"Catchpoint 1 \(catch nonfinite\): (\w+) made (\w+) in the (\w+) pass of step (\d)", r.stdout)
    assert hits == [("div", "Inf", "backward", "3")], r.stdout
    assert "SqrtBackward0" in r.stdout


# Lightning's GAN order: the generator's step, then the discriminator's, in one iteration;
# the generator's loss is made NaN at step 3 (a constant NaN the loss is multiplied by).
GENERATOR_FIRST = textwrap.dedent('''
    import torch, torch.nn as nn
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 6))
    D = nn.Sequential(nn.Linear(6, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    opt_g, opt_d = (torch.optim.Adam(net.parameters(), lr=1e-3) for net in (G, D))
    for step in range(5):
        z, real = torch.randn(8, 4), torch.randn(8, 6) + 1
        g_loss = nn.functional.softplus(-D(G(z))).mean()
        if step == 3:
            g_loss = g_loss * float("nan")     # NAN LINE
        opt_g.zero_grad(); g_loss.backward(); opt_g.step()
        d_loss = nn.functional.softplus(-D(real)).mean() + nn.functional.softplus(D(G(z).detach())).mean()
        opt_d.zero_grad(); d_loss.backward(); opt_d.step()
        print(step, g_loss.item(), d_loss.item())
''')


@pytest.mark.parametrize("script_text,what", [(GENERATOR_FIRST, "mul made NaN"), (LOG_LOSS, "log made Inf")],
                         ids=["gan_nan_constant", "log_of_zero"])
@pytest.mark.parametrize("eager", [False, True])
def test_catch_names_an_operation_once_not_again_at_its_own_backward(tmp_path, script_text, what, eager):
    """The backward of the forward operation that made the NaN or Inf makes one again from
    finite inputs: MulBackward0 multiplies by the same NaN constant, LogBackward0 divides
    by the 0 the log took.  A generator-first GAN whose generator loss went NaN got two
    origins in one stop, 'mul made NaN in the forward pass of step 3 (gan.py:12)' and 'mul
    made NaN in the backward pass of step 3 (MulBackward0, gan.py:13)' (two stops with
    --eager); the log of 0, 'div made Inf in the backward pass (LogBackward0)' after it.
    It is the same origin, named once."""
    script = _script(tmp_path, "train.py", script_text)
    line = 1 + script_text.splitlines().index(next(l for l in script_text.splitlines()
                                                    if "NAN LINE" in l or "LOG LINE" in l))
    r = _run(tmp_path, script, "-e", "catch nonfinite" + (" --eager" if eager else ""),
             "-e", "continue", "-e", "continue", "-e", "continue")
    hits = re.findall(r"^Catchpoint 1 \(catch nonfinite.*?\): (.*)$", r.stdout, re.M)
    assert len(hits) == 1 and hits[0].startswith(f"{what} in the forward pass of step 3"), r.stdout
    assert hits[0].endswith(f"train.py:{line})"), r.stdout


@pytest.mark.parametrize("script_text,param,made,backward", [
    (GENERATOR_FIRST, "G.0.weight", "mul", "mul \\(op \\d+; MulBackward0, \\S*train.py:\\d+\\) \\(the backward of mul "
     "\\(op {f}\\), which made the value in the forward pass\\)"),
    (LOG_LOSS, "0.weight", "log", "div \\(op \\d+; LogBackward0, \\S*train.py:\\d+\\) \\(the backward of log "
     "\\(op {f}\\), which made the value in the forward pass\\)"),
    (SQRT_OF_ZERO, "weight", None, "div \\(op \\d+; SqrtBackward0, \\S*train.py:\\d+\\) \\(from finite inputs\\)"),
], ids=["gan_nan_constant", "log_of_zero", "sqrt_at_zero"])
def test_origin_names_an_operations_own_backward_as_its_echo(tmp_path, script_text, param, made, backward):
    """'origin' said the gradient first went bad "at mul (op 21; MulBackward0, gan.py:11)
    (from finite inputs)", a second origin beside the forward's mul that made the NaN (and
    LogBackward0's division by the 0 the log took), where 'catch nan' names the forward
    operation once.  The gradient of sqrt at 0, which its forward did not make, stays an
    origin of its own."""
    script = _script(tmp_path, "train.py", script_text)
    # (the catch's replay of step 3 leaves its lineage in the trace, where origin reads it)
    r = _run(tmp_path, script, "-e", "catch nonfinite", "-e", "continue", "-e", f"origin {param}", "-e", "kill")
    assert f"{param} became non-finite at step 3" in r.stdout and "Catchpoint 1 (catch nonfinite)" in r.stdout, \
        r.stdout
    f = None
    if made is not None:
        m = re.search(rf"Step 3's forward pass: the first non-finite value came from finite inputs at {made} "
                      rf"\(op (\d+); ", r.stdout)
        assert m, r.stdout
        f = m.group(1)
    assert re.search(r"Step 3's backward pass: the gradient first went bad at " + backward.format(f=f), r.stdout), \
        r.stdout


BN_BUFFER_INF = textwrap.dedent('''
    import torch, torch.nn as nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    for step in range(6):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x * (1e20 if step == 3 else 1.0)), y)   # BN LINE
        loss.backward()
        opt.step()
    print("done", bool(model[1].running_var.isfinite().all()))
''')


@pytest.mark.parametrize("eager", [False, True])
def test_catch_nonfinite_sees_batchnorm_running_statistics(tmp_path, eager):
    """Inputs of 1e20 at step 3: the batch's variance overflows into running_var
    (Inf), while the normalised output, the loss, every gradient and parameter
    stay finite.  The buffer is a tensor the run makes: batch norm's in-place
    update of it is the first non-finite operation (before: no stop at all)."""
    script = _script(tmp_path, "train.py", BN_BUFFER_INF)
    line = 1 + BN_BUFFER_INF.splitlines().index(next(l for l in BN_BUFFER_INF.splitlines() if "BN LINE" in l))
    r = _run(tmp_path, script, "--report", str(tmp_path / "r.json"),
             "-e", "catch nonfinite" + (" --eager" if eager else ""), "-e", "continue", "-e", "continue")
    assert "done False" in r.stdout
    stops = json.loads((tmp_path / "r.json").read_text())["stops"]
    assert [(s["reason"], s["step"]) for s in stops] == [("catchpoint", 3)]    # once: not again at steps 4, 5
    d = stops[0]["detail"]
    assert (d["op"], d["phase"], d["module"], d["line"]) == ("native_batch_norm", "forward", "1", line)
    running_var = d["inputs"][4]
    assert running_var["written"] is True and running_var["inf"] == 16 and d["inputs"][0]["inf"] == 0
    assert "(after the operation wrote it in place)" in r.stdout


@pytest.fixture(scope="module")
def nan_parameter_origin(tmp_path_factory) -> Ran:
    """nan_lr.py stopped where 2.weight went NaN; origin of it, of a finite
    parameter and of an unknown name."""
    d = tmp_path_factory.mktemp("origin")
    argv = _argv(d, example("nan_lr.py"), "-e", "watch weight 2.weight nan_count > 0", "-e", "continue",
                 "-e", "origin 2.weight", "-e", "origin 0.bias", "-e", "origin nosuch", "-e", "kill")
    return Ran(nndb(*argv, cwd=str(d)), argv)


def test_origin_run_has_no_traceback(nan_parameter_origin):
    assert "Traceback" not in nan_parameter_origin.stderr


def test_origin_names_the_step_whose_update_made_the_parameter_non_finite(nan_parameter_origin):
    out = nan_parameter_origin.stdout
    assert "2.weight became non-finite at step 6 (nan 32, inf 0): the update of step 6 introduced it." in out
    assert "At step 5 it was finite" in out
    assert "Its gradient at step 6 carried it" in out


def test_origin_finds_where_the_gradient_first_went_bad_in_the_backward(nan_parameter_origin):
    assert re.search(r"Step 6's backward pass: the gradient first went bad at mse_loss_backward \(op \d+; "
                     r"module criterion, MseLossBackward0, \S*nan_lr.py:35\)", nan_parameter_origin.stdout)


def test_origin_finds_the_first_non_finite_value_of_the_forward(nan_parameter_origin):
    assert re.search(r"Step 6's forward pass: the first non-finite value came from finite inputs at addmm "
                     r"\(op \d+; module 2, \S*nan_lr.py:34\)", nan_parameter_origin.stdout)


def test_origin_of_an_unknown_parameter_says_so(nan_parameter_origin):
    assert "no parameter named 'nosuch' has been recorded" in nan_parameter_origin.stderr


def test_lineage_after_the_fact_equals_lineage_recorded_live(tmp_path):
    script = _script(tmp_path, "cnn.py", CNN)
    _run(tmp_path, script, "--lineage", "3", trace="live.h5")
    r = _run(tmp_path, script, "-e", "break step 5", "-e", "continue", "-e", "lineage loss --step 3 --depth 2",
             "-e", "continue", trace="late.h5")
    assert "lineage of loss in step 3" in r.stdout
    with TraceReader(str(tmp_path / "live.h5")) as a, TraceReader(str(tmp_path / "late.h5")) as b:
        assert a.lineage_steps() == [3] and b.lineage_steps() == [3]
        la, lb = a.lineage(3), b.lineage(3)
    assert la["ops"] == lb["ops"] and la["labels"] == lb["labels"]
    phases = {op[1] for op in la["ops"]}
    assert phases == {"forward", "backward", "optimizer"}
    assert any(op[0].startswith("convolution_backward") for op in la["ops"])


def test_graph_of_a_small_cnn_matches_its_modules(tmp_path):
    script = _script(tmp_path, "cnn.py", CNN)
    r = _run(tmp_path, script, "--lineage", "2", "-e", "break step 2", "-e", "continue", "-e", "graph",
             "-e", f"graph --dot {tmp_path / 'g.dot'}", "-e", "graph --ops", "-e", "continue")
    edges = re.findall(r"^  (\S+) -> (\S+)$", r.stdout, re.M)
    assert edges == [("input", "0"), ("0", "1"), ("1", "2"), ("2", "3"), ("3", "4"), ("4", "criterion"),
                     ("input", "criterion")], r.stdout           # (the targets go into the loss too)
    dot = (tmp_path / "g.dot").read_text()
    assert dot.startswith('// nndb lineage graph of step 2\ndigraph "step 2"')     # (the stamp: nndb's own file)
    assert '"0" -> "1";' in dot and '"4" -> "criterion";' in dot
    assert re.search(r"^\s+\d+ convolution\s+forward\s+0\s", r.stdout, re.M)


def test_repeated_steps_are_stored_once(tmp_path):
    script = _script(tmp_path, "cnn.py", CNN)
    _run(tmp_path, script, "--lineage", "0:6")
    with TraceReader(str(tmp_path / "t.h5")) as t:
        assert t.lineage_steps() == [0, 1, 2, 3, 4, 5]
        assert t.lineage_sequences() <= 3             # the first steps differ (momentum buffers), then repeat
        g = StepGraph(t.lineage(4))
    tid = g.resolve("loss")
    trace = g.backward_trace(tid, depth=30)
    assert any("param 0.weight" in line for line in trace) and any("(input)" in line for line in trace)


def test_lineage_of_an_expression_and_consumers(tmp_path):
    script = _script(tmp_path, "cnn.py", CNN)
    r = _run(tmp_path, script, "-e", "break step 1", "-e", "continue", "-e", "lineage on", "-e", "next",
             "-e", "lineage loss --depth 2", "-e", "consumers 4.weight --depth 1", "-e", "lineage x --depth 1",
             "-e", "consumers 4.weight --depth 2", "-e", "lineage off", "-e", "continue")
    assert "lineage of loss in step 2" in r.stdout
    assert re.search(r"t\d+ \(loss\) = nll_loss_forward", r.stdout) or "(loss) =" in r.stdout
    assert re.search(r"-> t\d+ = t\(t\d+ \(param 4.weight\)\) \[forward\]", r.stdout), r.stdout
    assert re.search(r"lineage of x in step 2 \(t\d+\):\nt\d+ \(input\) = randn", r.stdout), r.stdout
    # --depth D is D levels of operations, as lineage's (consumers counted from 2: --depth 1 and
    # 2 both showed the ops that took the tensor, and nothing said the tree was cut)
    one = r.stdout.split("consumers of 4.weight in step 2:\n", 1)[1].split("lineage of x", 1)[0]
    assert "\n    ... (--depth 1 reached)" in one and "\n    ->" not in one, one
    two = r.stdout.split("consumers of 4.weight in step 2:\n")[2].split("lineage off", 1)[0]
    assert "\n    -> " in two and "\n      ... (--depth 2 reached)" in two and "\n      ->" not in two, two


@pytest.mark.parametrize("cmd,msg", [
    ("catch foo", "catch what? (nan, inf or nonfinite)"),
    ("lineage", "lineage what?"),
    ("graph --step 99", "step 99 has not finished yet"),
    ("lineage nosuch_name", "name 'nosuch_name' is not defined"),
    ("graph --frob", "unexpected '--frob'"),
])
def test_bad_lineage_commands_get_one_line(tmp_path, cmd, msg):
    script = _script(tmp_path, "cnn.py", CNN)
    r = _run(tmp_path, script, "-e", "break step 1", "-e", "continue", "-e", cmd, "-e", "continue")
    assert msg in r.stderr, r.stderr
    assert re.search(rf"^-e {re.escape(shlex.quote(cmd))}: ", r.stderr, re.M), r.stderr
    assert r.returncode == 2              # an error in a batch run's -e command fails the run


def test_bad_lineage_steps_option(tmp_path):
    script = _script(tmp_path, "cnn.py", CNN)
    r = nndb("run", "--batch", "--lineage", "x:y", script, cwd=str(tmp_path))
    assert r.returncode == 2 and "bad step list 'x:y'" in r.stderr and "Traceback" not in r.stderr


def test_lineage_on_with_stats_records_every_ops_output_statistics(tmp_path):
    script = _script(tmp_path, "cnn.py", CNN)
    r = _run(tmp_path, script, "-e", "break step 1", "-e", "continue", "-e", "lineage on --stats", "-e", "next",
             "-e", "lineage loss --depth 2", "-e", "continue")
    line = next(l for l in r.stdout.splitlines() if "(loss) =" in l)
    m = re.search(r"min (\S+) max (\S+) mean (\S+)", line)
    assert m and float(m.group(1)) == float(m.group(2)) == float(m.group(3)) > 0, line   # a scalar loss
    with TraceReader(str(tmp_path / "t.h5")) as t:
        data = t.lineage(2)
    assert len(data["stats"]) >= len(data["ops"]) // 2       # (ops with a floating-point output)


# -- fetching a step's lineage (units: a fake session, no run) -------------------------------------
class _Writer:
    """The trace's lineage as the session's reader sees it, and what is written."""

    def __init__(self, recorded=None):
        self.recorded = {k: json.loads(json.dumps(v)) for k, v in (recorded or {}).items()}
        self.written = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def lineage_steps(self):
        return sorted(self.recorded)

    def lineage(self, step, data=None):
        if data is None:                             # (the reader's read)
            d = self.recorded.get(step)
            return dict(d, step=step) if d is not None else None
        self.written.append((step, data))


class _Lineage:
    def __init__(self, live=None, found=None):
        self._live, self._found = live or {}, found

    def live(self, step):
        return self._live.get(step)

    def find(self, value, step):
        return self._found


def _fake_session(live=None, recorded=None, found=None, last_step=9):
    from types import SimpleNamespace
    w = _Writer(recorded)
    return SimpleNamespace(lineage=_Lineage(live, found), rec=SimpleNamespace(writer=w),
                           view=SimpleNamespace(trace_reader=lambda: w), last_step=last_step)


# op 0 makes t1 (fc's output) from t0 (the input); op 1 makes the loss t2 from t1
_OPS = {"ops": [["addmm.default", "forward", [0], [1], [[2]], ["float32"], "fc", None, None, None],
                ["mean.default", "forward", [1], [2], [[]], ["float32"], None, None, None, None]],
        "labels": {"0": "input", "1": "act fc", "2": "loss"}, "checked": False}


def _no_replay(step, resolve):
    raise AssertionError("replayed")


def test_step_lineage_prefers_the_live_recorder_then_the_trace():
    from nndb.lineage.fetch import step_lineage
    s = _fake_session(live={3: dict(_OPS, live=True)}, recorded={3: _OPS, 4: _OPS})
    assert step_lineage(s, 3, _no_replay)[0]["live"] is True
    data, resolved = step_lineage(s, 4, _no_replay)
    assert data["step"] == 4 and data["ops"] == _OPS["ops"] and resolved == {}


def test_step_lineage_replays_when_unchecked_missing_or_resolving():
    from nndb.lineage.fetch import step_lineage
    calls = []

    def replay(step, resolve):
        calls.append((step, resolve))
        return dict(_OPS, checked=True), {e: 1 for e in resolve}

    s = _fake_session(recorded={4: _OPS})
    assert step_lineage(s, 4, replay, check=True)[0]["checked"] is True
    assert step_lineage(s, 5, replay)[0]["step"] == 5
    assert step_lineage(s, 4, replay, resolve=("x",))[1] == {"x": 1}
    assert calls == [(4, ()), (5, ()), (4, ("x",))]


def test_lineage_control_is_an_error_without_lineage():
    from types import SimpleNamespace
    from nndb.errors import CommandError
    from nndb.lineage.fetch import lineage_control
    with pytest.raises(CommandError, match="lineage is not available"):
        lineage_control(SimpleNamespace(lineage=None))


def test_resolve_target_by_name_then_by_expression():
    from nndb.errors import CommandError
    from nndb.lineage.fetch import resolve_target, step_lineage
    asked = []

    def replay(step, resolve):
        asked.append(resolve)
        return _OPS, {"y": 1, "z": "'z' is not a tensor"}

    s = _fake_session(recorded={4: _OPS})

    def lineage(step, resolve=()):
        return step_lineage(s, step, replay, resolve=resolve)

    g, tid = resolve_target(s, 4, "fc", lineage, None)
    assert (g.step, tid) == (4, 1)
    with pytest.raises(CommandError, match="no tensor named 'x'"):
        resolve_target(s, 4, "x", lineage, None)
    s.lineage._found = 2                            # the live recorder knows the value's tensor
    assert resolve_target(s, 4, "x", lineage, lambda e: object())[1] == 2 and asked == []
    s.lineage._found = None                         # else a replica resolves the expression
    assert resolve_target(s, 4, "y", lineage, lambda e: object())[1] == 1 and asked == [("y",)]
    with pytest.raises(CommandError, match="'z' is not a tensor"):
        resolve_target(s, 4, "z", lineage, lambda e: object())


def test_replay_lineage_asks_a_scan_replica_and_keeps_what_it_recorded():
    from types import SimpleNamespace
    from nndb.errors import CommandError
    from nndb.timetravel.lineage_replay import replay_lineage
    requests = []

    def replay(s, request, step):
        requests.append((request, step))
        return {"result": {"lineage": {"4": _OPS}, "resolved": {"x": 1}}}

    m = SimpleNamespace(replay=replay)
    s = _fake_session()
    assert replay_lineage(s, m, 4, ("x",)) == (_OPS, {"x": 1})
    assert requests == [({"kind": "scan", "from": 4, "end": 4, "lineage": [4], "resolve": ["x"]}, 3)]
    assert s.rec.writer.written == [(4, _OPS)]
    s = _fake_session(recorded={4: _OPS})
    replay_lineage(s, m, 4)
    assert s.rec.writer.written == []               # the trace has it already
    with pytest.raises(CommandError, match="time travel is off"):
        replay_lineage(s, None, 4)
    with pytest.raises(CommandError, match="has not finished yet"):
        replay_lineage(s, m, 10)
    with pytest.raises(CommandError, match="recorded no lineage"):
        replay_lineage(s, m, 5)


def test_op_records_have_the_fields_of_oprecord():
    from nndb.lineage import oprecord as R
    from nndb.lineage.ops import FIELDS
    assert FIELDS == R.FIELDS and [FIELDS[i] for i in (R.OP, R.PHASE, R.MODULE, R.NODE)] == \
        ["op", "phase", "module", "node"]
    op = _OPS["ops"][0]
    assert len(op) == len(FIELDS) and R.op_name(op) == "addmm" and op[R.OUTS] == [1]


# -- down to the parameters; functional ops; repeated structure (issue 19) --------------------

RNN_LM = str(__import__("pathlib").Path(__file__).parent / "scripts" / "lineage_rnn_lm.py")

VIEW_OUTSIDE = textwrap.dedent('''
    import torch, torch.nn as nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w_rows = model[0].weight[1:]             # a view made before any step: no op of a step made it
    for step in range(4):
        x, y = torch.randn(8, 4), torch.randn(8, 3)
        model(x)                             # (names the model)
        loss = ((x @ w_rows.t() - y[:, 1:]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
''')


@pytest.fixture(scope="module")
def mlp_lineage(tmp_path_factory) -> Ran:
    tmp = tmp_path_factory.mktemp("mlp_lineage")
    r = _run(tmp, example("mlp.py"), "--lineage", "3", "-e", "break step 3", "-e", "continue",
             "-e", "lineage loss --depth 12", "-e", "continue")
    return Ran(r)


def test_lineage_reaches_every_linear_weight_through_its_transpose(mlp_lineage):
    # nn.Linear's weight enters addmm through t(): a view, whose version counter
    # becomes the parameter's only after the op returns (it used to be a leaf
    # after step 0, once the optimizer had bumped the weight's version)
    out = mlp_lineage.stdout
    for layer in ("0", "2", "4"):
        assert re.search(rf"t\d+ = t\(t\d+ \(param {layer}\.weight\)\) \[forward\]", out), out
    assert "leaf: made before this step" not in out.split("t3 (input)")[0], out


def test_a_view_of_a_parameter_made_outside_the_step_links_to_it_by_storage(tmp_path):
    script = _script(tmp_path, "view.py", VIEW_OUTSIDE)
    r = _run(tmp_path, script, "--lineage", "2", "-e", "break step 2", "-e", "continue",
             "-e", "lineage loss --depth 8", "-e", "continue")
    assert re.search(r"t\d+ = param 0\.weight \(view\)", r.stdout), r.stdout


@pytest.fixture(scope="module")
def cnn_graph(tmp_path_factory) -> Ran:
    tmp = tmp_path_factory.mktemp("cnn_graph")
    r = _run(tmp, example("cnn.py"), "--lineage", "2", "-e", "break step 2", "-e", "continue",
             "-e", "graph", "-e", "graph --ops", "-e", f"graph --dot {tmp / 'g.dot'}", "-e", "continue")
    ran = Ran(r)
    ran.dot = (tmp / "g.dot").read_text()
    return ran


def test_functional_ops_are_no_module_node_but_named_on_the_edge(cnn_graph):
    out = cnn_graph.stdout
    edges = re.findall(r"^  (\S+) -> (\S+)", out, re.M)
    assert ("bn1", "conv2") in edges and ("bn2", "fc") in edges, out
    assert not any("model" in e for e in edges), out        # the root's own F.relu is no node
    assert re.search(r"^  bn1 -> conv2  via relu, max_pool2d_with_indices \(functional, in model's forward\)$",
                     out, re.M), out
    assert '"bn1" -> "conv2" [label="relu, max_pool2d_with_indices"];' in cnn_graph.dot


def test_backward_of_a_functional_op_is_not_the_next_module(cnn_graph):
    ops = re.findall(r"^\s+\d+ (\S+)\s+(forward|backward)\s+(.+?)\s+<-", cnn_graph.stdout, re.M)
    by = {(name, phase): where for name, phase, where in ops}
    assert by[("threshold_backward", "backward")] == "functional in model", cnn_graph.stdout
    assert by[("max_pool2d_with_indices_backward", "backward")] == "functional in model", cnn_graph.stdout
    assert by[("relu", "forward")] == "functional in model"
    assert by[("addmm", "forward")] == "fc" and by[("native_batch_norm_backward", "backward")] in ("bn1", "bn2")


@pytest.mark.parametrize("args,expect", [
    ((), r"\.\.\. and 10 more made the same way \(t\d+, t\d+, t\d+, t\d+, \.\.\. t\d+: tanh, module cell"),
    (("--last",), r"\.\.\. repeats the structure of t\d+ above \(a recurrence: 11 tensors of this step"),
])
def test_a_recurrent_model_prints_one_time_step(tmp_path, args, expect):
    r = nndb(*_argv(tmp_path, RNN_LM, "--lineage", "2", "-e", "break step 2", "-e", "continue",
                    "-e", "lineage loss --depth 40", "-e", "continue"), *args, cwd=str(tmp_path))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert re.search(expect, r.stdout), r.stdout
    tanh_lines = [l for l in r.stdout.splitlines() if "= tanh(" in l]
    assert 1 <= len(tanh_lines) <= 2, r.stdout                  # not one per time step (11)
    assert re.search(r"t\d+ = t\(t\d+ \(param cell\.weight_hh\)\)", r.stdout), r.stdout


def test_nonfinite_buffers_sees_a_bad_running_statistic_and_a_replaced_buffer():
    """catch nan's step-end check of the models' buffers (BatchNorm's running
    statistics are in no record): the modules holding buffers are listed once
    per model, the buffers themselves read at every check."""
    import torch
    from nndb.lineage.control import nonfinite_buffers
    from nndb.tracer.naming import Naming
    naming = Naming()
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    naming.add_root(model, None)
    assert nonfinite_buffers(naming) == []
    model[1].running_var[2] = float("inf")
    assert nonfinite_buffers(naming) == [(("1.running_var", "buffer"), False, True)]
    model[1].running_var = torch.ones(4)              # (replaced, not changed in place)
    model[1].running_mean = torch.tensor([0.0, float("nan"), 0.0, 0.0])
    assert nonfinite_buffers(naming) == [(("1.running_mean", "buffer"), True, False)]


# makemore's bigram at lr 1e37 (AdamW): at step 1 the log-probabilities are finite, down to -2e37,
# and nll_loss's sum of them overflows.  Here: finite log-probabilities of -4.8e37, and a float64 one.
HUGE_FINITE = textwrap.dedent('''
    import sys
    import torch, torch.nn as nn, torch.nn.functional as F
    dtype = torch.float64 if sys.argv[1:] == ["f64"] else torch.float32
    w = nn.Parameter(torch.zeros(16, 5, dtype=dtype))
    opt = torch.optim.SGD([w], lr=0.1)
    y = torch.arange(16) % 5
    for step in range(4):
        scale = (1e307 if dtype == torch.float64 else 3e37) if step == 2 else 1.0
        logp = F.log_softmax(w, dim=1) * scale
        loss = F.nll_loss(logp, y)                  # the mean of 16 values of -ln(5) x scale overflows
        opt.zero_grad()
        loss.backward()
        opt.step()
''')


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_a_catch_reports_the_mean_of_large_finite_inputs_as_finite(tmp_path, dtype):
    """The report of a catch summed the mean in float32: nll_loss's input of -2e37s read 'mean -inf,
    nan 0, inf 0' (float64: -1.93e37); and it made a float64 tensor float32 first, so 1e307s read
    as 'min -inf, ... inf 80', infinities the tensor did not have."""
    script = _script(tmp_path, "train.py", HUGE_FINITE)
    r = nndb(*_argv(tmp_path, script, "-e", "catch nonfinite", "-e", "continue", "-e", "kill"), dtype,
             cwd=str(tmp_path))
    assert "Traceback" not in r.stderr, r.stderr
    assert re.search(r"Catchpoint 1 \(catch nonfinite\): nll_loss_forward made Inf in the forward pass of step 2",
                     r.stdout), r.stdout
    m = re.search(r"input 0 of nll_loss_forward: (float\d+) \(16, 5\): min (\S+), max (\S+), mean (\S+), "
                  r"nan 0, inf (\d+)", r.stdout)
    assert m, r.stdout
    scale = 1e307 if dtype == "f64" else 3e37
    assert m[1] == {"f32": "float32", "f64": "float64"}[dtype] and m[5] == "0"
    for v in (m[2], m[3], m[4]):        # every element is about -ln(5) x scale (w has moved by ~0.01)
        assert float(v) == pytest.approx(-1.6094 * scale, rel=0.02), r.stdout


ACCUMULATED = textwrap.dedent('''
    import torch, torch.nn as nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(24, 4), torch.randn(24, 1)
    for step in range(3):
        for micro in range(4):              # (the Hugging Face Trainer's gradient_accumulation_steps=4)
            loss = ((model(x[micro * 6:micro * 6 + 6]) - y[micro * 6:micro * 6 + 6]) ** 2).mean() / 4
            loss.backward()
        opt.step()
        opt.zero_grad()
''')


def test_lineage_of_a_name_a_step_has_several_of_says_which(tmp_path):
    """Under gradient accumulation (the Trainer's, 2 micro-batches in its step 2) 'lineage loss
    --step 2' showed one micro-batch's loss, the last, as 'lineage of loss in step 2 (t710)',
    where the step's loss is the sum of both; a module called once a micro-batch the same.  The
    line says it is the last of them and names the others."""
    script = _script(tmp_path, "accumulated.py", ACCUMULATED)
    r = _run(tmp_path, script, "--lineage", "1", "-e", "until 2", "-e", "lineage loss --step 1 --depth 1",
             "-e", "lineage model --step 1 --depth 1", "-e", "consumers 0 --step 1 --depth 1", "-e", "continue")
    m = re.search(r"lineage of loss in step 1 \(t(\d+), the last of 4 tensors of this name in the step: "
                  r"t(\d+), t(\d+), t(\d+), t(\d+)\):\nt(\d+) \(loss\) = ", r.stdout)
    assert m, r.stdout
    tids = [int(t) for t in m.groups()]
    assert tids[0] == tids[4] == tids[5] and tids[1] < tids[2] < tids[3] < tids[4], tids
    assert re.search(r"lineage of model in step 1 \(t\d+, the last of 4 tensors of this name in the step: ", r.stdout)
    assert re.search(r"consumers of 0 in step 1 \(t\d+, the last of 4 tensors of this name in the step: ", r.stdout)
    # (a name the step has once: as it was)
    r = _run(tmp_path, script, "--lineage", "1", "-e", "until 2", "-e", "lineage 0.weight --step 1 --depth 1",
             "-e", "continue", trace="once.h5")
    assert re.search(r"lineage of 0.weight in step 1 \(t\d+\):\n", r.stdout), r.stdout


def test_a_forked_replica_records_the_step_it_replays_not_the_ones_before(tmp_path):
    """With '--lineage 0:3', 'goto 1' (a fork checkpoint at the end of step 0) then 'lineage loss'
    showed 'lineage of loss in step 1 (t36, the last of 2 tensors of this name in the step: t16,
    t36)': step 1's lineage in the replica held the model's construction and all of step 0 (the
    checkpoint was forked before step 0's lineage was closed, and the replica then renamed it step
    1), where the live run's step 1 is t7, made from the parameters and the batch.  Asked in the
    past it equals what the live run recorded."""
    script = _script(tmp_path, "fork_lineage.py", textwrap.dedent('''
        import torch, torch.nn as nn
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        nn.init.zeros_(model.bias)
        data = torch.randn(8, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(4):
            opt.zero_grad()
            loss = model(data).pow(2).mean()
            loss.backward()
            opt.step()
    '''))
    r = _run(tmp_path, script, "--replica", "fork", "--lineage", "0:3", "-e", "break step 2", "-e", "continue",
             "-e", "lineage loss --step 1 --depth 9", "-e", "goto 1", "-e", "lineage loss --depth 9", "-e", "kill")
    shown = re.findall(r"^lineage of loss in step 1 .*?(?=^\S*In the past|^nndb: the replica|\Z)", r.stdout,
                       re.S | re.M)
    assert len(shown) == 2, r.stdout
    assert shown[0] == shown[1], r.stdout
    assert "the last of" not in shown[1] and "zero_" not in shown[1], shown[1]


def test_an_optimizer_that_calls_a_closure_has_its_update_in_the_optimizer_pass(tmp_path):
    """LBFGS's step calls the closure (forward and backward) and then updates the parameters
    itself: 'lineage weight' showed that update as 't145 (param weight) = add_(t69 (param
    weight), t144) [forward]' (time_sequence_prediction's LSTM the same), the closure's forward
    pass having left its phase so.  After a closure's backward pass, inside the step, the
    operations are the optimizer's."""
    script = _script(tmp_path, "closure.py", textwrap.dedent('''
        import torch, torch.nn as nn
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        x, y = torch.randn(16, 4), torch.randn(16, 1)
        opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)
        for step in range(3):
            def closure():
                opt.zero_grad()
                loss = (model(x) - y).pow(2).mean()
                loss.backward()
                return loss
            opt.step(closure)
    '''))
    _run(tmp_path, script, "--lineage", "1")
    with TraceReader(str(tmp_path / "t.h5")) as t:
        data = t.lineage(1)
    ops, labels = data["ops"], data["labels"]
    updates = [op for op in ops if op[0].startswith("add_") and labels.get(str(op[3][0]), "").startswith("param ")]
    assert len(updates) >= 4, [(op[0], op[1]) for op in ops]       # (weight and bias, at each iteration)
    assert {op[1] for op in updates} == {"optimizer"}, [(op[0], op[1]) for op in updates]
    assert [op[1] for op in ops if op[0].startswith("addmm")][0] == "forward"      # (the closure's forward)


def test_origin_names_the_backward_op_that_made_the_gradient_bad_not_a_view_of_a_saved_value(tmp_path):
    """A blank image standardized by its own std (0/0) made NaN logits; 'origin fc.weight' said
    'the gradient first went bad at detach (op 124; ..., LogSoftmaxBackward0, ...)': the
    backward's detach of the NaN output log_softmax saved, a view that made nothing and is no
    gradient (mnist_rnn the same).  The gradient first went bad at _log_softmax_backward_data."""
    script = _script(tmp_path, "blank.py", textwrap.dedent('''
        import torch, torch.nn as nn, torch.nn.functional as F
        torch.manual_seed(0)
        fc = nn.Linear(6, 3)
        opt = torch.optim.SGD(fc.parameters(), lr=0.1)
        for step in range(4):
            x, y = torch.rand(4, 6), torch.randint(0, 3, (4,))
            if step == 2:
                x[1] = 0.0                                          # a blank sample
            x = (x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True)
            loss = F.nll_loss(F.log_softmax(fc(x), dim=1), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    '''))
    r = _run(tmp_path, script, "-e", "break step 3", "-e", "continue", "-e", "origin weight", "-e", "kill")
    assert "weight became non-finite at step 2" in r.stdout, r.stdout
    assert "the gradient first went bad at _log_softmax_backward_data (op " in r.stdout, r.stdout
    assert re.search(r"forward pass: the first non-finite value came from finite inputs at div \(op \d+; blank.py:10\)",
                     r.stdout), r.stdout
