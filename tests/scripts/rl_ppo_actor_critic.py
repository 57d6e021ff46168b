"""A PPO loop on a toy discrete environment (no gym): a rollout of ``--num-steps``
environment steps per iteration with actions sampled under ``torch.no_grad()``, GAE, then
``--update-epochs`` epochs of shuffled minibatches, each an Adam step after
``clip_grad_norm_``; the learning rate annealed by writing ``param_groups[0]['lr']`` at
each iteration's start.  The actor and the critic are two Tanh towers under one optimizer,
the actor's last layer initialised 100x smaller than the critic's (orthogonal, std 0.01 and
1), as cleanrl's ppo.py has them.  Prints each optimizer step's loss; ``--save PATH``
saves the weights at the end; ``--nan-at N`` plants a NaN observation in the batch of
optimizer step N (a broken sensor)."""
import argparse

import numpy as np
import torch
import torch.nn as nn
from torch.distributions.categorical import Categorical

parser = argparse.ArgumentParser()
parser.add_argument("--iterations", type=int, default=4)
parser.add_argument("--num-envs", type=int, default=2)
parser.add_argument("--num-steps", type=int, default=16)
parser.add_argument("--num-minibatches", type=int, default=2)
parser.add_argument("--update-epochs", type=int, default=2)
parser.add_argument("--lr", type=float, default=2.5e-4)
parser.add_argument("--nan-at", type=int, default=-1)
parser.add_argument("--save", default="")
parser.add_argument("--seed", type=int, default=1)
args = parser.parse_args()
OBS, ACTIONS = 4, 2
rng = np.random.default_rng(args.seed)
torch.manual_seed(args.seed)


class Envs:
    """Balance a drifting point: reward 1 a step until |x| > 2, then a new episode."""
    def reset(self):
        self.s = rng.normal(scale=0.1, size=(args.num_envs, OBS)).astype(np.float32)
        return self.s

    def step(self, actions):
        push = np.where(actions == 1, 0.1, -0.1).astype(np.float32)
        self.s = (self.s + 0.05 * rng.normal(size=self.s.shape) + push[:, None] * np.array([1, 0.5, 0, 0])).astype(
            np.float32)
        done = np.abs(self.s[:, 0]) > 2
        self.s[done] = rng.normal(scale=0.1, size=(int(done.sum()), OBS))
        return self.s, np.ones(args.num_envs, dtype=np.float32), done


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self):
        super().__init__()
        self.critic = nn.Sequential(layer_init(nn.Linear(OBS, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)),
                                    nn.Tanh(), layer_init(nn.Linear(64, 1), std=1.0))
        self.actor = nn.Sequential(layer_init(nn.Linear(OBS, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)),
                                   nn.Tanh(), layer_init(nn.Linear(64, ACTIONS), std=0.01))

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        probs = Categorical(logits=self.actor(x))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


agent = Agent()
optimizer = torch.optim.Adam(agent.parameters(), lr=args.lr, eps=1e-5)
batch_size = args.num_envs * args.num_steps
minibatch_size = batch_size // args.num_minibatches
obs = torch.zeros((args.num_steps, args.num_envs, OBS))
actions = torch.zeros((args.num_steps, args.num_envs))
logprobs, rewards = torch.zeros((args.num_steps, args.num_envs)), torch.zeros((args.num_steps, args.num_envs))
dones, values = torch.zeros((args.num_steps, args.num_envs)), torch.zeros((args.num_steps, args.num_envs))
envs = Envs()
next_obs, next_done = torch.tensor(envs.reset()), torch.zeros(args.num_envs)
updates = 0
for iteration in range(1, args.iterations + 1):
    optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / args.iterations) * args.lr
    for step in range(args.num_steps):
        obs[step], dones[step] = next_obs, next_done
        with torch.no_grad():
            action, logprob, _, value = agent.get_action_and_value(next_obs)
            values[step] = value.flatten()
        actions[step], logprobs[step] = action, logprob
        o, r, d = envs.step(action.numpy())
        rewards[step] = torch.tensor(r)
        next_obs, next_done = torch.tensor(o), torch.tensor(d, dtype=torch.float32)
    with torch.no_grad():
        next_value = agent.get_value(next_obs).reshape(1, -1)
        advantages, lastgaelam = torch.zeros_like(rewards), 0
        for t in reversed(range(args.num_steps)):
            nonterminal = 1.0 - (next_done if t == args.num_steps - 1 else dones[t + 1])
            nextvalues = next_value if t == args.num_steps - 1 else values[t + 1]
            delta = rewards[t] + 0.99 * nextvalues * nonterminal - values[t]
            advantages[t] = lastgaelam = delta + 0.99 * 0.95 * nonterminal * lastgaelam
        returns = advantages + values
    b_obs, b_logprobs, b_actions = obs.reshape(-1, OBS), logprobs.reshape(-1), actions.reshape(-1)
    b_advantages, b_returns, b_values = advantages.reshape(-1), returns.reshape(-1), values.reshape(-1)
    b_inds = np.arange(batch_size)
    for epoch in range(args.update_epochs):
        rng.shuffle(b_inds)
        for start in range(0, batch_size, minibatch_size):
            mb = b_inds[start:start + minibatch_size]
            mb_obs = b_obs[mb]
            if updates == args.nan_at:
                mb_obs = mb_obs.clone()
                mb_obs[0, 0] = float("nan")
            _, newlogprob, entropy, newvalue = agent.get_action_and_value(mb_obs, b_actions.long()[mb])
            logratio = newlogprob - b_logprobs[mb]
            ratio = logratio.exp()
            mb_adv = b_advantages[mb]
            mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
            pg_loss = torch.max(-mb_adv * ratio, -mb_adv * torch.clamp(ratio, 0.8, 1.2)).mean()
            newvalue = newvalue.view(-1)
            v_clipped = b_values[mb] + torch.clamp(newvalue - b_values[mb], -0.2, 0.2)
            v_loss = 0.5 * torch.max((newvalue - b_returns[mb]) ** 2, (v_clipped - b_returns[mb]) ** 2).mean()
            loss = pg_loss - 0.01 * entropy.mean() + v_loss * 0.5
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
            optimizer.step()
            print(f"update {updates} loss {loss.item()!r} lr {optimizer.param_groups[0]['lr']!r}")
            updates += 1

if args.save:
    torch.save(agent.state_dict(), args.save)
