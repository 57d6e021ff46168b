"""A causal language model shaped as a Hugging Face one, in plain torch, trained as the
Hugging Face Trainer trains it: called with its input ids as its labels, it shifts them
inside (pads them with -100 and drops the first, ``ForCausalLMLoss``); given the
Trainer's ``num_items_in_batch`` (the target tokens of the whole accumulated batch) it
returns the sum of the token losses over that number, else their mean.  Names of 2..6
tokens, many starting alike, padded: no model gets its loss to 0 on them.

Arguments: BATCH (rows a micro-batch), GA (micro-batches a step), "items" to pass
num_items_in_batch as the Trainer does."""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
V, T = 9, 7
BATCH, GA = int(sys.argv[1]), int(sys.argv[2])
ITEMS = sys.argv[3:] == ["items"]
lengths = torch.randint(2, 7, (96,))
X = torch.zeros(96, T, dtype=torch.long)
LABELS = torch.full((96, T), -100)
for i, n in enumerate(lengths.tolist()):
    word = torch.randint(1, V, (n,))
    word[0] = 1 + i % 3
    X[i, :n] = word                 # then 0: the end, and padding
    LABELS[i, :n + 1] = X[i, :n + 1]


class CausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, 16)
        self.rnn = nn.GRU(16, 48, batch_first=True)
        self.head = nn.Linear(48, V)

    def forward(self, input_ids, labels=None, num_items_in_batch=None):
        logits = self.head(self.rnn(self.emb(input_ids))[0])
        out = {"logits": logits}
        if labels is not None:
            shift = F.pad(labels, (0, 1), value=-100)[..., 1:]
            loss = F.cross_entropy(logits.float().view(-1, V), shift.reshape(-1), ignore_index=-100,
                                   reduction="sum" if num_items_in_batch is not None else "mean")
            out["loss"] = loss / num_items_in_batch if num_items_in_batch is not None else loss
        return out


model = CausalLM()
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for step in range(2):
    rows = slice(step * BATCH * GA, (step + 1) * BATCH * GA)
    items = (LABELS[rows, 1:] != -100).sum() if ITEMS else None
    total = 0.0
    for micro in range(GA):
        x = X[rows][micro * BATCH:(micro + 1) * BATCH]
        kw = {"num_items_in_batch": items} if ITEMS else {}
        loss = model(input_ids=x, labels=LABELS[rows][micro * BATCH:(micro + 1) * BATCH], **kw)["loss"]
        (loss if ITEMS else loss / GA).backward()
        total += loss.item()
    opt.step()
    opt.zero_grad()
    print(f"step {step} loss {total!r}")
