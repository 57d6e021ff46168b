"""A job of two "nodes" on this machine (one rank each, torchrun's static
rendezvous on a free localhost port): the prompt on node 0 controls the
ranks of both nodes, node 0's batch watchdog sees both, and nobody without
the job's secret can attach on either side of node 0's TCP channel."""
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from nndb.distributed import nodes
from test_distributed_run import (_assert_none_left, _copy, _digests, _env, _free_port, _metas, _on_terminal)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="gloo jobs on Linux")
SECRET = "f3" * 16


@pytest.fixture(autouse=True)
def job_secret(monkeypatch):
    """The secret every node of a job is given out of band (the nodes' nndb runs: through _env)."""
    monkeypatch.setenv(nodes.JOB_SECRET_ENV, SECRET)


def _launch(port: int):
    return ("--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", f"localhost:{port}")


def _node1(tmp_path, script, port, *extra):
    """Node 1's ``nndb run`` (never a prompt), in its own directory."""
    (tmp_path / "node1").mkdir()
    return subprocess.Popen([sys.executable, "-m", "nndb", "run", *_launch(port), "--node-rank", "1", *extra,
                             script], cwd=tmp_path / "node1", env=_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _end(p, timeout=60):
    try:
        out, err = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    return out, err


def test_the_prompt_on_node_0_controls_the_ranks_of_both_nodes(tmp_path):
    script = _copy(tmp_path, "distrun_ddp_mlp.py")
    port = _free_port()
    n1 = _node1(tmp_path, script, port)
    p, master, expect = _on_terminal(tmp_path, script, _launch(port))

    def cmd(line, until=") "):
        os.write(master, (line + "\n").encode())
        out = expect("(nndb r")
        expect(until)
        return out

    try:
        start = expect("(nndb r0) ", timeout=180)      # (two launchers' start-up on a loaded machine)
        assert "nndb: all 2 rank(s) stopped at the start" in start
        cmd("break step 2")
        out = cmd("continue")
        assert "nndb: all 2 rank(s) stopped at the end of step 2" in out
        out = cmd("p --ranks all $step")
        assert re.findall(r"^r(\d)\s+(\d+)\s*$", out.replace("\r", ""), re.M) == [("0", "2"), ("1", "2")], out
        out = cmd("rank 1")
        assert "rank 1: step 2" in out
        out = cmd("where --ranks all")
        assert out.count("distrun_ddp_mlp.py") >= 2, out
        out = cmd("goto 1")
        assert "time travel across nodes is not available" in out
        cmd("watch loss > 0 rank 1")                 # rank 1 (node 1) only: rank 0 stops with it
        out = cmd("continue")
        assert "nndb: all 2 rank(s) stopped at the end of step 3" in out
        cmd("delete")
        os.write(master, b"continue\n")
        out = expect("nndb: the job ended (exit code 0)")
        assert set(_digests(out.replace("\r", ""))) == {0}      # (rank 1 prints on node 1's terminal)
        p.wait(timeout=60)
    except AssertionError as e:         # (what node 1 said, to tell why)
        os.killpg(n1.pid, signal.SIGKILL)
        raise AssertionError(f"{e}\nnode 1 said: {n1.stderr.read()[-2000:]}") from None
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        os.close(master)
        out1, err1 = _end(n1)
    assert p.returncode == 0
    assert n1.returncode == 0, err1[-3000:]
    assert "nndb: node 1: the job's prompt (or, in batch mode, its watchdog) is on node 0" in err1
    assert set(_digests(out1)) == {1}
    _assert_none_left(str(tmp_path))


def test_the_batch_watchdog_on_node_0_sees_the_ranks_of_both_nodes(tmp_path):
    script = _copy(tmp_path, "distrun_desync.py")
    port = _free_port()
    n1 = _node1(tmp_path, script, port, "--batch", "-q")
    r = subprocess.run([sys.executable, "-m", "nndb", "run", "--batch", "-q", *_launch(port), "--hang-timeout", "3",
                        script], cwd=tmp_path, env=_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=120)
    out1, err1 = _end(n1)
    assert r.returncode == 5, r.stderr[-3000:]
    assert "nndb: the job hung: no rank finished a step for 3 s; every rank's stack:" in r.stderr
    assert "waiting in torch.distributed.all_reduce" in r.stderr          # rank 0, on node 0
    assert "rank 1 (pid" in r.stderr and "waiting in torch.distributed.barrier" in r.stderr   # rank 1, on node 1
    assert n1.returncode == 5, err1[-3000:]
    assert err1.strip().splitlines()[-1] == "nndb: rank 1 ended (exit code 5); node 0's nndb run says why"
    (run_dir,) = os.listdir(tmp_path / "nndb-runs")
    os.rename(tmp_path / "node1" / "nndb-runs" / run_dir / "rank1.h5", tmp_path / "nndb-runs" / run_dir / "rank1.h5")
    for _, end, _ in _metas(tmp_path / "nndb-runs" / run_dir):
        assert end["status"] == "killed" and end["exit_code"] == 5     # closed on both nodes
    _assert_none_left(str(tmp_path))


def test_node_0s_tcp_channel_takes_only_the_jobs_ranks_and_ranks_take_only_their_front(tmp_path):
    from nndb.distributed.front import Front, LaunchOptions
    from nndb.distributed.worker import FrontLink
    from nndb.errors import UsageError
    from nndb.run.launcher import Target
    from nndb.timetravel.channel import Channel
    from nndb.version import __version__
    script = _copy(tmp_path, "distrun_ddp_mlp.py")
    said = []
    front = Front(Target(path=script), LaunchOptions(1, nnodes="2", rdzv_endpoint="localhost:29400"), said.append)
    try:
        assert front.tcp_port is not None and front.tcp_host == "127.0.0.1"     # (the nodes' interface)
        assert front.secret == SECRET
        hello = {"op": "hello", "rank": 1, "pid": 1, "nndb_version": __version__, "nonce": "x",
                 "script": script, "script_sha256": front.digest}
        for proof in ("0" * 64, None, "guess"):     # a stranger: refused, the job goes on
            ch = Channel(socket.create_connection(("127.0.0.1", front.tcp_port)))
            ch.recv()
            ch.send(dict(hello, proof=proof, secret=front.secret if proof is None else None))
            assert ch.recv()["op"] == "refuse"
            ch.close()
        assert said[-1] == "nndb: error: a process without this job's secret tried to attach; refused"
        assert front.state.refused is None and front.state.ranks == {}
        ch = Channel(socket.create_connection(("127.0.0.1", front.tcp_port)))
        ch.sock.settimeout(10)
        assert ch.recv()["op"] == "nonce"
        ch.send({"op": "hello", "pad": "y" * nodes.HELLO_LIMIT})      # (too long before the proof: dropped)
        assert ch.recv() is None
        ch.close()
        assert front.state.ranks == {}
        # a rank of the job: the secret given out of band, its proof taken; then every message sealed
        record = {"hosts": ["127.0.0.1"], "port": front.tcp_port}
        ch = Channel(nodes.connect(record))
        theirs = ch.recv()["nonce"]
        ch.send(dict(hello, proof=nodes.proof(front.secret, "rank", theirs)))
        assert ch.recv()["proof"] == nodes.proof(front.secret, "front", "x")
        sealed = nodes.SealedChannel(ch, nodes.session_key(SECRET, theirs, "x"), "rank", "front")
        sealed.send({"op": "step", "step": 7})
        ch.send({"op": "step", "step": 8})                  # (unsealed: an injected message ends the channel)
        t0 = time.monotonic()
        # (the front's thread takes the rank in after its proof went out: not yet there, maybe)
        while getattr(front.state.ranks.get(1), "status", None) != "gone" and time.monotonic() - t0 < 10:
            time.sleep(0.05)
        assert front.state.ranks[1].step == 7 and front.state.ranks[1].status == "gone"
        # the console waits for every rank's hello, but not for ever after the first (a node without nndb)
        ch.close()
        ch = Channel(nodes.connect(record))
        ch.send(dict(hello, proof=nodes.proof(front.secret, "rank", ch.recv()["nonce"])))
        assert ch.recv()["op"] == "ok"
        assert front.wait_hello(1, lambda: False, patience=0.5)
        t0 = time.monotonic()
        assert not front.wait_hello(2, lambda: False, patience=0.5)
        assert time.monotonic() - t0 < 3
        ch.close()
    finally:
        front.close()

    # a process at the published address that does not know the secret gets no proof from a rank
    fake = nodes.tcp_listener()
    port = fake.getsockname()[1]

    def serve():
        conn, _ = fake.accept()
        ch = Channel(conn)
        ch.send({"op": "nonce", "nonce": "n"})
        got.append(ch.recv())
        ch.send({"op": "ok", "proof": "0" * 64, "interactive": True})
    got = []
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    store = _store()
    env = {"TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port),
           nodes.FROM_STORE_ENV: "1", "RANK": "1", "WORLD_SIZE": "2", "NNDB_FRONT_SECRET": "s3cret"}
    nodes.publish(env, f"127.0.0.1:{port}")
    assert nodes.lookup(env) == {"hosts": ["127.0.0.1"], "port": port}       # (never the secret)
    with pytest.raises(UsageError, match="does not know this job's secret; not attaching to it"):
        FrontLink.connect(Target(path=script), env)
    t.join(10)
    fake.close()
    assert got[0]["proof"] == nodes.proof("s3cret", "rank", "n") and "s3cret" not in str(got[0])


def test_a_job_of_several_nodes_needs_a_secret_given_out_of_band(monkeypatch, tmp_path):
    from nndb.distributed.front import Front, LaunchOptions
    from nndb.errors import UsageError
    from nndb.run.launcher import Target
    script = _copy(tmp_path, "distrun_ddp_mlp.py")
    for value in (None, "short"):
        if value is None:
            monkeypatch.delenv(nodes.JOB_SECRET_ENV)
        else:
            monkeypatch.setenv(nodes.JOB_SECRET_ENV, value)
        with pytest.raises(UsageError, match="a job of several nodes needs a secret that only its nodes know"):
            Front(Target(path=script), LaunchOptions(1, nnodes="2"), print)


WAITS = """\
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
while not os.path.exists(sys.argv[1]):          # (until the test has tried to get in)
    time.sleep(0.1)
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
print(f"rank {dist.get_rank()} sum {t.item():g}", flush=True)
dist.destroy_process_group()
"""


def test_a_stranger_who_reads_the_store_is_refused_and_the_job_goes_on(tmp_path):
    """Issue 41: the secret was in torchrun's store, which has no authentication;
    a stranger read it, passed the handshake with a wrong script and ended both nodes."""
    import json
    from nndb.timetravel.channel import Channel
    script = tmp_path / "waits.py"
    flag = str(tmp_path / "flag")
    script.write_text(WAITS.replace("sys.argv[1]", repr(flag)))
    port = _free_port()
    n1 = _node1(tmp_path, str(script), port, "--batch", "-q")
    n0 = subprocess.Popen([sys.executable, "-m", "nndb", "run", "--batch", "-q", *_launch(port), str(script)],
                          cwd=tmp_path, env=_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        # the stranger: reaches the rendezvous port, as every node must, and reads what nndb put there
        from datetime import timedelta
        from torch.distributed import TCPStore
        store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))
        record = json.loads(store.get("nndb/front/0").decode())
        assert record["hosts"] == ["127.0.0.1"] and SECRET not in json.dumps(record)
        ch = Channel(nodes.connect(record))
        nonce = ch.recv()["nonce"]
        ch.send({"op": "hello", "rank": 1, "pid": 1, "nndb_version": "0", "nonce": "x", "script": "other.py",
                 "script_sha256": "0" * 64, "proof": nodes.proof(record.get("secret", "guess"), "rank", nonce)})
        assert ch.recv()["op"] == "refuse"
        ch.close()
        open(flag, "w").close()
        out0, err0 = _end(n0, timeout=120)
    finally:
        open(flag, "w").close()
        out1, err1 = _end(n1, timeout=120)
        _end(n0)
    assert n0.returncode == 0, err0[-3000:] + "\nnode 1 said: " + err1[-3000:]
    assert n1.returncode == 0, err1[-3000:]
    assert "nndb: error: a process without this job's secret tried to attach; refused" in err0
    assert "rank 0 sum 3" in out0 and "rank 1 sum 3" in out1
    _assert_none_left(str(tmp_path))


def _store():
    from datetime import timedelta
    from torch.distributed import TCPStore
    return TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10))
