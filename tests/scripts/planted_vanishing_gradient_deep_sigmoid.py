"""Planted vanishing_gradient: 12 sigmoid layers: the first layer's gradient
is orders of magnitude below the last's (sigmoid' <= 1/4 per layer)."""
import torch.nn as nn

from rules_probes_kit import args, classes, optimizer, train

a = args(steps=8)
width = 24 + 8 * a.seed
layers, d = [], 10
for _ in range(12):
    layers += [nn.Linear(d, width), nn.Sigmoid()]
    d = width
model = nn.Sequential(*layers, nn.Linear(width, 4))
x, y = classes(64, 10, 4)
opt = optimizer(a.seed, model.parameters())
train(model, opt, lambda step: (x, y), a.steps)
