"""A model with dropout, trained with Adam on --device cpu or cuda, that can
resume from one of nndb's on-disk checkpoints (``--resume run.ckpt/step_N.pt``):
the checkpoint's modules, optimizer and RNG (torch's, CUDA's where the run
had CUDA initialised, Python's and numpy's), loaded with
``weights_only=True``, then steps N+1 on.  Resumed, it must print the same
losses as the recorded run did for those steps, bit for bit: dropout draws
from the device's generator, so the losses differ unless the RNG comes back.
scripts/gpu_check.py and tests/test_disk_checkpoints_alone.py run it."""
import argparse
import os

import torch
import torch.nn as nn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--resume", metavar="PATH")
    args = parser.parse_args()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 16, generator=g).to(args.device)
    y = torch.randint(0, 4, (256,), generator=g).to(args.device)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, 4)).to(args.device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = 0
    if args.resume:
        from nndb.timetravel import disk
        ck = torch.load(args.resume, weights_only=True)
        (state,) = ck["modules"].values()
        (ostate,) = ck["optimizers"].values()
        model.load_state_dict(state)
        opt.load_state_dict(ostate)
        disk.restore_rng(ck["rng"])
        print(f"resumed after step {ck['step']}, cuda rng states: {len(ck['rng']['cuda'])}")
        first = ck["step"] + 1
    for step in range(first, args.steps):
        idx = torch.randint(0, 256, (32,), device=args.device)    # the device's generator too
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item()!r}")


if __name__ == "__main__":
    main()
