"""The tests' fork server (tests/zygote.py) stands in for a real ``python -m
nndb`` subprocess: the same output, exit code and process state as a real
one, the environment a test gives taking effect (or a real subprocess when
the zygote could not honour it), timeouts that kill what the run started,
and every child reaped."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import conftest
import zygote
from conftest import nndb

PROBE = r'''
import atexit, json, os, random, signal, sys, threading, time
import numpy, torch
def late():
    time.sleep(0.3)
    print("thread-end", flush=False)
threading.Thread(target=late).start()           # non-daemon: joined before atexit, as Python does
atexit.register(lambda: print("atexit-ran", end=""))     # (no newline: the last bytes must still arrive)
st = {
    "argv": sys.argv, "name": __name__, "cwd": os.getcwd(), "path0": sys.path[0],
    "cwd_on_path": os.getcwd() in sys.path or "" in sys.path,
    "home": os.environ.get("HOME"), "mine": os.environ.get("NNDB_PROBE_VAR"),
    "ld_preload": os.environ.get("LD_PRELOAD"), "hashseed_env": os.environ.get("PYTHONHASHSEED"),
    "nndb_env": sorted(k for k in os.environ if k.startswith("NNDB_") and k != "NNDB_PROBE_VAR"),
    "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
    "sigpipe": signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN,
    "other_signals": sorted(s.name for s in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP, signal.SIGUSR1)
                            if signal.getsignal(s) != signal.SIG_DFL),
    "mask": sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "stdin": sys.stdin.read(), "stdout_tty": sys.stdout.isatty(),
    "executable": sys.executable, "threads": torch.get_num_threads(),
    "hash": hash("nndb-zygote"), "seeds": [torch.initial_seed(), random.random(), float(numpy.random.rand())],
    "sum": float(torch.manual_seed(0) and torch.randn(64, 64).matmul(torch.randn(64, 64)).sum()),
    "pid": os.getpid(), "pgid": os.getpgid(0),
}
print(json.dumps(st))
sys.stdout.write("no-newline")
sys.exit(int(sys.argv[1]))
'''


def _probe(tmp_path, *flags, env=None):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    return nndb("run", "--batch", "-q", "--nx", "--rules", "none", *flags, str(script), "3", cwd=str(tmp_path),
                env=env)


def _state(r):
    line = [l for l in r.stdout.splitlines() if l.startswith("{")][0]
    return json.loads(line)


def _hash_under(seed: str) -> int:
    return int(subprocess.run([sys.executable, "-c", "print(hash('nndb-zygote'))"], capture_output=True,
                              text=True, env=dict(os.environ, PYTHONHASHSEED=seed), check=True).stdout)


@pytest.mark.parametrize("flags", [(), ("--replica", "off")], ids=["preloaded", "plain"])
def test_a_zygote_run_looks_like_a_real_one(tmp_path, monkeypatch, flags):
    env = {"HOME": str(tmp_path), "NNDB_PROBE_VAR": "given"}
    monkeypatch.delenv(zygote.REAL_ENV, raising=False)
    z = _probe(tmp_path, *flags, env=env)
    monkeypatch.setenv(zygote.REAL_ENV, "1")
    r = _probe(tmp_path, *flags, env=env)
    assert (z.returncode, r.returncode) == (3, 3), (z.stderr, r.stderr)
    zs, rs = _state(z), _state(r)
    assert zs["pid"] != rs["pid"] and zs["pgid"] == zs["pid"]       # (its own process group: a timeout kills it all)
    assert zs["pid"] not in zygote_pids()
    for k in ("pid", "pgid", "hash", "seeds"):
        del zs[k], rs[k]
    assert zs == rs
    assert zs["home"] == str(tmp_path) and zs["mine"] == "given" and zs["stdin"] == ""
    assert zs["sigpipe"] and zs["mask"] == []
    # the same bytes after the state line: the thread's line, the unterminated write, atexit's output
    assert z.stdout.split("\n", 1)[1] == r.stdout.split("\n", 1)[1] == "no-newlinethread-end\natexit-ran"
    assert z.stderr == r.stderr


def zygote_pids() -> set:
    return {z.proc.pid for z in zygote._zygotes.values() if isinstance(z, zygote.Zygote)}


def test_the_recorded_hash_seed_is_the_one_the_run_hashed_with(tmp_path, monkeypatch):
    """A respawned replica hashes with the seed in the trace: under the
    zygote it must be the preloaded zygote's own seed."""
    import nndb
    monkeypatch.delenv(zygote.REAL_ENV, raising=False)
    trace = str(tmp_path / "t.h5")
    z = _probe(tmp_path, "--trace", trace)
    assert z.returncode == 3, z.stderr
    seed = nndb.open(trace).meta["replay"]["hash_seed"]
    assert seed and _hash_under(str(seed)) == _state(z)["hash"]
    again = _probe(tmp_path)        # fresh random states in each run, as in a new process
    assert all(a != b for a, b in zip(_state(z)["seeds"], _state(again)["seeds"]))


