"""nndb run's progress line: on a terminal, one line of stderr redrawn in
place at most a few times a second and removed at a stop and at the end;
none when stderr is not a terminal."""
import os
import re
import select
import time
from types import SimpleNamespace

import numpy as np
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
    log = SimpleNamespace(findings=[{"rule": "x"}])


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


def _loss_record(step: int, loss: float):
    """A step's record holding its loss alone (the raw sums of one element)."""
    from nndb.tracer import stats as S
    raw = dict(zip(S.RAW_FIELDS, [0.0] * S.N_RAW))
    raw.update(n=1.0, sum=loss, sumsq=loss * loss, min=loss, max=loss, sumabs=abs(loss))
    return SimpleNamespace(step=step, names=[("loss", "loss")], raw=np.array([[raw[f] for f in S.RAW_FIELDS]]))


def test_a_hand_written_loop_s_line_gives_the_step_s_own_loss():
    """A hand-written loop closes step N-1's record at step N's end: the line said 'step N ...
    loss X' with X step N-1's loss (regression/main.py, whose own lines print each step's)."""
    clock, out = _Clock(), []
    session = _Session()
    p = ProgressLine(session, out.append, interval=0.25, clock=clock)
    for step in range(1, 5000):
        clock.t = step * 0.001
        session.step_record = _loss_record(step, 100.0 + step)          # (the step's, as far as known)
        p.on_step(StepEnd(step, (_loss_record(step - 1, 100.0 + step - 1),)))
    m = re.search(r"nndb: step (\d+)  \S+ steps/s  loss (\S+)  ", out[-1])
    assert m and float(m.group(2)) == 100 + int(m.group(1)), out[-1]
    session.step_record = None                  # (not known: no loss rather than the step before's)
    clock.t += 1
    p.on_step(StepEnd(6000, (_loss_record(5999, 1.0),)))
    assert "nndb: step 6000 " in out[-1] and " loss -  " in out[-1], out[-1]


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


def _continue_to_the_end(term) -> str:
    """'continue' at the first prompt; what the terminal is sent (escape sequences
    kept) until the run has ended ("done") and its prompt shows (the prompt
    redrawn with the typed 'continue' may come first)."""
    term.expect("(nndb)")
    term.type("continue")
    raw = b""
    end = time.time() + 60
    while not (b"done" in raw and b"(nndb)" in raw[raw.index(b"done"):]) and time.time() < end:
        if select.select([term.master], [], [], 1)[0]:
            raw += os.read(term.master, 65536)
    return raw.decode(errors="replace")


def test_on_a_terminal_the_line_is_redrawn_and_removed_at_a_stop_and_at_the_end(tmp_path):
    pytest.importorskip("pty")
    from test_repl_terminal import Terminal
    (tmp_path / "long.py").write_text(LONG.format(secs=2.5))
    term = Terminal(["run", "--nx", "-q", "--trace", str(tmp_path / "t.h5"), "-e", "break step 2000000",
                     "long.py"], cwd=tmp_path, home=tmp_path)
    try:
        text = _continue_to_the_end(term)
        draws = re.findall(r"\r\x1b\[Knndb: step (\d+)  (\S+) steps/s  loss (\S+)  0 finding\(s\)\r", text)
        assert 2 <= len(draws) <= 16, text[-500:]            # about 4 a second for 1.5 s after the first
        assert [int(d[0]) for d in draws] == sorted(int(d[0]) for d in draws)
        assert float(draws[-1][1]) > 0
        after = text[text.rindex("steps/s"):]
        assert after.index("\r\x1b[K") < after.index("(nndb)")   # the line is removed before the prompt
        assert "done" in text[text.index("steps/s"):]           # (drawn again after the script's last line)
        term.type("quit")
        assert term.proc.wait(timeout=60) == 0
    finally:
        term.close()


def screen(raw: str) -> list:
    """The lines a terminal shows for ``raw``: carriage return, newline and
    erase-to-end-of-line obeyed, other escape sequences dropped."""
    lines, row, col = [""], 0, 0
    for token in re.findall(r"\x1b\[[0-9;?]*[A-Za-z]|\r|\n|[^\x1b\r\n]+|\x1b", raw):
        if token == "\r":
            col = 0
        elif token == "\n":
            row += 1
            col = 0
            if row == len(lines):
                lines.append("")
        elif token == "\x1b[K":
            lines[row] = lines[row][:col]
        elif not token.startswith("\x1b"):
            line = lines[row].ljust(col)
            lines[row] = line[:col] + token + line[col + len(token):]
            col += len(token)
    return lines


def test_screen_obeys_the_terminal():
    assert screen("nndb: step 3  1 finding(s)\rit 50\n") == ["it 50 step 3  1 finding(s)", ""]   # (the glue)
    assert screen("nndb: step 3\r\x1b[Kit 50\nab\rc\x1b[K") == ["it 50", "c"]


PRINTS = LONG.replace("    step += 1\n", "    step += 1\n    if step % 40 == 0:\n"
                      "        print(f'it {{step}}', flush=True)\n        import sys; print('e', step, file=sys.stderr)\n")


def test_the_script_s_lines_never_keep_a_piece_of_the_progress_line(tmp_path):
    """Each line the script prints erases the line first and it is drawn again
    after (issue 39: 'mfu 0.00%ding(s)'); nndb's own stop line too."""
    pytest.importorskip("pty")
    from test_repl_terminal import Terminal
    (tmp_path / "long.py").write_text(PRINTS.format(secs=2.5))
    term = Terminal(["run", "--nx", "-q", "--trace", str(tmp_path / "t.h5"), "long.py"], cwd=tmp_path, home=tmp_path)
    try:
        text = _continue_to_the_end(term)
        term.type("quit")
        assert term.proc.wait(timeout=60) == 0
    finally:
        term.close()
    assert "steps/s" in text                                  # (the line was drawn)
    shown = screen(text)
    script = [line for line in shown if line.startswith(("it ", "e ", "done"))]
    assert len(script) >= 4 and all(re.fullmatch(r"(it|e|done) \d+", line) for line in script), script
    assert not [line for line in shown if "finding(s)" in line and not line.startswith("nndb: step")], shown


def test_the_line_is_off_the_terminal_before_a_prompt_that_printed_nothing():
    """A stop whose points are all silent prints nothing (nothing cleared the
    line, and the prompt was drawn under it): the prompt loop clears it."""
    from nndb.driver import DebugOptions, build_session
    from nndb.frontends.batch import ScriptedFrontend
    s = build_session(ScriptedFrontend([]), DebugOptions())
    out = []
    s.progress = ProgressLine(s, out.append, streams=())
    s.progress.draw(12, 40.0, 0.5, 0)
    s.interact()                         # (no input: quit)
    assert out == [CLEAR + "nndb: step 12  40 steps/s  loss 0.5  0 finding(s)\r", CLEAR]
