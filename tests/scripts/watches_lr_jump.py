"""A healthy MLP regressor (SGD, lr 0.05) whose learning rate is multiplied by
100 at step --jump-at (default 20): from there the gradients explode.  For the
relative watch (`watch grad *`): no hit before the jump, a hit soon after."""
import argparse

import torch
import torch.nn as nn


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--jump-at", type=int, default=20)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(512, 16, generator=g)
    y = x @ torch.randn(16, 1, generator=g) + 0.1 * torch.randn(512, 1, generator=g)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        if step == args.jump_at:
            for group in optimizer.param_groups:
                group["lr"] *= 100
        idx = torch.randint(0, x.shape[0], (32,), generator=g)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item()!r}")


if __name__ == "__main__":
    main()
