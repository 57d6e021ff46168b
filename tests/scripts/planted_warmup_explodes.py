"""Planted bug (rule: exploding_gradient): a learning-rate warmup without a cap.

An MLP regressor whose learning rate is multiplied by ``--growth`` at every
step and never stops rising.  It trains for some 40 steps; then each step
overshoots more than the last, the gradients grow geometrically and the loss
overflows to Inf 10-20 steps later.  exploding_gradient must say so while the
loss is still finite (nonfinite reports the Inf).
"""
import argparse

import torch
import torch.nn as nn


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=90)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--optimizer", choices=("sgd", "momentum"), default="sgd")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--growth", type=float, default=1.15)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(2048, 16, generator=g)
    y = x @ torch.randn(16, 1, generator=g) + 0.1 * torch.randn(2048, 1, generator=g)
    model = nn.Sequential(nn.Linear(16, args.width), nn.ReLU(), nn.Linear(args.width, args.width), nn.ReLU(),
                          nn.Linear(args.width, 1))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9 if args.optimizer == "momentum" else 0.0)
    # the bug: a warmup that never ends (it should stop at the target learning rate)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: args.growth ** step)
    for step in range(args.steps):
        idx = torch.randint(0, x.shape[0], (128,), generator=g)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        sched.step()
        print(f"step {step} loss {loss.item()!r} lr {sched.get_last_lr()[0]:.3g}")


if __name__ == "__main__":
    main()
