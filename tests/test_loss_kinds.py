"""Losses that are not meant to go down (nndb.rules.loss_watch's marks): a
policy-gradient surrogate and a loss chasing a moving target are told from
the loss of supervised training, live and on the trace, so that
loss_not_decreasing stays quiet on healthy reinforcement learning (it warned
on every actor-critic and DQN run of pytorch/examples' and the tutorials'
shapes) and still fires on a flat loss of a look-alike (a fixed teacher's
targets, a sample fed back as the model's input).  tests/scripts/loss_kinds.py."""
import os

import pytest

from conftest import ROOT, run_in_process

from nndb.rules.catalog import load
from nndb.rules.offline import check_trace
from nndb.store.reader import TraceReader

SCRIPT = os.path.join(ROOT, "tests", "scripts", "loss_kinds.py")


def _run(tmp_path, mode, steps, rule="loss_not_decreasing"):
    res = run_in_process(tmp_path, SCRIPT, [mode, steps])
    assert res.exit_code == 0
    assert all(r.enabled for r in res.session.rules.rules)     # no rule failed and was switched off
    live = [f for f in res.session.log.findings if f["rule"] == rule]
    path = str(tmp_path / "run.h5")
    with TraceReader(path) as reader:
        kinds = reader.records("loss_kind")
        offline = check_trace(reader, load("default"))
    assert rule in offline.rules_run
    return live, kinds, [f.as_dict() for f in offline.findings if f.rule == rule]


# Without the marks the first three warned "loss has not gone down" (actor-critic at step 49: the
# episodes' summed loss grows as they get longer; DQN at step 160 and 112 of 200).
@pytest.mark.parametrize("mode, steps, kind, line", [
    ("actor_critic", 60, "policy_gradient", "loss.backward()"),
    ("dqn", 200, "moving_target", "loss.backward()"),
    ("dqn_hand", 200, "moving_target", "loss.backward()"),
    ("reinforce", 30, "policy_gradient", "loss.backward()"),
])
def test_reinforcement_learning_losses_are_not_judged_on_their_trend(tmp_path, mode, steps, kind, line):
    live, kinds, offline = _run(tmp_path, mode, steps)
    assert live == [] and offline == []
    # one record, at an early step the loss probe looks at, naming the script's backward() line
    [rec] = kinds
    assert rec["kind"] == kind and rec["step"] <= 1
    file, no = rec["where"].split(":")
    assert file == "loss_kinds.py"
    with open(SCRIPT) as f:
        assert f.read().splitlines()[int(no) - 1].strip() == line


@pytest.mark.parametrize("mode", ["distill_flat", "feedback_flat", "logsoftmax_flat"])
def test_a_flat_loss_of_a_look_alike_is_still_found(tmp_path, mode):
    # a fixed teacher of another architecture makes the targets (distillation), a class sampled
    # from the model's output comes back as its next input, a hand-written cross-entropy subtracts
    # the logits' detached maximum (it was marked a moving target, and its flat loss not found):
    # none is a surrogate, and at lr 0 the loss is flat, live and on the trace alike
    live, kinds, offline = _run(tmp_path, mode, 60)
    assert kinds == []
    assert len(live) == 1 and "has not gone down" in live[0]["message"]
    assert [f["step"] for f in offline] == [live[0]["step"]]


def test_a_policy_gradient_surrogate_whose_scale_follows_the_rewards_does_not_explode(tmp_path):
    """pytorch/examples' actor_critic.py (CartPole, unmodified) got 'loss_explodes at step 403: loss
    went from 0.4018 to 912.1 (x2.27e+03)' as its episodes grew to 500 steps, on its way to solving
    the task.  Here a bandit's rewards become 300x larger half-way: without the mark, loss_explodes
    at step 32 (0.2947 to 123.8) and loss_not_decreasing at step 49."""
    for rule in ("loss_explodes", "loss_not_decreasing"):
        live, kinds, offline = _run(tmp_path, "bandit", 60, rule)
        assert live == [] and offline == [], rule
        assert [k["kind"] for k in kinds] == ["policy_gradient"]
    # nndb inspect says why the loss rules are quiet
    from nndb.api.inspect import summary
    from nndb.render.text import summary as text
    with TraceReader(str(tmp_path / "run.h5")) as reader:
        [line] = [x for x in text(summary(reader)).splitlines() if x.startswith("loss       a ")]
    assert line.startswith("loss       a policy-gradient surrogate") and "loss_explodes do not judge it" in line
    assert line.endswith(f"({kinds[0]['where']}, seen at step 0)")


def test_a_moving_target_that_explodes_is_still_found(tmp_path):
    """A DQN whose targets run away (no target network sync, a huge learning rate) is a divergence:
    the moving-target mark leaves loss_explodes judging it."""
    live, kinds, offline = _run(tmp_path, "dqn_diverge", 40, "loss_explodes")
    assert [k["kind"] for k in kinds] == ["moving_target"]
    assert len(live) == 1 and [f["step"] for f in offline] == [live[0]["step"]]
