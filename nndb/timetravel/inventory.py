"""The checkpoints as data, for ``info checkpoints``: each one's step, kind,
process, cost and memory (what dropping it would free)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .forking import memory_kib


@dataclass
class CheckpointInfo:
    number: int
    step: int
    kind: str
    pid: int
    cost_s: float
    private_kib: Optional[int]        # None: the process's memory could not be read
    pss_kib: Optional[int]


def checkpoint_inventory(machine) -> list:
    """[CheckpointInfo] of the machine's checkpoints, oldest step first."""
    out = []
    for ck in sorted(machine.checkpoints.values(), key=lambda c: c.step):
        mem = memory_kib(ck.pid)
        out.append(CheckpointInfo(ck.number, ck.step, ck.kind, ck.pid, ck.cost_s,
                                  mem["private"] if mem else None, mem["pss"] if mem else None))
    return out


def total_private_kib(infos: list) -> int:
    """The private memory of all the checkpoints whose memory could be read."""
    return sum(i.private_kib for i in infos if i.private_kib is not None)
