"""nndb run's progress line: on a terminal, one line of stderr redrawn in
place at most a few times a second and removed at a stop and at the end;
none when stderr is not a terminal."""
import os
import re
import select
import time

import pytest

from conftest import example, nndb
from nndb.debugger.progress import CLEAR, ProgressLine
from nndb.tracer.pipeline import StepEnd

LONG = """\
import time, torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
t0 = time.monotonic()
step = 0
while time.monotonic() - t0 < {secs}:
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    step += 1
print("done", step, flush=True)
"""


class _Session:
    prompting = False
    replica = None
    findings = [{"rule": "x"}]


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_it_draws_at_most_once_an_interval_and_clears_once():
    clock, out = _Clock(), []
    p = ProgressLine(_Session(), out.append, interval=0.25, clock=clock)
    for step in range(10000):            # 10000 steps in 5 s of the fake clock
        clock.t = step * 0.0005
        p.on_step(StepEnd(step, ()))
    assert 14 <= p.draws <= 17           # (nothing in the first second, then four a second)
    assert all(w.startswith(CLEAR) and w.endswith("\r") for w in out)
    m = re.search(r"nndb: step (\d+)  (\S+) steps/s  loss -  1 finding\(s\)", out[-1])
    assert m and float(m.group(2)) == pytest.approx(2000, rel=0.01), out[-1]
    p.clear()
    p.clear()
    assert out[-2:] != [CLEAR, CLEAR] and out[-1] == CLEAR


def test_a_step_costs_one_clock_read_when_nothing_is_drawn():
    p = ProgressLine(_Session(), lambda text: None)
    end = StepEnd(1, ())
    n = 200000
    t0 = time.perf_counter()
    for _ in range(n):
        p.on_step(end)
    per_step = (time.perf_counter() - t0) / n
    assert per_step < 5e-6, per_step     # (a recorded step costs nndb tens of microseconds at least)


def test_no_progress_line_when_stderr_is_not_a_terminal(tmp_path):
    (tmp_path / "long.py").write_text(LONG.format(secs=1.5))
    r = nndb("run", "--batch", "--nx", "--trace", str(tmp_path / "t.h5"), "long.py", cwd=tmp_path)
    assert r.returncode == 0 and "steps/s" not in r.stderr and "\r" not in r.stderr + r.stdout


def test_on_a_terminal_the_line_is_redrawn_and_removed_at_a_stop_and_at_the_end(tmp_path):
    pytest.importorskip("pty")
    from test_repl_terminal import Terminal
    (tmp_path / "long.py").write_text(LONG.format(secs=2.5))
    term = Terminal(["run", "--nx", "-q", "--trace", str(tmp_path / "t.h5"), "-e", "break step 2000000",
                     "long.py"], cwd=tmp_path, home=tmp_path)
    try:
        term.expect("(nndb)")
        term.type("continue")
        raw = b""
        end = time.time() + 60
        # the run ends ("done"), and then its prompt shows (the prompt redrawn with the typed
        # 'continue' may come first)
        while not (b"done" in raw and b"(nndb)" in raw[raw.index(b"done"):]) and time.time() < end:
            if select.select([term.master], [], [], 1)[0]:
                raw += os.read(term.master, 65536)
        text = raw.decode(errors="replace")
        draws = re.findall(r"\r\x1b\[Knndb: step (\d+)  (\S+) steps/s  loss (\S+)  0 finding\(s\)\r", text)
        assert 2 <= len(draws) <= 16, text[-500:]            # about 4 a second for 1.5 s after the first
        assert [int(d[0]) for d in draws] == sorted(int(d[0]) for d in draws)
        assert float(draws[-1][1]) > 0
        after = text[text.rindex("steps/s"):]
        assert after.index("\r\x1b[K") < after.index("(nndb)")   # the line is removed before the prompt
        assert "done" in after
        term.type("quit")
        assert term.proc.wait(timeout=60) == 0
    finally:
        term.close()
