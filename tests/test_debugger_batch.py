"""End-to-end tests of ``nndb run --batch``: real example scripts run in a
subprocess under the debugger, driven by ``-x`` command files, ``-e``
commands and rc files; we check stdout/stderr, the exit code and the
``--report`` JSON (docs/report.md).

Every subprocess costs ~3 s (torch import), so a run puts many commands
together: the long runs are module-scoped fixtures (one run each), and each
test asserts one part of what its run printed, named for what it checks.
"""
import json
import os
import re
import shlex
import textwrap

import numpy as np
import pytest

from conftest import Ran, example, nndb, python
from nndb.commands import rcfiles
from nndb.store.reader import TraceReader


def _report(path) -> dict:
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    assert data["nndb_report"] == 1
    assert set(data) == {"nndb_report", "script", "argv", "exit", "steps", "trace", "stops", "findings", "pending"}
    for s in data["stops"]:
        assert set(s) == {"step", "reason", "id", "detail"}
    return data


def _stops(data) -> list:
    """[(step, reason, id)] of the report's stops, in order."""
    return [(s["step"], s["reason"], s["id"]) for s in data["stops"]]


def _script_lines(stdout: str) -> dict:
    """The script's own ``step N loss X`` lines: {N: X as printed}."""
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^step (\d+) loss (\S+)$", stdout, re.M)}


def _no_traceback_from_nndb(stderr: str) -> None:
    assert "Traceback" not in stderr
    assert "internal error" not in stderr


def _write(path, text: str) -> str:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return str(path)


class BatchRun(Ran):
    """One ``nndb run --batch`` in a directory of its own, with ``--trace`` and
    ``--report`` there; shown in pytest's report when a test holding it fails."""

    def __init__(self, cwd, *args):
        self.cwd = str(cwd)
        self.trace, self.report_path = str(cwd / "run.h5"), str(cwd / "r.json")
        argv = ["run", "--batch", "--trace", self.trace, "--report", self.report_path, *args]
        super().__init__(nndb(*argv, cwd=self.cwd), argv)

    def report(self) -> dict:
        return _report(self.report_path)


def _batch_run(tmp_path_factory, name, *args, files=None) -> BatchRun:
    """A run for a module-scoped fixture, in a directory of its own: ``files``
    ({name: text}) are written there first, and an argument that names one
    becomes its path."""
    d = tmp_path_factory.mktemp(name)
    paths = {k: _write(d / k, v) for k, v in (files or {}).items()}
    return BatchRun(d, *(paths.get(a, a) for a in args))


# -- breakpoints ------------------------------------------------------------------

BREAKPOINTS = """\
# comments and blank lines are skipped

break step 1
commands 1
silent
p "HIT1", $step, step
end
tbreak step 2
break if $step % 2 == 1 and $loss > 0 and step == $step
ignore 3 1
break step 4
condition 4 $loss > 100
break step 4 if $loss < 100 and isinstance(step, int)
commands
p "AT4", $step, round($loss, 3) == round(loss.item(), 3)
info breakpoints
end
"""


@pytest.fixture(scope="module")
def breakpoints_run(tmp_path_factory) -> BatchRun:
    return _batch_run(tmp_path_factory, "bp", "-x", "bp.nndb",
                      "-e", 'p "E-DONE"',
                      example("mlp.py"), "--steps", "6", files={"bp.nndb": BREAKPOINTS})


def _breakpoint_rows(out: str) -> dict:
    """{number: row} of the `info breakpoints` table that breakpoint 5's commands print."""
    table = out[out.index("('AT4'"):]
    return {int(m.group(1)): m.group(0) for m in re.finditer(r"^(\d+)\s+breakpoint\s.*$", table, re.M)}


def test_breakpoints_run_goes_to_its_end_and_exits_0(breakpoints_run):
    r = breakpoints_run
    assert r.returncode == 0, r.stderr
    _no_traceback_from_nndb(r.stderr)
    assert sorted(_script_lines(r.stdout)) == list(range(6))


def test_a_good_run_prints_nothing_but_the_recording_line_on_stderr(breakpoints_run):
    # (a bad -e line ends a batch run: tests/reliability/test_watches.py)
    err_lines = [l for l in breakpoints_run.stderr.splitlines() if not l.startswith("nndb: recording")]
    assert err_lines == []


def test_e_lines_run_after_the_command_file_at_the_first_stop(breakpoints_run):
    out = breakpoints_run.stdout
    assert out.index("'E-DONE'") < out.index("step 0 loss")


def test_silent_commands_run_without_the_stop_line(breakpoints_run):
    # $step and the script's own variable agree
    assert "('HIT1', 1, 1)" in breakpoints_run.stdout
    assert "Breakpoint 1," not in breakpoints_run.stdout


def test_tbreak_stops_once_then_is_deleted(breakpoints_run):
    out = breakpoints_run.stdout
    assert out.count("Temporary breakpoint 2, step 2 finished, loss ") == 1
    assert sorted(_breakpoint_rows(out)) == [1, 3, 4, 5]          # 2 is not in the later table


def test_break_if_with_ignore_1_skips_step_1_then_stops_at_3_and_5(breakpoints_run):
    out = breakpoints_run.stdout
    assert out.count("Breakpoint 3, if $step % 2 == 1") == 2
    assert "(step 3 finished, loss " in out and "(step 5 finished, loss " in out


def test_a_false_condition_is_not_a_hit(breakpoints_run):
    # gdb: a hit needs the condition true; `condition N` shows in the table
    out = breakpoints_run.stdout
    assert "Breakpoint 4," not in out
    assert re.search(r"\s0\s+stop only if \$loss > 100$", _breakpoint_rows(out)[4])


def test_a_true_condition_stops_and_runs_its_commands(breakpoints_run):
    out = breakpoints_run.stdout
    assert "Breakpoint 5, step 4 finished, loss " in out
    assert "('AT4', 4, True)" in out
    assert _breakpoint_rows(out)[5].split()[:4] == ["5", "breakpoint", "keep", "y"]


def test_info_breakpoints_counts_hits_the_ignored_one_too(breakpoints_run):
    rows = _breakpoint_rows(breakpoints_run.stdout)
    assert re.search(r"\s1\s+breakpoint already hit 1 time$", rows[1])
    assert re.search(r"\s2\s+breakpoint already hit 2 times$", rows[3])


def test_breakpoints_report_has_the_exit_the_run_and_no_findings(breakpoints_run):
    data = breakpoints_run.report()
    assert data["exit"] == {"code": 0, "reason": "finished"}
    assert data["steps"] == 6 and data["argv"] == ["--steps", "6"]
    assert data["script"] == example("mlp.py") and data["trace"] == breakpoints_run.trace
    assert data["findings"] == []


def test_breakpoints_report_lists_each_stop_with_its_detail(breakpoints_run):
    data = breakpoints_run.report()
    assert _stops(data) == [(1, "breakpoint", 1), (2, "breakpoint", 2), (3, "breakpoint", 3),
                            (4, "breakpoint", 5), (5, "breakpoint", 3)]
    by_id = {s["id"]: s["detail"] for s in data["stops"]}
    assert by_id[1] == {"step": 1, "what": "step 1", "fail": False}
    assert by_id[3] == {"expr": "$step % 2 == 1 and $loss > 0 and step == $step", "step": 5,
                        "what": "if $step % 2 == 1 and $loss > 0 and step == $step", "fail": False}


# -- watchpoints ------------------------------------------------------------------

