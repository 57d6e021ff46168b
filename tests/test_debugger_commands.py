"""Transcript tests of every debugger command: an in-process run (no torch
import per test) driven by ScriptedFrontend, with assertions on what it printed.

Each test groups many commands into one run to stay quick."""
import gc
import os
import re


from conftest import example
from nndb.config import RunConfig
from nndb.debugger.driver import DebugOptions, debug
from nndb.debugger.frontend import ScriptedFrontend
from nndb.launcher import Target


def run(tmp_path, script, lines, answers=(), steps=8, args=()):
    # an earlier test's run may leave optimizers in reference cycles; the tracer
    # counts the optimizers alive to choose how steps end (as 'run' does, in the driver)
    gc.collect()
    fe = ScriptedFrontend(lines, answers=answers)
    cfg = RunConfig(Target(path=example(script), args=["--steps", str(steps), *args]),
                    str(tmp_path / "t.h5"), quiet=True)
    res = debug(cfg, DebugOptions(no_rc=True, rules="none"), fe)
    return fe, res


def after(fe, command: str, nth: int = 1) -> str:
    """What was printed after the nth typing of ``command`` and before the next prompt."""
    chunks = fe.text.split("(nndb) ")[1:]
    hits = [c for c in chunks if c.split("\n", 1)[0] == command]
    assert len(hits) >= nth, f"{command!r} typed {len(hits)} time(s):\n{fe.text}"
    body = hits[nth - 1].split("\n", 1)
    return body[1] if len(body) > 1 else ""


def no_traceback(fe):
    assert "Traceback" not in fe.text and "internal error" not in fe.text, fe.text


