"""Fine-tuning with per-layer param groups: the first two layers frozen by a learning
rate of 0 (discriminative learning rates at their extreme), the head at 0.05, SGD with
momentum; ``--unfreeze N`` gives the middle layer lr 0.01 from step N on."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--unfreeze", type=int, default=-1)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))
    opt = torch.optim.SGD([{"params": model[0].parameters(), "lr": 0.0},
                           {"params": model[2].parameters(), "lr": 0.0},
                           {"params": model[4].parameters()}], lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(args.seed + 1)
    features = torch.randn(512, 16, generator=g)
    labels = (features[:, :5] * 2).argmax(1)
    batches = torch.randint(0, 512, (args.steps, 32), generator=g)
    for step, rows in enumerate(batches):
        if step == args.unfreeze:
            opt.param_groups[1]["lr"] = 0.01
        opt.zero_grad()
        logits = model(features[rows])
        loss = F.cross_entropy(logits, labels[rows])
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item()!r}")


if __name__ == "__main__":
    main()
