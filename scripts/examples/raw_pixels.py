"""Train an MLP classifier on synthetic 8x8 "images" with raw 0-255 pixel values.

Planted bug: pixels are never scaled to [0, 1], so the initial loss is ~20+ and the
first SGD updates are huge; they kill every hidden ReLU and the loss then sits at
ln(4) ~ 1.386. With x = pixels / 255 the same recipe reaches ~0.05.
"""
import argparse

import torch
import torch.nn as nn


def make_images(n, generator):
    """Four classes of 8x8 noise images; each class brightens a different quadrant."""
    y = torch.randint(0, 4, (n,), generator=generator)
    img = torch.rand(n, 8, 8, generator=generator) * 195.0
    for c, (r, col) in enumerate([(0, 0), (0, 4), (4, 0), (4, 4)]):
        mask = y == c
        img[mask, r : r + 4, col : col + 4] += 60.0
    pixels = img.round().clamp(0, 255)  # uint8-like values stored as float
    return pixels, y


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    pixels, y = make_images(1024, g)
    x = pixels.flatten(1)

    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    for step in range(args.steps):
        idx = torch.randint(0, x.shape[0], (args.batch_size,))
        optimizer.zero_grad()
        loss = criterion(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item()!r}")


if __name__ == "__main__":
    main()
