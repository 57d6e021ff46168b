"""A model whose optimizer holds its parameters in another order than the
model registers them (nanoGPT's way: the 2-D weights with weight decay in one
group, the biases and LayerNorm scales without in another), for nndb plot's
layer order (tests/test_plot.py).  Plain PyTorch, no nndb."""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Sequential()
model.add_module("fc1", nn.Linear(6, 8))
model.add_module("ln", nn.LayerNorm(8))
model.add_module("fc2", nn.Linear(8, 3))
decay = [p for p in model.parameters() if p.dim() >= 2]
no_decay = [p for p in model.parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=1e-2)
x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
for step in range(6):
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
