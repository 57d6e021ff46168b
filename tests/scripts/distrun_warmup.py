"""A tiny seeded DDP job (gloo, CPU) whose loop sets the learning rate by hand
before every optimizer step (a linear warmup written into each param_group),
with gradient accumulation (the gradients synchronised on the last micro-batch
only, through ``require_backward_grad_sync``) and gradient clipping.  Each rank
prints its step loss, the lr it stepped with and the clipped norm."""
import datetime
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS, ACCUM, BASE_LR, WARMUP = 6, 2, 0.05, 4

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
torch.manual_seed(0)
g = torch.Generator().manual_seed(1 + rank)
x = torch.randn(STEPS * ACCUM, 8, 8, generator=g)
y = (x.sum(2) > 0).long()
model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
decay = [p for p in model.parameters() if p.dim() >= 2]
no_decay = [p for p in model.parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=BASE_LR)
for step in range(STEPS):
    opt.zero_grad()
    total = 0.0
    for micro in range(ACCUM):
        model.require_backward_grad_sync = micro == ACCUM - 1
        i = step * ACCUM + micro
        loss = nn.functional.cross_entropy(model(x[i]), y[i]) / ACCUM
        total += loss.detach()
        loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    lr = BASE_LR * min(1.0, (step + 1) / WARMUP)
    for group in opt.param_groups:
        group["lr"] = lr
    opt.step()
    sys.stdout.write(f"rank {rank} step {step} loss {float(total):.17g} lr {lr} norm {float(norm):.17g}\n")
    sys.stdout.flush()
dist.destroy_process_group()
