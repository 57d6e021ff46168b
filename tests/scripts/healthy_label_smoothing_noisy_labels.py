"""Healthy: a classifier trained with label smoothing (0.1) on labels of which
a share are wrong (flipped at random, the noise real datasets have): the loss
falls to a floor above 0 and stays there.  Noise share, sizes and optimizer
vary with the seed."""
import torch
import torch.nn as nn

from rules_probes_kit import args, classes, optimizer, train

a = args(steps=40)
d, width, noise = [(16, 32, 0.2), (24, 64, 0.3), (12, 32, 0.1)][a.seed % 3]
x, y = classes(512, d, 5)
flip = torch.rand(512) < noise
y = torch.where(flip, torch.randint(0, 5, (512,)), y)
model = nn.Sequential(nn.Linear(d, width), nn.ReLU(), nn.Linear(width, 5))
crit = nn.CrossEntropyLoss(label_smoothing=0.1)


def batch(step):
    idx = torch.randint(0, 512, (64,))
    return x[idx], y[idx]


train(model, optimizer(a.seed, model.parameters()), batch, a.steps, loss_fn=crit)
