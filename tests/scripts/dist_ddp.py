"""A tiny DDP job on CPU/gloo for the cross-rank rules (tests/test_distributed_rules.py).

Healthy by default: DistributedSampler with set_epoch, no BatchNorm.  Each flag
plants one bug:
  --no-sampler    every rank iterates the whole dataset in the same order (duplicate_batches)
  --no-set-epoch  the DistributedSampler shuffles every epoch the same way (epoch_repeats)
  --perturb N     rank 1 changes a weight after step N's optimizer step, outside DDP (rank_divergence)
  --bn            a plain BatchNorm layer (unsynced_batchnorm; SyncBatchNorm needs a GPU)
  --slow-rank S   rank 1 sleeps S seconds loading each batch (straggler: data loading)
  --slow-forward S  rank 1 sleeps S seconds in each forward (straggler: compute, hidden in DDP's all-reduce)
Not a bug: --eval-backward  one more forward and backward after the last step, with no step
(an evaluation's backward: each rank's trace ends with a partial row)
"""
import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

ap = argparse.ArgumentParser()
ap.add_argument("--no-sampler", action="store_true")
ap.add_argument("--no-set-epoch", action="store_true")
ap.add_argument("--perturb", type=int, default=-1)
ap.add_argument("--bn", action="store_true")
ap.add_argument("--slow-rank", type=float, default=0.0)
ap.add_argument("--slow-forward", type=float, default=0.0)
ap.add_argument("--epochs", type=int, default=3)
ap.add_argument("--eval-backward", action="store_true")
args = ap.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))


class SlowOnRank1(nn.Module):
    """Extra compute in rank 1's forward (a sleep: the same on a loaded machine)."""
    def forward(self, x):
        if rank == 1:
            time.sleep(args.slow_forward)
        return x


layers = ([SlowOnRank1()] if args.slow_forward else []) + [nn.Linear(8, 16)] + ([nn.BatchNorm1d(16)] if args.bn else []) + [nn.ReLU(), nn.Linear(16, 3)]
model = nn.Sequential(*layers)
model = DDP(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def collate(batch):
    if args.slow_rank and rank == 1:
        time.sleep(args.slow_rank)
    return torch.utils.data.default_collate(batch)


if args.no_sampler:
    loader = DataLoader(data, batch_size=8, shuffle=True, collate_fn=collate)
    sampler = None
else:
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=8, sampler=sampler, collate_fn=collate)

step = 0
for epoch in range(args.epochs):
    if sampler is not None and not args.no_set_epoch:
        sampler.set_epoch(epoch)
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == args.perturb and rank == 1:
            with torch.no_grad():
                model.module[0].weight[0, 0] += 0.01
        step += 1
print(f"rank {rank} done: {step} steps, loss {loss.item():.6f}", flush=True)
if args.eval_backward:
    x, y = data[:8]
    nn.functional.cross_entropy(model(x), y).backward()
    print(f"rank {rank} last step's loss {loss.item()!r}", flush=True)
dist.destroy_process_group()
