"""The YAML rule file (--rules FILE.yaml), the condition language of the
rules it defines, and the rule commands at the prompt (info rules, rule ...)."""
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import example, nndb, run_in_process
from nndb.run.config import RunConfig
from nndb.driver import DebugOptions, debug
from nndb.frontends.batch import ScriptedFrontend
from nndb.errors import UsageError
from nndb.run.launcher import Target
from nndb.rules.base import STAT_INDEX, StepContext
from nndb.rules.catalog import default_rules, load
from nndb.rules.condition import Condition, ConditionError
from nndb.rules.yamlfile import CustomRule, load_file
from nndb.text import fmt


def rules_file(tmp_path, text: str, name="rules.yaml") -> str:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text).lstrip("\n"))
    return str(p)


# -- the schema -----------------------------------------------------------------------------------
def test_builtin_rules_are_changed_and_new_rules_added(tmp_path):
    path = rules_file(tmp_path, """
        rules:
          - id: stale_grad              # a built-in: change it
            action: fail
            severity: warning
            thresholds: {steps: 3, tol: 1e-4}
          - id: grad_none
            enabled: false
          - name: gradient_check        # a new rule
            condition: max(grad.norm) > 1e3
            action: stop
            severity: info
            message: "some gradient norm above 1e3"
          - name: quiet.one
            condition: loss.mean > 10
        """)
    rules = {r.id: r for r in load(path).rules}
    assert list(rules)[:len(default_rules())] == [r.id for r in default_rules()]    # catalog order, then new
    s = rules["stale_grad"]
    assert (s.action, s.severity, s.enabled) == ("fail", "warning", True)
    assert s.params == {"steps": 3, "tol": 1e-4, "min_share": 0.05}
    assert isinstance(s.params["steps"], int)
    assert rules["grad_none"].enabled is False
    g = rules["gradient_check"]
    assert isinstance(g, CustomRule) and (g.action, g.severity, g.message) == \
        ("stop", "info", "some gradient norm above 1e3")
    q = rules["quiet.one"]
    assert (q.action, q.severity, q.enabled) == ("warn", "warning", True)
    assert q.describe()["condition"] == "loss.mean > 10"
    # the other built-ins keep their defaults
    assert rules["nonfinite"].action == "warn" and rules["nonfinite"].enabled


def test_default_none_starts_from_no_rule(tmp_path):
    path = rules_file(tmp_path, """
        default: none
        rules:
          - id: grad_none
          - name: mine
            condition: step > 1
        """)
    assert [r.id for r in load(path).rules] == ["grad_none", "mine"]
    assert [r.id for r in load(rules_file(tmp_path, "default: none\n", "n.yaml")).rules] == []
    # an empty file (or only comments) is the built-in set with its defaults
    assert [r.id for r in load(rules_file(tmp_path, "# nothing\n", "e.yaml")).rules] == \
        [r.id for r in default_rules()]


