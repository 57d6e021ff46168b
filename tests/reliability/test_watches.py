"""Watches without noise (the relative rule: smoothed value, moving baseline,
numerically zero tensors skipped), edge-triggered watches (``always`` for the
old level-triggered behaviour) and batch commands that fail loudly (issue 19)."""
import json
import os
import re
from types import SimpleNamespace

import pytest

from conftest import example, nndb, run_in_process
from nndb.debugger import points as P
from nndb.debugger import watchband
from nndb.commands import TABLE
from nndb.errors import CommandError

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")


def _watch(text: str) -> P.Watch:
    fields = P.parse_watch(text.split(None, 1)[1])
    fields.pop("fail")
    return P.Watch(number=1, **fields)


def _feed(w: P.Watch, steps) -> list:
    """The step indices at which the watch hits, for [[(name, value)], ...]."""
    out = []
    for i, rows in enumerate(steps):
        scale = max((abs(v) for _, v in rows if v == v), default=0.0)
        if w.check(rows, scale) is not None:
            out.append(i)
    return out


# -- the relative rule ---------------------------------------------------------------------

def test_steady_convergence_is_not_a_hit_but_a_jump_is():
    """A gradient norm shrinking x0.9 per step for 80 steps (x2e-4 in all: the
    first-value rule hit from step 44 on) is followed; a x100 jump is a hit
    one step later (the median of 3 needs two high values)."""
    decay = [[("w", 2.0 * 0.9 ** i)] for i in range(80)]
    assert _feed(_watch("watch grad w"), decay) == []
    jump = [[("w", 1.0 + 0.1 * (i % 2))] for i in range(10)] + [[("w", 100.0)]] * 5
    assert _feed(_watch("watch grad w"), jump) == [11]


def test_one_odd_batch_is_smoothed_away():
    values = [0.1, 0.12, 0.09, 0.11, 0.0003, 0.1, 0.13, 9.0, 0.1, 0.1]
    assert _feed(_watch("watch grad b"), [[("b", v)] for v in values]) == []


def test_an_inf_is_a_hit_at_once_even_before_a_baseline():
    assert _feed(_watch("watch grad w"), [[("w", 1.0)], [("w", float("inf"))]]) == [1]


