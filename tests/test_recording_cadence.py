"""What is measured on which step (the default recording's cadence): norms
every step, activations on the first 20 steps then one in 32 (--act-every),
all ten statistics at full steps; the rules on observed steps; the rules'
probes and PyTorch's global module hooks only in the steps that need them."""
import json
import math
import os
from types import SimpleNamespace

import numpy as np
import pytest
from torch.nn.modules import module as torch_module

from conftest import example, nndb, run_in_process

import nndb as nndb_api
from nndb import cadence
from nndb.run.config import RecordSchedule
from nndb.errors import UsageError
from nndb.rules import base
from nndb.rules.engine import RuleEngine
from nndb.store.reader import TraceReader
from nndb.tracer import stats as S


# -- the schedule ---------------------------------------------------------------------------------

def test_activation_schedule_default_and_every_step():
    s = RecordSchedule()
    got = [step for step in range(45) if s.acts(step)]
    assert got == list(range(20)) + [32]                                # (full steps: 0, 32, 64)
    assert all(RecordSchedule.parse(act_every=1).acts(step) for step in range(100))
    every2 = RecordSchedule.parse(every=2)                                # counted in recorded steps
    assert [step for step in range(80) if every2.acts(step)] == list(range(0, 40, 2)) + [64]
    window = RecordSchedule.parse(steps="100:")
    assert window.acts(100) and window.acts(119) and not window.acts(121) and window.acts(132)
    with pytest.raises(UsageError, match="--act-every must be a positive"):
        RecordSchedule.parse(act_every=0)
    assert "activations the first 20 recorded steps, then every 32" in s.describe()


def test_full_steps_are_observed_steps():
    # a full step records activations: off the observed steps it would pay for them a second time
    s = RecordSchedule()
    full = [step for step in range(100) if s.full(step)]
    assert full == [0, 32, 64, 96]
    assert all(base.observed(step) and s.acts(step) for step in full)
    assert "full statistics every 32 recorded step(s)" in s.describe()


def test_one_cadence_answers_for_the_recorder_the_rules_and_the_probes():
    from nndb.rules.bn_probe import BatchNormRunning
    from nndb.rules.grad_rules import GradPresence, GradReset
    from nndb.rules.model_probes import ModelInputs, ReluUnits
    c = RecordSchedule()
    for step in range(300):
        m = c.at(step)
        assert m.recorded and m.full == c.full(step) and m.acts == c.acts(step)
        assert m.observed == base.observed(step) == ReluUnits.wants(step)
        assert m.bn_stats == BatchNormRunning.wants(step) and m.input_probes == ModelInputs.wants(step)
        assert m.grad_reset == cadence.grad_reset(step) and GradReset.wants(SimpleNamespace(_grown=True, _young=lambda s: False), step) == (m.grad_reset or
                                                                                       c.at(step + 1).grad_reset)
        assert m.grad_presence == GradPresence.wants(SimpleNamespace(_lacking=()), step)
        assert not m.big_acts or m.observed
    assert not c.at(5).grad_presence and c.at(50).grad_reset and c.at(51).grad_reset and not c.at(52).grad_reset
    assert c.at(64).input_probes and not c.at(32).input_probes
    outside = RecordSchedule.parse(steps="100:200").at(50)
    assert not any(outside)                                             # nothing measured off the recorded steps


@pytest.mark.parametrize("flags", [{}, {"every": 3}, {"steps": "40:90"}, {"full_every": 7, "act_every": 5},
                                   {"every": 100}])
