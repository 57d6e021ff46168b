"""A loop that ends its process with os._exit(--code) after its last step, as
scripts do to skip a teardown that hangs."""
import argparse
import os

import torch
import torch.nn as nn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--code", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    for step in range(args.steps):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
    print(f"last step {step} loss {loss.item()!r}", flush=True)
    os._exit(args.code)


if __name__ == "__main__":
    main()
