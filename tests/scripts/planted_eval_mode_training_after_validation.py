"""Planted eval_mode_training: a validation pass calls model.eval() and the
loop never calls model.train() again: Dropout and BatchNorm train in eval mode."""
import torch
import torch.nn as nn

from rules_probes_kit import args, classes, optimizer, train

a = args(steps=10)
width = 32 + 8 * a.seed
model = nn.Sequential(nn.Linear(12, width), nn.BatchNorm1d(width), nn.ReLU(), nn.Dropout(0.3),
                      nn.Linear(width, 3))
x, y = classes(96, 12, 3)
opt = optimizer(a.seed, model.parameters())


def validate(step):
    if step == 2:
        model.eval()
        with torch.no_grad():
            acc = (model(x[64:]).argmax(1) == y[64:]).float().mean()
        print(f"val acc {acc.item()!r}")                   # meant: model.train() here


train(model, opt, lambda step: (x[:64], y[:64]), a.steps, after=validate)
