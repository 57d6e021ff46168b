"""Fit a small 1-D regression (a sine curve) with torch.optim.LBFGS.

Healthy: each optimizer.step(closure) re-evaluates the closure several times,
so there are several forward/backward passes per printed step.
"""
import argparse

import torch
import torch.nn as nn


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--max-iter", type=int, default=5, help="LBFGS iterations per step")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    t = torch.linspace(-1, 1, 200).unsqueeze(1)
    noise = 0.02 * torch.randn(200, 1, generator=g)
    y = 0.5 * torch.sin(2.0 * torch.pi * t) + 0.3 * t + noise
    features = torch.cat([t, t**2, t**3], dim=1)

    model = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1))
    criterion = nn.MSELoss()
    optimizer = torch.optim.LBFGS(
        model.parameters(), lr=args.lr, max_iter=args.max_iter, history_size=10
    )

    for step in range(args.steps):
        def closure():
            optimizer.zero_grad()
            loss = criterion(model(features), y)
            loss.backward()
            return loss

        loss = optimizer.step(closure)
        print(f"step {step} loss {loss.item()!r}")


if __name__ == "__main__":
    main()
