"""A pre-imported fork server ("zygote") for the tests' ``python -m nndb`` runs.

Each run of ``python -m nndb`` spends 1.5-2 s importing torch, and one that
trains 1-2 s more importing torch._dynamo (torch.optim's first optimizer
does); the suite has some 900 of them.  A zygote is a Python process, started
once per pytest worker, that has imported torch, torch._dynamo, numpy, h5py
and nndb's modules but run no torch operation, and frozen what they made
(gc.freeze); for each run it forks a child that becomes that run: its working
directory, environment, ``sys.argv``/``sys.path`` as ``python -m`` sets them,
stdin (/dev/null or the given file) and stdout/stderr (pipes read here), the
signal dispositions and mask a fresh interpreter has, its own process group,
the command line ``ps`` shows (written over the zygote's own), fresh random seeds, and nndb's real entry point
(``runpy._run_module_as_main("nndb")``, as ``-m`` runs it).  It ends as the
interpreter would: SystemExit's code, non-daemon threads joined, atexit
handlers run, stdout/stderr flushed, then ``os._exit``.  ``run()`` returns a
``subprocess.CompletedProcess`` with the fields ``subprocess.run`` fills; at a
timeout it kills the child's process group and raises TimeoutExpired.

``nndb run`` starts itself again with Intel's OpenMP runtime preloaded
(nndb/run/preload.py).  A child of the plain zygote takes the same decision
(``preload.runtime_loaded`` says "not yet", as in a fresh process) and its
``os.execve`` of ``python -m nndb`` comes back here as a request, which a
second zygote, started with libiomp5 preloaded and a fixed PYTHONHASHSEED,
serves: the run gets the runtime and the hash seed it would have.

What a zygote cannot give, the caller (tests/conftest.py) gets from a real
subprocess: an environment that differs from the zygote's in a variable that
may be read at import time (only ``RUNTIME_VARS`` and ``NNDB_*`` may differ),
stdin/stdout arguments other than the plain ones, tests marked
``real_subprocess`` (start-up itself, torchrun jobs, what a script sees
before torch._dynamo is loaded: the modules it imported and how Python ends
at a KeyboardInterrupt), and every run when
``NNDB_TEST_REAL_SUBPROCESS=1``.  ``sys.executable`` is the real interpreter:
replicas and workers that nndb spawns start as they always do.

torchrun's workers are the exception: torchrun starts them with the
interpreter its ``PYTHON_EXEC`` names, which the tests set to a shim
(``worker_python``) that has the plain zygote fork each worker, with the
process state torchrun's Popen gives one (see "torchrun's workers" below).
"""
from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REAL_ENV = "NNDB_TEST_REAL_SUBPROCESS"

# Variables read at run time only (by nndb, the scripts or the libraries, never
# at import): a run may set them differently from the zygote's environment.
RUNTIME_VARS = frozenset({"HOME", "XDG_CONFIG_HOME", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                          "MLFLOW_TRACKING_URI", "PYTEST_CURRENT_TEST",
                          "PYTHONBREAKPOINT",           # (read by each breakpoint() call)
                          "TERM",       # (read by a terminal front end when it starts; nothing the zygote imports)
                          "TORCHINDUCTOR_CACHE_DIR",    # (torch sets it in a process that imports inductor)
                          # torchrun's, in its workers (read when the job starts)
                          "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE",
                          "MASTER_ADDR", "MASTER_PORT", "TORCH_NCCL_ASYNC_ERROR_HANDLING"})
RUNTIME_PREFIXES = ("NNDB_", "TORCHELASTIC_")

PRELOADED = "preloaded"


def env_fits(env: dict, base: dict) -> bool:
    """Whether ``env`` differs from the zygote's ``base`` only in run-time variables."""
    for k in set(env) | set(base):
        if env.get(k) != base.get(k) and k not in RUNTIME_VARS and not k.startswith(RUNTIME_PREFIXES):
            return False
    return True


