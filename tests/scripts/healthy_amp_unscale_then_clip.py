"""Healthy: float16 autocast under a GradScaler, with the documented order:
scaler.unscale_(opt), then clip_grad_norm_ on the true gradients."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from rules_probes_kit import args, classes

a = args(steps=40)
c = 4 + a.seed
model = nn.Sequential(nn.Linear(16, 48), nn.ReLU(), nn.Linear(48, c))
x, y = classes(256, 16, c)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
for step in range(a.steps):
    xb, yb = x[step % 4::4], y[step % 4::4]
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.cross_entropy(model(xb), yb)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    print(f"step {step} loss {loss.item()!r}")
