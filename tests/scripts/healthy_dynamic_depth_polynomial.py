"""Healthy: the PyTorch tutorial dynamic_net.py (beginner_source/examples_nn):
a third-order polynomial fit to sin(x) whose forward adds a random number of
extra terms each step, ``for exp in range(4, random.randint(4, 6)): y = y +
self.e * x ** exp`` (dynamic control flow), trained with SGD momentum on a
sum-of-squares loss.  The loss jumps by x100 and more whenever a deep step
is drawn and comes back at the next shallow one; ``e`` gets no gradient on
the steps that draw no extra term (a third of them, 5 in a row by chance:
at step 554 on seed 0).  It converges: neither is a finding.  Seed 0 is the
tutorial's run (random.seed(0), torch.manual_seed(0))."""
import argparse
import math
import random

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--steps", type=int, default=600)
a = ap.parse_args()
random.seed(a.seed)
torch.manual_seed(a.seed)


class DynamicNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(()))
        self.b = torch.nn.Parameter(torch.randn(()))
        self.c = torch.nn.Parameter(torch.randn(()))
        self.d = torch.nn.Parameter(torch.randn(()))
        self.e = torch.nn.Parameter(torch.randn(()))

    def forward(self, x):
        y = self.a + self.b * x + self.c * x ** 2 + self.d * x ** 3
        for exp in range(4, random.randint(4, 6)):
            y = y + self.e * x ** exp
        return y


x = torch.linspace(-math.pi, math.pi, 2000)
y = torch.sin(x)
model = DynamicNet()
criterion = torch.nn.MSELoss(reduction="sum")
optimizer = torch.optim.SGD(model.parameters(), lr=1e-8, momentum=0.9)
for t in range(a.steps):
    loss = criterion(model(x), y)
    if t % 100 == 99:
        print(t, loss.item())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
