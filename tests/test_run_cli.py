"""nndb run behaves like python SCRIPT ARGS, and bad input gets one clean line."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import click
import pytest

from conftest import example, nndb, nndb_started, python, without_nndb_lines
from nndb.store.reader import TraceReader


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return str(p)


def test_script_sees_main_argv_and_path(tmp_path, trace):
    script = write(tmp_path, "probe.py", """
        import json, sys, os
        print(json.dumps({"name": __name__, "argv": sys.argv, "path0": sys.path[0],
                          "file": __file__, "main_is_me": sys.modules["__main__"].__dict__ is globals()}))
        sys.exit(7)
    """)
    args = ["--help", "-v", "--lr", "0.1", "positional"]
    plain = python(script, *args, cwd=str(tmp_path))
    traced = nndb("run", "--trace", trace, script, *args, cwd=str(tmp_path))
    assert traced.returncode == plain.returncode == 7
    assert json.loads(traced.stdout) == json.loads(plain.stdout)
    assert json.loads(traced.stdout)["argv"][1:] == args


def test_run_module_like_python_m(tmp_path, trace):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("import sys\nprint(__name__, sys.argv[1:])\n")
    plain = subprocess.run([sys.executable, "-m", "pkg.train", "--x", "1"], cwd=str(tmp_path),
                           capture_output=True, text=True)
    traced = nndb("run", "--trace", trace, "-m", "pkg.train", "--x", "1", cwd=str(tmp_path))
    assert traced.returncode == 0, traced.stderr
    assert traced.stdout == plain.stdout == "__main__ ['--x', '1']\n"


@pytest.mark.parametrize("command", ["run", "check"])
def test_what_follows_the_module_is_the_modules_though_nndb_has_such_options(tmp_path, trace, command):
    """python -m's rule: `nndb run -m mlp --steps 2` gave mlp's --steps to nndb ('--steps takes
    A:B'), and `--every 2` recorded every second step; `-- x` reaches the module as python gives it."""
    (tmp_path / "mod.py").write_text("import sys\nprint(sys.argv[1:])\n")
    args = ["--steps", "2", "--every", "3", "-m", "x", "--", "y"]
    plain = subprocess.run([sys.executable, "-m", "mod", *args], cwd=str(tmp_path), capture_output=True, text=True)
    assert plain.stdout == f"{args}\n"
    extra = ["--trace", trace, "--force", "--batch"] if command == "run" else []
    for module in (["-m", "mod"], ["-mmod"]):
        r = nndb(command, *extra, *module, *args, cwd=str(tmp_path))
        assert r.stdout.startswith(plain.stdout), r.stdout + r.stderr


def test_missing_script_is_one_line_exit_2(tmp_path):
    r = nndb("run", str(tmp_path / "nope.py"), cwd=str(tmp_path))
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "no such file" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "nndb-runs").exists()       # no trace for a run that never started


def test_missing_module_is_one_line_exit_2(tmp_path):
    r = nndb("run", "-m", "no_such_module_xyz", cwd=str(tmp_path))
    assert r.returncode == 2 and "no module named no_such_module_xyz" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("content,what", [(b"\x7fELF\x00\x01\x02binary", "binary"),
                                          (b"def broken(:\n", "invalid syntax")])
def test_not_python_is_one_line_exit_2(tmp_path, content, what):
    p = tmp_path / "x.py"
    p.write_bytes(content)
    r = nndb("run", str(p), cwd=str(tmp_path))
    assert r.returncode == 2, r.stderr
    assert "is not a Python script" in r.stderr and what in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr


def test_missing_script_argument_is_usage_error(tmp_path):
    r = nndb("run", cwd=str(tmp_path))
    assert r.returncode == 2 and "missing SCRIPT" in r.stderr