# -- run control, the stack, info, print, display, stats, history ------------------------
def test_run_control_stack_and_inspection(tmp_path):
    fe, res = run(tmp_path, "mlp.py", [
        "info step", "where", "list", "up", "down", "down", "up 9",
        "s", "p $inputs", "p $module",
        "s", "s", "s", "s", "s", "s", "s", "s", "s", "s", "s", "s",
        "p $grad_output", "where", "list",
        "finish",
        "next 3", "p $step",
        "until 5", "where", "list", "list",
        "info locals", "info modules", "info params", "info optimizer",
        "p loss", "p/full x[:40]", "p x", "print/xyz x",
        "stats grad", "stats grad 4.*", "stats loss", "stats act nomatch*",
        "history loss", "history grad 0.weight norm --last 2", "history nope",
        "display $step", "display loss.item() > 0", "info display",
        "n", "undisplay 1", "n",
        "detach", "info step", "quit",
    ], steps=9)
    no_traceback(fe)
    assert res.exit_code == 0 and res.reason == "finished"

    # the start: stopped before the model's forward in step 0
    assert re.search(r"stopped\s+start in model forward", after(fe, "info step"))
    assert re.search(r"step in progress\s+0", after(fe, "info step"))
    where = after(fe, "where").splitlines()
    assert where[-2].startswith("> ") and where[-2].endswith("mlp.py(48)main()")
    assert where[-1] == "-> logits = model(inputs)"
    assert where[0].startswith("  ") and where[0].endswith("mlp.py(57)<module>()")
    listing = after(fe, "list").splitlines()
    assert len(listing) == 11 and "  48 ->         logits = model(inputs)" in listing
    assert after(fe, "up").startswith("> ") and "<module>()" in after(fe, "up")
    assert "main()" in after(fe, "down")
    assert after(fe, "down", 2).strip() == "Newest frame"
    assert after(fe, "up 9").strip() == "Oldest frame"

    # step: into each forward call, then into the backward pass, then the step end
    stops = re.findall(r"^Step 0, module (\S+) (forward|backward)$", fe.text, re.M)
    names = [f"{m} {ph}" for m, ph in stops]
    assert names[:6] == ["0 forward", "1 forward", "2 forward", "3 forward", "4 forward",
                         "criterion forward"]
    assert all(n.endswith("backward") for n in names[6:]) and len(names) == 13
    assert names[-1] == "0 backward" and "4 backward" in names and "2 backward" in names
    # $inputs: a tuple of one-line tensor summaries; $module the module
    assert after(fe, "p $inputs").strip().startswith("(tensor(shape=[64, 32], dtype=float32")
    assert after(fe, "p $inputs").strip().endswith(",)") and "\n" not in after(fe, "p $inputs").strip()
    assert after(fe, "p $module").strip() == "Linear(in_features=32, out_features=64, bias=True)"
    assert after(fe, "p $grad_output").startswith("tensor(shape=[64, 64]")
    # at a module stop in the backward, the stack is the script's (loss.backward())
    assert after(fe, "where", 2).splitlines()[-1] == "-> loss.backward()"
    assert "  50 ->         loss.backward()" in after(fe, "list", 2)

    assert after(fe, "finish").startswith("Step 0 finished, loss ")
    assert after(fe, "next 3").startswith("Step 3 finished, loss ")
    assert after(fe, "p $step").strip() == "3"
    assert after(fe, "until 5").startswith("Step 5 finished, loss ")
    # at a step end the script is in optimizer.step() (the step clock closes the step there)
    assert after(fe, "where", 3).splitlines()[-1] == "-> optimizer.step()"
    assert "  51 ->         optimizer.step()" in after(fe, "list", 3)
    assert after(fe, "list", 4).splitlines()[0].startswith("  57 ")   # list again: the next lines

    locs = after(fe, "info locals")
    assert re.search(r"^step\s+5$", locs, re.M)
    assert re.search(r"^x\s+tensor\(shape=\[1024, 32\], dtype=float32", locs, re.M)
    mods = after(fe, "info modules")
    assert re.search(r"^0\s+Linear\s+2112$", mods, re.M)
    assert re.search(r"^criterion\s+CrossEntropyLoss\s+0$", mods, re.M)
    assert re.search(r"^0\.weight\s+\(64, 32\)\s+float32\s+y\s", after(fe, "info params"), re.M)
    assert re.search(r"^optimizer\s+SGD\s+0\s+6\s+lr=0\.1, momentum=0\.9", after(fe, "info optimizer"), re.M)

    # print: a tensor is one line with shape and dtype; /full prints every element
    p_loss = after(fe, "p loss").strip()
    assert p_loss.startswith("tensor(shape=[], dtype=float32, device=cpu, requires_grad) value=")
    p_x = after(fe, "p x").strip()
    assert "\n" not in p_x and p_x.startswith("tensor(shape=[1024, 32], dtype=float32") and "norm=" in p_x
    full = after(fe, "p/full x[:40]")
    assert full.startswith("tensor([[") and "..." not in full and full.count("\n") >= 39 * 4
    assert after(fe, "print/xyz x").startswith("unknown print format '/xyz'")

    st = after(fe, "stats grad")
    assert st.splitlines()[0] == "step 5"
    assert st.splitlines()[1].split() == ["tensor", "kind", "count", "mean", "std", "min", "max", "norm",
                                          "zero_frac", "nan_count", "inf_count"]
    assert {l.split()[0] for l in st.splitlines()[2:]} == {"0.weight", "0.bias", "2.weight", "2.bias",
                                                           "4.weight", "4.bias"}
    assert [l.split()[0] for l in after(fe, "stats grad 4.*").splitlines()[2:]] == ["4.weight", "4.bias"]
    assert re.search(r"^loss\s+loss\s+1\s", after(fe, "stats loss"), re.M)
    assert after(fe, "stats act nomatch*").startswith("no act tensor matches 'nomatch*' at step 5")

    hist = after(fe, "history loss").splitlines()
    assert hist[0].startswith("loss (loss) norm, 6 recorded step(s) 0..5, min ")
    assert len(hist[1]) == 6 and set(hist[1]) <= set("▁▂▃▄▅▆▇█")     # the sparkline
    assert hist[2].split() == ["step", "norm"] and [l.split()[0] for l in hist[3:]] == list("012345")
    h2 = after(fe, "history grad 0.weight norm --last 2").splitlines()
    assert h2[0].startswith("0.weight (grad) norm, 6 recorded step(s)") and len(h2) == 2 + 1 + 2
    assert after(fe, "history nope").startswith("no tensor named 'nope' has been recorded")

    # display: shown when set and at every stop until undisplayed
    assert after(fe, "display $step").strip() == "1: $step = 5"
    assert after(fe, "display loss.item() > 0").strip() == "2: loss.item() > 0 = True"
    assert re.search(r"^1\s+\$step$", after(fe, "info display"), re.M)
    first_n = after(fe, "n")
    assert first_n.startswith("Step 6 finished") and "1: $step = 6" in first_n
    assert "2: loss.item() > 0 = True" in first_n
    second_n = after(fe, "n", 2)
    assert second_n.startswith("Step 7 finished") and "1: $step" not in second_n and "2: loss.item()" in second_n

    # detach: no more stops; the run ends and the prompt stays
    det = after(fe, "detach")
    assert det.startswith("Detached: the run goes on to its end")
    assert "the run ended (finished, exit code 0) after 9 step(s)" in det
    assert re.search(r"state\s+exited", after(fe, "info step", 2))
    assert "Kill it and quit?" not in fe.text       # nothing was live at quit