# -- the wire: a 4-byte length, then JSON; file descriptors ride on a message ----------------------

def _send(sock, obj, fds=()) -> None:
    data = json.dumps(obj).encode()
    data = struct.pack("!I", len(data)) + data
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


def _recv(sock, nfds=0):
    """One message (and the file descriptors sent with it), or (None, []) at EOF."""
    buf, fds = b"", []
    while len(buf) < 4:
        if nfds and not fds:
            chunk, fds, _, _ = socket.recv_fds(sock, 4 - len(buf), nfds)
        else:
            chunk = sock.recv(4 - len(buf))
        if not chunk:
            return None, fds
        buf += chunk
    (n,) = struct.unpack("!I", buf)
    body = b""
    while len(body) < n:
        chunk = sock.recv(n - len(body))
        if not chunk:
            return None, fds
        body += chunk
    return json.loads(body), fds


# -- the server -----------------------------------------------------------------------------------

def serve(sock_path: str, base_path: list) -> None:
    """The zygote's loop (started by ``Zygote``; ``base_path`` is ``sys.path``
    without the ``-c`` entry, the path a fresh ``python -m`` has after its first)."""
    fresh = {}
    for s in signal.valid_signals():
        try:
            fresh[s] = signal.getsignal(s)
        except (ValueError, OSError):
            pass
    fresh = {s: h for s, h in fresh.items() if h is not None}
    base_env = dict(os.environ)         # (before torch's import sets any)
    # Listening before the imports: a request that comes meanwhile waits in the
    # backlog (a torchrun worker's shim, PYTHON_EXEC, finds us started).
    lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.unlink(sock_path)            # (an earlier zygote's of this session, ended)
    except OSError:
        pass
    lst.bind(sock_path)
    lst.listen(64)
    import h5py  # noqa: F401
    import numpy  # noqa: F401
    import torch  # noqa: F401
    # (torch.optim's first optimizer imports torch._dynamo, and with it sympy
    # and torch.distributed: 800 modules, 1-2 s in each run that trains.
    # Importing it starts no thread and runs no torch operation.)
    import torch._dynamo  # noqa: F401
    import nndb.cli  # noqa: F401
    import nndb.driver  # noqa: F401
    import nndb.run.preload
    _import_lazy_modules()
    # What the imports made lives as long as the zygote: out of the collector's
    # sight (gc.freeze), in the children too.  A run's own objects are not
    # frozen, so what nndb finds by a referrer scan (its optimizers and data
    # loaders, each an instance made by the run) is the same; each scan and
    # each full collection then walks the run's objects, not torch's 180,000
    # (16 ms a scan, 90 ms a collection).
    import gc
    gc.collect()
    gc.freeze()
    parent = os.getppid()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(lst, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    running: dict = {}
    workers: dict = {}          # a torchrun worker's shim's connection -> its child's pid
    while True:
        events = sel.select(timeout=1.0)
        if os.getppid() != parent:          # pytest's worker is gone: so are we, and our runs
            for pid in running:
                _kill_group(pid)
            os._exit(0)
        for key, _ in events:
            if key.fileobj is lst:
                conn, _ = lst.accept()
                try:
                    req, fds = _recv(conn, nfds=3)
                except OSError:
                    req, fds = None, []
                if req is None:
                    conn.close()
                    continue
                worker = req.get("worker")
                if worker and not env_fits(req["env"], base_env):
                    for fd in fds:
                        os.close(fd)
                    try:
                        _send(conn, {"refused": sorted(
                            k for k in set(req["env"]) | set(base_env) if req["env"].get(k) != base_env.get(k)
                            and k not in RUNTIME_VARS and not k.startswith(RUNTIME_PREFIXES))})
                    except OSError:
                        pass
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    code = 70
                    try:
                        signal.set_wakeup_fd(-1)
                        sel.close()
                        for f in (lst, *running.values()):
                            f.close()
                        workers.clear()
                        for fd in (wake_r, wake_w):
                            os.close(fd)
                        code = _child(req, fds, conn, fresh, base_path)
                    except BaseException:
                        import traceback
                        traceback.print_exc()
                    finally:
                        os._exit(code)
                if worker:              # (its own session, made by the child: torchrun's start_new_session)
                    workers[conn] = pid
                    sel.register(conn, selectors.EVENT_READ)
                else:
                    try:
                        os.setpgid(pid, pid)        # (here too: a kill of the group right away reaches it)
                    except OSError:
                        pass
                for fd in fds:
                    os.close(fd)
                running[pid] = conn
                try:
                    _send(conn, {"pid": pid})
                except OSError:
                    pass
            elif key.fileobj in workers:
                # the shim ended before its worker (torchrun's SIGKILL after its SIGTERM
                # found the worker still running): the worker's group goes with it
                sel.unregister(key.fileobj)
                _kill_group(workers.pop(key.fileobj))
            else:
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
        while running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = running.pop(pid, None)
            if workers.pop(conn, None) is not None:
                sel.unregister(conn)
            if conn is not None:
                try:
                    _send(conn, {"status": status})
                except OSError:
                    pass
                conn.close()


# What runs import as they go, after nndb.cli and nndb.driver: 60-140 ms in each of the suite's
# ~900 runs otherwise (yaml and the rules' file, the batch front end, the time travel a session
# does, the trace API of inspect and check-trace).  Dependencies and nndb's own modules only: an
# optional extra stays unimported (a test may make it look missing).
LAZY_MODULES = ("yaml", "nndb.frontends.batch", "nndb.rules.condition", "nndb.rules.loss_watch",
                "nndb.rules.yamlfile", "nndb.timetravel.disk", "nndb.timetravel.inventory",
                "nndb.timetravel.navigate", "nndb.api.inspect", "nndb.api.recording", "nndb.api.trace",
                "nndb.render.text", "nndb.render.offline", "nndb.rules.offline", "nndb.store.rows")


def _import_lazy_modules() -> None:
    import importlib
    for name in LAZY_MODULES:
        importlib.import_module(name)


def _kill_group(pid: int) -> None:
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _child(req: dict, fds: list, conn, fresh: dict, base_path: list) -> int:
    """Become ``python -m nndb ARGS`` and run it; returns the exit status."""
    worker = req.get("worker")
    if worker:
        os.setsid()
    else:
        os.setpgid(0, 0)
    stdin = fds[2] if len(fds) > 2 else os.open(os.devnull, os.O_RDONLY)
    for fd, std in ((stdin, 0), (fds[0], 1), (fds[1], 2)):
        os.dup2(fd, std)
    for fd in {stdin, fds[0], fds[1]}:
        if fd > 2:
            os.close(fd)
    if worker:
        _unbuffered_stdio()
        _set_cmdline(worker["cmdline"])
    elif req.get("script"):
        _set_cmdline([sys.executable, *req["argv"]])
    else:
        _set_cmdline([sys.executable, "-m", "nndb", *req["argv"]])
    for s, h in fresh.items():
        try:
            signal.signal(s, h)
        except (OSError, ValueError, RuntimeError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    os.chdir(req["cwd"])
    env = dict(req["env"])
    import nndb.run.preload as preload
    if req.get("script"):
        pass                                        # (a plain script: no nndb run to restart)
    elif req.get("flavor") == PRELOADED:
        if env.get("NNDB_SET_HASHSEED"):         # nndb chose a seed; this interpreter runs with the zygote's
            env["PYTHONHASHSEED"] = os.environ["PYTHONHASHSEED"]
    else:
        _exec_comes_back(conn)
        preload.runtime_loaded = lambda: False      # as in a fresh process: torch not imported yet
    os.environ.clear()
    os.environ.update(env)
    if req.get("script"):                           # python SCRIPT ARGS
        path = req["argv"][0]
        sys.path[:] = [os.path.dirname(os.path.realpath(path))] + list(base_path)
        sys.argv = list(req["argv"])
        _reseed()
        return _finalize(_run_script(path))
    sys.path[:] = [os.getcwd()] + list(base_path)
    sys.argv = ["-m", *req["argv"]]
    _reseed()
    code = _run_main()
    code = _finalize(code)
    if req.get("flavor") == PRELOADED:
        preload.forget_openmp()     # (libiomp5 removes its /dev/shm registration at exit(); os._exit skips it)
    return code


def _set_cmdline(argv: list) -> None:
    """What /proc/PID/cmdline (ps, and the tests that look for processes left
    behind by their command line) shows of this process: ``argv``, written over
    the zygote's own (started with room for it: ``CMDLINE_ROOM``); cut short
    if longer."""
    try:
        import ctypes
        with open("/proc/self/stat", "rb") as fh:
            fields = fh.read().rpartition(b")")[2].split()
        start, end = int(fields[45]), int(fields[46])      # (arg_start, arg_end: fields 48 and 49)
        data = b"\0".join(os.fsencode(a) for a in argv)[:end - start - 1]
        ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)
    except (OSError, ValueError, IndexError):
        pass


def _unbuffered_stdio() -> None:
    """``python -u``'s stdout and stderr: written through, unbuffered underneath."""
    import io
    for fd, name in ((1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        raw = io.FileIO(fd, "wb", closefd=False)
        raw.name = f"<{name}>"
        new = io.TextIOWrapper(raw, encoding=old.encoding, errors=old.errors, newline="\n",
                               line_buffering=False, write_through=True)
        new.mode = "w"
        setattr(sys, name, new)
        setattr(sys, f"__{name}__", new)


def _exec_comes_back(conn) -> None:
    """``os.execve(sys.executable, [.., "-m", "nndb", ..], env)`` -> a request to
    the preloaded zygote (sent to the client), and this child ends."""
    real = os.execve

    def execve(path, argv, env):
        argv = list(argv)
        if path == sys.executable and argv[1:3] == ["-m", "nndb"] and env.get("NNDB_PRELOADED"):
            for f in (sys.stdout, sys.stderr):
                f.flush()
            _send(conn, {"exec": {"argv": argv[3:], "env": dict(env)}})
            os._exit(0)
        return real(path, argv, env)

    os.execve = execve


def _reseed() -> None:
    import random
    random.seed()
    import numpy
    import torch
    numpy.random.seed()
    torch.seed()            # (a fresh process's default generator starts from a random seed)
    try:
        import multiprocessing
        multiprocessing.current_process().authkey = os.urandom(32)
    except Exception:
        pass


def _run_main() -> int:
    import runpy
    main = sys.modules["__main__"]
    for k in list(main.__dict__):
        if k not in ("__name__", "__builtins__"):
            del main.__dict__[k]
    try:
        runpy._run_module_as_main("nndb")
    except SystemExit as e:
        return _exit_code(e.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        return -signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def _run_script(path: str) -> int:
    """What ``python PATH`` does with the script: its code run in ``__main__``
    (``__file__`` absolute, no ``__spec__``), an uncaught exception's
    traceback from the script's own frame on."""
    import importlib.machinery
    import io
    main = sys.modules["__main__"]
    for k in list(main.__dict__):
        if k != "__builtins__":
            del main.__dict__[k]
    path = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)    # (as Python: not normalised)
    main.__dict__.update(__name__="__main__", __doc__=None, __package__=None, __spec__=None, __file__=path,
                         __cached__=None, __loader__=importlib.machinery.SourceFileLoader("__main__", path))
    try:
        with io.open_code(path) as fh:
            code = compile(fh.read(), path, "exec", dont_inherit=True)
        exec(code, main.__dict__)
    except SystemExit as e:
        return _exit_code(e.code)
    except BaseException as e:
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:     # (this module's frames)
            tb = tb.tb_next
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        return -signal.SIGINT if isinstance(e, KeyboardInterrupt) else 1
    return 0


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(f"{code}\n")
    except Exception:
        pass
    return 1


def _finalize(code: int) -> int:
    """What Py_FinalizeEx does before the process exits: join the non-daemon
    threads, run atexit, flush stdout and stderr."""
    import atexit
    import threading
    try:
        threading._shutdown()
    except Exception:
        pass
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
    except Exception:
        code = 120
    try:
        sys.stderr.flush()
    except Exception:
        pass
    if code < 0:          # died of Ctrl-C, as Python does
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


# -- the client -----------------------------------------------------------------------------------

class Zygote:
    """One server process; ``flavor`` None or PRELOADED (libiomp5 preloaded)."""

    def __init__(self, base_env: dict, flavor=None):
        self.flavor = flavor
        self.env = self.env_for(base_env, flavor)
        self.dir = _home()
        self.sock_path = _sock_path(flavor)
        self.log = open(os.path.join(self.dir, f"{flavor or 'plain'}.log"), "wb")
        code = ("import sys\nbase = sys.path[1:]\nsys.path.insert(0, %r)\nimport zygote\ndel sys.path[0]\n"
                "zygote.serve(%r, base)\n" % (HERE, self.sock_path))
        # (the last argument: room for each child's own command line, _set_cmdline)
        self.proc = subprocess.Popen([sys.executable, "-c", code, CMDLINE_ROOM], cwd=self.dir, env=self.env,
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)

    @staticmethod
    def env_for(base_env: dict, flavor, like=None) -> dict:
        env = dict(base_env)
        if flavor == PRELOADED:
            from nndb.run.preload import libiomp_path
            env["LD_PRELOAD"] = libiomp_path()
            seed = str(int.from_bytes(os.urandom(4), "little") or 1)
            env["PYTHONHASHSEED"] = like["PYTHONHASHSEED"] if like else seed
        return env

    def connect(self, deadline: float) -> socket.socket:
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(self.sock_path)
                return s
            except OSError:
                s.close()
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the test zygote did not start: {self.tail()}")
                time.sleep(0.05)

    def tail(self) -> str:
        self.log.flush()
        with open(self.log.name, "rb") as fh:
            return fh.read()[-2000:].decode(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        for path in (self.sock_path, self.log.name):
            try:
                os.unlink(path)
            except OSError:
                pass


_zygotes: dict = {}


def _zygote(base_env: dict, flavor=None) -> Zygote:
    z = _zygotes.get(flavor)
    if z is not None and z.env != Zygote.env_for(base_env, flavor, z.env):
        raise ValueError("one environment for the zygotes of a session")
    if z is None or z.proc.poll() is not None:
        z = _zygotes[flavor] = Zygote(base_env, flavor)
    return z


def start(base_env: dict) -> None:
    """Both zygotes started, if they are not (each serves once its imports are
    done; a request that comes before waits): the plain one forks torchrun's
    workers and every run first, the preloaded one the runs nndb run starts again."""
    _zygote(base_env)
    from nndb.run.preload import libiomp_path
    if libiomp_path() is not None:
        _zygote(base_env, PRELOADED)


def close_all() -> None:
    for z in _zygotes.values():
        z.close()
    _zygotes.clear()
    if _homes:
        shutil.rmtree(_homes.pop(), ignore_errors=True)


_homes: list = []


def _home() -> str:
    """This process's directory for its zygotes' sockets and logs and the workers' shim."""
    if not _homes:
        _homes.append(tempfile.mkdtemp(prefix="nndb-zygote-"))
    return _homes[0]


def _sock_path(flavor) -> str:
    return os.path.join(_home(), f"{flavor or 'plain'}.sock")


def _answer(msg, req: dict, z: Zygote, status, flavor):
    """(status, flavor) after the zygote's message ``msg`` about a run: its exit status, or
    that the child re-exec'd itself with libiomp5 preloaded (``req`` takes the new argv and
    environment); None: the zygote ended."""
    if msg is None:
        raise RuntimeError(f"the test zygote ended: {z.tail()}")
    if "exec" in msg:
        req["argv"], req["env"] = msg["exec"]["argv"], msg["exec"]["env"]
        return status, PRELOADED
    return msg.get("status", status), flavor


def run(argv: list, cwd, env: dict, base_env: dict, timeout: float, stdin=subprocess.DEVNULL, script=False
        ) -> subprocess.CompletedProcess:
    """``python -m nndb *argv`` (with ``script``: ``python *argv``, argv[0] a
    script's path) in a child of the zygote for ``base_env`` (``env`` must fit
    it: ``env_fits``); as ``subprocess.run(..., capture_output=True,
    text=True, timeout=timeout)`` would return or raise."""
    import locale
    cmd = [sys.executable, *argv] if script else [sys.executable, "-m", "nndb", *argv]
    deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    fds = [out_w, err_w] + ([] if stdin == subprocess.DEVNULL else [stdin.fileno()])
    req = {"argv": list(argv), "cwd": os.path.abspath(cwd or os.getcwd()), "env": env, "script": script}
    chunks = {out_r: [], err_r: []}
    sel = selectors.DefaultSelector()
    for fd in chunks:
        sel.register(fd, selectors.EVENT_READ)
    open_fds = [out_r, err_r, out_w, err_w]
    status, flavor, pid, sock, timed_out = None, None, None, None, False
    try:
        while status is None:
            z = _zygote(base_env, flavor)
            req["flavor"] = flavor
            sock = z.connect(deadline + 60)
            _send(sock, req, fds)
            msg, _ = _recv(sock)
            # (the child may ask for the preloaded zygote before its parent has said its pid: on a
            # loaded machine the child runs first, and its "exec" came where "pid" was read)
            while msg is not None and "pid" not in msg:
                if "exec" in msg:
                    req["argv"], req["env"] = msg["exec"]["argv"], msg["exec"]["env"]
                    flavor = PRELOADED
                msg, _ = _recv(sock)
            if msg is None:
                raise RuntimeError(f"the test zygote ended: {z.tail()}")
            pid = msg["pid"]
            sel.register(sock, selectors.EVENT_READ)
            while status is None:
                left = deadline - time.monotonic()
                if left <= 0 and not timed_out:
                    timed_out = True
                    _kill_group(pid)
                for key, _ in sel.select(timeout=max(left, 0.05) if not timed_out else 1.0):
                    if key.fileobj is sock:
                        status, flavor = _answer(_recv(sock)[0], req, z, status, flavor)
                    else:
                        data = os.read(key.fileobj, 65536)
                        chunks[key.fileobj].append(data)
            sel.unregister(sock)
            sock.close()
            sock = None
            if flavor == PRELOADED and req.get("flavor") != PRELOADED and not timed_out:
                status = None            # (the plain child ended in its exec: the preloaded one runs it)
        for fd in (out_w, err_w):
            os.close(fd)
            open_fds.remove(fd)
        ends = 0
        while ends < 2:         # to EOF, as communicate() does: processes the run left may hold the pipes
            left = deadline - time.monotonic()
            if left <= 0:
                if timed_out:
                    break
                timed_out = True
                _kill_group(pid)
                deadline = time.monotonic() + 5
                continue
            for key, _ in sel.select(timeout=left):
                data = os.read(key.fileobj, 65536)
                if data:
                    chunks[key.fileobj].append(data)
                else:
                    sel.unregister(key.fileobj)
                    ends += 1
    finally:
        sel.close()
        if sock is not None:
            sock.close()
        for fd in open_fds:
            os.close(fd)
    enc = locale.getpreferredencoding(False)
    out, err = (b"".join(chunks[fd]).decode(enc).replace("\r\n", "\n").replace("\r", "\n")
                for fd in (out_r, err_r))
    if timed_out:
        raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err)
    return subprocess.CompletedProcess(cmd, os.waitstatus_to_exitcode(status), out, err)


class Started:
    """``python -m nndb *argv`` started in a child of the zygote for
    ``base_env`` (``env`` must fit it: ``env_fits``), as ``subprocess.Popen(...,
    stdout=PIPE, stderr=PIPE, text=True)`` would give it, for a test that reads
    a run's output as it comes and signals it (``pid`` is the run's: after
    ``nndb run``'s start again, the preloaded zygote's child).  ``stdout``: a
    file object to write to instead of a pipe; ``stderr``:
    ``subprocess.STDOUT`` for the same one.  A thread here follows the zygote's
    messages; ``returncode`` is set when the run has ended."""

    def __init__(self, argv: list, cwd, env: dict, base_env: dict, stdin=subprocess.DEVNULL, stdout=None,
                 stderr=None):
        import locale
        enc = locale.getpreferredencoding(False)
        self.stdout = self.stderr = None
        self._mine = []                     # descriptors of ours the run is given: closed when it has ended
        if stdout is None:
            r, w = os.pipe()
            self.stdout, out_w = open(r, encoding=enc), w
            self._mine.append(w)
        else:
            out_w = os.dup(stdout.fileno())     # (the caller may close its file at once, as after a Popen)
            self._mine.append(out_w)
        if stderr == subprocess.STDOUT:
            err_w = out_w
        else:
            r, w = os.pipe()
            self.stderr, err_w = open(r, encoding=enc), w
            self._mine.append(w)
        self.args = [sys.executable, "-m", "nndb", *argv]
        self.pid, self.returncode = None, None
        self._started, self._ended = threading.Event(), threading.Event()
        self._error = None
        fds = [out_w, err_w]
        if stdin != subprocess.DEVNULL:
            fds.append(os.dup(stdin.fileno()))
            self._mine.append(fds[-1])
        req = {"argv": list(argv), "cwd": os.path.abspath(cwd or os.getcwd()), "env": env, "script": False}
        threading.Thread(target=self._follow, args=(req, fds, base_env), daemon=True,
                            name="zygote-started").start()
        self._started.wait()
        if self._error is not None:
            raise self._error

    def _follow(self, req: dict, fds: list, base_env: dict) -> None:
        status, flavor = None, None
        try:
            while status is None:
                z = _zygote(base_env, flavor)
                req["flavor"] = flavor
                sock = z.connect(time.monotonic() + 120)
                try:
                    _send(sock, req, fds)
                    while status is None:
                        msg, _ = _recv(sock)
                        if msg is not None and "pid" in msg:
                            self.pid = msg["pid"]
                            self._started.set()
                        else:
                            status, flavor = _answer(msg, req, z, status, flavor)
                finally:
                    sock.close()
                if flavor == PRELOADED and req.get("flavor") != PRELOADED:
                    status = None        # (the plain child ended in its exec: the preloaded one runs it)
            self.returncode = os.waitstatus_to_exitcode(status)
        except BaseException as e:
            self._error = e
            self.returncode = 70
        finally:
            for fd in self._mine:
                os.close(fd)
            self._started.set()
            self._ended.set()

    def poll(self):
        return self.returncode if self._ended.is_set() else None

    def wait(self, timeout=None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig) -> None:
        if not self._ended.is_set():
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout=None):
        """(stdout, stderr) to their end (None for one not a pipe here; what a
        readline() before read ahead is kept), then the exit."""
        deadline = None if timeout is None else time.monotonic() + timeout
        files = [f for f in (self.stdout, self.stderr) if f is not None]
        got: dict = {}
        readers = [threading.Thread(target=lambda f=f: got.__setitem__(f, f.read()), daemon=True)
                   for f in files]
        for t in readers:
            t.start()
        for t in readers:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        for f in files:
            f.close()
        return tuple(got.get(f) if f is not None else None for f in (self.stdout, self.stderr))


# -- torchrun's workers: PYTHON_EXEC ----------------------------------------------------------------
#
# torchrun starts each worker as ``$PYTHON_EXEC -u -m nndb ARGS`` (nndb's jobs) or ``$PYTHON_EXEC -u
# SCRIPT ARGS`` (plain torchrun), PYTHON_EXEC defaulting to sys.executable: its own hook for the
# interpreter.  In the tests it is ``worker_python()``, a shim that has this session's plain zygote
# fork the worker, which then spends no 3 s importing torch, torch._dynamo and nndb.  torchrun keeps
# the shim's process; the worker is the zygote's child, made as torchrun's Popen makes a worker: a
# session of its own (start_new_session), the shim's stdin, stdout and stderr, its working directory
# and environment, ``-u``'s unbuffered stdout and stderr, the command line torchrun gave.  The shim
# passes on the signals torchrun sends its process group (SIGTERM at the job's end) to the worker's,
# and ends as the worker ended (its exit code, or killed by the same signal); if the shim is killed
# (torchrun's SIGKILL after SIGTERM), the zygote kills the worker's group.  Where the zygote cannot
# stand in (no zygote, an environment that differs in a variable read at import, another command
# line), or the worker starts itself again (nndb run's libiomp5 preload), the shim execs the real
# interpreter: the worker is then what it is outside the tests.

CMDLINE_ROOM = "-" * 8192
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def worker_python() -> str:
    """The PYTHON_EXEC of the torchrun jobs the tests start: an executable script (not a
    shell's, which would set PWD in the worker's environment)."""
    path = os.path.join(_home(), "python")
    if not os.path.exists(path):
        with open(path, "w") as fh:
            fh.write(f"#!{sys.executable} -I\n# torchrun's workers, forked by the tests' zygote\n"
                     f"import sys\nsys.path.insert(0, {HERE!r})\nimport zygote\n"
                     f"zygote.shim({_sock_path(None)!r}, sys.argv[1:])\n")
        os.chmod(path, 0o755)
    return path


def _worker_request(args: list):
    """The zygote's request for ``python ARGS`` as torchrun starts a worker, or None."""
    if args[:1] != ["-u"]:
        return None
    if args[1:3] == ["-m", "nndb"]:
        argv, script = args[3:], False
    elif len(args) > 1 and not args[1].startswith("-"):
        argv, script = args[1:], True
    else:
        return None
    return {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "script": script, "flavor": None,
            "worker": {"cmdline": [sys.executable, *args]}}


def shim(sock_path: str, args: list) -> None:
    """``python ARGS`` (torchrun's worker): forked by the zygote at ``sock_path``, or exec'd."""
    req = _worker_request(args)
    sock = None
    try:
        for fd in (0, 1, 2):
            os.fstat(fd)
    except OSError:
        req = None                      # (a standard stream closed: nothing to hand over)
    if req is not None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(sock_path)
        except OSError:
            sock.close()
            sock = None
    if sock is not None:
        child, pending = [], []
        given = {sig: signal.getsignal(sig) for sig in _FORWARDED}

        def forward(sig, frame):
            if child:
                try:
                    os.killpg(child[0], sig)
                except OSError:
                    pass
            else:
                pending.append(sig)

        for sig in _FORWARDED:
            signal.signal(sig, forward)
        _send(sock, req, [1, 2, 0])
        while True:
            msg, _ = _recv(sock)
            if msg is None:
                sys.stderr.write("tests/zygote.py: the zygote ended under a torchrun worker\n")
                os._exit(70)
            if "pid" in msg:
                child.append(msg["pid"])
                for sig in pending:
                    forward(sig, None)
            elif "exec" in msg:         # (nndb run starting itself again: as it would, here)
                os.execve(sys.executable, [sys.executable, "-m", "nndb", *msg["exec"]["argv"]], msg["exec"]["env"])
            elif "status" in msg:
                status = msg["status"]
                if os.WIFSIGNALED(status):
                    signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
                    os.kill(os.getpid(), os.WTERMSIG(status))
                os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
            elif "refused" in msg:
                for sig, how in given.items():          # (an ignored one stays ignored across the exec)
                    signal.signal(sig, how)
                break
    os.execv(sys.executable, [sys.executable, *args])
