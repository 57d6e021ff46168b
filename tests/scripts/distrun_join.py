"""Uneven inputs under torch's Join (gloo, CPU, 2 ranks): rank 0 has 5
batches, rank 1 has 8; after its last batch rank 0 shadows rank 1's
collectives inside ``Join.__exit__`` (no step of its own) while rank 1
trains on.  Each rank prints its losses and a digest of its final
parameters (the same on both: Join keeps the replicas in step)."""
import hashlib
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(3 + rank)
batches = [torch.randn(4, 4, generator=g) for _ in range(5 if rank == 0 else 8)]
with Join([model]):
    for step, x in enumerate(batches):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), x.mean(1, keepdim=True))
        loss.backward()
        opt.step()
        sys.stdout.write(f"rank {rank} step {step} loss {loss.item()!r}\n")
        sys.stdout.flush()
h = hashlib.sha256()
for t in model.state_dict().values():
    h.update(t.detach().numpy().tobytes())
sys.stdout.write(f"rank {rank} digest {h.hexdigest()}\n")     # (one write: the ranks share the pipe)
sys.stdout.flush()
dist.destroy_process_group()
