"""Healthy: a variational autoencoder (MLP encoder to a mean and log-variance,
the reparameterisation trick, MLP decoder) trained on the reconstruction
plus KL loss with Adam, on data that lies near a low-dimensional subspace.
Sizes, latent width and learning rate vary with the seed."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from rules_probes_kit import args

a = args(steps=40)
d, hidden, latent, lr = [(32, 64, 4, 1e-3), (24, 48, 2, 2e-3), (48, 32, 8, 5e-4)][a.seed % 3]


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(d, hidden), nn.ReLU())
        self.mu, self.logvar = nn.Linear(hidden, latent), nn.Linear(hidden, latent)
        self.dec = nn.Sequential(nn.Linear(latent, hidden), nn.ReLU(), nn.Linear(hidden, d))

    def forward(self, x):
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.dec(z), mu, logvar


g = torch.Generator().manual_seed(a.seed + 1)
basis = torch.randn(latent, d, generator=g)
model = VAE()
opt = torch.optim.Adam(model.parameters(), lr=lr)
for step in range(a.steps):
    x = torch.randn(64, latent, generator=g) @ basis + 0.05 * torch.randn(64, d, generator=g)
    recon, mu, logvar = model(x)
    kl = -0.5 * torch.mean(torch.sum(1 + logvar - mu.pow(2) - logvar.exp(), dim=1))
    loss = F.mse_loss(recon, x, reduction="none").sum(1).mean() + kl
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item()!r}")