def test_env_read_at_import_goes_to_a_real_subprocess(tmp_path, monkeypatch):
    monkeypatch.delenv(zygote.REAL_ENV, raising=False)
    base = conftest._base_env()
    # (a thread count other than the session's: conftest gives each worker its share of the cores)
    threads = "2" if base.get("OMP_NUM_THREADS") == "1" else "1"
    assert not conftest._zygote_may_run(dict(base, OMP_NUM_THREADS=threads), base, {"stdin": subprocess.DEVNULL})
    assert not conftest._zygote_may_run(dict(base, PYTHONPATH="/x"), base, {"stdin": subprocess.DEVNULL})
    assert not conftest._zygote_may_run(base, base, {"stdin": subprocess.DEVNULL, "input": "x"})
    assert conftest._zygote_may_run(dict(base, HOME="/h", NNDB_X="1"), base, {"stdin": subprocess.DEVNULL})
    # what the nndb() helper gives in a test (pytest sets PYTEST_CURRENT_TEST for each) fits the session's zygotes
    now, start = conftest._base_env(), conftest._ZYGOTE_ENV
    drift = sorted(k for k in set(now) | set(start) if now.get(k) != start.get(k))
    assert conftest._zygote_may_run(now, start, {"stdin": subprocess.DEVNULL}), \
        f"this worker's environment drifted from the session's start (an earlier test left it changed): {drift}"
    r = _probe(tmp_path, env={"OMP_NUM_THREADS": threads})
    assert r.returncode == 3 and _state(r)["threads"] == int(threads)


def test_a_timeout_kills_the_run_and_what_it_started(tmp_path, monkeypatch):
    monkeypatch.delenv(zygote.REAL_ENV, raising=False)
    script = tmp_path / "hang.py"
    script.write_text("import os, subprocess, sys, time\n"
                      "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
                      "open('pids', 'w').write(f'{os.getpid()} {p.pid}')\n"
                      "print('started', flush=True)\n"
                      "time.sleep(600)\n")
    # (both zygotes started first: the timeout then covers the run alone, not a zygote's start-up)
    (tmp_path / "quick.py").write_text("print('quick')\n")
    quick = nndb("run", "--batch", "-q", "--nx", "--rules", "none", "--replica", "off", str(tmp_path / "quick.py"),
                 cwd=str(tmp_path))
    assert quick.returncode == 0 and "quick" in quick.stdout, quick.stderr
    with pytest.raises(subprocess.TimeoutExpired) as e:
        nndb("run", "--batch", "-q", "--nx", "--rules", "none", "--replica", "off", str(script),
             cwd=str(tmp_path), timeout=5)
    assert "started" in e.value.output
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_every_child_is_reaped(tmp_path, monkeypatch):
    monkeypatch.delenv(zygote.REAL_ENV, raising=False)
    r = nndb("--version")
    assert r.returncode == 0 and r.stdout.startswith("nndb, version")
    time.sleep(0.5)
    assert 1 <= len(zygote._zygotes) <= 2          # (one of each kind for the whole session)
    for z in zygote._zygotes.values():
        if isinstance(z, zygote.Zygote):
            kids = [p for p in os.listdir("/proc") if p.isdigit() and _ppid(p) == z.proc.pid]
            assert kids == []


