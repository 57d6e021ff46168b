"""A tiny seeded DDP job (gloo, CPU) that, as the DDP tutorial's trainer does,
resumes from a snapshot file when one exists at its start (here: the step it
had reached, from which it trains on with a tenth of the learning rate) and
writes it at every step (rank 0).  Each rank prints its loss at every step."""
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
torch.manual_seed(0)
x, y = torch.randn(16, 4), torch.randn(16, 1)
model = DDP(nn.Linear(4, 1))
snapshot = "snapshot.txt"
resumed = os.path.exists(snapshot)
opt = torch.optim.SGD(model.parameters(), lr=0.01 if resumed else 0.1)
for step in range(6):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x[rank::2]), y[rank::2])
    loss.backward()
    opt.step()
    if rank == 0:
        with open(snapshot, "w") as fh:
            fh.write(f"step {step} lr {opt.param_groups[0]['lr']}\n")
    sys.stdout.write(f"rank {rank} step {step} loss {loss.item():.17g}\n")
    sys.stdout.flush()
dist.destroy_process_group()
