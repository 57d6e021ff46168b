"""Property tests of the command line: whatever is typed, ``Session.execute``
never raises and never prints a Python traceback (errors are one line), in
every state a session can be in; the table's parsers raise only CommandError.

The live states come from real in-process runs: the examples run inside the
front end's ``read_line`` while the session is stopped there."""
import gc
import os
import string
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import example
from nndb.run.config import RunConfig
from nndb.debugger import points as P
from nndb.commands import TABLE
from nndb.commands.breakpoints import _numbers
from nndb.commands.inspect import _info_arg
from nndb.driver import DebugOptions, build_session, debug
from nndb.frontends.batch import ScriptedFrontend
from nndb.debugger.session import Session
from nndb.errors import CommandError
from nndb.run.launcher import Target

SETTINGS = dict(deadline=None, database=None, derandomize=True,
                suppress_health_check=list(HealthCheck))

# -- strategies ----------------------------------------------------------------------------
NAMES = sorted({n for c in TABLE.commands for n in (c.name, *c.aliases)})
PREFIXES = sorted({c.name[:k] for c in TABLE.commands for k in (1, 2, 3)})
SUBWORDS = ["step", "module", "if", "fail", "forward", "backward", "grad", "weight", "param", "update",
            "act", "loss", "consecutive", "group", "optimizer", "lr", "momentum", "betas", "params",
            "breakpoints", "watchpoints", "display", "locals", "modules", "b", "s", "--last", "silent",
            "end", "info", "/full", "/f", "/x", *P.STATS]
# numbers that cannot make an expression allocate gigabytes ([0] * N, 'a' * N)
NUMBERS = st.one_of(st.integers(-3, 12).map(str),
                    st.sampled_from(["99999999999999999999999", "-99999999999999999999999", "0x1f", "0b2",
                                     "1e-3", "1e308", "-0", "nan", "inf", "-inf", "1_000", "3.5", "07", ""]))
GLOBS = st.sampled_from(["*", "0.*", "*.weight", "fc*", "model", "criterion", "0.weight", "4", "act#2",
                         "[", "[!a]", "?", "[]]", "\\", "zzz*"])
OPERATORS = st.sampled_from(["=", "==", "!=", ">", ">=", "<", "<=", "+", "-", "/", "%", "(", ")", "[", "]",
                             "{", "}", ",", ":", ";", ".", "'", '"', "'''", "\\", "#", "@", "~", "!", "$",
                             "-", "--", "1-3", "3-1", "-1-2", "and", "or", "not", "None", "lambda", "else",
                             "in", "is"])
DOLLARS = st.sampled_from(["$step", "$loss", "$grad", "$act", "$weight", "$param", "$update", "$losses",
                           "$inputs", "$grad_output", "$module", "$exception", "$nope", "$", "$1", "$$",
                           "$grad['0.weight'].norm", "$grad['*']", "$act['4'].zero_frac", "$grad['nope']",
                           "$grad[0]", "$inputs[0].shape", "$loss +", "$step == 1"])
NAMES_IN_SCRIPT = st.sampled_from(["loss", "inputs", "step", "model", "optimizer", "args", "undefined_name",
                                   "optimizer.param_groups[0]['lr']", "loss.item()", "len(", "print"])
TOKEN = st.one_of(st.sampled_from(NAMES + SUBWORDS), NUMBERS, GLOBS, OPERATORS, DOLLARS, NAMES_IN_SCRIPT,
                  st.text(alphabet=string.printable, max_size=4))
FIRST = st.one_of(st.sampled_from(NAMES), st.sampled_from(PREFIXES),
                  st.sampled_from(["p/full", "print/f", "p/", "p/zz", "!", "! ", "#", "", " ", "info b",
                                   "info s", "help info", "b step", "break module", "watch grad",
                                   "watch loss", "break if", "tbreak if", "condition 1", "ignore 1",
                                   "set lr", "commands 1", "delete 1-3", "history grad", "stats grad"]))
LINE = st.builds(lambda first, rest, sep: first + sep + " ".join(rest),
                 FIRST, st.lists(TOKEN, max_size=7), st.sampled_from([" ", "", "\t"]))
