"""Transcript tests of every debugger command: an in-process run (no torch
import per test) driven by ScriptedFrontend, with assertions on what it printed.

One scenario per test: the commands typed, then what each printed.  Sessions
cost a fraction of a second in-process, so a scenario that changes the run
gets a session of its own; scenarios that only read one stop share a
module-scoped session (one fixture, several tests, each asserting its part)."""
import contextlib
import gc
import io
import os
import re

import pytest

from conftest import Transcript, example, nndb
from nndb.run.config import RunConfig
from nndb.driver import DebugOptions, debug
from nndb.frontends.batch import ScriptedFrontend
from nndb.run.launcher import Target


def session(tmp_path, script, lines, answers=(), steps=8, args=()) -> Transcript:
    """Type ``lines``, then ``quit``, at a run of ``script`` (confirmations answered
    by ``answers``, yes when they run out); the session, with ``.result`` the
    driver's result."""
    # an earlier test's run may leave optimizers in reference cycles; the tracer
    # counts the optimizers alive to choose how steps end (as 'run' does, in the driver)
    gc.collect()
    if not lines or lines[-1] != "quit":
        lines = [*lines, "quit"]         # (so the last command's output ends at a prompt)
    fe = ScriptedFrontend(lines, answers=answers)
    cfg = RunConfig(Target(path=example(script), args=["--steps", str(steps), *args]),
                    str(tmp_path / "t.h5"), quiet=True)
    res = debug(cfg, DebugOptions(no_rc=True, rules="none"), fe)
    t = Transcript(fe.text, res)
    assert "Traceback" not in t.text and "internal error" not in t.text, "a traceback in the session"
    return t


def shared_session(tmp_path_factory, name, *a, **kw) -> Transcript:
    return session(tmp_path_factory.mktemp(name), *a, **kw)


# -- the start, where/list/up/down -----------------------------------------------------------
LIBRARY_STEP = """
import contextlib
import torch, torch.nn as nn
torch.manual_seed(0)
m = nn.Linear(4, 1)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
x, y = torch.randn(16, 4), torch.randn(16, 1)
for it in range(4):
    opt.zero_grad()
    loss = ((m(x) - y) ** 2).mean()
    loss.backward()
    with contextlib.ExitStack() as stack:      # (the step runs in the standard library's __exit__)
        stack.callback(opt.step)
    print(f"it {it} loss {loss.item()!r}")
"""


