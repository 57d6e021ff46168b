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
waiting rank says so once and from then on stops on its own.  So does a
rank held in one of the script's collectives while another waits for it
at a step end it has not reached, for HELD_S (a watcher thread reads its
main thread's stack when a peer is ahead): that collective waits for the
waiting rank, and the agreement for it, so neither would ever end.  It is
the rank out of inputs under torch's ``Join`` (uneven inputs), which
shadows the others' collectives from outside any step while they go on
training; the rank leaves the agreement (shared memory) and the others
go on, each stopping on its own, as the script runs without nndb.  A stop
inside a step (a module breakpoint) cannot be agreed on this way: the
other ranks are left where they are, waiting in a collective or in this
agreement (nndb.distributed.console tells them by their stacks); ``step`` is
refused across ranks.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from typing import Optional

from . import shmbarrier, stacks

HELD_S = 2.0                # (held this long in a collective while a peer waits at a step end: a deadlock)
WATCH_EVERY_S = 0.2


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
            if self.barrier is not None:
                threading.Thread(target=self._watch, args=(self.barrier, threading.main_thread().ident),
                                 name="nndb-allstop-watch", daemon=True).start()
        return True

    def _watch(self, barrier: shmbarrier.ShmBarrier, main: int) -> None:
        """Leave the barrier when the main thread is held in one of the
        script's collectives, short of a step end another rank waits at,
        for HELD_S (a Join's shadow collectives): see the module's docstring."""
        held = None                          # ((this rank's calls, the collective), since when)
        try:
            while self.barrier is barrier and barrier.left is None:
                time.sleep(WATCH_EVERY_S)
                coll = _held_in(sys._current_frames().get(main)) if barrier.peer_ahead() else None
                if coll is None:
                    held = None
                elif held is None or held[0] != (barrier.calls, coll):
                    held = ((barrier.calls, coll), time.monotonic())
                elif time.monotonic() - held[1] >= HELD_S:
                    barrier.leave(f"this rank waits in {coll} short of a step end another rank waits at "
                                  f"(out of inputs under Join?), so it left the agreement")
                    return
        except Exception:                   # (the barrier closed under it: the agreement is over; never crash)
            return

    def wants(self, local: bool) -> bool:
        """Every rank's answer: does any rank stop at this step end?"""
        asked = self._asked.is_set()
        if asked:
            self._asked.clear()
        mine = 1 if (local or asked) else 0
        if self.broken is not None:
            return bool(mine)               # (this rank stops on its own: no transport waits for the others)
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


_JOIN = os.sep + os.path.join("torch", "distributed", "algorithms", "join.py")


def _held_in(frame) -> Optional[str]:
    """Where the main thread waits, in words, if in one of the script's
    collectives (not nndb's agreement) or in a Join's shadowing of the
    others' (DDP's join hook calls the process group itself), else None."""
    if frame is None:
        return None
    summary = traceback.extract_stack(frame)
    coll = stacks.collective(summary)
    if coll is not None and "all-stop agreement" not in coll:
        return stacks.waiting_in(coll)
    if coll is None and any(f.filename.endswith(_JOIN) and f.name == "__exit__" for f in summary):
        return "torch.distributed's Join (shadowing the other ranks' collectives)"
    return None


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
