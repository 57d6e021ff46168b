"""Losses that are not meant to go down, and look-alikes that are (tests/test_loss_kinds.py).

    python loss_kinds.py MODE [STEPS] [SEED]

Reinforcement learning on a small cart-pole of our own (numpy physics, its own
RandomState), each step one optimizer step, as pytorch/examples and the DQN
tutorial write them:

- ``actor_critic``: one network with a policy and a value head; the episode's
  loss, the sum of ``-log_prob(a) * advantage`` and a value loss over its time
  steps, grows as the episodes get longer (a healthy run);
- ``reinforce``: a policy alone, ``torch.cat([-lp * G ...]).sum()``;
- ``bandit``: a contextual bandit's policy gradient whose rewards become 300x
  larger half-way (a harder level): the loss's scale follows the rewards';
- ``dqn``: a Q-network, a target network (a deep copy, synced every 25
  steps), Huber loss against ``r + gamma * max Q_target(s')`` made under
  ``no_grad``; ``dqn_hand``: the same with a hand-written squared error;
  ``dqn_diverge``: that at SGD lr 0.8, whose Q-values run away (a divergence).

Look-alikes whose loss must go down (all at lr 0 here: a flat loss, the
finding loss_not_decreasing exists for):

- ``distill_flat``: a student fitted to a fixed teacher of another
  architecture (its output made under no_grad is the target);
- ``feedback_flat``: a model fed the class it sampled from its own output at
  the last step, fitted to the true classes (the sample reaches the loss
  only through the model's input);
- ``logsoftmax_flat``: a cross-entropy written by hand, its log-softmax
  stabilised by ``logits - logits.max(...).detach()`` (the model's own output
  without gradient, but no target).

Prints one line a step with the loss (``.9g``).
"""
import copy
import math
import random
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Categorical

MODE = sys.argv[1]
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 60
SEED = int(sys.argv[3]) if len(sys.argv) > 3 else 0
random.seed(SEED)
np.random.seed(SEED)
torch.manual_seed(SEED)


class Pole:
    """A cart-pole: push left or right, reward 1 a time step until it falls."""

    def __init__(self, seed):
        self.rng = np.random.RandomState(seed)

    def reset(self):
        self.s = self.rng.uniform(-0.05, 0.05, 4)
        return self.s.astype(np.float32)

    def step(self, a):
        x, xd, th, thd = self.s
        f = 10.0 if a == 1 else -10.0
        ct, st = math.cos(th), math.sin(th)
        tmp = (f + 0.05 * thd * thd * st) / 1.1
        tha = (9.8 * st - ct * tmp) / (0.5 * (4.0 / 3.0 - 0.1 * ct * ct / 1.1))
        xa = tmp - 0.05 * tha * ct / 1.1
        self.s = np.array([x + 0.02 * xd, xd + 0.02 * xa, th + 0.02 * thd, thd + 0.02 * tha])
        done = abs(self.s[0]) > 2.4 or abs(self.s[2]) > 0.21
        return self.s.astype(np.float32), 1.0, bool(done)


def returns(rewards, gamma=0.99):
    R, out = 0.0, []
    for r in reversed(rewards):
        R = r + gamma * R
        out.insert(0, R)
    g = torch.tensor(out)
    return (g - g.mean()) / (g.std() + 1e-7) if len(out) > 1 else g


class ActorCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 64)
        self.pi = nn.Linear(64, 2)
        self.v = nn.Linear(64, 1)

    def forward(self, x):
        h = F.relu(self.body(x))
        return F.softmax(self.pi(h), dim=-1), self.v(h)


def actor_critic():
    env, net = Pole(SEED + 2), ActorCritic()
    opt = torch.optim.Adam(net.parameters(), lr=3e-2)
    for ep in range(STEPS):
        s, saved, rewards = env.reset(), [], []
        for _ in range(300):
            probs, v = net(torch.from_numpy(s))
            m = Categorical(probs)
            a = m.sample()
            saved.append((m.log_prob(a), v))
            s, r, done = env.step(a.item())
            rewards.append(r)
            if done:
                break
        pls, vls = [], []
        for (lp, v), G in zip(saved, returns(rewards)):
            pls.append(-lp * (G - v.item()))
            vls.append(F.smooth_l1_loss(v, torch.tensor([G])))
        opt.zero_grad()
        loss = torch.stack(pls).sum() + torch.stack(vls).sum()
        loss.backward()
        opt.step()
        print(f"step {ep} len {len(rewards)} loss {loss.item():.9g}")


