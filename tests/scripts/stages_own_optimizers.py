"""Blocks trained one after the other, each by an Adam of its own made up front
(greedy layer-wise training, as a forward-forward network trains its layers):
block 1 trains on block 0's detached output once block 0 is done, and block
0's optimizer lives on, never stepped again.  Each step prints the block, the
iteration and its loss; the step clock learns that block 1's optimizer took
the steps over only as it steps a second time."""
import argparse

import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.lin = nn.Linear(n_in, n_out)
        self.opt = torch.optim.Adam(self.parameters(), lr=0.01)

    def forward(self, x):
        return torch.relu(self.lin(x))

    def fit(self, k, x, y, iters):
        for i in range(iters):
            loss = ((self(x).mean(1) - y) ** 2).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            print("block", k, "iter", i, "loss", repr(loss.item()))
        return self(x).detach()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--iters", type=int, default=4)
    args = ap.parse_args()
    torch.manual_seed(0)
    blocks = [Block(6, 12), Block(12, 12)]
    x, y = torch.randn(32, 6), torch.rand(32)
    h = x
    for k, block in enumerate(blocks):
        h = block.fit(k, h, y, args.iters)


if __name__ == "__main__":
    main()
