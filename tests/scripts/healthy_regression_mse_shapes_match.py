"""Healthy: a regression with shapes that match: a hand-written MSE on (N, 1)
against (N, 1), F.mse_loss after squeeze, per-sample weights (N, 1) * (N, 1),
and a centring (N, 1) - (1,): broadcasts that create no batch dimension."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from rules_probes_kit import args, optimizer, regression, train

a = args(steps=40)
n = 64 + 32 * a.seed
x, y = regression(n, 8)
w = torch.rand(n, 1) + 0.5
model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
opt = optimizer(a.seed, model.parameters(), lr=3e-3)


def loss_fn(pred, target):
    hand = (w * (pred - target) ** 2).mean()
    centred = (pred - pred.mean(0)) - (target - target.mean(0))
    return hand + 0.1 * F.mse_loss(pred.squeeze(1), target.squeeze(1)) + 0.01 * centred.abs().mean()


train(model, opt, lambda step: (x, y), a.steps, loss_fn=loss_fn)
