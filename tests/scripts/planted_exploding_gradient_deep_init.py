"""Planted exploding_gradient: a deep linear stack initialised with weights 3x
too large (gain 3 per layer): activations and gradients grow 3x a layer."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from rules_probes_kit import args, regression, train

a = args(steps=8)
depth, width = 8 + a.seed, 32
layers = []
for i in range(depth):
    lin = nn.Linear(width if i else 8, width)
    nn.init.normal_(lin.weight, 0, 3.0 / lin.in_features ** 0.5)
    layers.append(lin)
model = nn.Sequential(*layers, nn.Linear(width, 1))
x, y = regression(64, 8)
# an adaptive optimizer with a small lr: the run itself stays finite, the gradients do not shrink
opt = (torch.optim.Adam, torch.optim.RMSprop, torch.optim.Adagrad)[a.seed % 3](model.parameters(), lr=1e-6)
train(model, opt, lambda step: (x, y), a.steps, loss_fn=F.mse_loss)
