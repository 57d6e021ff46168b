"""Healthy: a tanh network with PyTorch's default (sane) init, Xavier for
even seeds: pre-activations of std ~1, units far from saturation."""
import torch.nn as nn

from rules_probes_kit import args, classes, optimizer, train

a = args(steps=40)
width = 32 + 16 * a.seed
model = nn.Sequential(nn.Linear(12, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 3))
if a.seed % 2 == 0:
    for m in model:
        if isinstance(m, nn.Linear):
            nn.init.xavier_normal_(m.weight)
x, y = classes(128, 12, 3)
opt = optimizer(a.seed, model.parameters())
train(model, opt, lambda step: (x[step % 2::2], y[step % 2::2]), a.steps)
