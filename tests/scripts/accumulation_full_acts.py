"""Gradient accumulation over three micro-batches a step, the last one with
a different sequence length: each module runs three forward calls a step.

``train(steps, seen)`` calls ``seen(step, outputs)`` with the first layer's
outputs of the step's calls, in order (copies), so a test can compare them
with the whole tensor a trace kept.  Prints a digest of the final parameters.
"""
import hashlib
import sys

import torch
import torch.nn as nn


def train(steps: int = 4, seen=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    outputs = []
    model[0].register_forward_hook(lambda mod, args, out: outputs.append(out.detach().clone()))
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        outputs.clear()
        opt.zero_grad()
        for length in (5, 5, 3):
            x = torch.randn(2, length, 4, generator=g)
            (model(x).pow(2).mean() / 3).backward()
        opt.step()
        if seen is not None:
            seen(step, list(outputs))
    return model


if __name__ == "__main__":
    m = train(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
    h = hashlib.sha256()
    for name, p in m.state_dict().items():
        h.update(name.encode())
        h.update(p.numpy().tobytes())
    print("digest", h.hexdigest())
