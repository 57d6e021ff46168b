"""The cost of all-stop across ranks (``python scripts/bench.py --ranks 2``).

Two ranks (gloo, CPU, one thread each) train the CNN workload under DDP,
each recorded as ``nndb run --batch`` records a rank (recorder, session,
rules; no time travel across ranks), in pairs: without and with the
all-stop agreement (nndb.distributed.allstop: a shared-memory barrier, the ranks
being on one machine; ``--agreement gloo``: one all_reduce(MAX) of one int
per step end on nndb's own gloo group), interleaved, the order alternating.
Printed: the median ratio with/without, its quartiles and min-max, and the
step times.  A second, finer measure (``blocks``): one recorded run whose
agreement is switched on and off every BLOCK steps (at the same step on
every rank), the ratio of each pair of adjacent blocks: a machine whose load
drifts over seconds (the shared one) disturbs adjacent blocks alike.  ``--clock cpu`` times each loop by the rank's CPU time (its
process, all threads) instead of the wall clock: other processes on a loaded
machine disturb it less, but a rank blocked in a collective spends little CPU,
so the wall clock is the one that shows the agreement's wait.
Target: at most 1.05x.
"""
from __future__ import annotations

import json
import os
import socket
import statistics
import tempfile
import time

AGREEMENT_CALLS = 2000
BLOCK = 4               # steps a block (blocks): the agreement on, then off, then on ...


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _quartiles(xs: list) -> tuple:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return q[0], q[2]


def _rank(rank: int, world: int, port: int, name: str, pairs: int, scale: float, out: str,
          clock: str = "wall", transport: str = "auto") -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import bench as B
    from nndb.run.config import RecordSchedule
    from functools import partial

    from nndb.distributed.allstop import StepAgreement

    StepAgreement = partial(StepAgreement, transport)
    torch.set_num_threads(1)
    B.CLOCK = time.process_time if clock == "cpu" else time.perf_counter
    B.REPLICA = "off"                   # (as in every rank of nndb run --nproc-per-node)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    build0, steps, _ = B.WORKLOADS[name]
    steps = max(5, int(steps * scale))

    def build(seed):
        model, opt, crit, data = build0(seed)
        ddp = DDP(model)
        return ddp, type(opt)(ddp.parameters(), **opt.defaults), crit, data

    def agreed(session):
        session.agreement = StepAgreement()

    schedule = RecordSchedule.parse(None, None, None, None)
    ratios, without, with_ = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            times = {}
            for on in ((False, True) if i % 2 == 0 else (True, False)):
                dist.barrier()
                times[on] = B.timed_loop(build, steps, True, schedule, tmp, arm=agreed if on else None)[0]
            ratios.append(times[True] / times[False])
            without.append(times[False] / steps)
            with_.append(times[True] / steps)
    blocks = _blocks(B, build, schedule, pairs * 8, StepAgreement)
    # the agreement alone, the same call a step end makes (no training between: the bare collective)
    agreement = StepAgreement()
    agreement.wants(False)
    kind = agreement.kind
    dist.barrier()
    t, c = time.perf_counter(), time.process_time()
    for _ in range(AGREEMENT_CALLS):
        agreement.wants(False)
    alone_us = (time.perf_counter() - t) / AGREEMENT_CALLS * 1e6
    alone_cpu_us = (time.process_time() - c) / AGREEMENT_CALLS * 1e6
    if rank == 0:
        with open(out, "w") as fh:
            q1, q3 = _quartiles(ratios)
            json.dump({"workload": name, "ranks": world, "steps": steps, "pairs": pairs, "clock": clock,
                       "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                       "ratio_max": max(ratios), "ratio_q1": q1, "ratio_q3": q3, "ratios": ratios, "without_ms": statistics.median(without) * 1e3,
                       "with_ms": statistics.median(with_) * 1e3,
                       "cost_ms_per_step": (statistics.median(with_) - statistics.median(without)) * 1e3,
                       "agreement_alone_us": alone_us, "agreement": kind,
                       "agreement_alone_cpu_us": alone_cpu_us, "blocks": blocks}, fh)
    dist.destroy_process_group()


def _blocks(B, build, schedule, pairs: int, StepAgreement) -> dict:
    """One recorded run, the agreement switched every BLOCK steps: the ratio
    of each adjacent (on, off) pair of blocks' times, the order alternating."""
    import torch.distributed as dist
    model, opt, crit, data = build(0)
    with tempfile.TemporaryDirectory() as tmp:
        rec, session, path = B._recording(schedule, tmp)
        agreement = StepAgreement()
        rec.__enter__()
        try:
            B.train(model, opt, crit, data, B.WARMUP)
            agreement.wants(False)          # (nndb's group made: every rank, the same point)
            dist.barrier()
            ratios = []
            for i in range(pairs):
                t = {}
                for on in ((True, False) if i % 2 == 0 else (False, True)):
                    session.agreement = agreement if on else None
                    t0 = B.CLOCK()
                    B.train(model, opt, crit, data, BLOCK)
                    t[on] = B.CLOCK() - t0
                ratios.append(t[True] / t[False])
        finally:
            session.agreement = None
            rec.__exit__(None, None, None)
            rec.close()
            session.run_ended("finished", 0, "")
            session.machine.close()
    q1, q3 = _quartiles(ratios)
    return {"pairs": pairs, "block_steps": BLOCK, "ratio_median": statistics.median(ratios),
            "ratio_q1": q1, "ratio_q3": q3, "ratio_min": min(ratios), "ratio_max": max(ratios)}


def main(world: int, pairs: int, scale: float, json_path=None, name: str = "cnn", clock: str = "wall",
         transport: str = "auto") -> int:
    import torch.multiprocessing as mp
    from tabulate import tabulate
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ranks.json")
        mp.spawn(_rank, args=(world, _free_port(), name, pairs, scale, out, clock, transport), nprocs=world, join=True)
        with open(out) as fh:
            r = json.load(fh)
    print(f"{world} ranks, gloo, 1 thread each, DDP, nndb recording each rank; all-stop agreement "
          f"({r['agreement']}) off / on; "
          f"{pairs} pairs, {clock} clock")
    print(tabulate([[r["workload"], f"{r['without_ms']:.2f}", f"{r['with_ms']:.2f}", f"{r['cost_ms_per_step']:.3f}",
                     f"{r['ratio_median']:.3f}x", f"{r['ratio_q1']:.3f}-{r['ratio_q3']:.3f}",
                     f"{r['ratio_min']:.3f}-{r['ratio_max']:.3f}",
                     f"{r['agreement_alone_us']:.0f}"]],
                   headers=["workload", "ms/step without", "ms/step with", "cost ms/step", "ratio (median)",
                            "ratio quartiles", "ratio min-max", "agreement alone us"], disable_numparse=True))
    print(f"the agreement alone: {r['agreement_alone_us']:.0f} us wall, {r['agreement_alone_cpu_us']:.0f} us CPU "
          f"a call ({AGREEMENT_CALLS} calls in a row)")
    b = r["blocks"]
    print(f"blocks of {b['block_steps']} steps, agreement on/off alternating in one run, {b['pairs']} pairs: "
          f"ratio median {b['ratio_median']:.3f}x, quartiles {b['ratio_q1']:.3f}-{b['ratio_q3']:.3f}, "
          f"min-max {b['ratio_min']:.3f}-{b['ratio_max']:.3f}")
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(r, fh, indent=2)
    return 0
