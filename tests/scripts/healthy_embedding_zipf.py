"""Healthy: a recurrent language model with Adam over a vocabulary of 3000
words with Zipf frequencies.

An embedding's gradient is nonzero only in the rows of the words in the
batch, and a rare word's row almost never: the RMS over the whole table is
thousands of times below the decoder's, while the rows that were used have
gradients of the usual size.  Not a vanishing gradient.
"""
import argparse
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _lm_data import batches, zipf_stream  # noqa: E402
from healthy_rnn_lm_clip import LM  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--vocab", type=int, default=3000)
    ap.add_argument("--emb", type=int, default=64)
    ap.add_argument("--cell", choices=("lstm", "gru"), default="lstm")
    ap.add_argument("--batch-size", type=int, default=16)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    data = batches(zipf_stream(args.vocab, 20000, args.seed + 2), args.batch_size, 20, g)
    model = LM(args.vocab, args.emb, 64, args.cell)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    crit = nn.CrossEntropyLoss()
    for step in range(args.steps):
        x, y = next(data)
        opt.zero_grad()
        loss = crit(model(x).reshape(-1, args.vocab), y.reshape(-1))
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item()!r}")


if __name__ == "__main__":
    main()