# -- breakpoints -------------------------------------------------------------------------
def test_breakpoints_conditions_ignore_tbreak_enable(tmp_path):
    fe, res = run(tmp_path, "mlp.py", [
        "break step 2", "tbreak step 1", "break module 2", "b module 4 backward",
        "disable 3 4", "info breakpoints",
        "c", "info breakpoints", "c",
        "enable 3", "c", "p $step", "p $inputs[0].shape", "p model(inputs).shape", "display model(inputs).shape[1]",
        "condition 3 $step == 5 and $inputs[0].shape[0] == 64", "c", "p $step",
        "condition 3", "ignore 3 2", "c", "p $step",
        "c 2", "p $step",
        "delete 3", "enable 4", "c", "p $grad_output.shape", "p $step",
        "info breakpoints", "delete", "info breakpoints",
        "break step 99 if $loss >", "break module", "break frob", "condition 42 True", "ignore 1",
        "tbreak module zzz*", "delete 1-3", "enable x",
        "quit",
    ], answers=[True, True], steps=12)
    no_traceback(fe)
    assert after(fe, "break step 2").strip() == "Breakpoint 1: step 2"
    assert after(fe, "tbreak step 1").strip() == "Temporary breakpoint 2: step 1"
    assert after(fe, "break module 2").strip() == "Breakpoint 3: module 2 forward"
    assert after(fe, "b module 4 backward").strip() == "Breakpoint 4: module 4 backward"
    table = after(fe, "info breakpoints").splitlines()
    assert table[0].split() == ["Num", "Type", "Disp", "Enb", "What", "Hits", "Notes"]
    assert table[1].split() == ["1", "breakpoint", "keep", "y", "step", "2", "0"]
    assert table[2].split() == ["2", "breakpoint", "del", "y", "step", "1", "0"]
    assert table[3].split() == ["3", "breakpoint", "keep", "n", "module", "2", "forward", "0"]
    assert table[4].split() == ["4", "breakpoint", "keep", "n", "module", "4", "backward", "0"]

    assert after(fe, "c").startswith("Temporary breakpoint 2, step 1 finished, loss ")
    t2 = after(fe, "info breakpoints", 2)
    assert not re.search(r"^2\s", t2, re.M)                       # tbreak deleted after its stop
    assert after(fe, "c", 2).startswith("Breakpoint 1, step 2 finished, loss ")
    # a module breakpoint: in the step in progress ($step is that step)
    assert after(fe, "c", 3).startswith("Breakpoint 3, module 2 forward (step 3)")
    assert after(fe, "p $step").strip() == "3"
    assert after(fe, "p $inputs[0].shape").strip() == "torch.Size([64, 64])"
    # a module called by a command (or a display) at the prompt does not stop there again
    assert after(fe, "p model(inputs).shape").strip() == "torch.Size([64, 10])"
    assert after(fe, "display model(inputs).shape[1]").strip() == "1: model(inputs).shape[1] = 10"
    assert fe.text.count("1: model(inputs).shape[1] = 10") == 1 + 4     # and at each later stop
    # a condition sees the stop's own $step and $inputs
    assert after(fe, "c", 4).startswith("Breakpoint 3, module 2 forward (step 5)")
    assert after(fe, "p $step", 2).strip() == "5"
    assert after(fe, "condition 3").strip() == "Breakpoint 3 now unconditional."
    assert after(fe, "ignore 3 2").strip() == "Will ignore next 2 crossings of breakpoint 3."
    assert after(fe, "c", 5).startswith("Breakpoint 3, module 2 forward (step 8)")
    # continue N: ignore this breakpoint N-1 more times
    cn = after(fe, "c 2")
    assert cn.startswith("Will ignore next 1 crossings of breakpoint 3.  Continuing.")
    assert "Breakpoint 3, module 2 forward (step 10)" in cn
    assert after(fe, "c", 6).startswith("Breakpoint 4, module 4 backward (step 10)")
    assert after(fe, "p $grad_output.shape").strip() == "torch.Size([64, 10])"
    t3 = after(fe, "info breakpoints", 3)
    assert re.search(r"^1\s+breakpoint\s+keep\s+y\s+step 2\s+1\s+breakpoint already hit 1 time$", t3, re.M)
    assert re.search(r"^4\s+breakpoint\s+keep\s+y\s+module 4 backward\s+1\s", t3, re.M)
    assert not re.search(r"^3\s", t3, re.M)
    assert after(fe, "delete").strip() == "Delete all breakpoints? (y or n) y"
    assert after(fe, "info breakpoints", 4).strip() == "No breakpoints or watchpoints."
    # errors: one line and the usage
    assert after(fe, "break step 99 if $loss >").startswith("syntax error in '$loss >'")
    assert "usage: break step N" in after(fe, "break module")
    assert after(fe, "break frob").startswith("cannot break on 'frob'")
    assert after(fe, "condition 42 True").startswith("no breakpoint number 42")
    assert after(fe, "ignore 1").startswith("ignore needs a breakpoint number and a count")
    assert after(fe, "tbreak module zzz*").startswith("no module matches 'zzz*' (there are: ")
    assert after(fe, "delete 1-3").startswith("no breakpoint number 1")
    assert after(fe, "enable x").startswith("breakpoint number must be an integer, not 'x'")
    assert res.reason == "killed from the debugger" and res.exit_code == 0


