"""nndb over torchrun (gloo, CPU, 2 ranks): one trace per rank in one run
directory, ``nndb run --nproc-per-node`` through torch's own launcher, the
results bit for bit those of torchrun alone, the hang watchdog, a rank that
dies, bad input; no process left behind after any of them."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT, nndb
from nndb.run import rank as job
from nndb.distributed import nodes
from nndb.store.reader import TraceReader

SCRIPTS = os.path.join(ROOT, "tests", "scripts")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="gloo jobs on Linux")
# (the tests that start a job: torchrun jobs, processes left behind found by command line;
# bad input ends before a job starts, in a child of the tests' fork server)
JOB = pytest.mark.real_subprocess


def _env():
    e = dict(os.environ)
    e.pop("NNDB_DEBUG", None)
    e["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in e.get("PYTHONPATH", "").split(os.pathsep) if p])
    return e


def _copy(tmp_path, name):
    """The script under tmp_path: its path marks the job's processes (see _left_behind)."""
    dst = tmp_path / name
    shutil.copy(os.path.join(SCRIPTS, name), dst)
    return str(dst)


def _left_behind(marker: str) -> list:
    """Processes whose command line names ``marker`` (no psutil: /proc)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd:
            out.append((pid, cmd))
    return out


def _assert_none_left(marker: str) -> None:
    deadline = time.time() + 10
    while _left_behind(marker) and time.time() < deadline:
        time.sleep(0.2)
    assert _left_behind(marker) == []


def _digests(out: str) -> dict:
    """rank -> digest (the ranks share one pipe: a line of one may land inside the other's)."""
    import re
    return {int(r): d for r, d in re.findall(r"rank (\d+) digest ([0-9a-f]{64})", out)}


def _torchrun(*args, cwd, timeout=120):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=_env(),
                          stdin=subprocess.DEVNULL)


def _metas(run_dir) -> list:
    out = []
    for r in (0, 1):
        with TraceReader(os.path.join(run_dir, f"rank{r}.h5")) as t:
            out.append((dict(t.meta), t.end, t.num_steps if hasattr(t, "num_steps") else None))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@JOB