def test_watch_grad_relative_rule_cnn(tmp_path, trace):
    """`watch grad conv*`: the smoothed norm (median of the last 3) leaves
    [1/100, 50] x the baseline.  With a far too large learning rate a conv
    gradient collapses or explodes."""
    report = str(tmp_path / "r.json")
    r = nndb("run", "--batch", "--trace", trace, "--report", report, "-e", "watch grad conv*",
             example("cnn.py"), "--steps", "12", "--lr", "10", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    _no_traceback_from_nndb(r.stderr)
    assert "Watchpoint 1: grad conv* norm outside [0.01, 50] x baseline" in r.stdout
    data = _report(report)
    assert data["stops"], r.stdout
    with TraceReader(trace) as t:
        for s in data["stops"]:
            d = s["detail"]
            assert (s["reason"], s["id"]) == ("watchpoint", 1)
            assert re.fullmatch(r"conv\d\.weight", d["tensor"])        # the biases' gradients are ~0: not judged
            assert (d["kind"], d["stat"], d["step"], d["fail"]) == ("grad", "norm", s["step"], False)
            assert "op" not in d and "threshold" not in d
            steps, values = t.history(t.find(d["tensor"], "grad")[0], "norm")
            i = list(steps).index(s["step"])
            assert i >= 2 and d["value"] == pytest.approx(values[i], rel=1e-9)
            assert d["smoothed"] == pytest.approx(float(np.median(values[i - 2:i + 1])), rel=1e-9)
            ratio = d["smoothed"] / d["baseline"]
            assert ratio < 0.01 or ratio > 50
            line = (f"Watchpoint 1: grad {d['tensor']} norm = ")
            assert re.search(re.escape(line) + r"\S+ \(smoothed \S+, baseline \S+, x\S+\) at step "
                             + str(s["step"]), r.stdout, re.M)


NAN_WATCH = """\
watch grad *.weight norm > 1e3
watch loss nan_count > 0 always
break step 8 fail
commands
p "FAILED-AT", $step
continue
end
"""


@pytest.fixture(scope="module")
def nan_watch_run(tmp_path_factory) -> BatchRun:
    """nan_lr.py: gradients explode, then the loss is NaN.  A point with the
    fail action ends the batch run right after its commands, with exit 4."""
    return _batch_run(tmp_path_factory, "nanwatch", "-x", "w.nndb",
                      example("nan_lr.py"), "--steps", "12", files={"w.nndb": NAN_WATCH})


def _first_nan_step(stdout: str) -> int:
    return min(n for n, v in _script_lines(stdout).items() if v == "nan")


def test_a_fail_hit_exits_4_without_a_traceback(nan_watch_run):
    r = nan_watch_run
    assert r.returncode == 4, r.stderr
    _no_traceback_from_nndb(r.stderr)
    data = r.report()
    assert data["exit"]["code"] == 4 and "(3)" in data["exit"]["reason"]


def test_nan_lr_loss_goes_nan_before_the_fail_breakpoint(nan_watch_run):
    assert _first_nan_step(nan_watch_run.stdout) < 8


def test_a_fail_hit_ends_the_run_right_after_its_commands(nan_watch_run):
    r = nan_watch_run
    assert sorted(_script_lines(r.stdout)) == list(range(8))
    assert "('FAILED-AT', 8)" in r.stdout
    assert r.report()["steps"] == 9
    with TraceReader(r.trace) as t:
        assert t.status == "killed" and list(t.steps) == list(range(9))


def test_a_threshold_watch_stops_name_the_weight_and_its_norm(nan_watch_run):
    data = nan_watch_run.report()
    grads = [s for s in data["stops"] if s["id"] == 1]
    nans = [s for s in data["stops"] if s["id"] == 2]
    assert grads and all(s["reason"] == "watchpoint" for s in grads + nans)
    for s in grads:
        d = s["detail"]
        assert d["tensor"].endswith(".weight") and d["kind"] == "grad" and d["stat"] == "norm"
        assert d["value"] > 1e3 and (d["op"], d["threshold"]) == (">", 1000.0)
        assert re.search(rf"^Watchpoint 1: grad {re.escape(d['tensor'])} norm = \S+ \(> 1000\) "
                         rf"at step {s['step']}( \(also: [^)]*\))?$", nan_watch_run.stdout, re.M)


def test_a_nan_watch_with_always_stops_at_every_step_from_the_first_nan(nan_watch_run):
    first_nan = _first_nan_step(nan_watch_run.stdout)
    nans = [s for s in nan_watch_run.report()["stops"] if s["id"] == 2]
    assert [s["step"] for s in nans] == list(range(first_nan, 9))
    assert nans[0]["detail"] == {"tensor": "loss", "kind": "loss", "stat": "nan_count", "value": 1.0,
                                 "op": ">", "threshold": 0.0, "step": first_nan,
                                 "what": "loss * nan_count > 0 always", "fail": False}


def test_the_stop_line_says_the_loss_is_nan_not_unmeasured(nan_watch_run):
    # "-" would mean "not measured"
    first_nan = _first_nan_step(nan_watch_run.stdout)
    assert (f"Watchpoint 2: loss nan_count = 1 (> 0) at step {first_nan}\n"
            f"  (step {first_nan} finished, loss nan)") in nan_watch_run.stdout


def test_a_watch_and_a_fail_breakpoint_hit_together_are_both_listed(nan_watch_run):
    last = [s for s in nan_watch_run.report()["stops"] if s["step"] == 8]
    assert [(s["reason"], s["id"]) for s in last] == [("watchpoint", 2), ("breakpoint", 3)]
    assert last[1]["detail"] == {"step": 8, "what": "step 8", "fail": True}


@pytest.fixture(scope="module")
def dead_relu_run(tmp_path_factory) -> BatchRun:
    """The second use of the ReLU (after fc2) is all zero from step 0."""
    return _batch_run(tmp_path_factory, "deadrelu",
                      "-e", "watch act act#2 zero_frac == 1 consecutive 3", "-e", "info watchpoints",
                      "-e", "watch act act#2 zero_frac == 1 consecutive 5 fail",
                      "-e", "continue", "-e", 'p "AT", $step', "-e", "continue", "-e", 'p "QUEUED", $step',
                      example("dead_relu.py"), "--steps", "6")


def test_watch_and_info_watchpoints_show_consecutive_and_fail(dead_relu_run):
    out = dead_relu_run.stdout
    assert "Watchpoint 1: act act#2 zero_frac == 1 consecutive 3\n" in out
    assert "Watchpoint 2: act act#2 zero_frac == 1 consecutive 5 [fail]\n" in out
    assert re.search(r"^1\s+watchpoint\s+keep\s+y\s+act act#2 zero_frac == 1 consecutive 3\s+0", out, re.M)


def test_consecutive_3_stops_at_the_third_step_in_a_row_then_counts_again(dead_relu_run):
    """Stops at step 2, and (its count starting again) not at steps 3 and 4."""
    out = dead_relu_run.stdout
    assert ("Watchpoint 1: act act#2 zero_frac = 1 (== 1) for 3 steps in a row at step 2\n"
            "  (step 2 finished, loss ") in out
    assert out.count("Watchpoint 1: act") == 2        # the set message and one stop
    assert dead_relu_run.report()["stops"][0]["detail"] == {
        "tensor": "act#2", "kind": "act", "stat": "zero_frac", "value": 1.0, "op": "==", "threshold": 1.0,
        "step": 2, "what": "act act#2 zero_frac == 1 consecutive 3", "fail": False}


def test_a_watchpoint_with_the_fail_action_ends_the_run_with_exit_4(dead_relu_run):
    """`consecutive 5` hits at step 4, so step 5 never runs."""
    r = dead_relu_run
    assert r.returncode == 4, r.stderr
    _no_traceback_from_nndb(r.stderr)
    assert ("Watchpoint 2: act act#2 zero_frac = 1 (== 1) for 5 steps in a row at step 4\n"
            "  (step 4 finished, loss ") in r.stdout
    assert sorted(_script_lines(r.stdout)) == [0, 1, 2, 3]
    data = r.report()
    assert data["stops"][1]["detail"]["fail"] is True
    assert data["exit"] == {"code": 4, "reason": "a point with the fail action hit (2)"}
    assert data["steps"] == 5
    import nndb as api
    with api.open(r.trace) as t:     # (the trace said 'killed from the debugger', exit 0: a CI run that passed)
        assert (t.end["status"], t.end["exit_code"], t.end["reason"]) == \
            ("killed", 4, "a point with the fail action hit (2)")


def test_queued_e_commands_run_at_the_next_stops_the_fail_hits_too(dead_relu_run):
    assert "('AT', 2)" in dead_relu_run.stdout and "('QUEUED', 4)" in dead_relu_run.stdout


def test_dead_relu_report_lists_both_watchpoint_stops(dead_relu_run):
    assert _stops(dead_relu_run.report()) == [(2, "watchpoint", 1), (4, "watchpoint", 2)]


# A second model built at step 3, its parameters added to the optimizer then.
SECOND_MODEL_LATER = """\
import torch, torch.nn as nn
torch.manual_seed(0)
first = nn.Linear(4, 4)
opt = torch.optim.SGD(first.parameters(), lr=0.1)
second = None
for step in range(6):
    x = torch.randn(8, 4)
    if step == 3:
        second = nn.Linear(4, 2)
        opt.add_param_group({"params": second.parameters()})
    out = first(x) if second is None else second(first(x))
    loss = out.pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    print(f"step {step} loss {loss.item()!r}")
"""


def test_a_point_on_a_tensor_that_appears_later_stays_pending_past_step_0(tmp_path):
    """A watch or module breakpoint set once the run's names are known (here at
    step 1) on a model built at step 3 ended the batch run with exit 2: "-e 'watch
    act second max > 0': no act tensor matches 'second' (there are: first)", where
    gdb's pending breakpoints wait.  It stays pending, says so with the names there
    are (a typo shows), and hits when the tensor appears; one that never appears
    is pending at the end, as before step 0."""
    r = BatchRun(tmp_path, "-q", "--rules", "none", "-e", "until 1", "-e", "watch act second max > 0",
                 "-e", "tbreak module second", "-e", "watch grad second.wieght norm > 0",
                 _write(tmp_path / "s.py", SECOND_MODEL_LATER))
    _no_traceback_from_nndb(r.stderr)
    assert r.returncode == 0, r.stderr
    assert sorted(_script_lines(r.stdout)) == list(range(6))
    assert "No act tensor matches 'second' (there are: first); the point stays pending until one does." \
        in r.stdout, r.stdout
    assert "No module matches 'second' (there are: first); the point stays pending" in r.stdout
    assert "No grad tensor matches 'second.wieght' (there are: bias, weight); the point" in r.stdout
    assert _stops(r.report()) == [(3, "breakpoint", 2), (3, "watchpoint", 1)], r.report()
    assert r.report()["pending"] == [{"id": 3, "type": "watchpoint", "what": "grad second.wieght norm > 0",
                                      "fail": False}]
    assert "watchpoint 3 (grad second.wieght norm > 0) was still pending at the end of the run" in r.stderr


def test_a_loss_watchpoint_is_not_pending_when_the_run_ends_in_a_forward_after_its_last_step(tmp_path):
    """A CI job's ``watch loss mean > 1000 fail`` on a script whose own guard raises on a NaN
    loss before backward() at step 3: the loss was recorded at steps 0-2, but the run's last
    row (the partial step 3, its forward's activations) has none, and the end of the run read
    the point as pending: "no loss tensor matched '*'", exit 2 where the script's exit is 1."""
    script = os.path.join(os.path.dirname(__file__), "scripts", "loss_guard_raises.py")
    r = BatchRun(tmp_path, "-q", "--nx", "-e", "watch loss mean > 1000 fail",
                 "-e", "watch act nosuch fail", script)
    assert r.returncode == 2, r.stderr
    data = r.report()
    assert data["exit"] == {"code": 2, "reason": "a point with the fail action stayed pending (2)"}
    assert [p["id"] for p in data["pending"]] == [2] and data["steps"] == 3
    assert "still pending" in r.stderr and "watchpoint 1 " not in r.stderr
    r = BatchRun(tmp_path, "-q", "--nx", "--force", "-e", "watch loss mean > 1000 fail", script)
    assert r.returncode == 1, r.stderr
    assert r.report()["exit"] == {"code": 1, "reason": "FloatingPointError: loss is nan at step 3"}
    assert r.report()["pending"] == [] and "pending" not in r.stderr


def test_a_script_that_ends_with_os_exit_keeps_its_steps_and_its_report(tmp_path):
    """os._exit(3) after the last of 100 steps: Python ends the process there, and nothing
    closed the trace (1 step of 100 in it, status "incomplete") nor wrote the report.  Now
    the run ends there as at the script's end, and the process with the script's code."""
    script = os.path.join(os.path.dirname(__file__), "scripts", "ends_with_os_exit.py")
    plain = python(script, forked=True)
    assert plain.returncode == 3 and plain.stdout.splitlines()[-1].startswith("last step 99 loss ")
    r = BatchRun(tmp_path, "-q", "--nx", "-e", "watch loss mean > 1000 fail", script)
    assert r.returncode == 3 and r.stderr == "", r.stderr
    assert r.stdout.splitlines()[2:] == plain.stdout.splitlines()         # (after the watchpoint's lines)
    data = r.report()
    assert data["exit"] == {"code": 3, "reason": "os._exit(3)"} and data["steps"] == 100 and data["pending"] == []
    with TraceReader(r.trace) as t:
        assert t.status == "failed" and list(t.steps) == list(range(100))
        assert t.end["exit_code"] == 3 and t.end["reason"] == "os._exit(3)"
    r = BatchRun(tmp_path, "-q", "--nx", "--force", "-e", "watch act nosuch fail", script, "--code", "0")
    assert r.returncode == 2 and r.report()["exit"]["reason"] == "a point with the fail action stayed pending (1)"


# -- errors, exceptions, kill -------------------------------------------------------

BAD_FILE = """\
break step 1
continue
p "REACHED"
stats grad zzz*
p "NOT REACHED"
"""


def test_command_file_error_is_fatal_in_batch(tmp_path, trace):
    cmds = _write(tmp_path / "bad.nndb", BAD_FILE)
    report = str(tmp_path / "r.json")
    r = nndb("run", "--batch", "--trace", trace, "--report", report, "-x", "bad.nndb",
             "-e", 'p "E-NOT-REACHED"', example("mlp.py"), "--steps", "5", cwd=str(tmp_path))
    assert os.path.exists(cmds)
    assert r.returncode == 2
    _no_traceback_from_nndb(r.stderr)
    msg = "bad.nndb:4: no grad tensor matches 'zzz*' at step 1"
    assert [l for l in r.stderr.splitlines() if "bad.nndb" in l] == [msg]
    assert "'REACHED'" in r.stdout
    assert "NOT REACHED" not in r.stdout                   # the rest of the file and the -e lines
    assert sorted(_script_lines(r.stdout)) == [0]           # killed at the end of step 1
    data = _report(report)
    assert data["exit"] == {"code": 2, "reason": msg}
    assert _stops(data) == [(1, "breakpoint", 1)] and data["steps"] == 2
    # the trace was closed and stays readable
    i = nndb("inspect", "--json", trace, cwd=str(tmp_path))
    assert i.returncode == 0, i.stderr
    info = json.loads(i.stdout)
    assert info["status"] == "killed" and info["steps"] == 2 and info["last_step"] == 1
    # ... and says why, as the report does (it said 'exit 0 (killed from the debugger)': no one typed kill)
    assert (info["end"]["exit_code"], info["end"]["reason"]) == (2, msg)


def test_an_error_in_a_breakpoints_commands_ends_its_list_not_the_run(tmp_path, trace):
    """gdb: 'If an error occurs in a command, the rest of the list is not executed'.  nndb ran the
    rest (a 'p' after a failed 'p nosuch' printed); another breakpoint's list at the same stop runs,
    and the run goes on (exit 0)."""
    r = nndb("run", "--batch", "--nx", "--rules", "none", "--trace", trace,
             "-e", "break step 1", "-e", "commands", "-e", "p nosuch", "-e", 'p "AFTER-" + str($step)', "-e", "end",
             "-e", "break step 1", "-e", "commands", "-e", 'p "OTHER-" + str($step)', "-e", "end",
             example("mlp.py"), "--steps", "4", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "NameError: name 'nosuch' is not defined (the rest of breakpoint 1's commands is not run)" \
        in r.stderr.splitlines(), r.stderr
    assert "AFTER-" not in r.stdout and "'OTHER-1'" in r.stdout
    assert sorted(_script_lines(r.stdout)) == [0, 1, 2, 3]


def test_a_command_file_line_that_does_not_parse_fails_before_the_script_runs(tmp_path, trace):
    _write(tmp_path / "bad.nndb", BAD_FILE.replace("stats grad zzz*", "watch grad"))
    report = str(tmp_path / "r.json")
    r = nndb("run", "--batch", "--trace", trace, "--report", report, "-x", "bad.nndb",
             example("mlp.py"), "--steps", "5", cwd=str(tmp_path))
    assert r.returncode == 2
    msg = "bad.nndb:4: watch grad needs a tensor name or glob"
    assert r.stderr.splitlines() == [msg] and r.stdout == ""
    data = _report(report)
    assert data["exit"] == {"code": 2, "reason": msg} and data["stops"] == [] and data["steps"] == 0
    assert not os.path.exists(trace)


def test_script_raises_post_mortem_in_batch(tmp_path, trace):
    """The traceback is printed as Python prints it; the commands still queued
    run at the raising frame; the report has an exception stop; exit 1."""
    report = str(tmp_path / "r.json")
    r = nndb("run", "--batch", "--trace", trace, "--report", report,
             "-e", "continue", "-e", "where", "-e", "p step, fail_at, $step",
             example("raises.py"), "--steps", "6", "--fail-at", "2", cwd=str(tmp_path))
    assert r.returncode == 1
    assert "Traceback (most recent call last):" in r.stderr
    assert r.stderr.rstrip().endswith("RuntimeError: planted failure at step 2")
    assert "nndb/" not in r.stderr and "internal error" not in r.stderr
    assert sorted(_script_lines(r.stdout)) == [0, 1]
    assert re.search(r"^> \S*raises\.py\(\d+\)check_batch\(\)$", r.stdout, re.M)
    assert "(2, 2, 2)" in r.stdout
    data = _report(report)
    assert data["exit"] == {"code": 1, "reason": "RuntimeError: planted failure at step 2"}
    assert data["steps"] == 2
    assert data["stops"] == [{"step": 2, "reason": "exception", "id": None,
                              "detail": {"exception": "RuntimeError", "message": "planted failure at step 2"}}]
    with TraceReader(trace) as t:
        assert t.status == "failed" and list(t.partial) == [False, False, True]


def test_run_control_at_a_post_mortem_ends_the_run_and_then_says_how_it_ended(tmp_path, trace):
    """'next' at the post-mortem said "The program is not being run." (exit 2) where 'continue'
    ended the run; now each goes on as gdb's after a fatal signal, and after the end says how
    the run ended."""
    r = nndb("run", "--batch", "--trace", trace, "-e", "continue", "-e", 'p ("PM", $step)', "-e", "next",
             "-e", 'p ("END", $step)', "-e", "next", "-e", 'p "NOT REACHED"',
             example("raises.py"), "--steps", "6", "--fail-at", "2", cwd=str(tmp_path))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "('PM', 2)" in r.stdout and "('END', 1)" in r.stdout and "NOT REACHED" not in r.stdout
    assert ("-e next: The program is not being run: it ended (failed, exit code 1) after 2 step(s); "
            "'run' starts it again.") in r.stderr.splitlines(), r.stderr


KILL_FILE = """\
break step 1
continue
p "AT", $step
kill
p "AFTER-KILL"
"""


def test_kill_from_a_command_file(tmp_path, trace):
    cmds = _write(tmp_path / "kill.nndb", KILL_FILE)
    report = str(tmp_path / "r.json")
    r = nndb("run", "--batch", "--trace", trace, "--report", report, "-x", cmds,
             example("mlp.py"), "--steps", "5", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    _no_traceback_from_nndb(r.stderr)
    assert [l for l in r.stderr.splitlines() if not l.startswith("nndb: recording")] == []
    assert "('AT', 1)" in r.stdout
    assert "'AFTER-KILL'" in r.stdout                 # as gdb: the rest of the file runs after the run
    assert sorted(_script_lines(r.stdout)) == [0]
    data = _report(report)
    assert data["exit"] == {"code": 0, "reason": "killed from the debugger"}
    assert _stops(data) == [(1, "breakpoint", 1)] and data["steps"] == 2
    with TraceReader(trace) as t:
        assert t.status == "killed" and t.end["exit_code"] == 0 and list(t.steps) == [0, 1]


PRODUCER = """
import queue, threading, torch, torch.nn as nn
torch.manual_seed(0)
log = open("own.log", "w")
q = queue.Queue(maxsize=2)
def produce():
    for _ in range(30):
        q.put(torch.randn(4, 8))
threading.Thread(target=produce, name="prefetch").start()      # (not a daemon thread)
m = nn.Linear(8, 1)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for step in range(30):
    opt.zero_grad()
    loss = m(q.get()).pow(2).mean()
    loss.backward()
    opt.step()
    log.write(f"step {step} loss {loss.item()!r}\\n")
log.close()
print("done")
"""


@pytest.mark.parametrize("end", ["quit", "kill"])
def test_a_run_ended_at_the_prompt_does_not_wait_for_the_scripts_blocked_thread(tmp_path, trace, end):
    # The producer of a bounded queue.Queue, not a daemon thread, blocks on put once the loop
    # stops: Python waits for it at exit, and until 2026-12 'quit' or 'kill' at a stop hung
    # nndb there for good.  nndb says so and ends; the script's open file is flushed as at exit.
    script = _write(tmp_path / "producer.py", PRODUCER)
    r = nndb("run", "--batch", "-q", "--nx", "--trace", trace, "-e", "break step 5", "-e", "continue",
             "-e", end, script, cwd=str(tmp_path), timeout=120)
    Ran(r, ["run", "--batch", "-e", "break step 5", "-e", "continue", "-e", end, script])
    assert r.returncode == 0, r.stderr
    _no_traceback_from_nndb(r.stderr)
    assert ("nndb: the run was ended at the prompt while 1 thread(s) of the script were still running "
            "(prefetch; not daemon threads, which Python waits for): nndb ends without them") in r.stderr
    lines = (tmp_path / "own.log").read_text().splitlines()
    assert [l.split()[1] for l in lines] == [str(i) for i in range(5)]      # (step 5 stopped before its write)
    # a run the script ends itself is left to end as Python ends it
    r = nndb("run", "--batch", "-q", "--nx", "--trace", trace, "--force", script, cwd=str(tmp_path), timeout=120)
    assert r.returncode == 0 and r.stdout == "done\n" and "nndb:" not in r.stderr, r.stderr
    assert len((tmp_path / "own.log").read_text().splitlines()) == 30


# -- rc files and the trust rule ---------------------------------------------------------

@pytest.fixture
def rc_dirs(tmp_path):
    home, xdg, proj = tmp_path / "home", tmp_path / "xdg", tmp_path / "proj"
    for d in (home, xdg, proj):
        d.mkdir()
    _write(home / ".nndbrc", 'p "HOME-RC"\n')
    _write(proj / ".nndbrc", 'p "LOCAL-RC"\n')
    env = {"HOME": str(home), "XDG_CONFIG_HOME": str(xdg)}
    return home, xdg, proj, env


def _rc_args(tmp_path):
    x = _write(tmp_path / "x.nndb", 'p "X-FILE"\n')
    return ("-x", x, "-e", 'p "E-CMD"', example("mlp.py"), "--steps", "1")


def _printed(stdout: str) -> list:
    return re.findall(r"'(\w+(?:-\w+)*)'", stdout)


def test_untrusted_local_rc_is_skipped_with_the_command_that_trusts_it(rc_dirs, tmp_path):
    home, xdg, proj, env = rc_dirs
    r = nndb("run", "--batch", "-q", *_rc_args(tmp_path), cwd=str(proj), env=env)
    assert r.returncode == 0, r.stderr
    assert "LOCAL-RC" not in r.stdout
    assert _printed(r.stdout) == ["HOME-RC", "X-FILE", "E-CMD"]          # in order
    lines = [l for l in r.stderr.splitlines() if "nndb trust" in l]
    assert len(lines) == 1 and str(proj / ".nndbrc") in lines[0]
    trust_cmd = shlex.split(lines[0].split("run: ", 1)[1])
    assert trust_cmd == ["nndb", "trust", os.path.realpath(proj)]


def test_trusted_local_rc_is_read_after_the_home_rc(rc_dirs, tmp_path):
    home, xdg, proj, env = rc_dirs
    t = nndb("trust", os.path.realpath(proj), cwd=str(proj), env=env)   # the command the skip line prints
    assert t.returncode == 0, t.stderr
    with open(xdg / "nndb" / "trusted", encoding="utf-8") as fh:
        assert json.load(fh)["directories"] == [os.path.realpath(proj)]
    r = nndb("run", "--batch", "-q", *_rc_args(tmp_path), cwd=str(proj), env=env)
    assert r.returncode == 0, r.stderr
    assert _printed(r.stdout) == ["HOME-RC", "LOCAL-RC", "X-FILE", "E-CMD"]
    assert "nndb trust" not in r.stderr


def test_nx_reads_no_rc_file_but_runs_x_and_e(rc_dirs, tmp_path):
    home, xdg, proj, env = rc_dirs
    r = nndb("run", "--batch", "-q", "--nx", *_rc_args(tmp_path), cwd=str(proj), env=env)
    assert r.returncode == 0, r.stderr
    assert _printed(r.stdout) == ["X-FILE", "E-CMD"]
    assert r.stderr.strip() == ""


def test_trust_covers_subdirectories_only(tmp_path, monkeypatch):
    """In-process: trusting DIR trusts DIR/sub but not DIR2 (a name prefix)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    (tmp_path / "proj" / "sub").mkdir(parents=True)
    (tmp_path / "proj2").mkdir()
    assert not rcfiles.is_trusted(str(tmp_path / "proj"))
    assert rcfiles.trust(str(tmp_path / "proj")) == os.path.realpath(tmp_path / "proj")
    rcfiles.trust(str(tmp_path / "proj"))                      # twice: listed once
    assert rcfiles.trusted_dirs() == [os.path.realpath(tmp_path / "proj")]
    assert rcfiles.is_trusted(str(tmp_path / "proj"))
    assert rcfiles.is_trusted(str(tmp_path / "proj" / "sub"))
    assert not rcfiles.is_trusted(str(tmp_path / "proj2"))
    assert not rcfiles.is_trusted(str(tmp_path))


def test_commands_block_ends_with_its_file(tmp_path):
    """In-process: a `commands` block with no `end` in a command file is an
    error at that line; it does not swallow the -e commands that follow."""
    import io

    from nndb.frontends.batch import BatchFrontend
    from nndb.driver import DebugOptions, build_session
    from nndb.debugger.session import QueuedLine

    path = _write(tmp_path / "noend.nndb", "break step 1\ncommands\nsilent\np 1\n")
    out, err = io.StringIO(), io.StringIO()
    s = build_session(BatchFrontend(out, err), DebugOptions(batch=True, stop_at_start=False))
    s.queue_lines(rcfiles.read_command_file(path) + [QueuedLine('p "E1"'), QueuedLine("end")])
    s.interact()
    msg = f"{path}:2: 'commands' without a closing 'end'"
    assert err.getvalue() == msg + "\n"
    assert s.input.file_error == msg
    assert s.points[1].commands == [] and not s.points[1].silent
    assert [q.text for q in s.input.queue] == ['p "E1"', "end"]      # not part of the block, not run


def test_info_memory_shows_the_process_and_says_when_cuda_is_not_in_use():
    r = nndb("run", "--batch", "-q", "--rules", "none", "-e", "break step 2", "-e", "continue", "-e", "info memory",
             example("mlp.py"), "--steps", "4")
    assert r.returncode == 0, r.stderr
    rss = re.search(r"^process \(host, resident\)\s+([0-9.]+) MiB$", r.stdout, re.M)
    assert rss and float(rss.group(1)) > 10
    assert re.search(r"^nndb's tensors kept between steps \(host\)\s+[0-9.]+ MiB$", r.stdout, re.M)
    assert "CUDA: not initialised in this process (no GPU memory in use)." in r.stdout


def test_nndb_held_bytes_count_each_storage_once():
    import torch
    from nndb.debugger.memory import by_device
    a = torch.zeros(1000)
    assert by_device([a, a[:10], a.view(10, 100), torch.zeros(5, dtype=torch.float64)]) == {"cpu": 4000 + 40}


def test_a_command_that_fails_in_the_past_ends_the_run_with_exit_2(tmp_path, trace):
    """As anywhere else in batch mode (issue 39: the replica alone was killed,
    the live run went on to exit 0 and the commands after it were dropped unsaid)."""
    report = str(tmp_path / "r.json")
    r = nndb("run", "--batch", "--nx", "--trace", trace, "--report", report, "-e", "until 6", "-e", "rs 3",
             "-e", "p nosuch", "-e", 'p "NOT REACHED"', example("mlp.py"), "--steps", "12", cwd=str(tmp_path))
    assert r.returncode == 2, r.stdout + r.stderr
    _no_traceback_from_nndb(r.stderr)
    msg = "-e 'p nosuch': NameError: name 'nosuch' is not defined"
    assert msg in r.stderr.splitlines() and "In the past" in r.stdout
    assert "NOT REACHED" not in r.stdout
    assert sorted(_script_lines(r.stdout)) == list(range(6))     # killed at the stop at step 6, as outside the past
    assert _report(report)["exit"] == {"code": 2, "reason": msg}
    with TraceReader(trace) as t:
        assert t.status == "killed"
        assert (t.end["exit_code"], t.end["reason"]) == (2, msg)


def test_a_batch_run_goes_back_to_the_present_when_nothing_is_queued_in_the_past(tmp_path, trace):
    """The past did not run on to the script's end by itself: the script's
    lines of steps 3-11 were printed twice (once by the replica) and the
    replica ran as long as the run's rest."""
    r = nndb("run", "--batch", "--nx", "--trace", trace, "-e", "until 6", "-e", "rs 3", "-e", 'p ("AT", $step)',
             example("mlp.py"), "--steps", "12", cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = re.findall(r"^step (\d+) loss", r.stdout, re.M)
    assert lines == [str(i) for i in range(12)], r.stdout          # each step's line once, in order
    assert "('AT', 3)" in r.stdout and "Back in the present (timeline 0): step 6." in r.stdout
    assert "the script ended on this timeline" not in r.stdout


def test_continue_in_the_past_stops_at_the_present(tmp_path, trace):
    """gdb's record-full log ends at the live point: `continue` at step 3 in the past ran the
    replica on past the present (step 6) to the script's end, steps 6-11 unchecked and shown as
    the past, and the live run then printed them again (each of the script's lines twice)."""
    r = nndb("run", "--batch", "--nx", "--trace", trace, "-e", "until 6", "-e", "rs 3", "-e", "continue",
             "-e", 'p ("AT", $step)', "-e", "goto 6", "-e", "next", "-e", 'p ("THEN", $step)',
             example("mlp.py"), "--steps", "12", cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    # (the past prints what it runs, steps 3-5, up to the present; the live run the rest, once)
    printed = [int(n) for n in re.findall(r"^step (\d+) loss", r.stdout, re.M)]
    assert printed == [*range(6), 3, 4, 5, *range(6, 12)], r.stdout
    said = "No more reverse-execution history: the past ends at step 6, the present."
    assert r.stdout.count(said) == 2, r.stdout          # (run up to it, and typed there: 'goto 6', 'next')
    assert "('AT', 6)" in r.stdout and "('THEN', 6)" in r.stdout
    assert r.stdout.count("Back in the present (timeline 0): step 6.") == 2
    assert "the script ended on this timeline" not in r.stdout


def test_continue_in_the_past_after_the_run_ended_runs_to_the_scripts_end(tmp_path, trace):
    """Once the run has ended its recorded past goes on to the script's end (the run's last
    lines included), not only to its last step's end."""
    r = nndb("run", "--batch", "--nx", "--trace", trace, "-e", "continue", "-e", "goto 8", "-e", "continue",
             "-e", 'p ("END", $step)', example("mlp.py"), "--steps", "12", cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    printed = [int(n) for n in re.findall(r"^step (\d+) loss", r.stdout, re.M)]
    assert printed == [*range(12), 8, 9, 10, 11], r.stdout
    assert "nndb: the script ended on this timeline (finished); back to the present." in r.stdout
    assert "No more reverse-execution history" not in r.stdout and "('END', 11)" in r.stdout


INTERRUPTED_AT_10 = textwrap.dedent('''
    import os, signal, torch
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 1)
    o = torch.optim.SGD(m.parameters(), lr=0.1)
    x, y = torch.randn(60, 4), torch.randn(60, 1)
    for s in range(30):
        i = s % 10
        loss = ((m(x[6 * i:6 * i + 6]) - y[6 * i:6 * i + 6]) ** 2).mean()
        o.zero_grad()
        loss.backward()
        o.step()
        print("step", s, "loss", repr(loss.item()))
        if s == 10 and not os.path.exists("interrupted"):    # (Ctrl-C from outside: the live run only)
            open("interrupted", "w").close()
            os.kill(os.getpid(), signal.SIGINT)
''')


def test_continue_in_the_past_of_a_run_ctrl_c_ended_stops_at_its_last_step(tmp_path, trace):
    """A run that Ctrl-C ended at step 10 has no past after it: 'continue' at step 2 in
    the past ran the replica on to the script's end (steps 11-29, which the run never
    made, shown as the past); a script's own end is the past's end only where the script
    ended itself (it finished or raised)."""
    script = tmp_path / "train.py"
    script.write_text(INTERRUPTED_AT_10)
    r = nndb("run", "--batch", "--nx", "--trace", trace, "-e", "continue", "-e", "goto 2", "-e", "continue",
             "-e", 'p ("END", $step)', str(script), cwd=str(tmp_path))
    printed = [int(n) for n in re.findall(r"^step (\d+) loss", r.stdout, re.M)]
    # (the past prints from step 2's line, after its end, up to the present's end, before its line)
    assert printed == [*range(11), *range(2, 10)], r.stdout
    assert "No more reverse-execution history: the past ends at step 10, the present." in r.stdout, r.stdout
    assert "('END', 10)" in r.stdout
    with TraceReader(trace) as t:
        assert t.status == "interrupted"


CTRL_C_IN_A_REPLAY = textwrap.dedent('''
    import os, signal, torch, torch.nn as nn
    torch.manual_seed(0)
    m = nn.Linear(4, 1)
    o = torch.optim.SGD(m.parameters(), lr=0.1)
    for s in range(30):
        loss = (m(torch.randn(6, 4)) ** 2).mean()
        o.zero_grad()
        loss.backward()
        o.step()
        print("step", s, "loss", repr(loss.item()), flush=True)
        if s == 5 and os.path.exists("live_went_past_20"):     # (a replay: Ctrl-C at the terminal)
            os.killpg(os.getpgrp(), signal.SIGINT)
        if s == 20:
            open("live_went_past_20", "w").close()
''')


def test_ctrl_c_during_a_goto_replay_in_batch_mode_ends_the_run(tmp_path, trace):
    """Ctrl-C at the terminal while `goto 8` replayed: the replay gave up, then the
    commands after it ran ('AFTER' printed) and `continue` ran the script to its end,
    exit 0, as if no Ctrl-C had come.  It ends the run now, as Ctrl-C at a stop's
    commands does (the script interrupted, the trace closed as such)."""
    script = tmp_path / "train.py"
    script.write_text(CTRL_C_IN_A_REPLAY)
    r = nndb("run", "--batch", "--nx", "--trace", trace, "-e", "until 25", "-e", "goto 8", "-e", "p 'AFTER'",
             "-e", "continue", str(script), cwd=str(tmp_path), start_new_session=True)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "KeyboardInterrupt" in r.stderr and "AFTER" not in r.stdout, r.stdout + r.stderr
    printed = [int(n) for n in re.findall(r"^step (\d+) loss", r.stdout, re.M)]
    assert printed == list(range(25)), r.stdout        # (the replay prints nothing; nothing after the stop at 25)
    with TraceReader(trace) as t:
        assert t.status == "interrupted"


def test_goto_past_the_present_from_the_past_is_refused_as_in_the_present(tmp_path, trace):
    """It ran the replica on to step 9, which the live run (at step 6) had not made, shown as the past."""
    r = nndb("run", "--batch", "--nx", "--trace", trace, "-e", "until 6", "-e", "rs 3", "-e", "goto 9",
             example("mlp.py"), "--steps", "12", cwd=str(tmp_path))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "-e 'goto 9': step 9 has not run yet (the present is step 6): 'present', then 'until 9'" \
        in r.stderr.splitlines(), r.stderr
    assert "In the past (timeline 0): step 9" not in r.stdout


def test_a_goto_forward_in_the_past_cut_short_by_a_breakpoint_says_so(tmp_path, trace):
    """`goto 5` from step 1 in the past runs as `until 5`: breakpoint 1 at step 3 stopped it
    there with only 'Breakpoint 1, step 3 finished', no word of the goto nor of the past,
    and the next command ran at step 3, not 5."""
    r = nndb("run", "--batch", "--nx", "--trace", trace, "-e", "until 6", "-e", "break step 3", "-e", "goto 1",
             "-e", "goto 5", "-e", 'p ("AT", $step)', "-e", "goto 5", "-e", 'p ("THEN", $step)',
             example("mlp.py"), "--steps", "12", cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    hit = r.stdout.split("Breakpoint 1, step 3 finished, loss ")[1].splitlines()
    assert hit[1] == ("  (in the past (timeline 0): 'goto 5' stopped on the way, short of step 5; "
                      "'goto 5' again goes on)"), r.stdout
    assert "('AT', 3)" in r.stdout and "('THEN', 5)" in r.stdout
    assert "In the past (timeline 0): step 5 finished" in r.stdout
    assert r.stdout.count("stopped on the way") == 1


def _in_the_past(tmp_path, lines: list) -> tuple:
    """A batch run of mlp.py (12 steps) with ``lines`` as -e: the script's
    lines and, of its one stop in the past, the stop line's words and what the
    commands there printed."""
    argv = ["run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "t.h5"), "--force",
            *[a for line in lines for a in ("-e", line)], example("mlp.py"), "--steps", "12"]
    r = Ran(nndb(*argv, cwd=str(tmp_path)), argv)
    assert r.returncode == 0 and "In the past (timeline 0): " in r.stdout, r.stdout + r.stderr
    stop, _, rest = r.stdout.split("In the past (timeline 0): ", 1)[1].partition("\n")
    assert "Back in the present (timeline 0): step 7." in rest, r.stdout
    printed = rest.split("Back in the present")[0].splitlines()
    return _script_lines(r.stdout), stop, [line for line in printed if not line.startswith(("> ", "-> "))]


def test_a_travel_in_a_breakpoints_commands_runs_the_rest_of_them_in_the_past(tmp_path):
    """`rs 3` in a `commands` block went to step 4 and came straight back: the
    commands after it ran in the present under the past's stop line (`p $step`
    printed 7, `p $loss` step 7's loss).  They run in the past now, as the
    same commands do at the top level."""
    for travel, step in (("rs 3", 4), ("goto 2", 2)):
        block = _in_the_past(tmp_path, ["break step 7", "commands 1", travel, "p $step", "p $loss", "end"])
        top = _in_the_past(tmp_path, ["until 7", travel, "p $step", "p $loss"])
        for script, stop, printed in (block, top):
            assert stop.startswith(f"step {step} finished"), stop
            assert printed[0] == str(step) and float(printed[1]) == float(script[step]), printed
            assert sorted(script) == list(range(12))        # the live run went on from step 7 to its end



def test_a_goto_forward_in_a_breakpoints_commands_runs_the_rest_of_them_where_it_stops(tmp_path):
    """After a `goto` back, a `goto` forward in the past (to a later past step, or to the
    present's) in the same `commands` block resumed the replica as `continue` does, and the rest
    of the block was dropped unsaid: `goto 4` then `p $step` printed nothing, the past handed back
    to the present and the run went on (an HF Trainer session's `goto 5`, `goto 8`, then `predict 3`
    and `replay --verify`: none of them ran).  They run where the goto stops, as after a goto back."""
    argv = ["run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "t.h5"),
            *[a for line in ["tbreak step 7", "commands 1", "goto 2", "goto 4", "p $step", "p $loss", "goto 7",
                             "p $step", "p 'after'", "end"] for a in ("-e", line)], example("mlp.py"), "--steps", "12"]
    r = Ran(nndb(*argv, cwd=str(tmp_path)), argv)
    assert r.returncode == 0, r.stdout + r.stderr
    script = _script_lines(r.stdout)
    assert sorted(script) == list(range(12)), r.stdout       # the live run went on from step 7 to its end
    past = r.stdout.split("In the past (timeline 0): step 4 finished", 1)[1].split("Back in the present")[0]
    printed = [line for line in past.splitlines()[1:] if not line.startswith(("> ", "-> ", "step ", "In the past"))]
    assert printed == ["4", repr(float(script[4])), "7", "'after'"], r.stdout
    assert "In the past (timeline 0): step 7 finished" in past, r.stdout

# minGPT's Trainer.run: the stop is in a method's frame (self.loss, self.model), and the
# expressions typed there loop over layer names.
IN_A_METHOD = '''
import torch, torch.nn as nn
torch.manual_seed(0)
class Trainer:
    def run(self):
        self.model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        for step in range(4):
            self.loss = self.model(torch.randn(16, 4)).pow(2).mean()
            opt.zero_grad()
            self.loss.backward()
            opt.step()
            print("step", step, "loss", repr(self.loss.item()))
Trainer().run()
'''


def test_comprehensions_and_lambdas_see_nndbs_variables_and_the_frames(tmp_path):
    """'p {k: $update[k].norm for k in names}' said "NameError: name '__nndb_vars__' is not
    defined" (a comprehension's scope sees only the globals, and nndb's variables were in the
    locals), and so did 'break if any($loss < v for v in ...)' at every step; 'p [self.loss.item()
    for _ in ...]' in a method's frame: name 'self' is not defined."""
    script = tmp_path / "trainer.py"
    script.write_text(IN_A_METHOD)
    names = '["0.weight", "2.weight"]'
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "t.h5"), "-e", "break step 1", "-e", "continue",
                 "-e", f"p [abs($grad[k].norm - self.model.get_parameter(k).grad.norm().item()) < 1e-6 * $grad[k].norm "
                       f"for k in {names}]",
                 "-e", "p [self.loss.item() for _ in range(2)], (lambda: $step)()",
                 "-e", f"py norms = {{k: $weight[k].norm for k in {names}}}", "-e", "p sorted(norms)",
                 "-e", "delete 1", "-e", "break if any($loss < v for v in [-1.0, 0.0])", "-e", "continue",
                 str(script), cwd=str(tmp_path)), [])
    assert "Error" not in r.stdout + r.stderr, r.stdout + r.stderr
    printed = _script_lines(r.stdout)
    assert "[True, True]" in r.stdout, r.stdout
    assert f"([{printed[1]}, {printed[1]}], 1)" in r.stdout, r.stdout
    assert "['0.weight', '2.weight']" in r.stdout
    assert r.returncode == 0 and set(printed) == {0, 1, 2, 3}       # the condition never held


def test_dollar_variables_in_f_strings_of_either_quote(tmp_path):
    """"p f'step {$step}'" said "syntax error in ...: f-string: unmatched '['": $step became
    __nndb_vars__['step'], whose quotes ended the f-string (Python before 3.12)."""
    script = tmp_path / "trainer.py"
    script.write_text(IN_A_METHOD)
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "t.h5"), "-e", "break step 1", "-e", "continue",
                 "-e", "p f'step {$step} loss {$loss!r}'", "-e", 'p f"{$update[\'0.weight\'].norm > 0}"',
                 "-e", "display f'at {$step}'", "-e", "continue", str(script), cwd=str(tmp_path)), [])
    printed = _script_lines(r.stdout)
    assert f"'step 1 loss {printed[1]}'" in r.stdout, r.stdout + r.stderr
    assert "'True'" in r.stdout and "1: f'at {$step}' = 'at 1'" in r.stdout, r.stdout + r.stderr
    assert r.returncode == 0, r.stderr



def test_a_dollar_in_a_string_literal_is_the_strings_own(tmp_path):
    """'p "cost $step"' printed 'cost __nndb_vars__.step': every $name was rewritten as a
    convenience variable, inside a plain string literal too, where gdb ('print "cost $x"')
    prints the string as written.  The f-string's replacement fields are code and still
    take them; a statement's strings ('!') and a display's keep theirs as well."""
    script = tmp_path / "trainer.py"
    script.write_text(IN_A_METHOD)
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "t.h5"), "-e", "break step 1", "-e", "continue",
                 "-e", 'p "cost $step", $step', "-e", "p f'{{$step}} {$step:>3} {\"$loss\"}' + r'$x'",
                 "-e", '!print("printed $step")', "-e", 'display "at $step"', "-e", "continue",
                 str(script), cwd=str(tmp_path)), [])
    assert "('cost $step', 1)" in r.stdout, r.stdout + r.stderr
    assert "'{$step}   1 $loss$x'" in r.stdout, r.stdout + r.stderr
    assert "printed $step" in r.stdout and '1: "at $step" = \'at $step\'' in r.stdout, r.stdout + r.stderr
    assert "__nndb_vars__" not in r.stdout + r.stderr and r.returncode == 0, r.stdout + r.stderr

