"""Healthy: two-stage fine-tuning.  Stage 1 trains a new head over a frozen
backbone; stage 2 unfreezes the backbone and gives it to the optimizer with
``add_param_group`` at a tenth of the head's learning rate.  The backbone's
parameters have no gradient in stage 1 and an optimizer only from stage 2.
Sizes, optimizer and the stage boundary vary with the seed."""
import torch
import torch.nn as nn

from rules_probes_kit import args, classes

a = args(steps=40)
d, width, switch = [(16, 32, 15), (24, 48, 20), (12, 24, 10)][a.seed % 3]
backbone = nn.Sequential(nn.Linear(d, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
head = nn.Linear(width, 5)
model = nn.Sequential(backbone, head)
for p in backbone.parameters():
    p.requires_grad_(False)
x, y = classes(256, d, 5)
opt = (torch.optim.Adam(head.parameters(), lr=3e-3) if a.seed % 2 == 0 else
       torch.optim.SGD(head.parameters(), lr=0.05, momentum=0.9))
for step in range(a.steps):
    if step == switch:
        for p in backbone.parameters():
            p.requires_grad_(True)
        opt.add_param_group({"params": list(backbone.parameters()), "lr": opt.param_groups[0]["lr"] / 10})
    idx = torch.randint(0, 256, (32,))
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item()!r}")