# well-formed commands with odd parts: an expression grammar and each command's shape
ATOM = st.one_of(DOLLARS, NAMES_IN_SCRIPT, NUMBERS.filter(bool), st.sampled_from(["'a'", '"b"', "[1]", "()"]))
EXPR = st.builds(lambda atoms, ops, tail: "".join(a + " " + o + " " for a, o in zip(atoms, ops)) + atoms[-1] + tail,
                 st.lists(ATOM, min_size=1, max_size=4),
                 st.lists(st.sampled_from(["+", "-", "==", "!=", "<", ">=", "and", "or", "if", "else", ".",
                                           "[", "(", ","]), max_size=3),
                 st.sampled_from(["", "", ")", "]", "[", "(", " if", " fail", " if $step > 1", "'"]))
KIND = st.sampled_from(["grad", "weight", "param", "update", "act", "loss", "frob", ""])
STAT = st.sampled_from([*P.STATS, "", "frob"])
OP = st.sampled_from([*P.OPS, "", "=>", "=<"])
SHAPED = st.one_of(
    st.builds("p {} {}".format, st.sampled_from(["", "/full", "/f", "/"]), EXPR),
    st.builds("{} {}".format, st.sampled_from(["display", "py", "!", "break if", "tbreak if", "condition 1",
                                               "condition 2", "b step 2 if", "break module * if"]), EXPR),
    st.builds("{} {} {}".format, st.sampled_from(["break", "tbreak", "b", "tb"]),
              st.sampled_from(["step", "module", "if", ""]),
              st.one_of(NUMBERS, GLOBS.map(lambda g: g + " forward"), GLOBS.map(lambda g: g + " backward"))),
    st.builds("watch {} {} {} {} {} {}".format, KIND, GLOBS, STAT, OP, NUMBERS,
              st.sampled_from(["", "consecutive 2", "consecutive 0", "consecutive", "fail", "x"])),
    st.builds("set {} {} {}".format, st.sampled_from(["lr", "momentum", "betas", "params", "foreach", "x"]),
              st.one_of(NUMBERS, st.sampled_from(["(0.9, 0.99)", "(1,", "True", "'a'", "[1]", "None"])),
              st.sampled_from(["", "group 0", "group 9", "group x", "optimizer optimizer", "optimizer nope",
                               "group", "optimizer"])),
    st.builds("history {} {} {} {}".format, KIND, GLOBS, STAT,
              st.sampled_from(["", "--last 2", "--last", "--last 0", "--last x"])),
    st.builds("stats {} {}".format, KIND, GLOBS),
    st.builds("{} {}".format, st.sampled_from(["delete", "disable", "enable", "undisplay", "ignore 1", "ignore",
                                               "commands", "continue", "next", "until", "up", "down", "list",
                                               "info", "help", "echo"]),
              st.one_of(NUMBERS, st.sampled_from(["1-3", "3-1", "1 2", "-1", "x", "breakpoints", "locals",
                                                  "params", "optimizer", "modules", "step", "display"]))),
)
VALID = st.sampled_from([
    "p $step", "p $loss", "p $grad['0.weight'].norm", "p/full loss", "p $inputs", "p $exception", "stats",
    "stats grad", "stats act 4", "history loss", "history grad 0.weight zero_frac --last 3", "info step",
    "info locals", "info params", "info optimizer", "info modules", "info breakpoints", "info display",
    "where", "up", "down", "list", "list 1", "list", "display $loss", "display $step + 1", "undisplay",
    "break step 3", "break module 2", "break module * backward", "tbreak step 2", "break if $loss > 0",
    "watch grad 0.weight norm > 1", "watch loss", "watch act 1 zero_frac == 1 consecutive 2",
    "condition 1 $step > 0", "condition 1", "ignore 1 2", "commands 1", "commands", "delete 1", "delete",
    "disable", "enable", "help", "help p", "help info", "echo x\\ny", "set lr 0.05", "set momentum 0.5 group 0",
    "n", "n 2", "s", "c", "c 3", "finish", "until 3", "detach", "kill", "run", "quit", "!zz = 1", "p zz",
    "py pass", "source .", "source nope.txt"])