WARNS_EACH_STEP = textwrap.dedent('''
    import warnings
    import torch
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):
        warnings.warn("the script's own warning")    # once under plain Python: once per line
        loss = model(torch.randn(8, 3)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        print("step", step, "loss", repr(loss.item()))
''')


def test_expressions_leave_the_scripts_once_per_line_warnings_shown_once(tmp_path, trace):
    """Each expression nndb compiled ('p', a condition, a display) went through
    warnings.catch_warnings, and every change of Python's filters makes it forget the
    once-per-line warnings it has shown: the VAE tutorial's deprecation warning, once under
    plain Python, came again after every 'p', and at every step under a 'break if' (30 times
    in 30 steps).  The expression's own SyntaxWarning is still one error line."""
    script = tmp_path / "warns.py"
    script.write_text(WARNS_EACH_STEP)
    r = nndb("run", "--batch", "--nx", "-q", "--trace", trace, "-e", "break if $step == 100",
             "-e", "display $step", "-e", "break step 2", "-e", "c", "-e", "p $loss", "-e", "p 1 + 1",
             str(script), cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert set(_script_lines(r.stdout)) == set(range(6)) and "\n2\n" in r.stdout
    assert r.stderr.count("UserWarning: the script's own warning") == 1, r.stderr
    bad = nndb("run", "--batch", "--nx", "-q", "--trace", str(tmp_path / "bad.h5"), "-e", "p step is 1",
               str(script), cwd=str(tmp_path))
    assert bad.returncode == 2 and "Warning" not in bad.stderr, bad.stderr
    assert "syntax error in 'step is 1': \"is\" with a literal" in bad.stderr, bad.stderr


def test_inside_a_step_the_steps_statistics_are_not_measured_not_the_last_steps(tmp_path, trace):
    """At a module stop in step 3, '$step' said 3 and '$loss' 2.309532880783081, step 2's loss (step 3's is
    2.3051798343658447), '$grad' step 2's gradients, with nothing to tell; at the start stop '$loss' was
    None, so 'p $loss > 1' raised a TypeError (exit 2) and a condition on it stopped the run with an error.
    As at a step that was not recorded: not measured, and a comparison with it is false."""
    r = nndb("run", "--batch", "--nx", "-q", "--trace", trace, "-e", "p $loss", "-e", "p $loss > 1",
             "-e", "until 2", "-e", "p $loss", "-e", "break module 0", "-e", "c", "-e", "p $step", "-e", "p $loss",
             "-e", "p $grad['0.weight'].norm", "-e", "p $loss > 1", "-e", "kill",
             example("mlp.py"), "--steps", "6", cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    said = [l for l in r.stdout.splitlines()
            if not l.startswith(("step ", "Step ", "> ", "-> ", "Breakpoint"))]
    assert said == ["not measured", "False", "2.309532880783081", "3", "not measured", "not measured", "False"]
    assert "step 2 loss 2.309532880783081" in r.stdout


def test_run_after_kill_in_batch_starts_the_script_again(tmp_path):
    """'kill' then 'run' in batch mode: the run was killed at step 2 and 'run' and every command after it
    were dropped unsaid (exit 0, one trace), where at the prompt 'run' starts it again; the second run
    stops at the breakpoint too, with the script's own total there (2.164... after steps 0 and 1)."""
    script = tmp_path / "loop.py"
    script.write_text("import torch\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(3, 1)\n"
                      "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nx = torch.randn(8, 3)\ntotal = 0.0\n"
                      "for i in range(4):\n    opt.zero_grad()\n    loss = (model(x) ** 2).mean()\n"
                      "    loss.backward()\n    opt.step()\n    total += loss.item()\n"
                      "    print(f'i={i} total={total!r}')\n")
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "t.h5"), "-e", "break step 2",
                 "-e", "continue", "-e", "kill", "-e", "run", "-e", "p 'again', $step", "-e", "continue",
                 "-e", "p $step, total", str(script), cwd=str(tmp_path)))
    assert r.returncode == 0, r
    printed = re.findall(r"^i=(\d) total=(.*)$", r.stdout, re.M)
    assert [i for i, _ in printed] == ["0", "1", "0", "1", "2", "3"], r
    assert "('again', 0)" in r.stdout, r
    assert f"(2, {printed[1][1]})" in r.stdout, r
    assert (tmp_path / "t-run2.h5").exists()


