"""The floor under the overhead target (``python scripts/bench.py --floor``).

What every recorded step must read before nndb can make anything of it
(issue 19: each parameter's gradient and update at every step, and the
loss), done by the fewest hooks that can do it, against the plain loop and
against nndb, interleaved in one process:

* plain: the loop alone;
* floor: global optimizer pre/post hooks, a gradient-accumulated hook on
  each parameter that queues one callback at the backward's end (nndb's
  way of finding the step's end), the loss read there (``item()``), and per
  step: the parameters' values before and after the update concatenated
  into one float32 row of a 16-row ring, the update subtracted in place,
  the gradients copied in with one ``torch._foreach_copy_``; every 16 steps
  the ring's norms, one ``reduceat``.  No record, rule, trace, checkpoint or
  observed step;
* nndb: what ``nndb run --batch`` adds (the timed benchmark's B).

The floor's ratio is what capturing the data costs on the day's machine;
the distance from it to the target is what is left for everything else
(records, the rules on every step, the writer, checkpoints, observed
steps).  Only small CPU float32 parameters are handled (the workloads').
"""
from __future__ import annotations

import statistics

import numpy as np
import torch
from torch.autograd import Variable
from torch.optim import optimizer as _optim

RING = 16


class FloorHooks:
    """The minimal per-step capture, installed on one optimizer's parameters."""

    def __init__(self, opt, crit):
        self.params = [p for g in opt.param_groups for p in g["params"]]
        sizes = [p.numel() for p in self.params]
        n = self.n = sum(sizes)
        self.ring = np.empty((RING, 3 * n), dtype=np.float32)      # values | updates | gradients
        self.starts = np.concatenate([[0], np.cumsum(sizes * 3)[:-1]]).astype(np.int64)
        self.views = [p.detach().numpy().reshape(-1) for p in self.params]
        self.grad_dst = []
        flat = torch.from_numpy(self.ring)
        for row in range(RING):
            at, dst = 2 * n, []
            for p, k in zip(self.params, sizes):
                dst.append(flat[row, at:at + k].view(p.shape))
                at += k
            self.grad_dst.append(dst)
        self.i = 0
        self.losses: list = []
        self.norms: list = []
        self._loss = None
        self._pending = False
        self.handles = [_optim.register_optimizer_step_pre_hook(self._pre),
                        _optim.register_optimizer_step_post_hook(self._post),
                        crit.register_forward_hook(self._loss_out)]
        self.handles += [p.register_post_accumulate_grad_hook(self._accumulated) for p in self.params]

    def _loss_out(self, module, args, out):
        self._loss = out

    def _accumulated(self, param):
        if not self._pending:
            self._pending = True
            Variable._execution_engine.queue_callback(self._backward_end)

    def _backward_end(self):
        self._pending = False
        if self._loss is not None:
            self.losses.append(self._loss.item())

    def _pre(self, opt, args, kwargs):
        n = self.n
        np.concatenate(self.views, out=self.ring[self.i % RING, n:2 * n])

    def _post(self, opt, args, kwargs):
        row, n = self.ring[self.i % RING], self.n
        with torch.no_grad():
            torch._foreach_copy_(self.grad_dst[self.i % RING], [p.grad for p in self.params])
        np.concatenate(self.views, out=row[:n])
        np.subtract(row[:n], row[n:2 * n], out=row[n:2 * n])
        self.i += 1
        if self.i % RING == 0:
            self.norms.append(np.add.reduceat(np.square(self.ring), self.starts, axis=1))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def floor_loop(build, steps: int, bench) -> float:
    """Seconds for ``steps`` steps under the floor's hooks, after the benchmark's WARMUP."""
    model, opt, crit, data = build(0)
    hooks = FloorHooks(opt, crit)
    try:
        bench.train(model, opt, crit, data, bench.WARMUP)
        t = bench.CLOCK()
        bench.train(model, opt, crit, data, steps)
        elapsed = bench.CLOCK() - t
    finally:
        hooks.remove()
    if len(hooks.losses) != bench.WARMUP + steps or len(hooks.norms) != (bench.WARMUP + steps) // RING:
        raise RuntimeError("the floor's hooks missed steps")
    return elapsed


def main(names, pairs: int, scale: float, schedule, tmpdir, bench) -> list:
    """Per workload: plain, floor and nndb interleaved ``pairs`` times (the
    order rotating); the median ratios against plain."""
    from tabulate import tabulate
    rows, out = [], []
    for name in names:
        build, steps, _ = bench.WORKLOADS[name]
        steps = max(5, int(steps * scale))
        floor, nndb, plain_s = [], [], []
        kinds = ("plain", "floor", "nndb")
        for i in range(pairs):
            t = {}
            for kind in kinds[i % 3:] + kinds[:i % 3]:
                if kind == "floor":
                    t[kind] = floor_loop(build, steps, bench)
                else:
                    t[kind] = bench.timed_loop(build, steps, kind == "nndb", schedule, tmpdir)[0]
            plain_s.append(t["plain"] / steps)
            floor.append(t["floor"] / t["plain"])
            nndb.append(t["nndb"] / t["plain"])
        r = {"workload": name, "pairs": pairs, "plain_ms": statistics.median(plain_s) * 1e3,
             "floor_ratio": statistics.median(floor), "floor_min": min(floor), "floor_max": max(floor),
             "nndb_ratio": statistics.median(nndb), "nndb_min": min(nndb), "nndb_max": max(nndb)}
        out.append(r)
        rows.append([name, f"{r['plain_ms']:.2f}", f"{r['floor_ratio']:.3f}x ({r['floor_min']:.3f}-{r['floor_max']:.3f})",
                     f"{r['nndb_ratio']:.3f}x ({r['nndb_min']:.3f}-{r['nndb_max']:.3f})"])
    print(tabulate(rows, headers=["workload", "plain ms/step", "floor: capture only (min-max)",
                                  "nndb (min-max)"], disable_numparse=True))
    return out