def test_a_cadences_answers_hold_until_the_step_it_names(flags):
    """The recorder asks the cadence again only at ``until`` (issue 43: no call a step):
    every step before it has the same answers, the step it names has others (or the scan's end)."""
    c = cadence.Cadence.parse(**flags)
    asked = 0
    step = 0
    while step < 700:
        *answers, until = c.policies(step)
        asked += 1
        assert until > step
        for s in range(step, min(until, 700)):
            k, r = divmod(s - c.start, c.every)
            want = (r == 0 and s >= c.start and (c.stop is None or s < c.stop), k % c.full_every == 0 and r == 0,
                    r == 0 and (k < cadence.SETTLE or k % c.act_every == 0 or k % c.full_every == 0))
            assert tuple(answers) == want, (flags, s)
        assert until - step == c.SCAN or tuple(c.policies(until)[:3]) != tuple(answers)
        step = until
    if not flags:
        assert asked < 700 / 10          # (the default: asked twice in 32 steps after the first 20)


@pytest.mark.parametrize("fn", [cadence.observed, cadence.sampled, cadence.grad_reset_armed, cadence.grad_presence,
                                cadence.bn_stats])
def test_next_change_names_the_first_step_whose_answer_differs(fn):
    """The rules put their probes in and out only where a rhythm's answer changes."""
    for step in range(400):
        n = cadence.next_change(fn, step)
        assert all(fn(s) == fn(step) for s in range(step, n)) and fn(n) != fn(step), (fn.__name__, step, n)
    assert cadence.next_change(lambda s: True, 7) == 8          # (an unknown rhythm: asked at the next step)


def test_documented_recording_table_matches_the_cadence():
    import runpy
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    gen = runpy.run_path(os.path.join(root, "scripts", "gen_command_docs.py"))
    doc = open(os.path.join(root, "docs", "commands.md"), encoding="utf-8").read()
    table = gen["cadence_table"]()
    assert table.count("\n") >= 6 and f"{gen['CADENCE_START']}\n{table}\n{gen['CADENCE_END']}" in doc


# -- the statistics of the steps between full ones ------------------------------------------------

def test_norm_rows_equal_the_full_rows_norms():
    rng = np.random.default_rng(0)
    sizes = [7, 4096, 1, 300]
    flat = rng.standard_normal(sum(sizes)).astype(np.float32) * 3
    norm = S.host_norm_segments(flat.copy(), sizes)
    full = S.host_raw_segments(flat, sizes, True)
    # float32 sums between full steps, float64 at full steps: the same norm to float32's precision
    np.testing.assert_allclose(S.finalize_column(norm, "norm"), S.finalize_column(full, "norm"), rtol=1e-6)
    np.testing.assert_array_equal(norm[:, 0], sizes)
    assert np.isnan(S.finalize_column(norm, "min")).all() and np.isnan(S.finalize_column(norm, "mean")).all()
    assert not norm[:, 7:].any()                                        # no NaN, no Inf


def test_norm_rows_count_nan_and_inf_and_survive_overflow():
    flat = np.array([1, np.nan, 2, np.inf, -np.inf, 3e30, 3e30, 1, 2], dtype=np.float32)
    rows = S.host_norm_segments(flat, [3, 2, 2, 2])
    assert rows[:, 7].tolist() == [1, 0, 0, 0] and rows[:, 8].tolist() == [0, 2, 0, 0]
    assert S.finalize_column(rows, "norm")[0] == pytest.approx(math.sqrt(5))
    # squares beyond float32's range are not Inf: the exact path counts none
    assert S.finalize_column(rows, "norm")[2] == pytest.approx(math.sqrt(2) * 3e30, rel=1e-6)
    empty = S.host_norm_segments(np.array([1.0, 2.0], dtype=np.float32), [0, 2])
    assert empty[:, 0].tolist() == [0, 2] and S.finalize_column(empty, "norm")[1] == pytest.approx(math.sqrt(5))


def test_norm_rows_of_tiny_and_zero_segments_are_exact():
    # squares of 1e-22 underflow to 0 in float32: a tiny gradient must not read as exactly zero
    flat = np.array([1e-22, -1e-22, 0, 0, 1, 2], dtype=np.float32)
    rows = S.host_norm_segments(flat, [2, 2, 2])
    norms = S.finalize_column(rows, "norm")
    assert norms[0] == pytest.approx(math.sqrt(2) * 1e-22, rel=1e-6) and norms[1] == 0
    assert norms[2] == pytest.approx(math.sqrt(5))


