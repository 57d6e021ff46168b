"""Planted dead_relu: the hidden layer's bias starts at -10 (a bad init), so
its ReLU outputs 0 for every sample and no gradient reaches it."""
import torch
import torch.nn as nn

from rules_probes_kit import args, classes, optimizer, train

a = args(steps=8)
width = 32 + 16 * a.seed
model = nn.Sequential(nn.Linear(10, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 4))
with torch.no_grad():
    model[2].bias.fill_(-10.0)
x, y = classes(64, 10, 4)
opt = optimizer(a.seed, model.parameters())
train(model, opt, lambda step: (x, y), a.steps)
