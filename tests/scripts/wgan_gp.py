"""A WGAN-GP (tests/test_rules_grads.py, tests/test_rules_real_failures.py): the critic's loss
D(fake).mean() - D(real).mean() + 10 x gradient penalty (autograd.grad with create_graph), the
critic stepped N_CRITIC times per generator step (the generator's optimizer steps at steps
N_CRITIC, 2 N_CRITIC ... only).

    python wgan_gp.py ITERS N_CRITIC reset|forgotten

``forgotten``: the generator's zero_grad() is missing.  Prints ``D lossD D[2].bias.grad`` at
each critic step and ``G it |G[0].bias.grad|`` at each generator step.
"""
import sys

import torch
import torch.nn as nn

ITERS, N_CRITIC, RESET = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "reset"
torch.manual_seed(0)
G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
D = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 1))
optG = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.9))
optD = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.9))
for it in range(ITERS):
    for _ in range(N_CRITIC):
        real, fake = torch.randn(32, 2) * 0.5 + 1.0, G(torch.randn(32, 4)).detach()
        eps = torch.rand(32, 1)
        xh = (eps * real + (1 - eps) * fake).requires_grad_(True)
        g, = torch.autograd.grad(D(xh).sum(), xh, create_graph=True)
        lossD = D(fake).mean() - D(real).mean() + 10 * ((g.norm(2, dim=1) - 1) ** 2).mean()
        optD.zero_grad()
        lossD.backward()
        optD.step()
        print("D", repr(lossD.item()), repr(D[2].bias.grad.item()))
    lossG = -D(G(torch.randn(32, 4))).mean()
    if RESET:
        optG.zero_grad()
    lossG.backward()
    optG.step()
    print("G", it, repr(G[0].bias.grad.norm().item()))
