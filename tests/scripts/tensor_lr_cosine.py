"""Healthy: the compiled-optimizer recipe's tensor learning rate
(``AdamW(lr=torch.tensor(1e-3))``: an LR scheduler then writes each new lr
into the tensor, ``fill_``, and a compiled step is not compiled again) under
a cosine schedule annealed to 0 over the run, as a fine-tuning recipe's last
epoch ends.  Its last few steps move the weights by less than 1e-6 of their
norm because the schedule ends at 0, not because the lr is too small.
``--float`` gives the same run a float lr."""
import argparse

import torch
import torch.nn as nn

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=300)
ap.add_argument("--float", action="store_true")
a = ap.parse_args()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3 if a.float else torch.tensor(1e-3), weight_decay=0.05)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=a.steps, eta_min=0)
x = torch.randn(512, 16)
y = (x[:, :2] > 0).long() @ torch.tensor([1, 2])
for step in range(a.steps):
    idx = torch.randint(0, 512, (64,))
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
    loss.backward()
    lr = float(opt.param_groups[0]["lr"])
    opt.step()
    sched.step()
    if step % 50 == 0 or step == a.steps - 1:
        print(f"step {step} loss {loss.item()!r} lr {lr!r}")