def test_ddp_bit_identical_with_and_without_nndb_and_one_run_dir(tmp_path):
    script = _copy(tmp_path, "distrun_ddp_mlp.py")
    plain = _torchrun(script, cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr[-2000:]
    want = _digests(plain.stdout)
    assert sorted(want) == [0, 1]

    # nndb's front: torch.distributed.run as a library, every worker under nndb
    (tmp_path / "a").mkdir()
    front = nndb("run", "--batch", "--nproc-per-node", "2", script, cwd=tmp_path / "a", timeout=120)
    assert front.returncode == 0, front.stderr[-2000:]
    assert _digests(front.stdout) == want
    (run_dir,) = os.listdir(tmp_path / "a" / "nndb-runs")
    run_dir = tmp_path / "a" / "nndb-runs" / run_dir
    assert sorted(os.listdir(run_dir)) == ["rank0.h5", "rank1.h5"]
    metas = _metas(run_dir)
    assert [(m["rank"], m["world_size"], m["local_rank"]) for m, _, _ in metas] == [(0, 2, 0), (1, 2, 1)]
    assert metas[0][0]["job_id"] == metas[1][0]["job_id"] == run_dir.name
    assert all(end["status"] == "finished" and end["steps"] == 6 for _, end, _ in metas)

    # two "nodes" on localhost, one rank each: the run directory agreed through torchrun's store
    (tmp_path / "b").mkdir()
    port = _free_port()
    common = ["run", "--batch", "--nproc-per-node", "1", "--nnodes", "2", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", "twonodes"]
    secret = {"NNDB_JOB_SECRET": "5e" * 16}             # (given to every node, out of band)
    results = {}
    node0 = threading.Thread(target=lambda: results.update(n0=nndb(*common, script, cwd=tmp_path / "b",
                                                                      timeout=120, env=secret)))
    node0.start()
    time.sleep(0.5)
    results["n1"] = nndb(*common, "--node-rank", "1", script, cwd=tmp_path / "b",
                         timeout=120, env=secret)
    node0.join()
    assert results["n0"].returncode == 0 and results["n1"].returncode == 0, results["n1"].stderr[-2000:]
    assert {**_digests(results["n0"].stdout), **_digests(results["n1"].stdout)} == want
    (run_dir,) = os.listdir(tmp_path / "b" / "nndb-runs")
    metas = _metas(tmp_path / "b" / "nndb-runs" / run_dir)
    assert metas[0][0]["job_id"] == metas[1][0]["job_id"] == run_dir
    assert [m["local_rank"] for m, _, _ in metas] == [0, 0]

    # plain torchrun, nndb in every worker: each records its own rank, no prompt
    (tmp_path / "c").mkdir()
    under = _torchrun("-m", "nndb", "run", "--batch", script, cwd=tmp_path / "c")
    assert under.returncode == 0, under.stderr[-2000:]
    assert _digests(under.stdout) == want
    (run_dir,) = os.listdir(tmp_path / "c" / "nndb-runs")
    assert sorted(os.listdir(tmp_path / "c" / "nndb-runs" / run_dir)) == ["rank0.h5", "rank1.h5"]
    _assert_none_left(str(tmp_path))


@JOB
def test_ranks_started_by_mp_spawn_are_said_in_one_line_and_run_as_plain_python(tmp_path):
    """A script that starts its ranks with torch.multiprocessing.spawn (imagenet's
    --multiprocessing-distributed): nndb records only its own process, and said so only at
    the run's end, in the words of a script that trains nowhere ('the script called no
    backward() ...', after the whole training).  It now says so when the processes start,
    naming them and what to run instead; the ranks' losses are plain python's, bit for bit."""
    script = _copy(tmp_path, "dist_mp_spawn.py")
    plain = subprocess.run([sys.executable, script, str(_free_port())], cwd=str(tmp_path), capture_output=True,
                           text=True, timeout=120, env=_env(), stdin=subprocess.DEVNULL)
    assert plain.returncode == 0, plain.stderr
    r = nndb("run", "--batch", "-q", "--trace", str(tmp_path / "s.h5"), script, str(_free_port()),
             cwd=str(tmp_path), env=_env())
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == sorted(plain.stdout.splitlines()) and len(plain.stdout.splitlines()) == 2
    said = [ln for ln in r.stderr.splitlines() if ln.startswith("nndb:")]
    assert said == ["nndb: the script starts 2 process(es) with torch.multiprocessing.spawn (worker): nndb does "
                    "not trace them (it records the process it runs); to record each rank, start them with "
                    "'nndb run --nproc-per-node N SCRIPT' where the script reads torchrun's environment "
                    "(docs/distributed.md)"], r.stderr
    _assert_none_left(script)


@JOB
def test_hang_timeout_shows_every_rank_and_exits_5(tmp_path):
    script = _copy(tmp_path, "distrun_desync.py")
    t0 = time.time()
    r = nndb("run", "--batch", "-q", "--nproc-per-node", "2", "--hang-timeout", "3", "--report", "rep.json",
             script, cwd=tmp_path, timeout=120)
    took = time.time() - t0
    assert r.returncode == 5, r.stderr[-3000:]
    assert took < 55                     # (gloo's own timeout in the script is 60 s)
    err = r.stderr
    assert "nndb: the job hung: no rank finished a step for 3 s; every rank's stack:" in err
    assert "rank 0 (pid" in err and "waiting in torch.distributed.all_reduce" in err
    assert "rank 1 (pid" in err and "waiting in torch.distributed.barrier" in err
    assert "distrun_desync.py:26 in <module>" in err and "distrun_desync.py:28 in <module>" in err
    rep = json.loads((tmp_path / "rep.json").read_text())
    assert rep["exit"]["code"] == 5
    hung = {x["rank"]: x for x in rep["hang"]["ranks"]}
    assert sorted(hung) == [0, 1]
    main1 = next(t for t in hung[1]["stacks"] if t["main"])
    assert main1["collective"] == "barrier"
    (run_dir,) = os.listdir(tmp_path / "nndb-runs")
    for _, end, _ in _metas(tmp_path / "nndb-runs" / run_dir):
        assert end["status"] == "killed" and end["exit_code"] == 5     # closed by the worker's helper thread
    _assert_none_left(str(tmp_path))


_HUNG = ("rank 0 step 4 all_reduce", "rank 1 barrier")     # (tests/scripts/distrun_desync.py: where it hangs)


def _until_hung(fd, timeout=90) -> str:
    """What the job printed on ``fd`` until both ranks of distrun_desync.py
    said they entered the collective they hang in (past their last step end)."""
    import select
    seen, end = b"", time.time() + timeout
    while not all(w.encode() in seen for w in _HUNG):
        r, _, _ = select.select([fd], [], [], max(0.0, end - time.time()))
        assert r, f"no hang: the job printed {seen.decode(errors='replace')[-1500:]}"
        chunk = os.read(fd, 4096)
        assert chunk, f"the job ended: {seen.decode(errors='replace')[-1500:]}"
        seen += chunk
    # (a rank says so just before its call: on a loaded machine its stack at Ctrl-C was still the
    # script's line, not torch.distributed.all_reduce's; the calls are in within this margin)
    time.sleep(2.0)
    return seen.decode(errors="replace")


@JOB
def test_ctrl_c_at_a_hung_job_shows_every_stack_and_closes_every_trace(tmp_path):
    script = _copy(tmp_path, "distrun_desync.py")
    p = subprocess.Popen([sys.executable, "-m", "nndb", "run", "--batch", "-q", "--nproc-per-node", "2", script],
                         cwd=tmp_path, env=_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        shown = _until_hung(p.stdout.fileno())     # hung: both ranks have recorded their 5 steps
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        out = shown + out
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130, err[-3000:]
    assert "nndb: every rank's stack at Ctrl-C:" in err
    assert "waiting in torch.distributed.all_reduce" in err and "waiting in torch.distributed.barrier" in err
    assert err.count("c10d_logger.py:83 in wrapper") == 2          # (once per rank: nndb's detour hidden)
    (run_dir,) = os.listdir(tmp_path / "nndb-runs")
    for _, end, _ in _metas(tmp_path / "nndb-runs" / run_dir):
        assert end["status"] == "interrupted" and end["exit_code"] == 130
    _assert_none_left(str(tmp_path))


@JOB
# (forked workers skip the interpreter's teardown: rank 0, failing on the connection rank 1's death
# broke, ends within the same second as rank 1, and torchrun's one-second timestamps tie: the ranks'
# own times of ending tell which was first, as test_the_first_rank_to_fail_is_named_in_a_tie shows)
def test_a_rank_that_dies_takes_the_job_down(tmp_path):
    script = _copy(tmp_path, "distrun_ddp_mlp.py")
    r = nndb("run", "--batch", "-q", "--nproc-per-node", "2", "--trace", "out/run.h5", "--report", "job.json", script,
             "--fail-rank", "1", cwd=tmp_path, timeout=120)
    assert r.returncode == 1, r.stderr[-3000:]
    # the steps each rank finished: 0 and 1 (rank 0's step 2, cut short in the gradients' all-reduce
    # when rank 1 died, is a partial row of its trace, no step it finished: the report said 2)
    report = json.loads((tmp_path / "job.json").read_text())
    assert [(x["rank"], x["last_step"]) for x in report["ranks"]] == [(0, 1), (1, 1)], report["ranks"]
    lines = [l for l in r.stderr.splitlines() if l.startswith("nndb: rank")]
    assert lines[0] == ("nndb: rank 1 failed: exit code 1 (RuntimeError: planted failure on rank 1); "
                        "its traceback is above")
    assert "RuntimeError: planted failure on rank 1" in r.stderr.split(lines[0])[0]   # the traceback itself
    assert "[rank1]:   File " in r.stderr and "nndb/run/" not in r.stderr   # the script's frames only, as torchrun
    # --trace PATH: the rank goes before the extension, never one file for all ranks
    assert sorted(os.listdir(tmp_path / "out")) == ["run.rank0.h5", "run.rank1.h5"]
    ends, ids = [], set()
    for rank in (0, 1):
        with TraceReader(str(tmp_path / "out" / f"run.rank{rank}.h5")) as t:
            ends.append(t.end)
            ids.add(t.meta["job_id"])
            assert t.meta["rank"] == rank
    assert ends[1]["status"] == "failed"
    assert ends[0] is not None                  # rank 0's trace closed too
    assert len(ids) == 1 and None not in ids    # one job id in both
    _assert_none_left(str(tmp_path))


def test_fail_on_fails_the_job_on_a_finding_across_ranks(tmp_path):
    """--fail-on error goes to every rank, whose own rules' findings fail it (exit code 4); a
    finding of the rules across ranks, judged in the front, did not: every rank trained on
    the same batches (no DistributedSampler), the front printed 'nndb: error:
    duplicate_batches at step 1 (across ranks)', and the job ended with exit code 0, its
    report's too."""
    script = _copy(tmp_path, "dist_ddp.py")
    r = nndb("run", "--batch", "-q", "--nproc-per-node", "2", "--fail-on", "error", "--report", "job.json",
             script, "--no-sampler", "--epochs", "1", cwd=tmp_path, timeout=120)
    assert r.returncode == 4, r.stderr[-3000:]
    assert "nndb: --fail-on error: error duplicate_batches at step 1 (across ranks) (exit code 4)" in r.stderr
    report = json.loads((tmp_path / "job.json").read_text())
    assert report["exit"]["code"] == 4
    assert [(f["rule"], f["step"]) for f in report["cross_rank_findings"]] == [("duplicate_batches", 1)]
    _assert_none_left(str(tmp_path))


def test_batch_mode_lines_of_each_rank_say_whose_they_are(tmp_path):
    """In batch mode each rank runs -e/-x by itself and prints its own stops and findings, all
    ranks on one terminal: nndb's lines came without a rank ('Breakpoint 1, step 1 finished,
    loss 0.6927' twice, '7' and '107' from 'p rank * 100 + 7', in whatever order the ranks
    got there).  Every line nndb prints for a rank starts with '[rN] ', as at the job's prompt;
    the script's own output is as torchrun shows it."""
    script = _copy(tmp_path, "distrun_ddp_mlp.py")
    r = nndb("run", "--batch", "--nproc-per-node", "2", "--trace", "out/", "-e", "break step 1", "-e", "commands",
             "-e", "p rank * 100 + 7", "-e", "end", script, "--steps", "3", cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out, err = r.stdout.splitlines(), r.stderr.splitlines()
    for rank in (0, 1):
        assert f"[r{rank}] nndb: recording to out/rank{rank}.h5" in err, r.stderr
        assert f"[r{rank}] Breakpoint 1: step 1" in out, r.stdout
        assert any(ln.startswith(f"[r{rank}] Breakpoint 1, step 1 finished, loss ") for ln in out), r.stdout
        assert f"[r{rank}] {rank * 100 + 7}" in out, r.stdout
    mine = [ln for ln in out + err if ln.startswith(("Breakpoint", "nndb: recording", "> ", "-> "))
            or ln.strip() in ("7", "107")]
    assert mine == [], mine
    assert len(set(_digests(r.stdout).values())) == 1      # (the script's lines as they were)


def test_batch_mode_lines_for_some_ranks_run_on_those_ranks(tmp_path):
    """With --batch every rank runs the -e lines by itself; a line naming ranks ('break step 1
    rank 1', 'p --ranks all ...') was refused on every rank it did not name ('no rank 1 (ranks:
    0): this session is rank 0 of 2, on its own'), an error in a startup command: the job
    ended with exit code 2, though rank 1 had taken the same line.  A line for other ranks is
    theirs: rank 1 alone stops at step 1, and '--ranks all' gives each rank's own answer."""
    import nndb as api
    script = _copy(tmp_path, "distrun_ddp_mlp.py")
    r = nndb("run", "--batch", "--nproc-per-node", "2", "--trace", "out/", "-e", "break step 1 rank 1",
             "-e", "commands rank 1", "-e", "p 12345", "-e", "end", "-e", "p --ranks all rank * 100 + 7",
             script, "--steps", "3", cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout.splitlines()
    assert "[r0] 7" in out and "[r1] 107" in out, r.stdout
    assert [ln for ln in out if ln.endswith("12345")] == ["[r1] 12345"], r.stdout    # (the block is rank 1's)
    assert "[r1] Breakpoint 1: step 1" in out and "[r0] Breakpoint 1: step 1" not in out, r.stdout
    stops = []
    for rank in (0, 1):
        with api.open(str(tmp_path / "out" / f"rank{rank}.h5")) as t:
            stops.append([(s["step"], s["reason"]) for s in t.stops])
    assert stops == [[], [(1, "breakpoint")]], stops


def test_the_scripts_arguments_are_the_scripts_not_torchrun_s():
    """The front's torchrun command line: the script's arguments after the script went through
    torchrun's parser, which reads every word as a possible option: a script's --n (its own
    --nsamples, abbreviated) was 'ambiguous option: --n could match --nnodes, --nproc-per-node,
    ...' with torchrun's usage, exit code 2.  They reach the script as under python."""
    from torch.distributed import run as torchrun
    from nndb.distributed.front import LaunchOptions
    worker = ["run", "--batch", "/a/train.py", "--nnodes", "4", "--n", "3", "-m", "x"]
    args = torchrun.parse_args(LaunchOptions(2).torchrun_argv(worker))
    assert (args.nnodes, args.nproc_per_node, args.module) == ("1", "2", True)
    assert [args.training_script, *args.training_script_args] == ["nndb", *worker]


def test_the_first_rank_to_fail_is_named_in_a_tie():
    """torchrun's failure timestamps are whole seconds: rank 0, failing on the connection rank 1's
    death broke, tied with rank 1 and was named as the cause ('nndb: rank 0 failed: exit code 1
    (RuntimeError: ... Connection closed by peer ...)'); the ranks' own times of ending break the tie."""
    from types import SimpleNamespace
    from nndb.distributed.front import Front, FrontState, RankInfo
    said = []
    front = Front.__new__(Front)            # (its _failed alone: no sockets, no job)
    front.state, front.message = FrontState(), said.append
    front.options = SimpleNamespace(follower=lambda: False)
    front.state.ranks = {
        0: RankInfo(0, 1, None, status="exit", reason="RuntimeError: [gloo] Connection closed by peer",
                    ended_at=1000.731),
        1: RankInfo(1, 2, None, status="exit", reason="RuntimeError: planted failure on rank 1", ended_at=1000.402)}
    failures = {r: SimpleNamespace(exitcode=1, timestamp=1000) for r in (0, 1)}
    assert front._failed(SimpleNamespace(failures=failures)) == 1
    assert said == ["nndb: rank 1 failed: exit code 1 (RuntimeError: planted failure on rank 1); its traceback is above",
                    "nndb: rank 0 ended too: exit code 1 (RuntimeError: [gloo] Connection closed by peer)"]
    # a rank that never said when (killed before it could) goes by torchrun's timestamp
    front.state.ranks[1].ended_at, failures[1].timestamp = None, 999
    said.clear()
    front._failed(SimpleNamespace(failures=failures))
    assert said[0].startswith("nndb: rank 1 failed")


@pytest.mark.parametrize("args, line", [
    (["--nproc-per-node", "0", "S"], "nndb: error: --nproc-per-node must be at least 1, not 0"),
    (["--nproc-per-node", "2", "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
      "nowhere.invalid:29400", "S"],
     "nndb: error: cannot reach the rendezvous endpoint nowhere.invalid:29400: unknown host 'nowhere.invalid'"),
    (["--nproc-per-node", "2", "missing.py"], "nndb: error: no such file: missing.py"),
    (["--hang-timeout", "3", "S"], "nndb: error: --hang-timeout goes with --nproc-per-node N"),
    (["--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "2", "S"],
     "nndb: error: --node-rank must be in 0..1, not 2"),
    (["--nproc-per-node", "2", "--replica", "fork", "S"],
     "nndb: error: across ranks, time travel runs the whole job again and takes no checkpoints: "
     "--replica is not taken"),
])
def test_bad_input_is_one_line(tmp_path, args, line):
    script = _copy(tmp_path, "distrun_ddp_mlp.py")
    r = nndb("run", "--batch", *[script if a == "S" else a for a in args], cwd=tmp_path, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == line
    assert not (tmp_path / "nndb-runs").exists() or not os.listdir(tmp_path / "nndb-runs")
    _assert_none_left(str(tmp_path))


def test_trace_names_per_rank(tmp_path):
    two = job.Place(rank=1, world_size=2, local_rank=1)
    assert job.rank_trace(str(tmp_path / "run.h5"), two) == str(tmp_path / "run.rank1.h5")
    assert job.rank_trace(str(tmp_path / "run"), two) == str(tmp_path / "run.rank1.h5")
    assert job.rank_trace(str(tmp_path / "run.h5"), job.Place()) == str(tmp_path / "run.h5")
    one = job.place({"NNDB_JOB_ID": "x-1"})         # (nndb run --nproc-per-node 1's worker)
    assert one.in_job and not one.distributed
    assert job.rank_trace(str(tmp_path / "run.h5"), one) == str(tmp_path / "run.rank0.h5")
    assert job.rank_trace(str(tmp_path / "d") + os.sep, one) == str(tmp_path / "d" / "rank0.h5")
    given = job.job_run_dir(str(tmp_path), "x", two, env={"NNDB_RUN_DIR": str(tmp_path / "d")})
    assert given == str(tmp_path / "d") and os.path.isdir(given)
    # without a front or a store: every rank derives the same name
    env = {"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    a = job.job_run_dir(str(tmp_path), "x", job.Place(0, 2, 0), env=env)
    b = job.job_run_dir(str(tmp_path), "x", two, env=env)
    assert a == b
    assert job.job_id(a, env={}) == os.path.basename(a)


def test_front_refuses_a_worker_without_the_secret_or_with_another_version(tmp_path):
    from nndb.distributed.front import Front, LaunchOptions
    from nndb.run.launcher import Target
    from nndb.timetravel.channel import Channel
    from nndb.version import __version__
    script = _copy(tmp_path, "distrun_ddp_mlp.py")
    said = []
    front = Front(Target(path=script), LaunchOptions(2), said.append)
    try:
        good = {"op": "hello", "rank": 0, "pid": 1, "nndb_version": __version__, "nonce": "n",
                "script": script, "script_sha256": front.digest}
        cases = [(dict(good, secret=front.secret), "without this job's secret"),     # (the proof, not the secret)
                 (dict(good, nndb_version="0.0.1"), "rank 0 runs nndb 0.0.1, this front nndb"),
                 (dict(good, script_sha256="f" * 64), "rank 0 runs a different script than this front"),
                 (good, None)]
        for hello, why in cases:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(front.socket_path)
            ch = Channel(s)
            nonce = ch.recv()["nonce"]
            if "secret" not in hello:
                hello = dict(hello, proof=nodes.proof(front.secret, "rank", nonce))
            ch.send(hello)
            answer = ch.recv()
            ch.close()
            if why is None:
                assert answer == {"op": "ok", "proof": nodes.proof(front.secret, "front", "n"),
                                  "interactive": False}
            else:
                assert answer["op"] == "refuse" and why in answer["reason"]
                assert why in said[-1]
    finally:
        front.close()
    assert not os.path.exists(front.socket_path)


def _on_terminal(tmp_path, script, launch=("--nproc-per-node", "2"), args=()):
    """``nndb run LAUNCH SCRIPT ARGS`` on a pseudo-terminal: (process, master fd, expect)."""
    import pty
    import select
    master, slave = pty.openpty()
    env = dict(_env(), TERM="dumb", HOME=str(tmp_path))
    p = subprocess.Popen([sys.executable, "-m", "nndb", "run", "-q", *launch, script, *args],
                         cwd=tmp_path, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    seen = [b""]

    def expect(text, timeout=90):
        """Read until ``text``; return everything up to it."""
        end = time.time() + timeout
        while text.encode() not in seen[0]:
            r, _, _ = select.select([master], [], [], max(0.0, end - time.time()))
            assert r, f"no {text!r}; the terminal shows: {seen[0].decode(errors='replace')[-1500:]}"
            try:
                seen[0] += os.read(master, 4096)
            except OSError:
                break
        i = seen[0].index(text.encode()) + len(text)
        before, seen[0] = seen[0][:i].decode(errors="replace"), seen[0][i:]
        return before
    return p, master, expect


def _ends(tmp_path) -> list:
    """(status, exit code) of each rank's trace under out/, rank 0 first."""
    ends = []
    for rank in (0, 1):
        with TraceReader(str(tmp_path / "out" / f"rank{rank}.h5")) as t:
            ends.append((t.end["status"], t.end["exit_code"]))
    return ends


def _reap(p, master) -> None:
    """A job's terminal closed; the job killed if it is still running (a failed test)."""
    if p.poll() is None:
        os.killpg(p.pid, 9)
    os.close(master)


def _commands(master, expect):
    """``cmd(line)``: type a line at the job's prompt; what it printed up to
    the next ``(nndb rN)`` prompt (then read on to ``until``), without CRs."""
    def cmd(line, until=") "):
        os.write(master, (line + "\n").encode())
        out = expect("(nndb r")
        expect(until)
        return out.replace("\r", "")
    return cmd


@JOB
def test_a_rank_whose_script_raises_stops_at_its_post_mortem(tmp_path):
    """At the job's prompt, rank 1's script raised at step 2 after 'continue': the traceback,
    then the job ended (rank 0's all-reduce broken under it), with no post-mortem, where one
    process stops at the raising frame (pdb's post-mortem).  The rank stops there: 'p', 'where'
    look at its frame, the others are left where they wait (rank 0 in DDP's all-reduce), and
    'continue' (or 'quit') ends the job as the script did: rank 1 named, exit code 1."""
    script = _copy(tmp_path, "distrun_ddp_mlp.py")
    p, master, expect = _on_terminal(tmp_path, script, ("--nproc-per-node", "2", "--trace", "out/"),
                                     args=("--fail-rank", "1"))
    try:
        expect("(nndb r0) ", timeout=150)
        cmd = _commands(master, expect)
        out = cmd("continue")
        assert "RuntimeError: planted failure on rank 1" in out, out          # (the rank's traceback)
        assert "nndb: 1 of 2 rank(s) stopped: r1" in out, out
        assert ("nndb: post-mortem of rank 1 (RuntimeError in step 2): 'where', 'up', 'p', 'stats' look there; "
                "'continue' or 'quit' ends the job") in out, out
        assert "\n2\n" in cmd("p step")
        assert 'raise RuntimeError(f"planted failure on rank {rank}")' in cmd("where")
        assert "rank 0: not at a stop" in cmd("rank 0")
        assert "rank 1: at its post-mortem (RuntimeError in step 2)" in cmd("rank 1")
        os.write(master, b"continue\n")
        out = expect("nndb: the job ended (exit code 1)").replace("\r", "")
        assert "nndb: the job cannot go on past rank 1 (RuntimeError in step 2): ending it" in out, out
        assert "nndb: rank 1 failed: exit code 1 (RuntimeError: planted failure on rank 1)" in out, out
        p.wait(timeout=60)
    finally:
        _reap(p, master)
    assert p.returncode == 1
    ends = _ends(tmp_path)
    assert ends == [("killed", 0), ("failed", 1)], ends
    _assert_none_left(str(tmp_path))


@JOB
def test_a_waiting_rank_whose_collective_fails_at_the_prompt_is_at_its_post_mortem(tmp_path):
    """Rank 1 stopped inside step 0 (a module breakpoint); rank 0, left waiting in DDP's
    all-reduce, saw its collective time out (the process group's 8 s) while the job sat at
    the prompt, and its script raised there.  The console still took it for a waiting rank:
    'rank 0: not at a stop', 'where' showed nndb's own prompt as its stack, and 'quit' ended
    it 'killed' with the job's exit code 0.  It is at its post-mortem, said before the next
    command, and 'quit' ends the job as its script did (exit code 1, rank 0 named)."""
    script = _copy(tmp_path, "distrun_ddp_mlp.py")
    p, master, expect = _on_terminal(tmp_path, script, ("--nproc-per-node", "2", "--trace", "out/"),
                                     args=("--pg-timeout", "8"))
    try:
        expect("(nndb r0) ", timeout=150)
        cmd = _commands(master, expect)
        cmd("break module module.0 rank 1")
        assert "nndb: 1 of 2 rank(s) stopped: r1" in cmd("continue")
        expect("Timed out waiting 8000ms", timeout=120)      # (rank 0's traceback, printed by its process)
        seen, deadline = "", time.time() + 60
        while time.time() < deadline:       # (until rank 0's post-mortem reached the front: no time assumed)
            out = cmd("rank 0")
            seen += out
            if "at its post-mortem" in out:
                break
            seen += cmd("rank 1")
            time.sleep(0.2)
        assert "nndb: post-mortem of rank 0 (RuntimeError in step 0)" in seen, seen
        assert "rank 0: at its post-mortem (RuntimeError in step 0)" in out, seen
        assert "-> loss.backward()" in cmd("where")
        os.write(master, b"quit\n")
        out = expect("nndb: the job ended (exit code 1)").replace("\r", "")
        assert "nndb: rank 0 failed: exit code 1 (RuntimeError: " in out, out
        p.wait(timeout=60)
    finally:
        _reap(p, master)
    assert p.returncode == 1
    ends = _ends(tmp_path)
    assert ends == [("failed", 1), ("killed", 0)], ends
    _assert_none_left(str(tmp_path))


@JOB
def test_ctrl_c_at_the_prompt_of_a_hung_job(tmp_path):
    """Ctrl-C while the ranks run asks each to stop at the next step end; a
    hung job does not, and after 3 s every rank's stack is shown: where the
    script hangs without nndb (rank 0 in its all_reduce, rank 1 in the final
    barrier: rank 0, held in an all_reduce while rank 1 waited for it at a
    step end, left nndb's agreement, as a rank out of inputs under Join
    does); Ctrl-C again ends it, traces closed."""
    script = _copy(tmp_path, "distrun_desync.py")
    p, master, expect = _on_terminal(tmp_path, script)
    try:
        expect("(nndb r0) ")
        os.write(master, b"continue\n")
        shown = expect(_HUNG[1])
        if _HUNG[0] not in shown:
            expect(_HUNG[0])
        p.send_signal(signal.SIGINT)            # (the terminal's Ctrl-C: the front's process group)
        out = expect("nndb: Ctrl-C again ends the job\r\n")
        assert "not every rank stopped within 3 s (a hang?); every rank's stack:" in out
        assert "waiting in torch.distributed.all_reduce\r\n" in out
        assert "waiting in torch.distributed.barrier\r\n" in out
        assert "all-stop agreement at a step end" not in out
        p.send_signal(signal.SIGINT)
        out = expect("nndb: the job ended (exit code 130)")
        assert "the job was interrupted" in out
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
        os.close(master)
    assert p.returncode == 130
    (run_dir,) = os.listdir(tmp_path / "nndb-runs")
    for _, end, _ in _metas(tmp_path / "nndb-runs" / run_dir):
        assert end["status"] == "interrupted"
    _assert_none_left(str(tmp_path))


@JOB
def test_all_stop_prompt_on_a_terminal(tmp_path):
    """One prompt for both ranks: a breakpoint stops both at the end of the
    same step; a watch given 'rank 1' hits on rank 1 only and rank 0 stops
    with it; 'rank N' switches; --ranks all prints side by side;
    reverse-step respawns both ranks and lands on the first pass's values;
    the results are those of torchrun alone."""
    import re
    script = _copy(tmp_path, "distrun_ddp_mlp.py")
    p, master, expect = _on_terminal(tmp_path, script)

    def cmd(line):
        os.write(master, (line + "\n").encode())
        return expect("(nndb r")

    try:
        start = expect("(nndb r0) ")
        assert "nndb: all 2 rank(s) stopped at the start" in start
        out = cmd("break step 2")
        out = cmd("continue")
        assert "nndb: all 2 rank(s) stopped at the end of step 2" in out
        expect(") ")
        out = cmd("p --ranks all loss.item()")
        at2 = re.findall(r"^r(\d)\s+(\S+)\s*$", out, re.M)
        assert [r for r, _ in at2] == ["0", "1"], out
        expect(") ")
        out = cmd("rank 1")
        assert "rank 1: step 2" in out
        expect("1) ")
        out = cmd("p --ranks all $step * 10")
        rows = re.findall(r"^r(\d)\s+(\d+)\s*$", out, re.M)
        assert rows == [("0", "20"), ("1", "20")], out
        expect(") ")
        out = cmd("delete 1")
        expect(") ")
        out = cmd("watch loss > 0 rank 1")          # rank 1 only: rank 0 stops with it
        assert "Watchpoint 2" in out
        expect(") ")
        out = cmd("continue")
        assert "nndb: all 2 rank(s) stopped at the end of step 3" in out
        assert "[r0] " not in out                   # (rank 0 stopped for rank 1: no hit of its own)
        expect(") ")
        out = cmd("p --ranks all $step")
        assert re.findall(r"^r(\d)\s+(\d+)\s*$", out, re.M) == [("0", "3"), ("1", "3")], out
        expect(") ")
        out = cmd("reverse-step")                   # every rank respawned, replayed to step 2
        assert "time travel runs the whole job again from its start" in out
        assert "nndb: all 2 rank(s) stopped at the end of step 2" in out
        expect(") ")
        out = cmd("p --ranks all loss.item()")
        assert re.findall(r"^r(\d)\s+(\S+)\s*$", out, re.M) == at2      # the values of the first pass
        expect(") ")
        out = cmd("rank 0")
        expect(") ")
        out = cmd("info breakpoints")                # the points are set again, each on its ranks
        assert "No breakpoints or watchpoints." in out
        expect(") ")
        out = cmd("rank 1")
        expect(") ")
        out = cmd("info breakpoints")
        assert "No breakpoints" not in out and "loss" in out
        expect(") ")
        out = cmd("timelines")
        assert "timelines are not kept across ranks" in out
        expect(") ")
        os.write(master, b"delete\n")
        expect(") ")
        os.write(master, b"continue\n")
        out = expect("nndb: the job ended (exit code 0)")
        assert len(set(_digests(out.replace("\r", "")).values())) == 1
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
        os.close(master)
    assert p.returncode == 0
    _assert_none_left(str(tmp_path))


@JOB
@pytest.mark.parametrize("existing,nproc", [(False, 2), (True, 2), (False, 1)],
                         ids=["new-dir", "existing-dir", "one-rank"])
def test_nproc_per_node_trace_dir_gives_each_rank_its_file_inside_as_torchrun_does(tmp_path, existing, nproc):
    """``--trace DIR/`` (new, with its slash) or ``--trace DIR`` (existing):
    DIR/rank<R>.h5, the rule ``torchrun -m nndb run`` follows (rank_trace);
    the job's report gives each rank's last step as its trace ends.  A job of one
    rank too: ``--nproc-per-node 1 --trace DIR/`` was refused ('is a directory'), and
    without --trace its trace went to nndb-runs/<script>-<time>.h5 beside the run
    directory the front announced, left empty."""
    script = _copy(tmp_path, "distrun_ddp_mlp.py")
    out = tmp_path / "out"
    if existing:
        out.mkdir()
    r = nndb("run", "--batch", "-q", "--nproc-per-node", str(nproc), "--trace", str(out) if existing else "out/",
             "--report", "rep.json", script, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(os.listdir(out)) == [f"rank{k}.h5" for k in range(nproc)]
    assert not list(tmp_path.glob("out.rank*"))
    if nproc == 1:
        r = nndb("run", "--batch", "--nproc-per-node", "1", script, cwd=tmp_path, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        runs = os.listdir(tmp_path / "nndb-runs")
        assert len(runs) == 1 and os.listdir(tmp_path / "nndb-runs" / runs[0]) == ["rank0.h5"], runs
        assert f"traces of the 1 rank(s) in {tmp_path / 'nndb-runs' / runs[0]}" in r.stderr, r.stderr
    with open(tmp_path / "rep.json") as fh:
        reported = {x["rank"]: x for x in json.load(fh)["ranks"]}
    for rank in range(nproc):
        with TraceReader(str(out / f"rank{rank}.h5")) as t:
            assert t.meta["rank"] == rank and t.status == "finished"
            # the report's last step is the trace's, not the last one sent while the job ran
            assert reported[rank]["last_step"] == t.end["last_step"] == int(t.steps[-1])


@JOB
@pytest.mark.parametrize("trace", ["runJ/", "run.h5"])
def test_travel_across_ranks_with_a_trace_given_records_beside_it(tmp_path, trace):
    """With --trace, reverse-step ran the job again on the same paths: every rank refused
    ('--trace .../rank0.h5 exists') and the stopped job was lost.  The job run again records
    beside the run before (runJ.t1/, run.t1.rank<R>.h5), which keeps its traces to be checked against."""
    script = _copy(tmp_path, "distrun_ddp_mlp.py")
    p, master, expect = _on_terminal(tmp_path, script, launch=("--nproc-per-node", "2", "--trace", trace))
    cmd = _commands(master, expect)
    try:
        expect("(nndb r0) ")
        cmd("break step 2")
        assert "nndb: all 2 rank(s) stopped at the end of step 2" in cmd("continue")
        out = cmd("reverse-step")
        fresh = "runJ.t1/" if trace.endswith("/") else "run.t1.h5"
        assert f"nndb: the job run again records to {tmp_path / fresh}" in out, out
        assert "nndb: all 2 rank(s) stopped at the end of step 1" in out and "exists" not in out, out
        assert "equals the run before's, bit for bit" in out, out
        os.write(master, b"delete\n")
        expect(") ")
        os.write(master, b"continue\n")
        expect("nndb: the job ended (exit code 0)")
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
        os.close(master)
    first = ["runJ/rank0.h5", "runJ/rank1.h5"] if trace.endswith("/") else ["run.rank0.h5", "run.rank1.h5"]
    again = ["runJ.t1/rank0.h5", "runJ.t1/rank1.h5"] if trace.endswith("/") else ["run.t1.rank0.h5", "run.t1.rank1.h5"]
    assert all((tmp_path / f).exists() for f in first + again)
    _assert_none_left(str(tmp_path))
