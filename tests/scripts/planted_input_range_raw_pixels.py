"""Planted input_range: 8x8 "images" of raw 0-255 pixel values go into a small
CNN unscaled (no / 255, no normalisation)."""
import torch
import torch.nn as nn

from rules_probes_kit import args, optimizer, train

a = args(steps=6)
n = 32 + 16 * a.seed
pixels = torch.randint(0, 256, (n, 1, 8, 8)).float()
y = (pixels.mean((1, 2, 3)) > 127.5).long()
model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 64, 2))
opt = optimizer(a.seed, model.parameters(), lr=1e-4)
train(model, opt, lambda step: (pixels, y), a.steps)