def test_unwritable_trace_path_fails_before_the_run(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    script = write(tmp_path, "s.py", "print('ran')\n")
    # A directory that cannot exist (its parent is a file) fails for root too.
    r = nndb("run", "--trace", str(blocker / "sub" / "t.h5"), script, cwd=str(tmp_path))
    assert r.returncode == 2
    assert "cannot create trace" in r.stderr and str(blocker / "sub" / "t.h5") in r.stderr
    assert r.stdout == ""                                   # the script never ran
    assert "Traceback" not in r.stderr


def test_default_trace_path_is_printed_and_created(tmp_path):
    script = write(tmp_path, "s.py", "print('ran')\n")
    r = nndb("run", script, cwd=str(tmp_path))
    assert r.returncode == 0
    line = [l for l in r.stderr.splitlines() if l.startswith("nndb: recording to ")][0]
    path = line.split("nndb: recording to ", 1)[1]
    assert path.startswith("nndb-runs/s-") and path.endswith(".h5")
    assert os.path.exists(tmp_path / path)
    r2 = nndb("run", script, cwd=str(tmp_path))
    path2 = [l for l in r2.stderr.splitlines() if l.startswith("nndb: recording to ")][0].split(" to ", 1)[1]
    assert path2 != path                                     # never overwrites a trace


def test_script_exception_traceback_as_python_and_trace_kept(tmp_path, trace):
    script = example("raises.py")
    plain = python(script, "--fail-at", "3", cwd=str(tmp_path))
    r = nndb("run", "--trace", trace, script, "--fail-at", "3", cwd=str(tmp_path))
    assert r.returncode == plain.returncode == 1
    assert r.stdout == plain.stdout
    assert without_nndb_lines(r.stderr) == plain.stderr
    assert "nndb/" not in r.stderr                            # none of nndb's frames
    with TraceReader(trace) as t:
        assert t.status == "failed" and t.end["exit_code"] == 1
        assert "planted failure" in t.end["reason"]
        # steps 0..2 finished; step 3 raised after its backward and is kept, marked partial
        assert list(t.steps) == [0, 1, 2, 3]
        assert list(t.partial) == [False, False, False, True]
        loss = t.find("loss", "loss")[0]
        assert len(t.history(loss, "mean")[0]) == 4
        assert len(t.history(t.find("weight", "update")[0], "norm")[0]) == 3


def test_a_scripts_excepthook_that_hands_on_to_pythons_shows_no_nndb_frame(tmp_path, trace):
    """A script's sys.excepthook that calls the one it replaced (torch.distributed
    installs one at init_process_group, prefixing "[rankN]: ") ends in
    sys.__excepthook__, which shows the exception's own traceback whatever it
    is given: the traceback was nndb's runner.py and launcher.py frames above
    the script's under nndb, the script's frames alone under python."""
    script = write(tmp_path, "s.py", (
        "import sys\n"
        "old = sys.excepthook\n"
        "def hook(*a):\n"
        "    sys.stderr.write('[rank0]: hook\\n')\n"
        "    old(*a)\n"
        "sys.excepthook = hook\n"
        "import torch\n"
        "m = torch.nn.Linear(2, 1)\n"
        "o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for i in range(3):\n"
        "    o.zero_grad(); m(torch.ones(1, 2)).sum().backward(); o.step()\n"
        "raise RuntimeError('planted')\n"))
    plain = python(script, cwd=str(tmp_path))
    r = nndb("run", "--batch", "-q", "--trace", trace, script, cwd=str(tmp_path))
    assert r.returncode == plain.returncode == 1
    assert "[rank0]: hook\nTraceback" in plain.stderr
    assert without_nndb_lines(r.stderr) == plain.stderr
    assert "nndb/" not in r.stderr


OP_RAISES_AFTER_THE_STEP = """
import torch
torch.manual_seed(0)
m = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for step in range(3):
    loss = m(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    print(step, loss.item())
with torch.no_grad():                       # sampling from the model, as minGPT's callbacks do
    probs = torch.softmax(m(torch.randn(1, 4)), -1)
    probs[0, 0] = -1.0
    torch.multinomial(probs, 1)
"""


@pytest.mark.parametrize("armed", ["lineage on", "catch nan --eager"])
def test_an_operation_that_raises_under_the_op_recorder_shows_pythons_traceback(tmp_path, trace, armed):
    """Under nndb's dispatch mode (the op recorder of 'lineage on' and 'catch nan
    --eager') an operation that raised showed three torch frames Python does not
    (torch/_compile.py inner, eval_frame.py _fn, _ops.py __call__: the mode's way in
    and out), and the post-mortem stopped in the last of them, where 'p probs' was
    a NameError."""
    script = write(tmp_path, "s.py", OP_RAISES_AFTER_THE_STEP)      # (raises in C++: no frame of torch's)
    plain = python(script, cwd=str(tmp_path))
    r = nndb("run", "--batch", "-q", "--trace", trace, "-e", armed, "-e", "c", "-e", "where", "-e", "p probs.shape",
             script, cwd=str(tmp_path))
    assert r.returncode == plain.returncode == 1
    assert 's.py", line 13, in <module>' in plain.stderr and "_ops.py" not in plain.stderr
    assert without_nndb_lines(r.stderr) == plain.stderr
    assert r.stdout.endswith("> s.py(13)<module>()\n-> torch.multinomial(probs, 1)\ntorch.Size([1, 2])\n")


def test_sys_exit_with_message(tmp_path, trace):
    script = write(tmp_path, "s.py", "import sys\nsys.exit('bye')\n")
    r = nndb("run", "--trace", trace, script)
    p = python(script)
    assert r.returncode == p.returncode == 1
    assert without_nndb_lines(r.stderr) == p.stderr == "bye\n"


# A training loop that prints "ready" after step READY and runs until stopped.
LOOP = """
import time, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), 0.01)
def train():
    for step in range(10 ** 7):
        opt.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
        if step == READY:
            print("ready", flush=True)
        time.sleep(SLEEP)
"""


def _launch(tmp_path, trace, *flags, ready=5, sleep=0.002, after=None):
    """Start ``nndb run FLAGS`` on LOOP (``after``: the script's last lines,
    which call train()); return once the loop is past step ``ready``."""
    text = LOOP.replace("READY", str(ready)).replace("SLEEP", str(sleep)) + (after or "train()\n")
    script = tmp_path / "loop.py"
    script.write_text(text)
    proc = nndb_started("run", *flags, "--trace", trace, str(script))
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _wait(proc, stop=False):
    """(stdout, stderr) of a test's run; terminated first if ``stop``, and
    killed if it does not end: a test never leaves a run behind."""
    if stop and proc.poll() is None:
        proc.terminate()
    try:
        return proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise


NO_FLUSH = ("--flush-every", "1000", "--flush-secs", "1000")


@pytest.mark.parametrize("sig,code,status", [(signal.SIGTERM, 143, "terminated"),
                                             (signal.SIGINT, 130, "interrupted")])
def test_signals_flush_and_close_the_trace(tmp_path, trace, sig, code, status):
    proc = _launch(tmp_path, trace, *NO_FLUSH)
    time.sleep(0.3)
    proc.send_signal(sig)
    _, err = _wait(proc)
    # (Ctrl-C ends the run as it ends plain Python: with an optimizer, which loads torch._dynamo, 1)
    assert proc.returncode == (1 if sig == signal.SIGINT else code), err
    with TraceReader(trace) as t:
        # (the code the process ended with: the trace said 130 where it exited 1)
        assert t.status == status and t.end["exit_code"] == proc.returncode
        assert t.n_steps >= 6                        # nothing buffered was lost despite no flush before
        assert list(t.steps) == list(range(t.n_steps))
    if sig == signal.SIGINT:
        assert "KeyboardInterrupt" in err


def test_sigterm_does_not_wait_for_a_blocked_thread_of_the_script(tmp_path, trace):
    # SIGTERM ends plain Python at once; nndb ends the run and its trace instead, and then
    # Python's shutdown waited for the script's non-daemon thread (blocked on a queue no one
    # feeds): until 2026-12 the process never ended (py-spy: MainThread in threading._shutdown)
    after = """
import queue, threading
threading.Thread(target=queue.Queue().get, name="feeder").start()
train()
"""
    proc = _launch(tmp_path, trace, after=after)
    proc.send_signal(signal.SIGTERM)
    _, err = _wait(proc)
    assert proc.returncode == 143, err
    assert ("nndb: the run was terminated (SIGTERM) while 1 thread(s) of the script were still running "
            "(feeder; not daemon threads, which Python waits for): nndb ends without them") in err
    with TraceReader(trace) as t:
        assert t.status == "terminated" and list(t.steps) == list(range(t.n_steps))


def test_sigterm_between_backward_and_step_counts_the_whole_steps(tmp_path, trace):
    """SIGTERM in step 3, after its backward() and before its step(): nndb said 'trace
    closed with 4 step(s)' where the report said steps 3 and the trace has step 3 partial."""
    script = tmp_path / "mid.py"
    script.write_text(LOOP.replace("READY", "-1").replace("SLEEP", "0").replace(
        "        opt.step()\n", "        if step == 3:\n            print('ready', flush=True)\n"
                               "            time.sleep(60)\n        opt.step()\n") + "train()\n")
    report = str(tmp_path / "r.json")
    proc = nndb_started("run", "--report", report, "--trace", trace, str(script))
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    _, err = _wait(proc)
    assert proc.returncode == 143, err
    assert f"nndb: terminated (SIGTERM); trace closed with 3 step(s) and the partial step 3: {trace}" in err, err
    with open(report, encoding="utf-8") as fh:
        assert json.load(fh)["steps"] == 3
    with TraceReader(trace) as t:
        assert list(t.steps) == [0, 1, 2, 3] and list(t.partial) == [False, False, False, True]


@pytest.mark.parametrize("delay", [0.05, 0.2, 0.45])
def test_sigterm_in_a_busy_loop_loses_no_step(tmp_path, trace, delay):
    """No sleep in the loop: the signal lands inside nndb's hooks often."""
    proc = _launch(tmp_path, trace, ready=3, sleep=0)
    time.sleep(delay)
    proc.send_signal(signal.SIGTERM)
    _, err = _wait(proc)
    assert proc.returncode == 143, err
    assert "Exception ignored" not in err
    with TraceReader(trace) as t:
        assert t.status == "terminated"
        assert list(t.steps) == list(range(t.n_steps))


def test_script_that_catches_ctrl_c_goes_on_undisturbed(tmp_path, trace):
    after = """
try:
    train()
except KeyboardInterrupt:
    time.sleep(1.5)          # a second Ctrl-C from nndb would land here
    print("saved", flush=True)
"""
    proc = _launch(tmp_path, trace, sleep=0, after=after)
    proc.send_signal(signal.SIGINT)
    out, err = _wait(proc)
    assert proc.returncode == 0, err
    assert out.strip() == "saved" and "Traceback" not in err
    with TraceReader(trace) as t:
        assert t.status == "finished" and list(t.steps) == list(range(t.n_steps))


def test_kill_9_leaves_a_readable_trace_up_to_the_last_flush(tmp_path, trace):
    # (--replica off: each time-travel checkpoint flushes the writer too, which
    # only saves more; this test checks the flush cadence alone)
    proc = _launch(tmp_path, trace, "--flush-every", "10", "--flush-secs", "1000", "--replica", "off",
                   ready=25, sleep=0)
    proc.kill()
    proc.wait(timeout=30)
    with TraceReader(trace) as t:
        assert t.status == "incomplete" and t.end is None
        # whole flushes only (at least the first: the writer's thread may still be writing the
        # second, begun at step 20's end, when the kill comes 5 steps later on a loaded machine)
        assert t.n_steps >= 10 and t.n_steps % 10 == 0
        assert list(t.steps) == list(range(t.n_steps))
        w = t.find("0.weight", "param")[0]
        steps, norms = t.history(w, "norm")
        assert len(steps) == t.n_steps and all(n > 0 for n in norms)
    r = nndb("inspect", trace)
    assert r.returncode == 0 and "killed" in r.stdout


def test_trace_readable_while_the_run_writes(tmp_path, trace):
    proc = _launch(tmp_path, trace, "--flush-every", "1")
    try:
        seen = []
        for _ in range(2):
            r = nndb("inspect", "--json", trace)
            assert r.returncode == 0, r.stderr
            data = json.loads(r.stdout)
            seen.append(data["steps"])
            assert data["status"] == "incomplete"
        assert proc.poll() is None                   # the writer was alive all along
        assert seen[0] >= 6 and seen[1] > seen[0]    # and the reader saw it grow
    finally:
        _wait(proc, stop=True)


def test_version_and_help():
    r = nndb("--version")
    assert r.returncode == 0 and "nndb" in r.stdout
    r = nndb("run", "--help")
    assert r.returncode == 0 and "--every" in r.stdout and "--steps" in r.stdout


def test_the_command_list_tells_each_command_apart():
    """nndb --help's one line a command: run and fuzz both read 'Run SCRIPT
    [ARGS]...' (click cut their help at its first full stop)."""
    from nndb.cli import cli
    ctx = click.Context(cli)
    lines = {name: cli.get_command(ctx, name).get_short_help_str(60) for name in cli.list_commands(ctx)}
    assert len(set(lines.values())) == len(lines), lines
    assert all(len(line) > len("Run SCRIPT [ARGS]...") for line in lines.values()), lines


def test_run_options_are_the_run_commands_flags():
    """One RunOptions field per parameter of nndb run, each with the flag's
    default; a notebook's line is parsed by the same command into the same options."""
    import dataclasses
    from nndb.cli.run import given_options, parse_run_line, run, run_options
    from nndb.run.config import RunOptions
    assert [f.name for f in dataclasses.fields(RunOptions)] == [p.name for p in run.params] + ["given"]
    assert run_options(run.make_context("nndb run", ["train.py"])) == RunOptions(script="train.py",
                                                                                  given=("script",))
    words = ["--every", "2", "-e", "info", "--nx", "train.py", "--every", "3"]
    o = run_options(run.make_context("nndb run", list(words)))
    assert (o.every, o.eval_commands, o.nx, o.args) == (2, ("info",), True, ("--every", "3"))
    assert given_options(run, o) == ("--every", "2", "--eval-command", "info", "--nx")
    assert parse_run_line(words, "%nndb run")[0] == o
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.every = 4


def test_a_misspelt_name_gets_pythons_suggestion(tmp_path):
    """Python 3.10+ adds "Did you mean: 'loss'?" to a NameError or
    AttributeError; the traceback nndb prints for the script's exception had
    lost it (traceback's printer adds it only from 3.12): the same stderr as
    plain python now."""
    script = tmp_path / "typo.py"
    script.write_text("import torch\nloss = torch.zeros(1)\nprint(losss)\n")
    plain = python(str(script))
    r = nndb("run", "--batch", "--trace", str(tmp_path / "t.h5"), str(script))
    assert plain.returncode == r.returncode == 1
    assert "Did you mean: 'loss'?" in plain.stderr
    assert without_nndb_lines(r.stderr) == plain.stderr


# (a real subprocess: in the tests' zygote torch._dynamo, and the standard
# modules it imports, are there before the script; in python -m nndb they are not)
@pytest.mark.real_subprocess
def test_a_module_beside_the_script_is_the_scripts_own_though_nndb_imported_one_of_that_name(tmp_path):
    """A statistics.py beside the script: plain python imports it; under nndb
    the standard library's, which nndb had imported, was taken from
    sys.modules and the script failed (AttributeError, exit 1)."""
    (tmp_path / "statistics.py").write_text("def running_mean(xs):\n    return sum(xs) / len(xs)\n")
    (tmp_path / "shlex.py").write_text("MINE = True\n")
    script = tmp_path / "train.py"
    script.write_text("import statistics, shlex\nimport torch\n"
                      "print(statistics.running_mean([1.0, 2.0]), shlex.MINE, torch.ones(2).sum().item())\n")
    plain = python(str(script))
    r = nndb("run", "--batch", "--trace", str(tmp_path / "t.h5"), str(script))
    assert plain.returncode == 0 and plain.stdout == "1.5 True 2.0\n"
    assert r.returncode == 0, r.stderr
    assert r.stdout == plain.stdout


RECURSES = """\
import sys
sys.setrecursionlimit(100)
n = 0
def f():
    global n
    n += 1
    f()
try:
    f()
except RecursionError:
    print("repeats", n, "limit", sys.getrecursionlimit())
"""


@pytest.mark.parametrize("how", ["script", "module"])
def test_a_tight_recursion_limit_counts_the_scripts_frames_only(tmp_path, how):
    """Issue 41: nndb's own frames under the script counted against its
    limit (82 repeats for plain Python's 96)."""
    (tmp_path / "recurses.py").write_text(RECURSES)
    target = ["recurses.py"] if how == "script" else ["-m", "recurses"]
    plain = python(*target, cwd=str(tmp_path))
    assert plain.returncode == 0 and plain.stdout.startswith("repeats 9"), plain.stderr
    r = nndb("run", "--batch", "-q", "--trace", str(tmp_path / "t.h5"), *target, cwd=str(tmp_path))
    assert (r.returncode, r.stdout) == (0, plain.stdout), r.stderr


@pytest.mark.parametrize("before,ends", [
    # (no optimizer: a real subprocess, where torch._dynamo is not loaded as it is in the tests' zygote)
    pytest.param("", -signal.SIGINT, marks=pytest.mark.real_subprocess),
    ("import torch\ntorch.optim.SGD([torch.zeros(1, requires_grad=True)])\n", 1)])
def test_the_scripts_own_keyboard_interrupt_ends_the_run_as_it_ends_python(tmp_path, before, ends):
    """Issue 41: exit code 130 under nndb; plain Python ends itself by SIGINT
    after its exit handlers (bpo-1054041), which a parent tells apart -- or,
    once an optimizer has loaded torch._dynamo, exits 1.  The trace records the status the
    process ends with (it said 130 where the process exited 1)."""
    (tmp_path / "ki.py").write_text(before + "import atexit\natexit.register(print, 'atexit ran')\nprint('a')\n"
                                    "raise KeyboardInterrupt\n")
    plain = python("ki.py", cwd=str(tmp_path))
    r = nndb("run", "--batch", "-q", "--trace", str(tmp_path / "t.h5"), "ki.py", cwd=str(tmp_path))
    assert plain.returncode == ends and plain.stdout == "a\natexit ran\n"
    assert (r.returncode, r.stdout) == (plain.returncode, plain.stdout), r.stderr
    assert r.stderr.strip().endswith("KeyboardInterrupt")
    with TraceReader(str(tmp_path / "t.h5")) as t:
        assert t.status == "interrupted" and t.end["exit_code"] == (130 if ends == -signal.SIGINT else 1)


@pytest.mark.parametrize("argv,said", [(["run", "--batch", "--bogus", "x.py"], "No such option '--bogus'."),
                                       (["check", "--steps", "0", "x.py"], "Invalid value for '--steps'"),
                                       (["bogus"], "No such command 'bogus'.")])
def test_a_bad_option_is_one_line_and_exit_2(tmp_path, argv, said):
    """README's exit table: a usage error is one line (click's form was three: the usage, a hint, the error)."""
    r = nndb(*argv, cwd=str(tmp_path))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"nndb: error: {said}"), r.stderr


