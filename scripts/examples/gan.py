"""Train a tiny GAN on 2-D synthetic data (a ring of 8 Gaussians).

Healthy (DCGAN-style loop): netG / netD with optimizerG / optimizerD. Each
iteration does a D step on real + fake.detach(), then a G step.
"""
import argparse
import math

import torch
import torch.nn as nn

NZ = 8


def sample_real(n, generator):
    k = torch.randint(0, 8, (n,), generator=generator)
    angle = k.float() * (2 * math.pi / 8)
    centers = torch.stack([torch.cos(angle), torch.sin(angle)], dim=1) * 2.0
    return centers + 0.05 * torch.randn(n, 2, generator=generator)


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=50, help="number of iterations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    data_gen = torch.Generator().manual_seed(args.seed + 1)

    netG = nn.Sequential(
        nn.Linear(NZ, 32), nn.ReLU(),
        nn.Linear(32, 32), nn.ReLU(),
        nn.Linear(32, 2),
    )
    netD = nn.Sequential(
        nn.Linear(2, 32), nn.LeakyReLU(0.2),
        nn.Linear(32, 32), nn.LeakyReLU(0.2),
        nn.Linear(32, 1),
    )

    criterion = nn.BCEWithLogitsLoss()
    optimizerD = torch.optim.Adam(netD.parameters(), lr=args.lr, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=args.lr, betas=(0.5, 0.999))

    real_label, fake_label = 1.0, 0.0
    for step in range(args.steps):
        # (1) Update D: maximize log(D(x)) + log(1 - D(G(z)))
        netD.zero_grad()
        real = sample_real(args.batch_size, data_gen)
        label = torch.full((args.batch_size, 1), real_label)
        errD_real = criterion(netD(real), label)
        errD_real.backward()

        noise = torch.randn(args.batch_size, NZ)
        fake = netG(noise)
        label.fill_(fake_label)
        errD_fake = criterion(netD(fake.detach()), label)
        errD_fake.backward()
        errD = errD_real + errD_fake
        optimizerD.step()

        # (2) Update G: maximize log(D(G(z)))
        netG.zero_grad()
        label.fill_(real_label)
        errG = criterion(netD(fake), label)
        errG.backward()
        optimizerG.step()

        print(f"step {step} lossD {errD.item()!r} lossG {errG.item()!r}")


if __name__ == "__main__":
    main()
