"""Healthy: a linear (or small MLP) regression trained full-batch until it has
converged: the loss reaches the noise floor within a few dozen steps and the
gradients shrink toward 0 (the last updates round away against the weights).
Sizes, model and optimizer vary with the seed."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from rules_probes_kit import args, regression, train

a = args(steps=60)
d = [4, 8, 6][a.seed % 3]
x, y = regression(256, d)
model = nn.Linear(d, 1) if a.seed % 3 != 2 else nn.Sequential(nn.Linear(d, 16), nn.Tanh(), nn.Linear(16, 1))
opt = [lambda p: torch.optim.SGD(p, lr=0.3), lambda p: torch.optim.Adam(p, lr=0.05),
       lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)][a.seed % 3](model.parameters())
train(model, opt, lambda step: (x, y), a.steps, loss_fn=F.mse_loss)
