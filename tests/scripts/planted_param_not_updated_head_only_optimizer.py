"""Planted param_not_updated: the optimizer holds only the head's parameters,
but the whole model trains (requires_grad, gradients flow): the body never changes."""
import torch.nn as nn

from rules_probes_kit import args, classes, optimizer, train

a = args(steps=10)
width = 32 + 8 * a.seed
model = nn.Sequential(nn.Linear(12, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 3))
x, y = classes(64, 12, 3)
opt = optimizer(a.seed, model[4].parameters())         # meant: model.parameters()
train(model, opt, lambda step: (x, y), a.steps)
