"""A GAN whose two optimizers both accumulate gradients over micro-batches.

``--shape sequential``: each step, k micro-batches of the discriminator's loss,
then ``optD.step()``; then k micro-batches of the generator's, then
``optG.step()``.  ``--shape interleaved`` (Lightning's manual optimization
with ``toggle_optimizer`` and ``accumulate_grad_batches``): the micro-batches
of D and G alternate, and each optimizer steps after its k-th.  With
``--toggle`` the other network's parameters are frozen before each backward
(``requires_grad_(False)``, as ``toggle_optimizer`` does); without it the
discriminator's loss takes a detached fake and the generator's gradient
reaches the discriminator too, whose gradients the next step sets to None
before D's first micro-batch (dcgan's ``netD.zero_grad()``; sequential only).

``--scaler``: under a GradScaler whose first scale overflows the discriminator's
gradients (its loss is 1000 times larger) but not the generator's, so that
``scaler.step(optD)`` skips D's first steps while G's go on.

Each step prints the sum of the losses each optimizer's gradients came from
(their ``backward()`` passes'), D's and G's, as float32 sums them."""
import argparse

import torch
import torch.nn as nn

from toggle_accumulation import toggle


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shape", choices=("sequential", "interleaved"), default="sequential")
    ap.add_argument("--toggle", action="store_true")
    ap.add_argument("--micro", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--scaler", action="store_true")
    args = ap.parse_args()
    if args.shape == "interleaved" and not args.toggle:
        ap.error("interleaved needs --toggle: G's backward would add to D's accumulating gradients")
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    D = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    optD = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.9))
    optG = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.9))
    data = torch.Generator().manual_seed(1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 118, enabled=args.scaler)
    big = 1000.0 if args.scaler else 1.0

    def d_loss():
        if args.toggle:
            toggle(D, G)
        real = torch.randn(16, 2, generator=data) + 2
        fake = G(torch.randn(16, 4, generator=data))
        return big * (D(fake if args.toggle else fake.detach()).mean() - D(real).mean())

    def g_loss():
        if args.toggle:
            toggle(G, D)
        return -D(G(torch.randn(16, 4, generator=data))).mean()

    def micro(loss_fn, total):
        """One micro-batch's backward; ``total`` plus its loss."""
        loss = loss_fn()
        scaler.scale(loss).backward()
        return loss.detach() if total is None else total + loss.detach()

    k = args.micro
    for step in range(args.steps):
        total_d = total_g = None
        if not args.toggle:
            D.zero_grad(set_to_none=True)     # (what G's backward left in D's gradients: dcgan's netD.zero_grad())
        if args.shape == "sequential":
            for _ in range(k):
                total_d = micro(d_loss, total_d)
            scaler.step(optD)
            optD.zero_grad()
            for _ in range(k):
                total_g = micro(g_loss, total_g)
            scaler.step(optG)
            optG.zero_grad()
        else:
            for i in range(k):
                total_d = micro(d_loss, total_d)
                if i == k - 1:
                    scaler.step(optD)
                    optD.zero_grad()
                total_g = micro(g_loss, total_g)
                if i == k - 1:
                    scaler.step(optG)
                    optG.zero_grad()
        scaler.update()
        print("step", step, repr(total_d.item()), repr(total_g.item()))


if __name__ == "__main__":
    main()
