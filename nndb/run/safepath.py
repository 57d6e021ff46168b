"""Nothing from the working directory runs because nndb started a process.

``python -m nndb`` and ``python -c`` put the working directory first on
``sys.path`` (``python script.py`` puts the script's directory there), so a
``click.py`` or ``numpy.py`` in the directory nndb is started from would be
imported by nndb itself, before the script or any trust check.  Each entry
point of nndb takes that entry out as its first action (``drop_start_dir``),
and the launcher gives the script the ``sys.path[0]`` Python gives it.

This is Python's safe-path mode (``-P``, ``PYTHONSAFEPATH``) done by hand:
the flag itself would be passed on to the processes the script starts
(multiprocessing copies the interpreter's flags to its spawned workers),
and it does not exist before Python 3.11.

Only ``os`` and ``sys`` are imported here: this module runs before the rest
of nndb and its dependencies.
"""
from __future__ import annotations

import os
import sys

DROPPED = False     # whether this process's start entry of sys.path was taken out


def user_safe_path() -> bool:
    """The user started Python in safe-path (or isolated) mode: it adds no
    directory of its own to ``sys.path``, for the script neither."""
    return bool(getattr(sys.flags, "safe_path", False) or sys.flags.isolated)


def drop_start_dir() -> None:
    """Take out the working directory that ``-m`` (as its path) or ``-c``
    (as '') put first on ``sys.path``."""
    global DROPPED
    if user_safe_path() or not sys.path:
        return
    first = sys.path[0]
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = None
    if first == "" or (cwd is not None and os.path.realpath(first) == os.path.realpath(cwd)):
        del sys.path[0]
        DROPPED = True


INTERRUPTED = 130         # a respawned replica's exit status when Ctrl-C came before its session


def replica_entry(home: str) -> str:
    """The ``python -c`` program of a respawned replica: the working
    directory out of ``sys.path`` first, nndb imported from ``home`` (the
    directory the live run's nndb package lies in) where nothing else on the
    path has it, and that directory out of the path again."""
    # (a Ctrl-C before the replica's session takes it, while torch is imported, ends the
    # process with 130 and no traceback: the live run says the replay was interrupted.  A
    # handler, not only the except: a KeyboardInterrupt raised in a callback (an import lock's)
    # is printed and ignored, and the replay went on.  nndb.timetravel.respawn.run puts
    # Python's own back before the script starts, for the session's guard to take.)
    return (
        "import os, signal, sys\n"
        f"signal.signal(signal.SIGINT, lambda *a: os._exit({INTERRUPTED}))\n"
        "try:\n"
        "    dropped = sys.path[:1] == ['']\n"
        "    if dropped: del sys.path[0]\n"
        f"    sys.path.append({home!r})\n"
        "    import nndb.run.safepath\n"
        "    from nndb.cli import replica_main\n"
        f"    del sys.path[len(sys.path) - 1 - sys.path[::-1].index({home!r})]\n"
        "    nndb.run.safepath.DROPPED = dropped\n"
        "    replica_main()\n"
        "except KeyboardInterrupt:\n"
        f"    os._exit({INTERRUPTED})\n")


def enter_script(first: str):
    """Put ``first`` (the script's directory, or the working directory for
    ``-m``) at ``sys.path[0]`` as Python would; returns what undoes it."""
    if user_safe_path():
        return lambda: None
    if DROPPED or not sys.path:
        sys.path.insert(0, first)

        def undo():
            if sys.path and sys.path[0] == first:
                del sys.path[0]
        return undo
    saved = sys.path[0]                 # the console script's directory (or a host's entry): replaced
    sys.path[0] = first

    def restore():
        if sys.path:
            sys.path[0] = saved
    return restore
