"""Healthy: a CNN with BatchNorm2d, SGD with momentum and weight decay,
inputs standardised; a validation pass under eval() + no_grad(), then train()."""
import torch
import torch.nn as nn

from rules_probes_kit import args, train

a = args(steps=24)
n, ch = 64, 8 + 4 * a.seed
x = torch.randn(n, 1, 8, 8)
y = (x[:, :, :4].mean((1, 2, 3)) > x[:, :, 4:].mean((1, 2, 3))).long()
model = nn.Sequential(nn.Conv2d(1, ch, 3, padding=1), nn.BatchNorm2d(ch), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(ch, ch, 3, padding=1), nn.BatchNorm2d(ch), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(ch, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
criterion = nn.CrossEntropyLoss()


def validate(step):
    if step % 8 == 7:
        model.eval()
        with torch.no_grad():
            acc = (model(x).argmax(1) == y).float().mean()
        model.train()
        print(f"val acc {acc.item()!r}")


train(model, opt, lambda step: (x[step % 2::2], y[step % 2::2]), a.steps, loss_fn=criterion, after=validate)
