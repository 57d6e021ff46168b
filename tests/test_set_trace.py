"""nndb.set_trace() and breakpoint() with PYTHONBREAKPOINT=nndb.set_trace:
the prompt at the script's line, in a process nndb did not start (it starts
recording there) and under nndb run (a stop of that run)."""
import os
import re

import pytest

from conftest import Transcript, _base_env, python
from nndb.store.reader import TraceReader

LOOP = """\
import torch
{imports}
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = torch.randn(32, 4), torch.randn(32, 1)
for step in range(12):
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 4:
        {call}
    print(f"step {{step}} loss {{loss.item():.8f}}")
"""
CALL_LINE = 13


def _script(tmp_path, call="nndb.set_trace()", imports="import nndb"):
    path = tmp_path / "loop.py"
    path.write_text(LOOP.format(call=call, imports=imports))
    return path


def _python(tmp_path, script, stdin="", env=None):
    """``python SCRIPT`` with ``stdin`` piped in, in a child of the zygote (the
    script's own start-up is not what these tests look at: what the prompt
    does, what the script computes and prints; the terminal's test is a real
    Python on a pty)."""
    e = {k: v for k, v in _base_env().items() if k != "PYTHONBREAKPOINT"}
    e.update(env or {})
    return python(str(script), cwd=str(tmp_path), forked=True, input=stdin, env=e, timeout=120)


def _plain(tmp_path):
    """The loop without the call, as plain Python prints it (in a child of the
    zygote: what the script computes and prints, no torch import of its own)."""
    return python(str(_script(tmp_path, call="pass", imports="")), cwd=str(tmp_path), forked=True)


def _losses(stdout: str) -> list:
    """The script's lines (one may follow a prompt: input() shows it without a newline)."""
    return re.findall(r"step \d+ loss [0-9.]+", stdout)


def _trace_in(tmp_path) -> str:
    runs = os.listdir(tmp_path / "nndb-runs")
    assert len(runs) == 1, runs
    return str(tmp_path / "nndb-runs" / runs[0])


def test_set_trace_stops_at_the_line_and_continue_finishes_with_the_same_numbers(tmp_path):
    plain = _plain(tmp_path)
    script = _script(tmp_path)
    ran = _python(tmp_path, script, stdin="p step\np loss.item() > 0\ncontinue\n")
    assert ran.returncode == 0, ran.stderr
    out = ran.stdout
    assert f"Stopped at nndb.set_trace() during step 0\n> loop.py({CALL_LINE})<module>()\n-> nndb.set_trace()" in out
    assert "(nndb) 4\n(nndb) True\n(nndb) " in out               # p of the script's locals
    assert _losses(out) == _losses(plain.stdout) and len(_losses(out)) == 12
    assert "recording from here to nndb-runs/loop-" in out
    assert "time travel (goto, reverse-step) reaches back to the end of this step, not before" in out
    with TraceReader(_trace_in(tmp_path)) as r:
        assert r.status == "finished" and r.n_steps == 7     # steps 5..11 of the script, from set_trace on


def test_breakpoint_with_pythonbreakpoint_and_a_watch_after_the_call(tmp_path):
    plain = _plain(tmp_path)          # (what it prints with breakpoint() a no-op, PYTHONBREAKPOINT=0)
    script = _script(tmp_path, call="breakpoint()", imports="")
    cmds = "watch loss mean < 1.05\ncontinue\np step\nrs 1\np step\npresent\ncontinue\n"
    ran = _python(tmp_path, script, stdin=cmds, env={"PYTHONBREAKPOINT": "nndb.set_trace"})
    assert ran.returncode == 0, ran.stderr
    t = Transcript(ran.stdout + ran.stderr)
    assert f"> loop.py({CALL_LINE})<module>()\n-> breakpoint()" in t.text
    assert "Watchpoint 1: loss mean = 1.045 (< 1.05) at step 3" in t.text    # nndb's step 3: the script's 8
    assert "(nndb) 8\n" in t.text
    assert "In the past (timeline 0): step 2 finished" in t.text and "(nndb past) 7\n" in t.text
    assert _losses(ran.stdout) == _losses(plain.stdout)


