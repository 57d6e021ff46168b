"""Planted bn_stats: features in the thousands feed a Linear then a
BatchNorm1d: its running variance climbs past 1e6 (eval mode normalises with it)."""
import torch.nn as nn

from rules_probes_kit import args, classes, optimizer, train

a = args(steps=8)
width = 16 + 8 * a.seed
model = nn.Sequential(nn.Linear(8, width), nn.BatchNorm1d(width), nn.ReLU(), nn.Linear(width, 3))
x, y = classes(64, 8, 3, scale=3000.0)
opt = optimizer(a.seed, model.parameters())
train(model, opt, lambda step: (x, y), a.steps)
