"""Training loops of the shapes users write, for ``nndb check``'s planted
bugs (tests/test_check_shapes.py): ``--shape plain`` (zero_grad, forward,
backward, step), ``nanogpt`` (a tiny character model: micro-step gradient
accumulation, the learning rate set by the script each iteration, gradient
clipping, AdamW, zero_grad(set_to_none=True) after the step), ``dcgan`` (two
optimizers; the generator's backward passes through the discriminator) and
``ddp-tutorial`` (one Linear, cross_entropy over its single output: a loss of
exactly 0).  ``--no-zero-grad`` plants the missing zero_grad.  Plain PyTorch,
no nndb."""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--shape", default="plain", choices=["plain", "nanogpt", "dcgan", "ddp-tutorial"])
ap.add_argument("--no-zero-grad", action="store_true")
ap.add_argument("--steps", type=int, default=6)
a = ap.parse_args()
torch.manual_seed(0)
zero_grad = not a.no_zero_grad


def train_step(opt, loss_of):
    """zero_grad (unless planted away), the loss, backward, step."""
    if zero_grad:
        opt.zero_grad()
    loss = loss_of()
    loss.backward()
    opt.step()
    return loss


def plain():
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = torch.randn(64, 8)
    y = (x @ torch.randn(8, 4)).argmax(1)
    for step in range(a.steps):
        loss = train_step(opt, lambda: F.cross_entropy(model(x), y))
        print(f"step {step} loss {loss.item():.6f}")


class TinyLM(nn.Module):
    def __init__(self, vocab=16, n_embd=24, block=8):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block, n_embd)
        self.ln = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1])
        x = self.wte(idx) + self.wpe(pos)
        x = x + self.mlp(self.ln(x))
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def nanogpt():
    data = torch.randint(0, 16, (2000,))
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    accum, warmup, lr_decay, max_lr, min_lr = 4, 2, 20, 6e-4, 6e-5

    def get_batch():
        ix = torch.randint(len(data) - 9, (12,))
        return torch.stack([data[i:i + 8] for i in ix]), torch.stack([data[i + 1:i + 9] for i in ix])

    def get_lr(it):
        if it < warmup:
            return max_lr * (it + 1) / (warmup + 1)
        ratio = min(1.0, (it - warmup) / (lr_decay - warmup))
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (max_lr - min_lr)

    X, Y = get_batch()
    for it in range(a.steps):
        lr = get_lr(it)
        for group in optimizer.param_groups:
            group["lr"] = lr
        for micro in range(accum):
            logits, loss = model(X, Y)
            loss = loss / accum
            X, Y = get_batch()
            scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        if zero_grad:
            optimizer.zero_grad(set_to_none=True)
        print(f"iter {it}: loss {loss.item() * accum:.4f}")


def dcgan():
    netG = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8), nn.Tanh())
    netD = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1), nn.Sigmoid())
    optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    real = torch.randn(256, 8)
    for step in range(a.steps):
        x = real[(step * 32) % 256:][:32]
        if zero_grad:
            netD.zero_grad()
        errD_real = F.binary_cross_entropy(netD(x).view(-1), torch.ones(32))
        errD_real.backward()
        fake = netG(torch.randn(32, 4))
        errD_fake = F.binary_cross_entropy(netD(fake.detach()).view(-1), torch.zeros(32))
        errD_fake.backward()
        optD.step()
        if zero_grad:
            netG.zero_grad()
        errG = F.binary_cross_entropy(netD(fake).view(-1), torch.ones(32))
        errG.backward()
        optG.step()
        print(f"step {step} D {(errD_real + errD_fake).item():.4f} G {errG.item():.4f}")


def ddp_tutorial():
    data = [(torch.rand(20), torch.rand(1)) for _ in range(256)]
    loader = torch.utils.data.DataLoader(data, batch_size=32, shuffle=True)
    model = nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    step = 0
    while step < a.steps:
        for source, targets in loader:
            loss = train_step(optimizer, lambda: F.cross_entropy(model(source), targets))
            print(f"step {step} loss {loss.item()!r}")
            step += 1
            if step == a.steps:
                break


{"plain": plain, "nanogpt": nanogpt, "dcgan": dcgan, "ddp-tutorial": ddp_tutorial}[a.shape]()
