"""The past on a real terminal (a pseudo-terminal): the history file, Ctrl-C
during a prediction and a goto made there, and the progress lines (issue 39)."""
import os
import re
import signal
import time

import pytest

from test_repl_terminal import LOOP, Terminal

pytest.importorskip("pty")

SLOW = LOOP.replace("range(100000)", "range(400)").replace("0.002", "0.02")     # (20 ms a step)


def _interrupt(term) -> None:
    """Ctrl-C as the terminal sends it: SIGINT to the foreground process group."""
    os.killpg(term.proc.pid, signal.SIGINT)


def _history(path) -> list:
    return [line[1:] for line in path.read_text().splitlines() if line.startswith("+")]


def test_commands_typed_in_the_past_are_kept_after_a_prediction_there_is_interrupted(tmp_path):
    (tmp_path / "slow.py").write_text(SLOW)
    hist = tmp_path / "hist"
    term = Terminal(["run", "--nx", "--trace", str(tmp_path / "t.h5"), "slow.py"], cwd=tmp_path, home=tmp_path,
                    env={"NNDB_HISTFILE": str(hist)})
    try:
        term.expect("(nndb)")
        term.type("until 10")
        term.expect("(nndb)")
        term.type("rs 3")
        term.expect("(nndb past)")
        term.type("p 111")
        term.expect("(nndb past)")
        term.type("predict 300")
        time.sleep(1.5)                            # (it runs: 300 steps of 20 ms)
        _interrupt(term)
        term.expect("nndb: interrupted (Ctrl-C): no prediction")
        shown = term.expect("(nndb past)")
        term.type("p 222")
        term.expect("\n222\r")
        shown = term.expect("(nndb past)")
        term.type("p 333")
        term.expect("\n333\r")
        shown += term.expect("(nndb past)")
        term.type("present")
        shown += term.expect("(nndb)")
        assert "Unhandled exception" not in shown and "Traceback" not in shown, shown
        term.type("p 444")
        term.expect("(nndb)")
        term.type("kill")
        term.expect("(y or n)")
        term.type("y")
        term.expect("(nndb)")
        term.type("quit")
        assert term.proc.wait(timeout=60) == 0
    finally:
        term.close()
    assert _history(hist) == ["until 10", "rs 3", "p 111", "predict 300", "p 222", "p 333", "present",
                              "p 444", "kill", "y", "quit"]
    assert oct(hist.stat().st_mode & 0o777) == "0o600"
