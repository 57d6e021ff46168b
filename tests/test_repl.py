"""The prompt_toolkit REPL, driven without a terminal: pipe input, dummy output."""
import io

import pytest
from prompt_toolkit.document import Document
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from nndb.run.config import RunConfig
from nndb.driver import DebugOptions, debug
from nndb.run.launcher import Target
from nndb.frontends.repl import ReplFrontend
from nndb.frontends.completer import NndbCompleter
from nndb.frontends.toolbar import toolbar_text

from conftest import example


def _run(tmp_path, typed: str, script="dead_relu.py", steps=4, history=None, **options):
    out = io.StringIO()
    with create_pipe_input() as inp:
        inp.send_text(typed)
        fe = ReplFrontend(input=inp, output=DummyOutput(), out=out, err=out, history_path=history)
        cfg = RunConfig(Target(path=example(script), args=["--steps", str(steps)]),
                        str(tmp_path / "t.h5"), quiet=True)
        res = debug(cfg, DebugOptions(no_rc=True, **options), fe)
    return out.getvalue(), res


def test_a_typed_session_stops_steps_prints_and_quits(tmp_path, capsys):
    out, res = _run(tmp_path, "break step 1\nc\np $step\n\nn\ninfo step\nquit\ny\n")
    assert out.startswith("Stopped at the start of the run (module model is about to run its forward)")
    assert "-> loss = criterion(model(x[idx]), y[idx])" in out.split("Breakpoint 1: step 1")[0]
    assert "Breakpoint 1: step 1" in out
    assert "Breakpoint 1, step 1 finished, loss" in out
    # an empty line repeats the last command: p $step printed twice
    assert out.count("\n1\n") >= 1 and out.split("Breakpoint 1, step 1 finished")[1].count("1\n") >= 2
    assert "Step 2 finished" in out
    assert "last finished step  2" in out
    assert res.exit_code == 0 and res.reason == "killed from the debugger"
    # killed inside step 2's optimizer.step(): the script never printed step 2
    script_out = capsys.readouterr().out
    assert "step 1 loss" in script_out and "step 2 loss" not in script_out


def test_ctrl_d_asks_before_killing_a_live_run(tmp_path):
    # Ctrl-D (end of input) at the prompt: quit, which asks; "n" keeps the session
    out, res = _run(tmp_path, "n\n\x04n\nc\nquit\n")
    assert "Not confirmed." in out
    assert res.exit_code == 0 and res.reason != "killed from the debugger"


def test_history_is_kept_in_a_file(tmp_path):
    hist = tmp_path / "hist"
    _run(tmp_path, "p 1 + 1\ninfo modules\nquit\ny\n", history=str(hist))
    text = hist.read_text()
    assert "p 1 + 1" in text and "info modules" in text


def test_run_straight_on_with_dash_dash_run(tmp_path):
    out, res = _run(tmp_path, "p $step\nquit\n", stop_at_start=False)
    # no stop at the start: the first prompt is after the run ended
    assert "the run ended (finished, exit code 0) after 4 step(s)" in out
    assert "\n3\n" in out
    assert res.exit_code == 0


class _Probe(ReplFrontend):
    """Runs ``check(session)`` at the first prompt, then quits."""

    def __init__(self, check, **kw):
        super().__init__(**kw)
        self.check = check
        self.result = None

    def read_line(self, prompt):
        if self.result is None:
            self.result = self.check(self.session)
        return "quit"

    def confirm(self, question):
        return True


def _probe(tmp_path, check, commands=(), script="gan.py"):
    out = io.StringIO()
    with create_pipe_input() as inp:
        fe = _Probe(check, input=inp, output=DummyOutput(), out=out, err=out, history_path=None)
        cfg = RunConfig(Target(path=example(script), args=["--steps", "3"]), str(tmp_path / "t.h5"), quiet=True)
        debug(cfg, DebugOptions(no_rc=True, eval_commands=tuple(commands)), fe)
    return fe.result, out.getvalue()


def _complete(session, text):
    comp = NndbCompleter(lambda: session)
    return [c.text for c in comp.get_completions(Document(text, len(text)), None)]


# -- completion at a stop: one probe session (gan.py, stopped at breakpoint 1) ----------------
# (typed text, what the completer offers): one match, then several in any order
EXACTLY = [
    ("wat", ["watch"]),
    ("info b", ["breakpoints"]),
    ("break module netD.0", ["netD.0"]),
    ("watch gr", ["grad"]),
    ("watch grad netD.0.w", ["netD.0.weight"]),
    ("watch grad netD.0.weight no", ["norm"]),
    ("stats act netG.1", ["netG.1"]),
    ("p errD_r", ["errD_real"]),
    ("p $st", ["$step"]),
    ("delete ", ["1"]),
    ("ran", ["rank"]),                      # (the one table: rank and --ranks, nndb.commands.ranks)
    ("p --ra", ["--ranks"]),
    ("stats --ranks a", ["all"]),
    ("stats --ranks all act netG.1", ["netG.1"]),
]
IN_ANY_ORDER = [
    ("break ", {"step", "module", "if"}),
    ("break module netG.[0-3]", {"netG.0", "netG.1", "netG.2", "netG.3"}),
    ("help con", {"continue", "condition", "consumers"}),
]


@pytest.fixture(scope="module")
def at_breakpoint_1(tmp_path_factory) -> dict:
    """What the completer offered for each typed text at the stop, and the toolbar there."""
    texts = [t for t, _ in EXACTLY + IN_ANY_ORDER] + ["set l"]

    def check(s):
        return {"completions": {t: _complete(s, t) for t in texts}, "toolbar": toolbar_text(s)}
    r, _ = _probe(tmp_path_factory.mktemp("complete"), check, commands=["break step 1", "c"])
    return r


@pytest.mark.parametrize("typed,offered", EXACTLY, ids=[t for t, _ in EXACTLY])
def test_completion_offers_the_only_match(at_breakpoint_1, typed, offered):
    assert at_breakpoint_1["completions"][typed] == offered


@pytest.mark.parametrize("typed,offered", IN_ANY_ORDER, ids=[t for t, _ in IN_ANY_ORDER])
def test_completion_offers_every_match(at_breakpoint_1, typed, offered):
    assert set(at_breakpoint_1["completions"][typed]) == offered


def test_completion_of_a_setting_name_offers_lr(at_breakpoint_1):
    assert "lr" in at_breakpoint_1["completions"]["set l"]


def test_toolbar_shows_the_step_the_loss_and_the_stop(at_breakpoint_1):
    bar = at_breakpoint_1["toolbar"]
    assert "step 1" in bar and "loss" in bar and "breakpoint 1" in bar