def reinforce():
    env = Pole(SEED + 1)
    policy = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    for ep in range(STEPS):
        s, logps, rewards = env.reset(), [], []
        for _ in range(200):
            m = Categorical(F.softmax(policy(torch.from_numpy(s).unsqueeze(0)), dim=1))
            a = m.sample()
            logps.append(m.log_prob(a))
            s, r, done = env.step(a.item())
            rewards.append(r)
            if done:
                break
        loss = torch.cat([-lp * g for lp, g in zip(logps, returns(rewards))]).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {ep} len {len(rewards)} loss {loss.item():.9g}")


def bandit():
    policy = nn.Linear(4, 3)
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    x = torch.randn(64, 4)
    for step in range(STEPS):
        m = Categorical(logits=policy(x))
        a = m.sample()
        r = (a == 2).float() * (1.0 if step < STEPS // 2 else 300.0)
        loss = -(m.log_prob(a) * r).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.9g}")


def dqn(hand_written, lr=None):
    env = Pole(SEED)
    q = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
    target = copy.deepcopy(q)
    opt = torch.optim.Adam(q.parameters(), lr=1e-3) if lr is None else torch.optim.SGD(q.parameters(), lr=lr)
    buf, s, eps, step = [], env.reset(), 1.0, 0
    while step < STEPS:
        if random.random() < eps:
            a = random.randrange(2)
        else:
            with torch.no_grad():
                a = q(torch.from_numpy(s)).argmax().item()
        s2, r, done = env.step(a)
        buf = (buf + [(s, a, r, s2, done)])[-1000:]
        s = env.reset() if done else s2
        eps = max(0.05, eps * 0.99)
        if len(buf) < 64:
            continue
        batch = random.sample(buf, 32)
        S = torch.tensor(np.stack([b[0] for b in batch]))
        A = torch.tensor([b[1] for b in batch])
        R = torch.tensor([b[2] for b in batch], dtype=torch.float32)
        S2 = torch.tensor(np.stack([b[3] for b in batch]))
        D = torch.tensor([b[4] for b in batch], dtype=torch.float32)
        qsa = q(S).gather(1, A.unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            y = R + 0.99 * (1 - D) * target(S2).max(1)[0]
        loss = ((qsa - y) ** 2).mean() if hand_written else F.smooth_l1_loss(qsa, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            target.load_state_dict(q.state_dict())
        print(f"step {step} loss {loss.item():.9g}")
        step += 1


def _fit(opt, loss, step):
    """One step of a look-alike's supervised loop (lr 0 here), its loss printed."""
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.9g}")


def distill_flat():
    teacher = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))
    student = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(student.parameters(), lr=0.0)
    for step in range(STEPS):
        x = torch.randn(4096, 8)
        with torch.no_grad():
            soft = F.softmax(teacher(x), dim=1)
        loss = F.kl_div(F.log_softmax(student(x), dim=1), soft, reduction="batchmean")
        _fit(opt, loss, step)


def logsoftmax_flat():
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    for step in range(STEPS):
        x = torch.randn(512, 6)
        y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
        logits = model(x)
        z = logits - logits.max(dim=1, keepdim=True)[0].detach()      # (a stable log-softmax by hand)
        loss = -(z.gather(1, y[:, None]) - z.exp().sum(1, keepdim=True).log()).mean()
        _fit(opt, loss, step)


def feedback_flat():
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    last = torch.zeros(16, dtype=torch.long)
    for step in range(STEPS):
        x = torch.cat([torch.randn(16, 3), F.one_hot(last, 3).float()], dim=1)
        logits = model(x)
        y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
        loss = F.cross_entropy(logits, y)
        last = Categorical(logits=logits.detach()).sample()
        _fit(opt, loss, step)


{"actor_critic": actor_critic, "reinforce": reinforce, "bandit": bandit, "dqn": lambda: dqn(False), "dqn_hand": lambda: dqn(True),
 "dqn_diverge": lambda: dqn(True, float(sys.argv[4]) if len(sys.argv) > 4 else 0.8),
 "distill_flat": distill_flat, "feedback_flat": feedback_flat,
 "logsoftmax_flat": logsoftmax_flat}[MODE]()