ANY_LINE = st.one_of(VALID, LINE, SHAPED, SHAPED, st.text(max_size=40))
LINES = st.lists(ANY_LINE, min_size=1, max_size=4)


# -- the check ----------------------------------------------------------------------------
def _reset(s: Session, frame_index: int) -> None:
    """Undo what an example's commands asked of the run (they only set flags:
    the run goes on only when read_line returns)."""
    s.reset_run_control()
    s.input.queue.clear()
    if s.here.frames:
        s.here.frame_index = frame_index


def _check_lines(s: Session, fe, lines) -> None:
    frame_index = s.here.frame_index
    before = len(fe.output)
    try:
        for text in lines:
            s.execute(text)                  # must not raise
    finally:
        _reset(s, frame_index)
    printed = "\n".join(fe.output[before:])
    assert "Traceback" not in printed and "internal error" not in printed, (lines, printed)


def _fuzz(s: Session, fe, max_examples: int) -> None:
    @settings(max_examples=max_examples, **SETTINGS)
    @given(LINES)
    def check(lines):
        _check_lines(s, fe, lines)
    check()


class FuzzFrontend(ScriptedFrontend):
    """Types ``lines``; at the prompt after them runs the examples, then kills
    the run and quits.  A ``commands`` block read from it is empty or unclosed."""
    session = None

    def __init__(self, lines, max_examples):
        super().__init__(lines)
        self.max_examples = max_examples
        self.failure = None
        self.fuzzed = None          # the session's state when the examples ran
        self._blocks = 0

    def read_line(self, prompt):
        if prompt == ">":
            self._blocks += 1
            return "end" if self._blocks % 2 else None
        if self.lines:
            return super().read_line(prompt)
        if self.fuzzed is None:
            s = self.session
            self.fuzzed = (s.control.state, s.here.stop.kind if s.here.stop else None)
            try:
                _fuzz(s, self, self.max_examples)
            except BaseException as e:      # re-raised by the test, not into the script
                self.failure = e
            return "kill"
        return "quit"


def _fuzz_run(tmp_path, monkeypatch, script, lines, args=(), max_examples=150):
    monkeypatch.chdir(tmp_path)              # 'source WORD' reads nothing of the repository
    gc.collect()
    fe = FuzzFrontend(lines, max_examples)
    cfg = RunConfig(Target(path=example(script), args=["--steps", "4", *args]), str(tmp_path / "t.h5"),
                    quiet=True)
    res = debug(cfg, DebugOptions(no_rc=True), fe)
    if fe.failure is not None:
        raise fe.failure
    return fe, res


# -- the states ------------------------------------------------------------------------------
@settings(max_examples=200, **SETTINGS)
@given(LINES)
def test_no_run_never_raises(lines):
    fe = ScriptedFrontend([], answers=[])
    s = build_session(fe, DebugOptions())
    _check_lines(s, fe, lines)


@settings(max_examples=100, **SETTINGS)
@given(LINES)
def test_batch_session_without_a_run_never_raises(lines):
    fe = ScriptedFrontend([])
    s = build_session(fe, DebugOptions(batch=True))
    _check_lines(s, fe, lines)


@pytest.mark.parametrize("script,lines,args,state", [
    ("mlp.py", ["n"], (), ("live", "next")),                                     # a step end
    ("mlp.py", [], (), ("live", "start")),                                       # a module's forward
    ("mlp.py", ["break module 4 backward", "c", "delete"], (), ("live", "breakpoint")),  # a backward
    ("raises.py", ["c"], ("--fail-at", "1"), ("post-mortem", "exception")),
    ("mlp.py", ["kill"], (), ("exited", "exited")),
])
def test_a_stopped_session_never_raises(tmp_path, monkeypatch, capsys, script, lines, args, state):
    fe, res = _fuzz_run(tmp_path, monkeypatch, script, lines, args)
    assert fe.fuzzed == state                # the examples ran in the state meant
    assert "Traceback" not in "\n".join(fe.output)
    err = capsys.readouterr().err
    # the only traceback is the script's own (raises.py), printed as Python does
    assert err.count("Traceback (most recent call last)") == (1 if script == "raises.py" else 0), err


