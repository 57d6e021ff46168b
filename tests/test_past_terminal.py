"""The past on a real terminal (a pseudo-terminal): the history file, Ctrl-C
during a prediction and a goto made there, and the progress lines (issue 39)."""
import os
import re
import select
import signal
import time

import pytest

from test_repl_terminal import _ESC, LOOP, Terminal

pytest.importorskip("pty")

SLOW = LOOP.replace("range(100000)", "range(400)").replace("0.002", "0.02")     # (20 ms a step)


def _interrupt(term) -> None:
    """Ctrl-C as the terminal sends it: SIGINT to the foreground process group."""
    os.killpg(term.proc.pid, signal.SIGINT)


def _raw_until(term, text: str, timeout: float = 120) -> str:
    """What the terminal is sent up to ``text`` (escape sequences kept: the
    erasing of a line is one), read past Terminal.expect, which drops them."""
    raw, end = term.seen, time.time() + timeout
    while text.encode() not in _ESC.sub(b"", raw):
        r, _, _ = select.select([term.master], [], [], max(0.0, end - time.time()))
        assert r, f"no {text!r} on the terminal: {raw[-600:]!r}"
        raw += os.read(term.master, 4096)
    term.seen = b""
    return raw.decode(errors="replace")


def _history(path) -> list:
    return [line[1:] for line in path.read_text().splitlines() if line.startswith("+")]


def _in_the_past(tmp_path, text: str, until: int, back: int):
    """A run of ``text`` on a terminal, its history in the working directory ("hist"), gone
    back ``back`` steps from the end of step ``until``: (the terminal, what it showed)."""
    (tmp_path / "train.py").write_text(text)
    term = Terminal(["run", "--nx", "--trace", str(tmp_path / "t.h5"), "train.py"], cwd=tmp_path, home=tmp_path,
                    env={"NNDB_HISTFILE": str(tmp_path / "hist")})
    term.expect("(nndb)")
    term.type(f"until {until}")
    term.expect("(nndb)")
    term.type(f"rs {back}")
    return term, term.expect("(nndb past)")


def test_commands_typed_in_the_past_are_kept_after_a_prediction_there_is_interrupted(tmp_path):
    hist = tmp_path / "hist"
    term, _ = _in_the_past(tmp_path, SLOW, 10, 3)
    try:
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
        _kill_and_quit(term)
    finally:
        term.close()
    assert _history(hist) == ["until 10", "rs 3", "p 111", "predict 300", "p 222", "p 333", "present",
                              "p 444", "kill", "y", "quit"]
    assert oct(hist.stat().st_mode & 0o777) == "0o600"


def _kill_and_quit(term) -> None:
    """At the live run's prompt: kill it (confirmed), then quit; nndb exits 0."""
    term.type("kill")
    term.expect("(y or n)")
    term.type("y")
    term.expect("(nndb)")
    term.type("quit")
    assert term.proc.wait(timeout=60) == 0


def test_ctrl_c_in_a_goto_from_the_past_says_the_user_is_in_the_present(tmp_path):
    """The goto hands the past back to the live run (that past is gone): the
    progress line and the message say where Ctrl-C leaves the user (issue 39:
    'nothing was changed ... leaves you where you were', in the present).  And
    the replica's progress line is off the terminal before it prints, counting
    the steps as its stop line does."""
    from test_progress import screen
    (tmp_path / "slow.py").write_text(SLOW)
    term = Terminal(["run", "--nx", "--checkpoint-every", "1000", "--trace", str(tmp_path / "t.h5"), "slow.py"],
                    cwd=tmp_path, home=tmp_path)
    try:
        term.expect("(nndb)")
        term.type("until 200")
        term.expect("(nndb)")
        term.type("rs 5")                  # (195 steps from the checkpoint at step 0: a progress line)
        raw = _raw_until(term, "(nndb past)")
        term.type("goto 190")
        time.sleep(2.5)                    # (it replays 190 steps of 20 ms: 3.8 s at least)
        _interrupt(term)
        shown = _raw_until(term, "(nndb)")
        term.type("p step")
        term.expect("\n200\r")
        term.expect("(nndb)")
        assert term.quit() == 0
    finally:
        term.close()
    lines = screen(shown)
    said = [line for line in lines if "interrupted" in line]
    assert said == ["nndb: interrupted (Ctrl-C); nothing was changed; you are in the present (timeline 0): step 200"], \
        lines
    assert "Ctrl-C stops it and takes you to the present (step 200)" in shown
    assert "leaves you where you were" not in shown
    # the first replay: its line said N of 195, was cleared before 'In the past', and agrees with it
    counts = {int(n) for n in re.findall(r"replaying: \d+ of (\d+) step", raw)}
    past = [line for line in screen(raw) if "In the past" in line]
    assert counts == {195} and past[0].startswith("In the past (timeline 0): step 195 finished"), (counts, past)
    assert past[0].endswith("195 step(s) replayed from the checkpoint at step 0)"), past


def test_the_history_is_written_past_a_replica_s_sandbox(tmp_path, monkeypatch):
    """In a replica the sandbox replaces open (and may replace os.open): the
    history keeps the opener of the process that made the prompt."""
    import builtins
    from nndb.frontends.repl import History
    path = tmp_path / "hist"
    h = History(str(path))

    def sandboxed(*args, **kwargs):
        raise AssertionError("the history went through the sandbox")
    monkeypatch.setattr(builtins, "open", sandboxed)
    monkeypatch.setattr(os, "open", sandboxed)
    h.store_string("p 1")
    h.store_string("p 2")
    monkeypatch.undo()
    assert _history(path) == ["p 1", "p 2"]


def test_the_history_written_in_the_past_is_no_file_the_replica_changed(tmp_path):
    """The history file under the working directory (a run started from the home directory,
    or NNDB_HISTFILE there): each travel back after a command typed in the past said "nndb:
    warning: 1 of your file(s) changed while the replica ran (...): hist (changed)"."""
    hist = tmp_path / "hist"
    term, shown = _in_the_past(tmp_path, LOOP, 5, 2)
    try:
        term.type("p 111")
        shown += term.expect("(nndb past)")
        term.type("present")
        shown += term.expect("(nndb)")
        _kill_and_quit(term)
    finally:
        term.close()
    assert "Back in the present (timeline 0): step 5." in shown, shown
    assert "changed while the replica ran" not in shown, shown
    assert _history(hist)[:4] == ["until 5", "rs 2", "p 111", "present"]
