"""The offline rule invoker (nndb.rules.offline) and ``nndb check-trace``:
units on traces written in this process, then real runs of the examples whose
live findings the trace must give back."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import example, nndb
from nndb.cli import cli
from nndb.text import fmt, json_value as _clean
from nndb.errors import EXIT_FAIL_ACTION, EXIT_USAGE
from nndb.rules.base import Rule, StepContext
from nndb.rules.catalog import load
from nndb.rules.engine import RuleEngine
from nndb.rules.offline import check_trace, trace_steps
from nndb.store.reader import TraceReader
from nndb.store.writer import TraceWriter
from nndb.tracer import stats as S
from nndb.tracer.recorder import StepRecord

# What a trace cannot serve, spelled out (not derived from the code under test).
OFFLINE = ["nonfinite", "loss_not_decreasing", "loss_explodes", "zero_gradients"]
# ... and what it serves where it records the optimizers (a run's trace; not one written here by hand)
OPTIMIZERS = ["exploding_gradient", "vanishing_gradient", "update_ratio", "param_not_updated"]
# (epoch_repeats: from the input checksums a run's trace keeps, its fingerprints)
WITH_OPTIMIZERS = ["nonfinite"] + OPTIMIZERS + ["loss_not_decreasing", "loss_explodes", "zero_gradients",
                                                 "epoch_repeats", "duplicate_batches"]
PROBES = {"bn_stats", "grad_none", "stale_grad", "dead_relu", "saturated_activation", "eval_mode_training",
          "input_range", "initial_loss", "loss_broadcast", "double_softmax", "clip_before_unscale"}
# (a trace written by hand here records no optimizers: their rules are skipped too)
NOT_ON_HAND_WRITTEN = PROBES | set(OPTIMIZERS) | {"epoch_repeats", "duplicate_batches"}


def _record(step, names, arrays, loss, optimizer_steps=1, partial=False):
    raw = np.stack([S.host_raw_one(np.asarray(a, dtype=np.float32)) for a in arrays] + [S.scalar_raw(loss)])
    return StepRecord(step, 0.1 * step, 1, optimizer_steps, names + [("loss", "loss")], raw, partial)


def _records(n=60, nan_at=None, late_act_at=None, partial_last=False, optimizer_steps=1):
    """A run of ``n`` steps: two activations, a weight and its gradient, and a
    loss that stays flat (loss_not_decreasing fires at step 49)."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        names = [("fc1", "act"), ("fc2", "act"), ("fc1.weight", "param"), ("fc1.weight", "grad")]
        arrays = [rng.normal(size=32), rng.normal(size=16), rng.normal(size=64), rng.normal(size=64) * 1e-2]
        if nan_at is not None and i >= nan_at:
            arrays[1] = np.where(np.arange(16) < 3, np.nan, arrays[1])
        if late_act_at is not None and i >= late_act_at:
            names.insert(0, ("embed", "act"))
            arrays.insert(0, rng.normal(size=8))
        out.append(_record(i, names, arrays, 2.3 + 0.01 * rng.normal(), optimizer_steps,
                           partial=partial_last and i == n - 1))
    return out


def _write(path, records):
    w = TraceWriter(path, {"script": "x.py", "argv": ["x.py"]}, flush_steps=7)
    for r in records:
        w.append(r)
    w.close("finished", 0)
    return path


def _live(records, spec="default"):
    """What the live invoker reports on the same records (the raw rows, no probes)."""
    engine = load(spec)
    engine.attach(None)
    found = []
    for r in records:
        if r.partial:
            continue
        found += engine.on_record(r)
    return [_clean(f.as_dict()) for f in found]


def _offline(path, spec="default"):
    with TraceReader(path) as reader:
        return check_trace(reader, load(spec))


def test_the_trace_gives_the_rules_the_numbers_of_the_live_records(tmp_path):
    records = _records(nan_at=53)
    path = _write(str(tmp_path / "t.h5"), records)
    with TraceReader(path) as reader:
        steps = list(trace_steps(reader))
    assert [s.step for s in steps] == [r.step for r in records]
    for rec, st in zip(records, steps):
        assert st.names == rec.names
        live, off = StepContext(rec), StepContext(st, st.stats)
        for stat in S.STAT_NAMES:                  # bit for bit, NaN where NaN
            assert np.array_equal(live.col(stat), off.col(stat), equal_nan=True), (rec.step, stat)
        assert live.nonfinite == off.nonfinite
        i = len(rec.names) - 1
        assert live.mean_of(i) == off.mean_of(i)
    # steps with the same series share one names list, as the recorder's do
    assert steps[0].names is steps[1].names


