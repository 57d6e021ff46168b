"""Planted initial_loss (issue 19): F.cross_entropy on a network whose last
layer starts with weights of std 3: the first loss is many times ln(C)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from rules_probes_kit import args, classes, optimizer, train

a = args(steps=4)
c = 6 + 4 * a.seed
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, c))
with torch.no_grad():
    model[2].weight.normal_(0, 3.0)
x, y = classes(64, 16, c)
opt = optimizer(a.seed, model.parameters(), lr=1e-3)
train(model, opt, lambda step: (x, y), a.steps, loss_fn=lambda out, t: F.cross_entropy(out, t))