def test_until_past_the_end_in_batch_mode_says_the_run_ended_before_the_commands_left(tmp_path):
    """In batch mode 'until 50' in a run of 8 steps gave way to the next command with nothing said:
    '-e "p $step"' printed 7, as if the run had stopped there.  The end is said first, as gdb's
    '[Inferior 1 (process N) exited normally]' and nndb's prompt say it."""
    script = tmp_path / "loop.py"
    script.write_text("import torch\nmodel = torch.nn.Linear(3, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                      "for i in range(8):\n    opt.zero_grad()\n    model(torch.ones(2, 3)).sum().backward()\n"
                      "    opt.step()\n")
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "t.h5"), "-e", "until 50", "-e", "p $step",
                 str(script), cwd=str(tmp_path)))
    assert r.returncode == 0, r
    assert r.stdout.splitlines() == ["nndb: the run ended (finished, exit code 0) after 8 step(s); the commands left "
                                     "run at its end", "7"], r


def test_a_script_name_after_kill_is_said_gone_not_undefined(tmp_path):
    """After 'kill' (or the run's end) 'p total' said "NameError: name 'total' is not defined" of a
    variable the script had defined (2.16... at the stop): the line says the script is not stopped
    in a frame, its variables gone; nndb's $step is still there."""
    script = tmp_path / "loop.py"
    script.write_text("import torch\nmodel = torch.nn.Linear(3, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                      "total = 0.0\nfor i in range(3):\n    opt.zero_grad()\n    loss = model(torch.ones(2, 3)).sum()\n"
                      "    loss.backward()\n    opt.step()\n    total += 1.0\n")
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "t.h5"), "-e", "until 1", "-e", "p total",
                 "-e", "kill", "-e", "p $step", "-e", "p total", str(script), cwd=str(tmp_path)))
    assert r.returncode == 2, r
    assert r.stdout.splitlines()[-3:] == ["1.0", "nndb: the run ended (killed, exit code 0) after 2 step(s); the "
                                          "commands left run at its end", "1"], r
    assert r.stderr.strip() == ("-e 'p total': NameError: name 'total' is not defined (the script is not stopped "
                                "in a frame: its variables are gone; nndb's $ variables are left)"), r


