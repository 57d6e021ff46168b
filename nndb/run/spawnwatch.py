"""Processes the script starts with ``torch.multiprocessing.spawn`` (or
``start_processes``): nndb records only the process it runs, so a script
that trains in them (pytorch/examples' imagenet with
``--multiprocessing-distributed``, DDP tutorials' ``mp.spawn(worker, ...)``)
is told so in one line when it starts them, not after hours of training
with nothing recorded.  The call itself is torch's, unchanged: the script
runs and prints what it does under plain python (docs/distributed.md)."""
from __future__ import annotations

import sys
from typing import Callable


def _name(fn) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


class SpawnWatch:
    """Wraps torch.multiprocessing's ``start_processes`` (which ``spawn``
    calls) while installed; ``spawned`` lists ``(function, nprocs)`` per call."""

    def __init__(self, message: Callable[[str], None]):
        self.message = message
        self.spawned: list = []
        self._patched: list = []         # (owner, attribute, original)

    def install(self) -> None:
        tmp = sys.modules.get("torch.multiprocessing")
        mod = sys.modules.get("torch.multiprocessing.spawn")
        if tmp is None or mod is None or self._patched:
            return
        original = getattr(mod, "start_processes", None)
        if original is None:
            return
        watch = self

        def start_processes(fn, args=(), nprocs=1, *rest, **kw):
            watch.started(fn, nprocs)
            return original(fn, args, nprocs, *rest, **kw)
        start_processes.__wrapped__ = original
        for owner in (mod, tmp):
            if getattr(owner, "start_processes", None) is original:
                self._patched.append((owner, "start_processes", original))
                setattr(owner, "start_processes", start_processes)

    def uninstall(self) -> None:
        for owner, attr, original in reversed(self._patched):
            setattr(owner, attr, original)
        self._patched = []

    def started(self, fn, nprocs) -> None:
        try:
            first = not self.spawned
            self.spawned.append((_name(fn), nprocs))
            if first:
                self.message(f"nndb: the script starts {nprocs} process(es) with torch.multiprocessing.spawn "
                             f"({_name(fn)}): nndb does not trace them (it records the process it runs); to record "
                             f"each rank, start them with 'nndb run --nproc-per-node N SCRIPT' where the script "
                             f"reads torchrun's environment (docs/distributed.md)")
        except Exception:               # (never in the way of the script's own call)
            pass