def test_commands_silent_break_if_and_fail(tmp_path):
    fe, res = run(tmp_path, "mlp.py", [
        "break step 1", "commands", "silent", "p $step * 100", "end",
        "break step 2", "commands 2", "echo hello", "p $step", "end",
        "break step 3", "commands", "echo passing by", "continue", "end",
        "break if $loss > 0 if $step == 4",
        "break if $step == 6 fail",
        "info breakpoints",
        "c", "c", "c", "p $step", "c", "p $step", "quit",
    ], answers=[True])
    no_traceback(fe)
    assert 'End with a line saying just "end".' in after(fe, "commands")
    assert fe.text.count(">end") == 3
    table = after(fe, "info breakpoints")
    assert "commands: silent; p $step * 100" in table and "commands: echo hello; p $step" in table
    assert re.search(r"^4\s+breakpoint\s+keep\s+y\s+if \$loss > 0\s+0\s+stop only if \$step == 4$", table, re.M)
    assert re.search(r"^5\s+breakpoint\s+keep\s+y\s+if \$step == 6 \[fail\]", table, re.M)
    # silent: no stop line, the commands' output only
    assert after(fe, "c").strip() == "100"
    c2 = after(fe, "c", 2).splitlines()
    assert c2[0] == "Breakpoint 2, step 2 finished, loss " + c2[0].rsplit(" ", 1)[1]
    assert c2[-2:] == ["hello", "2"]
    # breakpoint 3's commands continue at once: no prompt there; the next stop is breakpoint 4
    c3 = after(fe, "c", 3)
    assert "Breakpoint 3, step 3 finished" in c3 and "passing by" in c3
    assert "Breakpoint 4, if $loss > 0" in c3 and "(step 4 finished, loss " in c3
    assert after(fe, "p $step").strip() == "4"
    assert "Breakpoint 5, if $step == 6" in after(fe, "c", 4)
    assert after(fe, "p $step", 2).strip() == "6"
    assert res.exit_code == 4 and "fail action" in res.reason
    assert [s["id"] for s in res.session.stops] == [1, 2, 3, 4, 5]