def test_offline_findings_equal_the_live_invokers(tmp_path):
    records = _records(nan_at=53)
    result = _offline(_write(str(tmp_path / "t.h5"), records))
    assert result.rules_run == OFFLINE
    assert {s.rule for s in result.skipped} == NOT_ON_HAND_WRITTEN
    live = [f for f in _live(records) if f["rule"] in OFFLINE]
    assert [f["rule"] for f in live] == ["loss_not_decreasing", "nonfinite"]
    assert [_clean(f.as_dict()) for f in result.findings] == live
    assert result.findings[1].tensor == "fc2" and result.findings[1].step == 53
    assert result.steps_checked == 60 and not result.unchecked and not result.errors


def test_steps_the_live_rules_never_saw_are_not_checked_and_named(tmp_path):
    result = _offline(_write(str(tmp_path / "t.h5"), _records(n=12, nan_at=11, partial_last=True)))
    assert result.steps_checked == 11 and result.findings == []
    assert result.unchecked == [(11, "the run ended inside it")]
    # hand-written updates: the last step's record closes after the last step end, and the live
    # run judges it at its end (it did not: a NaN loss at a by-hand loop's last step was no finding)
    result = _offline(_write(str(tmp_path / "m.h5"), _records(n=12, nan_at=11, optimizer_steps=0)))
    assert result.steps_checked == 12 and result.unchecked == []
    assert [(f.rule, f.step) for f in result.findings] == [("nonfinite", 11)]


def test_a_series_first_seen_after_others_of_its_kind_skips_the_order_rules(tmp_path):
    records = _records(nan_at=53, late_act_at=5)
    result = _offline(_write(str(tmp_path / "t.h5"), records))
    assert result.rules_run == ["loss_not_decreasing", "loss_explodes", "zero_gradients"]
    order = [s for s in result.skipped if s.need == "order"]
    assert [s.rule for s in order] == ["nonfinite"]
    assert "act embed first appears at step 5" in order[0].reason
    assert [f.rule for f in result.findings] == ["loss_not_decreasing"]


class _AsksForOptimizers(Rule):
    """A rule that forgot to say it reads the optimizers."""
    id = "asks"

    def check(self, ctx):
        return [self.finding(ctx, f"{len(ctx.optimizers)} optimizers")]


def test_a_rule_that_asks_a_trace_for_the_optimizers_fails_out_loud(tmp_path):
    path = _write(str(tmp_path / "t.h5"), _records(n=3))
    engine = RuleEngine([_AsksForOptimizers()])
    with TraceReader(path) as reader:
        result = check_trace(reader, engine)
    assert result.findings == []
    assert result.errors == ["rule asks failed and is disabled: OfflineUnavailable: "
                             "a trace does not keep the optimizers"]


def test_the_engine_is_left_as_it_was(tmp_path):
    path = _write(str(tmp_path / "t.h5"), _records(n=3))
    engine = load("default")
    engine.set_enabled("loss_not_decreasing", False)
    with TraceReader(path) as reader:
        result = check_trace(reader, engine)
    assert result.rules_run == ["nonfinite", "loss_explodes", "zero_gradients"]
    assert "loss_not_decreasing" not in {s.rule for s in result.skipped}     # disabled: neither run nor skipped
    assert {r.id for r in engine.rules if r.enabled} == {r.id for r in load("default").rules} - {"loss_not_decreasing"}
    assert "module_types" not in vars(engine)


# -- the command ----------------------------------------------------------------------------

def _cli(*args):
    return CliRunner().invoke(cli, ["check-trace", *args])


