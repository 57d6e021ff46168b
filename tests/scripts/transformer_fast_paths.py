"""A transformer classifier over padded sequences (nn.TransformerEncoder with a
src_key_padding_mask) distilled from a frozen teacher of the same kind (eval mode,
requires_grad False, called with autograd on), and evaluated under no_grad in eval
mode every 4 steps.  Both the teacher and the evaluation take PyTorch's fused paths:
MultiheadAttention's native kernel, and nested tensors that leave the padded
positions' outputs exactly 0 (the ``padded`` column)."""
import argparse
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors")
ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=34)
a = ap.parse_args()
torch.manual_seed(0)


def encoder():
    return nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1, batch_first=True), 2)


teacher = encoder().eval().requires_grad_(False)
student = encoder()
head = nn.Linear(16, 3)
opt = torch.optim.AdamW([*student.parameters(), *head.parameters()], lr=1e-3)
x = torch.randn(64, 6, 16)
lengths = torch.randint(2, 7, (64,))
pad = torch.arange(6)[None] >= lengths[:, None]
y = torch.randint(0, 3, (64,))
for step in range(a.steps):
    student.train()
    idx = torch.randint(0, 64, (8,))
    feats = student(x[idx], src_key_padding_mask=pad[idx])
    target = teacher(x[idx], src_key_padding_mask=pad[idx])
    loss = F.cross_entropy(head(feats[:, 0]), y[idx]) + F.mse_loss(feats, target)
    opt.zero_grad()
    loss.backward()
    opt.step()
    line = f"step {step} loss {loss.item()!r} target {target.sum().item()!r}"
    if step % 4 == 0:
        student.eval()
        with torch.no_grad():
            out = student(x[:8], src_key_padding_mask=pad[:8])
        line += f" eval {out.sum().item()!r} padded {out[pad[:8]].abs().sum().item()!r}"
    print(line)
