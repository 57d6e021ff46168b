"""A GAN-shaped loop whose generator first steps in iteration 2 (``if i >= 2``):
step 3 holds the generator's first step alone, and from step 4 on step k + 1
is iteration k (docs/steps.md).  ``train(iterations, seen)`` calls
``seen(i, name, kind, tensor)`` with copies of the discriminator's first
weight's gradient (at its optimizer's step) and value (after it), and of the
generator's output, so a test can compare them with the whole tensors a trace
kept.  Prints a digest of the final parameters.
"""
import hashlib
import sys

import torch
import torch.nn as nn


def train(iterations: int = 7, seen=None):
    torch.manual_seed(0)
    gen = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    disc = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))
    opt_g = torch.optim.Adam(gen.parameters(), 1e-2)
    opt_d = torch.optim.SGD(disc.parameters(), 0.1, momentum=0.9)
    note = seen or (lambda *a: None)
    for i in range(iterations):
        real, z = torch.randn(16, 3), torch.randn(16, 4)
        opt_d.zero_grad()
        fake = gen(z)
        note(i, "gen", "act", fake.detach().clone())
        loss_d = (disc(real) - 1).pow(2).mean() + disc(fake.detach()).pow(2).mean()
        loss_d.backward()
        note(i, "disc.0.weight", "grad", disc[0].weight.grad.clone())
        opt_d.step()
        note(i, "disc.0.weight", "param", disc[0].weight.detach().clone())
        opt_g.zero_grad()
        (disc(fake) - 1).pow(2).mean().backward()
        if i >= 2:
            opt_g.step()
    return gen, disc


if __name__ == "__main__":
    gen, disc = train(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
    h = hashlib.sha256()
    for p in list(gen.parameters()) + list(disc.parameters()):
        h.update(p.detach().numpy().tobytes())
    print("digest", h.hexdigest())
