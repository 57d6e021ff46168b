"""A soft actor-critic loop on a toy continuous environment (no gym): an environment step
between updates, a replay buffer, twin Q networks under one optimizer, their target copies
moved by hand (Polyak averaging of ``.data``), an actor whose ``get_action`` calls
``self(x)``, a temperature ``log_alpha`` trained by an optimizer of its own, and the actor
and temperature updated ``policy_frequency`` times every ``policy_frequency`` environment
steps: the optimizers step in an irregular order (q | q actor alpha actor alpha | q | ...).
Prints each optimizer step's loss; ``--save PATH`` saves the weights at the end."""
import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--learning-starts", type=int, default=8)
parser.add_argument("--policy-frequency", type=int, default=2)
parser.add_argument("--save", default="")
args = parser.parse_args()

torch.manual_seed(1)
rng = np.random.default_rng(1)
OBS, ACT = 3, 1


class Env:
    """s' = 0.9 s + a (on the first coordinate) + noise; reward -|s'|^2."""

    def reset(self):
        self.s = rng.normal(size=OBS).astype(np.float32)
        return self.s

    def step(self, a):
        s = 0.9 * self.s + 0.05 * rng.normal(size=OBS).astype(np.float32)
        s[0] += float(a[0])
        self.s = s.astype(np.float32)
        return self.s, -float((self.s ** 2).sum())


class SoftQ(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(OBS + ACT, 32), nn.Linear(32, 32), nn.Linear(32, 1)

    def forward(self, x, a):
        h = F.relu(self.fc1(torch.cat([x, a], 1)))
        return self.fc3(F.relu(self.fc2(h)))


class Actor(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(OBS, 32), nn.Linear(32, 32)
        self.fc_mean, self.fc_logstd = nn.Linear(32, ACT), nn.Linear(32, ACT)

    def forward(self, x):
        h = F.relu(self.fc2(F.relu(self.fc1(x))))
        return self.fc_mean(h), torch.tanh(self.fc_logstd(h)).clamp(-5, 2)

    def get_action(self, x):
        mean, log_std = self(x)
        normal = torch.distributions.Normal(mean, log_std.exp())
        u = normal.rsample()
        a = torch.tanh(u)
        log_prob = (normal.log_prob(u) - torch.log(1 - a.pow(2) + 1e-6)).sum(1)
        return a, log_prob


actor, qf1, qf2 = Actor(), SoftQ(), SoftQ()
qf1_target, qf2_target = SoftQ(), SoftQ()
qf1_target.load_state_dict(qf1.state_dict())
qf2_target.load_state_dict(qf2.state_dict())
q_optimizer = torch.optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=1e-3)
actor_optimizer = torch.optim.Adam(actor.parameters(), lr=3e-4)
log_alpha = torch.zeros(1, requires_grad=True)
alpha = log_alpha.exp().item()
a_optimizer = torch.optim.Adam([log_alpha], lr=1e-3)
target_entropy = -float(ACT)

buf_obs, buf_act, buf_rew, buf_next = [], [], [], []
env = Env()
obs = env.reset()
for global_step in range(args.steps):
    if global_step < args.learning_starts:
        action = rng.uniform(-1, 1, size=ACT).astype(np.float32)
    else:
        with torch.no_grad():
            action = actor.get_action(torch.tensor(obs)[None])[0][0].numpy()
    next_obs, reward = env.step(action)
    buf_obs.append(obs), buf_act.append(action), buf_rew.append(reward), buf_next.append(next_obs)
    obs = next_obs
    if global_step > args.learning_starts:
        idx = rng.integers(0, len(buf_obs), size=16)
        o = torch.tensor(np.stack([buf_obs[i] for i in idx]))
        a = torch.tensor(np.stack([buf_act[i] for i in idx]))
        r = torch.tensor([buf_rew[i] for i in idx], dtype=torch.float32)
        o2 = torch.tensor(np.stack([buf_next[i] for i in idx]))
        with torch.no_grad():
            a2, logp2 = actor.get_action(o2)
            q_next = torch.min(qf1_target(o2, a2), qf2_target(o2, a2)).view(-1) - alpha * logp2
            target = r + 0.99 * q_next
        qf_loss = F.mse_loss(qf1(o, a).view(-1), target) + F.mse_loss(qf2(o, a).view(-1), target)
        q_optimizer.zero_grad()
        qf_loss.backward()
        q_optimizer.step()
        print(f"{global_step} q_optimizer {qf_loss.item()!r}")
        if global_step % args.policy_frequency == 0:
            for _ in range(args.policy_frequency):
                pi, logp = actor.get_action(o)
                actor_loss = (alpha * logp - torch.min(qf1(o, pi), qf2(o, pi)).view(-1)).mean()
                actor_optimizer.zero_grad()
                actor_loss.backward()
                actor_optimizer.step()
                print(f"{global_step} actor_optimizer {actor_loss.item()!r}")
                with torch.no_grad():
                    _, logp = actor.get_action(o)
                alpha_loss = (-log_alpha.exp() * (logp + target_entropy)).mean()
                a_optimizer.zero_grad()
                alpha_loss.backward()
                a_optimizer.step()
                alpha = log_alpha.exp().item()
                print(f"{global_step} a_optimizer {alpha_loss.item()!r}")
        for net, tgt in ((qf1, qf1_target), (qf2, qf2_target)):
            for p, tp in zip(net.parameters(), tgt.parameters()):
                tp.data.copy_(0.005 * p.data + 0.995 * tp.data)

if args.save:
    torch.save({"actor": actor.state_dict(), "qf1": qf1.state_dict(), "qf1_target": qf1_target.state_dict(),
                "log_alpha": log_alpha.detach()}, args.save)
