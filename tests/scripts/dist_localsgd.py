"""Local SGD on CPU/gloo (2 ranks): DDP all-reduces the gradients for 2
steps, then each rank steps its own replica and torch's
PostLocalSGDOptimizer averages the replicas every 4 steps (``--manual``:
the script calls a PeriodicModelAverager itself after each step).  The
replicas differ between averages by design.  Each rank prints, per step,
its loss and a digest of its parameters (equal on both ranks at steps
2, 6 and 10)."""
import hashlib
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState, post_localSGD_hook
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.distributed.optim import PostLocalSGDOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

manual = "--manual" in sys.argv
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1)))
subgroup, _ = dist.new_subgroups(group_size=1)       # (each rank alone between averages)
model.register_comm_hook(PostLocalSGDState(process_group=None, subgroup=subgroup, start_localSGD_iter=2),
                         post_localSGD_hook)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
averager = PeriodicModelAverager(period=4, warmup_steps=2)
if not manual:
    opt = PostLocalSGDOptimizer(optim=opt, averager=averager)
g = torch.Generator().manual_seed(100 + rank)
out = []
for step in range(12):
    x = torch.randn(8, 5, generator=g)
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), x[:, :1] * 2)
    loss.backward()
    opt.step()
    if manual:
        averager.average_parameters(model.parameters())
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().numpy().tobytes())
    out.append(f"rank {rank} step {step} loss {loss.item()!r} params {h.hexdigest()[:16]}")
sys.stdout.write("\n".join(out) + "\n")     # (one write: the ranks share the pipe)
sys.stdout.flush()
dist.destroy_process_group()
