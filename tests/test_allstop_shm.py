"""The all-stop agreement's shared-memory barrier (nndb.distributed.shmbarrier)
and its use by nndb.distributed.allstop, in threads and processes (no torch job:
the job's end-to-end tests are in test_distributed_run.py and
test_allstop_job.py)."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time

import pytest

from nndb.distributed import shmbarrier
from nndb.distributed.allstop import StepAgreement
from nndb.distributed.shmbarrier import BarrierBroken, ShmBarrier

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def segment(tmp_path):
    def make(world=2):
        return shmbarrier.create(world, str(tmp_path))
    return make


def _in_thread(fn, *args):
    box = {}

    def run():
        try:
            box["value"] = fn(*args)
        except BaseException as e:      # (handed to the test)
            box["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def test_two_ranks_agree_on_every_step_end_and_or_their_wants(segment):
    """1000 step ends in two threads, each rank wanting to stop at random
    ones: both get the OR of that very step end's wants, every time (the
    threads drift up to a step apart: the other slot holds the next call)."""
    path = segment()
    rng = random.Random(7)
    wants = [(rng.random() < 0.2, rng.random() < 0.2) for _ in range(1000)]
    got = {0: [], 1: []}

    def rank(r):
        b = ShmBarrier(path, r, 2)
        for w in wants:
            got[r].append(b.agree(w[r]))
            if rng.random() < 0.01:
                time.sleep(0.001)
    threads = [_in_thread(rank, r) for r in (0, 1)]
    for t, box in threads:
        t.join(60)
        assert not t.is_alive() and "error" not in box, box
    expected = [a or b for a, b in wants]
    assert got[0] == expected and got[1] == expected
    assert 0 < sum(expected) < len(expected)


def test_a_stale_slot_is_never_read_as_the_current_step_end(segment):
    """Rank 1 wanted to stop at call 1; at call 2 rank 0 waits for rank 1's
    call 2 (the word of call 1, or of no call, is not it) and does not take
    call 1's wants for call 2's."""
    path = segment()
    b0, b1 = ShmBarrier(path, 0, 2), ShmBarrier(path, 1, 2)
    t, box = _in_thread(b1.agree, True)
    assert b0.agree(False) is True
    t.join(5)
    assert box == {"value": True}
    t, box = _in_thread(b0.agree, False)            # call 2: rank 1 has not come
    time.sleep(0.3)
    assert t.is_alive() and box == {}
    assert b1.agree(False) is False
    t.join(5)
    assert box == {"value": False}
    b1.calls += 4                                    # (a rank that skipped step ends: said, not hidden)
    t, box = _in_thread(b1.agree, False)             # (its call 7 against rank 0's call 3)
    time.sleep(0.05)
    with pytest.raises(BarrierBroken, match="rank 1 is at step end 7, this rank at 3"):
        b0.agree(False)
    b0._words[b0._at(0, 2)] = 9 << 1                 # (lets rank 1's thread end the same way)
    t.join(5)
    assert isinstance(box.get("error"), BarrierBroken)


_PEER = """
import sys
sys.path.insert(0, {root!r})
from nndb.distributed.shmbarrier import ShmBarrier
b = ShmBarrier({path!r}, 1, 2)
print(b.agree(True), flush=True)
sys.stdin.readline()              # (alive until rank 0 has looked at its pid)
"""


def test_two_processes_agree_and_a_dead_peer_breaks_the_barrier(segment):
    """A second process agrees on call 1 (its wants reach rank 0), then
    ends; rank 0's call 2 finds it gone (a zombie not yet reaped counts as
    gone) within a few tenths of a second and says which rank."""
    path = segment()
    b0 = ShmBarrier(path, 0, 2)
    p = subprocess.Popen([sys.executable, "-c", _PEER.format(root=ROOT, path=path)], stdout=subprocess.PIPE,
                         stdin=subprocess.PIPE, text=True)
    try:
        assert b0.agree(False) is True
        assert p.stdout.readline().strip() == "True"
        assert b0.peers_visible()
        p.stdin.close()                               # (the peer ends now)
        while p.poll() is None and shmbarrier.alive(p.pid):
            time.sleep(0.01)
        t = time.monotonic()
        with pytest.raises(BarrierBroken, match=rf"rank 1 \(pid {p.pid}\) has ended"):
            b0.agree(False)
        assert time.monotonic() - t < 2
    finally:
        p.wait(10)


class _Session:
    def __init__(self):
        self.errors = []

    def error(self, text):
        self.errors.append(text)


def test_a_broken_agreement_is_said_once_and_the_rank_goes_its_own_way(segment):
    path = segment()
    agreement = StepAgreement()
    agreement.group = object()                       # (made: the barrier below is its transport)
    agreement.barrier = ShmBarrier(path, 0, 2)
    peer = ShmBarrier(path, 1, 2)
    peer._words[peer._at(1)] = 2 ** 22 + 12345       # (rank 1's pid: no such process)
    assert not shmbarrier.alive(2 ** 22 + 12345)
    session = _Session()
    assert agreement.agree(session, 3, None) is None
    assert agreement.agree(session, 4, "own stop") == "own stop"
    agreement.request_stop()
    stop = agreement.agree(session, 5, None)
    assert stop is not None and stop.kind == "interrupt"
    assert session.errors == ["nndb: the all-stop agreement across ranks is broken at step 3 (rank 1 "
                              f"(pid {2 ** 22 + 12345}) has ended); this rank stops on its own from here"]
    assert agreement.barrier is None


def test_a_segment_not_for_this_job_is_refused(segment, tmp_path):
    path = segment(2)
    with pytest.raises(BarrierBroken):
        ShmBarrier(path, 0, 3)
    other = tmp_path / "other"
    other.write_bytes(b"\0" * shmbarrier.segment_size(2))
    with pytest.raises(BarrierBroken):
        ShmBarrier(str(other), 0, 2)


def _two_ranks(rank, port, out):
    import json

    import torch.distributed as dist

    from nndb.distributed import allstop
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    seen = {}
    a = allstop.StepAgreement()
    seen["auto"] = [a.wants(rank == 1), a.wants(False), a.wants(rank == 0), a.kind]
    if rank == 1:                       # (rank 1 cannot map rank 0's segment: every rank takes the collective)
        def refuse(*args):
            raise OSError("not shared")
        allstop.shmbarrier.ShmBarrier = refuse
    b = allstop.StepAgreement()
    seen["refused"] = [b.wants(rank == 1), b.wants(False), b.kind]
    with open(f"{out}.{rank}", "w") as fh:
        json.dump(seen, fh)
    dist.destroy_process_group()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm: the collective only")
def test_the_job_agrees_in_shared_memory_or_every_rank_takes_the_collective(tmp_path):
    """Two gloo ranks: the agreement is made in shared memory (rank 0's
    segment, unlinked once mapped); where one rank cannot map it, both use
    the gloo all_reduce; the answers are the OR either way."""
    import glob
    import json
    import socket

    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    before = set(glob.glob(f"/dev/shm/nndb-allstop-{os.getuid()}-*"))
    out = str(tmp_path / "seen")
    mp.spawn(_two_ranks, args=(port, out), nprocs=2, join=True)
    for rank in (0, 1):
        with open(f"{out}.{rank}") as fh:
            seen = json.load(fh)
        assert seen == {"auto": [True, False, True, "shared memory"], "refused": [True, False, "gloo"]}
    # Nothing of this job's is left.  (A job of a test on the other worker
    # may hold a segment for a moment, between making it and unlinking it
    # once mapped: a new name must be gone within a few seconds, as theirs
    # are; one of this job's would stay.)
    import time
    deadline = time.monotonic() + 10
    while set(glob.glob(f"/dev/shm/nndb-allstop-{os.getuid()}-*")) - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert set(glob.glob(f"/dev/shm/nndb-allstop-{os.getuid()}-*")) - before == set()


def test_a_rank_that_leaves_breaks_the_wait_of_the_others_and_its_own_next(segment):
    """Rank 1 held short of the step end rank 0 waits at (out of inputs
    under Join) leaves the barrier: rank 0's wait ends at once with why,
    rank 1's next step end raises its own reason, and a step end rank 0
    comes to later is broken too (it never waits for a rank that left)."""
    path = segment()
    b0, b1 = ShmBarrier(path, 0, 2), ShmBarrier(path, 1, 2)
    t, box = _in_thread(b0.agree, True)
    deadline = time.monotonic() + 10
    while not b1.peer_ahead() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert b1.peer_ahead() and not b0.peer_ahead()
    b1.leave("held in Join")
    t.join(10)
    assert isinstance(box.get("error"), BarrierBroken), box
    assert "rank 1 left it: it waits in a collective of the script short of this step end" in str(box["error"])
    with pytest.raises(BarrierBroken, match="held in Join"):
        b1.agree(False)
    with pytest.raises(BarrierBroken, match="rank 1 left it"):
        b0.agree(False)
    assert not b0.peer_ahead()                  # (a rank that left is ahead of no one)


def test_a_broken_agreement_waits_on_no_transport_afterwards(segment, monkeypatch):
    """Once broken (a rank left), the agreement takes no collective either:
    a rank that would wait in nndb's gloo group for a peer held in Join
    would hang the job again (it did: the shared memory closed, the next
    step end took the gloo all_reduce)."""
    import torch.distributed as dist
    taken = []
    monkeypatch.setattr(dist, "all_reduce", lambda *a, **k: taken.append(a))
    path = segment()
    agreement = StepAgreement()
    agreement.group = object()                  # (a collective on it would raise: not taken)
    agreement.barrier = ShmBarrier(path, 0, 2)
    ShmBarrier(path, 1, 2).leave("held")
    session = _Session()
    assert agreement.agree(session, 5, None) is None
    assert agreement.agree(session, 6, None) is None and agreement.agree(session, 7, "own") == "own"
    assert len(session.errors) == 1 and "rank 1 left it" in session.errors[0], session.errors
    assert taken == []
