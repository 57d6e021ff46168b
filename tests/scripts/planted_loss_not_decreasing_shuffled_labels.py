"""Planted loss_not_decreasing: the labels are drawn afresh for every batch
(a data pipeline that shuffles labels apart from their inputs): nothing to learn."""
import torch
import torch.nn as nn

from rules_probes_kit import args, optimizer, train

a = args(steps=40)
n, c = 48 + 16 * a.seed, 4
model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, c))
x = torch.randn(n, 10)
opt = optimizer(a.seed, model.parameters(), lr=3e-3)
train(model, opt, lambda step: (x, torch.randint(0, c, (n,))), a.steps)