ERRORS = [
    ("rules:\n  - id: stale_grad\n    action: [warn\n", 4, "YAML syntax error"),
    ("rules:\n  - id: nope\n", 2, "unknown rule id 'nope' (built-in rules: "),
    ("rules:\n  - id: grad_none\n    colour: red\n", 3,
     "a built-in rule: unknown key 'colour' (there are: id, enabled, action, severity, thresholds)"),
    ("rulez: []\n", 1, "the rule file: unknown key 'rulez' (there are: default, rules)"),
    ("default: some\n", 1, "unknown default 'some' (one of: all, default, none)"),
    ("rules:\n\n  - id: grad_none\n    action: explode\n", 4, "unknown action 'explode' (one of: warn, stop, fail)"),
    ("rules:\n  - id: grad_none\n    severity: fatal\n", 3, "unknown severity 'fatal' (one of: error, warning, info)"),
    ("rules:\n  - id: grad_none\n    thresholds:\n      step: 3\n", 4,
     "thresholds of grad_none: unknown key 'step' (there are: steps, stopped, gap_factor)"),
    ("rules:\n  - id: grad_none\n    thresholds: {steps: many}\n", 3, "threshold steps of grad_none must be a number"),
    ("rules:\n  - id: NO_THRESHOLDS\n    thresholds: {x: 1}\n", 3, "rule NO_THRESHOLDS has no thresholds"),
    ("rules:\n  - id: grad_none\n    enabled: maybe\n", 3, "'enabled' must be true or false"),
    ("rules:\n  - id: grad_none\n  - id: grad_none\n", 3, "rule 'grad_none' is listed twice (first at line 2)"),
    ("rules:\n  - id: grad_none\n    action: warn\n    action: stop\n", 4, "'action' given twice (first at line 3)"),
    ("rules: grad_none\n", 1, "'rules' must be a list"),
    ("rules:\n  - grad_none\n", 2, "a rule must be a mapping with 'id'"),
    ("rules:\n  - action: stop\n", 2, "a rule needs 'id' (a built-in rule to change) or 'name' (a new rule)"),
    ("rules:\n  - id: grad_none\n    name: x\n", 2, "not both"),
    ("rules:\n  - name: big\n    message: hi\n", 2, "new rule big needs a 'condition'"),
    ("rules:\n  - name: grad_none\n    condition: step > 1\n", 2, "'grad_none' is a built-in rule: change it with 'id: grad_none'"),
    ("rules:\n  - name: two words\n    condition: step > 1\n", 2, "rule name 'two words'"),
    ("rules:\n  - name: a\n    condition: step > 1\n    thresholds: {x: 1}\n", 4, "new rule a: no thresholds"),
    ("rules:\n  - name: a\n    condition: max(grad.nrm) > 1\n", 3,
     "condition of a: unknown statistic 'nrm' (one of: count, mean, std, min, max, norm, "),
    ("rules:\n  - name: a\n    message: m\n    condition: max(grad.norm) >\n", 4, "condition of a: syntax error"),
    ("rules:\n  - name: a\n    condition: __import__('os').system('true')\n", 3,
     "condition of a: __import__('os').system(): not a function here"),
    ("rules:\n  - name: a\n    condition: max(grad.norm)\n", 3, "condition of a: the condition is a number: it must be true or false"),
    ("rules:\n  - name: a\n    condition: 12\n", 3, "condition of a must be an expression"),
]


@pytest.mark.parametrize("text,line,message", ERRORS, ids=[m[:30] for _, _, m in ERRORS])
def test_every_mistake_is_one_error_with_file_and_line(tmp_path, text, line, message):
    bare = next(r.id for r in default_rules() if not r.THRESHOLDS)      # a built-in rule without thresholds
    text, message = text.replace("NO_THRESHOLDS", bare), message.replace("NO_THRESHOLDS", bare)
    path = rules_file(tmp_path, text)
    with pytest.raises(UsageError) as e:
        load(path)
    assert str(e.value).startswith(f"{path}:{line}: "), str(e.value)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_a_missing_rule_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no such rule file"):
        load_file(str(tmp_path / "nope.yaml"), default_rules())


def test_a_bad_rule_file_stops_nndb_run_before_the_script(tmp_path):
    path = rules_file(tmp_path, "rules:\n  - id: stale_grad\n    action: explode\n")
    r = nndb("run", "--batch", "--rules", path, example("mlp.py"), "--steps", "2", cwd=str(tmp_path))
    assert r.returncode == 2
    assert r.stderr.splitlines() == [f"nndb: error: {path}:3: unknown action 'explode' (one of: warn, stop, fail)"]
    assert r.stdout == ""                       # the script never ran


# -- the condition language ----------------------------------------------------------------------------
def ctx_of(rows: dict, step=3) -> StepContext:
    """rows: {(name, kind): {stat: value}} -> a StepContext."""
    names = list(rows)
    stats = np.full((len(names), len(STAT_INDEX)), np.nan)
    for i, key in enumerate(names):
        for stat, v in rows[key].items():
            stats[i, STAT_INDEX[stat]] = v
    return StepContext(SimpleNamespace(step=step, names=names), stats)


CTX = ctx_of({
    ("fc1", "act"): {"zero_frac": 0.2, "mean": 1.0},
    ("fc2", "act"): {"zero_frac": 1.0, "mean": 0.0},
    ("loss", "loss"): {"mean": 2.5},
    ("fc1.weight", "grad"): {"norm": 5.0, "mean": -1.0},
    ("fc1.bias", "grad"): {"norm": 2000.0, "mean": 3.0},
    ("fc2.weight", "grad"): {"norm": float("nan"), "mean": 0.0},
    ("fc1.weight", "param"): {"norm": 10.0},
    ("fc1.bias", "param"): {"norm": 1.0},
    ("fc2.weight", "param"): {"norm": 4.0},
})


