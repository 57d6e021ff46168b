"""The all-stop agreement through shared memory, end to end: 2 gloo ranks
under ``nndb run --nproc-per-node 2`` on a pseudo-terminal (one job)."""
from __future__ import annotations

import glob
import os
import re

import pytest

from test_distributed_run import _assert_none_left, _commands, _copy, _digests, _on_terminal, pytestmark  # noqa: F401


def _segments() -> set:
    return set(glob.glob(f"/dev/shm/nndb-allstop-{os.getuid()}-*"))


def test_one_rank_stops_both_stop_and_a_rank_waiting_in_the_shared_memory_barrier_is_named(tmp_path):
    """A breakpoint on rank 1 only stops both ranks at the end of the same
    step (the agreement in shared memory); a module breakpoint on rank 1
    between backward and the optimizer step leaves rank 0 waiting at the
    step end, in nndb's agreement, and the console says so; the results
    are the same on both ranks, and no segment is left in /dev/shm."""
    before = _segments()
    script = _copy(tmp_path, "distrun_probe.py")
    p, master, expect = _on_terminal(tmp_path, script)

    cmd = _commands(master, expect)

    try:
        expect("(nndb r0) ", timeout=150)
        assert _segments() == before                # (the first step end makes it, and unlinks it at once)
        cmd("break step 2 rank 1")
        out = cmd("continue")
        assert "nndb: all 2 rank(s) stopped at the end of step 2" in out, out
        out = cmd("p --ranks all $step")
        assert re.findall(r"^r(\d)\s+(\d+)\s*$", out, re.M) == [("0", "2"), ("1", "2")], out
        assert _segments() == before
        cmd("delete")
        assert "Breakpoint" in cmd("break module *probe rank 1")
        out = cmd("continue")
        assert ("nndb: rank 0 did not stop: it waits in nndb's all-stop agreement at a step end "
                "(shared memory)") in out, out
        assert "nndb: 1 of 2 rank(s) stopped: r1" in out, out
        out = cmd("where --ranks all")
        assert "waiting in nndb's all-stop agreement at a step end (shared memory)" in out, out
        out = cmd("p --ranks all $step")
        assert re.search(r"^r0\s+rank 0 is not at a stop: it waits in nndb's all-stop agreement", out, re.M), out
        cmd("delete")
        os.write(master, b"continue\n")
        out = expect("nndb: the job ended (exit code 0)")
        digests = _digests(out.replace("\r", ""))
        assert sorted(digests) == [0, 1] and len(set(digests.values())) == 1, out
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
        os.close(master)
    assert p.returncode == 0
    assert _segments() == before
    _assert_none_left(str(tmp_path))


@pytest.mark.xdist_group("distrun_join")          # (conftest's distrun_join_plain: one torchrun job for both)
def test_uneven_inputs_under_join_the_rank_out_of_inputs_leaves_the_agreement(tmp_path, distrun_join_plain):
    """Rank 0 runs out of inputs after 5 steps and shadows rank 1's
    collectives inside Join (no step end of its own) while rank 1 trains 3
    more steps.  Rank 1 waited for it at its step end 5 for good (the job
    hung: rank 0 in Join's all_reduce, rank 1 in the agreement); now rank 0
    leaves the agreement, rank 1 says so once, 'break step 6' stops rank 1
    (rank 0 named where it waits), and the job ends with torchrun's results."""
    script = _copy(tmp_path, "distrun_join.py")
    plain = distrun_join_plain
    want = _digests(plain.stdout)
    losses = set(re.findall(r"rank 1 step 6 loss \S+", plain.stdout))
    p, master, expect = _on_terminal(tmp_path, script)
    cmd = _commands(master, expect)
    try:
        expect("(nndb r0) ", timeout=150)
        cmd("break step 6")
        out = cmd("continue")
        assert ("nndb: the all-stop agreement across ranks is broken at step 5 (rank 0 left it: it waits in a "
                "collective of the script short of this step end") in out, out
        assert "Breakpoint 1, step 6 finished" in out, out
        assert "nndb: rank 0 did not stop: it waits in torch.distributed.all_reduce" in out, out
        assert "nndb: 1 of 2 rank(s) stopped: r1" in out, out
        out = cmd("p --ranks all $step")
        assert re.search(r"^r1\s+6\s*$", out, re.M) and re.search(r"^r0\s+rank 0 is not at a stop", out, re.M), out
        os.write(master, b"continue\n")
        out = expect("nndb: the job ended (exit code 0)").replace("\r", "")
        assert _digests(out) == want and sorted(want) == [0, 1], out
        assert set(re.findall(r"rank 1 step 6 loss \S+", out)) == losses, out
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
        os.close(master)
    assert p.returncode == 0
    _assert_none_left(str(tmp_path))


def test_quit_with_a_rank_held_in_ddps_all_reduce_ends_the_job_as_quit(tmp_path):
    """A module breakpoint on rank 1 leaves rank 0 held in DDP's all-reduce
    inside backward; 'quit' there ended rank 1 first, which broke rank 0's
    collective: 'nndb: rank 0 failed: exit code 1 (RuntimeError: ...
    Connection closed by peer); its traceback is above', rank 0's trace
    "failed" and the job's exit code 1.  Now the held rank is ended first
    from its helper thread: the job ends as a quit (exit code 0), every
    trace "killed", nothing left running."""
    from test_distributed_run import _metas
    script = _copy(tmp_path, "distrun_ddp_mlp.py")
    p, master, expect = _on_terminal(tmp_path, script)
    cmd = _commands(master, expect)
    try:
        expect("(nndb r0) ", timeout=150)
        cmd("break step 1")
        out = cmd("continue")
        assert "nndb: all 2 rank(s) stopped at the end of step 1" in out, out
        cmd("delete")
        assert "Breakpoint" in cmd("break module module.0 rank 1")
        out = cmd("continue")
        assert "nndb: rank 0 did not stop: it waits in" in out and "autograd's backward" in out, out
        assert "nndb: 1 of 2 rank(s) stopped: r1" in out, out
        os.write(master, b"quit\n")
        out = expect("nndb: the job ended (exit code 0)").replace("\r", "")
        assert "failed" not in out and "Traceback" not in out, out
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
        os.close(master)
    assert p.returncode == 0
    (run_dir,) = os.listdir(tmp_path / "nndb-runs")
    for _, end, _ in _metas(tmp_path / "nndb-runs" / run_dir):
        assert end["status"] == "killed" and end["exit_code"] == 0, end
    _assert_none_left(str(tmp_path))
