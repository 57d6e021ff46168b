"""Planted nonfinite: a Poisson-style loss takes log() of a raw Linear output,
which is negative for some samples: NaN in the loss from step 0."""
import torch
import torch.nn as nn

from rules_probes_kit import args, optimizer, regression, train

a = args(steps=6)
n = 32 + 16 * a.seed
x, y = regression(n, 6)
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
opt = optimizer(a.seed, model.parameters())
train(model, opt, lambda step: (x, y.abs()), a.steps,
      loss_fn=lambda rate, target: (rate - target * torch.log(rate)).mean())
