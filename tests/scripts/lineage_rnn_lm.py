"""A tiny recurrent language model whose forward loops over time steps by
hand (one RNNCell call per token), for the lineage tests: the loss depends on
every time step through torch.stack (``--last``: only through the last
hidden state, a recurrence h[t] = cell(x[t], h[t-1]))."""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

LAST = "--last" in sys.argv


class RNNLM(nn.Module):
    def __init__(self, vocab=50, hidden=16):
        super().__init__()
        self.encoder = nn.Embedding(vocab, hidden)
        self.cell = nn.RNNCell(hidden, hidden)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, tokens):
        emb = self.encoder(tokens)                     # (T, N, H)
        h = torch.zeros(tokens.shape[1], self.cell.hidden_size)
        outs = []
        for x in emb:
            h = self.cell(x, h)
            outs.append(h)
        if LAST:                                        # only the last time step's output
            return self.decoder(h)                      # (N, V)
        return self.decoder(torch.stack(outs))          # (T, N, V)


torch.manual_seed(0)
model = RNNLM()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(4):
    tokens = torch.randint(0, 50, (12, 4))
    logits = model(tokens[:-1])
    target = tokens[-1] if LAST else tokens[1:].reshape(-1)
    loss = F.cross_entropy(logits.reshape(-1, 50), target)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("done")
