"""Planted bug (rule: loss_not_decreasing): labels that carry no signal.

An MLP classifier whose labels are drawn at random for every batch (a
shuffled or misaligned label column): nothing can be learned, and the loss
stays at the entropy of the classes, whatever the optimizer does.
"""
import argparse

import torch
import torch.nn as nn


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    ap.add_argument("--batch-size", type=int, default=64)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(4096, 32, generator=g)
    model = nn.Sequential(nn.Linear(32, args.width), nn.ReLU(), nn.Linear(args.width, args.classes))
    opt = (torch.optim.Adam(model.parameters(), lr=1e-3) if args.optimizer == "adam"
           else torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    crit = nn.CrossEntropyLoss()
    for step in range(args.steps):
        idx = torch.randint(0, x.shape[0], (args.batch_size,), generator=g)
        y = torch.randint(0, args.classes, (args.batch_size,), generator=g)     # the bug: no relation to x
        opt.zero_grad()
        loss = crit(model(x[idx]), y)
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item()!r}")


if __name__ == "__main__":
    main()