def test_check_trace_text_json_and_exit_codes(tmp_path):
    path = _write(str(tmp_path / "t.h5"), _records(nan_at=53))
    r = _cli(path)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].startswith("nndb: warning: loss_not_decreasing at step 49 [check-trace]: loss has not gone down")
    assert lines[1] == ("nndb: error: nonfinite at step 53 [check-trace]: NaN first appeared in act fc2 (3 element(s)); "
                        "its norm at step 52 was " + lines[1].rsplit(" ", 1)[1])
    assert lines[2].startswith("nndb: not run on a trace: exploding_gradient, vanishing_gradient, update_ratio, "
                               "param_not_updated (they read the optimizers")
    assert lines[-1] == (f"nndb: {path}: 60 step(s) checked with 4 rule(s): 2 findings "
                         "(the run alone: 0, this re-check alone: 2, both: 0)")
    d = json.loads(_cli(path, "--json").output)
    assert [f["rule"] for f in d["findings"]] == ["loss_not_decreasing", "nonfinite"]
    assert {s["rule"] for s in d["skipped"]} == NOT_ON_HAND_WRITTEN and d["rules_run"] == OFFLINE
    assert d["steps_checked"] == 60 and d["unchecked_steps"] == [] and d["status"] == "finished"
    # a rule with the fail action that fires: the live run's exit code 4
    rules = tmp_path / "r.yaml"
    rules.write_text("default: none\nrules:\n  - id: nonfinite\n    action: fail\n"
                     "  - name: big_act\n    condition: max(act.max) > 100\n")
    r = _cli(path, "--rules", str(rules))
    assert r.exit_code == EXIT_FAIL_ACTION, r.output
    assert r.output.splitlines()[0].startswith("nndb: error: nonfinite at step 53 [check-trace]:")
    assert "not run on a trace" not in r.output


def test_check_trace_errors_are_one_line_with_exit_code_2(tmp_path):
    for bad in (str(tmp_path / "missing.h5"), str(tmp_path)):
        r = _cli(bad)
        assert r.exit_code == EXIT_USAGE and r.output.count("\n") == 1 and r.output.startswith("nndb: error: ")
    junk = tmp_path / "junk.h5"
    junk.write_text("not hdf5")
    r = _cli(str(junk))
    assert r.exit_code == EXIT_USAGE and "is not an nndb trace" in r.output
    path = _write(str(tmp_path / "t.h5"), _records(n=2))
    rules = tmp_path / "r.yaml"
    rules.write_text("rules:\n  - id: no_such_rule\n")
    r = _cli(path, "--rules", str(rules))
    assert r.exit_code == EXIT_USAGE and r.output.startswith(f"nndb: error: {rules}:2:")


# -- the live runs of the examples ----------------------------------------------------------

# (script, its arguments, run as a subprocess of the real command line; else
# through the same driver in this process, which saves a torch import a run)
EXAMPLES = [("nan_lr.py", ["--steps", "10"], True), ("raises.py", ["--steps", "6"], True),
            ("manual_sgd.py", ["--steps", "6"], True), ("dead_relu.py", ["--steps", "70"], False),
            ("raw_pixels.py", ["--steps", "70"], False), ("no_zero_grad.py", ["--steps", "6"], False),
            ("frozen_backbone.py", ["--steps", "6"], False), ("mlp.py", ["--steps", "6"], False),
            ("cnn.py", ["--steps", "4"], False)]


def _run_live(script, args, trace, report, subprocess):
    if subprocess:
        live = nndb("run", "--batch", "-q", "--report", report, "--trace", trace, script, *args)
        assert live.returncode in (0, 1), live.stderr
        return
    import gc
    from nndb.run.config import RunConfig
    from nndb.driver import DebugOptions, debug
    from nndb.frontends.batch import ScriptedFrontend
    from nndb.run.launcher import Target
    gc.collect()     # an earlier test's optimizers must not look alive to the step clock
    cfg = RunConfig(Target(path=script, args=list(args)), trace, quiet=True)
    debug(cfg, DebugOptions(batch=True, no_rc=True, report=report), ScriptedFrontend([]))


