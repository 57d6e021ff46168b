"""Train a tiny MLP classifier (32 -> 64 -> 64 -> 10) on synthetic data.

Healthy baseline: standard zero_grad / forward / loss / backward / step loop
with SGD + momentum. The loss should decrease steadily.
"""
import argparse

import torch
import torch.nn as nn


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(n, 32, generator=g)
    w = torch.randn(32, 10, generator=g)
    y = (x @ w).argmax(dim=1)
    return x, y


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    x, y = make_data(1024, args.seed)

    model = nn.Sequential(
        nn.Linear(32, 64),
        nn.ReLU(),
        nn.Linear(64, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    for step in range(args.steps):
        idx = torch.randint(0, x.shape[0], (args.batch_size,))
        inputs, targets = x[idx], y[idx]

        optimizer.zero_grad()
        logits = model(inputs)
        loss = criterion(logits, targets)
        loss.backward()
        optimizer.step()

        print(f"step {step} loss {loss.item()!r}")


if __name__ == "__main__":
    main()
