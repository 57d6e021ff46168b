"""A script that puts counting wrappers in the place of torch.nn.functional's
functions, as a FLOP counter or a profiling library patches them (one plain,
one with functools.wraps), and prints the counts each step: the same under
nndb as under python."""
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

calls = {"mse_loss": 0, "relu": 0, "dropout": 0}


def counting(name):
    orig = getattr(F, name)

    def wrapper(*args, **kwargs):
        calls[name] += 1
        return orig(*args, **kwargs)
    setattr(F, name, functools.wraps(orig)(wrapper) if name == "relu" else wrapper)


for name in calls:
    counting(name)

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.1), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 4), torch.randn(16, 1)
for step in range(4):
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item()!r} calls {calls}")
