"""Planted clip_before_unscale: float16 autocast under a GradScaler, and
clip_grad_norm_ before scaler.unscale_(opt): it clips the gradients times the
loss scale (2**16), so every step's update is cut to max_norm / 65536."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from rules_probes_kit import args, classes, optimizer

a = args(steps=8)
c = 4 + a.seed
model = nn.Sequential(nn.Linear(16, 48), nn.ReLU(), nn.Linear(48, c))
x, y = classes(128, 16, c)
opt = optimizer(a.seed, model.parameters())
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
for step in range(a.steps):
    xb, yb = x[step % 4::4], y[step % 4::4]
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.cross_entropy(model(xb), yb)
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)     # (the bug: before unscale_)
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    print(f"step {step} loss {loss.item()!r}")
