"""Planted epoch_repeats under gradient accumulation: one rank's view of a
DistributedSampler (num_replicas and rank given: no process group needed)
without sampler.set_epoch, two micro-batches to an optimizer step, so an
epoch of 8 batches is 4 steps.  ``--set-epoch``: the healthy loop."""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

ap = argparse.ArgumentParser()
ap.add_argument("--set-epoch", action="store_true")
ap.add_argument("--seed", type=int, default=0)      # (the rule matrix's seeds)
a = ap.parse_args()
torch.manual_seed(a.seed)
data = TensorDataset(torch.randn(64, 6), torch.randint(0, 3, (64,)))
sampler = DistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=a.seed)
loader = DataLoader(data, batch_size=4, sampler=sampler)
model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
accum = 2
for epoch in range(3):
    if a.set_epoch:
        sampler.set_epoch(epoch)
    for i, (x, y) in enumerate(loader):
        loss = nn.functional.cross_entropy(model(x), y) / accum
        loss.backward()
        if (i + 1) % accum == 0:
            opt.step()
            opt.zero_grad()
print(f"loss {loss.item():.4f}")