@pytest.mark.parametrize("src,true,who,value", [
    ("max(grad.norm) > 1e3", True, ("grad", "fc1.bias"), 2000.0),     # NaN is ignored by max
    ("min(grad.norm) < 1", False, None, None),
    ("grad.norm > 1e3", True, ("grad", "fc1.bias"), 2000.0),          # a vector: true for some tensor
    ("grad['fc1.*'].norm > 10", True, ("grad", "fc1.bias"), 2000.0),
    ("grad['fc2*'].norm > 10", False, None, None),
    ("grad.norm / weight.norm > 100", True, ("grad", "fc1.bias"), 2000.0),   # matched by tensor name
    ("any(act.zero_frac == 1)", True, ("act", "fc2"), 1.0),
    ("all(act.zero_frac == 1)", False, None, None),
    ("count(act.zero_frac >= 0.2) == 2 and len(grad) == 3", True, None, None),
    ("mean(abs(grad.mean)) == 4/3 and sum(weight.norm) == 15", True, None, None),
    ("loss.mean > 2 and step >= 3", True, ("loss", "loss"), 2.5),
    ("not loss.mean > 2 or step == 4", False, None, None),
    ("1 < loss.mean < 2", False, None, None),
    ("0 < max(max(grad.norm), 3) <= 2e3", True, ("grad", "fc1.bias"), 2000.0),
    ("-grad.mean > 0.5", True, ("grad", "fc1.weight"), 1.0),
    ("step % 2 == 1 and step ** 2 == 9 and step // 2 == 1", True, None, None),
    ("act.zero_frac > 0.5 and act.mean < 0.5", True, ("act", "fc2"), 1.0),
    ("max(grad['nothing*'].norm) > 0", False, None, None),           # no tensor: NaN, false
])
def test_conditions(src, true, who, value):
    r = Condition(src).evaluate(CTX)
    assert r.true is true
    if who is not None:
        assert r.who == who and r.value == pytest.approx(value)


@pytest.mark.parametrize("src,message", [
    ("grad.__class__ == 1", "unknown statistic '__class__'"),
    ("().__class__", "not allowed in a condition"),
    ("open('f') == 1", "open(): not a function here"),
    ("(lambda: 1)() == 1", "not a function here"),
    ("[x for x in grad] == 1", "not allowed in a condition"),
    ("grad > 1", "grad needs a statistic, e.g. grad.norm"),
    ("grad[0].norm > 1", "the filter must be a quoted name or glob"),
    ("loss.mean['x'] > 1", "only a kind takes a name filter"),
    ("x > 1", "unknown name 'x'"),
    ("max(grad.norm, 1) > 1", "max() of several arguments takes numbers"),
    ("mean(grad.norm, 1) > 1", "mean() takes one argument"),
    ("max(x=1) > 1", "max() takes plain arguments"),
    ("any(grad.norm) ", "any() takes a comparison"),
    ("grad.norm > 1 + (step > 2)", "arithmetic needs numbers"),
    ("'a' < 'b'", "only as a name filter"),
    ("step is 1", "only < <= > >= == != compare"),
    ("step > 1; 2", "syntax error"),
    ("grad.norm", "it must be true or false"),
])
def test_conditions_refused_when_loaded(src, message):
    with pytest.raises(ConditionError) as e:
        Condition(src)
    assert message in str(e.value)


# -- custom rules in a run -----------------------------------------------------------------------------
def test_a_custom_fail_rule_names_its_tensor_and_exits_4(tmp_path):
    path = rules_file(tmp_path, """
        default: none
        rules:
          - name: big_grad
            condition: max(grad['0.*'].norm) > 0 and step >= 2
            action: fail
            severity: error
            message: "first layer gradient"
        """)
    fe = ScriptedFrontend([])
    res = run_in_process(tmp_path, example("mlp.py"), ["--steps", "6"], rules=path, frontend=fe)
    assert res.exit_code == 4
    [f] = res.session.log.findings
    assert (f["rule"], f["step"], f["severity"]) == ("big_grad", 2, "error")
    assert f["tensor"].startswith("0.") and f["evidence"]["kind"] == "grad"
    assert f["message"].startswith(f"first layer gradient (grad {f['tensor']}: max(grad['0.*'].norm) = ")
    assert f"nndb: error: big_grad at step 2: first layer gradient (grad {f['tensor']}" in fe.text


def test_a_custom_rule_is_checked_at_every_recorded_step(tmp_path):
    """Not only on the built-in trend rules' observed steps (one in 8 after the first 20)."""
    path = rules_file(tmp_path, """
        default: none
        rules:
          - name: late_step
            condition: step == 23 and max(grad.norm) > 0
        """)
    res = run_in_process(tmp_path, example("mlp.py"), ["--steps", "26"], rules=path)
    assert [(f["rule"], f["step"]) for f in res.session.log.findings] == [("late_step", 23)]