PROMPT_CALLS = """\
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 24), nn.Tanh(), nn.Linear(24, 3))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
X = torch.randn(200, 6); Y = torch.randint(0, 3, (200,))
for step in range(8):
    if step == 5:            # a second stage: a new optimizer under the same name
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = X[(step % 5) * 40:(step % 5 + 1) * 40], Y[(step % 5) * 40:(step % 5 + 1) * 40]
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item()!r}")
"""


def test_what_the_prompt_computes_is_not_the_runs(tmp_path):
    """Expressions typed at a stop ran under nndb's recording as if the script had run them:
    'p model(X).sum()' after step 2 went into step 3's activations ('0': count 5760 and norm
    47.76 where the script's batch gives 960 and 18.14), 'p F.cross_entropy(softmax(...), y)'
    fired 'double_softmax at step 3: F.cross_entropy at <nndb>:1' on a healthy script, and a
    torch call at the prompt kept the expression's copy of the script's names alive: after the
    script made a new 'opt', 'info optimizer' listed the dead one too and 'set lr' asked which."""
    script = tmp_path / "stages.py"
    script.write_text(PROMPT_CALLS)
    quiet = Ran(nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "quiet.h5"), str(script),
                     cwd=str(tmp_path)))
    assert quiet.returncode == 0, quiet
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "t.h5"), "-e", "break step 2",
                 "-e", "break step 6", "-e", "continue", "-e", "p model(X).sum()",
                 "-e", "p nn.functional.cross_entropy(torch.softmax(model(X), 1), Y)",
                 "-e", "!z = model(X[:3]).norm()", "-e", "display model(X).shape",
                 "-e", "continue", "-e", "info optimizer", "-e", "set lr 0.02", "-e", "p opt.param_groups[0]['lr']",
                 "-e", "continue", str(script), cwd=str(tmp_path)))
    assert r.returncode == 0, r
    assert _script_lines(r.stdout) == _script_lines(quiet.stdout), r     # (the same run up to the set at step 6)
    assert "double_softmax" not in r.stderr and "warning" not in r.stderr and "error" not in r.stderr, r
    table = r.stdout[r.stdout.index("optimizer    type"):]
    assert len(re.findall(r"^opt\S*\s+Adam\s", table, re.M)) == 1, r
    assert "0.01   0.02" in r.stdout and "\n0.02\n" in r.stdout, r
    with TraceReader(str(tmp_path / "quiet.h5")) as a, TraceReader(str(tmp_path / "t.h5")) as b:
        for name in ("0", "2", "model"):
            for stat in ("count", "norm"):
                want, got = (t.history(t.find(name, "act")[0], stat) for t in (a, b))
                assert np.array_equal(want[0], got[0]) and np.array_equal(want[1], got[1]), (name, stat, want, got)


