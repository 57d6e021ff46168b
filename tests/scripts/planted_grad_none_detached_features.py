"""Planted grad_none: the features are detach()ed before the head, so the
backbone, whose parameters the optimizer holds, never gets a gradient."""
import torch.nn as nn

from rules_probes_kit import args, classes, optimizer, train


class Net(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(10, width), nn.ReLU())
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        return self.head(self.backbone(x).detach())      # meant: no detach()


a = args(steps=16)
model = Net(24 + 8 * a.seed)
x, y = classes(64, 10, 4)
opt = optimizer(a.seed, model.parameters())
train(model, opt, lambda step: (x, y), a.steps)
