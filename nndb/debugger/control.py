"""Run control: what the user asked the run to do until the next stop, and
where the run stands (bdb's ``stopframe``/``stoplineno``/``quitting``).

Owned by the session (``session.control``); the session's ``set_*`` and
``request_*`` requests set it, the stop checks (nndb.debugger.stoppoints)
read it.  Plain data and a few transitions, no I/O."""
from __future__ import annotations

import threading
from typing import Optional

from .modes import End, Mode, State


class RunControl:
    """The run's mode (continue, next, step, finish, until, detach) with its
    targets (``count`` steps left for next, ``until_step``), the stops asked
    for outside a mode (``pending_start``: the start of a run, with
    ``stop_at_start`` for each run; ``interrupt_requested``: Ctrl-C), whether
    the prompt loop is to end (``resume``) and what then happens to the run
    (``end``: kill, restart, quit); where the session stands (``state``) and
    how the last run ended (``ended``: its status, ``exit_code``).  Also the
    session's hold on the run: its listeners in the run's step pipeline
    (``listeners``: joined as a run starts, left as it ends) and the thread
    stops happen in (``main_thread``)."""

    def __init__(self, stop_at_start: bool = True):
        self.stop_at_start = stop_at_start
        self.mode = Mode.CONTINUE
        self.count = 0                       # next: steps left to run
        self.until_step: Optional[int] = None
        self.pending_start = stop_at_start   # stop at the run's first module call (or step end)
        self.interrupt_requested = False
        self.resume = False                  # the prompt loop ends: a command resumed the run
        self.end: Optional[End] = None       # what happens to the run as the prompt loop ends
        self.state = State.NONE
        self.ended: Optional[str] = None     # how the last run ended (status), or None
        self.exit_code: Optional[int] = None
        self.listeners: list = []            # the session's part of the run's step pipeline
        self.main_thread = threading.main_thread().ident

    def new_run(self, pending_start: bool) -> None:
        """A run starts: plain continue, the start stop if asked; a quit asked
        before it still ends the session."""
        self.state = State.LIVE
        self.ended = None
        self.pending_start = pending_start
        self.mode, self.count, self.until_step = Mode.CONTINUE, 0, None
        self.interrupt_requested = False
        if self.end is not End.QUIT:
            self.end = None

    def request(self, mode: Mode, count: int = 0, until: Optional[int] = None) -> None:
        """Run in ``mode`` from the end of this prompt loop."""
        self.mode, self.count, self.until_step = mode, count, until
        self.resume = True

    def finish(self, end: End) -> None:
        """End the run (and with ``End.QUIT`` the session) as the prompt loop ends."""
        self.end, self.resume = end, True

    def reset(self) -> None:
        """Plain continue, nothing requested: a replica starting from a checkpoint."""
        self.mode, self.count, self.until_step = Mode.CONTINUE, 0, None
        self.pending_start = self.interrupt_requested = self.resume = False
        self.end = None

    @property
    def kill_requested(self) -> bool:
        return self.end in (End.KILL, End.QUIT)

    @property
    def restart_requested(self) -> bool:
        return self.end is End.RESTART

    @property
    def quit_requested(self) -> bool:
        return self.end is End.QUIT
