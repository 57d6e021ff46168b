"""Contrastive self-supervised loops on random images, whose cross-entropy targets are
made in code, not data: each row's positive is its logit 0, so every label is 0.

Default (MoCo's shape): a query encoder trained by SGD, a key encoder that is its
momentum copy (requires_grad False, updated by hand in the forward, under no_grad,
but held by the optimizer too, as model.parameters() gives it), a queue of past keys
(a buffer the forward overwrites), and the model returning (logits, labels).
--simclr: two augmented views through one encoder, NT-Xent's logits built outside the
model and labels = torch.zeros(2N, dtype=torch.long)."""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=12)
ap.add_argument("--simclr", action="store_true")
a = ap.parse_args()
torch.manual_seed(0)


def encoder(dim=16):
    return nn.Sequential(nn.Flatten(), nn.Linear(48, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, dim))


class Momentum(nn.Module):
    def __init__(self, dim=16, K=64, m=0.99, T=0.2):
        super().__init__()
        self.K, self.m, self.T = K, m, T
        self.encoder_q, self.encoder_k = encoder(dim), encoder(dim)
        for pq, pk in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            pk.data.copy_(pq.data)
            pk.requires_grad = False
        self.register_buffer("queue", F.normalize(torch.randn(dim, K), dim=0))
        self.register_buffer("ptr", torch.zeros(1, dtype=torch.long))

    def forward(self, im_q, im_k):
        q = F.normalize(self.encoder_q(im_q), dim=1)
        with torch.no_grad():
            for pq, pk in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
                pk.data = pk.data * self.m + pq.data * (1.0 - self.m)
            k = F.normalize(self.encoder_k(im_k), dim=1)
        l_pos = (q * k).sum(1, keepdim=True)
        l_neg = q @ self.queue.clone().detach()
        logits = torch.cat([l_pos, l_neg], dim=1) / self.T
        labels = torch.zeros(logits.shape[0], dtype=torch.long)
        with torch.no_grad():
            p = int(self.ptr)
            self.queue[:, p:p + k.shape[0]] = k.T
            self.ptr[0] = (p + k.shape[0]) % self.K
        return logits, labels


def nt_xent(features, n, T=0.5):
    f = F.normalize(features, dim=1)
    same = torch.cat([torch.arange(n)] * 2)
    same = (same[None] == same[:, None]).float()
    sim = f @ f.T
    eye = torch.eye(2 * n, dtype=torch.bool)
    same, sim = same[~eye].view(2 * n, -1), sim[~eye].view(2 * n, -1)
    logits = torch.cat([sim[same.bool()].view(2 * n, -1), sim[~same.bool()].view(2 * n, -1)], dim=1) / T
    return logits, torch.zeros(logits.shape[0], dtype=torch.long)


model = encoder() if a.simclr else Momentum()
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9, weight_decay=1e-4)
data = torch.rand(128, 3, 4, 4)
for step in range(a.steps):
    lr = 0.03 * 0.5 * (1.0 + math.cos(math.pi * step / a.steps))
    for g in optimizer.param_groups:
        g["lr"] = lr
    x = data[torch.randint(0, 128, (16,))]
    v1, v2 = x + 0.1 * torch.randn_like(x), x + 0.1 * torch.randn_like(x)
    if a.simclr:
        output, target = nt_xent(model(torch.cat([v1, v2])), 16)
    else:
        output, target = model(v1, v2)
    loss = criterion(output, target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item()!r} lr {lr!r}")
