"""Train a small MLP regressor with gradient accumulation.

Healthy: each optimizer step accumulates gradients over 4 micro-batches, the
loss is divided by 4 before backward, and zero_grad is called after step.
"""
import argparse

import torch
import torch.nn as nn


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=30, help="number of optimizer steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--accum", type=int, default=4, help="micro-batches per optimizer step")
    parser.add_argument("--micro-batch-size", type=int, default=16)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(1024, 16, generator=g)
    true_w = torch.randn(16, 1, generator=g)
    y = torch.sin(0.25 * (x @ true_w)) + 0.05 * torch.randn(1024, 1, generator=g)

    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    criterion = nn.MSELoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    optimizer.zero_grad()
    for step in range(args.steps):
        total = 0.0
        for micro in range(args.accum):
            idx = torch.randint(0, x.shape[0], (args.micro_batch_size,))
            loss = criterion(model(x[idx]), y[idx]) / args.accum
            loss.backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {total!r}")


if __name__ == "__main__":
    main()
