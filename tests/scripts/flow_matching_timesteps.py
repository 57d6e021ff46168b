"""A rectified-flow denoiser's training loop (the shape of diffusers' SD3 scripts): noisy
images x_t = (1 - s) x0 + s * noise at a random s per sample, the model given the
timesteps s * 1000 as floats (one number a sample, into a sinusoidal embedding), an MSE
on the velocity (noise - x0), AdamW under a warmup-then-cosine LambdaLR stepped every
iteration, clip_grad_norm_, and an EMA of the weights kept as a list of shadow tensors
(diffusers' EMAModel), updated after each optimizer step."""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=8)
a = ap.parse_args()
torch.manual_seed(0)


class Denoiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.temb = nn.Sequential(nn.Linear(16, 32), nn.SiLU(), nn.Linear(32, 16))
        self.conv_in = nn.Conv2d(3, 16, 3, padding=1)
        self.norm = nn.GroupNorm(4, 16)
        self.conv_out = nn.Conv2d(16, 3, 3, padding=1)

    def forward(self, x, timesteps):
        freqs = torch.exp(-math.log(10000) * torch.arange(8) / 8)
        e = timesteps[:, None] * freqs[None]
        e = self.temb(torch.cat([e.sin(), e.cos()], 1))
        return self.conv_out(F.silu(self.norm(self.conv_in(x) + e[:, :, None, None])))


model = Denoiser()
shadow = [p.detach().clone() for p in model.parameters()]
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-2)
sched = torch.optim.lr_scheduler.LambdaLR(
    opt, lambda i: (i + 1) / 3 if i < 3 else 0.5 * (1 + math.cos(math.pi * (i - 3) / max(1, a.steps - 3))))
images = torch.rand(64, 3, 8, 8) * 2 - 1
for step in range(a.steps):
    x0 = images[torch.randint(0, 64, (8,))]
    noise = torch.randn_like(x0)
    s = torch.rand(8)
    x_t = (1 - s[:, None, None, None]) * x0 + s[:, None, None, None] * noise
    loss = F.mse_loss(model(x_t, s * 1000), noise - x0)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad()
    with torch.no_grad():
        decay = min(0.999, (1 + step) / (10 + step))
        for e, p in zip(shadow, model.parameters()):
            e.lerp_(p, 1 - decay)
    print(f"step {step} loss {loss.item()!r} lr {sched.get_last_lr()[0]!r}")
