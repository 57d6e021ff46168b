"""A tiny DDP job whose model has a probe module called after backward and
before the optimizer step (inside a step, past DDP's gradient all-reduce):
a module breakpoint on it stops one rank there while the other ranks go on
to the step end and wait in nndb's all-stop agreement.  Each rank prints a
digest of its final parameters."""
import datetime
import hashlib
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        self.probe = nn.Linear(2, 1)
        self.probe.requires_grad_(False)

    def forward(self, x):
        return self.body(x)


dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
torch.manual_seed(0)
g = torch.Generator().manual_seed(1 + rank)
model = DDP(Net())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    xb = torch.randn(8, 8, generator=g)
    yb = (xb.sum(1) > 0).long()
    opt.zero_grad()
    out = model(xb)
    loss = nn.functional.cross_entropy(out, yb)
    loss.backward()
    with torch.no_grad():
        model.module.probe(out.detach())
    opt.step()
h = hashlib.sha256()
for t in model.state_dict().values():
    h.update(t.detach().numpy().tobytes())
sys.stdout.write(f"rank {rank} digest {h.hexdigest()}\n")
sys.stdout.flush()
dist.destroy_process_group()