def test_a_custom_stop_rule_stops_and_says_why(tmp_path):
    path = rules_file(tmp_path, """
        default: none
        rules:
          - name: late
            condition: step == 1
            action: stop
        """)
    fe = ScriptedFrontend(["continue", "p $step", "continue"])
    res = _debug(tmp_path, "mlp.py", fe, path, steps=3)
    assert res.exit_code == 0
    assert "Rule late (warning): step == 1 is true (step = 1)" in fe.text
    assert "(nndb) p $step\n1" in fe.text


# -- the rule commands ------------------------------------------------------------------------------------
def _debug(tmp_path, script, fe, rules, steps=4):
    import gc
    gc.collect()
    cfg = RunConfig(Target(path=example(script), args=["--steps", str(steps)]), str(tmp_path / "t.h5"), quiet=True)
    return debug(cfg, DebugOptions(no_rc=True, rules=rules), fe)


def after(fe, command: str) -> str:
    chunks = fe.text.split("(nndb) ")[1:]
    hits = [c for c in chunks if c.split("\n", 1)[0] == command]
    assert hits, f"{command!r} not typed:\n{fe.text}"
    body = hits[0].split("\n", 1)
    return body[1].rstrip("\n") if len(body) > 1 else ""


def test_info_rules_and_the_rule_command(tmp_path):
    path = rules_file(tmp_path, """
        rules:
          - name: loss_seen
            condition: loss.mean > 0
        """)
    fe = ScriptedFrontend([
        "info rules", "rule disable grad_none nonfinite", "rule disable nope", "rule enable grad_none",
        "rule action stale_grad stop", "rule action stale_grad explode", "rule severity loss_seen info",
        "rule threshold stale_grad steps 3", "rule threshold stale_grad nope 1", "rule threshold grad_none steps x",
        "rule show stale_grad", "rule show loss_seen", "rule", "rule frob x", "rule enable", "rule sh grad_none",
        "i r", "continue",
    ])
    res = _debug(tmp_path, "mlp.py", fe, path)
    assert "Traceback" not in fe.text and "internal error" not in fe.text, fe.text
    assert res.exit_code == 0
    table = after(fe, "info rules").splitlines()
    assert table[0].split() == ["rule", "severity", "action", "enb", "found", "thresholds"]
    rows = {line.split()[0]: line.split() for line in table[1:]}
    assert rows["stale_grad"][:5] == ["stale_grad", "error", "warn", "y", "0"]
    assert "steps=2," in rows["stale_grad"] and "tol=0.001," in rows["stale_grad"]
    assert rows["grad_none"][1:] == ["warning", "warn", "y", "0", "steps=5,", "stopped=50,", "gap_factor=4"]
    assert rows["loss_seen"][1:] == ["warning", "warn", "y", "0", "if", "loss.mean", ">", "0"]
    assert after(fe, "rule disable grad_none nonfinite") == "Rules grad_none, nonfinite disabled."
    assert after(fe, "rule disable nope").startswith("no rule 'nope' (there are: ")
    assert "grad_none" in after(fe, "rule disable nope")
    assert len(after(fe, "rule disable nope").splitlines()) == 1
    assert after(fe, "rule enable grad_none") == "Rule grad_none enabled."
    assert after(fe, "rule action stale_grad stop") == "Rule stale_grad: action stop."
    assert after(fe, "rule action stale_grad explode").startswith("unknown action 'explode' (one of: warn, stop, fail)")
    assert after(fe, "rule severity loss_seen info") == "Rule loss_seen: severity info."
    assert after(fe, "rule threshold stale_grad steps 3") == "Rule stale_grad: steps = 3 (default 2)."
    assert after(fe, "rule threshold stale_grad nope 1") == \
        "rule stale_grad has no threshold 'nope' (it has: steps, tol, min_share)"
    assert after(fe, "rule threshold grad_none steps x").startswith("'x' is not a number")
    show = after(fe, "rule show stale_grad").splitlines()
    assert show[0].startswith("stale_grad (error, action stop, enabled): gradients are not reset")
    assert show[1].startswith("  steps = 3 (default 2): consecutive optimizer steps")
    assert after(fe, "rule show loss_seen").splitlines()[1] == "  condition: loss.mean > 0"
    assert after(fe, "rule").startswith("rule what? (enable | disable | action | severity | threshold | show)")
    assert after(fe, "rule frob x").startswith("unknown rule command 'frob'")
    assert after(fe, "rule enable").startswith("rule enable needs a rule id")
    assert after(fe, "rule sh grad_none").startswith("grad_none (warning, action warn, enabled)")
    rows = {line.split()[0]: line.split() for line in after(fe, "i r").splitlines()[1:]}
    assert rows["nonfinite"][3] == "n" and rows["stale_grad"][2] == "stop"
    assert rows["loss_seen"][1] == "info"
    # the changes held for the run: nonfinite off, loss_seen reported at step 0 with severity info
    eng = res.session.rules
    assert not eng.rule("nonfinite").enabled and eng.rule("stale_grad").params["steps"] == 3
    assert [(f["rule"], f["severity"]) for f in res.session.log.findings if f["severity"] != "info" or
            f["rule"] == "loss_seen"] == [("loss_seen", "info")]


