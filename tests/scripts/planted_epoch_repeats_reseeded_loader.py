"""Planted epoch_repeats: the DataLoader shuffles, but with a generator the
script seeds again at every epoch's start, so every epoch sees the batches
in the same order (as a DistributedSampler does without set_epoch)."""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

ap = argparse.ArgumentParser()
ap.add_argument("--seed", type=int, default=0)
a = ap.parse_args()
torch.manual_seed(a.seed)
data = TensorDataset(torch.randn(40 + 8 * a.seed, 6), torch.randint(0, 3, (40 + 8 * a.seed,)))
gen = torch.Generator()
loader = DataLoader(data, batch_size=8, shuffle=True, generator=gen)
model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(3):
    gen.manual_seed(1234)               # the bug: the same shuffle every epoch
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
print(f"loss {loss.item():.4f}")
