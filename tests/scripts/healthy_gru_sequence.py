"""Healthy: a small recurrent classifier (GRU for even seeds, LSTM for odd)
on sequences, Adam, gradient clipping."""
import torch
import torch.nn as nn

from rules_probes_kit import args

a = args(steps=30)
rnn_cls = nn.LSTM if a.seed % 2 else nn.GRU


class Net(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.rnn = rnn_cls(4, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 2)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


x = torch.randn(64, 10 + 2 * a.seed, 4)
y = (x[:, :, 0].sum(1) > 0).long()
model = Net(16 + 8 * a.seed)
opt = torch.optim.Adam(model.parameters(), lr=5e-3)
criterion = nn.CrossEntropyLoss()
for step in range(a.steps):
    opt.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    print(f"step {step} loss {loss.item()!r}")