def test_a_step_that_ends_inside_a_library_stops_at_the_users_line(tmp_path):
    """A step whose optimizer.step() an installed package calls (accelerate's
    AcceleratedOptimizer, the Hugging Face Trainer; here the standard library's
    ExitStack) stopped in the library's frame: 'p loss' raised NameError until 'up'.
    The user's innermost frame is selected (pdb's skip, for installed packages and the
    standard library); 'where' still lists the library's frames and 'down' goes to them."""
    (tmp_path / "s.py").write_text(LIBRARY_STEP)
    r = nndb("run", "--batch", "-q", "--nx", "--rules", "none", "--trace", str(tmp_path / "t.h5"),
             "-e", "break step 2", "-e", "c", "-e", "p loss.item()", "-e", "where", "-e", "down",
             "-e", "p type(self).__name__", str(tmp_path / "s.py"), cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "> s.py(12)<module>()\n-> with contextlib.ExitStack() as stack:" in out, out
    printed = re.search(r"^it 2 loss (\S+)$", out, re.M).group(1)
    assert f"\n{printed}\n" in out, out                   # (p loss.item(): the script's own frame)
    lines = out.splitlines()
    exit_frame = [l for l in lines if re.search(r"contextlib\.py\(\d+\)__exit__\(\)$", l)]
    assert exit_frame[0].startswith("  ") and exit_frame[-1].startswith("> "), exit_frame     # (where; down)
    assert "'ExitStack'" in out                             # ('down': the library's frame, its self)


def test_the_run_starts_stopped_before_the_models_forward_in_step_0(stepped_through_step_0):
    t = stepped_through_step_0
    assert re.search(r"stopped\s+start in model forward", t.after("info step"))
    assert re.search(r"step in progress\s+0", t.after("info step"))
    where = t.after("where").splitlines()
    assert where[-2].startswith("> ") and where[-2].endswith("mlp.py(48)main()")
    assert where[-1] == "-> logits = model(inputs)"
    assert where[0].startswith("  ") and where[0].endswith("mlp.py(57)<module>()")
    listing = t.after("list").splitlines()
    assert len(listing) == 11 and "  48 ->         logits = model(inputs)" in listing
    assert t.after("up").startswith("> ") and "<module>()" in t.after("up")
    assert "main()" in t.after("down")
    assert t.after("down", 2).strip() == "Newest frame"
    # as pdb and gdb: 'up 9' with one frame above goes to it ("Oldest frame" before, and it stayed);
    # only a move from the end is refused
    assert t.after("up 9").startswith("> ") and "<module>()" in t.after("up 9")
    assert t.after("up", 2).strip() == "Oldest frame"
    assert t.after("down 9").startswith("> ") and "main()" in t.after("down 9")


# -- step: into each forward call, then into the backward pass --------------------------------
@pytest.fixture(scope="module")
def stepped_through_step_0(tmp_path_factory):
    return shared_session(tmp_path_factory, "step", "mlp.py", [
        "info step", "where", "list", "up", "down", "down", "up 9", "up", "down 9",
        "s", "p $inputs", "p $module",
        "s", "s", "s", "s", "s", "s", "s", "s", "s", "s", "s", "s",
        "p $grad_output", "where", "list",
    ], steps=9)


def test_step_stops_at_each_forward_then_each_backward(stepped_through_step_0):
    t = stepped_through_step_0
    stops = re.findall(r"^Step 0, module (\S+) (forward|backward)$", t.text, re.M)
    names = [f"{m} {ph}" for m, ph in stops]
    assert names[:6] == ["0 forward", "1 forward", "2 forward", "3 forward", "4 forward",
                         "criterion forward"]
    assert all(n.endswith("backward") for n in names[6:]) and len(names) == 13
    assert names[-1] == "0 backward" and "4 backward" in names and "2 backward" in names


def test_inputs_and_module_at_a_forward_stop(stepped_through_step_0):
    t = stepped_through_step_0
    # $inputs: a tuple of one-line tensor summaries; $module the module
    assert t.after("p $inputs").strip().startswith("(tensor(shape=[64, 32], dtype=float32")
    assert t.after("p $inputs").strip().endswith(",)") and "\n" not in t.after("p $inputs").strip()
    assert t.after("p $module").strip() == "Linear(in_features=32, out_features=64, bias=True)"


def test_grad_output_and_the_scripts_stack_at_a_backward_stop(stepped_through_step_0):
    t = stepped_through_step_0
    assert t.after("p $grad_output").startswith("tensor(shape=[64, 64]")
    # at a module stop in the backward, the stack is the script's (loss.backward())
    assert t.after("where", 2).splitlines()[-1] == "-> loss.backward()"
    assert "  50 ->         loss.backward()" in t.after("list", 2)


# -- finish, next N, until ---------------------------------------------------------------------
def test_finish_next_and_until_stop_at_step_ends_in_optimizer_step(at_step_5):
    t = at_step_5
    assert t.after("finish").startswith("Step 0 finished, loss ")
    assert t.after("next 3").startswith("Step 3 finished, loss ")
    assert t.after("p $step").strip() == "3"
    assert t.after("until 5").startswith("Step 5 finished, loss ")
    # at a step end the script is in optimizer.step() (the step clock closes the step there)
    assert t.after("where").splitlines()[-1] == "-> optimizer.step()"
    assert "  51 ->         optimizer.step()" in t.after("list")
    assert t.after("list", 2).splitlines()[0].startswith("  57 ")   # list again: the next lines


# -- reading one stop: info, print, stats, history at the end of step 5 -------------------------
@pytest.fixture(scope="module")
def at_step_5(tmp_path_factory):
    return shared_session(tmp_path_factory, "at5", "mlp.py", [
        "finish", "next 3", "p $step", "until 5", "where", "list", "list",
        "info locals", "info modules", "info params", "info optimizer",
        "p loss", "p/full x[:40]", "p x", "print/xyz x",
        "stats grad", "stats grad 4.*", "stats loss", "stats act nomatch*",
        "history loss", "history grad 0.weight norm --last 2", "history nope",
        "history 0.weight --last 2", "history param 0.weight --last 2", "history update 0.weight --last 2",
    ], steps=9)


@pytest.mark.parametrize("command,line", [
    ("info locals", r"^step\s+5$"),
    ("info locals", r"^x\s+tensor\(shape=\[1024, 32\], dtype=float32"),
    ("info modules", r"^0\s+Linear\s+2112$"),
    ("info modules", r"^criterion\s+CrossEntropyLoss\s+0$"),
    ("info params", r"^0\.weight\s+\(64, 32\)\s+float32\s+y\s"),
    ("info optimizer", r"^optimizer\s+SGD\s+0\s+6\s+lr=0\.1, momentum=0\.9"),
])
def test_info_at_a_step_end_lists(at_step_5, command, line):
    assert re.search(line, at_step_5.after(command), re.M)


def test_print_a_tensor_is_one_line_with_shape_and_dtype(at_step_5):
    p_loss = at_step_5.after("p loss").strip()
    assert p_loss.startswith("tensor(shape=[], dtype=float32, device=cpu, requires_grad) value=")
    p_x = at_step_5.after("p x").strip()
    assert "\n" not in p_x and p_x.startswith("tensor(shape=[1024, 32], dtype=float32") and "norm=" in p_x


def test_print_full_prints_every_element(at_step_5):
    full = at_step_5.after("p/full x[:40]")
    assert full.startswith("tensor([[") and "..." not in full and full.count("\n") >= 39 * 4


def test_print_with_an_unknown_format_says_so(at_step_5):
    assert at_step_5.after("print/xyz x").startswith("unknown print format '/xyz'")


def test_stats_grad_is_a_table_of_every_gradient(at_step_5):
    st = at_step_5.after("stats grad")
    assert st.splitlines()[0] == "step 5"
    assert st.splitlines()[1].split() == ["tensor", "kind", "count", "mean", "std", "min", "max", "norm",
                                          "zero_frac", "nan_count", "inf_count"]
    assert {l.split()[0] for l in st.splitlines()[2:]} == {"0.weight", "0.bias", "2.weight", "2.bias",
                                                           "4.weight", "4.bias"}


def test_stats_of_a_glob_and_of_the_loss(at_step_5):
    assert [l.split()[0] for l in at_step_5.after("stats grad 4.*").splitlines()[2:]] == ["4.weight", "4.bias"]
    assert re.search(r"^loss\s+loss\s+1\s", at_step_5.after("stats loss"), re.M)


def test_stats_of_a_glob_that_matches_nothing_says_so(at_step_5):
    assert at_step_5.after("stats act nomatch*").startswith("no act tensor matches 'nomatch*' at step 5")


def test_history_of_the_loss_has_a_sparkline_and_a_row_per_step(at_step_5):
    hist = at_step_5.after("history loss").splitlines()
    assert hist[0].startswith("loss mean, 6 recorded step(s) 0..5, min ")
    assert len(hist[1]) == 6 and set(hist[1]) <= set("▁▂▃▄▅▆▇█")     # the sparkline
    assert hist[2].split() == ["step", "mean"] and [l.split()[0] for l in hist[3:9]] == list("012345")
    assert all(" │" in l for l in hist[9:17]) and hist[17].lstrip().startswith("└")    # the chart, at the prompt


def test_history_last_n_rows(at_step_5):
    h2 = at_step_5.after("history grad 0.weight norm --last 2").splitlines()
    assert h2[0].startswith("0.weight (grad) norm, 6 recorded step(s)") and len(h2) == 2 + 1 + 2 + 10
    assert [l.split()[0] for l in h2[3:5]] == ["4", "5"]     # (then the whole series' chart)


def test_history_of_a_parameters_name_shows_its_kinds_side_by_side(at_step_5):
    """README's 'history fc1.weight' (no kind) was an error, "'0.weight' is recorded as grad, param,
    update: say which", which in batch mode ended the run with exit code 2; now the three side by side,
    as 'nndb inspect --series' shows them, each column the number its own kind's history gives."""
    h = at_step_5.after("history 0.weight --last 2").splitlines()
    assert h[0] == "0.weight norm (param, update, grad), 6 recorded step(s) 0..5", h
    assert [l.split()[0] for l in h[1:4]] == ["param", "update", "grad"]
    assert h[4].split() == ["step", "param", "update", "grad"] and len(h) == 7
    one = {k: [l.split() for l in at_step_5.after(f"history {k} 0.weight --last 2").splitlines()[3:5]]
           for k in ("param", "update")}
    one["grad"] = [l.split() for l in at_step_5.after("history grad 0.weight norm --last 2").splitlines()[3:5]]
    for row, (step, *values) in enumerate(l.split() for l in h[5:7]):
        assert step == str(4 + row)
        assert values == [one[k][row][1] for k in ("param", "update", "grad")]


def test_history_of_an_unknown_tensor_says_so(at_step_5):
    assert at_step_5.after("history nope").startswith("no tensor named 'nope' has been recorded")


# -- display, detach ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def displayed_then_detached(tmp_path_factory):
    return shared_session(tmp_path_factory, "disp", "mlp.py", [
        "until 5", "display $step", "display loss.item() > 0", "info display", "n", "undisplay 1", "n",
        "detach", "info step",
    ], steps=9)


def test_display_shows_at_every_stop_until_undisplayed(displayed_then_detached):
    t = displayed_then_detached
    assert t.after("display $step").strip() == "1: $step = 5"
    assert t.after("display loss.item() > 0").strip() == "2: loss.item() > 0 = True"
    assert re.search(r"^1\s+\$step$", t.after("info display"), re.M)
    first_n = t.after("n")
    assert first_n.startswith("Step 6 finished") and "1: $step = 6" in first_n
    assert "2: loss.item() > 0 = True" in first_n
    second_n = t.after("n", 2)
    assert second_n.startswith("Step 7 finished") and "1: $step" not in second_n and "2: loss.item()" in second_n


def test_undisplay_takes_ranges_all_or_none_and_asks_before_deleting_all(tmp_path):
    """gdb's 'undisplay 1-2' (delete, disable and enable take ranges) was "display number must be
    an integer, not '1-2'"; 'undisplay 3 9' removed 3, then said there is no 9; 'undisplay'
    deleted them all without asking, where gdb (and 'delete') asks."""
    t = session(tmp_path, "mlp.py", [
        "n", "display $step", "display $loss", "display 1+1", "display 2+2", "undisplay 1-2 4", "info display",
        "undisplay 3 9", "info display", "undisplay", "info display", "undisplay", "info display", "kill",
    ], answers=[False, True, True], steps=4)
    assert re.findall(r"^(\d+)\s+\S+$", t.after("info display"), re.M) == ["3"]
    assert t.after("undisplay 3 9").strip() == "no display number 9"
    assert re.findall(r"^(\d+)\s+\S+$", t.after("info display", 2), re.M) == ["3"]
    assert t.after("undisplay").strip() == "Delete all auto-display expressions? (y or n) n\nNot confirmed."
    assert re.findall(r"^(\d+)\s+\S+$", t.after("info display", 3), re.M) == ["3"]
    assert t.after("undisplay", 2).strip() == "Delete all auto-display expressions? (y or n) y"
    assert t.after("info display", 4).strip() == "There are no auto-display expressions now."


def test_detach_lets_the_run_finish_and_ends_the_session(displayed_then_detached):
    t = displayed_then_detached
    det = t.after("detach")
    assert det.startswith("Detached: the run goes on to its end")
    assert "nndb: the run ended (finished, exit code 0) after 9 step(s), detached; trace: " in det
    assert "info step" not in t.text and "(nndb" not in det       # no prompt after the run
    assert t.result.exit_code == 0 and t.result.reason == "finished"


# -- breakpoints -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def breakpoints_set(tmp_path_factory):
    return shared_session(tmp_path_factory, "bp", "mlp.py", [
        "break step 2", "tbreak step 1", "break module 2", "b module 4 backward", "disable 3 4",
        "info breakpoints", "c", "info breakpoints", "c",
    ], steps=12)


def test_break_tbreak_and_disable_are_listed_in_info_breakpoints(breakpoints_set):
    t = breakpoints_set
    assert t.after("break step 2").strip() == "Breakpoint 1: step 2"
    assert t.after("tbreak step 1").strip() == "Temporary breakpoint 2: step 1"
    assert t.after("break module 2").strip() == "Breakpoint 3: module 2 forward"
    assert t.after("b module 4 backward").strip() == "Breakpoint 4: module 4 backward"
    table = t.after("info breakpoints").splitlines()
    assert table[0].split() == ["Num", "Type", "Disp", "Enb", "What", "Hits", "Notes"]
    assert table[1].split() == ["1", "breakpoint", "keep", "y", "step", "2", "0"]
    assert table[2].split() == ["2", "breakpoint", "del", "y", "step", "1", "0"]
    assert table[3].split() == ["3", "breakpoint", "keep", "n", "module", "2", "forward", "0"]
    assert table[4].split() == ["4", "breakpoint", "keep", "n", "module", "4", "backward", "0"]


def test_tbreak_stops_once_then_is_deleted(breakpoints_set):
    t = breakpoints_set
    assert t.after("c").startswith("Temporary breakpoint 2, step 1 finished, loss ")
    assert not re.search(r"^2\s", t.after("info breakpoints", 2), re.M)   # tbreak deleted after its stop
    assert t.after("c", 2).startswith("Breakpoint 1, step 2 finished, loss ")


def test_module_breakpoint_stops_in_the_step_in_progress_not_in_prompt_calls(tmp_path):
    t = session(tmp_path, "mlp.py", [
        "break module 2", "disable 1", "until 2", "enable 1", "c",
        "p $step", "p $inputs[0].shape", "p model(inputs).shape", "display model(inputs).shape[1]",
        "c", "c", "c", "c",
    ], steps=12)
    # a module breakpoint: in the step in progress ($step is that step)
    assert t.after("c").startswith("Breakpoint 1, module 2 forward (step 3)")
    assert t.after("p $step").strip() == "3"
    assert t.after("p $inputs[0].shape").strip() == "torch.Size([64, 64])"
    # a module called by a command (or a display) at the prompt does not stop there again
    assert t.after("p model(inputs).shape").strip() == "torch.Size([64, 10])"
    assert t.after("display model(inputs).shape[1]").strip() == "1: model(inputs).shape[1] = 10"
    assert t.count("1: model(inputs).shape[1] = 10") == 1 + 4     # and at each of the 4 later stops


@pytest.fixture(scope="module")
def module_breakpoint_conditioned(tmp_path_factory):
    return shared_session(tmp_path_factory, "cond", "mlp.py", [
        "break module 2", "condition 1 $step == 5 and $inputs[0].shape[0] == 64", "c", "p $step",
        "condition 1", "ignore 1 2", "c", "c 2",
    ], steps=12)


def test_condition_sees_the_stops_own_step_and_inputs(module_breakpoint_conditioned):
    t = module_breakpoint_conditioned
    assert t.after("c").startswith("Breakpoint 1, module 2 forward (step 5)")
    assert t.after("p $step").strip() == "5"


def test_condition_without_expression_and_ignore_n_crossings(module_breakpoint_conditioned):
    t = module_breakpoint_conditioned
    assert t.after("condition 1").strip() == "Breakpoint 1 now unconditional."
    assert t.after("ignore 1 2").strip() == "Will ignore next 2 crossings of breakpoint 1."
    assert t.after("c", 2).startswith("Breakpoint 1, module 2 forward (step 8)")


def test_continue_n_ignores_this_breakpoint_n_minus_1_more_times(module_breakpoint_conditioned):
    cn = module_breakpoint_conditioned.after("c 2")
    assert cn.startswith("Will ignore next 1 crossings of breakpoint 1.  Continuing.")
    assert "Breakpoint 1, module 2 forward (step 10)" in cn


def test_backward_module_breakpoint_and_hit_counts_in_info_breakpoints(tmp_path):
    t = session(tmp_path, "mlp.py", [
        "break step 2", "b module 4 backward", "break module 2", "disable 2 3", "c",
        "delete 3", "enable 2", "c", "p $grad_output.shape", "info breakpoints",
    ], steps=12)
    assert t.after("c", 2).startswith("Breakpoint 2, module 4 backward (step 3)")
    assert t.after("p $grad_output.shape").strip() == "torch.Size([64, 10])"
    table = t.after("info breakpoints")
    assert re.search(r"^1\s+breakpoint\s+keep\s+y\s+step 2\s+1\s+breakpoint already hit 1 time$", table, re.M)
    assert re.search(r"^2\s+breakpoint\s+keep\s+y\s+module 4 backward\s+1\s", table, re.M)
    assert not re.search(r"^3\s", table, re.M)


def test_info_step_inside_a_step_shows_the_last_recorded_step_s_loss(tmp_path):
    """At a module stop inside step 3, 'info step' listed step 2 as the last recorded
    step with its backward passes and optimizer steps, and 'loss -' under them: the
    row took $loss, which is not measured inside a step (the trace held step 2's)."""
    t = session(tmp_path, "mlp.py", ["until 2", "stats loss", "b module 4 backward", "c", "info step", "p $loss"],
                steps=6)
    at_2 = re.search(r"^loss\s+loss\s+1\s+(\S+)", t.after("stats loss"), re.M).group(1)
    info = t.after("info step")
    assert re.search(r"^last recorded step\s+2$", info, re.M) and re.search(r"step in progress\s+3", info), info
    assert re.search(rf"^loss\s+{re.escape(at_2)}$", info, re.M), (at_2, info)
    assert t.after("p $loss").strip() == "not measured"


BREAKPOINT_ERRORS = [
    ("break step 99 if $loss >", "syntax error in '$loss >'"),
    ("break frob", "cannot break on 'frob': nndb breaks at training steps and module calls, not at source lines"),
    ("b 12", "cannot break on '12': nndb breaks at training steps and module calls, not at source lines or "
             "functions ('break step 12' stops when training step 12 has finished; to stop at a line, put "
             "nndb.set_trace() there)"),
    ("tbreak mlp.py:40", "cannot break on 'mlp.py:40': nndb breaks at training steps and module calls"),
    ("break 3x", "cannot break on '3x'"),
    ("condition 42 True", "no breakpoint number 42"),
    ("ignore 1", "ignore needs a breakpoint number and a count"),
    ("delete 1-3", "no breakpoint number 1"),
    ("enable x", "breakpoint number must be an integer, not 'x'"),
]


@pytest.fixture(scope="module")
def breakpoints_deleted(tmp_path_factory):
    return shared_session(tmp_path_factory, "bpdel", "mlp.py", [
        "break step 2", "b module 4 backward", "delete", "info breakpoints", "n", "break module",
    ] + [c for c, _ in BREAKPOINT_ERRORS] + ["quit"], answers=[True, True], steps=12)


def test_delete_without_numbers_asks_then_deletes_all(breakpoints_deleted):
    t = breakpoints_deleted
    assert t.after("delete").strip() == "Delete all breakpoints? (y or n) y"
    assert t.after("info breakpoints").strip() == "No breakpoints or watchpoints."
    assert t.result.reason == "killed from the debugger" and t.result.exit_code == 0


@pytest.mark.parametrize("command,message", BREAKPOINT_ERRORS)
def test_a_bad_breakpoint_command_gets_one_line(breakpoints_deleted, command, message):
    assert breakpoints_deleted.after(command).startswith(message)


def test_break_with_too_few_words_shows_the_usage(breakpoints_deleted):
    assert "usage: break step N" in breakpoints_deleted.after("break module")


def test_break_on_a_step_already_finished_says_so(tmp_path):
    t = session(tmp_path, "mlp.py", ["next 3", "break step 1", "break step 5", "quit"],
                answers=[True], steps=8)
    early = t.after("break step 1")
    assert early.startswith("Breakpoint 1: step 1\n(step 1 has already finished in this run, which is at step 2")
    assert "'run'" in early
    assert t.after("break step 5").strip() == "Breakpoint 2: step 5"


# -- commands attached to breakpoints, break if, the fail action --------------------------------
@pytest.fixture(scope="module")
def breakpoints_with_commands(tmp_path_factory):
    return shared_session(tmp_path_factory, "bpcmds", "mlp.py", [
        "break step 1", "commands", "silent", "p $step * 100", "end",
        "break step 2", "commands 2", "echo hello", "p $step", "end",
        "break step 3", "commands", "echo passing by", "continue", "end",
        "break if $loss > 0 if $step == 4",
        "break if $step == 6 fail",
        "info breakpoints",
        "c", "c", "c", "p $step", "c", "p $step", "quit",
    ], answers=[True])


def test_commands_blocks_and_break_if_are_listed_in_info_breakpoints(breakpoints_with_commands):
    t = breakpoints_with_commands
    assert 'End with a line saying just "end".' in t.after("commands")
    assert t.count(">end") == 3
    table = t.after("info breakpoints")
    assert "commands: silent; p $step * 100" in table and "commands: echo hello; p $step" in table
    assert re.search(r"^4\s+breakpoint\s+keep\s+y\s+if \$loss > 0\s+0\s+stop only if \$step == 4$", table, re.M)
    assert re.search(r"^5\s+breakpoint\s+keep\s+y\s+if \$step == 6 \[fail\]", table, re.M)


def test_silent_commands_print_their_output_without_the_stop_line(breakpoints_with_commands):
    assert breakpoints_with_commands.after("c").strip() == "100"


def test_commands_run_after_the_stop_line(breakpoints_with_commands):
    c2 = breakpoints_with_commands.after("c", 2).splitlines()
    assert c2[0] == "Breakpoint 2, step 2 finished, loss " + c2[0].rsplit(" ", 1)[1]
    assert c2[-2:] == ["hello", "2"]


def test_commands_ending_in_continue_go_on_to_the_next_stop(breakpoints_with_commands):
    t = breakpoints_with_commands
    # breakpoint 3's commands continue at once: no prompt there; the next stop is breakpoint 4
    c3 = t.after("c", 3)
    assert "Breakpoint 3, step 3 finished" in c3 and "passing by" in c3
    assert "Breakpoint 4, if $loss > 0" in c3 and "(step 4 finished, loss " in c3
    assert t.after("p $step").strip() == "4"


def test_a_breakpoint_with_the_fail_action_ends_the_run_with_exit_4(breakpoints_with_commands):
    t = breakpoints_with_commands
    assert "Breakpoint 5, if $step == 6" in t.after("c", 4)
    assert t.after("p $step", 2).strip() == "6"
    assert t.result.exit_code == 4 and "fail action" in t.result.reason


def test_every_stop_is_recorded_silent_and_continued_ones_too(breakpoints_with_commands):
    assert [s["id"] for s in breakpoints_with_commands.result.session.log.stops] == [1, 2, 3, 4, 5]


# -- watchpoints ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def nan_lr_watched(tmp_path_factory):
    """nan_lr.py: the grad norm of 0.weight leaves 50x its first value, later the loss is NaN."""
    return shared_session(tmp_path_factory, "watch", "nan_lr.py", [
        "watch loss nan_count > 0", "watch grad 0.weight", "watch grad nope*", "watch frob x",
        "watch grad 0.weight norm >", "info watchpoints",
        "c", "p $step", "disable 2 3", "c", "p $step", "info watchpoints",
        "watch grad zzz*", "quit",
    ], answers=[True], steps=12)


def test_watch_says_what_it_watches(nan_lr_watched):
    t = nan_lr_watched
    assert t.after("watch loss nan_count > 0").splitlines()[-1] == "Watchpoint 1: loss * nan_count > 0"
    assert t.after("watch grad 0.weight").strip() == "Watchpoint 2: grad 0.weight norm outside [0.01, 50] x baseline"


def test_watch_on_a_glob_with_no_tensor_yet_stays_pending(nan_lr_watched):
    pending = nan_lr_watched.after("watch grad nope*")
    assert "stays pending" in pending and "Watchpoint 3: grad nope*" in pending


def test_a_watch_that_matches_no_recorded_tensor_stays_pending_and_names_those_there_are(nan_lr_watched):
    # (it was an error once the names were known: a batch run ended with exit 2)
    assert nan_lr_watched.after("watch grad zzz*").startswith(
        "No grad tensor matches 'zzz*' (there are: 0.bias, 0.weight, 2.bias, 2.weight); the point stays pending")


@pytest.mark.parametrize("command,message", [
    ("watch frob x", "unknown kind 'frob'"),
    ("watch grad 0.weight norm >", "'>' needs a value"),
])
def test_a_bad_watch_gets_one_line(nan_lr_watched, command, message):
    assert nan_lr_watched.after(command).startswith(message)


def test_info_watchpoints_lists_them(nan_lr_watched):
    table = nan_lr_watched.after("info watchpoints").splitlines()
    assert table[0].split()[:5] == ["Num", "Type", "Disp", "Enb", "What"] and len(table) == 4
    assert table[1].split()[:4] == ["1", "watchpoint", "keep", "y"]


def test_watch_stops_when_the_grad_norm_leaves_50x_its_first_value(nan_lr_watched):
    t = nan_lr_watched
    c1 = t.after("c")
    assert re.match(r"Watchpoint 2: grad 0\.weight norm = \S+ \(smoothed \S+, baseline \S+, x\S+\) at step (\d+)", c1)
    step = int(re.match(r".* at step (\d+)", c1.splitlines()[0]).group(1))
    assert t.after("p $step").strip() == str(step)


def test_watch_stops_when_the_loss_is_nan_and_counts_the_hits_of_a_disabled_one(nan_lr_watched):
    t = nan_lr_watched
    step = int(re.match(r".* at step (\d+)", t.after("c").splitlines()[0]).group(1))
    c2 = t.after("c", 2)
    assert re.match(r"Watchpoint 1: loss nan_count = 1 \(> 0\) at step (\d+)", c2), c2
    nan_step = int(t.after("p $step", 2))
    assert nan_step > step
    assert re.search(r"^2\s+watchpoint\s+keep\s+n\s.*breakpoint already hit \d+ time",
                     t.after("info watchpoints", 2), re.M)


def test_watch_consecutive_on_a_dead_layer(tmp_path):
    t = session(tmp_path, "dead_relu.py", [
        "n", "watch act act#2 zero_frac == 1 consecutive 3", "c", "p $step", "info watchpoints", "kill", "quit",
    ], answers=[True], steps=10)
    c = t.after("c")
    assert c.startswith("Watchpoint 1: act act#2 zero_frac = 1 (== 1) for 3 steps in a row at step 3"), c
    assert t.after("p $step").strip() == "3"
    assert t.after("kill").startswith("Kill the run being debugged? (y or n) y")


# -- changing the run: set, py/! --------------------------------------------------------------
@pytest.fixture(scope="module")
def set_hyper_parameters(tmp_path_factory):
    return shared_session(tmp_path_factory, "set", "mlp.py", [
        "set lr 0.01", "n", "p optimizer.param_groups[0]['lr']", "info optimizer",
        "set momentum 0.5 group 0", "p optimizer.param_groups[0]['momentum']",
        "set foo 1", "set lr abc", "set lr", "set lr 1 group 3", "set lr 1 optimizer nope",
    ], answers=[True], steps=3)


def test_set_lr_shows_was_and_now_and_sticks(set_hyper_parameters):
    t = set_hyper_parameters
    tbl = t.after("set lr 0.01").splitlines()
    assert tbl[0].split() == ["optimizer", "group", "hyper-parameter", "was", "now"]
    assert tbl[1].split() == ["optimizer", "0", "lr", "0.1", "0.01"]   # named as the script names it
    assert t.after("p optimizer.param_groups[0]['lr']").strip() == "0.01"
    assert "lr=0.01, momentum=0.9" in t.after("info optimizer")


def test_set_in_one_param_group(set_hyper_parameters):
    assert set_hyper_parameters.after("p optimizer.param_groups[0]['momentum']").strip() == "0.5"


@pytest.mark.parametrize("command,message", [
    ("set foo 1", "optimizer has no hyper-parameter 'foo' (it has: lr, momentum"),
    ("set lr", "set needs a hyper-parameter and a value"),
    ("set lr 1 group 3", "optimizer has 1 param group(s); there is no group 3"),
    ("set lr 1 optimizer nope", "no optimizer named 'nope' (there are: optimizer)"),
])
def test_a_bad_set_gets_one_line(set_hyper_parameters, command, message):
    assert set_hyper_parameters.after(command).startswith(message)


def test_set_with_a_value_that_is_not_a_number_shows_the_usage(set_hyper_parameters):
    assert set_hyper_parameters.after("set lr abc").splitlines() == [
        "'abc' is not a number or tuple of numbers",
        "usage: set HYPER VALUE [group N] [optimizer NAME] [--hold]  |  set var NAME VALUE    (e.g. set lr 1e-4)"]


@pytest.fixture(scope="module")
def py_statements(tmp_path_factory):
    return shared_session(tmp_path_factory, "py", "mlp.py", [
        "n", "!x_new = 5", "p x_new", "py step_copy = step * 10", "p step_copy",
        "!args.lr = 0.5", "p args.lr", "!x_new", "py loss", "!1/0", "p exit()", "! ",
        "c", "quit",
    ], answers=[True], steps=3)


def test_py_assignments_run_in_the_scripts_frame_and_stick(py_statements):
    # statements run in the script's frame (main()); assignments stick
    assert py_statements.after("p x_new").strip() == "5"
    assert py_statements.after("p step_copy").strip() == "0"
    assert py_statements.after("p args.lr").strip() == "0.5"


def test_py_expression_statement_shows_its_value_as_print_does(py_statements):
    assert py_statements.after("!x_new").strip() == "5"
    assert py_statements.after("py loss").startswith("tensor(shape=[], dtype=float32")


@pytest.mark.parametrize("command,message", [
    ("!1/0", "ZeroDivisionError: division by zero"),
    ("p exit()", "SystemExit"),                     # pdb: an error, not the end
    ("! ", "py needs a statement"),
])
def test_a_failing_py_statement_gets_one_line(py_statements, command, message):
    assert py_statements.after(command).startswith(message)


def test_errors_at_the_prompt_do_not_end_the_run(py_statements):
    assert py_statements.after("!1/0").strip() == "ZeroDivisionError: division by zero"     # the whole line
    assert py_statements.result.reason == "finished" and py_statements.result.exit_code == 0


@pytest.fixture(scope="module")
def two_optimizers(tmp_path_factory):
    return shared_session(tmp_path_factory, "gan", "gan.py", [
        "info optimizer", "set lr 0.01", "set lr 0.01 optimizer optimizerG",
        "p optimizerG.param_groups[0]['lr']", "p optimizerD.param_groups[0]['lr']",
        "set betas (0.9, 0.99) optimizer optimizerD", "p optimizerD.param_groups[0]['betas']",
        "quit",
    ], answers=[True], steps=2)


def test_info_optimizer_lists_both_optimizers(two_optimizers):
    info = two_optimizers.after("info optimizer")
    assert re.search(r"^optimizerD\s+Adam\s+0\s", info, re.M) and re.search(r"^optimizerG\s+Adam\s+0\s", info, re.M)


def test_set_with_two_optimizers_asks_which(two_optimizers):
    # (listed by name, whatever order the process made them in)
    said = two_optimizers.after("set lr 0.01")
    assert said.startswith("2 optimizers: say which with 'optimizer NAME' (optimizerD, optimizerG)"), said


def test_set_in_a_named_optimizer_changes_only_that_one(two_optimizers):
    t = two_optimizers
    assert t.after("set lr 0.01 optimizer optimizerG").splitlines()[1].split() == \
        ["optimizerG", "0", "lr", "0.002", "0.01"]
    assert t.after("p optimizerG.param_groups[0]['lr']").strip() == "0.01"
    assert t.after("p optimizerD.param_groups[0]['lr']").strip() == "0.002"


def test_set_a_tuple_hyper_parameter(two_optimizers):
    assert two_optimizers.after("p optimizerD.param_groups[0]['betas']").strip() == "(0.9, 0.99)"


def test_assignment_in_a_function_frame_changes_the_run(tmp_path, capsys):
    # raises.py fails at step 2 in check_batch(step, fail_at): stop in train_step()
    # before that and change its local fail_at; the run then finishes cleanly
    t = session(tmp_path, "raises.py", [
        "break module model if $step == 2", "c", "where", "p fail_at", "!fail_at = 99", "p fail_at",
        "info locals", "c", "quit",
    ], steps=4, args=["--fail-at", "2"])
    assert t.after("where").splitlines()[-2].endswith("raises.py(20)train_step()")
    assert t.after("p fail_at").strip() == "2"
    assert t.after("p fail_at", 2).strip() == "99"
    assert re.search(r"^fail_at\s+99$", t.after("info locals"), re.M)
    assert "the run ended (finished, exit code 0) after 4 step(s)" in t.after("c", 2)
    assert t.result.exit_code == 0 and t.result.reason == "finished"
    assert "step 3 loss" in capsys.readouterr().out


# -- post-mortem ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def post_mortem(tmp_path_factory):
    """raises.py raises at step 2; the session is at the raising frame."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        t = shared_session(tmp_path_factory, "pm", "raises.py", [
            "c", "where", "p step", "p $step", "p $exception", "up", "p fail_at", "info locals",
            "up", "p args.fail_at", "down", "down", "down", "stats grad", "history grad weight",
            "info step", "n", "c", "quit",
        ], steps=6, args=["--fail-at", "2"])
    t.stderr = err.getvalue()
    return t


def test_post_mortem_stops_at_the_raise_and_the_run_fails(post_mortem):
    assert post_mortem.after("c").startswith("nndb: post-mortem: the script raised RuntimeError during step 2;")
    res = post_mortem.result
    assert res.exit_code == 1 and res.reason == "RuntimeError: planted failure at step 2"
    assert "RuntimeError: planted failure at step 2" in post_mortem.stderr     # Python's traceback


def test_post_mortem_where_is_the_raising_frame(post_mortem):
    where = post_mortem.after("where").splitlines()
    assert [l.rsplit("/", 1)[-1] for l in where[::2]] == [
        "raises.py(53)<module>()", "raises.py(48)main()", "raises.py(22)train_step()",
        "raises.py(15)check_batch()"]
    assert where[-2].startswith("> ") and where[-1] == '-> raise RuntimeError(f"planted failure at step {step}")'


@pytest.mark.parametrize("command,value", [
    ("p step", "2"),
    ("p $step", "2"),
    ("p $exception", "RuntimeError('planted failure at step 2')"),
    ("p fail_at", "2"),                # one frame up
    ("p args.fail_at", "2"),           # two frames up
])
def test_post_mortem_print(post_mortem, command, value):
    assert post_mortem.after(command).strip() == value


def test_post_mortem_up_down_and_locals(post_mortem):
    t = post_mortem
    assert t.after("up").startswith("> ") and "train_step()" in t.after("up")
    assert re.search(r"^inputs\s+tensor\(shape=\[32, 8\]", t.after("info locals"), re.M)
    assert t.after("down", 3).strip() == "Newest frame"


def test_post_mortem_stats_and_history_of_the_steps_recorded(post_mortem):
    assert re.search(r"^weight\s+grad\s+16\s", post_mortem.after("stats grad"), re.M)
    assert post_mortem.after("history grad weight").startswith("weight (grad) norm, 3 recorded step(s) 0..2")


def test_post_mortem_run_control_ends_the_run(post_mortem):
    """As gdb's after a fatal signal: each of them lets the exception end the run (only
    'continue' did; 'next', 'step', 'until', 'finish' and 'kill' said the program was not being
    run, and did nothing); then they say how it ended."""
    assert re.search(r"state\s+post-mortem", post_mortem.after("info step"))
    assert "the run ended (failed, exit code 1) after 2 step(s)" in post_mortem.after("n")
    assert post_mortem.after("c", 2).strip() == \
        "The program is not being run: it ended (failed, exit code 1) after 2 step(s); 'run' starts it again."


# -- kill, run, quit, the empty line -----------------------------------------------------------
@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kill")
    t = session(tmp, "mlp.py", [
        "break step 1", "n", "", "p $step", "",
        "quit", "kill", "kill", "info step", "p $step", "kill",
    ], answers=[False, False, True], steps=4)
    t.tmp = tmp
    return t


def test_the_empty_line_repeats_the_last_command(killed):
    t = killed
    # n, then n again, then p $step twice
    assert t.after("n").startswith("Step 0 finished")
    assert t.after("").startswith("Breakpoint 1, step 1 finished")
    assert t.after("p $step").strip() == "1" and t.after("", 2).strip() == "1"


def test_quit_and_kill_ask_first_while_the_run_is_live(killed):
    t = killed
    assert t.after("quit").strip() == "A run is active.  Kill it and quit? (y or n) n\nNot confirmed."
    assert t.after("kill").strip() == "Kill the run being debugged? (y or n) n\nNot confirmed."
    k = t.after("kill", 2)
    assert k.startswith("Kill the run being debugged? (y or n) y")
    assert "the run ended (killed, exit code 0) after 2 step(s); trace: " + str(t.tmp / "t.h5") in k


def test_after_kill_the_last_stop_can_still_be_read(killed):
    t = killed
    assert re.search(r"state\s+exited", t.after("info step"))
    assert t.after("p $step").strip() == "1"
    assert t.after("kill", 3).strip() == \
        "The program is not being run: it ended (killed, exit code 0) after 2 step(s); 'run' starts it again."


@pytest.fixture(scope="module")
def run_again(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run")
    t = session(tmp, "mlp.py", [
        "break step 1", "c", "kill",
        "run", "", "info step", "info breakpoints", "c", "info breakpoints",
        "run", "c", "quit",
    ], answers=[True, True, True], steps=4)
    t.tmp = tmp
    return t


def test_run_after_kill_starts_a_new_trace_and_keeps_the_breakpoints(run_again):
    t = run_again
    assert t.after("run").startswith("Stopped at the start of the run (module model is about to run")
    assert t.after("", 1) == ""                                        # 'run' is not repeated
    assert re.search(r"trace\s+" + re.escape(str(t.tmp / "t-run2.h5")), t.after("info step"))
    # the breakpoints kept, their hit counts start again
    assert re.search(r"^1\s+breakpoint\s+keep\s+y\s+step 1\s+0\s*$", t.after("info breakpoints"), re.M)
    assert t.after("c", 2).startswith("Breakpoint 1, step 1 finished")
    assert "breakpoint already hit 1 time" in t.after("info breakpoints", 2)


def test_run_while_live_asks_then_starts_a_third_trace(run_again):
    t = run_again
    assert t.after("run", 2).startswith("The run being debugged has been started already.  "
                                        "Start it from the beginning? (y or n) y")
    assert t.after("c", 3).startswith("Breakpoint 1, step 1 finished")
    assert t.after("quit").startswith("A run is active.  Kill it and quit? (y or n) y")
    assert os.path.exists(t.tmp / "t.h5") and os.path.exists(t.tmp / "t-run2.h5") \
        and os.path.exists(t.tmp / "t-run3.h5")
    assert t.result.session.log.runs == 3 and t.result.reason == "killed from the debugger"


# -- the session commands: help, source, echo, prefixes, errors ------------------------------------
@pytest.fixture(scope="module")
def session_commands(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cmds")
    cmds = tmp / "cmds.nndb"
    cmds.write_text("# a comment\necho from the file\np $step + 1\n")
    bad = tmp / "bad.nndb"
    bad.write_text("echo one\nfrobnicate\necho never\n")
    t = session(tmp, "mlp.py", [
        "help", "help break", "help info", "help nosuch", "h c",
        f"source {cmds}", f"source {bad}", f"source {tmp / 'missing'}", "source",
        "echo a\\nb", "echo c\\n", "echo d\\n\\n", "echo", "echo e\\tf\\\\n\\x",
        "de 1", "frobnicate", "disp", "cont 1", "wh", "fin now", "i b", "info xyz", "info",
        "info s", "# just a comment", "next 0", "until -1", "until x", "up x", "list 10000",
        "quit",
    ], answers=[True], steps=3)
    t.files = {"cmds": cmds, "bad": bad, "missing": tmp / "missing"}
    return t


def test_help_lists_every_command_with_its_aliases(session_commands):
    h = session_commands.after("help")
    assert h.startswith('Commands ("help CMD" for one; a unique prefix of a name works):')
    for name in ("continue (c, cont)", "next (n)", "break (b, br)", "watch", "print (p)", "set",
                 "py (!)", "history", "info (i)", "source", "echo", "help (h)", "quit (q, exit)"):
        assert name in h, name


def test_help_for_one_command(session_commands):
    t = session_commands
    assert t.after("help break").startswith("usage: break step N | break module GLOB")
    assert "aliases: b, br" in t.after("help break")
    assert "info locals" in t.after("help info")
    assert t.after("h c").startswith("usage: continue [N]")


def test_source_runs_a_command_file(session_commands):
    src = session_commands.after(f"source {session_commands.files['cmds']}").splitlines()
    assert src == ["from the file", "1"]                    # $step at the start stop: step 0 in progress


def test_source_stops_a_file_at_its_first_error(session_commands):
    bad = session_commands.files["bad"]
    assert session_commands.after(f"source {bad}").splitlines() == [
        "one", f'{bad}:2: undefined command: "frobnicate".  Try "help".']
    assert "never" not in session_commands.text             # the rest of a file is dropped at its first error


# -- the engine functions behind set, info params/modules/optimizer and rule threshold (units) -----
def test_set_hyperparameter_changes_numbers_in_place_and_refuses_the_rest():
    import pytest
    import torch
    from nndb.debugger.hyperparams import set_hyperparameter
    from nndb.errors import CommandError
    w = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.Adam([{"params": [w]}, {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 0.5}])
    assert set_hyperparameter("adam", opt, "lr", 1, group=1) == [("adam", 1, "lr", 0.5, 1.0)]
    assert type(opt.param_groups[1]["lr"]) is float and opt.param_groups[0]["lr"] == 1e-3
    assert set_hyperparameter("adam", opt, "betas", (0.8, 0.9))[0][3:] == ((0.9, 0.999), (0.8, 0.9))
    for key, value, msg in (("lr", 1e-4, "there is no group 2"), ("nope", 1, "no hyper-parameter 'nope'"),
                            ("amsgrad", 1, "not a number"), ("betas", 0.5, "of the same shape")):
        with pytest.raises(CommandError, match=msg):
            set_hyperparameter("adam", opt, key, value, group=2 if msg.startswith("there") else None)


def test_set_hyperparameter_takes_a_fraction_for_a_rate_held_as_a_whole_number():
    """LBFGS's default lr is the int 1: 'set lr 0.5' (and predict's --set lr=0.5) made it
    int(0.5), 0, and neural style transfer stood still (each step returned 0.003346 again
    where the script with lr 0.5 goes on to 0.002101).  A whole number stays whole where
    it is one (max_iter), and a fraction for it is refused."""
    import torch
    from nndb.debugger.hyperparams import set_hyperparameter
    from nndb.errors import CommandError
    opt = torch.optim.LBFGS([torch.nn.Parameter(torch.zeros(2))])
    assert set_hyperparameter("optimizer", opt, "lr", 0.5) == [("optimizer", 0, "lr", 1, 0.5)]
    assert opt.param_groups[0]["lr"] == 0.5
    assert set_hyperparameter("optimizer", opt, "max_iter", 10.0)[0][4] == 10
    assert type(opt.param_groups[0]["max_iter"]) is int
    with pytest.raises(CommandError, match="'max_iter' is 10, a whole number: give a whole number, not 2.5"):
        set_hyperparameter("optimizer", opt, "max_iter", 2.5)
    assert opt.param_groups[0]["max_iter"] == 10


def test_rule_set_threshold_keeps_an_int_threshold_an_int():
    from nndb.rules.base import Rule, Threshold

    class R(Rule):
        THRESHOLDS = {"n": Threshold(3, "count"), "x": Threshold(0.5, "ratio")}

    r = R()
    assert r.set_threshold("n", 4.0) == 4 and type(r.params["n"]) is int
    with pytest.raises(ValueError, match="is a count: a whole number, not 4.5"):
        r.set_threshold("n", 4.5)                      # (a count threshold takes whole numbers only)
    assert r.set_threshold("x", 2.0) == 2.0 and type(r.params["x"]) is float


def test_model_and_optimizer_summaries_of_the_session():
    from types import SimpleNamespace
    import torch
    from nndb.debugger.queries import RunView
    net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
    net[0].weight.grad = torch.ones(3, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    naming = SimpleNamespace(roots=lambda: [net], root_params=lambda: list(net.parameters()),
                             module_name=lambda m: type(m).__name__.lower(),
                             param_name=lambda p: "w" if p is net[0].weight else "b")
    q = RunView(SimpleNamespace(rec=SimpleNamespace(naming=naming)))
    q.optimizers = lambda: [("opt", opt)]
    assert q.module_summary() == [("sequential", "Sequential", 0), ("linear", "Linear", 9), ("relu", "ReLU", 0)]
    rows = q.param_summary()
    assert [r[:4] for r in rows] == [("w", (3, 2), "float32", True), ("b", (3,), "float32", True)]
    assert rows[0][5] == 6 ** 0.5 and rows[1][5] is None
    ((name, o, gi, n, hyper),) = q.optimizer_groups()
    assert (name, o, gi, n, hyper["lr"]) == ("opt", opt, 0, 2, 0.1) and "params" not in hyper


def test_echo_prints_escapes(session_commands):
    assert session_commands.after("echo a\\nb") == "a\nb\n"
    # gdb's C escapes: a tab, a backslash (before an n: no new line), an unknown one as it is
    assert session_commands.after("echo e\\tf\\\\n\\x") == "e\tf\\n\\x\n"
    # gdb's 'echo TEXT\n' (its own line's end) printed a blank line after TEXT
    assert session_commands.after("echo c\\n") == "c\n"
    assert session_commands.after("echo d\\n\\n") == "d\n\n"


def test_ambiguous_and_undefined_commands_get_one_line(session_commands):
    assert session_commands.after("de 1").splitlines() == ['ambiguous command "de": delete (d), detach (det)', ]
    assert session_commands.after("frobnicate").splitlines() == ['undefined command: "frobnicate".  Try "help".']


def test_unique_prefixes_run_their_command(session_commands):
    t = session_commands
    assert t.after("disp") == ""                         # display (a unique prefix) with nothing to show
    assert t.after("cont 1").startswith("nndb: the run ended (finished, exit code 0) after 3 step(s)")
    assert "mlp.py" not in t.after("wh") and t.after("wh").startswith("no stack")
    assert t.after("i b").strip() == "No breakpoints or watchpoints."
    assert re.match(r"state\s+exited\n", t.after("info s"))


def test_a_comment_line_does_nothing(session_commands):
    assert session_commands.after("# just a comment") == ""


@pytest.mark.parametrize("command,message", [
    ("help nosuch", 'undefined command: "nosuch".  Try "help".'),
    ("source missing", "cannot read command file"),
    ("source", "source needs a file name"),
    ("fin now", "unexpected 'now'"),
    ("info xyz", 'undefined info command: "xyz".  Try "help info".'),
    ("info", "info what? (breakpoints | watchpoints"),
    ("next 0", "the count must be at least 1, not 0"),
    ("until -1", "step numbers start at 0, not -1"),
    ("until x", "the step must be an integer, not 'x'"),
    ("list 10000", "no stack"),
])
def test_a_bad_command_gets_one_line(session_commands, command, message):
    if command == "source missing":
        command = f"source {session_commands.files['missing']}"
    assert session_commands.after(command).startswith(message)


def test_up_with_a_bad_count_after_the_run(session_commands):
    up = session_commands.after("up x")
    assert up.startswith("no stack") or up.startswith("the count must be")


def test_pp_pretty_prints_as_pdb_does(tmp_path):
    """pdb's 'pp EXPR' was 'undefined command: "pp"' (exit 2 in batch mode, the rest of a command file
    dropped): it is pprint.pformat of the value, a tensor the one line of 'p'."""
    import pprint
    t = session(tmp_path, "mlp.py", ["until 1", 'pp {"steps": list(range(30)), "at": $step}',
                                     "pp model[0].bias", "p model[0].bias"], steps=3)
    assert t.after('pp {"steps": list(range(30)), "at": $step}').strip() == \
        pprint.pformat({"steps": list(range(30)), "at": 1})
    assert t.after("pp model[0].bias").strip() == t.after("p model[0].bias").strip()
    assert t.after("pp model[0].bias").startswith("tensor(shape=[")


def test_list_a_range_and_longlist_as_pdb_and_gdb_have_them(tmp_path):
    """'list 3,5' (gdb's and pdb's range) was 'the line must be an integer, not '3,5'' and pdb's 'll'
    an undefined command: the range lists those lines (a last below the first is a count, as in pdb),
    'll' the whole function the stop is in, its current line marked."""
    src = open(example("mlp.py")).read().splitlines()
    t = session(tmp_path, "mlp.py", ["until 1", "list 3,5", "list 30,2", "ll"], steps=3)
    assert [l[8:] for l in t.after("list 3,5").strip("\n").splitlines()] == src[2:5]
    assert [int(l.split()[0]) for l in t.after("list 30,2").strip("\n").splitlines()] == [30, 31, 32]
    ll = t.after("ll").strip("\n").splitlines()
    first = int(ll[0].split()[0])
    assert src[first - 1].lstrip().startswith("def ") and len(ll) > 11
    assert [l[8:] for l in ll] == src[first - 1:first - 1 + len(ll)]
    assert sum(l[5:7] == "->" for l in ll) == 1 and "step()" in [l for l in ll if l[5:7] == "->"][0]



def test_list_past_the_end_names_the_lines_asked_for(tmp_path):
    """'list 9999' lists 9994-10004 (11 lines around it, as pdb): it said "line 9994 is past the
    end", a line nobody asked for; it names the window and the file's length."""
    n = len(open(example("mlp.py")).read().splitlines())
    t = session(tmp_path, "mlp.py", ["until 1", "list 9999"], steps=3)
    assert f"lines 9994-10004 are past the end of {example('mlp.py')} ({n} lines)" in t.after("list 9999"), t.text

