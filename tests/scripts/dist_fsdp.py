"""FSDP2 (fully_shard) on CPU/gloo: each rank holds a shard of every parameter.
Prints, on rank 0, one JSON line: each parameter's full count and norm after the last step."""
import json

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 10), nn.ReLU(), nn.Linear(10, 3))
fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(rank)
for step in range(4):
    x, y = torch.randn(6, 8, generator=g), torch.randint(0, 3, (6,), generator=g)
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
full = {n: p.detach().full_tensor().double() for n, p in model.named_parameters()}
if rank == 0:
    print(json.dumps({n: {"count": t.numel(), "norm": float(t.norm()), "mean": float(t.mean()),
                          "min": float(t.min()), "max": float(t.max())} for n, t in full.items()}))
dist.destroy_process_group()
