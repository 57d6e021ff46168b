"""A self-distillation loop (DINO's shape) on random data: a student trained by AdamW, a
teacher updated by hand by EMA under no_grad (requires_grad False, never in an optimizer),
lr and weight decay written into each param group every iteration from cosine schedules
(wd only in the first group), the last layer frozen in epoch 0 by p.grad = None after
backward, per-parameter gradient clipping by hand, multi-crop (several forward passes of the
student, one loss, one backward), a loss with a center buffer updated by EMA, a checkpoint
saved each epoch.  --dist: a one-process gloo group, the center all-reduced as DINO does;
--nan-at IT: a NaN crop at iteration IT; --late-zero-grad: every gradient dropped."""
import argparse
import copy
import hashlib
import math
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--epochs", type=int, default=2)
ap.add_argument("--iters", type=int, default=8)
ap.add_argument("--freeze-epochs", type=int, default=1)
ap.add_argument("--lr", type=float, default=5e-3)
ap.add_argument("--dist", action="store_true")
ap.add_argument("--out", default="")
ap.add_argument("--nan-at", type=int, default=-1)
ap.add_argument("--late-zero-grad", action="store_true", help="a planted bug: zero_grad() between backward() and step()")
args = ap.parse_args()

if args.dist:
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)   # (a free port)

torch.manual_seed(0)


class Head(nn.Module):
    def __init__(self, d, out):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(d, 32), nn.GELU(), nn.Linear(32, 16))
        self.last_layer = nn.Linear(16, out, bias=False)

    def forward(self, x):
        return self.last_layer(F.normalize(self.mlp(x), dim=-1))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 32), nn.GELU(), nn.Linear(32, 24))
        self.head = Head(24, 20)

    def forward(self, crops):
        return self.head(torch.cat([self.backbone(c) for c in crops]))


class SelfDistillLoss(nn.Module):
    def __init__(self, out, ncrops):
        super().__init__()
        self.ncrops = ncrops
        self.register_buffer("center", torch.zeros(1, out))

    def forward(self, s, t):
        s = (s / 0.1).chunk(self.ncrops)
        q = F.softmax((t - self.center) / 0.04, dim=-1).detach().chunk(2)
        total, n = 0, 0
        for iq, qq in enumerate(q):
            for v in range(len(s)):
                if v != iq:
                    total += torch.sum(-qq * F.log_softmax(s[v], dim=-1), dim=-1).mean()
                    n += 1
        with torch.no_grad():
            c = t.sum(0, keepdim=True)
            if args.dist:
                dist.all_reduce(c)
            self.center = self.center * 0.9 + c / len(t) * 0.1
        return total / n


def cosine(base, final, epochs, niter, warmup=0):
    w = np.linspace(0, base, warmup * niter) if warmup else np.array([])
    it = np.arange(epochs * niter - warmup * niter)
    return np.concatenate((w, final + 0.5 * (base - final) * (1 + np.cos(np.pi * it / len(it)))))


student = Net()
teacher = copy.deepcopy(student)
for p in teacher.parameters():
    p.requires_grad = False
regularized = [p for n, p in student.named_parameters() if p.ndim > 1]
plain = [p for n, p in student.named_parameters() if p.ndim <= 1]
optimizer = torch.optim.AdamW([{"params": regularized}, {"params": plain, "weight_decay": 0.0}])
crit = SelfDistillLoss(20, 4)
lr_s = cosine(args.lr, 1e-5, args.epochs, args.iters, warmup=1)
wd_s = cosine(0.04, 0.4, args.epochs, args.iters)
m_s = cosine(0.99, 1.0, args.epochs, args.iters)
data = torch.randn(64, 3, 8, 8)

for epoch in range(args.epochs):
    for i in range(args.iters):
        it = epoch * args.iters + i
        for j, g in enumerate(optimizer.param_groups):
            g["lr"] = lr_s[it]
            if j == 0:
                g["weight_decay"] = wd_s[it]
        idx = torch.randint(0, 64, (8,))
        x = data[idx]
        crops = [x + 0.1 * torch.randn_like(x) for _ in range(4)]
        if it == args.nan_at:
            crops[2] = crops[2] * float("nan")
        t_out = teacher(crops[:2])
        s_out = student(crops)
        loss = crit(s_out, t_out)
        if not math.isfinite(loss.item()):
            print(f"loss is {loss.item()}, stopping")
            raise SystemExit(1)
        optimizer.zero_grad()
        loss.backward()
        for n, p in student.named_parameters():          # clip each parameter's gradient by hand
            if p.grad is not None:
                norm = p.grad.data.norm(2)
                coef = 1.0 / (norm + 1e-6)
                if coef < 1:
                    p.grad.data.mul_(coef)
        if epoch < args.freeze_epochs:                   # last layer frozen for the first epoch(s)
            for n, p in student.named_parameters():
                if "last_layer" in n:
                    p.grad = None
        if args.late_zero_grad:
            optimizer.zero_grad()
        optimizer.step()
        with torch.no_grad():
            m = m_s[it]
            for ps, pt in zip(student.parameters(), teacher.parameters()):
                pt.data.mul_(m).add_((1 - m) * ps.detach().data)
        print(f"epoch {epoch} it {it} loss {loss.item()!r} lr {float(optimizer.param_groups[0]['lr'])!r}")
    if args.out:
        torch.save({"student": student.state_dict(), "teacher": teacher.state_dict(),
                    "optimizer": optimizer.state_dict(), "center": crit.center, "epoch": epoch + 1},
                   os.path.join(args.out, "checkpoint.pth"))
h = hashlib.sha1()
for t in [*student.state_dict().values(), *teacher.state_dict().values(), crit.center]:
    h.update(t.detach().numpy().tobytes())
print("final", h.hexdigest()[:16], repr(loss.item()))
