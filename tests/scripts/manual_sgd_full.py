"""A loop without torch.optim: a hand-written SGD update under no_grad.

``train(steps, seen)`` calls ``seen(step, grads, params)`` after each
update with copies of the gradients (before the update) and the parameters
(after it), so a test can compare them with the whole tensors a trace kept.
Prints a digest of the final parameters.
"""
import hashlib
import sys

import torch
import torch.nn as nn


def train(steps: int = 6, seen=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    lr = 0.1
    for step in range(steps):
        for p in model.parameters():
            p.grad = None
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
        if seen is not None:
            seen(step, grads, {n: p.detach().clone() for n, p in model.named_parameters()})
    return model


if __name__ == "__main__":
    m = train(int(sys.argv[1]) if len(sys.argv) > 1 else 6)
    h = hashlib.sha256()
    for name, p in m.state_dict().items():
        h.update(name.encode())
        h.update(p.numpy().tobytes())
    print("digest", h.hexdigest())