@pytest.mark.parametrize("script,args,subprocess", EXAMPLES, ids=[s for s, _, _ in EXAMPLES])
def test_check_trace_gives_the_live_runs_findings(tmp_path, script, args, subprocess):
    trace, report = str(tmp_path / "t.h5"), str(tmp_path / "r.json")
    _run_live(example(script), args, trace, report, subprocess)
    d, findings = _compare(trace, report)
    # what makes these runs worth comparing: the examples' planted bugs (double_softmax.py's loss
    # falls steadily, 0.5% by step 49 and 4% by 96: no longer a flat loss; raw pixels' is flat)
    expected = {"nan_lr.py": ["update_ratio", "loss_explodes", "exploding_gradient", "nonfinite"],
                "dead_relu.py": ["zero_gradients", "loss_not_decreasing"],
                "raw_pixels.py": ["update_ratio", "loss_explodes", "loss_not_decreasing"]}
    assert [f["rule"] for f in d["findings"]] == expected.get(script, [])
    unchecked = {"raises.py": 3}
    assert [u["step"] for u in d["unchecked_steps"]] == ([unchecked[script]] if script in unchecked else [])


def _compare(trace, report):
    """check-trace's findings on ``trace`` are the live run's (``report``) for every rule it runs."""
    with open(report) as fh:
        findings = json.load(fh)["findings"]
    r = _cli(trace, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["rules_run"] == WITH_OPTIMIZERS and {s["rule"] for s in d["skipped"]} == PROBES
    assert _found_by(d, "check-trace") == [f for f in findings if f["rule"] in WITH_OPTIMIZERS]
    assert _found_by(d, "run") == findings      # every finding the run stored, marked as the run's
    assert d["errors"] == []
    return dict(d, findings=_found_by(d, "check-trace")), findings


def _found_by(d: dict, who: str) -> list:
    """check-trace --json's findings that ``who`` (run, check-trace) found, without the mark."""
    return [{k: v for k, v in f.items() if k != "found_by"} for f in d["findings"] if who in f["found_by"]]


# A planted bug: a scheduler multiplies the learning rate by FACTOR from step
# CHANGE on (the rules see it from that step's end: step 11's ended at its
# optimizer step, before the scheduler's).
SCHEDULED = """
import sys
import torch
torch.manual_seed(0)
factor, change = float(sys.argv[1]), int(sys.argv[2])
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD([{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.02}], lr=0.01)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 if i < change else factor)
x, y = torch.randn(64, 16), torch.randn(64, 4)
for step in range(40):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    sched.step()
"""


@pytest.mark.parametrize("factor,fires", [(1000.0, "update_ratio"), (0.0, "param_not_updated"), (2.0, None)])
def test_a_scheduler_that_changes_the_lr_mid_run_gives_the_same_findings_live_and_offline(tmp_path, factor, fires):
    script = tmp_path / "scheduled.py"
    script.write_text(SCHEDULED)
    trace, report = str(tmp_path / "t.h5"), str(tmp_path / "r.json")
    _run_live(str(script), [str(factor), "12"], trace, report, False)
    d, _ = _compare(trace, report)
    rules = [f["rule"] for f in d["findings"]]
    assert (fires in rules) if fires else not set(rules) & set(OPTIMIZERS), rules
    with TraceReader(trace) as reader:
        lrs = [(r["step"], r["group"], r["lr"]) for r in reader.hyper()]
    # written when they change: each group's at the start, then once more at the change
    assert lrs == [(0, 0, 0.01), (0, 1, 0.02), (12, 0, 0.01 * factor), (12, 1, 0.02 * factor)]
    if fires:
        f = next(f for f in d["findings"] if f["rule"] == fires)
        assert f["evidence"]["lr"] == pytest.approx((0.01 if "0." in f["tensor"] else 0.02) * factor)


def test_on_a_trace_written_before_the_optimizers_were_recorded_their_rules_say_why(tmp_path):
    from test_store import _as_written_before_optimizers
    trace, report = str(tmp_path / "t.h5"), str(tmp_path / "r.json")
    _run_live(example("nan_lr.py"), ["--steps", "10"], trace, report, False)
    _as_written_before_optimizers(trace)
    d = json.loads(_cli(trace, "--json").output)
    assert d["rules_run"] == OFFLINE + ["epoch_repeats", "duplicate_batches"]
    assert [f["rule"] for f in _found_by(d, "check-trace")] == ["loss_explodes", "nonfinite"]
    why = {s["rule"]: s for s in d["skipped"] if s["need"] == "optimizers"}
    assert list(why) == OPTIMIZERS
    assert "the trace predates the optimizers' records" in why["update_ratio"]["reason"]


# Gradients that explode under clip_grad_norm_: the loss's scale grows 10x a step from
# step 20, the gradients the optimizer applies stay clipped to a total norm of 1.
CLIPPED = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = torch.randn(64, 8), torch.randn(64, 1)
for step in range(40):
    opt.zero_grad()
    scale = 1.0 if step < 20 else 10.0 ** min(step - 19, 6)
    loss = torch.nn.functional.mse_loss(model(x), y) * scale
    loss.backward()
    total = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    print(step, repr(loss.item()), repr(total.item()))
"""


def test_a_clip_that_clips_nothing_is_not_called_clipping_live_and_offline(tmp_path):
    """clip_grad_norm_(params, 1e9) clips nothing (a script that only reads the total norm):
    exploding_gradient said 'the gradients the optimizer applies are clipped, so their
    norms do not show it' of its total of 1.1e5.  It says whether the call clipped
    (total > max_norm), on the trace too (its ``clips`` rows keep max_norm)."""
    script = tmp_path / "unclipped.py"
    # (the loss times 1e5 from step 20, the learning rate divided by as much: the run does not diverge)
    script.write_text(CLIPPED.replace("clip_grad_norm_(model.parameters(), 1.0)",
                                      "clip_grad_norm_(model.parameters(), 1e9)")
                      .replace("10.0 ** min(step - 19, 6)", "1e5")
                      .replace("    opt.step()\n", "    opt.param_groups[0]['lr'] = 0.05 / scale\n    opt.step()\n"))
    trace, report = str(tmp_path / "t.h5"), str(tmp_path / "r.json")
    _run_live(str(script), [], trace, report, True)
    d, findings = _compare(trace, report)
    [f] = [f for f in d["findings"] if f["rule"] == "exploding_gradient" and f["tensor"] == "clip_grad_norm_"]
    printed = [float(line.split()[2]) for line in python_out(script)]
    assert max(printed) < 1e9 and f["step"] == 22 and f["evidence"]["grad_norm"] == printed[22], (printed, f)
    assert f["message"].startswith(f"exploding gradient: clip_grad_norm_ returned a total norm of {fmt(printed[22])} "
                                   f"at step 22"), f["message"]
    assert f["message"].endswith("; it did not clip them (max_norm 1e+09): the optimizer applies them as they "
                                 "are"), f["message"]
    assert "clipped" not in f["message"] and f["evidence"]["clipped"] is False, f
    assert f["evidence"]["max_norm"] == 1e9
    from nndb.store.reader import TraceReader
    with TraceReader(trace) as t:
        assert t.clips() == [{"step": 0, "clips": {"clip_grad_norm_": [1e9, False]}}]


# accelerate's (and so the HF Trainer's) clipping: the total norm computed by get_total_norm,
# the clipping by clip_grads_with_norm_, torch.nn.utils.clip_grad_norm_ never called
ACCELERATE_CLIP = """    from torch.nn.utils import clip_grads_with_norm_, get_total_norm
    params = list(model.parameters())
    total = get_total_norm([p.grad for p in params], 2.0)
    clip_grads_with_norm_(params, 1.0, total)
"""


@pytest.mark.parametrize("how", ["clip_grad_norm_", "accelerate"])
def test_gradients_exploding_under_clipping_are_found_live_and_offline(tmp_path, how):
    """The gradients recorded are those the optimizer applies (clipped): no weight's norm
    grew, and exploding_gradient said nothing.  clip_grad_norm_'s total norm, recorded as
    the grad series 'clip_grad_norm_', shows it; the rule reads it, on the trace too.
    accelerate clips without clip_grad_norm_ (the Trainer's 'grad_norm' 1.62 where nndb
    had no series): clip_grads_with_norm_'s total norm is the same series."""
    script = tmp_path / "clipped.py"
    script.write_text(CLIPPED if how == "clip_grad_norm_" else CLIPPED.replace(
        "    total = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n", ACCELERATE_CLIP))
    trace, report = str(tmp_path / "t.h5"), str(tmp_path / "r.json")
    _run_live(str(script), [], trace, report, True)
    d, findings = _compare(trace, report)
    exploding = [f for f in d["findings"] if f["rule"] == "exploding_gradient"]
    assert len(exploding) == 1, d["findings"]
    f = exploding[0]
    assert f["tensor"] == "clip_grad_norm_" and f["step"] == 26, f
    assert f["evidence"]["steps"] == [24, 26] and f["evidence"]["before_clipping"] is True
    [le] = [f for f in d["findings"] if f["rule"] == "loss_explodes"]     # (it clips: no "no gradient clipping?")
    assert le["message"].endswith("the run diverges (a learning rate far too high?)"), le["message"]
    assert f["message"].startswith("exploding gradient before clipping: clip_grad_norm_ returned a total norm of "
                                   "1.101e+05 at step 26 (2.794e+05x its early median 0.3940)"), f["message"]
    assert f["message"].endswith("it clipped them to max_norm 1, so the norms of the gradients the optimizer "
                                 "applies do not show it") and f["evidence"]["clipped"] is True, f["message"]
    printed = [float(line.split()[2]) for line in python_out(script)]
    import nndb
    steps, norms = nndb.open(trace).history("clip_grad_norm_", "grad", "norm")
    assert list(steps) == list(range(40)) and list(norms) == printed      # the returned values, bit for bit


def python_out(script):
    from conftest import python
    r = python(str(script), forked=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


NAN_UNDER_CLIPPING = """
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
X = torch.randn(256, 20); Y = X[:, :4].argmax(1)
for step in range(8):
    i = torch.arange(step * 16, step * 16 + 16)
    loss = F.cross_entropy(model(X[i]), Y[i])
    if step == 2:
        loss = loss * torch.log(torch.tensor(-1.0))
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    opt.step()
    print(step, repr(loss.item()))
"""


def test_a_nan_under_clipping_is_nonfinites_not_an_exploding_gradient(tmp_path):
    """A NaN loss at step 2 under clip_grad_norm_ (Lightning's gradient_clip_val): after
    nonfinite's 'NaN first appeared in loss', exploding_gradient said 'exploding gradient
    before clipping: clip_grad_norm_ returned a total norm of nan at step 4 (holds NaN) ...
    it clipped them to max_norm 0.5', of a NaN that clipping makes every gradient.  A NaN
    total is not judged, as a weight's NaN gradient norm is not; live and on the trace."""
    script = tmp_path / "nan_clip.py"
    script.write_text(NAN_UNDER_CLIPPING)
    trace, report = str(tmp_path / "t.h5"), str(tmp_path / "r.json")
    _run_live(str(script), [], trace, report, False)
    d, findings = _compare(trace, report)
    assert [(f["rule"], f["step"]) for f in findings] == [("nonfinite", 2)], findings
    assert findings[0]["message"].startswith("NaN first appeared in loss"), findings[0]["message"]


GENERATOR_FIRST_GAN = """
import sys
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(1)
G = nn.Sequential(nn.Linear(8, 32), nn.LeakyReLU(0.2), nn.Linear(32, 16), nn.Tanh())
D = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
opt_g = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
data = torch.randn(512, 16) * 0.5 + 1.0
for step in range(6):
    real = data[step * 32:(step + 1) * 32]
    if step == 4 and sys.argv[1] == "data":
        real = real * float("nan")
    z = torch.randn(32, 8)
    valid, fake = torch.ones(32, 1), torch.zeros(32, 1)
    g_loss = F.binary_cross_entropy_with_logits(D(G(z)), valid)
    if step == 4 and sys.argv[1] == "generator":
        g_loss = g_loss * float("nan")
    opt_g.zero_grad(); g_loss.backward(); opt_g.step()
    d_loss = (F.binary_cross_entropy_with_logits(D(real), valid)
              + F.binary_cross_entropy_with_logits(D(G(z).detach()), fake)) / 2
    opt_d.zero_grad(); d_loss.backward(); opt_d.step()
    print(step, repr(g_loss.item()), repr(d_loss.item()))
"""


@pytest.mark.parametrize("planted", ["generator", "data"])
def test_a_nan_of_a_gans_first_pass_is_not_pinned_on_a_later_passs_activation(tmp_path, planted):
    """Lightning's GAN shape, the generator's pass first: a NaN generator loss at step 4 made
    the generator NaN in its update, and the discriminator's pass then ran on a NaN fake
    batch.  nonfinite said 'NaN first appeared in act D.0 (1024 element(s))', a layer of the
    later pass: activations add up over the step's passes and were put before every loss.
    It says that the first optimizer's loss, NaN too, may have come first.  A NaN batch of
    real data in the discriminator's pass (the generator's loss finite) is its layer's."""
    script = tmp_path / "gan.py"
    script.write_text(GENERATOR_FIRST_GAN)
    trace, report = str(tmp_path / "t.h5"), str(tmp_path / "r.json")
    _run_live(str(script), [planted], trace, report, False)
    d, findings = _compare(trace, report)
    [nf] = [f for f in findings if f["rule"] == "nonfinite"]
    assert nf["step"] == 4 and nf["message"].startswith("NaN first appeared in act D.0"), nf
    if planted == "generator":
        assert "; or in loss/opt_g: the step ran 2 optimizers' passes in turn" in nf["message"], nf["message"]
        assert nf["evidence"]["or_loss"] == "loss/opt_g"
    else:
        assert "or in" not in nf["message"] and "or_loss" not in nf["evidence"], nf["message"]


def test_each_clip_grad_norm_call_is_a_series_a_watch_reads(tmp_path):
    """Two clip_grad_norm_ calls a step (a GAN's two networks): 'clip_grad_norm_' and
    'clip_grad_norm_#2', in call order; a watch on one stops at the step it crossed."""
    script = tmp_path / "two.py"
    script.write_text(CLIPPED.replace(
        "    total = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n",
        "    total = torch.nn.utils.clip_grad_norm_(model[0].parameters(), 1.0)\n"
        "    torch.nn.utils.clip_grad_norm_(model[2].parameters(), 1.0)\n"))
    r = nndb("run", "--batch", "--nx", "--rules", "none", "--trace", str(tmp_path / "t.h5"), "--force",
             "-e", "watch grad clip_grad_norm_ > 50", "-e", "continue", "-e", 'p ("AT", $step)', "-e", "kill",
             str(script), cwd=str(tmp_path))
    printed = {int(line.split()[0]): float(line.split()[2]) for line in python_out(script)}
    first = min(k for k, v in printed.items() if v > 50)
    assert f"Watchpoint 1: grad clip_grad_norm_ norm = " in r.stdout and f"('AT', {first})" in r.stdout, r.stdout
    import nndb as api
    t = api.open(str(tmp_path / "t.h5"))
    names = {(s.name, s.kind) for s in t.tensors}
    assert {("clip_grad_norm_", "grad"), ("clip_grad_norm_#2", "grad")} <= names
    steps, norms = t.history("clip_grad_norm_", "grad", "norm")
    assert [float(v) for v in norms] == [printed[int(s)] for s in steps]



HAND_CLIPPED = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
x, y = torch.randn(64, 8), torch.randn(64, 1)
for step in range(8):
    model.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y) * (1.0 if step < 5 else 100.0)
    loss.backward()
    total = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-0.5)
    print(step, repr(loss.item()), repr(total.item()))