# -- watchpoints ---------------------------------------------------------------------------
def test_watchpoints(tmp_path):
    fe, res = run(tmp_path, "nan_lr.py", [
        "watch loss nan_count > 0", "watch grad 0.weight", "watch grad nope*", "watch frob x",
        "watch grad 0.weight norm >", "info watchpoints",
        "c", "p $step", "disable 2 3", "c", "p $step", "info watchpoints",
        "watch grad zzz*", "quit",
    ], answers=[True], steps=12)
    no_traceback(fe)
    assert after(fe, "watch loss nan_count > 0").splitlines()[-1] == "Watchpoint 1: loss * nan_count > 0"
    assert after(fe, "watch grad 0.weight").strip() == "Watchpoint 2: grad 0.weight norm outside [0.01, 50] x first"
    pending = after(fe, "watch grad nope*")
    assert "stays pending" in pending and "Watchpoint 3: grad nope*" in pending
    assert after(fe, "watch frob x").startswith("unknown kind 'frob'")
    assert after(fe, "watch grad 0.weight norm >").startswith("'>' needs a value")
    table = after(fe, "info watchpoints").splitlines()
    assert table[0].split()[:5] == ["Num", "Type", "Disp", "Enb", "What"] and len(table) == 4
    assert table[1].split()[:4] == ["1", "watchpoint", "keep", "y"]
    # the relative rule: the grad norm leaves 50x its first value
    c1 = after(fe, "c")
    assert re.match(r"Watchpoint 2: grad 0\.weight norm = \S+ \(first \S+, x\S+\) at step (\d+)", c1)
    step = int(re.match(r".* at step (\d+)", c1.splitlines()[0]).group(1))
    assert after(fe, "p $step").strip() == str(step)
    c2 = after(fe, "c", 2)
    assert re.match(r"Watchpoint 1: loss loss nan_count = 1 \(> 0\) at step (\d+)", c2), c2
    nan_step = int(after(fe, "p $step", 2))
    assert nan_step > step
    assert re.search(r"^2\s+watchpoint\s+keep\s+n\s.*breakpoint already hit \d+ time",
                     after(fe, "info watchpoints", 2), re.M)
    assert after(fe, "watch grad zzz*").startswith("no grad tensor matches 'zzz*' (there are: 0.bias")


def test_watch_consecutive_on_a_dead_layer(tmp_path):
    fe, res = run(tmp_path, "dead_relu.py", [
        "n", "watch act act#2 zero_frac == 1 consecutive 3", "c", "p $step", "info watchpoints", "kill", "quit",
    ], answers=[True], steps=10)
    no_traceback(fe)
    c = after(fe, "c")
    assert c.startswith("Watchpoint 1: act act#2 zero_frac = 1 (== 1) for 3 steps in a row at step 3"), c
    assert after(fe, "p $step").strip() == "3"
    assert after(fe, "kill").startswith("Kill the run being debugged? (y or n) y")


# -- changing the run: set, py/! --------------------------------------------------------------
def test_set_lr_and_py_assignments_stick(tmp_path):
    fe, res = run(tmp_path, "mlp.py", [
        "set lr 0.01", "n", "p optimizer.param_groups[0]['lr']", "info optimizer",
        "set momentum 0.5 group 0", "p optimizer.param_groups[0]['momentum']",
        "set foo 1", "set lr abc", "set lr", "set lr 1 group 3", "set lr 1 optimizer nope",
        "!x_new = 5", "p x_new", "py step_copy = step * 10", "p step_copy",
        "!args.lr = 0.5", "p args.lr", "!x_new", "py loss", "!1/0", "p exit()", "! ",
        "c", "quit",
    ], answers=[True], steps=3)
    no_traceback(fe)
    tbl = after(fe, "set lr 0.01").splitlines()
    assert tbl[0].split() == ["optimizer", "group", "hyper-parameter", "was", "now"]
    assert tbl[1].split() == ["optimizer", "0", "lr", "0.1", "0.01"]   # named as the script names it
    assert after(fe, "p optimizer.param_groups[0]['lr']").strip() == "0.01"
    assert "lr=0.01, momentum=0.9" in after(fe, "info optimizer")
    assert after(fe, "p optimizer.param_groups[0]['momentum']").strip() == "0.5"
    assert after(fe, "set foo 1").startswith("optimizer has no hyper-parameter 'foo' (it has: lr, momentum")
    assert after(fe, "set lr abc").splitlines() == [
        "'abc' is not a number or tuple of numbers",
        "usage: set HYPER VALUE [group N] [optimizer NAME]    (e.g. set lr 1e-4)"]
    assert after(fe, "set lr").startswith("set needs a hyper-parameter and a value")
    assert after(fe, "set lr 1 group 3").startswith("optimizer has 1 param group(s); there is no group 3")
    assert after(fe, "set lr 1 optimizer nope").startswith("no optimizer named 'nope' (there are: optimizer)")
    # statements run in the script's frame (main()); assignments stick
    assert after(fe, "p x_new").strip() == "5"
    assert after(fe, "p step_copy").strip() == "0"
    assert after(fe, "p args.lr").strip() == "0.5"
    # an expression statement shows its value through the front end, as print does
    assert after(fe, "!x_new").strip() == "5"
    assert after(fe, "py loss").startswith("tensor(shape=[], dtype=float32")
    assert after(fe, "!1/0").strip() == "ZeroDivisionError: division by zero"
    assert after(fe, "p exit()").startswith("SystemExit")                 # pdb: an error, not the end
    assert after(fe, "! ").startswith("py needs a statement")
    assert res.reason == "finished" and res.exit_code == 0


