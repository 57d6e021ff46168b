"""The processes nndb starts end with it and leave nothing behind.

* A respawned replica dies with the live run (a kill -9 of it included), as
  fork checkpoints do.
* SIGTERM ends an interactive session as it ends a batch one (exit 143,
  the checkpoint processes gone), at the prompt or while the script runs.
* Intel OpenMP's ``/dev/shm/__KMP_REGISTERED_LIB_<pid>_<uid>`` file of a
  replica is removed when the replica ends, or is killed.
* An on-disk checkpoint holds only what ``torch.load(weights_only=True)``
  reads: a param group's (or a module's extra state's) other values are
  dropped with one line naming the key."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from conftest import ROOT, nndb
from nndb.run.preload import libiomp_path
from nndb.timetravel import disk

pytestmark = pytest.mark.real_subprocess     # (processes and OpenMP registrations left behind)


def _ppid(pid: int):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent to reap it counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _children(pid: int) -> list:
    return [int(d) for d in os.listdir("/proc") if d.isdigit() and _ppid(int(d)) == pid]


def _gone_within(pids, seconds: float) -> list:
    end = time.time() + seconds
    while time.time() < end and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _kill(pids) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


def _wait_for_file(path, proc, seconds=120.0) -> str:
    end = time.time() + seconds
    while time.time() < end:
        if os.path.exists(path) and open(path).read().strip():
            return open(path).read()
        assert proc.poll() is None, "nndb ended early"
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


# The replica (which runs the script again) blocks at step 2 once the live run has
# passed step 3, and writes its pid first (posix.open: past the replica's redirection of os.open).
# (The flag is there at the run's start and rewritten: a file made since is not there for a
# replay from the start.)
HANG = textwrap.dedent('''
    import os, sys, time, torch
    FLAG, PIDS, WORKERS = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    def batches():
        if WORKERS:
            from torch.utils.data import DataLoader, TensorDataset
            while True:
                yield from DataLoader(TensorDataset(torch.randn(64, 256)), batch_size=16, num_workers=WORKERS)
        while True:
            yield (torch.randn(16, 256),)
    for step, (x,) in zip(range(8), batches()):
        if step == 2 and open(FLAG).read() == "go":
            import posix
            fd = posix.open(PIDS, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            os.write(fd, f"{os.getpid()}\\n".encode())
            os.close(fd)
            time.sleep(120)
        if step == 3:
            with open(FLAG, "w") as fh:
                fh.write("go")
        loss = (model(x) @ torch.randn(256, 256)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("done", flush=True)
''')


def _start(tmp_path, replica: str, workers: int, commands) -> tuple:
    script = tmp_path / "hang.py"
    script.write_text(HANG)
    flag, pids = tmp_path / "flag", tmp_path / "pids"
    flag.write_text("")
    argv = [sys.executable, "-m", "nndb", "run", "--batch", "--nx", "--rules", "none", "--replica", replica,
            "--trace", str(tmp_path / "t.h5")]
    for c in commands:
        argv += ["-e", c]
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen(argv + [str(script), str(flag), str(pids), str(workers)], cwd=str(tmp_path),
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    return proc, pids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: /proc, prctl")
def test_a_respawned_replica_dies_with_a_killed_live_run(tmp_path):
    proc, pids = _start(tmp_path, "respawn", 2,
                        ["break step 3", "continue", "goto 1", "continue", "present", "continue"])
    replica, workers = None, []
    try:
        replica = int(_wait_for_file(pids, proc).split()[0])
        assert _ppid(replica) == proc.pid          # a replica, started by the live run
        end = time.time() + 30
        while len(workers) < 2 and time.time() < end:
            workers = _children(replica)           # its DataLoader workers
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert _gone_within([replica], 3) == [], "the replica outlived the live run"
        assert _gone_within(workers, 15) == [], "the replica's DataLoader workers outlived it"
    finally:
        _kill([proc.pid] + ([replica] if replica else []) + workers)
        proc.communicate(timeout=30)


@pytest.mark.skipif(libiomp_path() is None or not os.path.isdir("/dev/shm"),
                    reason="Intel OpenMP (intel-openmp) registers in /dev/shm")
def test_no_openmp_registration_file_is_left_by_replicas(tmp_path):
    """Each process that uses libiomp5 writes /dev/shm/__KMP_REGISTERED_LIB_<pid>_<uid>
    and removes it at its normal exit; a replica ends with os._exit (or is killed)."""
    def kmp_files():
        return {n for n in os.listdir("/dev/shm") if n.startswith("__KMP_REGISTERED_LIB_")}

    before = kmp_files()
    # replica 1 replays to step 1 and hands back; replica 2 blocks at step 2 and is killed
    proc, pids = _start(tmp_path, "fork", 0, ["break step 3", "continue", "goto 1", "present", "goto 1",
                                             "continue", "continue"])
    family, stop = {proc.pid}, threading.Event()

    def watch():                                   # every process nndb starts, and theirs
        while not stop.is_set():
            for d in os.listdir("/proc"):
                if d.isdigit() and _ppid(int(d)) in family:
                    family.add(int(d))
            time.sleep(0.02)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    replica = None
    try:
        replica = int(_wait_for_file(pids, proc).split()[0])
        time.sleep(0.3)
        os.kill(replica, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        stop.set()
        _kill([proc.pid] + ([replica] if replica else []))
    # the killed replica's command fails, which ends a batch run (exit 2) as any startup command's error
    assert proc.returncode == 2 and "the replica ended without reporting back" in err, out + err
    assert replica in family and len(family) >= 4, family      # live, checkpoint(s), two replicas
    uid = os.getuid()
    left = sorted(n for n in kmp_files() - before
                  if any(n == f"__KMP_REGISTERED_LIB_{p}_{uid}" for p in family))
    assert left == [], f"left by nndb's processes {sorted(family)}: {left}"




@pytest.mark.parametrize("when", ["at the prompt", "while the script runs"])
def test_sigterm_ends_an_interactive_session(tmp_path, when):
    pytest.importorskip("pty")
    from test_repl_terminal import LOOP, Terminal        # (a pseudo-terminal; a script that trains on)
    (tmp_path / "loop.py").write_text(LOOP)
    trace = tmp_path / "t.h5"
    term = Terminal(["run", "--nx", "--rules", "none", "--trace", str(trace), "loop.py"], cwd=tmp_path,
                    home=tmp_path)
    kids = []
    try:
        term.expect("(nndb)")
        if when == "at the prompt":
            term.type("break step 8")
            term.expect("(nndb)")
            term.type("continue")
            term.expect("Breakpoint 1, step 8")
            term.expect("(nndb)")
        else:
            term.type("continue")
            term.expect("ready")
        time.sleep(0.5)
        kids = _children(term.proc.pid)          # the checkpoint processes
        assert kids, "no checkpoint process"
        os.kill(term.proc.pid, signal.SIGTERM)
        try:
            term.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            raise AssertionError("the session survived SIGTERM: " + term.expect("zzz-never", timeout=1))
        assert term.proc.returncode == 143
        assert _gone_within(kids, 5) == [], "checkpoint processes outlived the session"
    finally:
        _kill(kids)
        term.close()
    from nndb.store.reader import TraceReader
    with TraceReader(str(trace)) as reader:
        assert reader.status == "terminated"


class Hint:
    """Not a tensor, number or string: torch.load(weights_only=True) refuses it."""


class WithExtra(torch.nn.Linear):
    def get_extra_state(self):
        return {"calls": 3, "hint": Hint()}

    def set_extra_state(self, state):
        pass


def test_a_disk_checkpoint_drops_what_weights_only_cannot_load(tmp_path):
    model = WithExtra(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.param_groups[0]["scheduler_hint"] = Hint()
    opt.param_groups[0]["extra"] = {"ok": [1, 2.5, "x", None], "obj": Hint()}
    opt.param_groups[0]["listed"] = [1, Hint()]          # (dropped whole: positions keep their meaning)
    warned = []
    path = disk.save(str(tmp_path / "ck"), 3, {"model": model}, {"opt": opt}, disk.capture_rng(),
                     warn=warned.append)
    data = torch.load(path, weights_only=True)          # data: loads without running code
    group = data["optimizers"]["opt"]["param_groups"][0]
    assert group["lr"] == 0.1 and "scheduler_hint" not in group and "listed" not in group
    assert group["extra"] == {"ok": [1, 2.5, "x", None]}
    assert data["modules"]["model"]["_extra_state"] == {"calls": 3}
    assert torch.equal(data["modules"]["model"]["weight"], model.weight.detach())
    assert len(warned) == 4 and all("\n" not in w for w in warned), warned
    for key in ("scheduler_hint", "obj", "hint", "listed"):
        assert any(key in w for w in warned), (key, warned)
    assert disk.load(path)["step"] == 3


KILLED = textwrap.dedent('''
    import os, signal, torch
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for step in range(6):
        loss = m(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        if step == 3:                                 # (its pid, and whether its OpenMP registration is there)
            print(os.getpid(), os.path.exists(f"/dev/shm/__KMP_REGISTERED_LIB_{os.getpid()}_{os.getuid()}"),
                  flush=True)
            os.kill(os.getpid(), signal.SIGKILL)      # kill -9 of the run, steps 0-3 flushed
''')


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: /dev/shm")
def test_a_killed_runs_trace_is_nndbs_and_its_openmp_registration_is_cleared(tmp_path):
    """A run killed with SIGKILL leaves its trace flagged open for writing
    (SWMR) and, under the preloaded libiomp5, /dev/shm/__KMP_REGISTERED_LIB_<pid>_<uid>
    (issue 41: --force said the trace was 'not an nndb trace'; the file stayed)."""
    (tmp_path / "killed.py").write_text(KILLED)
    (tmp_path / "ok.py").write_text("print('ok')\n")
    trace = str(tmp_path / "t.h5")
    r = nndb("run", "--batch", "-q", "--rules", "none", "--flush-every", "1", "--trace", trace, "killed.py",
             cwd=str(tmp_path))
    assert r.returncode == -signal.SIGKILL, r.stderr
    pid, registered = r.stdout.split()
    kmp = f"/dev/shm/__KMP_REGISTERED_LIB_{pid}_{os.getuid()}"
    # Whether the file was there is asked by the run itself, as it is killed, not
    # here after: from its death on, any nndb run of this user (another test
    # worker's) may remove it already, as forget_dead_openmp should.  Nothing
    # else does, so if nndb did not, it would still be there at the end.
    assert registered == str(libiomp_path() is not None)
    r = nndb("inspect", "--json", trace)
    assert r.returncode == 0 and json.loads(r.stdout)["steps"] >= 1, r.stderr
    r = nndb("run", "--batch", "-q", "--rules", "none", "--force", "--trace", trace, "ok.py", cwd=str(tmp_path))
    assert (r.returncode, r.stdout) == (0, "ok\n"), r.stderr
    from nndb.store.reader import TraceReader
    with TraceReader(trace) as t:
        assert t.meta["script"] == str(tmp_path / "ok.py")
    assert not os.path.exists(kmp)


def test_only_dead_processes_registrations_are_cleared(tmp_path):
    from nndb.run.preload import forget_dead_openmp
    uid = os.getuid()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    names = {f"__KMP_REGISTERED_LIB_{dead.stdout.strip()}_{uid}": False,       # ended: removed
             f"__KMP_REGISTERED_LIB_{os.getpid()}_{uid}": True,                # running: kept
             f"__KMP_REGISTERED_LIB_{dead.stdout.strip()}_{uid + 1}": True,    # another user's: kept
             "__KMP_REGISTERED_LIB_x_0": True, "notes.txt": True}
    for n in names:
        (tmp_path / n).write_text("x")
    assert forget_dead_openmp(str(tmp_path)) == [n for n, kept in names.items() if not kept]
    assert sorted(os.listdir(tmp_path)) == sorted(n for n, kept in names.items() if kept)