def test_a_silent_breakpoint_shows_no_displays_a_noisy_one_does(tmp_path):
    """gdb shows nothing at a 'silent' breakpoint's stop but what its commands print, displays included;
    nndb printed every display there ('1: $step = 1' before the commands' own line at each hit, the
    log that 'silent' + 'continue' is for, cluttered)."""
    t = session(tmp_path, "mlp.py", ["display $step * 10", "break step 1", "commands", "silent", "p 'quiet'",
                                     "end", "break step 2", "c", "c", "p 'end'"], steps=4)
    assert t.after("c").strip() == "'quiet'"
    second = t.after("c", 2).strip().splitlines()
    assert second[0].startswith("Breakpoint 2, step 2 finished") and second[-1] == "1: $step * 10 = 20"


def test_until_alone_is_next_and_continue_n_off_a_breakpoint_says_it_ignores_n(tmp_path):
    """gdb's and pdb's 'until' with no argument was 'until needs a step number'; 'continue 3' at a stop
    no breakpoint made ignored its count unsaid.  'until' goes to the end of the step in progress (as
    next: step 0's end from the start stop, then step 1's), 'continue 3' says what gdb says."""
    t = session(tmp_path, "mlp.py", ["until", "p $step", "u", "p $step", "c 3", "p 'after'"], steps=4)
    assert t.after("until").startswith("Step 0 finished")
    assert t.after("p $step").strip() == "0" and t.after("p $step", 2).strip() == "1"
    assert t.after("u").startswith("Step 1 finished")
    assert t.after("c 3").startswith("Not stopped at any breakpoint; argument ignored.")


