"""gdb's all-stop mode across ranks: when any rank stops at a step end,
every rank stops at the end of that same step.

The agreement is one all_reduce(MAX) of one int per step end, on nndb's own
gloo group (``torch.distributed.new_group(backend="gloo")``, made by every
rank at its first step end, after the script's own process group exists),
made by every rank at the same point: the session's step-end stop check.
Each rank puts in 1 if it would stop there (a breakpoint, watchpoint, rule,
run control) or was asked to (Ctrl-C at the front), else 0.  A rank that
would go on but sees 1 stops too.  A stop inside a step (a module
breakpoint) cannot be agreed on this way: the other ranks are left where
they are, waiting in a collective (nndb.dist.console tells them by their
stacks); ``step`` is refused across ranks.
"""
from __future__ import annotations

import threading
from typing import Optional


class StepAgreement:
    def __init__(self):
        self.group = None
        self.broken: Optional[str] = None   # why the agreement stopped (then every rank goes its own way)
        self._asked = threading.Event()     # Ctrl-C at the front: stop at the next step end

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
            import torch
            import torch.distributed as dist
            flag = torch.tensor([mine], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
            return bool(flag.item())
        except Exception as e:              # (never crash training: this rank stops agreeing, says so once)
            self.broken = f"{type(e).__name__}: {e}"
            return bool(mine)

    def agree(self, session, step: int, stop):
        """The session's stop at this step end, made the job's: None, the
        rank's own stop, or an all-stop for another rank's."""
        if not self.wants(stop is not None):
            return None
        if stop is not None:
            return stop
        from ..debugger.stoppoints import Stop
        return Stop("interrupt", step, note="another rank stopped")