def test_time_travel_after_set_trace_lands_on_the_recorded_values(tmp_path):
    """Fork checkpoints from the call on: goto and reverse-step show what the
    script computed at those steps (its own printed losses), going back
    before the first checkpoint is refused in one line, and the piped
    commands run once each (a replica forked at the prompt must not inherit
    the lines the parent read ahead)."""
    plain = _plain(tmp_path)
    script_losses = {int(a): b for a, b in re.findall(r"step (\d+) loss ([0-9.]+)", plain.stdout)}
    cmds = ("break step 5\ncontinue\np '%.8f' % $loss\ngoto 2\np '%.8f' % $loss\np step\nreverse-step\n"
            "p step\ngoto 0\nreverse-step\npresent\np step\ncontinue\n")
    ran = _python(tmp_path, _script(tmp_path), stdin=cmds)
    assert ran.returncode == 0, ran.stderr
    t = Transcript(ran.stdout + ran.stderr)
    # nndb's step k is the script's step k + 5 (recording starts in the script's step 5)
    assert f"(nndb) '{script_losses[10]}'\n" in t.text                      # the live stop at step 5
    assert "In the past (timeline 0): step 2 finished" in t.text
    assert f"(nndb past) '{script_losses[7]}'\n(nndb past) 7\n" in t.text      # goto 2: the script's step 7
    assert "step 1 finished" in t.text and "(nndb past) 6\n" in t.text       # reverse-step
    assert "cannot go back before the end of step 0 (the first checkpoint)" in t.text
    assert "Back in the present" in t.text and "(nndb) 10\n" in t.text
    assert t.text.count("In the past") == 3                    # goto 2, reverse-step, goto 0: once each
    assert _losses(ran.stdout) == _losses(plain.stdout)


def test_quit_ends_the_recording_and_the_program_goes_on(tmp_path):
    ran = _python(tmp_path, _script(tmp_path), stdin="quit\ny\n")
    assert ran.returncode == 0, ran.stderr
    assert len(_losses(ran.stdout)) == 12
    assert "the recording ended" in ran.stderr and "the program goes on without nndb" in ran.stderr
    with TraceReader(_trace_in(tmp_path)) as r:
        assert r.status == "killed"


def test_end_of_input_at_the_prompt_is_quit(tmp_path):
    ran = _python(tmp_path, _script(tmp_path), stdin="")
    assert ran.returncode == 0 and len(_losses(ran.stdout)) == 12, ran.stderr


def test_under_nndb_run_set_trace_is_a_stop_of_that_run(tmp_path):
    from nndb.run.config import RunConfig
    from nndb.driver import DebugOptions, debug
    from nndb.frontends.batch import ScriptedFrontend
    from nndb.run.launcher import Target
    fe = ScriptedFrontend(["p step", "continue"])
    cfg = RunConfig(Target(path=str(_script(tmp_path))), str(tmp_path / "run.h5"), quiet=True)
    result = debug(cfg, DebugOptions(stop_at_start=False, no_rc=True, replica="off"), fe)
    t = Transcript(fe.text, result)
    assert result.exit_code == 0
    assert f"Stopped at nndb.set_trace() during step 5\n> {os.path.relpath(tmp_path / 'loop.py')}({CALL_LINE})" in t.text
    assert "(nndb) p step\n4" in t.text
    assert [s["reason"] for s in result.session.log.stops] == ["set_trace"]
    assert not (tmp_path / "nndb-runs").exists()            # nndb run's trace, not a second recording
    with TraceReader(str(tmp_path / "run.h5")) as r:
        assert r.n_steps == 12


def test_set_trace_on_a_terminal_uses_the_repl(tmp_path):
    pytest.importorskip("pty")
    from test_repl_terminal import Terminal
    _script(tmp_path)
    term = Terminal([], cwd=tmp_path, home=tmp_path, python_args=["loop.py"])
    try:
        shown = term.expect("(nndb)")
        assert f"loop.py({CALL_LINE})<module>()" in shown
        term.type("p step")
        term.expect("\n4\r")
        term.expect("(nndb)")
        term.type("continue")
        term.expect("step 11 loss")
        assert term.proc.wait(timeout=60) == 0
    finally:
        term.close()


def test_a_trace_path_it_may_not_write_is_one_line_and_the_program_goes_on(tmp_path):
    (tmp_path / "taken.txt").write_text("mine")
    ran = _python(tmp_path, _script(tmp_path, call="nndb.set_trace(trace='taken.txt')"), stdin="continue\n")
    assert ran.returncode == 0 and len(_losses(ran.stdout)) == 12
    assert ran.stderr.count("\n") == 1 and "exists and is not an nndb trace" in ran.stderr
    assert "the program goes on without nndb" in ran.stderr and (tmp_path / "taken.txt").read_text() == "mine"
