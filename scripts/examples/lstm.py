"""Train a small LSTM sequence classifier on synthetic sequences.

Healthy: the label is whether the running sum of the sequence ends positive.
Uses Adam with gradient clipping (clip_grad_norm_) before every step.
"""
import argparse

import torch
import torch.nn as nn


class SeqClassifier(nn.Module):
    def __init__(self, input_size=4, hidden_size=32, num_classes=2):
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size, batch_first=True)
        self.head = nn.Linear(hidden_size, num_classes)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return self.head(out[:, -1])


def make_data(n, seq_len, seed):
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(n, seq_len, 4, generator=g)
    y = (x[:, :, 0].sum(dim=1) > 0).long()
    return x, y


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=12)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    x, y = make_data(512, args.seq_len, args.seed)

    model = SeqClassifier()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    for step in range(args.steps):
        idx = torch.randint(0, x.shape[0], (args.batch_size,))
        optimizer.zero_grad()
        loss = criterion(model(x[idx]), y[idx])
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizer.step()
        print(f"step {step} loss {loss.item()!r} grad_norm {grad_norm.item()!r}")


if __name__ == "__main__":
    main()
