"""Going back a few steps from the end of a run replays few steps (issue
39, item 11): the kept checkpoints are dense near the present and sparser
with age, and when the schedule cannot keep the newest one within its tail
bound (schedule.TAIL_S) the prompt says so, once."""
import os
import re

import pytest

from conftest import Ran, nndb
from nndb.timetravel.machine import Checkpoint, TimeMachine

LOOP = '''
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
data = torch.randn(200, 8)
for step in range(120):
    x = data[step % 10 * 20:(step % 10 + 1) * 20]
    opt.zero_grad()
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    loss.backward()
    opt.step()
print("done")
'''


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork replicas need fork()")
def test_going_back_from_the_end_of_a_run_replays_few_steps(tmp_path):
    # 60 checkpoints taken (every 2 steps), 20 kept: spread over the run they were ~6 steps apart at
    # its end too; dense near the present, 'rs 6' from step 119 replays one step
    (tmp_path / "loop.py").write_text(LOOP)
    argv = ["run", "--batch", "--nx", "--rules", "none", "--trace", str(tmp_path / "t.h5"), "--force",
            "--checkpoint-every", "2", "-e", "until 119", "-e", "info checkpoints", "-e", "rs 6",
            "-e", "present", "-e", "continue"]
    r = Ran(nndb(*argv, "loop.py", cwd=str(tmp_path)), argv + ["loop.py"])
    m = re.search(r"In the past \(timeline 0\): step 113 finished.*\(6 step\(s\) back; (\d+) step\(s\) replayed "
                  r"from the checkpoint at step (\d+)\)", r.stdout)
    assert m, r.stdout + r.stderr
    assert (int(m.group(1)), int(m.group(2))) == (1, 112)
    kept = [int(s) for s in re.findall(r"^\d+\s+(\d+)\s+auto\s", r.stdout, re.M)]
    assert len(kept) == 20 and kept[0] == 0 and kept[-5:] == [110, 112, 114, 116, 118], kept
    assert "done" in r.stdout


def _machine(cost_s: float, steps: list, step_s: float = 0.1) -> TimeMachine:
    m = TimeMachine("auto")
    for n, step in enumerate(steps, 1):
        m.checkpoints[n] = Checkpoint(n, step, 100 + n, None, "auto", 0.0, cost_s)
        m.policy.taken(step, cost_s, float(step) * step_s)
    m.step_times.extend([step_s] * 20)
    return m


def test_the_prompt_says_when_going_back_replays_more_than_the_tail_bound():
    # the CNN: 0.1 s steps, a checkpoint of 462 ms, one every 9.24 s (5%): 92 steps
    m = _machine(0.462, [0, 93, 186])
    assert m.tail_warning(199) is None                 # 13 steps back: 1.3 s
    assert m.tail_warning(270) == (
        "nndb: warning: going back from step 270 replays from the checkpoint at step 186 or earlier, about "
        "8.4 s or more (4 s is the aim: a checkpoint costs 462 ms here, and keeping one every 4 s would take "
        "more than 5% of the run time: one comes every 9.24 s); 'info checkpoints' lists them (said once a run)")
    # a 150 ms checkpoint keeps it (one every 4 s, 40 steps)
    assert _machine(0.15, [0, 41, 82]).tail_warning(122) is None
