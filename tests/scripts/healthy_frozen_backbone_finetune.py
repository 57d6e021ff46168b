"""Healthy: fine-tuning a head on a frozen backbone (requires_grad False, the
backbone, with its BatchNorm, kept in eval mode; only the head in the optimizer)."""
import torch
import torch.nn as nn

from rules_probes_kit import args, classes, optimizer, train

a = args(steps=30)
width = 32 + 16 * a.seed
backbone = nn.Sequential(nn.Linear(16, width), nn.BatchNorm1d(width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
head = nn.Linear(width, 4)
for p in backbone.parameters():
    p.requires_grad_(False)
backbone.eval()
model = nn.Sequential(backbone, head)
x, y = classes(128, 16, 4)
opt = optimizer(a.seed, head.parameters(), lr=3e-2)
train(model, opt, lambda step: (x[step % 2::2], y[step % 2::2]), a.steps,
      after=lambda step: backbone.eval())
