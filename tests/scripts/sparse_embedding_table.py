"""A large sparse embedding table (nn.Embedding(sparse=True), 200,000 rows) under
SparseAdam beside a dense head under Adam, as recommendation and word2vec
loops train one: each step moves only the 32 rows its batch used, by about
lr per element.  At lr 3e-5 those rows move by ~3e-5 of their size, a small
but working rate; over the whole table the update is 4e-7 of the weights.
``--lr`` sets the table's learning rate (1e-9: far too low)."""
import argparse

import torch
import torch.nn as nn

ap = argparse.ArgumentParser()
ap.add_argument("--lr", type=float, default=3e-5)
ap.add_argument("--steps", type=int, default=30)
a = ap.parse_args()
torch.manual_seed(0)
V = 200_000
emb = nn.Embedding(V, 8, sparse=True)
head = nn.Linear(8, 5)
sparse_opt = torch.optim.SparseAdam(list(emb.parameters()), lr=a.lr)
dense_opt = torch.optim.Adam(head.parameters(), lr=1e-3)
for step in range(a.steps):
    idx = torch.randint(0, V, (32,))
    rows = emb.weight.detach()[idx].clone()
    sparse_opt.zero_grad()
    dense_opt.zero_grad()
    loss = nn.functional.cross_entropy(head(emb(idx)), idx % 5)
    loss.backward()
    sparse_opt.step()
    dense_opt.step()
    moved = (emb.weight.detach()[idx] - rows).norm() / rows.norm()
    print(f"step {step} loss {loss.item()!r} rows moved by {moved.item():.3g} of their norm")