"""


def test_a_hand_written_loop_s_clip_is_its_own_step_s_in_the_trace_and_for_a_watch(tmp_path):
    """word_language_model's loop (no optimizer: backward, clip_grad_norm_, p.data.add_): the
    step ends as backward() returns, and the clip that follows measured that step's
    gradients.  It went into the next step: the trace's clip_grad_norm_ at step 3 was
    step 2's total (0.2416 where the script's was 1.7196), and a watch on it stopped a step
    late.  Now each step holds its own total, and a watch names the step that crossed."""
    script = tmp_path / "hand.py"
    script.write_text(HAND_CLIPPED)
    r = nndb("run", "--batch", "--nx", "--rules", "none", "--trace", str(tmp_path / "t.h5"),
             "-e", "watch grad clip_grad_norm_ > 10", "-e", "continue", "-e", "kill", str(script), cwd=str(tmp_path))
    printed = {int(line.split()[0]): float(line.split()[2]) for line in python_out(script)}
    first = min(k for k, v in printed.items() if v > 10)
    assert f"Watchpoint 1: grad clip_grad_norm_ norm = {fmt(printed[first])} (> 10) at step {first}" in r.stdout, \
        r.stdout + r.stderr
    import nndb as api
    with api.open(str(tmp_path / "t.h5")) as t:
        steps, norms = t.history("clip_grad_norm_", "grad", "norm")
    assert list(steps) == list(range(len(steps))) and len(steps) >= first
    assert [float(v) for v in norms] == [printed[int(s)] for s in steps]
    # set at a later stop (the glob known from the record before it), and found in reverse:
    # step 'first''s total is judged at the end of the step after it, where rc goes
    r = nndb("run", "--batch", "--nx", "--rules", "none", "--trace", str(tmp_path / "t2.h5"), "-e", "until 7",
             "-e", "watch grad clip_grad_norm_ > 10", "-e", "rc", "-e", 'p ("AT", $step)', "-e", "kill",
             str(script), cwd=str(tmp_path))
    assert r.returncode == 0 and f"('AT', {first + 1})" in r.stdout, r.stdout + r.stderr


SPARE_OPTIMIZER_CLIP = """
import torch
torch.manual_seed(0)
m = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
spare = torch.optim.SGD(m.parameters(), lr=0.1)   # made up front, never stepped
x = torch.randn(8, 4); y = torch.randn(8, 1)
for step in range(4):
    loss = ((m(x) - y) ** 2).mean()
    loss.backward()
    n = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
    print(step, repr(n.item()))
    opt.step(); opt.zero_grad()
