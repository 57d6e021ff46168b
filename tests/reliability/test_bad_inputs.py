"""Bad input is one line and a documented exit code (issue 20): rule files
that are binary, tagged, huge or out of range; --lineage steps that mean
nothing; a binary script; nndb check on a script that ends its own process
or raises KeyboardInterrupt itself."""
import json
import os
import textwrap

import pytest

from conftest import nndb
from nndb.errors import UsageError
from nndb.rules.catalog import load

# -- rule files (in-process: the loader; one end-to-end run for the exit code) ---------------

RULE_FILES = {
    "nul": (b"rules:\n  - id: stale_grad\0\n", 2, "NUL"),
    "tag": (b"rules:\n  - id: stale_grad\n    action: !foo warn\n", 3, "unknown tag !foo"),
    "tag_on_list": (b"rules: !foo\n  - id: stale_grad\n", 1, "unknown tag !foo"),
    "python_name": (b"default: !!python/name:os.system all\n", 1, "unknown tag !!python/name:os.system"),
    "python_object": (b"rules:\n  - !!python/object/apply:os.system [echo hi]\n", 2, "unknown tag"),
    "control_char": (b"rules:\n  - id: stale_grad\n    \x01action: warn\n", 3, "U+0001"),
    "not_utf8": (b"rules:\n  - id: \xff\xfe\n", 2, "not UTF-8"),
    "inf": (b"rules:\n  - id: stale_grad\n    thresholds: {steps: .inf}\n", 3, "finite number"),
    "negative": (b"rules:\n  - id: exploding_gradient\n    thresholds: {ceiling: -1}\n", 3, "finite number"),
    "fraction_of_a_step": (b"rules:\n  - id: stale_grad\n    thresholds: {steps: 2.5}\n", 3, "whole number"),
    "deep": (b"rules: " + b"[" * 50000 + b"\n", 1, "YAML"),
}


@pytest.mark.parametrize("name", sorted(RULE_FILES))
def test_a_bad_rule_file_is_file_line_message(tmp_path, name):
    data, line, what = RULE_FILES[name]
    p = tmp_path / f"{name}.yaml"
    p.write_bytes(data)
    with pytest.raises(UsageError) as e:
        load(str(p))
    msg = str(e.value)
    assert msg.startswith(f"{p}:{line}: "), msg
    assert what in msg and "\n" not in msg


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_an_endless_rule_file_is_refused_at_once(device):
    import time
    t0 = time.monotonic()
    with pytest.raises(UsageError, match=f"^{device}:1: .*larger than"):
        load(device)
    assert time.monotonic() - t0 < 10


def test_a_rule_file_with_a_tag_is_exit_2_in_one_line(tmp_path):
    (tmp_path / "s.py").write_text("print('ran')\n")
    (tmp_path / "r.yaml").write_text("default: !!python/name:os.system all\n")
    r = nndb("run", "--batch", "--rules", "r.yaml", "s.py", cwd=str(tmp_path))
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == "nndb: error: r.yaml:1: unknown tag !!python/name:os.system " \
                               "(a rule file has plain values, lists and mappings only)"
    assert r.stdout == ""


# -- command-line values -------------------------------------------------------------------------

@pytest.mark.parametrize("steps,what", [("-5", "count from 0"), ("5:2", "holds no step"), ("3:3", "holds no step"),
                                        ("1,-2:4", "count from 0")])
def test_lineage_steps_that_mean_nothing_are_refused(steps, what):
    from nndb.errors import CommandError
    from nndb.lineage.control import parse_steps
    with pytest.raises(CommandError, match=what):
        parse_steps(steps)


def test_lineage_refusal_is_exit_2_before_the_script(tmp_path):
    (tmp_path / "s.py").write_text("print('ran')\n")
    r = nndb("run", "--batch", "--lineage", "5:2", "s.py", cwd=str(tmp_path))
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr.strip().count("\n") == 0 and "5:2" in r.stderr


@pytest.mark.parametrize("content", [b"\xff\xfe\x80\x81 garbage", b"# -*- coding: nope -*-\nx = 1\n"])
def test_a_script_that_cannot_be_decoded_names_no_line_none(tmp_path, content):
    from nndb.run.launcher import Target, prepare
    p = tmp_path / "x.py"
    p.write_bytes(content)
    with pytest.raises(UsageError) as e:
        prepare(Target(path=str(p)))
    assert "is not a Python script" in str(e.value)
    assert "None" not in str(e.value), str(e.value)


# -- nndb check on scripts that end themselves -------------------------------------------------

CHECK_SCRIPT = """\
import os, signal, torch
torch.manual_seed(0)
m = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for step in range(5):
    loss = torch.nn.functional.cross_entropy(m(torch.randn(8, 4)), torch.randint(0, 2, (8,)))
    opt.zero_grad(); loss.backward(); opt.step()
    if step == 0:
        {END}
"""


