"""Train a small two-layer regressor with hand-written SGD (no torch.optim).

Healthy: after loss.backward() the parameters are updated in place under
torch.no_grad() with p.add_(p.grad, alpha=-lr), then p.grad is set to None.
"""
import argparse

import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 1)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(512, 8, generator=g)
    true_w = torch.randn(8, 1, generator=g)
    y = x @ true_w + 0.1 * torch.randn(512, 1, generator=g)

    model = Net()
    for step in range(args.steps):
        idx = torch.randint(0, x.shape[0], (args.batch_size,))
        loss = ((model(x[idx]) - y[idx]) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-args.lr)
                p.grad = None
        print(f"step {step} loss {loss.item()!r}")


if __name__ == "__main__":
    main()
