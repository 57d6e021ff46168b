"""Train a small CNN with BatchNorm on synthetic 1x16x16 images (10 classes).

Healthy: Adam optimizer; every 10 steps runs a short validation pass under
model.eval() + torch.no_grad(), then switches back with model.train().
"""
import argparse
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class SmallCNN(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, kernel_size=3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, kernel_size=3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16 * 4 * 4, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)  # 8x8
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)  # 4x4
        return self.fc(x.flatten(1))


def make_data(n, seed):
    """Each class is a fixed random template plus noise."""
    g = torch.Generator().manual_seed(seed + 1)
    templates = torch.randn(10, 1, 16, 16, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    x = templates[y] + 0.8 * torch.randn(n, 1, 16, 16, generator=g)
    return x, y


def evaluate(model, x, y):
    model.eval()
    with torch.no_grad():
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        acc = (logits.argmax(dim=1) == y).float().mean()
    model.train()
    return loss.item(), acc.item()


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--val-every", type=int, default=10)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where the model and the batches live (the data is made on the CPU either way)")
    parser.add_argument("--deterministic", action="store_true",
                        help="torch.use_deterministic_algorithms(True) (and CUBLAS_WORKSPACE_CONFIG on CUDA)")
    parser.add_argument("--time", action="store_true",
                        help="print the loop's time after its first steps to stderr (scripts/gpu_check.py)")
    args = parser.parse_args()
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")   # read when cuBLAS starts
        torch.use_deterministic_algorithms(True)

    torch.manual_seed(args.seed)
    x, y = make_data(640, args.seed)
    x, y = x.to(args.device), y.to(args.device)
    x_train, y_train = x[:512], y[:512]
    x_val, y_val = x[512:], y[512:]

    model = SmallCNN().to(args.device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    model.train()
    warm, t0 = min(20, args.steps // 4), time.perf_counter()     # (--time: after the first steps)
    for step in range(args.steps):
        if args.time and step == warm:
            if args.device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        idx = torch.randint(0, x_train.shape[0], (args.batch_size,)).to(args.device)   # CPU generator either way
        optimizer.zero_grad()
        loss = criterion(model(x_train[idx]), y_train[idx])
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item()!r}")

        if (step + 1) % args.val_every == 0:
            val_loss, val_acc = evaluate(model, x_val, y_val)
            print(f"val step {step} loss {val_loss!r} acc {val_acc!r}")

    if args.time:
        if args.device == "cuda":
            torch.cuda.synchronize()
        print(f"time {args.steps - warm} steps {time.perf_counter() - t0!r} s", file=sys.stderr)


if __name__ == "__main__":
    main()
