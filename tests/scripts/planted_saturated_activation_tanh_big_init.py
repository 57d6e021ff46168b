"""Planted saturated_activation (issue 19): a tanh network whose weights start
far too large: pre-activations of std ~20, nearly every unit at +1 or -1,
flipping with the sample; none sits at one asymptote for the whole batch."""
import torch
import torch.nn as nn

from rules_probes_kit import args, classes, optimizer, train

a = args(steps=8)
width, d = 32 + 16 * a.seed, 16
model = nn.Sequential(nn.Linear(d, width), nn.Tanh(), nn.Linear(width, 5))
with torch.no_grad():
    model[0].weight.normal_(0, 20 / d ** 0.5)            # std of a pre-activation: 20
x, y = classes(64, d, 5)
opt = optimizer(a.seed, model.parameters())
train(model, opt, lambda step: (x, y), a.steps)