def _ppid(pid: str):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().split(") ", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def test_usage_errors_match_a_real_subprocess(monkeypatch, tmp_path):
    monkeypatch.delenv(zygote.REAL_ENV, raising=False)
    z = nndb("run", "--every", "x", "s.py", cwd=str(tmp_path))
    monkeypatch.setenv(zygote.REAL_ENV, "1")
    r = nndb("run", "--every", "x", "s.py", cwd=str(tmp_path))
    assert (z.returncode, z.stdout, z.stderr) == (r.returncode, r.stdout, r.stderr) and z.returncode == 2


def test_a_forked_plain_python_run_looks_like_a_real_one(tmp_path, monkeypatch):
    """``python(SCRIPT, forked=True)`` (the plain side of the tests' bit-for-bit
    comparisons): what the script sees and prints, its exit code and its
    traceback, as ``python SCRIPT`` gives them."""
    monkeypatch.delenv(zygote.REAL_ENV, raising=False)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "p.py").write_text(
        "import json, os, sys, torch\n"
        "print(json.dumps({'argv': sys.argv, 'name': __name__, 'file': __file__, 'path0': sys.path[0],\n"
        "                  'main_is_me': sys.modules['__main__'].__dict__ is globals(), 'cwd': os.getcwd(),\n"
        "                  'sum': float(torch.manual_seed(0) and torch.randn(8, 8).sum())}))\n"
        "def f():\n    raise ValueError('planted')\n"
        "f() if sys.argv[1] == 'raise' else sys.exit(int(sys.argv[1]))\n")
    for arg, code in (("raise", 1), ("4", 4)):
        forked = conftest.python("sub/../sub/p.py", arg, cwd=str(tmp_path), forked=True)
        real = conftest.python("sub/../sub/p.py", arg, cwd=str(tmp_path))
        assert (forked.returncode, forked.stdout, forked.stderr) == (real.returncode, real.stdout, real.stderr)
        assert real.returncode == code and '"main_is_me": true' in real.stdout
        assert ("ValueError: planted" in forked.stderr) == (arg == "raise") and "zygote" not in forked.stderr


def test_a_started_run_is_the_one_its_pid_names_and_signals(tmp_path, monkeypatch):
    """conftest.nndb_started() (zygote.Started, Popen's stand-in): the run's
    output as it comes, its pid the process that runs the script (nndb run's
    start again with libiomp5 is a second child), a signal to it ending the
    run as it ends a real one (SIGTERM: 143), and a file as its stdout and
    stderr."""
    monkeypatch.delenv(zygote.REAL_ENV, raising=False)
    script = tmp_path / "s.py"
    script.write_text("import os, sys, time\nprint('to stderr', file=sys.stderr, flush=True)\n"
                      "print('pid', os.getpid(), flush=True)\ntime.sleep(120)\n")
    p = conftest.nndb_started("run", "--batch", "-q", "--nx", "--rules", "none", str(script), cwd=str(tmp_path))
    try:
        assert isinstance(p, zygote.Started)
        assert p.stdout.readline() == f"pid {p.pid}\n" and p.poll() is None
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 143 and out == "" and "to stderr\n" in err, (p.returncode, out, err)
    with open(tmp_path / "log", "w") as fh:
        p = conftest.nndb_started("run", "--batch", "-q", "--nx", "--rules", "none", str(script), cwd=str(tmp_path),
                                  stdout=fh, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            if "pid" in (tmp_path / "log").read_text():
                break
            time.sleep(0.1)
        p.terminate()
        assert p.wait(timeout=60) == 143 and p.stdout is None and p.stderr is None
    finally:
        p.kill()
    assert (tmp_path / "log").read_text().startswith(f"to stderr\npid {p.pid}\n")


WORKER_PROBE = r'''
import json, os, signal, sys, time
rank = int(os.environ["RANK"])
with open("/proc/self/cmdline", "rb") as fh:
    cmdline = [a.decode() for a in fh.read().rstrip(b"\0").split(b"\0")]
st = {
    "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "cmdline": cmdline,
    "own_session": os.getsid(0) == os.getpid() == os.getpgid(0),
    "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT", "PWD",
                                         "OMP_NUM_THREADS", "NNDB_PROBE_VAR")},
    "stdout": [type(sys.stdout.buffer).__name__, sys.stdout.write_through, sys.stdout.line_buffering,
               sys.stdout.encoding, sys.stdout.errors, sys.stderr.errors, sys.stdout.buffer.name],
    "stdin": sys.stdin.read(), "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
    "mask": sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])), "ppid": os.getppid(),
}
print(json.dumps(st), end="")           # (unbuffered: reaches the pipe without a flush or a newline)
print(file=sys.stderr)
if rank == 1:
    time.sleep(1)
    os._exit(3)                 # rank 1 fails: torchrun ends rank 0 with SIGTERM
signal.signal(signal.SIGTERM, lambda *a: (open(f"sigterm{rank}", "w").close(), os._exit(7)))
time.sleep(120)
'''


def _torchrun_probe(tmp_path, name, env):
    d = tmp_path / name
    d.mkdir()
    (d / "probe.py").write_text(WORKER_PROBE)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        "probe.py", "--flag"], cwd=d, env=env, capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    states = [json.loads(line) for line in r.stdout.replace("}{", "}\n{").splitlines() if line.startswith("{")]
    for st in states:
        assert st["cwd"] == st["path0"] == str(d)
        del st["cwd"], st["path0"], st["env"]["MASTER_PORT"]
    return r, sorted(states, key=lambda st: st["env"]["RANK"]), sorted(os.listdir(d))


