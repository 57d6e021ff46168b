"""Healthy: a recurrent language model trained the classic way, plain SGD at a
high learning rate (20) with gradient clipping at 0.25.

The recipe of PyTorch's word_language_model example: the update is written
by hand (p -= lr * p.grad) after clip_grad_norm_.  The update/weight ratio of
some weights is above 0.2 for a while, but the clip bounds the step and the
loss goes down steadily: a high ratio that trains is not the finding a high
ratio with a rising or oscillating loss is.
"""
import argparse
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _lm_data import batches, zipf_stream  # noqa: E402


class LM(nn.Module):
    def __init__(self, vocab, emb, hidden, cell):
        super().__init__()
        self.encoder = nn.Embedding(vocab, emb)
        self.rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[cell](emb, hidden, batch_first=True)
        self.decoder = nn.Linear(hidden, vocab)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, x):
        out, _ = self.rnn(self.encoder(x))
        return self.decoder(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--cell", choices=("lstm", "gru"), default="lstm")
    ap.add_argument("--lr", type=float, default=20.0)
    ap.add_argument("--clip", type=float, default=0.25)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    data = batches(zipf_stream(args.vocab, 20000, args.seed + 2), 16, 20, g)
    model = LM(args.vocab, 32, args.hidden, args.cell)
    crit = nn.CrossEntropyLoss()
    for step in range(args.steps):
        x, y = next(data)
        model.zero_grad()
        loss = crit(model(x).reshape(-1, args.vocab), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-args.lr)
        print(f"step {step} loss {loss.item()!r}")


if __name__ == "__main__":
    main()
