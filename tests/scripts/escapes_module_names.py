"""A tiny model whose module names hold terminal escapes (an OSC that retitles
the terminal, a CSI that clears the screen): what nndb prints of them must
show the escapes, not send them.  Trains a few steps of plain SGD."""
import argparse

import torch
import torch.nn as nn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("\x1b]0;pwned\x07", nn.Linear(4, 8))
    model.add_module("\x1b[2J", nn.ReLU())
    model.add_module("out", nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    for _ in range(args.steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
