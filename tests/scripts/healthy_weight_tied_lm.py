"""Healthy: a recurrent language model whose output layer shares the input
embedding's weight (weight tying, Press & Wolf 2017: the decoder's weight
*is* the encoder's), trained with Adam and gradient clipping on a Zipf
corpus.  One tensor gets two gradients a step (the embedding's rows and the
decoder's), summed.  Sizes, cell and learning rate vary with the seed."""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _lm_data import batches, zipf_stream  # noqa: E402
from rules_probes_kit import args  # noqa: E402

a = args(steps=40)
vocab, d, cell, lr = [(300, 24, nn.LSTM, 3e-3), (500, 32, nn.GRU, 2e-3), (200, 16, nn.LSTM, 5e-3)][a.seed % 3]


class TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Embedding(vocab, d)
        self.rnn = cell(d, d, batch_first=True)
        self.decoder = nn.Linear(d, vocab)
        self.decoder.weight = self.encoder.weight

    def forward(self, x):
        return self.decoder(self.rnn(self.encoder(x))[0])


g = torch.Generator().manual_seed(a.seed + 1)
data = batches(zipf_stream(vocab, 5000, a.seed + 2), 16, 12, g)
model = TiedLM()
opt = torch.optim.Adam(model.parameters(), lr=lr)
for step in range(a.steps):
    x, y = next(data)
    loss = F.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    opt.step()
    print(f"step {step} loss {loss.item()!r}")
