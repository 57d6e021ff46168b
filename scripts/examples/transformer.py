"""Train a tiny TransformerEncoder (d_model 32, 2 layers, dropout 0.1).

Healthy: token-sequence classification (is token 1 present more often than
token 2?) with AdamW and a linear-warmup LambdaLR scheduler stepped per step.
"""
import argparse
import sys
import time

import torch
import torch.nn as nn


class TinyTransformer(nn.Module):
    def __init__(self, vocab=16, d_model=32, nhead=4, num_layers=2, seq_len=16, num_classes=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(1, seq_len, d_model))
        layer = nn.TransformerEncoderLayer(
            d_model=d_model, nhead=nhead, dim_feedforward=64, dropout=0.1, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(
            layer, num_layers=num_layers, enable_nested_tensor=False
        )
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens):
        h = self.embed(tokens) + self.pos[:, : tokens.shape[1]]
        h = self.encoder(h)
        return self.head(h.mean(dim=1))


def make_data(n, seq_len, seed):
    g = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, 16, (n, seq_len), generator=g)
    y = ((tokens == 1).sum(dim=1) > (tokens == 2).sum(dim=1)).long()
    return tokens, y


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where the model and the batches live (the data is made on the CPU either way)")
    parser.add_argument("--time", action="store_true",
                        help="print the loop's time after its first steps to stderr (scripts/gpu_check.py)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    seq_len = 16
    tokens, y = make_data(512, seq_len, args.seed)
    tokens, y = tokens.to(args.device), y.to(args.device)

    model = TinyTransformer(seq_len=seq_len).to(args.device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda=lambda s: min(1.0, (s + 1) / args.warmup)
    )

    model.train()
    warm, t0 = min(20, args.steps // 4), time.perf_counter()     # (--time: after the first steps)
    for step in range(args.steps):
        if args.time and step == warm:
            if args.device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        idx = torch.randint(0, tokens.shape[0], (args.batch_size,)).to(args.device)   # CPU generator either way
        optimizer.zero_grad()
        loss = criterion(model(tokens[idx]), y[idx])
        loss.backward()
        optimizer.step()
        lr = scheduler.get_last_lr()[0]
        scheduler.step()
        print(f"step {step} loss {loss.item()!r} lr {lr!r}")

    if args.time:
        if args.device == "cuda":
            torch.cuda.synchronize()
        print(f"time {args.steps - warm} steps {time.perf_counter() - t0!r} s", file=sys.stderr)


if __name__ == "__main__":
    main()
