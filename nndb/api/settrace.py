"""``nndb.set_trace()``: the nndb prompt at this line of a running program
(pdb's ``set_trace``; ``PYTHONBREAKPOINT=nndb.set_trace`` makes
``breakpoint()`` call it).

Under ``nndb run`` (or inside ``nndb.record``, or after an earlier
``set_trace``) the run's debugger session is live: the call is a stop like a
breakpoint's, with everything that run has (its recorded steps, watches,
time travel).  Otherwise it starts recording here, in this process, with
the pieces of ``nndb.record`` and an interactive session, and stops at the
prompt; the recording ends when the process exits.  What such a recording
cannot have is said at its first stop: the steps before the call.  Time
travel works from the call on, with fork checkpoints of this process (the
first one at the end of the step the call was made in); a respawned replica
re-runs a script nndb started, so there is none here, and in a notebook
kernel (whose threads do not survive fork()) time travel is off.  Without
nndb run's OpenMP preload a replica of a multi-threaded run computes with one
thread: ``info checkpoints`` says whether replays are exact, and a replay
that drifts from the trace is reported as under nndb run.

Nothing here raises into the program: a failure is one line on stderr and
the program goes on; ``quit`` at the prompt ends the recording (the trace is
kept) and the program goes on without nndb.
"""
from __future__ import annotations

import atexit
import sys
from typing import Optional

from ..run.config import shown
from ..debugger import current
from ..errors import KillRun, NndbError, RestartRun
from ..run.runner import stderr_line
from .recording import Recorder

_own: Optional[Recorder] = None      # the recording set_trace started in this process

NOT_HERE = "steps before this call were not recorded ('nndb run SCRIPT' records them all)"
TRAVEL_FROM_HERE = "time travel (goto, reverse-step) reaches back to the end of this step, not before"
KERNEL_NO_TRAVEL = ("nndb.set_trace() in a notebook kernel: its threads do not survive fork(); "
                    "'%nndb run SCRIPT' or 'nndb run SCRIPT' has time travel")


def choose_frontend():
    """The REPL at a terminal; else a prompt read with input() (lines piped
    in, or a notebook's input box); a notebook's front end in a kernel."""
    from ..frontends import notebook
    if notebook.in_kernel():
        return notebook.NotebookFrontend()
    try:
        tty = sys.stdin.isatty() and sys.stdout.isatty()
    except (AttributeError, ValueError):
        tty = False
    if tty:
        from ..frontends.repl import ReplFrontend
        return ReplFrontend()
    from ..frontends.batch import InputFrontend
    return InputFrontend()


def _start(frame, trace: Optional[str]):
    global _own
    from ..frontends import notebook
    kernel = notebook.in_kernel()
    # (None: a new file under ./nndb-runs/)
    rec = Recorder(trace, frontend=choose_frontend(), interactive=True, replica="off" if kernel else "fork")
    s = rec.session
    if kernel:
        s.machine.off_reason = KERNEL_NO_TRAVEL
    rec.__enter__()
    _own = rec
    if not _end_with_the_cell(rec):
        atexit.register(_end_at_exit, rec)
    s.message(f"nndb: recording from here to {shown(rec.path)}; {NOT_HERE}"
              + ("" if kernel else f"; {TRAVEL_FROM_HERE}"))
    return s


def _end_with_the_cell(rec: Recorder) -> bool:
    """In a notebook kernel the recording ends with the cell that called
    set_trace (the kernel outlives it: its later cells are not recorded)."""
    from ..frontends import notebook
    if not notebook.in_kernel():
        return False
    shell = sys.modules["IPython"].get_ipython()

    def ended(result=None):
        global _own
        shell.events.unregister("post_run_cell", ended)
        if _own is rec:
            _own = None
        exc = getattr(result, "error_in_exec", None)
        rec.end(exc if isinstance(exc, Exception) else None)
        stderr_line(f"nndb: the cell ended; trace: {rec.path}")

    shell.events.register("post_run_cell", ended)
    return True


def _end_at_exit(rec: Recorder) -> None:
    # An uncaught exception was printed before atexit runs: the trace says
    # the run failed (no post-mortem prompt while the interpreter goes down).
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    rec.end(exc if isinstance(exc, Exception) else None)


def _leave(rec: Recorder, why: str) -> None:
    global _own
    _own = None
    rec.end(KillRun())
    stderr_line(f"nndb: left the prompt ({why}); the recording ended ({rec.path}) and the program goes on "
            "without nndb")


def set_trace(*, trace: Optional[str] = None, frame=None) -> None:
    """Stop at the nndb prompt at the caller's line (``frame``: another
    frame).  ``trace``: where a recording started here goes (default: a new
    file under ./nndb-runs/)."""
    frame = frame or sys._getframe(1)
    try:
        s = current.session()
        if s is None:
            s = _start(frame, trace)
        s.stop_requested(frame)
    except (KillRun, RestartRun):
        if _own is None or current.session() is not _own.session:
            raise                   # nndb run's: its runner ends the run
        _leave(_own, "quit" if _own.session.quit_requested else "kill")
    except NndbError as e:
        stderr_line(f"nndb: set_trace: {e}; the program goes on without nndb")
    except Exception as e:      # nndb's own failure never stops the program
        stderr_line(f"nndb: set_trace: internal error, the program goes on: {type(e).__name__}: {e}")
