"""A loop whose own guard raises before backward() at step --fail-at (a loss
that went NaN), as a CI job meets it: the optimizer's loop, or (--by-hand)
the hand-written update of pytorch/examples' regression, with the module's
zero_grad() (its gradients set to None) before the forward that raises.
--no-guard: the NaN loss goes on through backward() and the update."""
import argparse

import torch
import torch.nn as nn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--fail-at", type=int, default=3)
    parser.add_argument("--by-hand", action="store_true")
    parser.add_argument("--no-guard", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = None if args.by_hand else torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    for step in range(args.steps):
        if opt is not None:
            opt.zero_grad()
        else:
            model.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        if step == args.fail_at:
            loss = loss * float("nan")
        if not args.no_guard and not torch.isfinite(loss):
            raise FloatingPointError(f"loss is {loss.item()} at step {step}")
        loss.backward()
        if opt is not None:
            opt.step()
        else:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(-0.1 * p.grad)
        print(f"step {step} loss {loss.item()!r}")


if __name__ == "__main__":
    main()
