"""A DDP job that starts its own ranks with torch.multiprocessing.spawn (the
shape of pytorch/examples' imagenet --multiprocessing-distributed and the DDP
tutorials): gloo on the CPU, 2 ranks, 3 steps; each rank prints its losses in
one write (the ranks share the pipe).  ``PORT``: the rendezvous port."""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def worker(rank, world, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = port
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    losses = []
    for _ in range(3):
        loss = model(torch.randn(8, 4, generator=g)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item().hex())
    sys.stdout.write(f"rank {rank} losses {' '.join(losses)}\n")
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2, sys.argv[1]), nprocs=2)
