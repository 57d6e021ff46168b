"""A log-space regression whose loss is NaN only in a rare corner of the inputs.

Inputs are 16 features drawn uniformly from [-1, 1]; the target is
1 + 0.1 * sum(x) (always positive on the data).  The script compares the
prediction with the target in log space and, to keep the prediction
positive, feeds ``log`` with ``1 + out`` (the model's output ``out`` stays
above -1 on the training data).  The model learns out ~ 0.1 * sum(x), so
where most features are near -1 (sum(x) < -10: a 4-sigma corner of the
input cube that no training batch reaches) ``1 + out`` is negative and the
loss is NaN.  ``--healthy`` uses ``softplus`` instead, positive everywhere.

Prints the loss now and then and, at the end, a digest of the parameters
(so that two runs can be compared bit for bit).
"""
import argparse
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--healthy", action="store_true")
    p.add_argument("--inject", metavar="FILE.pt", help="at step --at, feed the batch saved by nndb fuzz")
    p.add_argument("--at", type=int, default=0)
    a = p.parse_args()
    found = torch.load(a.inject, weights_only=True) if a.inject else None

    torch.manual_seed(a.seed)
    dim, n = 16, 1024
    x = torch.rand(n, dim) * 2 - 1
    y = 1 + 0.1 * x.sum(1, keepdim=True) + 0.01 * torch.randn(n, 1)
    model = nn.Sequential(nn.Linear(dim, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(a.steps):
        idx = torch.randint(0, n, (32,))
        xb, yb = x[idx], y[idx]
        if found is not None and step == a.at:
            xb, yb = found["inputs"][0], found["loss_constants"][0]
        out = model(xb)
        q = F.softplus(out) + 0.5 if a.healthy else 1 + out
        loss = ((torch.log(q) - torch.log(yb)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0 or step == a.steps - 1 or (found is not None and step == a.at):
            print(f"step {step} loss {loss.item():.6f}")
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().numpy().tobytes())
    print("params", h.hexdigest()[:16])


if __name__ == "__main__":
    main()
