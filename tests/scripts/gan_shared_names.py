"""A GAN whose generator and discriminator both keep their layers in ``main``
(DCGAN's layout), each model with many layers: at step 0 the generator's
activations are seen (named 'main.0', ...) before the discriminator's first
call qualifies every name by its model's variable ('netG.main.0')."""
import numpy as np
import torch
import torch.nn as nn

torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self, out):
        super().__init__()
        self.main = nn.Sequential(*[m for _ in range(9) for m in (nn.Linear(8, 8), nn.ReLU())], nn.Linear(8, out))

    def forward(self, x):
        return self.main(x)


netG, netD = Net(8), Net(1)
optG = torch.optim.Adam(netG.parameters(), 1e-3)
optD = torch.optim.Adam(netD.parameters(), 1e-3)
crit = nn.BCEWithLogitsLoss()
for step in range(3):
    real, z = torch.randn(16, 8), torch.randn(16, 8)
    if step == 0:
        with torch.no_grad():
            first = netG.main[0](z).numpy().astype(np.float64).sum()
        print(f"first {float(first)!r}")
    netD.zero_grad()
    fake = netG(z)
    loss_d = crit(netD(real), torch.ones(16, 1)) + crit(netD(fake.detach()), torch.zeros(16, 1))
    loss_d.backward()
    optD.step()
    netG.zero_grad()
    loss_g = crit(netD(fake), torch.ones(16, 1))
    loss_g.backward()
    optG.step()
    print(step, float(loss_d), float(loss_g))
