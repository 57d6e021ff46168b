"""Planted double_softmax: the model ends in a softmax, then F.cross_entropy
applies log-softmax again."""
import torch.nn as nn

from rules_probes_kit import args, classes, optimizer, train

a = args(steps=4)
c = 4 + 3 * a.seed
model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, c), nn.Softmax(dim=1))
x, y = classes(64, 12, c)
opt = optimizer(a.seed, model.parameters())
train(model, opt, lambda step: (x, y), a.steps)
