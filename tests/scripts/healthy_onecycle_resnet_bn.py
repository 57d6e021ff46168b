"""Healthy: a small ResNet with BatchNorm (conv-BN-ReLU residual blocks, no bias
before BN) trained with SGD, Nesterov momentum and weight decay under a
OneCycle schedule (the learning rate rises to its peak over the first 30% of
the run, then anneals), on a learnable image task.  Width, depth and peak
learning rate vary with the seed."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from rules_probes_kit import args

a = args(steps=40)
width, blocks, peak = [(8, 1, 0.1), (12, 2, 0.2), (6, 2, 0.05)][a.seed % 3]


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(x + self.b2(self.c2(F.relu(self.b1(self.c1(x))))))


model = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                      *[Block(width) for _ in range(blocks)], nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(width, 4))
g = torch.Generator().manual_seed(a.seed + 1)
protos = torch.randn(4, 3, 8, 8, generator=g)
opt = torch.optim.SGD(model.parameters(), lr=peak / 25, momentum=0.9, nesterov=True, weight_decay=5e-4)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=peak, total_steps=a.steps)
for step in range(a.steps):
    y = torch.randint(0, 4, (32,), generator=g)
    x = protos[y] + 0.8 * torch.randn(32, 3, 8, 8, generator=g)
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    sched.step()
    print(f"step {step} loss {loss.item()!r}")
