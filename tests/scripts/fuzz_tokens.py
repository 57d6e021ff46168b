"""A token model for nndb fuzz's integer mutation: ids come from a
vocabulary of 50 (the Embedding's num_embeddings) but the data uses only
ids 0..19.  Prints a parameter digest at the end."""
import hashlib

import torch
import torch.nn as nn


class Bag(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, ids):
        return self.head(self.emb(ids).mean(1))


torch.manual_seed(0)
model = Bag()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    ids = torch.randint(0, 20, (8, 5))
    y = ids[:, 0] % 3
    loss = nn.functional.cross_entropy(model(ids), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
h = hashlib.sha256()
for t in model.state_dict().values():
    h.update(t.numpy().tobytes())
print("params", h.hexdigest()[:16])
