"""gdb's all-stop mode across ranks: when any rank stops at a step end,
every rank stops at the end of that same step.

Every rank makes the agreement at the same point, the session's step-end
stop check, and puts in 1 if it would stop there (a breakpoint,
watchpoint, rule, run control) or was asked to (Ctrl-C at the front),
else 0; every rank gets the OR, and a rank that would go on but sees 1
stops too.  No rank passes a step end before every rank has put in its
answer for it.  How, chosen once, at the first step end (after the
script's own process group exists), through nndb's own gloo group
(``torch.distributed.new_group(backend="gloo")``):

- every rank on one machine (the common case): a barrier in shared memory
  (nndb.distributed.shmbarrier), about 10 us a step end where a collective costs
  hundreds; rank 0 makes the segment, every rank maps it, checks it sees
  every other rank's pid through it, and it is unlinked at once;
- otherwise (ranks on several machines, a segment not shared): one
  all_reduce(MAX) of one int per step end on the gloo group.

A rank that ends while another waits for it breaks the agreement; the
waiting rank says so once and from then on stops on its own.  A stop
inside a step (a module breakpoint) cannot be agreed on this way: the
other ranks are left where they are, waiting in a collective or in this
agreement (nndb.distributed.console tells them by their stacks); ``step`` is
refused across ranks.
"""
from __future__ import annotations

import threading
from typing import Optional

from . import shmbarrier


class StepAgreement:
    """``transport``: "auto" (shared memory where every rank can map it,
    else gloo) or "gloo" (always the collective: what bench.py compares)."""

    def __init__(self, transport: str = "auto"):
        self.transport = transport
        self.group = None
        self.barrier: Optional[shmbarrier.ShmBarrier] = None
        self.broken: Optional[str] = None   # why the agreement stopped (then every rank goes its own way)
        self._told = False
        self._asked = threading.Event()     # Ctrl-C at the front: stop at the next step end

    @property
    def kind(self) -> Optional[str]:
        """"shared memory", "gloo", or None before the first step end."""
        return None if self.group is None else ("shared memory" if self.barrier is not None else "gloo")

    def request_stop(self) -> None:
        self._asked.set()

    def _ready(self) -> bool:
        if self.group is not None:
            return True
        if self.broken is not None:
            return False
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            return False                    # (no process group yet: nothing to agree with)
        self.group = dist.new_group(backend="gloo")
        if self.transport == "auto":
            self.barrier = _shared(self.group)
        return True

    def wants(self, local: bool) -> bool:
        """Every rank's answer: does any rank stop at this step end?"""
        asked = self._asked.is_set()
        if asked:
            self._asked.clear()
        mine = 1 if (local or asked) else 0
        try:
            if not self._ready():
                return bool(mine)
            if self.barrier is not None:
                return self.barrier.agree(bool(mine))
            import torch
            import torch.distributed as dist
            flag = torch.tensor([mine], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
            return bool(flag.item())
        except shmbarrier.BarrierBroken as e:
            self.broken = str(e)
        except Exception as e:              # (never crash training: this rank stops agreeing, says so once)
            self.broken = f"{type(e).__name__}: {e}"
        if self.barrier is not None:
            self.barrier.close()
            self.barrier = None
        return bool(mine)

    def agree(self, session, step: int, stop):
        """The session's stop at this step end, made the job's: None, the
        rank's own stop, or an all-stop for another rank's."""
        wanted = self.wants(stop is not None)
        if self.broken is not None and not self._told:
            self._told = True
            session.error(f"nndb: the all-stop agreement across ranks is broken at step {step} "
                          f"({self.broken}); this rank stops on its own from here")
        if not wanted:
            return None
        if stop is not None:
            return stop
        from ..debugger.stoppoints import Stop
        return Stop("interrupt", step, note="another rank stopped")


def _shared(group) -> Optional[shmbarrier.ShmBarrier]:
    """A shared-memory barrier of every rank of ``group``, or None (then
    the collective): made by rank 0, opened by every rank, used only if
    every rank opened it and sees every other rank's pid through it."""
    import torch
    import torch.distributed as dist
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    path = ""
    if rank == 0:
        try:
            path = shmbarrier.create(world)
        except OSError:
            path = ""                       # (no /dev/shm, not writable: the collective)
    name = torch.zeros(256, dtype=torch.uint8)
    raw = path.encode()[:256]
    name[:len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    dist.broadcast(name, src=0, group=group)
    path = bytes(name.tolist()).rstrip(b"\0").decode(errors="replace")
    barrier = None
    try:
        if path:
            barrier = shmbarrier.ShmBarrier(path, rank, world)
    except (OSError, shmbarrier.BarrierBroken):
        barrier = None
    try:
        ok = torch.tensor([1 if barrier is not None else 0], dtype=torch.int32)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)      # (every rank has mapped it, or not)
        if ok.item():
            ok.fill_(1 if barrier.peers_visible() else 0)
            dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
    finally:
        if rank == 0:
            shmbarrier.remove(path)          # (mapped by every rank, or by none that will use it)
    if not ok.item():
        if barrier is not None:
            barrier.close()
        return None
    return barrier