@pytest.mark.parametrize("v", [2.5, -1.0, 0.0, float("nan"), float("inf"), float("-inf")])
def test_scalar_row_equals_the_array_row(v):
    a = S.finalize(S.scalar_raw(v))
    b = S.finalize(S.host_raw_one(np.array([v], dtype=np.float32)))
    np.testing.assert_array_equal(a, b)


# -- end to end -------------------------------------------------------------------------------------

def _act_steps(path, name="0"):
    with TraceReader(path) as t:
        steps, norms = t.history(t.find(name, "act")[0], "norm")
        return [int(s) for s, n in zip(steps, norms) if not math.isnan(n)], t


def test_run_records_activations_on_their_schedule(tmp_path):
    a, b = str(tmp_path / "a.h5"), str(tmp_path / "b.h5")
    assert nndb("run", "--trace", a, example("mlp.py"), "--steps", "40").returncode == 0
    assert nndb("run", "--act-every", "1", "--trace", b, example("mlp.py"), "--steps", "40").returncode == 0
    got, _ = _act_steps(a)
    assert got == list(range(20)) + [32]
    assert _act_steps(b)[0] == list(range(40))
    with TraceReader(a) as t:                 # the parameters' norms: every step, the same in both runs
        w = t.find("0.weight", "grad")[0]
        steps, norms = t.history(w, "norm")
        assert list(steps) == list(range(40)) and np.isfinite(norms).all()
        with TraceReader(b) as u:
            np.testing.assert_array_equal(norms, u.history(u.find("0.weight", "grad")[0], "norm")[1])
    r = nndb("run", "--act-every", "0", "--trace", str(tmp_path / "c.h5"), example("mlp.py"))
    assert r.returncode == 2 and "--act-every must be a positive" in r.stderr and "Traceback" not in r.stderr


def test_a_watch_on_activations_records_them_every_step(tmp_path):
    r = nndb("run", "--batch", "--trace", str(tmp_path / "w.h5"), "-e", "watch act 0 norm > 1e30",
             example("mlp.py"), "--steps", "30")
    assert r.returncode == 0, r.stderr
    assert _act_steps(str(tmp_path / "w.h5"))[0] == list(range(30))



def test_a_watch_on_the_loss_s_mean_leaves_the_other_tensors_on_their_schedule(tmp_path):
    """The loss has all ten statistics at every step: a CI job's `watch loss mean > 1000 fail`
    (and `watch loss`, whose statistic is the mean) measured every tensor's ten and every
    activation at every step of a batch run (a 7-layer MLP's loop: 6.75 s where it is 1.69 s).
    A watch on a gradient's mean still needs its tensors' at every step."""
    trace = str(tmp_path / "w.h5")
    r = nndb("run", "--batch", "--trace", trace, "-e", "watch loss mean > 1000 fail", "-e", "watch loss",
             example("mlp.py"), "--steps", "40")
    assert r.returncode == 0, r.stderr
    assert _act_steps(trace)[0] == list(range(20)) + [32]
    with nndb_api.open(trace) as t:
        assert list(t.history("0.weight", kind="grad", stat="mean")[0]) == [0, 32]
        assert list(t.history("loss", kind="loss", stat="mean")[0]) == list(range(40))
    r = nndb("run", "--batch", "--trace", trace, "--force", "-e", "watch grad 0.weight mean > 1000",
             example("mlp.py"), "--steps", "40")
    with nndb_api.open(trace) as t:
        assert list(t.history("0.weight", kind="grad", stat="mean")[0]) == list(range(40))

# -- rules and probes ---------------------------------------------------------------------------------

class _Counting(base.Rule):
    id = "counting"

    def reset(self):
        self.steps = []

    def check(self, ctx):
        self.steps.append(ctx.step)
        return ()