def test_ctrl_c_before_the_script_runs_is_one_line_and_ends_by_sigint(monkeypatch, capsys):
    """Ctrl-C while nndb starts (importing torch, before the script runs) printed
    click's 'Aborted!' and exited 1; it says so in one line and ends as Python's
    own Ctrl-C does (KeyboardInterrupt out of the program: by SIGINT, 130 in a
    shell).  click's Abort of another cause (EOF at a confirmation) is as before."""
    import click
    from nndb import cli as nndb_cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sys, "excepthook", sys.excepthook)       # (put back after the test)
    monkeypatch.setattr(nndb_cli.inspect.inspect, "callback", interrupted)
    with pytest.raises(KeyboardInterrupt):
        nndb_cli.main(["inspect", "t.h5"])
    assert capsys.readouterr().err.strip() == "nndb: interrupted (Ctrl-C)"

    def aborted(*args, **kwargs):
        raise click.Abort()

    monkeypatch.setattr(nndb_cli.inspect.inspect, "callback", aborted)
    with pytest.raises(SystemExit) as e:
        nndb_cli.main(["inspect", "t.h5"])
    assert e.value.code == 1 and capsys.readouterr().err.strip() == "Aborted!"


STOP_LOOP = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(8):
    opt.zero_grad()
    loss = model(torch.ones(2, 4)).pow(2).mean()
    loss.backward()
    opt.step()
    print("step", step, flush=True)