TENSOR_LR = """\
import torch
torch.manual_seed(0)
m = torch.nn.Linear(4, 1)
opt = torch.optim.Adam(m.parameters(), lr=torch.tensor(0.01))     # (torch's compiled-optimizer recipe)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
for step in range(6):
    loss = m(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    print(f"step {step} lr {opt.param_groups[0]['lr'].item()!r}")
    sched.step()
"""


def test_info_optimizer_shows_a_tensor_lr(tmp_path):
    """A tensor lr (Adam(lr=torch.tensor(0.01)), the lr Hugging Face's AdafactorSchedule writes)
    was left out of 'info optimizer': no lr at all in the row, where 'set lr' took it (was
    0.005).  It is shown by its value, as .item() gives it: the lr step 3 used."""
    script = tmp_path / "tensor_lr.py"
    script.write_text(TENSOR_LR)
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "t.h5"), "-e", "break step 3",
                 "-e", "commands 1", "-e", "info optimizer", "-e", "end", str(script), cwd=str(tmp_path)))
    assert r.returncode == 0, r
    used = re.search(r"^step 3 lr (\S+)$", r.stdout, re.M).group(1)
    assert float(used) == float(np.float32(0.005)), used        # (0.01 halved at step 2, float32)
    row = re.search(r"^opt\s+Adam\s+0\s+2\s+(.*)$", r.stdout, re.M).group(1)
    assert row.startswith(f"lr=tensor({used}), betas=(0.9, 0.999)"), row
    assert f"initial_lr=tensor({float(np.float32(0.01))!r})" in row, row

