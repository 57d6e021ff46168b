"""Train a small MLP classifier by iterating epochs over a DataLoader.

Healthy: TensorDataset + DataLoader(shuffle=True, batch_size=32, num_workers=0)
with a seeded generator; stops after --steps optimizer steps in total.
"""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=40, help="total optimizer steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(256, 20, generator=g)
    y = (x[:, :3].sum(dim=1) > 0).long() + (x[:, 3] > 1).long()

    dataset = TensorDataset(x, y)
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=0,
        generator=torch.Generator().manual_seed(args.seed),
    )

    model = nn.Sequential(nn.Linear(20, 48), nn.ReLU(), nn.Linear(48, 3))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    step = 0
    epoch = 0
    while step < args.steps:
        for inputs, targets in loader:
            if step >= args.steps:
                break
            optimizer.zero_grad()
            loss = criterion(model(inputs), targets)
            loss.backward()
            optimizer.step()
            print(f"step {step} loss {loss.item()!r}")
            step += 1
        epoch += 1
        print(f"epoch {epoch} done")


if __name__ == "__main__":
    main()
