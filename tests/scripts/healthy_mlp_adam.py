"""Healthy: an MLP classifier with Adam and F.cross_entropy (seen through the
loss probe's TorchFunctionMode: at chance at step 0, shapes that match)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from rules_probes_kit import args, classes, train

a = args(steps=40)
c, width = 5 + a.seed, 48 + 16 * a.seed
model = nn.Sequential(nn.Linear(20, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, c))
x, y = classes(256, 20, c)
opt = torch.optim.Adam(model.parameters(), lr=3e-3)
train(model, opt, lambda step: (x[step % 4::4], y[step % 4::4]), a.steps,
      loss_fn=lambda out, t: F.cross_entropy(out, t, label_smoothing=0.05 * a.seed))