def test_set_with_two_optimizers(tmp_path):
    fe, res = run(tmp_path, "gan.py", [
        "info optimizer", "set lr 0.01", "set lr 0.01 optimizer optimizerG",
        "p optimizerG.param_groups[0]['lr']", "p optimizerD.param_groups[0]['lr']",
        "set betas (0.9, 0.99) optimizer optimizerD", "p optimizerD.param_groups[0]['betas']",
        "quit",
    ], answers=[True], steps=2)
    no_traceback(fe)
    info = after(fe, "info optimizer")
    assert re.search(r"^optimizerD\s+Adam\s+0\s", info, re.M) and re.search(r"^optimizerG\s+Adam\s+0\s", info, re.M)
    assert after(fe, "set lr 0.01").startswith("2 optimizers: say which with 'optimizer NAME' (optimizerD, optimizerG)")
    assert after(fe, "set lr 0.01 optimizer optimizerG").splitlines()[1].split() == \
        ["optimizerG", "0", "lr", "0.002", "0.01"]
    assert after(fe, "p optimizerG.param_groups[0]['lr']").strip() == "0.01"
    assert after(fe, "p optimizerD.param_groups[0]['lr']").strip() == "0.002"
    assert after(fe, "p optimizerD.param_groups[0]['betas']").strip() == "(0.9, 0.99)"


def test_assignment_in_a_function_frame_changes_the_run(tmp_path, capsys):
    # raises.py fails at step 2 in check_batch(step, fail_at): stop in train_step()
    # before that and change its local fail_at; the run then finishes cleanly
    fe, res = run(tmp_path, "raises.py", [
        "break module model if $step == 2", "c", "where", "p fail_at", "!fail_at = 99", "p fail_at",
        "info locals", "c", "quit",
    ], steps=4, args=["--fail-at", "2"])
    no_traceback(fe)
    assert after(fe, "where").splitlines()[-2].endswith("raises.py(20)train_step()")
    assert after(fe, "p fail_at").strip() == "2"
    assert after(fe, "p fail_at", 2).strip() == "99"
    assert re.search(r"^fail_at\s+99$", after(fe, "info locals"), re.M)
    assert "the run ended (finished, exit code 0) after 4 step(s)" in after(fe, "c", 2)
    assert res.exit_code == 0 and res.reason == "finished"
    assert "step 3 loss" in capsys.readouterr().out


# -- post-mortem ------------------------------------------------------------------------------
def test_post_mortem(tmp_path, capsys):
    fe, res = run(tmp_path, "raises.py", [
        "c", "where", "p step", "p $step", "p $exception", "up", "p fail_at", "info locals",
        "up", "p args.fail_at", "down", "down", "down", "stats grad", "history grad weight",
        "info step", "n", "c", "quit",
    ], steps=6, args=["--fail-at", "2"])
    no_traceback(fe)
    assert res.exit_code == 1 and res.reason == "RuntimeError: planted failure at step 2"
    pm = after(fe, "c")
    assert pm.startswith("nndb: post-mortem: the script raised RuntimeError during step 2;")
    where = after(fe, "where").splitlines()
    assert [l.rsplit("/", 1)[-1] for l in where[::2]] == [
        "raises.py(53)<module>()", "raises.py(48)main()", "raises.py(22)train_step()",
        "raises.py(15)check_batch()"]
    assert where[-2].startswith("> ") and where[-1] == '-> raise RuntimeError(f"planted failure at step {step}")'
    assert after(fe, "p step").strip() == "2"
    assert after(fe, "p $step").strip() == "2"
    assert after(fe, "p $exception").strip() == "RuntimeError('planted failure at step 2')"
    assert after(fe, "up").startswith("> ") and "train_step()" in after(fe, "up")
    assert after(fe, "p fail_at").strip() == "2"
    assert re.search(r"^inputs\s+tensor\(shape=\[32, 8\]", after(fe, "info locals"), re.M)
    assert after(fe, "p args.fail_at").strip() == "2"
    assert after(fe, "down", 3).strip() == "Newest frame"
    assert re.search(r"^weight\s+grad\s+16\s", after(fe, "stats grad"), re.M)
    assert after(fe, "history grad weight").startswith("weight (grad) norm, 3 recorded step(s) 0..2")
    assert re.search(r"state\s+post-mortem", after(fe, "info step"))
    assert after(fe, "n").strip() == "The program is not being run."
    assert "the run ended (failed, exit code 1) after 2 step(s)" in after(fe, "c", 2)
    assert "RuntimeError: planted failure at step 2" in capsys.readouterr().err   # Python's traceback


