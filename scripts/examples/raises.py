"""Train a tiny linear classifier, then fail with an exception mid-training.

Planted failure: a helper called every step raises
RuntimeError("planted failure at step K") at step --fail-at (default 3), so the
script exits non-zero with an ordinary Python traceback through that helper.
"""
import argparse

import torch
import torch.nn as nn


def check_batch(step, fail_at):
    if step == fail_at:
        raise RuntimeError(f"planted failure at step {step}")


def train_step(model, optimizer, criterion, inputs, targets, step, fail_at):
    optimizer.zero_grad()
    loss = criterion(model(inputs), targets)
    loss.backward()
    check_batch(step, fail_at)
    optimizer.step()
    return loss


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fail-at", type=int, default=3, help="step at which to raise")
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(256, 8, generator=g)
    y = (x.sum(dim=1) > 0).long()

    model = nn.Linear(8, 2)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    for step in range(args.steps):
        idx = torch.randint(0, x.shape[0], (32,))
        loss = train_step(model, optimizer, criterion, x[idx], y[idx], step, args.fail_at)
        print(f"step {step} loss {loss.item()!r}")


if __name__ == "__main__":
    main()
