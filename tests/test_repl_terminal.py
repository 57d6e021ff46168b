"""The REPL on a real terminal (a pseudo-terminal): Ctrl-C while the script
trains stops it at the next stop point and gives the prompt back."""
import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from nndb.store.reader import TraceReader

pty = pytest.importorskip("pty")

LOOP = """
import time, torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(100000):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 5:
        print("ready", flush=True)
    time.sleep(0.002)
"""
_ESC = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


class Terminal:
    def __init__(self, args, cwd, home, python_args=None, env=None):
        """``nndb ARGS`` on a pseudo-terminal (``python_args``: ``python ARGS`` instead)."""
        env = dict(os.environ, PYTHONPATH=ROOT, PROMPT_TOOLKIT_NO_CPR="1", TERM="xterm",
                   HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), **(env or {}))
        self.master, slave = pty.openpty()
        argv = [sys.executable, *python_args] if python_args is not None else [sys.executable, "-m", "nndb", *args]
        self.proc = subprocess.Popen(argv, cwd=cwd, stdin=slave, stdout=slave,
                                     stderr=slave, env=env, close_fds=True, start_new_session=True)
        os.close(slave)
        self.seen = b""

    def expect(self, text: str, timeout: float = 60) -> str:
        """Read until ``text`` shows (escape sequences removed); return what came before."""
        end = time.time() + timeout
        while text.encode() not in _ESC.sub(b"", self.seen):
            r, _, _ = select.select([self.master], [], [], max(0.0, end - time.time()))
            if not r:
                raise AssertionError(f"no {text!r} on the terminal; it shows: {_ESC.sub(b'', self.seen)[-600:]!r}")
            try:
                self.seen += os.read(self.master, 4096)
            except OSError:
                break
        clean = _ESC.sub(b"", self.seen).decode(errors="replace")
        i = clean.index(text)
        self.seen = clean[i + len(text):].encode()
        return clean[:i]

    def type(self, line: str) -> None:
        """Type a line and wait for its echo (the prompt is redrawn with it)."""
        os.write(self.master, line.encode() + b"\r")
        self.expect(line)

    def quit(self) -> int:
        """'quit', answering yes to killing the run; the exit code."""
        self.type("quit")
        self.expect("(y or n)")
        self.type("y")
        return self.proc.wait(timeout=60)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        os.close(self.master)


def test_ctrl_c_stops_a_running_script_at_the_next_stop_point(tmp_path):
    (tmp_path / "loop.py").write_text(LOOP)
    trace = tmp_path / "t.h5"
    term = Terminal(["run", "--nx", "--trace", str(trace), "loop.py"], cwd=tmp_path, home=tmp_path)
    try:
        term.expect("(nndb)")                      # stopped at the start of step 0
        term.type("continue")
        term.expect("ready")
        time.sleep(0.1)
        os.kill(term.proc.pid, signal.SIGINT)      # Ctrl-C
        shown = term.expect("(nndb)")
        assert "stopping at the next step boundary or module call" in shown
        m = re.search(r"Interrupted: step (\d+)", shown)
        assert m, shown
        step = int(m.group(1))
        assert step >= 5 and "loop.py(" in shown
        term.type("p $step")
        term.expect(f"\n{step}\r")               # the value on a line of its own (the prompt may be
        term.expect("(nndb)")                    # redrawn with the typed line first, under load)
        assert term.quit() == 0
    finally:
        term.close()
    with TraceReader(str(trace)) as r:
        assert r.status == "killed" and r.n_steps >= step


STEPS = LOOP.replace("range(100000)", "range(40)") + 'print("done", step)\n'


def test_reverse_step_gives_the_terminal_to_a_replica_and_back(tmp_path):
    """A replica in the past reads the same terminal with its own prompt; Ctrl-C
    there is the replica's; 'present' brings back the live run's prompt."""
    (tmp_path / "steps.py").write_text(STEPS)
    term = Terminal(["run", "--nx", "--trace", str(tmp_path / "t.h5"), "steps.py"], cwd=tmp_path, home=tmp_path)
    try:
        term.expect("(nndb)")
        term.type("until 20")
        term.expect("(nndb)")
        term.type("reverse-step 5")
        term.expect("In the past (timeline 0): step 15 finished")
        term.expect("(nndb past)")
        term.type("p step")
        term.expect("\n15\r")
        term.expect("(nndb past)")
        term.type("set lr 0.5")
        term.expect("starts timeline 1")
        term.expect("(nndb t1)")
        term.type("present")
        term.expect("Back in the present (timeline 0): step 20.")
        term.expect("(nndb)")
        term.type("p step")
        term.expect("\n20\r")
        term.expect("(nndb)")
        term.type("continue")
        term.expect("done 39")
        term.expect("(nndb)")
        term.type("quit")
        assert term.proc.wait(timeout=60) == 0
    finally:
        term.close()


RAISES = """
import torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(5):
    if step == 2:
        raise RuntimeError("planted at step 2")
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
"""


def test_sigterm_at_the_post_mortem_prompt_ends_the_run_as_at_any_prompt(tmp_path):
    """SIGTERM (torchrun ending a job's ranks, a scheduler) at the post-mortem prompt: nndb
    printed its own traceback ('nndb.errors.Terminated', raised from prompt_toolkit under the
    script's) and ended with 1.  It ends as SIGTERM at any prompt does: exit code 143, the
    trace closed 'terminated', its reason the script's exception first."""
    (tmp_path / "raises.py").write_text(RAISES)
    trace = tmp_path / "t.h5"
    term = Terminal(["run", "--nx", "--trace", str(trace), "raises.py"], cwd=tmp_path, home=tmp_path)
    try:
        term.expect("(nndb)")
        term.type("continue")
        term.expect("nndb: post-mortem: the script raised RuntimeError during step 2")
        term.expect("(nndb)")
        os.kill(term.proc.pid, signal.SIGTERM)
        assert term.proc.wait(timeout=60) == 143
        rest = b""
        while select.select([term.master], [], [], 0.5)[0]:
            try:
                rest += os.read(term.master, 4096)
            except OSError:
                break
        shown = _ESC.sub(b"", term.seen + rest).decode(errors="replace")
    finally:
        term.close()
    assert "Terminated" not in shown and "Traceback" not in shown, shown
    with TraceReader(str(trace)) as r:
        assert r.status == "terminated" and r.end["exit_code"] == 143, r.end
        assert r.end["reason"] == "RuntimeError: planted at step 2 (then SIGTERM at its post-mortem)"
        assert r.n_steps == 2