def test_a_torchrun_worker_forked_by_the_zygote_looks_like_a_real_one(tmp_path):
    """torchrun's workers under the tests' PYTHON_EXEC (zygote.worker_python)
    are children of the zygote: each sees what a real ``python -u SCRIPT``
    worker sees (argv, command line, a session of its own, torchrun's
    environment and nothing of the shim's, unbuffered stdout), and ends as one
    (rank 1's exit code in torchrun's report; rank 0 given torchrun's
    SIGTERM)."""
    env = dict(conftest._base_env(), NNDB_PROBE_VAR="given")
    if "PYTHON_EXEC" not in env or "OMP_NUM_THREADS" not in env:
        pytest.skip("workers are real processes here (NNDB_TEST_REAL_SUBPROCESS=1, or -n 0: torchrun's "
                    "OMP_NUM_THREADS=1 is not the zygote's environment)")
    zygote.start(conftest._ZYGOTE_ENV)
    forked = _torchrun_probe(tmp_path, "forked", env)
    real = _torchrun_probe(tmp_path, "real", {k: v for k, v in env.items() if k != "PYTHON_EXEC"})
    zygote_pid = zygote._zygotes[None].proc.pid
    assert [st.pop("ppid") for st in forked[1]] == [zygote_pid] * 2
    assert zygote_pid not in [st.pop("ppid") for st in real[1]]
    assert forked[1] == real[1]
    assert [st["env"]["RANK"] for st in real[1]] == ["0", "1"] and real[1][0]["own_session"]
    assert real[1][0]["cmdline"] == [sys.executable, "-u", "probe.py", "--flag"]
    assert real[1][0]["stdout"][:3] == ["FileIO", True, False] and real[1][0]["env"]["PWD"] == env.get("PWD")
    for r, _, files in (forked, real):
        assert r.returncode == 1 and "exitcode  : 3" in r.stderr, r.stderr[-3000:]
        assert files == ["probe.py", "sigterm0"]


def test_a_torchrun_worker_dies_with_its_shim(tmp_path):
    """torchrun's SIGKILL of a worker that outlived its SIGTERM reaches the
    shim only: the zygote then kills the worker (and what it started)."""
    env = conftest._base_env()
    if "PYTHON_EXEC" not in env or "OMP_NUM_THREADS" not in env:
        pytest.skip("workers are real processes here")
    zygote.start(conftest._ZYGOTE_ENV)
    (tmp_path / "w.py").write_text("import os, time\nopen('pid' + os.environ['RANK'], 'w').write(str(os.getpid()))\n"
                                   "time.sleep(120)\n")
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "w.py"], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not all((tmp_path / f"pid{r}").exists() and (tmp_path / f"pid{r}").read_text() for r in (0, 1)):
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.1)
        workers = [int((tmp_path / f"pid{r}").read_text()) for r in (0, 1)]
        assert all(_ppid(str(w)) == zygote._zygotes[None].proc.pid for w in workers)
        shims = [c for c in os.listdir("/proc") if c.isdigit() and _ppid(c) == p.pid]
        assert len(shims) == 2
        for s in shims:
            os.kill(int(s), signal.SIGKILL)
        assert p.wait(timeout=60) == 1
        deadline = time.monotonic() + 10
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(w) for w in workers)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stderr.close()
