"""Planted update_ratio: a learning rate of 1e-9, a million times too small:
the weights do not move (update / weight ~1e-9)."""
import torch
import torch.nn as nn

from rules_probes_kit import args, classes, train

a = args(steps=10)
width = 32 + 16 * a.seed
model = nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, 5))
x, y = classes(64, 16, 5)
opt = (torch.optim.SGD if a.seed % 2 else torch.optim.Adam)(model.parameters(), lr=1e-9)
train(model, opt, lambda step: (x, y), a.steps)