"""


def test_one_clip_a_step_beside_an_idle_optimizer_is_clip_grad_norm_each_step(tmp_path):
    """A second optimizer that never steps (accelerate's AcceleratedOptimizer around the
    Trainer's AdamW; one made up front) closes step 0 after the fact, when the first steps
    again: step 1's one clip_grad_norm_ counted step 0's and was 'clip_grad_norm_#2'
    (2.3267 at step 1 only; 'clip_grad_norm_' had steps 0, 2, 3)."""
    script = tmp_path / "spare.py"
    script.write_text(SPARE_OPTIMIZER_CLIP)
    r = nndb("run", "--batch", "-q", "--rules", "none", "--trace", str(tmp_path / "t.h5"), "--force",
             str(script), cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    printed = {int(line.split()[0]): float(line.split()[1]) for line in python_out(script)}
    import nndb as api
    t = api.open(str(tmp_path / "t.h5"))
    assert "clip_grad_norm_#2" not in {s.name for s in t.tensors}
    steps, norms = t.history("clip_grad_norm_", "grad", "norm")
    assert {int(s): float(v) for s, v in zip(steps, norms)} == printed


# An embedding table not named *embed* (word_language_model's is `encoder`), then a layer
# whose gradient a saturated sigmoid makes vanish: the layer spread leaves embeddings out.
EMBEDDING_ENCODER = """
import torch, torch.nn as nn
class LM(nn.Module):
    def __init__(self, vocab=200, dim=16):
        super().__init__()
        self.encoder, self.hidden, self.decoder = nn.Embedding(vocab, dim), nn.Linear(dim, dim), nn.Linear(dim, vocab)
    def forward(self, x):
        return self.decoder(torch.sigmoid(self.hidden(self.encoder(x))))
torch.manual_seed(0)
model = LM()
nn.init.constant_(model.hidden.bias, 9.0)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randint(0, 200, (8, 5)), torch.randint(0, 200, (8, 5))
for step in range(6):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    opt.step()
"""


def test_an_embedding_not_named_embed_is_left_out_of_the_layer_spread_offline_too(tmp_path):
    """The live run knows `encoder` is an nn.Embedding and leaves it out of vanishing_gradient's
    layer spread: it found hidden.weight at step 2 (2816x below decoder.weight).  check-trace,
    with only the names, took the table for a layer: it found encoder.weight instead (2.950e+04x,
    a finding the run never made) and missed the run's (pytorch/examples' word_language_model at
    lr 3000: the run's vanishing_gradient at step 4 on rnn.weight_hh_l0, none offline).  The
    trace's modules rows keep each module's class now."""
    script = tmp_path / "lm.py"
    script.write_text(EMBEDDING_ENCODER)
    trace, report = str(tmp_path / "t.h5"), str(tmp_path / "r.json")
    _run_live(str(script), [], trace, report, False)
    d, findings = _compare(trace, report)
    vanishing = [(f["step"], f["tensor"]) for f in d["findings"] if f["rule"] == "vanishing_gradient"]
    assert vanishing == [(2, "hidden.weight")]
    with TraceReader(trace) as reader:
        assert reader.module_types() == {"encoder": "Embedding", "hidden": "Linear", "decoder": "Linear",
                                         "model": "LM"}