def test_the_prompt_measures_every_statistic_and_batch_mode_keeps_the_rhythm(tmp_path):
    """docs/commands.md's table of what is recorded when is a batch run's: at the prompt every
    step measures all ten statistics (someone may print any), which the document did not say
    (it said a mean between full steps is 'not measured' there too)."""
    t = session(tmp_path, "mlp.py", ["until 3", "p $grad['0.weight'].mean"], steps=5)
    assert re.fullmatch(r"-?\d\.\d+(e-?\d+)?", t.after("p $grad['0.weight'].mean").strip()), t.text
    b = nndb("run", "--batch", "-q", "--nx", "--rules", "none", "--trace", str(tmp_path / "b.h5"), "-e", "until 3",
             "-e", "p ('AT', $step, $grad['0.weight'].mean)", "-e", "kill", example("mlp.py"), "--steps", "5")
    assert "('AT', 3, not measured)" in b.stdout, b.stdout + b.stderr
    doc = " ".join(open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "docs", "commands.md")).read().split())
    assert "At the prompt (`nndb run` at a terminal) every recorded step measures all ten statistics" in doc


def test_stats_gives_a_large_tensor_s_element_count_whole(tmp_path):
    """fmt gives a whole float of more than 7 significant digits 4 of them (a float32 magnitude
    such as a diverging loss, 21943189504.0, is 2.194e+10): a count is no magnitude, and the
    stats table gave a 3163 x 3163 weight's 10,004,569 elements as 1.000e+07."""
    script = tmp_path / "big.py"
    script.write_text("import torch, torch.nn as nn\n"
                      "torch.manual_seed(0)\n"
                      "model = nn.Linear(3163, 3163, bias=False)\n"
                      "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
                      "x = torch.randn(2, 3163)\n"
                      "for step in range(2):\n"
                      "    opt.zero_grad()\n"
                      "    model(x).square().mean().backward()\n"
                      "    opt.step()\n")
    r = nndb("run", "--batch", "-q", "--trace", str(tmp_path / "t.h5"), "-e", "break step 0", "-e", "continue",
             "-e", "stats param", str(script))
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("weight "))
    assert row.split()[2] == "10004569", r.stdout