RESUME = st.sampled_from(["c", "n", "s", "finish", "until 2", "c 2", "n 2", "detach", "run", "kill", "quit"])


@settings(max_examples=12, **SETTINGS)
@given(st.lists(st.one_of(ANY_LINE, RESUME, RESUME), max_size=20), st.lists(st.booleans(), max_size=8),
       st.sampled_from(["mlp.py", "raises.py", "gan.py"]))
def test_whole_sessions_end_cleanly(lines, answers, script):
    """Typed lines that also resume, restart and kill the run: the session ends
    (the lines run out: kill, quit) with no traceback and a known exit code."""
    gc.collect()
    fe = ScriptedFrontend(lines + ["kill", "quit"], answers=answers)
    with tempfile.TemporaryDirectory() as d:
        args = ["--steps", "3"] + (["--fail-at", "1"] if script == "raises.py" else [])
        res = debug(RunConfig(Target(path=example(script), args=args), os.path.join(d, "t.h5"), quiet=True),
                    DebugOptions(no_rc=True), fe)
    assert "Traceback" not in fe.text and "internal error" not in fe.text, fe.text
    assert res.exit_code in (0, 1, 4)
    # (the lines run out, or quit ended the session, or a detached run ended it with the script)
    assert not fe.lines or fe.lines == ["kill", "quit"][-len(fe.lines):] or res.session.quit_requested \
        or res.session.control.mode == "detach"


# -- the parsers --------------------------------------------------------------------------------
PARSE_TEXT = st.one_of(st.text(max_size=40), st.lists(TOKEN, max_size=8).map(" ".join))


def _only_command_errors(fn, text):
    try:
        fn(text)
    except CommandError:
        pass


@settings(max_examples=200, **SETTINGS)
@given(st.sampled_from(TABLE.commands), PARSE_TEXT)
def test_each_commands_parser_raises_only_command_error(cmd, text):
    _only_command_errors(cmd.parse, text)


@settings(max_examples=200, **SETTINGS)
@given(st.sampled_from([P.parse_break, P.parse_watch, _numbers, _info_arg, TABLE.lookup, TABLE.help]),
       PARSE_TEXT)
def test_grammar_parsers_raise_only_command_error(fn, text):
    _only_command_errors(fn, text)


@settings(max_examples=200, **SETTINGS)
@given(st.text(min_size=1, max_size=30).filter(lambda t: t.strip()))
def test_split_and_lookup(text):
    word, rest = TABLE.split(text)
    assert word and (word == "!" or not any(c.isspace() for c in word))
    try:
        cmd = TABLE.lookup(word.partition("/")[0])
    except CommandError as e:
        assert str(e).startswith(("ambiguous command", "undefined command"))
    else:
        assert cmd.name.startswith(word.partition("/")[0]) or word.partition("/")[0] in cmd.aliases


def test_parse_break_examples():
    assert P.parse_break("step 3") == (P.StepBreak, {"step": 3}, None, False)
    assert P.parse_break("module fc* backward if $step > 2 fail") == \
        (P.ModuleBreak, {"glob": "fc*", "phase": "backward"}, "$step > 2", True)
    assert P.parse_break("if $loss > 1") == (P.ExprBreak, {"expr": "$loss > 1"}, None, False)
    # break if EXPR if COND; Python's conditional expression stays one expression
    assert P.parse_break("if $loss > 1 if $step == 3") == (P.ExprBreak, {"expr": "$loss > 1"}, "$step == 3", False)
    assert P.parse_break("if (1 if $step else 0) if $step") == \
        (P.ExprBreak, {"expr": "(1 if $step else 0)"}, "$step", False)
    assert P.parse_break("if 1 if $step else 0") == (P.ExprBreak, {"expr": "1 if $step else 0"}, None, False)
    for bad in ("", "step", "step x", "step -1", "module", "module a b c", "module a sideways", "frob", "if"):
        with pytest.raises(CommandError):
            P.parse_break(bad)
