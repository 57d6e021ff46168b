"""Two halves of a model trained in turn by one optimizer with gradient
accumulation: before each micro-batch's backward the other half is frozen
(requires_grad_(False)), as Lightning's toggle_optimizer freezes the
parameters of every optimizer but the one it trains, and the step applies
both micro-batches' gradients.  Its loss, the objective whose gradient the
step applies, is the micro-batches' sum; the script prints it."""
import argparse

import torch
import torch.nn as nn


def toggle(on, off):
    for p in on.parameters():
        p.requires_grad_(True)
    for p in off.parameters():
        p.requires_grad_(False)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    torch.manual_seed(0)
    a, b = nn.Linear(4, 8), nn.Linear(8, 1)
    opt = torch.optim.SGD([*a.parameters(), *b.parameters()], lr=0.1)
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    for step in range(args.steps):
        toggle(a, b)
        loss_a = ((b(torch.tanh(a(x[:16]))) - y[:16]) ** 2).mean()
        loss_a.backward()
        toggle(b, a)
        loss_b = ((b(torch.tanh(a(x[16:]))) - y[16:]) ** 2).mean()
        loss_b.backward()
        opt.step()
        opt.zero_grad()
        print("step", step, repr((loss_a + loss_b).item()))


if __name__ == "__main__":
    main()
