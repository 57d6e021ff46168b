"""fork() for replicas: what blocks it, the fork itself, and the suspended
checkpoint process (gdb's ``checkpoint``).

A checkpoint is a child forked at a step boundary that waits on its channel.
To resume it, the live run sends ``resume``: the checkpoint forks again and
the grandchild goes on running the script from that boundary as a replica,
while the checkpoint itself stays for later use (copy-on-write makes each
copy cheap).  The checkpoint reports ``replica-exited`` when that replica ends.

OpenMP: GNU libgomp's thread pool does not survive fork() (a forked child
hangs in its first parallel region).  Intel's libiomp5 does, and ``nndb run``
preloads it when it is installed (``nndb.run.preload``).  Without it a
replica runs with one thread, which is safe but may differ in the last bits
from a multi-threaded run: ``exactness()`` says which case applies.
"""
from __future__ import annotations

import ctypes
import os
import random
import re
import signal
import sys
import threading
from typing import Optional

from ..run.preload import forget_openmp
from .channel import Channel

_PR_SET_PDEATHSIG = 1


def openmp_forks_safely() -> bool:
    from ..run.meta import openmp_runtime
    rt = openmp_runtime()
    # libiomp5 preloaded takes over the GOMP_* entry points even where libgomp
    # is loaded too (torch links it)
    return "libiomp5" in rt or "libgomp" not in rt


def exactness() -> tuple[bool, str]:
    """(exact, why): whether a forked replica computes what the live run did, bit for bit."""
    import torch
    threads = torch.get_num_threads()
    if threads == 1 or openmp_forks_safely():
        return True, f"{threads} thread(s), OpenMP runtime safe across fork()"
    from ..run.preload import libiomp_path
    # (installed, but not preloaded: --replica respawn starts no second process for it)
    fix = ("intel-openmp is installed but not loaded in this process: 'nndb run' preloads it, but not under "
           "--replica respawn" if libiomp_path() else "install intel-openmp to replay exactly")
    return False, (f"the GNU OpenMP runtime cannot run {threads} threads in a forked process: "
                   f"replicas run with 1 thread and may differ in the last bits ({fix})")


def blockers() -> list:
    """Why this process cannot be forked safely now ([] when it can)."""
    reasons = []
    if not hasattr(os, "fork"):
        return ["this platform has no fork()"]
    try:
        import torch
        if torch.cuda.is_initialized():
            reasons.append("CUDA is initialised in this process and does not survive fork()")
    except Exception:
        pass
    group = process_group()
    if group:
        reasons.append(f"a torch.distributed process group ({group}) is initialised in this process: its "
                       "connections and threads do not survive fork() (a forked replica hangs in its first "
                       "collective)")
    import multiprocessing
    kids = multiprocessing.active_children()
    if kids:
        reasons.append(f"{len(kids)} worker process(es) are alive (a DataLoader with num_workers > 0?); "
                       "a forked replica cannot share their queues")
    threads = script_threads(tolerated=False)
    if threads:
        reasons.append(f"the script started threads ({threads}) that do not survive fork()")
    return reasons


