"""A planted desync: rank 1 skips the loss all_reduce at step 2 and goes on
to the barrier at the end, while rank 0 waits in that all_reduce: both hang
(until gloo's 60 s timeout; nndb's --hang-timeout ends it first).  A rank
says so before each collective: the hang is there once rank 0 said step 4's
all_reduce and rank 1 the barrier (a test waits for that, not a guessed time)."""
import datetime

import torch
import torch.distributed as dist
import torch.nn as nn

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 4), torch.randn(16, 1)
for step in range(5):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    logged = loss.detach().clone()
    if not (rank == 1 and step == 2):       # the planted bug
        print(f"rank {rank} step {step} all_reduce", flush=True)
        dist.all_reduce(logged)
print(f"rank {rank} barrier", flush=True)
dist.barrier()
dist.destroy_process_group()
