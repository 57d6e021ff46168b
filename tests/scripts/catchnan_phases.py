"""A NaN that arises in the backward pass only, or in the optimizer's step only,
at step 3 (``--phase backward|optimizer``); until then every value is finite.

backward: the head measures the distance between two embeddings (a square
root of a sum of squares); at step 3 one pair is equal, so the square root is
of exactly 0 and its backward divides by 0 (SqrtBackward0: Inf), which the
squares' backward multiplies by 0 (NaN).  The forward and the loss stay finite.

optimizer: Adam with eps=0 (the scale's group) divides 0 by 0 in the first update of a parameter
whose gradient is exactly 0: the scale joins the loss at step 3 multiplied by 0.
Forward and backward stay finite.
"""
import argparse

import torch
import torch.nn as nn


class Distance(nn.Module):
    def forward(self, a, b):
        return ((a - b) ** 2).sum(1).sqrt()          # SQRT LINE


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase", choices=["backward", "optimizer"], default="backward")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    embed, dist = nn.Linear(4, 3), Distance()
    scale = nn.Parameter(torch.ones(1))
    opt = torch.optim.Adam([{"params": embed.parameters()},      # (embed.bias cancels out: its gradient is 0)
                            {"params": [scale], "eps": 0.0}], lr=0.01)
    for step in range(args.steps):
        x, other = torch.randn(8, 4), torch.randn(8, 4)
        if step == 3 and args.phase == "backward":
            other[0] = x[0]                          # one pair the same: a distance of exactly 0
        loss = dist(embed(x), embed(other)).mean()
        if step >= 3 and args.phase == "optimizer":
            loss = loss + 0.0 * scale                # a gradient of exactly 0 for the scale
        opt.zero_grad()
        loss.backward()                              # BACKWARD LINE
        opt.step()                                   # STEP LINE
        print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
