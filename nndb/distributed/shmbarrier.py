"""The all-stop agreement's barrier when every rank is on one machine: a
small shared-memory segment instead of a collective (nndb.distributed.allstop).

Layout (one file in /dev/shm, mapped by every rank, unlinked as soon as
every rank has it mapped, so nothing is left behind): a 64-byte header
(magic, world size), then one 64-byte line a rank (so no two ranks write
one cache line): [pid, slot 0, slot 1].  At its n-th step end a rank
writes ``(n << 1) | wants`` into slot ``n & 1`` of its line, in one aligned
8-byte store, then waits until every other rank's slot ``n & 1`` holds call
n, and ORs their wants.  Two slots, not one: a rank that has passed call n
may write call n+1 before a slower rank has read call n (it cannot get to
n+2: that needs the slower rank's n+1), so call n's word is never
overwritten while someone may still read it, and a word of an older call
(n-2, or the empty 0) is never taken for call n.

Waiting: spin briefly with ``os.sched_yield`` (the ranks come nearly
together: DDP's gradient all-reduce has just lined them up), then sleep
50 us at a time for the first 20 ms (a machine whose cores are all busy
training must not lose one to a waiting rank, and what the early rank
oversleeps the job loses at its next collective), then sleep longer, the
interval doubling to 20 ms (a rank at a prompt inside a step, a hang).  Every ~0.1 s of waiting
the waiting rank checks that the ranks it waits for still live (their
pids); one that ended breaks the barrier (``BarrierBroken``).  A rank
stopped at a prompt inside a step is alive: the others wait for it, as
they would in any collective.  Plain Python: a KeyboardInterrupt (Ctrl-C,
the front's abort) ends the wait.  No torch here.

A rank can also leave the barrier for good (``leave``): it writes LEFT
into both its slots, and a rank that waits for it, or comes to wait for
it later, breaks the barrier (``BarrierBroken``) instead of waiting for a
step end that will not come.  nndb.distributed.allstop does it for a rank
held in one of the script's collectives while another rank waits for it
here (``peer_ahead``): the rank out of inputs under torch's ``Join``,
which shadows the others' collectives from outside any step.
"""
from __future__ import annotations

import mmap
import os
import secrets
import time
from typing import Optional

from ..run.preload import alive

MAGIC = 0x6E6E6462_61677231        # "nndbagr1"
_LINE = 64
_WORDS = _LINE // 8
SPIN_S = 50e-6                      # (spin with sched_yield this long, then sleep)
SHORT_SLEEP_S = 50e-6               # (sleeps while the wait is short: what a rank oversleeps, the job loses
SHORT_WAIT_S = 20e-3                #  at its next collective, so the early rank wakes within ~0.1 ms ...)
LONG_SLEEP_CAP_S = 20e-3            # (... then doubling to this: a rank at a prompt, a hang)
LIVENESS_EVERY_S = 0.1
SHM_DIR = "/dev/shm"
LEFT = 1 << 61                      # (a slot's call number once its rank has left the barrier)


class BarrierBroken(Exception):
    """A rank the barrier waits for has ended (or the segment is not shared)."""


def segment_size(world: int) -> int:
    return _LINE * (1 + world)


