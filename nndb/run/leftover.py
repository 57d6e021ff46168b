"""The script's threads that a run ended at the prompt, or by SIGTERM, leaves behind.

Python waits for every non-daemon thread before it exits
(``threading._shutdown``).  A run nndb ended at the prompt (``quit``,
``kill``, ``run``) stopped the script where it stood: a thread of the
script that waits on its loop (a producer blocked on a full
``queue.Queue``, a consumer waiting for the next item) never ends then, and
nndb, in the same process, never ended either (``-e quit`` hung a batch
run until it was killed).  So did a SIGTERM, which nndb turns into the end
of the run and its trace (plain Python dies of it at once: no thread is
waited for then either, ``wait_s`` 0).  The driver notes the threads alive as a run is
ended so (``running``); ``end_without`` waits a little for them (one that
is finishing its work, an asynchronous save, finishes it), names those
still running and ends the process without them, as Python would end it
otherwise: the exit handlers run (``atexit``: logging's flush, the script's
own) and the script's open files are flushed, then ``os._exit``.  The
threads of a run that ended by itself are waited for as Python waits for
them (a script that hangs at its end under Python hangs under nndb too).
"""
from __future__ import annotations

import atexit
import gc
import io
import os
import sys
import threading
import time
from typing import Callable

JOIN_S = 2.0            # how long the threads get to end by themselves, all together


def running() -> list:
    """The script's threads Python would wait for: alive, not daemon threads, not nndb's own."""
    return [t for t in threading.enumerate()
            if t is not threading.main_thread() and t.is_alive() and not t.daemon
            and not t.name.startswith("nndb-")]


def end_without(threads, code: int, message: Callable[[str], None], wait_s: float = JOIN_S,
                how: str = "ended at the prompt") -> None:
    """Return if none of ``threads`` is left once they had ``wait_s`` seconds
    to end; else say which (the run was ``how``) and end the process with ``code``."""
    deadline = time.monotonic() + wait_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    left = [t for t in threads if t.is_alive()]
    if not left:
        return
    names = ", ".join(sorted(t.name for t in left)[:4]) + (" ..." if len(left) > 4 else "")
    message(f"nndb: the run was {how} while {len(left)} thread(s) of the script were still "
            f"running ({names}; not daemon threads, which Python waits for): nndb ends without them")
    try:
        atexit._run_exitfuncs()
    except BaseException:
        pass
    _flush_open_files()
    os._exit(code)


def _flush_open_files() -> None:
    """What interpreter shutdown would write: every open file object's buffer."""
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    kinds = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom, io.FileIO)
    for o in gc.get_objects():
        # (the type alone: isinstance would ask objects for __class__, which some answer with a warning)
        if issubclass(type(o), kinds):
            try:
                if not o.closed and o.writable():
                    o.flush()
            except Exception:
                pass
