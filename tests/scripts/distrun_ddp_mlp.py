"""A tiny DDP job for the distributed tests: gloo on the CPU, a
DistributedSampler, a few steps; each rank prints a digest of its final
parameters (bit-exact comparison with and without nndb).
``--fail-rank R``: rank R raises at step 2 (a rank that dies); ``--pg-timeout S``: the
process group's timeout (a collective that waits longer fails)."""
import argparse
import datetime
import hashlib
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
p.add_argument("--fail-rank", type=int, default=-1)
p.add_argument("--pg-timeout", type=float, default=60)
a = p.parse_args()

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.pg_timeout))
rank = dist.get_rank()
torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
x = torch.randn(64, 8, generator=g)
y = (x.sum(1) > 0).long()
sampler = DistributedSampler(TensorDataset(x, y), shuffle=True, seed=0)
loader = DataLoader(TensorDataset(x, y), batch_size=8, sampler=sampler)
model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = 0
for epoch in range(100):
    sampler.set_epoch(epoch)
    for xb, yb in loader:
        if step == a.steps:
            break
        if rank == a.fail_rank and step == 2:
            raise RuntimeError(f"planted failure on rank {rank}")
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        step += 1
    if step == a.steps:
        break
h = hashlib.sha256()
for t in model.state_dict().values():
    h.update(t.detach().numpy().tobytes())
sys.stdout.write(f"rank {rank} digest {h.hexdigest()}\n")     # (one write: the ranks share the pipe)
sys.stdout.flush()
dist.destroy_process_group()