def test_a_frozen_parameter_has_no_gradient_to_watch_or_print(tmp_path):
    """A parameter with requires_grad=False (a fine-tune's frozen backbone, LLMs from
    scratch's ch06 embeddings) never has a gradient, but every parameter's name counted
    as a grad tensor's: 'watch grad 0.0.weight norm == 0' was set as if it watched one (no
    'pending', and none at the run's end) and never hit, and '$grad["0.0.weight"]' was a row
    of 'not measured', as on a step not recorded."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts",
                          "healthy_frozen_backbone_finetune.py")
    r = nndb("run", "--batch", "-q", "--rules", "none", "--trace", str(tmp_path / "t.h5"),
             "-e", "watch grad 0.0.weight norm == 0", "-e", "break step 1", "-e", "continue",
             "-e", 'p $grad["1.weight"].norm > 0', "-e", 'p $grad["0.0.weight"]', script, "--steps", "3")
    assert "Traceback" not in r.stderr, r.stderr
    assert "No grad tensor matches '0.0.weight' yet; the point stays pending until one does." in r.stdout, r.stdout
    assert "\nTrue\n" in r.stdout
    assert "no grad tensor named '0.0.weight' at this step" in r.stdout + r.stderr, r.stdout + r.stderr
    assert "not measured" not in r.stdout


def test_stats_of_weights_and_updates_at_a_hand_written_step_says_when_they_come(tmp_path):
    """char_rnn_generation_tutorial's loop (no optimizer: ``p.data.add_(p.grad.data,
    alpha=-lr)`` after ``backward()``): a step ends as its backward returns, and its weights
    and update are taken at the next step's end.  'stats update' at a stop there said
    'nothing recorded' (and 'stats weight fc*' that no tensor matched) though every step
    before had them, in the trace and 'history'."""
    script = tmp_path / "by_hand.py"
    script.write_text("import torch, torch.nn as nn\n"
                      "torch.manual_seed(0)\n"
                      "rnn = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))\n"
                      "x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))\n"
                      "for step in range(4):\n"
                      "    rnn.zero_grad()\n"
                      "    loss = nn.functional.cross_entropy(rnn(x), y)\n"
                      "    loss.backward()\n"
                      "    for p in rnn.parameters():\n"
                      "        p.data.add_(p.grad.data, alpha=-0.1)\n")
    r = nndb("run", "--batch", "-q", "--rules", "none", "--trace", str(tmp_path / "t.h5"), "-e", "break step 2",
             "-e", "continue", "-e", "stats update", "-e", "stats weight 0.*", "-e", "history update 0.weight",
             "-e", "kill", str(script))
    assert r.returncode == 0, r.stderr
    said = ("step 2's weight and update rows are not measured yet: with hand-written updates they are taken "
            "at the next step's end, after the update (step 1's: 'history NAME')")
    assert r.stdout.count(said) == 2, r.stdout
    assert "nothing recorded" not in r.stdout and "matches" not in r.stderr
    assert "0.weight (update) norm, 2 recorded step(s) 0..1" in r.stdout