def test_info_optimizer_shows_a_numpy_lr_as_its_number(tmp_path):
    """DINO writes its cosine schedules' values, numpy float64, into each param group: 'info
    optimizer' read 'lr=np.float64(0.0007515535026209658)', and an np.float32 lr was left out of
    the row.  Both are shown as their Python number, every digit kept."""
    script = tmp_path / "numpy_lr.py"
    script.write_text(textwrap.dedent("""
        import numpy as np, torch
        m = torch.nn.Linear(4, 1)
        opt = torch.optim.AdamW([{"params": [m.weight]}, {"params": [m.bias], "weight_decay": 0.0}])
        lrs = np.linspace(0.0, 0.01, 6)
        for step in range(6):
            opt.param_groups[0]["lr"] = lrs[step]
            opt.param_groups[1]["lr"] = np.float32(lrs[step])
            loss = m(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
        """))
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "t.h5"), "-e", "break step 3",
                 "-e", "commands 1", "-e", "info optimizer", "-e", "end", str(script), cwd=str(tmp_path)))
    assert r.returncode == 0, r
    rows = re.findall(r"^opt\s+AdamW\s+(\d)\s+(?:weight|bias)\s+(.*)$", r.stdout, re.M)    # (a group's one parameter named)
    assert [g for g, _ in rows] == ["0", "1"] and "np." not in r.stdout, r
    assert rows[0][1].startswith(f"lr={float(np.linspace(0.0, 0.01, 6)[3])!r}, "), rows
    assert f"lr={float(np.float32(np.linspace(0.0, 0.01, 6)[3]))!r}" in rows[1][1], rows
    # ('set lr' that the script's schedule undoes: the warning names the lr it stepped with
    # as a number, where it read 'stepped with lr np.float64(0.008) in group 0')
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "t2.h5"), "-e", "break step 3",
                 "-e", "continue", "-e", "set lr 0.5", "-e", "continue", str(script), cwd=str(tmp_path)))
    assert r.returncode == 0 and "np." not in r.stderr, r
    assert f"'set lr 0.5' did not hold: opt stepped with lr {float(np.linspace(0.0, 0.01, 6)[4])!r} in group 0" \
        in r.stderr, r


LOOSE_PARAMETER = """\
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
X = torch.randn(64, 8); Y = torch.randint(0, 4, (64,))
logit_scale = None
for step in range(6):
    if step == 2:            # a learnable temperature, in no module, given to the optimizer mid-run
        logit_scale = nn.Parameter(torch.tensor(0.5))
        opt.add_param_group({"params": [logit_scale], "lr": 0.05})
    out = model(X[step * 8:(step + 1) * 8])
    if logit_scale is not None:
        out = out * logit_scale.exp()
    opt.zero_grad()
    loss = nn.functional.cross_entropy(out, Y[step * 8:(step + 1) * 8])
    loss.backward()
    opt.step()
    if logit_scale is not None:
        print(f"step {step} scale {logit_scale.item()!r} grad {abs(logit_scale.grad.item())!r}")
"""


def test_info_params_lists_an_optimizers_tensor_in_no_module(tmp_path):
    """'stats grad' and 'history' had logit_scale (an nn.Parameter given to the optimizer by
    add_param_group, in no module); 'info params' listed the model's four and not it."""
    script = tmp_path / "loose.py"
    script.write_text(LOOSE_PARAMETER)
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "t.h5"), "-e", "break step 4",
                 "-e", "continue", "-e", "info params", "-e", "continue", str(script), cwd=str(tmp_path)))
    assert r.returncode == 0, r
    scale, grad = re.search(r"^step 4 scale (\S+) grad (\S+)$", r.stdout, re.M).groups()
    row = re.search(r"^logit_scale\s+\(\)\s+float32\s+y\s+(\S+)\s+(\S+)$", r.stdout, re.M)
    assert row, r
    assert float(row.group(1)) == pytest.approx(abs(float(scale)), rel=1e-3), r
    assert float(row.group(2)) == pytest.approx(float(grad), rel=1e-3), r
    assert re.search(r"^0\.weight\s+\(16, 8\)", r.stdout, re.M), r


def test_a_watch_hit_tells_its_value_from_a_threshold_that_rounds_alike(tmp_path):
    """A loss of 10.8447 over a threshold of 10.84 read 'loss mean = 10.84 (>
    10.84)' (build-nanogpt's loss at step 5): the value and the threshold get
    the digits that tell them apart."""
    r = nndb("run", "--batch", "-q", "--trace", str(tmp_path / "t.h5"), "-e", "watch loss loss > 10.84",
             os.path.join(os.path.dirname(__file__), "scripts", "constant_loss.py"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Watchpoint 1: loss mean = 10.845 (> 10.84) at step 0" in r.stdout, r.stdout


NO_MODULE_LOOP = """
import torch
torch.manual_seed(0)
w = torch.zeros(3, requires_grad=True)          # trained by an optimizer, no module called
opt = torch.optim.SGD([w], lr=0.1)
for step in range(4):
    loss = (w - 1).pow(2).sum()
    opt.zero_grad(); loss.backward(); opt.step()
    print("step", step, loss.item())
"""


def test_a_watch_given_with_e_sees_step_0_where_the_start_stop_falls_at_its_end(tmp_path):
    """In a loop whose step calls no module's forward the start stop falls at step 0's end, after
    its points were judged: '-e "watch loss loss > 0"' first hit at step 1 (loss 1.92) where
    step 0's loss, 3.0, held it already.  A watch set there sees step 0; a 'break step 0' set
    there is not hit again (the run is past it), as gdb's breakpoint on the current line."""
    script = tmp_path / "w.py"
    script.write_text(NO_MODULE_LOOP)
    r = nndb("run", "--batch", "-q", "--rules", "none", "--trace", str(tmp_path / "t.h5"),
             "-e", "watch loss loss > 0", "-e", "break step 0", str(script))
    assert r.returncode == 0, r.stderr
    hits = re.findall(r"^Watchpoint 1: loss mean = (\S+) \(> 0\) at step (\d+)$", r.stdout, re.M)
    assert hits == [("3", "0")], r.stdout
    assert "Breakpoint 2, " not in r.stdout, r.stdout
    assert [l for l in r.stdout.splitlines() if l.startswith("step ")] == \
        ["step 0 3.0", "step 1 1.9200000762939453", "step 2 1.2287999391555786", "step 3 0.7864319086074829"]


def test_info_optimizer_names_the_one_parameter_of_an_optimizer_per_parameter(tmp_path):
    """optimizer_step_in_backward_tutorial: an Adam per parameter, stepped in the parameter's
    post-accumulate-grad hook.  'info optimizer' listed adam ... adam4 with '1' param each,
    and 'predict --set' asks for one of them by name ('4 optimizers: say which, as in --set
    adam.lr=0.1'): nothing said which parameter each one steps."""
    script = tmp_path / "in_backward.py"
    script.write_text("import torch, torch.nn as nn\n"
                      "torch.manual_seed(0)\n"
                      "model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))\n"
                      "opts = {p: torch.optim.Adam([p]) for p in model.parameters()}\n"
                      "def hook(q):\n"
                      "    opts[q].step()\n"
                      "    opts[q].zero_grad()\n"
                      "for p in model.parameters():\n"
                      "    p.register_post_accumulate_grad_hook(hook)\n"
                      "for i in range(3):\n"
                      "    model(torch.randn(5, 4)).square().mean().backward()\n")
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--trace", str(tmp_path / "t.h5"), "-e", "break step 1",
                 "-e", "continue", "-e", "info optimizer", "-e", "kill", str(script), cwd=str(tmp_path)))
    assert r.returncode == 0, r
    rows = [line.split()[:4] for line in r.stdout.splitlines() if re.match(r"adam\d*\s", line)]
    assert sorted(p for _, _, _, p in rows) == ["0.bias", "0.weight", "2.bias", "2.weight"], r


# Two models, each called by the script (a body and a head), one checkpointed
# (reentrant: its layers' forward runs again inside the backward): their names are
# qualified by the models' variables ('body.2') once step 0 ends.
TWO_MODELS = textwrap.dedent('''
    import torch, torch.nn as nn
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0)
    pre = nn.Linear(8, 8)
    body = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    head = nn.Linear(8, 1)
    opt = torch.optim.SGD([*pre.parameters(), *body.parameters(), *head.parameters()], lr=0.1)
    for step in range(4):
        loss = head(checkpoint(body, pre(torch.randn(4, 8)), use_reentrant=True)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        print("step", step)
''')


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_a_module_break_in_one_of_several_models_stops_at_every_step(tmp_path, phase):
    """'break module body.2 backward' never stopped: the stop's name of a module, cached as
    step 0's backward met it ('2': names are qualified by the model's variable as step 0 ends)
    was kept for the whole run; the forward one ('2' in step 0's forward) stopped from step 1
    on.  Both stop at step 0 to 3 now."""
    hits, r = _module_break_hits(tmp_path, TWO_MODELS, f"body.2 {phase}")
    # (reentrant checkpointing runs the forward twice a step: without gradients, then again in the backward)
    assert hits == ([0, 0, 1, 1, 2, 2, 3, 3] if phase == "forward" else [0, 1, 2, 3]), r.stdout


def _module_break_hits(tmp_path, source: str, point: str):
    """The steps at which 'break module POINT' stopped a run of ``source``, and the run."""
    (tmp_path / "s.py").write_text(source)
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--rules", "none", "--trace", str(tmp_path / "t.h5"),
                 "-e", f"break module {point}", "-e", "commands 1", "-e", "silent",
                 "-e", 'p ("HIT", $step)', "-e", "continue", "-e", "end", "-e", "continue", "s.py",
                 cwd=str(tmp_path)), [])
    return [int(s) for s in re.findall(r"\('HIT', (\d+)\)", r.stdout)], r


# One model, whose names stay unqualified ('encoder.1'), and a module stop point written
# as the script writes the module, through the model's variable ('model.encoder.1', as
# 'model.bert.encoder.layer.0.attention' for a Hugging Face model held in 'model').
ONE_MODEL = textwrap.dedent('''
    import torch, torch.nn as nn
    torch.manual_seed(0)
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
            self.head = nn.Linear(8, 1)
        def forward(self, x):
            return self.head(self.encoder(x))
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        print("step", step)
''')


