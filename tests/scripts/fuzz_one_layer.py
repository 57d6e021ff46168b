"""A model that is one nn.Linear (no submodules), trained by hand on a polynomial's
features: the loss is taken with .item() and the weights moved with param.data."""
import torch
import torch.nn.functional as F

torch.manual_seed(0)
w_true = torch.randn(4, 1)
fc = torch.nn.Linear(4, 1)
for step in range(6):
    x = torch.randn(32)
    feats = torch.stack([x ** i for i in range(1, 5)], 1)
    out = F.smooth_l1_loss(fc(feats), feats @ w_true)
    fc.zero_grad()
    out.backward()
    for p in fc.parameters():
        p.data.add_(-0.1 * p.grad)
    print("step", step, "loss", round(out.item(), 6))
