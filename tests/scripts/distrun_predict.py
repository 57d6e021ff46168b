"""A tiny seeded DDP job (gloo, CPU) for time travel across ranks: each rank
prints its loss at every step, exactly ("%.17g", one write a line: the ranks
share the pipe).  ``NNDB_TEST_LR_AT=S:LR`` sets the optimizer's lr to LR
after step S (what ``predict --set lr=LR`` at the end of step S predicts),
for the independent run the test compares with.  A file ``unseeded`` beside
the script makes a job unseeded (seeded by the clock: a replica of it drifts)."""
import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=8)
a = p.parse_args()
change = os.environ.get("NNDB_TEST_LR_AT")
at, lr = (int(change.split(":")[0]), float(change.split(":")[1])) if change else (None, None)

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
seed = time.time_ns() % 2**31 if os.path.exists(os.path.join(os.path.dirname(__file__), "unseeded")) else 0
torch.manual_seed(seed)
g = torch.Generator().manual_seed(seed + 1)
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
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        sys.stdout.write(f"rank {rank} step {step} loss {loss.item():.17g}\n")
        sys.stdout.flush()
        if step == at:
            for group in opt.param_groups:
                group["lr"] = lr
        step += 1
    if step == a.steps:
        break
dist.destroy_process_group()
