"""A small CNN whose hidden ReLU layer dies over training (planted).

A penalty on fc1's bias (``--push``) drives it down a little every step, so
more and more of relu1's units output 0 for every input: the share of zeros
of ``act relu1`` grows from about half at step 0 to nearly all.  Prints a
digest of the final parameters (the run must be bit-identical under nndb).
"""
import argparse
import hashlib

import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.fc1 = nn.Linear(4 * 8 * 8, 32)
        self.relu1 = nn.ReLU()
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        h = torch.relu(self.conv1(x))
        h = torch.relu(self.conv2(h))
        h = self.relu1(self.fc1(h.flatten(1)))
        return self.fc2(h)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--push", type=float, default=0.2)
    args = ap.parse_args()
    torch.manual_seed(0)
    x = torch.randn(256, 1, 8, 8)
    y = torch.randint(0, 10, (256,))
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(args.steps):
        i = torch.randint(0, 256, (32,))
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x[i]), y[i]) + args.push * model.fc1.bias.sum()
        loss.backward()
        opt.step()
    h = hashlib.sha256()
    for name, p in model.state_dict().items():
        h.update(name.encode())
        h.update(p.detach().numpy().tobytes())
    print("digest", h.hexdigest())


if __name__ == "__main__":
    main()