def check_of(tmp_path, end: str, *args):
    (tmp_path / "s.py").write_text(textwrap.dedent(CHECK_SCRIPT).replace("{END}", end))
    return nndb("check", *args, "s.py", cwd=str(tmp_path))


@pytest.mark.parametrize("end,what", [("os._exit(5)", "status 5"),
                                      ("os.kill(os.getpid(), signal.SIGKILL)", "SIGKILL")])
def test_check_of_a_script_that_ends_its_process_prints_a_fail_line(tmp_path, end, what):
    r = check_of(tmp_path, end, "--json")
    assert r.returncode == 1, (r.stdout, r.stderr)
    report = json.loads(r.stdout)
    run = report["checks"][0]
    assert run["name"] == "run" and run["status"] == "FAIL" and what in run["evidence"], run
    assert "in step 1" in run["evidence"]
    assert [c["status"] for c in report["checks"][1:]] == ["SKIP"] * 8


def test_check_of_a_script_that_raises_keyboard_interrupt_is_a_fail_line(tmp_path):
    r = check_of(tmp_path, "raise KeyboardInterrupt")
    assert r.returncode == 1, (r.stdout, r.stderr)
    run = [l for l in r.stdout.splitlines() if l.startswith("FAIL  run")]
    assert len(run) == 1 and "KeyboardInterrupt, raised by the script at s.py:9" in run[0], r.stdout
    assert "interrupted" not in r.stderr


def test_an_infinite_threshold_at_the_prompt_is_refused(tmp_path):
    """`rule threshold` checks the range as the rule file does (inf turned the rule off)."""
    from conftest import example, run_in_process
    from nndb.frontends.batch import ScriptedFrontend
    fe = ScriptedFrontend([])
    res = run_in_process(tmp_path, example("mlp.py"), args=("--steps", "1"), frontend=fe,
                         commands=("rule threshold stale_grad steps inf",))
    assert "threshold steps of stale_grad must be a finite number >= 0, not inf" in fe.text, fe.text
    assert res.session.rules.rule("stale_grad").params["steps"] == 2      # unchanged
    assert res.exit_code == 2                 # (a startup command that fails ends a batch run)


def test_ctrl_c_still_ends_the_check_with_130(tmp_path):
    """The user's Ctrl-C (SIGINT to the process group, as a terminal sends it) is not the script's."""
    import signal
    from conftest import nndb_started
    (tmp_path / "s.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(120)\n")
    p = nndb_started("check", "s.py", cwd=str(tmp_path), start_new_session=True)
    try:
        assert p.stdout.readline() == "started\n"
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130 and err.strip() == "nndb: check interrupted", (out, err)


@pytest.mark.parametrize("argv,said", [
    (["run", "--bogus", "ok.py"], "nndb: error: No such option '--bogus'."),
    (["run", "--batc", "ok.py"], "No such option '--batc'. (Did you mean one of: '--batch'"),
    (["check", "--step=3", "ok.py"], "No such option '--step'. Did you mean '--steps'?"),
    (["fuzz", "--step", "1", "--budgt", "3", "ok.py"], "No such option '--budgt'. Did you mean '--budget'?"),
    (["run", "--flush-secs", "nan", "ok.py"], "Invalid value for '--flush-secs': 'nan' is not a number."),
    (["fuzz", "--step", "1", "--tolerance", "nan", "ok.py"], "Invalid value for '--tolerance': 'nan' is not a number."),
])
def test_an_unknown_option_or_a_nan_before_script_is_clicks_usage_error(tmp_path, argv, said):
    """Issue 41: an unknown option before SCRIPT was taken for it ('no such
    file: --bogus'); --flush-secs nan was accepted."""
    (tmp_path / "ok.py").write_text("open('ran.txt', 'w').write('ran')\n")
    r = nndb(*argv, cwd=str(tmp_path))
    assert r.returncode == 2 and said in r.stderr and "no such file" not in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("nndb: error: ")         # one line
    assert not (tmp_path / "ran.txt").exists()


@pytest.mark.parametrize("content,line", [(b"\x80\x81\xfe\xffabc\n\xc3", 1), (b"x = 1\n# caf\xe9\n", 2)])
def test_a_binary_file_without_nul_is_said_in_pythons_words(tmp_path, content, line):
    """Issue 41: 'invalid or missing encoding declaration' for a file that
    declares none; Python says what is wrong with it."""
    from conftest import python
    (tmp_path / "b.py").write_bytes(content)
    plain = python("b.py", cwd=str(tmp_path))
    said = plain.stderr.strip().splitlines()[-1]
    assert said.startswith("SyntaxError: Non-UTF-8 code starting with") and f"on line {line}" in said
    r = nndb("run", "--batch", "b.py", cwd=str(tmp_path))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    words = said[len("SyntaxError: "):].replace(f" in file {tmp_path / 'b.py'}", "")
    assert r.stderr == f"nndb: error: b.py is not a Python script: {words}\n"
