"""Healthy: a small causal transformer LM trained the standard way: AdamW with
weight decay on the matrices only (biases, LayerNorm and embeddings none:
nanoGPT's grouping), a linear warmup of 20 steps then cosine decay, gradient
clipping at 1.0, the loss falling.

Under Adam the update/weight ratio is not the SGD rule of thumb (~1e-3):
during the warmup it rises with the learning rate, and on small or freshly
initialised tensors it is ~lr / |w| per element whatever the gradient.
Sizes, learning rate and batch vary with the seed.
"""
import argparse
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _lm_data import batches, zipf_stream  # noqa: E402


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, d, heads, layers, ctx):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, x):
        t = x.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf")), 1)
        h = self.tok(x) + self.pos(torch.arange(t))
        for b in self.blocks:
            h = b(h, mask)
        return self.head(self.ln(h))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    vocab, d, lr, bs = [(100, 16, 3e-3, 8), (150, 24, 1e-3, 8), (200, 32, 6e-4, 6)][args.seed % 3]
    g = torch.Generator().manual_seed(args.seed + 1)
    data = batches(zipf_stream(vocab, 4000, args.seed + 2), bs, 8, g)
    model = GPT(vocab, d, 2, 1 + args.seed % 2, 8)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "tok" not in n and "pos" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "tok" not in n and "pos" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))

    def factor(step):
        if step < args.warmup:
            return (step + 1) / args.warmup
        q = (step - args.warmup) / max(1, args.steps - args.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * q))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    for step in range(args.steps):
        x, y = next(data)
        loss = F.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        print(f"step {step} loss {loss.item()!r}")


if __name__ == "__main__":
    main()