def process_group() -> str:
    """The backend of the default process group the script initialised ('gloo', 'nccl'), '' when
    there is none.  A script may start one itself, a world of one included (DINO's
    init_distributed_mode under plain ``python``): not imported here where it is not."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return ""
        return str(dist.get_backend())
    except Exception:
        return "unknown backend"


def _fork_lock(t: threading.Thread):
    """The lock that makes a fork with thread ``t`` alive safe, for the
    threads known to need nothing in a forked child but that lock free: tqdm's
    monitor (``tqdm._monitor.TMonitor``, started by the first progress bar)
    wakes every 10 s to nudge slow bars' ``miniters``, and all it does then is
    under tqdm's thread lock (``TqdmDefaultWriteLock.th_lock``, which the bars
    take to print).  A child forked while that lock is held (``fork`` takes it
    first) has the bars and no monitor (``tqdm.monitor`` there is the dead
    thread, which says it is running: no second is started), so a bar
    nudges itself no more: its numbers and the run's are as before.  None
    for every other thread (and for a tqdm whose lock is not its own: one set
    with ``tqdm.set_lock``)."""
    cls = type(t)
    if cls.__name__ != "TMonitor" or cls.__module__.split(".")[0] != "tqdm":
        return None
    lock = getattr(getattr(t, "tqdm_cls", None), "_lock", None)
    if type(lock).__name__ != "TqdmDefaultWriteLock":
        return None
    return getattr(type(lock), "th_lock", None)


def script_threads(own_code: bool = False, tolerated: bool = True) -> str:
    """The threads alive beside the main one, nndb's own left out, named
    for the user ('' when there are none): at most four.  ``own_code``: only
    those that run the script's own code (``_runs_own_code``); not
    ``tolerated``: not those a fork is made safe for (``_fork_lock``)."""
    names = sorted(_label(t) for t in threading.enumerate()
                   if t is not threading.main_thread() and t.is_alive() and not t.name.startswith("nndb-")
                   and (not own_code or _runs_own_code(t)) and (tolerated or _fork_lock(t) is None))
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _label(t: threading.Thread) -> str:
    """A thread's name; a name Python made up ('Thread-1', 'Thread-1
    (_monitor)') with what the thread runs, which says whose it is
    ('Thread-1 (tensorboard.summary.writer.event_file_writer._AsyncWriterThread)'
    is TensorBoard's SummaryWriter)."""
    m = re.fullmatch(r"(Thread-\d+)(?: \(.*\))?", t.name)
    if m is None:
        return t.name
    what = getattr(t, "_target", None)
    if what is None and type(t) is not threading.Thread:
        what = type(t)
    module, name = getattr(what, "__module__", None), getattr(what, "__qualname__", None)
    return f"{m.group(1)} ({module}.{name})" if module and name else t.name


def _runs_own_code(t: threading.Thread) -> bool:
    """Whether thread ``t`` runs code of the script's (its target, or the
    ``run`` of its class, is defined outside the standard library and the
    installed packages), or a thread pool's callables (concurrent.futures):
    such a thread may draw random numbers or change what the loop reads, where
    a library's own (tqdm's monitor, TensorBoard's writer, a logging
    QueueListener, multiprocessing's feeders) does neither."""
    import sysconfig
    func = getattr(t, "_target", None) or getattr(type(t), "run", None)
    if getattr(func, "__module__", "") == "concurrent.futures.thread":
        return True
    code = getattr(func, "__code__", None)
    if code is None:
        return False             # (a builtin: time.sleep, C code)
    where = os.path.realpath(code.co_filename)
    libs = {os.path.realpath(p) for k, p in sysconfig.get_paths().items() if k in ("stdlib", "purelib", "platlib")}
    return not any(where.startswith(lib + os.sep) for lib in libs)


def die_with_parent(parent: int) -> None:
    """Linux: a checkpoint or replica (forked or respawned) is killed when
    the process that started it, ``parent``, ends; if that has happened
    already (before the request took effect), it ends now."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:
        return
    if os.getppid() != parent:
        os._exit(0)


def fork(close: tuple = ()) -> int:
    """fork() with nndb's tracer left on in the child (a DataLoader worker's
    is switched off) and the stdio buffers flushed first (else the child
    would print them again).  In the child: the channels in ``close`` are closed, and
    Python's ``random`` draws on as in the parent."""
    from ..tracer import hooks
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    hooks.REPLICA_FORK = True
    parent = os.getpid()
    # CPython reseeds the module ``random``'s global generator in a forked child
    # (random.py: os.register_at_fork(after_in_child=_inst.seed)): a replica must go on
    # drawing the run's own numbers (a script that shuffles or augments with ``random``).
    py_random = random.getstate()
    held = [lk for lk in {id(lk): lk for lk in map(_fork_lock, threading.enumerate()) if lk is not None}.values()]
    for lk in held:                 # (never held by their thread at the fork: _fork_lock)
        lk.acquire()
    try:
        pid = os.fork()
    finally:
        hooks.REPLICA_FORK = False
        for lk in held:             # (in the child too: the forking thread holds them there)
            lk.release()
    if pid == 0:
        random.setstate(py_random)
        for c in close:
            c.close()
        die_with_parent(parent)
        if not openmp_forks_safely():
            import torch
            torch.set_num_threads(1)
    return pid


