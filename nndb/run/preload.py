"""Make fork replicas multi-threaded and exact: ``nndb run`` starts itself
again with Intel's OpenMP runtime preloaded (the ``intel-openmp`` package),
as Intel's PyTorch launcher does.

The CPU torch wheel ships GNU libgomp, whose thread pool does not survive
fork(): a forked replica hangs in its first parallel operation unless it runs
one thread, and a one-thread replay of a two-thread run may differ in the
last bits.  libiomp5 re-creates its pool in a forked child, and torch splits
work by thread count, not by runtime, so the numbers stay the same as under
libgomp (tests/test_run_cli.py compares nndb's output with plain Python's).

The new process also gets a fixed PYTHONHASHSEED (a random one, recorded in
the trace) so that a respawned replica can order sets and dicts of strings as
the run did.  Both variables are then taken out of ``os.environ`` again: the
script and the processes it starts see the environment they would without nndb.
"""
from __future__ import annotations

import os
import random
import sys
from typing import Optional

HASH_SEED: Optional[str] = None      # the hash seed nndb fixed for this process


def libiomp_path() -> Optional[str]:
    for base in (sys.prefix, os.path.dirname(os.path.dirname(sys.executable))):
        p = os.path.join(base, "lib", "libiomp5.so")
        if os.path.exists(p):
            return p
    try:
        from importlib import metadata
        for f in metadata.distribution("intel-openmp").files or ():
            if f.name == "libiomp5.so":
                p = str(f.locate())
                if os.path.exists(p):
                    return p
    except Exception:
        pass
    return None


def preloaded_env() -> Optional[dict]:
    """os.environ with libiomp5 put first in LD_PRELOAD, or None when it is not
    installed or is there already."""
    path = libiomp_path()
    old = os.environ.get("LD_PRELOAD", "")
    if path is None or "libiomp5" in old or os.environ.get("NNDB_NO_PRELOAD"):
        return None
    return dict(os.environ, LD_PRELOAD=path + (":" + old if old else ""))


def settle() -> None:
    """In the process started again: hand the script its own environment back."""
    global HASH_SEED
    if not os.environ.pop("NNDB_PRELOADED", None):
        return
    user = os.environ.pop("NNDB_USER_LD_PRELOAD", "")
    if user:
        os.environ["LD_PRELOAD"] = user
    else:
        os.environ.pop("LD_PRELOAD", None)
    HASH_SEED = os.environ.get("PYTHONHASHSEED")
    if os.environ.pop("NNDB_SET_HASHSEED", None):
        os.environ.pop("PYTHONHASHSEED", None)


def runtime_loaded() -> bool:
    """Whether this process has loaded an OpenMP runtime (torch does at import).
    (The tests' fork server, tests/zygote.py, stands its children in for
    fresh processes here.)"""
    return "torch" in sys.modules


def maybe_restart(replica_mode: str) -> None:
    """Start ``python -m nndb ARGS`` again with libiomp5 preloaded, when it is
    installed, not loaded yet, and fork replicas may be used; else, where
    replicas may be respawned, with a fixed PYTHONHASHSEED if it has none.
    Returns only if not."""
    if os.environ.get("NNDB_PRELOADED") is not None:
        settle()
        return
    if not sys.platform.startswith("linux"):
        return
    forget_dead_openmp()
    if replica_mode == "off" or runtime_loaded():   # (loaded: too late for either)
        return
    env = preloaded_env() if replica_mode != "respawn" else None
    if env is None:
        # no runtime to preload (not installed; or replicas respawned only, no fork): started
        # again all the same while the hash seed is not fixed, as a respawned replica (CUDA's
        # only travel) orders sets and dicts of strings as the run did only with the same seed
        if "PYTHONHASHSEED" in os.environ:
            return
        env = dict(os.environ)
    env["NNDB_PRELOADED"] = "1"
    env["NNDB_USER_LD_PRELOAD"] = os.environ.get("LD_PRELOAD", "")
    if "PYTHONHASHSEED" not in env:
        env["PYTHONHASHSEED"] = str(random.SystemRandom().randint(1, 2**32 - 1))
        env["NNDB_SET_HASHSEED"] = "1"
    for f in (sys.stdout, sys.stderr):
        f.flush()
    try:
        os.execve(sys.executable, [sys.executable, "-m", "nndb", *sys.argv[1:]], env)
    except OSError:
        return


KMP_DIR = "/dev/shm"
_KMP_PREFIX = "__KMP_REGISTERED_LIB_"


def forget_openmp(pid: Optional[int] = None) -> None:
    """Remove Intel OpenMP's registration of process ``pid`` (default: this
    one), ``/dev/shm/__KMP_REGISTERED_LIB_<pid>_<uid>``.  libiomp5 writes it
    in every process that starts its runtime (a forked replica too) and
    removes it at a normal exit only: a replica ends with ``os._exit`` and
    may be killed, so its own nndb code (before ``os._exit``) and the process
    that reaps it (which knows its pid) remove it."""
    if not sys.platform.startswith("linux"):
        return
    try:
        os.unlink(os.path.join(KMP_DIR, f"{_KMP_PREFIX}{os.getpid() if pid is None else pid}_{os.getuid()}"))
    except OSError:
        pass


def forget_dead_openmp(directory: str = KMP_DIR) -> list:
    """Remove the OpenMP registrations this user's ended processes left
    (``__KMP_REGISTERED_LIB_<pid>_<uid>`` of a pid no longer running: a run
    killed with SIGKILL removes nothing), as each ``nndb run`` starts; the
    names removed.  A running process's registration, another user's, or
    one whose pid is running something else now, stays."""
    uid, gone = os.getuid(), []
    try:
        names = os.listdir(directory)
    except OSError:
        return gone
    suffix = f"_{uid}"
    for name in names:
        pid = name[len(_KMP_PREFIX):-len(suffix)] if name.startswith(_KMP_PREFIX) and name.endswith(suffix) else ""
        if not pid.isdigit() or alive(int(pid)):
            continue
        path = os.path.join(directory, name)
        try:
            if os.lstat(path).st_uid == uid:
                os.unlink(path)
                gone.append(name)
        except OSError:
            pass
    return gone


def alive(pid: int) -> bool:
    """Is process ``pid`` running (not ended, not a zombie waiting to be reaped)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rpartition(b")")[2].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return True
