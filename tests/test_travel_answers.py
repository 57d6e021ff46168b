"""Time travel answers that must be right (the time-travel issue's regressions):
reverse-continue lands on the last step where its condition held, and
replay --verify counts what it compared, on every loop shape, and after the
run has ended."""
import os
import re

import pytest

from conftest import Ran, example, nndb
from nndb.store.reader import TraceReader

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork replicas need fork()")


def _run(tmp_path, script, commands, *args, extra=()):
    argv = ["run", "--batch", "--nx", "--trace", str(tmp_path / "t.h5"), *extra]
    for c in commands:
        argv += ["-e", c]
    r = Ran(nndb(*argv, example(script), *args, cwd=str(tmp_path)), argv + [script, *args])
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    return r


def test_reverse_continue_finds_a_hit_at_a_step_that_holds_a_checkpoint(tmp_path):
    # 'until 44' leaves a checkpoint at step 44; the breakpoint is set later, so
    # that stop's own hits do not know it: the step is checked again when scanned
    r = _run(tmp_path, "cnn.py", ["until 44", "until 99", "break if $loss > 0.01", "rc",
                                  'p ("AT", $step, $loss)', "present", "continue"], "--steps", "100")
    with TraceReader(str(tmp_path / "t.h5")) as t:
        steps, losses = t.history(t.find("loss", "loss")[0], "mean")
    held = [int(s) for s, v in zip(steps, losses) if v > 0.01 and s < 99]
    step, loss = re.search(r"\('AT', (\d+), ([\d.e-]+)\)", r.stdout).groups()
    assert int(step) == held[-1], (held, r.stdout)
    assert float(loss) > 0.01


def test_replay_verify_compares_a_hand_written_loop_and_leaves_b_out(tmp_path):
    r = _run(tmp_path, "manual_sgd.py", ["until 12", "replay --verify 0:10", "continue"], "--steps", "20")
    m = re.search(r"replay --verify 0:10: (\d+) step\(s\) replayed from .*: identical to the trace, "
                  r"bit for bit \((\d+) values\)", r.stdout)
    assert m, r.stdout + r.stderr
    assert int(m.group(1)) == 10 and int(m.group(2)) > 0


def test_replay_verify_after_the_run_ended_reads_the_closed_trace(tmp_path):
    r = _run(tmp_path, "mlp.py", ["continue", "replay --verify 2:8"], "--steps", "12")
    assert re.search(r"replay --verify 2:8: 6 step\(s\) replayed .*identical to the trace", r.stdout), \
        r.stdout + r.stderr


def test_replay_verify_that_compared_nothing_is_an_error(tmp_path):
    r = _run(tmp_path, "mlp.py", ["until 9", "replay --verify 1:4", "continue"], "--steps", "12",
             extra=("--every", "5"))
    assert "replay --verify 1:4: nothing to compare" in r.stderr, r.stdout + r.stderr
    assert "identical to the trace" not in r.stdout


def test_a_hand_written_loop_stops_with_the_step_s_own_loss(tmp_path):
    r = _run(tmp_path, "manual_sgd.py", ["until 5", 'p ("AT", repr(loss.item()), repr($loss), $step)',
                                         "predict 2", "next", 'p ("NEXT", $loss)', "continue"],
             "--steps", "10")
    at = re.search(r"\('AT', '([^']+)', '([^']+)', (\d+)\)", r.stdout)
    assert at and at.group(1) == at.group(2) and at.group(3) == "5", r.stdout    # the script's loss, step 5
    printed = dict(re.findall(r"^step (\d+) loss (\S+)$", r.stdout, re.M))
    assert float(printed["5"]) == float(at.group(2))
    rows = re.findall(r"^(\d+)\s+([-\d.e+]+)\s+([-\d.e+]+)\s+(\S+)$", r.stdout, re.M)
    assert [int(x[0]) for x in rows[:2]] == [6, 7]                      # predict's rows: steps 6 and 7 ...
    nxt = float(re.search(r"\('NEXT', ([\d.e-]+)\)", r.stdout).group(1))
    assert float(rows[0][1]) == float(f"{nxt:.6g}") == float(f"{float(printed['6']):.6g}")   # ... are theirs


def test_lbfgs_step_loss_is_the_first_closure_call_s_as_the_script_prints_it(tmp_path):
    r = _run(tmp_path, "lbfgs.py", ["until 2", 'p ("LOSS", repr($loss))', "continue"], "--steps", "4")
    printed = [float(v) for v in re.findall(r"^step \d+ loss (\S+)$", r.stdout, re.M)]
    with TraceReader(str(tmp_path / "t.h5")) as t:
        _, losses = t.history(t.find("loss", "loss")[0], "mean")
    assert [float(x) for x in losses] == printed                       # bit for bit
    assert float(re.search(r"\('LOSS', '([^']+)'\)", r.stdout).group(1)) == printed[2]


UNSEEDED = '''
import os, torch, torch.nn as nn
torch.manual_seed(int.from_bytes(os.urandom(4), "little"))     # a new run, other numbers
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(32, 4), torch.randn(32, 1)
for step in range(8):
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
print("done")
'''

READS_A_FILE = '''
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(32, 4), torch.randn(32, 1)
for step in range(10):
    scale = float(open("scale.txt").read())              # read at every step
    opt.zero_grad()
    loss = ((model(x) * scale - y) ** 2).mean()
    loss.backward()
    opt.step()
    if step == 6:
        open("scale.txt", "w").write("3.0")             # the file changes under the run
print("done")
'''


def _script_run(tmp_path, text, commands, *extra):
    (tmp_path / "s.py").write_text(text)
    argv = ["run", "--batch", "--nx", "--rules", "none", "--trace", str(tmp_path / "t.h5"), *extra]
    for c in commands:
        argv += ["-e", c]
    return Ran(nndb(*argv, "s.py", cwd=str(tmp_path)), argv + ["s.py"])


def test_a_respawned_replay_of_an_unseeded_script_says_it_diverged(tmp_path):
    r = _script_run(tmp_path, UNSEEDED, ["break step 5", "continue", "goto 2", 'p ("AT", $step)', "continue"],
                    "--replica", "respawn")
    assert re.search(r"the replay diverged from the recorded run at step 0: loss recorded [\d.e-]+, replayed "
                     r"[\d.e-]+ \(likely cause: unseeded randomness", r.stderr), r.stdout + r.stderr
    assert "In the past" not in r.stdout                  # no wrong past is shown
    assert "('AT', 5)" in r.stdout and "done" in r.stdout   # the user stays where they were


def test_a_replay_of_a_script_that_reads_a_changed_file_says_it_diverged(tmp_path):
    (tmp_path / "scale.txt").write_text("1.0")
    r = _script_run(tmp_path, READS_A_FILE, ["break step 8", "continue", "goto 3", 'p ("AT", $step)', "continue"],
                    "--replica", "fork")
    assert re.search(r"the replay diverged from the recorded run at step 1: loss recorded", r.stderr), \
        r.stdout + r.stderr
    assert "In the past" not in r.stdout and "('AT', 8)" in r.stdout