def create(world: int, directory: Optional[str] = None) -> str:
    """A new segment for ``world`` ranks (a fresh random name, mode 0600), in
    ``directory`` (default SHM_DIR: a tmpfs of this machine's own, never a
    shared file system, whose mappings would not be coherent): its path."""
    path = os.path.join(directory or SHM_DIR, f"nndb-allstop-{os.getuid()}-{secrets.token_hex(16)}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, segment_size(world))
        with mmap.mmap(fd, segment_size(world)) as m:
            words = memoryview(m).cast("q")
            words[1] = world
            words[0] = MAGIC
            words.release()
    finally:
        os.close(fd)
    return path


class ShmBarrier:
    """Rank ``rank`` of ``world`` on the segment at ``path`` (made by ``create``)."""

    def __init__(self, path: str, rank: int, world: int):
        fd = os.open(path, os.O_RDWR)
        try:
            if os.fstat(fd).st_size != segment_size(world):
                raise BarrierBroken(f"{path} is not a segment for {world} ranks")
            self._map = mmap.mmap(fd, segment_size(world))
        finally:
            os.close(fd)
        self._words = memoryview(self._map).cast("q")
        if self._words[0] != MAGIC or self._words[1] != world:
            self.close()
            raise BarrierBroken(f"{path} is not an nndb all-stop segment for {world} ranks")
        self.rank, self.world, self.calls = rank, world, 0
        self.left: Optional[str] = None     # (why this rank left the barrier: ``leave``)
        self._words[self._at(rank)] = os.getpid()

    @staticmethod
    def _at(rank: int, word: int = 0) -> int:
        return (1 + rank) * _WORDS + word

    def pids(self) -> list:
        return [self._words[self._at(r)] for r in range(self.world)]

    def peers_visible(self) -> bool:
        """Every rank has written its pid here and this process can see it
        running (a segment that is not really shared, or ranks in other pid
        namespaces, fail: then the agreement takes the collective instead)."""
        return all(pid > 0 and alive(pid) for pid in self.pids())

    def agree(self, wants: bool) -> bool:
        """This rank's next step end: does any rank want to stop there?
        Waits for every rank to come; BarrierBroken if one has ended."""
        if self.left is not None:
            raise BarrierBroken(self.left)
        self.calls += 1
        n, slot = self.calls, 1 + (self.calls & 1)
        words = self._words
        words[self._at(self.rank, slot)] = (n << 1) | (1 if wants else 0)
        anyone = bool(wants)
        pending = [self._at(r, slot) for r in range(self.world) if r != self.rank]
        start = time.perf_counter()
        sleep, check = SHORT_SLEEP_S, start + LIVENESS_EVERY_S
        while True:
            still = []
            for at in pending:
                word = words[at]
                if word >> 1 == n:
                    anyone = anyone or bool(word & 1)
                elif word >> 1 == LEFT:
                    raise BarrierBroken(f"rank {at // _WORDS - 1} left it: it waits in a collective of the "
                                        f"script short of this step end (a rank out of inputs under Join, "
                                        f"or ranks whose collectives differ)")
                elif word >> 1 > n:
                    raise BarrierBroken(f"rank {at // _WORDS - 1} is at step end {word >> 1}, "
                                        f"this rank at {n}: the ranks' step ends differ")
                else:
                    still.append(at)
            if not still:
                return anyone
            if self.left is not None:
                raise BarrierBroken(self.left)
            pending = still
            now = time.perf_counter()
            if now - start < SPIN_S:
                os.sched_yield()
                continue
            if now > check:
                self._check_alive(pending)
                check = now + LIVENESS_EVERY_S
            sleep = SHORT_SLEEP_S if now - start < SHORT_WAIT_S else min(LONG_SLEEP_CAP_S, sleep * 2)
            time.sleep(sleep)

    def peer_ahead(self) -> bool:
        """Does another rank wait at a step end this rank has not reached
        (its word of a call past this rank's calls)?"""
        for r in range(self.world):
            if r != self.rank:
                for slot in (1, 2):
                    n = self._words[self._at(r, slot)] >> 1
                    if self.calls < n < LEFT:
                        return True
        return False

    def leave(self, why: str) -> None:
        """Leave the barrier for good: the ranks that wait for this one, or
        come to, break it; this rank's next ``agree`` raises ``why``."""
        self.left = why
        for slot in (1, 2):
            self._words[self._at(self.rank, slot)] = LEFT << 1

    def _check_alive(self, pending: list) -> None:
        for at in pending:
            rank = at // _WORDS - 1
            pid = self._words[self._at(rank)]
            if not alive(pid):
                raise BarrierBroken(f"rank {rank} (pid {pid}) has ended")

    def close(self) -> None:
        try:
            self._words.release()
            self._map.close()
        except (BufferError, ValueError):
            pass


def remove(path: Optional[str]) -> None:
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass
