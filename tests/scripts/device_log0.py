"""At step 3 a module's forward takes log(0): -inf, then NaN in the loss, on
--device cpu or cuda.  scripts/gpu_check.py runs it under `catch nan` and
expects the first stop to name log, the module `head`, the line marked LOG
LINE and step 3.  (Named device_, not planted_: the rule matrix leaves it out.)"""
import argparse
import os

import torch
import torch.nn as nn


class LogProb(nn.Module):
    def forward(self, p):
        return torch.log(p)                       # LOG LINE


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 4)
        self.head = LogProb()

    def forward(self, x, plant=False):
        p = torch.softmax(self.body(x), dim=1)
        if plant:
            p = p * torch.zeros_like(p)           # every probability exactly 0
        return self.head(p)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    # catch nan replays step 3 to find the op; on CUDA that replay is a respawned
    # process (no fork), which must compute the same numbers as this one
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    model = Net().to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(args.steps):
        x = torch.randn(16, 8).to(args.device)
        y = torch.randint(0, 4, (16,)).to(args.device)
        logp = model(x, plant=step == 3)
        loss = -(nn.functional.one_hot(y, 4).float() * logp).sum(1).mean()  # 0 * -inf = NaN
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item()!r}")


if __name__ == "__main__":
    main()
