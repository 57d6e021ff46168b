"""A small regression loop for the Python API's tests (tests/test_api.py):
run as a script (``nndb run``) or imported and called (``nndb.record``).

With NNDB_TEST_API_PAUSE_AT=N in the environment it stops after step N's optimizer
step, creates the file NNDB_TEST_API_READY and waits (at most a minute) for the file
NNDB_TEST_API_GO: a test reads the trace while the run is still writing it, or kills it."""
import os
import sys
import time

import torch
import torch.nn as nn


def _pause(step: int) -> None:
    if os.environ.get("NNDB_TEST_API_PAUSE_AT") != str(step):
        return
    open(os.environ["NNDB_TEST_API_READY"], "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(os.environ["NNDB_TEST_API_GO"]) and time.monotonic() < deadline:
        time.sleep(0.02)


def build(seed: int = 0) -> tuple:
    """(model, optimizer, x, y)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(64, 8)
    return model, opt, x, x.sum(1, keepdim=True)


def train(steps: int = 12, seed: int = 0) -> float:
    return loop(*build(seed), steps)


def loop(model, opt, x, y, steps: int) -> float:
    for step in range(steps):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        _pause(step)
    return loss.item()


if __name__ == "__main__":
    train(int(sys.argv[1]) if len(sys.argv) > 1 else 12)
