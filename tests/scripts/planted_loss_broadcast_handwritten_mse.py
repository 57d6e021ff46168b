"""Planted loss_broadcast (issue 19): a hand-written ((pred - target) ** 2).mean()
with pred of shape (N, 1) and target of shape (N,): silently (N, N)."""
import torch.nn as nn

from rules_probes_kit import args, optimizer, regression, train

a = args(steps=6)
n = 32 + 16 * a.seed
x, y = regression(n, 8)
y = y.squeeze(1)                                          # (N,): the bug
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
opt = optimizer(a.seed, model.parameters())
train(model, opt, lambda step: (x, y), a.steps, loss_fn=lambda pred, target: ((pred - target) ** 2).mean())
