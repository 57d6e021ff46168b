"""Healthy: fine-tuning a new linear head on a frozen backbone, which learns slowly.

A random MLP backbone is frozen (requires_grad False, eval mode); Adam trains
only a new linear head on its features, for labels the backbone was not made
for.  The loss falls by a few percent over the first 30 steps and keeps
falling slowly: a slow learner, not a flat loss.
"""
import argparse

import torch
import torch.nn as nn


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--batch-size", type=int, default=64)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(4096, 32, generator=g)
    y = (x @ torch.randn(32, args.classes, generator=g)).argmax(dim=1)
    backbone = nn.Sequential(nn.Linear(32, args.features), nn.ReLU(), nn.Linear(args.features, args.features),
                             nn.ReLU())
    for p in backbone.parameters():
        p.requires_grad = False
    backbone.eval()
    head = nn.Linear(args.features, args.classes)
    opt = torch.optim.Adam(head.parameters(), lr=args.lr)
    crit = nn.CrossEntropyLoss()
    for step in range(args.steps):
        idx = torch.randint(0, x.shape[0], (args.batch_size,), generator=g)
        with torch.no_grad():
            feats = backbone(x[idx])
        opt.zero_grad()
        loss = crit(head(feats), y[idx])
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item()!r}")


if __name__ == "__main__":
    main()
