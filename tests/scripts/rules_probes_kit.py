"""Shared by the rule-matrix scripts of the rules-probes topic (planted_*.py,
healthy_*.py here): the command line, synthetic data and a plain training
loop.  Plain PyTorch, no nndb; each script stays readable on its own."""
import argparse

import torch
import torch.nn.functional as F


def args(steps: int, **extra):
    """``--seed N`` (default 0) and ``--steps N``; seeds torch."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=steps)
    for name, default in extra.items():
        ap.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    return a


def classes(n: int, d: int, c: int, scale: float = 1.0):
    """A learnable classification set: labels from a random linear map of the inputs."""
    x = torch.randn(n, d)
    y = (x @ torch.randn(d, c)).argmax(1)
    return x * scale, y


def regression(n: int, d: int):
    """y = x @ w + noise, shaped (n, 1) like a one-output model's prediction."""
    x = torch.randn(n, d)
    return x, x @ torch.randn(d, 1) + 0.1 * torch.randn(n, 1)


def optimizer(seed: int, params, lr: float = 1e-2):
    """SGD with momentum, Adam or RMSprop, by seed."""
    kind = seed % 3
    if kind == 0:
        return torch.optim.SGD(params, lr=lr * 5, momentum=0.9)
    return (torch.optim.Adam if kind == 1 else torch.optim.RMSprop)(params, lr=lr * 0.3)


def train(model, opt, batch, steps: int, loss_fn=F.cross_entropy, zero_grad: bool = True, after=None):
    """``steps`` steps of: forward on ``batch(step)``, loss, backward, step; prints the loss."""
    for step in range(steps):
        x, y = batch(step)
        if zero_grad:
            opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item()!r}")
        if after is not None:
            after(step)
