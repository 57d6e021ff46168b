"""Reinforcement-learning loop shapes (cleanrl's single-file PPO, DQN and SAC), in scripts of
the same shape with toy environments (tests/scripts/rl_*.py: no gym): environment steps
between updates, action sampling forwards, target networks copied by hand, optimizers that
step in an irregular order.  The script prints what plain Python prints, and nndb's steps,
losses and time travel are the script's own."""
import os
import re

import pytest

from conftest import ROOT, Ran, nndb, python
from nndb.store.reader import TraceReader

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork replicas need fork()")

SCRIPTS = os.path.join(ROOT, "tests", "scripts")
SAC = os.path.join(SCRIPTS, "rl_soft_actor_critic.py")


def _run(tmp_path, script, commands=(), *args, extra=()):
    argv = ["run", "--batch", "--nx", "--trace", str(tmp_path / "t.h5"), "--force", *extra]
    for c in commands:
        argv += ["-e", c]
    r = Ran(nndb(*argv, script, *args, cwd=str(tmp_path)), argv + [script, *args])
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return r


def _printed(out: str) -> list:
    """[(environment step, optimizer, loss)] as the SAC script prints them."""
    return [(int(s), o, float(v)) for s, o, v in re.findall(r"^(\d+) (\w+_optimizer) (\S+)$", out, re.M)]


def test_sac_each_optimizer_step_is_in_a_step_of_its_own(tmp_path):
    """cleanrl's SAC steps its critic at every environment step and its actor and
    temperature twice every other one (q | q actor alpha actor alpha | q | ...): from the
    third environment step of training on, two critic steps and the policy's made one
    nndb step, whose loss was the sum of the critic's two (97.23 = 56.44 + 40.79 on
    Pendulum; here 1.509 = 0.6204 + 0.8887).  No step holds two steps of one optimizer:
    each loss the script prints is a step's loss, in order, bit for bit, and 'goto' to a
    step closed as the critic stepped again stops at that step's own end."""
    plain = python(SAC, forked=True)
    assert plain.returncode == 0, plain.stderr
    r = _run(tmp_path, SAC, ["until 8", "goto 4", 'p ("AT", $step, global_step, repr($loss), repr(qf_loss.item()))',
                             "present", "continue"], extra=("--rules", "none"))
    assert _printed(r.stdout) == _printed(plain.stdout)
    printed = _printed(plain.stdout)
    with TraceReader(str(tmp_path / "t.h5")) as t:
        series = {}
        for name in ("loss", "loss/actor_optimizer", "loss/a_optimizer"):
            steps, values = t.history(t.find(name, "loss")[0], "mean")
            series[name] = [(int(s), float(v)) for s, v in zip(steps, values)]
    for name, opt in (("loss", "q_optimizer"), ("loss/actor_optimizer", "actor_optimizer"),
                      ("loss/a_optimizer", "a_optimizer")):
        assert [v for _, v in series[name]] == [v for _, o, v in printed if o == opt], name
    # step 4 is the critic's step at environment step 11 alone (closed as it stepped again at 12)
    assert series["loss"][2] == (4, printed[6][2]) and printed[6][:2] == (11, "q_optimizer"), series["loss"][:4]
    at = re.search(r"\('AT', (\d+), (\d+), '([^']+)', '([^']+)'\)", r.stdout)
    assert at and at.group(1, 2) == ("4", "11"), r.stdout
    assert float(at.group(3)) == float(at.group(4)) == printed[6][2], r.stdout


SELF_CALL = '''
import torch, torch.nn as nn
torch.manual_seed(0)


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))

    def forward(self, x):
        return self.body(x)

    def act(self, x):
        return torch.distributions.Categorical(logits=self(x))


def main():
    pi_net, value = Policy(), nn.Linear(3, 1)
    opt = torch.optim.Adam(list(pi_net.parameters()) + list(value.parameters()), lr=1e-2)
    for step in range(4):
        x = torch.randn(16, 3)
        dist = pi_net.act(x)
        a = dist.sample()
        loss = -(dist.log_prob(a) * value(x).detach().view(-1)).mean() + (value(x) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


main()
'''


def test_a_model_called_from_a_method_of_its_own_is_named_by_the_scripts_variable(tmp_path):
    """cleanrl's SAC calls its actor through ``actor.get_action(x)``, which calls ``self(x)``:
    the actor's parameters were named 'self.fc1.weight' (the variable found in the innermost
    frame, the method's own ``self``); they are 'actor.fc1.weight', as the script names it
    (and 'pi_net.body.0.weight' where the variable is a local of another function)."""
    _run(tmp_path, SAC, extra=("--rules", "none"))
    with TraceReader(str(tmp_path / "t.h5")) as t:
        names = {s.name for s in t.series() if s.kind == "param"}
    assert "actor.fc1.weight" in names and not any(n.startswith("self.") for n in names), sorted(names)
    (tmp_path / "s.py").write_text(SELF_CALL)
    _run(tmp_path, str(tmp_path / "s.py"), extra=("--rules", "none"))
    with TraceReader(str(tmp_path / "t.h5")) as t:
        names = {s.name for s in t.series() if s.kind == "param"}
    assert {"pi_net.body.0.weight", "value.weight"} <= names, sorted(names)


PPO = os.path.join(SCRIPTS, "rl_ppo_actor_critic.py")


def test_ppo_actor_and_critic_towers_are_no_exploding_gradient(tmp_path):
    """cleanrl's ppo.py on CartPole: 'exploding gradient in critic.4.weight: norm 0.08182 at step
    2 (1.941e+04x between the RMS gradients of critic.4.weight and actor.2.weight)'.  The actor's
    head is initialised 100x smaller than the critic's (std 0.01), which damps every gradient of
    the actor's tower, beside the critic's (another tower, under the same optimizer), and
    clip_grad_norm_(0.5) holds every gradient below 0.5: no gradient is exploding there.  The
    layer spread flags a largest gradient of min_norm (1) or more only, as the relative test
    does."""
    from conftest import findings_of, run_in_process
    res = run_in_process(tmp_path, PPO)
    assert res.exit_code == 0
    assert findings_of(res) == []


def test_ppo_loss_is_known_for_a_surrogate_through_the_rollout_buffers(tmp_path):
    """cleanrl's ppo.py on CartPole (256 updates): 'loss_not_decreasing at step 224: loss has
    not gone down in 225 recorded steps'.  Its loss is a policy-gradient surrogate (and its
    value loss chases returns made of the critic's own values), which the loss probe tells by
    the marks it carries from the model's outputs and samples; but the rollout writes each
    sample into a buffer made before it (``actions[step] = action``, ``values[step] = value``)
    and the marks stopped there.  A write into a tensor marks it with what was written."""
    _run(tmp_path, PPO)
    with TraceReader(str(tmp_path / "t.h5")) as t:
        assert [(k["kind"], k["step"]) for k in t.records("loss_kind")] == [("policy_gradient", 0)]
    r = Ran(nndb("inspect", str(tmp_path / "t.h5"), cwd=str(tmp_path)), ["inspect"], title="nndb inspect")
    line = next((l for l in r.stdout.splitlines() if l.startswith("loss ") and "surrogate" in l), None)
    assert line is not None and "a policy-gradient surrogate" in line, r.stdout