def checkpoint_loop(chan: Channel) -> dict:
    """In a new checkpoint process: wait for orders.  Returns only in a replica
    (the grandchild), with the ``resume`` message.  Anything that goes wrong
    here (a fork that fails for want of memory, a message that is no JSON)
    ends the checkpoint (``os._exit``): an exception out of here would let
    this fork of the run go on as if it were the live run, writing its
    trace and running the rest of the script."""
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is for the replica at the terminal
    try:
        while True:
            msg = chan.recv()
            if msg is None or msg.get("op") == "exit":
                forget_openmp()
                os._exit(0)
            if msg.get("op") != "resume":
                continue
            pid = fork()
            if pid == 0:
                signal.signal(signal.SIGINT, old)
                return msg
            chan.send({"op": "replica-started", "pid": pid})    # (SIGTERM at the live run ends it: SigtermEnds)
            status = 0
            while True:
                try:
                    _, status = os.waitpid(pid, 0)
                    break
                except ChildProcessError:
                    break
                except InterruptedError:
                    continue
            forget_openmp(pid)            # (a replica killed, or one that ended without removing it)
            chan.send({"op": "replica-exited", "status": status})
    except BaseException:         # (never out of here but as the replica)
        os._exit(1)


class SigtermEnds:
    """SIGTERM while the live run waits for a replica (a goto's replay or its past at the prompt,
    a scan, a prediction: ``nndb run`` under ``timeout``, a job scheduler): the replica is ended
    (a fork whose work is thrown away, or a respawned process; the live run is unchanged) and the
    signal goes on to the live run's own handler, which ends the run (143).  Without this the live
    run, busy in the stop's command, put the signal off until the replica was done: a replay to
    its end, and then the past's commands.  ``add``: a replica's pid learned meanwhile (a
    checkpoint's replica, from its ``replica-started`` message)."""

    def __init__(self, *pids: int):
        self.pids = list(pids)
        self.got = False
        self._old = None

    def add(self, pid: int) -> None:
        self.pids.append(pid)
        if self.got:
            _kill(pid)

    def _handle(self, signum, frame) -> None:
        if not self.got:
            self.got = True
            for pid in self.pids:
                _kill(pid)

    def __enter__(self) -> "SigtermEnds":
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if self._old is None:
            return False
        signal.signal(signal.SIGTERM, self._old)
        if not self.got:
            return False
        os.kill(os.getpid(), signal.SIGTERM)
        from ..errors import CommandError
        if kind is not None and not issubclass(kind, CommandError):
            return False
        raise CommandError("nndb: terminated (SIGTERM); the replica was stopped and the live run is unchanged")


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def silence() -> tuple:
    """Send fds 1 and 2 to /dev/null (a replay prints nothing); returns what restores them."""
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    saved = (os.dup(1), os.dup(2))
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    return saved


def unsilence(saved: Optional[tuple]) -> None:
    if not saved:
        return
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)
    os.close(saved[0])
    os.close(saved[1])


def memory_kib(pid: int) -> Optional[dict]:
    """A process's unique memory (private pages: what dropping it frees) and
    proportional share, from /proc/PID/smaps_rollup (Linux), in KiB."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            vals = {}
            for line in fh:
                parts = line.split()
                if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                    vals[parts[0][:-1]] = int(parts[1])
    except OSError:
        return None
    return {"private": vals.get("Private_Clean", 0) + vals.get("Private_Dirty", 0), "pss": vals.get("Pss", 0)}


def resident_kib(pid: int) -> Optional[int]:
    """A process's resident memory (a bound on its PSS, read from the
    kernel's counters: /proc/PID/statm), in KiB; None where not there."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    except (OSError, ValueError, IndexError):
        return None


def reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except (ChildProcessError, OSError):
        pass
    forget_openmp(pid)
