"""LoRA adapters on a frozen MLP: each adapted Linear keeps its weight frozen and
learns base(x) + (x A^T B^T) * alpha / r, A small and random, B zero at the start
(so the adapter adds nothing at first and A's gradient is exactly 0 at step 0).
AdamW trains the adapters alone.  ``--no-zero-grad`` leaves out zero_grad()."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, r: int = 4, alpha: float = 8.0):
        super().__init__()
        self.base = base
        self.A = nn.Parameter(torch.randn(r, base.in_features) * 0.01)
        self.B = nn.Parameter(torch.zeros(base.out_features, r))
        self.scale = alpha / r

    def forward(self, x):
        return self.base(x) + (x @ self.A.t() @ self.B.t()) * self.scale


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--no-zero-grad", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))
    model.requires_grad_(False)                      # the pretrained base, frozen
    model[0], model[2] = LoRALinear(model[0]), LoRALinear(model[2])
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.0)
    g = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(512, 16, generator=g)
    y = (x[:, :5] * 2).argmax(1)
    for step in range(args.steps):
        idx = torch.randint(0, 512, (32,), generator=g)
        if not args.no_zero_grad:
            opt.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item()!r}")


if __name__ == "__main__":
    main()