def test_a_numerically_zero_baseline_is_skipped_and_named_once():
    """A bias before BatchNorm: ~1e-7 while the weights' gradients are ~1."""
    w = _watch("watch grad conv*")
    steps = [[("conv.weight", 1.0), ("conv.bias", 1.7e-7 * 10 ** -(i // 5))] for i in range(20)]
    assert _feed(w, steps[:3]) == []
    notes = w.take_zero_notes()
    assert [n for n, _ in notes] == ["conv.bias"] and notes[0][1] == pytest.approx(1.7e-7)
    assert _feed(w, steps[3:]) == [] and w.take_zero_notes() == []
    # watched alone, it is compared with the largest of its kind (the scale), not with itself
    alone = _watch("watch grad conv.bias")
    for _ in range(3):
        assert alone.check([("conv.bias", 1e-7)], 3.0) is None
    assert [n for n, _ in alone.take_zero_notes()] == ["conv.bias"]
    same = _watch("watch grad conv.bias")
    for _ in range(3):
        same.check([("conv.bias", 1e-7)], 1e-7)
    assert same.take_zero_notes() == []


def test_the_hit_detail_has_the_smoothed_value_and_the_baseline():
    w = _watch("watch grad w")
    for v in (1.0, 1.0, 1.0, 200.0):
        assert w.check([("w", v)], v) is None
    d = w.check([("w", 300.0)], 300.0)
    assert d["tensor"] == "w" and d["value"] == 300.0 and d["smoothed"] == 200.0
    assert d["baseline"] == 1.0 and "first" not in d         # judged against the baseline before this step


# -- edge-triggered --------------------------------------------------------------------------

def test_consecutive_fires_when_the_streak_reaches_k_then_only_after_a_false_step():
    held = [True] * 8 + [False] + [True] * 3
    rows = [[("a", 1.0 if h else 0.0)] for h in held]
    assert _feed(_watch("watch act a zero_frac == 1 consecutive 2"), rows) == [1, 10]
    assert _feed(_watch("watch act a zero_frac == 1 consecutive 2 always"), rows) == [1, 3, 5, 7, 10]
    assert _feed(_watch("watch act a zero_frac == 1"), rows) == [0, 9]


def test_unmeasured_steps_neither_grow_nor_break_a_streak():
    nan = float("nan")
    rows = [[("a", v)] for v in (1.0, nan, 1.0, nan, 1.0, 1.0)]
    assert _feed(_watch("watch act a zero_frac == 1 consecutive 3"), rows) == [4]


def test_always_is_parsed_shown_and_completed():
    assert P.parse_watch("watch grad w norm > 1 consecutive 3 always fail".split(None, 1)[1])["always"] is True
    assert _watch("watch grad w norm > 1 consecutive 3 always").what() == "grad w norm > 1 consecutive 3 always"
    assert _watch("watch loss always").what() == "loss * mean outside [0.01, 50] x baseline always"
    from nndb.frontends.completer import candidates
    assert "always" in candidates(SimpleNamespace(table=TABLE), "op", ["watch", "grad", "w", "norm"], "")
    assert "always" in TABLE.lookup("watch").usage and "always" in TABLE.lookup("watch").help


# -- statistic names -------------------------------------------------------------------------

@pytest.mark.parametrize("text,message", [
    ("loss nan_cnt > 0 fail", "unknown statistic 'nan_cnt' (did you mean nan_count?"),
    ("grad 0.weight nrom > 1", "unknown statistic 'nrom' (did you mean norm?"),
    ("los nan_count > 0 fail", "unknown kind 'los' (did you mean loss?"),
])
def test_a_misspelt_name_is_an_error_with_did_you_mean(text, message):
    with pytest.raises(CommandError) as e:
        P.parse_watch(text)
    assert str(e.value).startswith(message)


def test_a_loss_glob_is_still_a_glob():
    assert P.parse_watch("loss loss/opt* nan_count > 0")["glob"] == "loss/opt*"
    assert P.parse_watch("loss * > 3")["glob"] == "*"
    assert P.parse_watch("loss nan_count > 0")["glob"] == "*"


# -- real runs: no noise on healthy runs, a hit on a planted explosion -------------------------

def _watch_stops(result) -> list:
    return [(s["step"], s["detail"]["tensor"]) for s in result.session.log.stops if s["reason"] == "watchpoint"]


@pytest.mark.parametrize("script,glob,args", [
    ("cnn.py", "conv*", ("--steps", "100")),    # the first-value rule hit conv2.bias at 44, conv2.weight at 47
    ("mlp.py", "*", ()),
    ("lstm.py", "*", ()),                       # it hit head.bias at step 23 (one odd batch)
    ("transformer.py", "*", ()),                # it hit three biases at steps 37-39
])
def test_a_healthy_run_does_not_hit_a_relative_watch(tmp_path, script, glob, args):
    r = run_in_process(tmp_path, example(script), args, rules="none", commands=[f"watch grad {glob}"])
    assert r.exit_code == 0, r.reason
    assert _watch_stops(r) == []


def test_the_cnn_names_its_zero_gradient_biases_once(tmp_path):
    from nndb.frontends.batch import ScriptedFrontend
    fe = ScriptedFrontend([])
    run_in_process(tmp_path, example("cnn.py"), ("--steps", "12"), rules="none", commands=["watch grad conv*"],
                   frontend=fe)
    lines = [l for l in fe.output if "numerically zero" in l]
    assert len(lines) == 1, fe.text
    assert re.match(r"Watchpoint 1: not judging conv1\.bias \(\S+\), conv2\.bias \(\S+\) against the band: "
                    r"their grad norm is numerically zero", lines[0])


def test_a_planted_lr_jump_hits_once_right_after_it(tmp_path):
    """The learning rate goes x100 at step 20: one hit, at step 22 (the first
    value rule hit at 21, 22 and 23), none before the jump."""
    r = run_in_process(tmp_path, os.path.join(SCRIPTS, "watches_lr_jump.py"), (), rules="none",
                       commands=["watch grad *"])
    stops = _watch_stops(r)
    assert len(stops) == 1 and stops[0][0] == 22, stops
    d = r.session.log.stops[0]["detail"]
    assert d["smoothed"] / d["baseline"] > 50 and set(d["also"]) | {d["tensor"]} == {
        "0.weight", "0.bias", "2.weight", "2.bias"}


def test_nan_lr_hits_before_the_loss_is_inf(tmp_path):
    r = run_in_process(tmp_path, example("nan_lr.py"), ("--steps", "10"), rules="none",
                       commands=["watch grad *"])
    steps = [s for s, _ in _watch_stops(r)]
    assert steps and steps[0] < 6, steps                 # the loss is inf at step 6


def test_dead_relu_consecutive_edge_and_always(tmp_path):
    """act#2 is all zero from step 0: `consecutive 2` hits once (step 1);
    with `always`, every second step."""
    cmds = ["watch act act#2 zero_frac == 1 consecutive 2", "watch act act#2 zero_frac == 1 consecutive 2 always"]
    r = run_in_process(tmp_path, example("dead_relu.py"), ("--steps", "8"), rules="none", commands=cmds)
    by_id = {}
    for s in r.session.log.stops:
        by_id.setdefault(s["id"], []).append(s["step"])
    assert by_id == {1: [1], 2: [1, 3, 5, 7]}


# -- batch commands that fail loudly -----------------------------------------------------------

def _batch(tmp_path, *argv):
    report = str(tmp_path / "r.json")
    r = nndb("run", "--batch", "--trace", str(tmp_path / "t.h5"), "--report", report, *argv, cwd=str(tmp_path))
    assert "Traceback" not in r.stderr, r.stderr
    with open(report) as fh:
        return r, json.load(fh)


@pytest.mark.parametrize("command,message", [
    ("watch los nan_count > 0 fail", "unknown kind 'los' (did you mean loss?"),
    ("watch loss nan_cnt > 0 fail", "unknown statistic 'nan_cnt' (did you mean nan_count?"),
    ("wacth loss nan_count > 0", 'undefined command: "wacth"'),
])
def test_a_typo_in_an_e_command_exits_2_before_the_script_runs(tmp_path, command, message):
    r, data = _batch(tmp_path, "-e", "break step 1", "-e", command, example("nan_lr.py"), "--steps", "3")
    assert r.returncode == 2, r.stderr
    lines = [l for l in r.stderr.splitlines() if l.startswith("-e ")]
    assert len(lines) == 1 and lines[0].startswith(f"-e '{command}': {message}"), r.stderr
    assert "step 0" not in r.stdout and not os.path.exists(tmp_path / "t.h5")
    assert data["exit"] == {"code": 2, "reason": lines[0]} and data["steps"] == 0 and data["stops"] == []


def test_an_e_command_that_fails_when_it_runs_ends_the_batch_run_with_2(tmp_path):
    r, data = _batch(tmp_path, "-e", "p no_such_name", "-e", 'p "NOT REACHED"', example("mlp.py"), "--steps", "3")
    assert r.returncode == 2, r.stderr
    assert re.search(r"^-e 'p no_such_name': .*no_such_name", r.stderr, re.M), r.stderr
    assert "NOT REACHED" not in r.stdout
    assert data["exit"]["code"] == 2 and data["exit"]["reason"].startswith("-e 'p no_such_name': ")


def test_a_pending_fail_point_is_reported_and_exits_2(tmp_path):
    r, data = _batch(tmp_path, "-e", "watch grad nope* fail", "-e", "watch act nada", example("mlp.py"),
                     "--steps", "3")
    assert r.returncode == 2, r.stderr
    assert ("nndb: watchpoint 1 (grad nope* norm outside [0.01, 50] x baseline [fail]) was still pending "
            "at the end of the run") in r.stderr
    assert "nndb: watchpoint 2 (act nada norm outside [0.01, 50] x baseline) was still pending" in r.stderr
    assert data["pending"] == [
        {"id": 1, "type": "watchpoint", "what": "grad nope* norm outside [0.01, 50] x baseline", "fail": True},
        {"id": 2, "type": "watchpoint", "what": "act nada norm outside [0.01, 50] x baseline", "fail": False}]
    assert data["exit"] == {"code": 2, "reason": "a point with the fail action stayed pending (1)"}


def test_a_pending_point_without_fail_keeps_the_exit_code(tmp_path):
    r, data = _batch(tmp_path, "-e", "break module nomodule*", "-e", "watch grad 0.weight", example("mlp.py"),
                     "--steps", "3")
    assert r.returncode == 0, r.stderr
    assert [p["id"] for p in data["pending"]] == [1]
    assert "nndb: breakpoint 1 (module nomodule* forward) was still pending" in r.stderr


def test_the_startup_check_skips_commands_blocks():
    from nndb.commands.rcfiles import first_error
    from nndb.debugger.session import QueuedLine
    lines = [QueuedLine(t) for t in ("break step 1", "commands", "silent", "p $step", "end", "watch loss")]
    assert first_error(TABLE, lines) is None
    assert first_error(TABLE, lines + [QueuedLine("frob", "f.nndb", 7)]).startswith('f.nndb:7: undefined command')


def test_a_replica_keeps_its_own_watch_streaks_when_points_change_hands():
    """The snapshot of another process (the present, for a replica replaying
    the past) carries that process's streaks: a watch this process has too
    keeps its own; a new one starts afresh, so its hits in the past are not
    swallowed by a streak of the present."""
    from nndb.frontends.batch import ScriptedFrontend
    from nndb.debugger.session import Session
    from nndb.render import debug as renderer
    s = Session(ScriptedFrontend([]), TABLE, renderer)
    mine = s.points.add(P.Watch, {k: v for k, v in P.parse_watch("grad w norm > 1").items() if k != "fail"})
    mine.streak["w"] = 2
    theirs = {n: P.point_to_dict(p) for n, p in s.points.items()}
    theirs[1]["streak"] = {"w": 7}
    theirs[2] = dict(theirs[1], number=2, glob="v", streak={"v": 5})
    s.restore({"points": list(theirs.values())})
    assert s.points[1].streak == {"w": 2} and s.points[2].streak == {}


@pytest.mark.parametrize("prune", [False, True])
def test_a_watch_that_leaves_out_parametrized_or_pruned_weights_says_which(tmp_path, prune):
    """``watch grad *.weight`` on layers whose weights are parametrized (weight_norm, orthogonal,
    spectral_norm: recorded as N.parametrizations.weight.original*) or pruned (N.weight_orig)
    looked at none of them: pending to the end, 'no grad tensor matched', or silent where it
    matched the other layers' weights, so a watch the user took for one on every weight never
    stopped and nothing said why.  The end of the run names the tensors it left out."""
    script = os.path.join(SCRIPTS, "parametrized_layers.py")
    r, data = _batch(tmp_path, "-q", "-e", "watch grad *.weight norm > 1e6", script, *(["prune"] if prune else []))
    assert r.returncode == 0, r.stderr
    note = ": a parametrized or pruned layer's tensor is recorded under the name of the parameter that holds it"
    if prune:
        assert ("nndb: watchpoint 1 (grad *.weight norm > 1e+06) never stopped, and did not look at "
                "0.weight_orig, 2.weight_orig" + note) in r.stderr, r.stderr
        assert data["pending"] == []
    else:
        assert ("nndb: watchpoint 1 (grad *.weight norm > 1e+06) was still pending at the end of the run: no grad "
                "tensor matched '*.weight' (0.parametrizations.weight.original0, 0.parametrizations.weight.original1, "
                "2.parametrizations.weight.original, 4.parametrizations.weight.original" + note) in r.stderr, r.stderr
    # a watch by the names the trace has is told nothing
    r, _ = _batch(tmp_path, "-q", "-e", "watch grad *original* norm > 1e6", script)
    assert "did not look at" not in r.stderr and "pending" not in r.stderr, r.stderr


def test_a_watch_on_the_second_path_of_tied_weights_names_the_tensor_it_is(tmp_path):
    """A language model whose output layer's weight is its embedding's (GPT-2's lm_head.weight is
    transformer.wte.weight) has one series for the tensor, under its first path: ``watch grad
    decoder.weight`` was said to match no grad tensor, at the prompt and at the run's end, with
    nothing of the tensor it names, and ``$grad['decoder.weight']`` was an error.  Both name it,
    ``$grad`` has its row by either path, and a watch by its recorded name stops."""
    script = os.path.join(SCRIPTS, "healthy_weight_tied_lm.py")
    r, data = _batch(tmp_path, "-q", "-e", "until 0", "-e", "watch grad decoder.weight norm > 0",
                     "-e", "p ('ROW', $grad['decoder.weight'].name, $grad['decoder.weight'] == $grad['encoder.weight'])",
                     "-e", "history grad decoder.weight",
                     "-e", "continue", script, "--steps", "3")
    assert r.returncode == 0, r.stderr
    assert "('ROW', 'encoder.weight', True)" in r.stdout, r.stdout
    assert "decoder.weight (grad) norm, 1 recorded step(s) 0..0" in r.stdout, r.stdout      # (encoder.weight's)
    assert ("No grad tensor is recorded as 'decoder.weight', which names encoder.weight as the script does "
            "(a parametrized or pruned layer's tensor is recorded under the name of the parameter that holds it, "
            "weights tied at several paths under the first); the point stays pending until a tensor of its name "
            "appears: watch grad encoder.weight ...") in r.stdout, r.stdout
    assert ("nndb: watchpoint 1 (grad decoder.weight norm > 0) was still pending at the end of the run: no grad "
            "tensor matched 'decoder.weight' (encoder.weight: a parametrized or pruned layer's tensor is recorded "
            "under the name of the parameter that holds it, weights tied at several paths under the first; watch "
            "it by that name)") in r.stderr, r.stderr
    r, _ = _batch(tmp_path, "-q", "--force", "-e", "watch grad encoder.weight norm > 0", "-e", "continue",
                  "-e", "kill", script, "--steps", "3")
    assert "Watchpoint 1: grad encoder.weight norm = " in r.stdout and "pending" not in r.stdout + r.stderr, r
