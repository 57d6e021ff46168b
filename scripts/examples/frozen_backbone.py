"""Fine-tune only the classification head on top of a frozen MLP backbone.

Healthy: backbone parameters have requires_grad=False and only the head's
parameters are given to the optimizer; backbone weights never change.
"""
import argparse

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU()
        )
        self.head = nn.Linear(64, 5)

    def forward(self, x):
        return self.head(self.backbone(x))


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=5e-2)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(1024, 32, generator=g)
    y = (x @ torch.randn(32, 5, generator=g)).argmax(dim=1)

    model = Model()
    for p in model.backbone.parameters():
        p.requires_grad = False
    model.backbone.eval()

    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.head.parameters(), lr=args.lr)

    for step in range(args.steps):
        idx = torch.randint(0, x.shape[0], (args.batch_size,))
        optimizer.zero_grad()
        loss = criterion(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item()!r}")


if __name__ == "__main__":
    main()
