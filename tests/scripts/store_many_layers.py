"""A model of many small Linear layers (2000 by default), trained a few steps:
the trace's size per step at scale (tests/reliability/test_trace_scale.py, README).

python store_many_layers.py [--layers N] [--steps N] [--width N]"""
import argparse

import torch
import torch.nn as nn


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=2000)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--width", type=int, default=4)
    args = p.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(args.width, args.width) for _ in range(args.layers)])
    for layer in model:
        nn.init.eye_(layer.weight)
        nn.init.zeros_(layer.bias)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(8, args.width)
    y = torch.randn(8, args.width)
    for step in range(args.steps):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
