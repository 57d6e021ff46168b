"""Planted loss_explodes (and update_ratio at step 0): a recurrent word LM
updated by hand (p -= lr * grad, the word_language_model example's loop) at
a learning rate thousands of times too high and no effective clipping: the
loss multiplies by ~100 within two steps and the updates are as large as the
weights from the first step.  The script stops itself when the loss is no
longer finite (the example dies of OverflowError there).  Sizes and the
recurrent cell vary with the seed."""
import argparse
import math
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _lm_data import batches, zipf_stream  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--steps", type=int, default=12)
ap.add_argument("--lr", type=float, default=5000.0)
a = ap.parse_args()
torch.manual_seed(a.seed)
vocab, emb, hidden, cell = [(300, 16, 16, nn.LSTM), (500, 24, 32, nn.GRU), (800, 32, 24, nn.LSTM)][a.seed % 3]
g = torch.Generator().manual_seed(a.seed + 1)
data = batches(zipf_stream(vocab, 5000, a.seed + 2), 8, 12, g)


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Embedding(vocab, emb)
        self.rnn = cell(emb, hidden, batch_first=True)
        self.decoder = nn.Linear(hidden, vocab)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, x):
        return self.decoder(self.rnn(self.encoder(x))[0])


model = LM()
crit = nn.CrossEntropyLoss()
for step in range(a.steps):
    x, y = next(data)
    model.zero_grad()
    loss = crit(model(x).reshape(-1, vocab), y.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-a.lr)
    print(f"step {step} loss {loss.item()!r}")
    if not math.isfinite(loss.item()) or loss.item() > 1e30:
        break