class _EveryStep(_Counting):
    id = "every"
    EVERY_STEP = True


def test_rules_run_on_observed_steps_unless_every_step():
    eng = RuleEngine([_Counting(), _EveryStep()])
    for r in eng.rules:
        r.reset()
    names = [("loss", "loss")]
    for step in range(40):
        rec = type("R", (), {"step": step, "names": names, "raw": np.array([S.scalar_raw(1.0)]),
                             "nonfinite": False})()
        eng.on_record(rec)
    assert eng.rules[0].steps == [s for s in range(40) if base.observed(s)] == list(range(20)) + [32]
    assert eng.rules[1].steps == list(range(40))


PROBED = '''
import torch, torch.nn as nn
from torch.nn.modules import module as M
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(32, 8), torch.randint(0, 2, (32,))
seen = []
for step in range(40):
    seen.append(len(M._global_forward_hooks) + len(M._global_forward_pre_hooks))
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
print(seen)
'''


def test_module_hooks_and_probes_only_in_the_steps_that_need_them(tmp_path, capsys):
    script = tmp_path / "probed.py"
    script.write_text(PROBED)
    before = len(torch_module._global_forward_hooks) + len(torch_module._global_forward_pre_hooks)
    res = run_in_process(tmp_path, str(script))
    seen = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    ours = [n - before for n in seen]
    # steps 0..19 and every 32nd (activations, the ReLU probe; the input probes sample on
    # observed steps): both hooks in; the others: none.  And before step 0's first forward the
    # fingerprints' input hook (nndb.tracer.fingerprint): one process, no shuffling DataLoader
    # found at step 0, so it is not put in again
    assert ours == [(2 if (s < 20 or s % base.EVERY == 0) else 0) + (s == 0) for s in range(40)]
    assert len(torch_module._global_forward_hooks) + len(torch_module._global_forward_pre_hooks) == before
    assert res.session.rules is not None


def test_a_failing_probe_is_said_once_and_the_run_goes_on(tmp_path, monkeypatch):
    """A probe that raises is switched off and said once, on the step it failed
    (probes are asked for errors only after steps they were in for), and the
    training and the other rules go on."""
    from nndb.rules.model_probes import ReluUnits

    def boom(self, module, use, args, output):
        raise RuntimeError("boom")
    monkeypatch.setattr(ReluUnits, "forward", boom)
    res = run_in_process(tmp_path, example("dead_relu.py"), ["--steps", "70"])     # (its flat loss is reported at 64)
    said = [line for line in res.session.frontend.output
            if "probe relu_units failed and is off: RuntimeError: boom" in line]
    assert said == ["nndb: probe relu_units failed and is off: RuntimeError: boom"]
    assert res.exit_code == 0
    assert "loss_not_decreasing" in {f["rule"] for f in res.session.log.findings}
    with TraceReader(str(tmp_path / "run.h5")) as r:
        assert r.n_steps == 70


@pytest.mark.parametrize("script", ["manual_sgd.py", "mlp.py"])
def test_full_statistics_land_on_the_observed_steps_in_every_loop_shape(tmp_path, script):
    """A hand-written update's parameters, updates and gradients had their
    full statistics a step early (30/31, 62/63): measured with the next
    step's policy.  Every kind now has them at steps 0, 32, 64, as the
    activations do and as docs/commands.md's cadence table says."""
    import nndb as api
    r = nndb("run", "--batch", "-q", "--rules", "none", "--trace", str(tmp_path / "t.h5"), example(script),
             "--steps", "80")
    assert r.returncode == 0, r.stderr
    with api.open(str(tmp_path / "t.h5")) as t:
        name = next(i.name for i in t.tensors if i.kind == "grad" and i.name.endswith("weight"))
        for kind in ("param", "update", "grad"):
            steps, values = t.history(name, kind, "mean")
            full = [int(s) for s, v in zip(steps, values) if not math.isnan(v)]
            assert full == [0, 32, 64], (kind, full)