# -- kill, run, quit, the empty line, the session commands ---------------------------------------
def test_kill_run_quit_and_repeat(tmp_path):
    fe, res = run(tmp_path, "mlp.py", [
        "break step 1", "n", "", "p $step", "",
        "quit", "kill", "kill", "info step", "p $step", "kill",
        "run", "", "info step", "info breakpoints", "c", "info breakpoints",
        "run", "c", "quit",
    ], answers=[False, False, True, True, True], steps=4)
    no_traceback(fe)
    # the empty line repeats the last command: n, then n again, then p $step twice
    assert after(fe, "n").startswith("Step 0 finished")
    assert after(fe, "").startswith("Breakpoint 1, step 1 finished")
    assert after(fe, "p $step").strip() == "1" and after(fe, "", 2).strip() == "1"
    # quit and kill ask first while the run is live
    assert after(fe, "quit").strip() == "A run is active.  Kill it and quit? (y or n) n\nNot confirmed."
    assert after(fe, "kill").strip() == "Kill the run being debugged? (y or n) n\nNot confirmed."
    k = after(fe, "kill", 2)
    assert k.startswith("Kill the run being debugged? (y or n) y")
    assert "the run ended (killed, exit code 0) after 2 step(s); trace: " + str(tmp_path / "t.h5") in k
    assert re.search(r"state\s+exited", after(fe, "info step"))
    assert after(fe, "p $step").strip() == "1"
    assert after(fe, "kill", 3).strip() == "The program is not being run."
    # run: a new trace, the breakpoints kept (their hit counts start again)
    assert after(fe, "run").startswith("Stopped at the start of the run (module model is about to run")
    assert after(fe, "", 3) == ""                                       # 'run' is not repeated
    assert re.search(r"trace\s+" + re.escape(str(tmp_path / "t-run2.h5")), after(fe, "info step", 2))
    assert re.search(r"^1\s+breakpoint\s+keep\s+y\s+step 1\s+0\s*$", after(fe, "info breakpoints"), re.M)
    assert after(fe, "c").startswith("Breakpoint 1, step 1 finished")
    assert "breakpoint already hit 1 time" in after(fe, "info breakpoints", 2)
    # run while live asks first, then starts a third trace
    assert after(fe, "run", 2).startswith("The run being debugged has been started already.  "
                                          "Start it from the beginning? (y or n) y")
    assert after(fe, "c", 2).startswith("Breakpoint 1, step 1 finished")
    assert after(fe, "quit", 2).startswith("A run is active.  Kill it and quit? (y or n) y")
    assert os.path.exists(tmp_path / "t.h5") and os.path.exists(tmp_path / "t-run2.h5") \
        and os.path.exists(tmp_path / "t-run3.h5")
    assert res.session.runs == 3 and res.reason == "killed from the debugger"


