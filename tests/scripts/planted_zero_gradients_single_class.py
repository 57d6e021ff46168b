"""Planted zero_gradients: a cross-entropy over a single class (a model with
one output, soft targets of one column: the DDP tutorial's loop), so the loss
is exactly 0 and every gradient exactly 0, step after step.  Sizes, batch and
optimizer vary with the seed."""
import argparse

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

ap = argparse.ArgumentParser()
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--steps", type=int, default=24)
a = ap.parse_args()
torch.manual_seed(a.seed)
d, bs = [(20, 32), (12, 16), (32, 24)][a.seed % 3]


class Pairs(Dataset):
    def __init__(self, n):
        self.data = [(torch.rand(d), torch.rand(1)) for _ in range(n)]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i]


model = torch.nn.Linear(d, 1)
opt = [lambda p: torch.optim.SGD(p, lr=1e-3), lambda p: torch.optim.Adam(p, lr=1e-3),
       lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9)][a.seed % 3](model.parameters())
loader = DataLoader(Pairs(bs * a.steps), batch_size=bs, shuffle=True)
for step, (source, targets) in enumerate(loader):
    opt.zero_grad()
    loss = F.cross_entropy(model(source), targets)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item()!r}")
