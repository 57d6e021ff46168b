"""fuzz_log_corner's log-space regression with a Dropout layer in train mode:
the loss is NaN where 1 + out < 0, and out depends on the dropout mask the
step draws.  Prints every step's loss exactly (repr) and takes the batch
nndb fuzz saved at step --at (--inject)."""
import argparse

import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=32)
p.add_argument("--inject")
p.add_argument("--at", type=int, default=0)
a = p.parse_args()
found = torch.load(a.inject, weights_only=True) if a.inject else None
torch.manual_seed(0)
x = torch.rand(1024, 16) * 2 - 1
y = 1 + 0.1 * x.sum(1, keepdim=True) + 0.01 * torch.randn(1024, 1)
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Dropout(0.5), nn.Linear(32, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(a.steps):
    idx = torch.randint(0, 1024, (32,))
    xb, yb = x[idx], y[idx]
    if found is not None and step == a.at:
        xb, yb = found["inputs"][0], found["loss_constants"][0]
    out = model(xb)
    loss = ((torch.log(1 + out) - torch.log(yb)) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item()!r}")