def test_session_commands_help_source_echo_prefixes(tmp_path):
    cmds = tmp_path / "cmds.nndb"
    cmds.write_text("# a comment\necho from the file\np $step + 1\n")
    bad = tmp_path / "bad.nndb"
    bad.write_text("echo one\nfrobnicate\necho never\n")
    fe, res = run(tmp_path, "mlp.py", [
        "help", "help break", "help info", "help nosuch", "h c",
        f"source {cmds}", f"source {bad}", f"source {tmp_path / 'missing'}", "source",
        "echo a\\nb", "echo",
        "de 1", "frobnicate", "disp", "cont 1", "wh", "fin now", "i b", "info xyz", "info",
        "info s", "# just a comment", "next 0", "until -1", "until x", "up x", "list 10000",
        "quit",
    ], answers=[True], steps=3)
    no_traceback(fe)
    h = after(fe, "help")
    assert h.startswith('Commands ("help CMD" for one; a unique prefix of a name works):')
    for name in ("continue (c, cont)", "next (n)", "break (b, br)", "watch", "print (p)", "set",
                 "py (!)", "history", "info (i)", "source", "echo", "help (h)", "quit (q, exit)"):
        assert name in h, name
    assert after(fe, "help break").startswith("usage: break step N | break module GLOB")
    assert "aliases: b, br" in after(fe, "help break")
    assert "info locals" in after(fe, "help info")
    assert after(fe, "help nosuch").startswith('undefined command: "nosuch".  Try "help".')
    assert after(fe, "h c").startswith("usage: continue [N]")
    src = after(fe, f"source {cmds}").splitlines()
    assert src == ["from the file", "1"]                    # $step at the start stop: step 0 in progress
    assert after(fe, f"source {bad}").splitlines() == [
        "one", f'{bad}:2: undefined command: "frobnicate".  Try "help".']
    assert "never" not in fe.text                           # the rest of a file is dropped at its first error
    assert after(fe, f"source {tmp_path / 'missing'}").startswith("cannot read command file")
    assert after(fe, "source").startswith("source needs a file name")
    assert after(fe, "echo a\\nb") == "a\nb\n"
    assert after(fe, "de 1").splitlines() == ['ambiguous command "de": delete, detach', ]
    assert after(fe, "frobnicate").splitlines() == ['undefined command: "frobnicate".  Try "help".']
    assert after(fe, "disp") == ""                         # display (a unique prefix) with nothing to show
    assert after(fe, "cont 1").startswith("nndb: the run ended (finished, exit code 0) after 3 step(s)")
    assert "mlp.py" not in after(fe, "wh") and after(fe, "wh").startswith("no stack")
    assert after(fe, "fin now").startswith("unexpected 'now'")
    assert after(fe, "i b").strip() == "No breakpoints or watchpoints."
    assert after(fe, "info xyz").startswith('undefined info command: "xyz".  Try "help info".')
    assert after(fe, "info").startswith("info what? (breakpoints | watchpoints")
    assert re.match(r"state\s+exited\n", after(fe, "info s"))            # a unique prefix
    assert after(fe, "# just a comment") == ""
    assert after(fe, "next 0").startswith("the count must be at least 1, not 0")
    assert after(fe, "until -1").startswith("step numbers start at 0, not -1")
    assert after(fe, "until x").startswith("the step must be an integer, not 'x'")
    assert after(fe, "up x").startswith("no stack") or after(fe, "up x").startswith("the count must be")
    assert after(fe, "list 10000").startswith("no stack")


def test_break_on_a_step_already_finished_says_so(tmp_path):
    fe, res = run(tmp_path, "mlp.py", ["next 3", "break step 1", "break step 5", "quit"],
                  answers=[True], steps=8)
    no_traceback(fe)
    early = after(fe, "break step 1")
    assert early.startswith("Breakpoint 1: step 1\n(step 1 has already finished in this run, which is at step 2")
    assert "'run'" in early
    assert after(fe, "break step 5").strip() == "Breakpoint 2: step 5"


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


def test_rule_set_threshold_keeps_an_int_threshold_an_int():
    from nndb.rules.base import Rule, Threshold

    class R(Rule):
        THRESHOLDS = {"n": Threshold(3, "count"), "x": Threshold(0.5, "ratio")}

    r = R()
    assert r.set_threshold("n", 4.0) == 4 and type(r.params["n"]) is int
    assert r.set_threshold("n", 4.5) == 4.5
    assert r.set_threshold("x", 2.0) == 2.0 and type(r.params["x"]) is float


def test_model_and_optimizer_summaries_of_the_session():
    from types import SimpleNamespace
    import torch
    from nndb.debugger.queries import RunQueries
    net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
    net[0].weight.grad = torch.ones(3, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    naming = SimpleNamespace(roots=lambda: [net], module_name=lambda m: type(m).__name__.lower(),
                             param_name=lambda p: "w" if p is net[0].weight else "b")
    q = RunQueries()
    q.rec = SimpleNamespace(naming=naming)
    q.optimizers = lambda: [("opt", opt)]
    assert q.module_summary() == [("sequential", "Sequential", 0), ("linear", "Linear", 9), ("relu", "ReLU", 0)]
    rows = q.param_summary()
    assert [r[:4] for r in rows] == [("w", (3, 2), "float32", True), ("b", (3,), "float32", True)]
    assert rows[0][5] == 6 ** 0.5 and rows[1][5] is None
    ((name, o, gi, n, hyper),) = q.optimizer_groups()
    assert (name, o, gi, n, hyper["lr"]) == ("opt", opt, 0, 2, 0.1) and "params" not in hyper