@pytest.mark.parametrize("glob", ["model.encoder.1", "encoder.1"])
@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_a_module_break_through_the_models_variable_stops_at_every_step(tmp_path, glob, phase):
    """'break module model.encoder.1' in a run of one model stopped at step 0 and never
    again: in step 0 it matched the name the module would have had were the names
    qualified, and they stayed unqualified ('encoder.1') as step 0 ended.  It stops at
    every step now, as 'break module encoder.1' does, and is not said to be pending."""
    hits, r = _module_break_hits(tmp_path, ONE_MODEL, f"{glob} {phase}")
    assert hits == [0, 1, 2, 3], r.stdout
    assert "pending" not in r.stdout + r.stderr, r


def test_a_module_break_through_the_models_variable_is_not_pending_when_the_run_ends_first(tmp_path):
    """'break module model.2' set at step 1 of mlp.py (its model a local of main()), killed
    there, was said to be 'still pending at the end of the run: no module matched', the model
    gone by then; 'model.9' still is."""
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--rules", "none", "--trace", str(tmp_path / "t.h5"),
                 "-e", "until 1", "-e", "break module model.2", "-e", "break module model.9",
                 "-e", "kill", example("mlp.py"), "--steps", "3", cwd=str(tmp_path)), [])
    assert "No module matches 'model.2'" not in r.stdout, r.stdout
    assert "no module matched 'model.9'" in r.stderr and "'model.2'" not in r.stderr, r.stderr


LOSS_MODULE = textwrap.dedent('''
    import torch, torch.nn as nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    crit = nn.MSELoss()
    for step in range(3):
        loss = crit(model(torch.randn(4, 4)), torch.randn(4, 1))
        opt.zero_grad(); loss.backward(); opt.step()
        print("step", step)
''')


def test_the_backward_of_modules_called_before_a_forward_stop_is_still_stopped_in(tmp_path):
    """At a stop in the loss module's forward (step 0), 'break module 0 backward' then 'c'
    stopped at step 1's, and 'step' went from crit's backward to the end of step 0: the
    modules' backward is watched from their forward, and the model's forward had run unwatched
    (only a backward breakpoint or 'step' turned it on).  Both stop in step 0's backward now."""
    (tmp_path / "s.py").write_text(LOSS_MODULE)
    run = ["run", "--batch", "-q", "--nx", "--rules", "none", "--force", "--trace", str(tmp_path / "t.h5"),
           "-e", "tbreak module crit", "-e", "c"]
    r = Ran(nndb(*run, "-e", "break module 0 backward", "-e", "c", "-e", "kill", "s.py", cwd=str(tmp_path)), [])
    assert re.findall(r"^Breakpoint 2, .*$", r.stdout, re.M) == ["Breakpoint 2, module 0 backward (step 0)"], r.stdout
    r = Ran(nndb(*run, "-e", "step", "-e", "step", "-e", "step", "-e", "kill", "s.py", cwd=str(tmp_path)), [])
    assert re.findall(r"^Step .*$", r.stdout, re.M) == [
        "Step 0, module crit backward", "Step 0, module 2 backward", "Step 0, module model backward"], r.stdout


# A seq2seq's encoder, a GRU whose output the script drops (`_, h = encoder(x)`: only the last
# hidden state goes to the decoder), and a decoder that returns (log-probabilities, hidden),
# called at each time step.
ENCODER_HIDDEN = textwrap.dedent('''
    import torch, torch.nn as nn
    torch.manual_seed(0)
    encoder = nn.GRU(4, 8, batch_first=True)
    decoder = nn.GRUCell(8, 8)
    head = nn.Linear(8, 3)
    class Dec(nn.Module):
        def __init__(self):
            super().__init__()
            self.cell, self.out = decoder, head
        def forward(self, h):
            h = self.cell(h, h)
            return self.out(h).log_softmax(-1), h
    dec = Dec()
    opt = torch.optim.SGD([*encoder.parameters(), *dec.parameters()], lr=0.1)
    for step in range(3):
        _, h = encoder(torch.randn(2, 5, 4))
        h, loss = h[0], 0
        for t in range(2):
            logp, h = dec(h)
            loss = loss - logp[:, 0].mean()
        opt.zero_grad(); loss.backward(); opt.step()
        print("step", step)
''')


def test_a_backward_break_on_a_module_whose_first_output_the_loss_does_not_use_stops(tmp_path):
    """'break module encoder backward' on a GRU whose output the script drops for its last
    hidden state never stopped (nor did 'step' into it): the stop watched the module's first
    output's gradient alone, which never comes.  It stops at every step, $grad_output the
    gradients of the module's outputs as PyTorch's backward hooks give them (None where no
    gradient reached one: the encoder's dropped output)."""
    hits, r = _module_break_hits(tmp_path, ENCODER_HIDDEN, "encoder backward")
    assert hits == [0, 1, 2], r.stdout
    (tmp_path / "s.py").write_text(ENCODER_HIDDEN)
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--rules", "none", "--trace", str(tmp_path / "t2.h5"),
                 "-e", "tbreak module encoder backward", "-e", "tbreak module dec backward",
                 "-e", "continue", "-e", "p [None if g is None else tuple(g.shape) for g in $grad_output]",
                 "-e", "continue", "-e", "p [None if g is None else tuple(g.shape) for g in $grad_output]",
                 "-e", "kill", "s.py", cwd=str(tmp_path)), [])
    stops = re.findall(r"^Temporary breakpoint (\d), module (\S+) backward \(step 0\)\n.*\n.*\n(.*)$", r.stdout, re.M)
    assert stops == [("2", "dec", "[(2, 3), (2, 8)]"), ("1", "encoder", "[None, (1, 2, 8)]")], r.stdout


# A module the step calls twice, the first module to run: the run's start stop is before its
# first call ('module enc is about to run its forward'), where a batch run's -e and -x commands run.
TWICE_FIRST = textwrap.dedent('''
    import torch, torch.nn as nn
    torch.manual_seed(0)
    enc, head = nn.Linear(4, 4), nn.Linear(8, 1)
    opt = torch.optim.SGD(list(enc.parameters()) + list(head.parameters()), lr=0.1)
    for step in range(4):
        a, b = torch.randn(8, 4), torch.randn(8, 4)
        print("FIRST", step, round(a[0, 0].item(), 5))
        loss = head(torch.cat([enc(a), enc(b)], 1)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
''')


def test_a_module_break_set_at_the_start_stop_stops_at_the_call_it_is_before(tmp_path):
    """'break module enc' then 'continue' from the start stop (a batch run's -e commands), where
    enc, called twice a step, is the module about to run: the run went on to enc's second call of
    step 0, its first never stopped at (hits 0, 1, 1, 2, 2 ...; the first stop's input was b's).
    It stops at both calls of every step, the first at step 0's first call, on a's input."""
    (tmp_path / "s.py").write_text(TWICE_FIRST)
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--rules", "none", "--trace", str(tmp_path / "t.h5"),
                 "-e", "break module enc", "-e", "commands 1", "-e", "silent",
                 "-e", 'p ("HIT", $step, round($inputs[0][0, 0].item(), 5))', "-e", "continue", "-e", "end",
                 "-e", "continue", "s.py", cwd=str(tmp_path)), [])
    assert r.returncode == 0, r.stderr
    hits = re.findall(r"\('HIT', (\d+), (-?[\d.]+)\)", r.stdout)
    assert [int(s) for s, _ in hits] == [0, 0, 1, 1, 2, 2, 3, 3], r.stdout
    firsts = dict(re.findall(r"FIRST (\d+) (-?[\d.]+)", r.stdout))
    assert [v for s, v in hits[::2]] == [firsts[str(k)] for k in range(4)], r.stdout


def test_reverse_continue_from_a_module_hit_in_the_live_run_goes_to_the_same_steps_earlier_call(tmp_path):
    """rc from the live run's stop at enc's second call of step 2 went to step 1's second call,
    skipping step 2's first (the search looked at the steps before the one in progress only;
    from a stop in the past it looked at the step's earlier hits first). gdb's
    reverse-continue goes to the last earlier hit: step 2's first call, then step 1's second,
    then its first."""
    (tmp_path / "s.py").write_text(TWICE_FIRST)
    show = 'p ("AT", $step, round($inputs[0][0, 0].item(), 5))'
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--rules", "none", "--trace", str(tmp_path / "t.h5"),
                 "-e", "break module enc", *["-e", "continue"] * 6, "-e", show,
                 *[x for _ in range(3) for x in ("-e", "reverse-continue", "-e", show)], "s.py",
                 cwd=str(tmp_path)), [])
    assert r.returncode == 0, r.stderr
    firsts = {int(k): v for k, v in re.findall(r"FIRST (\d+) (-?[\d.]+)", r.stdout)}
    at = [(int(s), v) for s, v in re.findall(r"\('AT', (\d+), (-?[\d.]+)\)", r.stdout)]
    assert [s for s, _ in at] == [2, 2, 1, 1], r.stdout
    # the second call's input is not the first's; the first calls' are the script's prints
    assert at[0][1] != firsts[2] and at[1][1] == firsts[2] and at[2][1] != firsts[1] \
        and at[3][1] == firsts[1], (at, firsts)


def test_reverse_step_from_a_module_hit_in_the_live_run_stops_at_the_same_steps_earlier_call(tmp_path):
    """'rs 1' from the live run's stop at enc's second call of step 2 went to the end of step 1,
    past step 2's first call, where a breakpoint held on the way (gdb's reverse-step stops
    there, as nndb's rc does): it stops at step 2's first call, on its input."""
    (tmp_path / "s.py").write_text(TWICE_FIRST)
    show = 'p ("AT", $step, round($inputs[0][0, 0].item(), 5))'
    r = Ran(nndb("run", "--batch", "-q", "--nx", "--rules", "none", "--trace", str(tmp_path / "t.h5"),
                 "-e", "break module enc", *["-e", "continue"] * 6, "-e", show, "-e", "rs 1", "-e", show,
                 "s.py", cwd=str(tmp_path)), [])
    assert r.returncode == 0, r.stderr
    firsts = {int(k): v for k, v in re.findall(r"FIRST (\d+) (-?[\d.]+)", r.stdout)}
    at = [(int(s), v) for s, v in re.findall(r"\('AT', (\d+), (-?[\d.]+)\)", r.stdout)]
    assert [s for s, _ in at] == [2, 2] and at[0][1] != firsts[2] and at[1][1] == firsts[2], (at, r.stdout)
