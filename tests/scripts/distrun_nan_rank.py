"""A 2-rank DDP job (gloo, CPU) whose rank 1 gets a NaN in its batch at step 2
(the planted line below): its forward goes NaN, and the gradients' all-reduce
carries the NaN to rank 0's gradients in the same step's backward.
``--deterministic``: torch.use_deterministic_algorithms(True), which fills the
memory torch.empty returns with NaN (DDP's gradient bucket, made at step 1)."""
import datetime
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
if "--deterministic" in sys.argv:
    torch.use_deterministic_algorithms(True)
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(1 + rank)
for step in range(4):
    xb = torch.randn(4, 8, generator=g)
    yb = (xb.sum(1) > 0).long()
    if rank == 1 and step == 2:
        xb[0, 0] = float("nan")         # the planted NaN
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
    print(f"rank {rank} step {step} loss {loss.item()!r}", flush=True)
dist.destroy_process_group()