def test_rule_commands_when_rules_are_off(tmp_path):
    fe = ScriptedFrontend(["info rules", "rule disable grad_none", "continue"])
    _debug(tmp_path, "mlp.py", fe, "none", steps=2)
    assert after(fe, "info rules") == "Rules are off (nndb run --rules none)."
    assert after(fe, "rule disable grad_none") == "Rules are off (nndb run --rules none)."


def test_a_custom_vector_rule_reports_each_tensor_at_its_own_first_step(tmp_path):
    """Once per tensor: a tensor that makes the condition true later is reported then, although
    one reported earlier is still true (the finding named the first true tensor only, already
    reported, and the engine dropped it: b and c were never reported)."""
    script = tmp_path / "grow.py"
    script.write_text(textwrap.dedent("""
        import torch

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.a = torch.nn.Parameter(torch.full((3,), 5.0))
                self.b = torch.nn.Parameter(torch.zeros(3))
                self.c = torch.nn.Parameter(torch.zeros(3))
                self.d = torch.nn.Parameter(torch.zeros(3))

            def forward(self, x):
                return (x * self.a).sum() * 0 - self.b.sum() - self.c.sum() - 0.5 * self.d.sum()

        m = M()
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        for step in range(10):
            opt.zero_grad()
            loss = m(torch.ones(3))
            loss.backward()
            opt.step()
        """))
    path = rules_file(tmp_path, """
        default: none
        rules:
          - name: big_weight
            condition: weight.norm > 2.5
        """)
    res = run_in_process(tmp_path, str(script), rules=path)
    import nndb
    with nndb.open(str(tmp_path / "run.h5")) as t:
        first = {n: int(t.steps[np.argmax(t.series(n, kind="param") > 2.5)]) for n in "abcd"}
        norm_b = t.stats(first["b"])["param"]["b"]["norm"]
    assert first["a"] == 0 and first["b"] == first["c"] < first["d"]        # (b and c: 2.6 at step 2)
    found = [(f["step"], f["tensor"], f["evidence"].get("also")) for f in res.session.log.findings]
    assert found == [(first["a"], "a", None), (first["b"], "b", ["c"]), (first["d"], "d", None)]
    assert res.session.log.findings[1]["message"] == (
        f"weight.norm > 2.5 is true (param b: weight.norm = {fmt(norm_b)} (and 1 more: c))")


def test_a_name_filter_that_matches_no_tensor_is_said_at_the_end(tmp_path):
    """A misspelt tensor name in a condition ('fc9.weight' in a model of 0, 2, 4) was judged as
    NaN at every step, silently: the run said 0 findings as for a healthy model.  It is said at
    the end of the run and of check-trace, one line per filter; one not judged (an 'and' that never
    got to it) or that matched at some step is not."""
    path = rules_file(tmp_path, """
        default: none
        rules:
          - name: typo
            condition: grad['fc9.weight'].norm > 0
          - name: late
            condition: step > 100 and max(grad['nothing*'].norm) > 0
          - name: fine
            condition: max(grad['4.*'].norm) > 1e9
        """)
    run_h5 = str(tmp_path / "run.h5")
    res = nndb("run", "--batch", "-q", "--trace", run_h5, "--rules", path,
               example("mlp.py"), "--steps", "3", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    notes = [line for line in res.stderr.splitlines() if "matched no" in line]
    assert notes == ["nndb: rule typo: grad['fc9.weight'] matched no grad tensor in the run (there are: "
                     "0.weight, 0.bias, 2.weight, 2.bias, 4.weight, 4.bias); its condition was judged "
                     "without it"]
    off = nndb("check-trace", "--rules", path, run_h5, cwd=tmp_path)
    assert off.returncode == 0 and notes[0] in off.stdout.splitlines()