"""


def test_ctrl_c_while_a_batch_stops_commands_run_ends_the_run_at_the_stop(tmp_path):
    """Ctrl-C in batch mode while a breakpoint's stop ran its commands (the `py` below
    sends it as the terminal would): the KeyboardInterrupt was raised wherever the signal
    landed in nndb's code (in a `goto`, the script's traceback ended in h5py's frames of
    the trace's read), and then the commands after it still ran (`goto 1` replayed the
    past, `p $loss` printed).  Now the command running ends, the rest are dropped, and the
    stop interrupts the script: the traceback ends at opt.step(), the trace is closed."""
    (tmp_path / "loop.py").write_text(STOP_LOOP)
    trace = str(tmp_path / "t.h5")
    r = nndb("run", "--batch", "-q", "--trace", trace, "-e", "break step 3", "-e", "continue",
             "-e", "py import os, signal; os.kill(os.getpid(), signal.SIGINT); print('sent', flush=True)",
             "-e", "goto 1", "-e", "p $loss", "loop.py", cwd=str(tmp_path))
    # (an optimizer loads torch._dynamo: Python's Ctrl-C then ends with 1, as plain Python's does)
    assert r.returncode in (1, -signal.SIGINT), r.stderr
    out = [line for line in r.stdout.splitlines() if not line.startswith(("Breakpoint 1", ">", "->"))]
    assert out == ["step 0", "step 1", "step 2", "sent"], r.stdout + r.stderr
    assert "In the past" not in r.stdout + r.stderr and "goto" not in r.stderr
    tb = r.stderr[r.stderr.index("Traceback"):].splitlines()
    assert tb[-1] == "KeyboardInterrupt" and "post_hook(self, args, kwargs)" in tb[-2], r.stderr
    assert not [line for line in tb if "/nndb/" in line or "h5py" in line], r.stderr
    with TraceReader(trace) as t:
        assert t.status == "interrupted" and t.end["exit_code"] == (130 if r.returncode == -signal.SIGINT else 1)
        assert list(t.steps) == [0, 1, 2, 3]
