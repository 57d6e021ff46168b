"""Planted stale_grad: optimizer.zero_grad() is never called: each step uses
the sum of all gradients so far."""
import torch.nn as nn

from rules_probes_kit import args, classes, optimizer, train

a = args(steps=8)
width = 16 + 16 * a.seed
model = nn.Sequential(nn.Linear(12, width), nn.Tanh(), nn.Linear(width, 3))
x, y = classes(48, 12, 3)
opt = optimizer(a.seed, model.parameters(), lr=1e-3)
train(model, opt, lambda step: (x[step % 3::3], y[step % 3::3]), a.steps, zero_grad=False)
