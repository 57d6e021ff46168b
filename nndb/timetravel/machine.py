"""The time machine of the live run: checkpoints as the run goes, and the
replicas built from them for reverse execution, scans and predictions.

It lives in the session (``session.machine``).  In the live process it takes
checkpoints at step ends (``at_step_end``), and a command that travels sends
a checkpoint its orders, then waits while the replica has the terminal, and
takes back the session state when the replica hands it back.  In a replica
(``self.replica``) it takes no checkpoints: travelling hands the terminal
back to the live process with the order instead, so all checkpoints stay
owned by one process.

Why this size: it is one object, the live run's side of time travel, whose
parts share its checkpoints and their costs: taking them (the schedule's
cadence), dropping them (the schedule's eviction and the memory cap, which
must agree on what is kept), and handing the terminal to a replica and back
(with the changes made at the prompt and the file survey that go with each
travel).  Splitting it by line count would put one invariant (what is kept)
in two places.
"""
from __future__ import annotations

import collections
import contextlib
import os
import signal
import time
from dataclasses import dataclass
from typing import Optional

from ..errors import CommandError
from ..run import safepath
from . import forking, sandbox
from .respawn import spawn
from .search import recorded_losses
from .channel import Channel
from .schedule import BUDGET, Adaptive, DiskSchedule, Settling, make_policy, regular_excess, replay_bound


@dataclass
class Checkpoint:
    number: int
    step: int
    pid: int
    chan: Channel
    kind: str              # auto | stop | manual
    taken_at: float
    cost_s: float
    changes: int = 0       # how many of the session's changes (made at the prompt) it holds
    # taken as a later stage's optimizer took the step over (StepClock.handovers), closed after the
    # fact inside the next step's first optimizer step: a start for replays of the steps after
    # it, never its step's own end (a forked replica told of the handover ends it where it ended)
    late: bool = False


def files_note(msg: dict) -> str:
    """What a replica's message says of the user's files, for the line after
    it: its writes that went to scratch copies, and that the files compared
    are as they were (only when they are: ``TimeMachine.watching_files``)."""
    writes, seen = msg.get("scratch_writes"), msg.get("files") or {}
    note = f"; its {writes} file write(s) went to scratch copies" if writes else ""
    if writes and seen.get("where") and not seen.get("changed"):
        note += f", your files under {seen['where']} are as they were" + (
            "" if seen.get("complete") else f" (the first {sandbox.Survey.LIMIT} compared)")
    return note


def present_step(s) -> Optional[int]:
    """The step the live run is stopped in, as ``$step`` reads it there: the step that
    finished at a step end, the step running at a stop inside one (a module's call)."""
    stop = s.here.stop
    if stop is None or stop.at_step_end or stop.step is None:
        return s.last_step
    return stop.step


def _none_at_or_before(step: int) -> str:
    """Why a replay from after ``step`` (-1: the run's start, to replay step 0) has no checkpoint
    to start from.  (Step 0's replay, a catch point's at a NaN in the first step, said 'no
    checkpoint at or before step -1'.)"""
    return "no checkpoint before step 0" if step < 0 else f"no checkpoint at or before step {step}"


def _size(kib: int) -> str:
    return f"{kib / 1024:.1f} MiB" if kib >= 1024 else f"{kib} KiB"


def default_memory_kib() -> Optional[int]:
    """A quarter of the memory available at start (None where /proc/meminfo is not there)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) // 4
    except (OSError, ValueError, IndexError):
        pass
    return None


def parse_size(text: str) -> int:
    """``--checkpoint-memory``: 512M, 2G, 300000K or 25% (of the memory available now) -> KiB."""
    t = text.strip().upper().removesuffix("B")
    try:
        if t.endswith("%"):
            avail = default_memory_kib()
            pct = float(t[:-1])
            if avail is not None and 0 < pct <= 100:
                return int(avail * 4 * pct / 100)
        else:
            mult = {"K": 1, "M": 1024, "G": 1024 ** 2, "T": 1024 ** 3}.get(t[-1:], None)
            value = float(t[:-1]) if mult else float(t) / 1024
            if value > 0:
                return int(value * (mult or 1))
    except ValueError:
        pass
    raise ValueError(f"--checkpoint-memory takes a size (512M, 2G) or a share of the memory (25%), not '{text}'")


class TimeMachine:
    """The live run's side of time travel (the module's docstring says how it works).

    Why this size: as the module's: one object whose parts share the
    checkpoints and their costs (the schedule, the eviction and the memory
    cap, the disk copies, the travels and their timelines)."""

    def __init__(self, replica_mode: str = "auto", total_steps: Optional[int] = None,
                 budget: float = BUDGET, max_live: int = 20, disk: bool = True, rules_spec: str = "default",
                 lineage_spec: Optional[str] = None, every: Optional[str] = None,
                 memory_kib: Optional[int] = None):
        self.mode = replica_mode          # auto | fork | respawn | off
        # (the user's files modified since then are read by a replica as they are now: a drift names them)
        self.started = time.time()
        self.start_files: Optional[sandbox.Survey] = None     # (the user's files as the run started: attach)
        self.off_reason = "--replica off"  # why, when off (nndb.set_trace: a process nndb did not start)
        self.total_steps = total_steps
        self.every = every                # --checkpoint-every N|Ns
        # --checkpoint-memory: the memory (PSS) all checkpoints may hold
        self.memory_kib = memory_kib if memory_kib is not None else default_memory_kib()
        self.budget = budget
        self.max_live = max_live
        self.disk = disk
        self.rules_spec = rules_spec      # (a respawned replica builds its session from these)
        self.lineage_spec = lineage_spec
        self.replica = False              # this process is a replica
        self.timeline = 0                 # the timeline this process is on
        self.changed = False              # a replica: something was changed here
        self.timelines: list = [{"id": 0, "origin": "the live run", "change": "", "status": "present"}]
        # the files replays read as they are now (sandbox.Sandbox.stale) said since the live run's stop
        self.stale_told: set = set()
        self._reset()

    def _reset(self) -> None:
        self.checkpoints: dict = {}
        self._next = 1
        self.policy = make_policy(self.total_steps, self.budget, self.max_live, self.every)
        self.disk_schedule = DiskSchedule(self.total_steps)
        self.disk_files: list = []
        self._disk_warned: set = set()
        self.blocked: Optional[str] = None    # why fork checkpoints are off in this run
        self._told_blocked: Optional[str] = None   # the ``blocked`` a travel has said in full
        self.exact, self.exact_why = True, ""
        self.taken = 0
        self.ticks = 0                    # the schedule's ticks where fork checkpoints are off (disk alone)
        self.step_times = collections.deque(maxlen=50)   # recent step durations (s)
        self._last_end: Optional[float] = None
        self._paused = 0.0                # seconds at the prompt: not the run's time
        self.evicted_for_memory = 0
        self._said: set = set()          # the kinds of checkpoint dropped for memory, said once a run
        # A fork's cost comes mostly after it (copy-on-write): schedule.Settling,
        # with the regular excess of the steps timed since the last window (_since_*).
        self._settling: Optional[Settling] = None
        self._since_sum, self._since_n = 0.0, 0
        self._preflush: Optional[float] = None      # when the writer was asked to write ahead of a fork
        self._tail_warned = False                   # tail_warning said at a prompt (once a run)

    # -- the run's lifetime --------------------------------------------------------------
    def attach(self, s) -> None:
        if self.replica:
            return
        self.close()
        self._reset()
        if self.mode in ("auto", "fork"):
            self.exact, self.exact_why = forking.exactness()
        # The user's files as the run starts: a replay from the start does not find those made
        # since (sandbox.Sandbox.hide).  Not where no replay can respawn.
        self.start_files = self._survey(s) if self.mode in ("auto", "respawn") else None

    @staticmethod
    def _survey(s) -> "sandbox.Survey":
        """A survey of the user's files: under the script's directory and the working
        directory, nndb's trace and its checkpoints left out, and the files the front end
        writes (the prompt's history, which a command typed in the past is added to: run
        from the home directory, every travel back said "home/.nndb_history (changed)" was
        written past the replica's scratch copies)."""
        t = getattr(s.rec, "target", None)
        script = getattr(t, "path", None)
        roots = [os.path.dirname(os.path.abspath(script)) if script else None, os.getcwd()]
        from .disk import directory_for
        trace = s.log.trace_path
        own = tuple(getattr(s.frontend, "own_files", ()))
        return sandbox.Survey(roots, skip=((trace, directory_for(trace)) if trace else ()) + own)

    def close(self) -> None:
        for ck in list(self.checkpoints.values()):
            self._drop(ck)

    def _drop(self, ck: Checkpoint) -> None:
        self.checkpoints.pop(ck.number, None)
        ck.chan.send({"op": "exit"})
        ck.chan.close()
        forking.reap(ck.pid)

    # -- taking checkpoints (the live run) ------------------------------------------------
    SETTLE = 2
    # Copy-on-write goes on for a while after a fork: ~100 steps (1.2 s) on the
    # bench's CNN (docs/performance.md).  Without a median yet (the first checkpoint), SETTLE steps.
    SETTLE_S = 1.0

    def clock(self) -> float:
        """The run's clock: monotonic time less the time spent at the prompt,
        so a pause is never a step's time nor a checkpoint's cost."""
        return time.monotonic() - self._paused

    def paused(self, seconds: float) -> None:
        """The run waited ``seconds`` at a stop (the prompt, its commands)."""
        self._paused += max(0.0, seconds)

    def at_step_end(self, s, step: int) -> None:
        now = time.monotonic() - self._paused         # (self.clock(), inline: every step)
        if self._last_end is not None:
            took = now - self._last_end
            if self._settling is not None:
                self._settle(took, now)
            else:
                self.step_times.append(took)
                self._since_sum, self._since_n = self._since_sum + took, self._since_n + 1
        self._last_end = now
        if self.replica or self._settling is not None:
            return
        if self.mode not in ("auto", "fork") or self.blocked:
            if self.disk and self.mode != "off" and self.policy.due(step, now):
                self._tick_disk_alone(s, step, now)
            return
        if self.policy.due(step, now) and self._writer_ready(s.rec.writer, now):
            self.take(s, step, "auto")
        self._last_end = self.clock()         # (the checkpoint's cost is not a step's)

    # A checkpoint writes the trace's buffers before its fork.  On the adaptive schedule, with
    # PREFLUSH_STEPS or more waiting, the writer's thread writes them first (the fork waits
    # for it, PREFLUSH_WAIT_S at most): 345 steps in the training thread were 27 ms of 64.
    PREFLUSH_STEPS = 32
    PREFLUSH_WAIT_S = 0.5

    def _writer_ready(self, writer, now: float) -> bool:
        if type(self.policy) is not Adaptive:
            return True                  # (a schedule of steps: taken at the step it names)
        if self._preflush is None:
            if not writer.start_flush(self.PREFLUSH_STEPS):
                return True
            self._preflush = now
        if writer.busy and now - self._preflush < self.PREFLUSH_WAIT_S:
            return False
        self._preflush = None
        return True

    def _settle(self, took: float, now: float) -> None:
        st = self._settling
        ck = st.checkpoint
        cost = st.step(took, now)
        if cost is None:
            if ck.number in self.checkpoints:
                return
            cost = st.so_far()                      # (dropped meanwhile: what it cost until now)
        self._settling = None
        ck.cost_s = cost
        self.policy.taken(ck.step, cost, now)

    STOP_KEEP = 10          # checkpoints taken at stops: the most recent are kept

    def take(self, s, step: int, kind: str):
        """Fork a checkpoint of this process at the end of ``step``.  Returns the
        Checkpoint; in a replica resumed from it, returns "replica"."""
        why = forking.blockers()
        if why:                              # (said when someone travels: a plain run stays quiet)
            self.blocked = f"no fork checkpoints from step {step} on: " + "; ".join(why)
            return None
        t0 = time.perf_counter()
        s.flush_rules()                      # a replica resumed from here starts with every step judged
        s.rec.writer.flush()                 # the replica's copy of the trace file has nothing unwritten
        parent_end, child_end = Channel.pair()
        pid = forking.fork(close=tuple(c.chan for c in self.checkpoints.values()) + (parent_end,))
        if pid == 0:
            msg = forking.checkpoint_loop(child_end)     # returns in a replica only
            self._become_replica(s, msg, child_end)
            return "replica"
        child_end.close()
        cost = time.perf_counter() - t0
        ck = Checkpoint(self._next, step, pid, parent_end, kind, time.time(), cost, len(s.log.changes),
                        step in s.rec.tracer.clock.handovers)
        self._next += 1
        self.checkpoints[ck.number] = ck
        self.taken += 1
        if kind == "auto":
            if self.disk and self.disk_schedule.due(step, self.taken, self.clock()):
                cost += self._save_disk(s, step, self.taken)   # (the schedule pays for the disk copy too)
                ck.cost_s = cost
            now = self.clock()
            self.policy.taken(step, cost, now)
            # (a fixed --checkpoint-every schedule needs no cost)
            if type(self.policy) is Adaptive:
                median = self.step_time()
                self._settling = Settling(ck, cost, self.SETTLE, now + self.SETTLE_S, median,
                                          regular_excess(median, self._since_sum, self._since_n))
            self._since_sum, self._since_n = 0.0, 0
            autos = sorted(c.step for c in self.checkpoints.values() if c.kind == "auto")
            drop = set(self.policy.evict(autos))
            for c in list(self.checkpoints.values()):
                if c.kind == "auto" and c.step in drop:
                    self._drop(c)
        elif kind == "stop":
            stops = sorted((c for c in self.checkpoints.values() if c.kind == "stop"), key=lambda c: c.number)
            for c in stops[:-self.STOP_KEEP]:
                self._drop(c)
        self._keep_within_memory(s)
        return ck if ck.number in self.checkpoints else None

    def _keep_within_memory(self, s=None) -> None:
        """Over --checkpoint-memory, checkpoints go until the rest fit:
        automatic ones first (the one whose loss leaves the smallest gap
        for its age, then the older of the last two), then those taken at stops, then the
        user's own (oldest first).  One that is not automatic, or the first
        automatic one the cap cannot hold at all, is said at once to ``s``."""
        if not self.memory_kib:
            return
        # (a checkpoint's PSS is at most its resident size, which costs
        # nothing to read; its PSS costs a walk of its pages: 8-10 ms for the
        # bench MLP's 330 MB, in the training thread)
        resident = [forking.resident_kib(c.pid) for c in self.checkpoints.values()]
        if None not in resident and sum(resident) <= self.memory_kib:
            return
        while self.checkpoints:
            used = sum((forking.memory_kib(c.pid) or {}).get("pss", 0) for c in self.checkpoints.values())
            if used <= self.memory_kib:
                return
            victim = self._memory_victim()
            self._drop(victim)
            self.evicted_for_memory += 1
            if s is not None and (victim.kind != "auto" or not self.checkpoints) and victim.kind not in self._said:
                if victim.kind != "manual":
                    self._said.add(victim.kind)        # (automatic ones and stops': said once a run)
                what = {"manual": "", "stop": " (taken at a stop)"}.get(victim.kind, " (automatic)")
                alone = "it alone holds" if not self.checkpoints else "the checkpoints hold"
                s.error(f"nndb: checkpoint {victim.number} of step {victim.step}{what} dropped: {alone} "
                        f"{_size(used)}, over --checkpoint-memory {_size(self.memory_kib)} "
                        f"(raise it to keep more; going back replays from an earlier checkpoint or the start)")

    def _memory_victim(self) -> Checkpoint:
        for kind in ("auto", "stop", "manual"):
            mine = sorted((c for c in self.checkpoints.values() if c.kind == kind), key=lambda c: c.number)
            if not mine:
                continue
            if kind == "auto" and len(mine) > 2:
                drop = set(Adaptive(max_live=len(mine) - 1).evict([c.step for c in mine]))
                return next((c for c in mine if c.step in drop), mine[0])
            return mine[0]
        return next(iter(self.checkpoints.values()))

    def at_stop(self, s, stop):
        """The live run stops at a step end: a checkpoint there makes going back
        to it cheap.  Returns the stop to show (in a replica resumed from it:
        its own, or None to run on)."""
        self.stale_told = set()
        if self.replica or self.mode not in ("auto", "fork") or self.blocked or not s.live:
            return stop
        warning = None if self._tail_warned else self.tail_warning(stop.step)
        if warning:
            self._tail_warned = True
            s.error(warning)
        if any(c.step == stop.step for c in self.checkpoints.values()):
            return stop
        if self.take(s, stop.step, "stop") == "replica":
            return s.replica.arrived(s, stop)
        return stop

    def _tick_disk_alone(self, s, step: int, now: float) -> None:
        """Where no fork checkpoint can be taken (CUDA initialised, DataLoader
        workers, ``--replica respawn``) the schedule's ticks still come, as
        checkpoints that cost nothing; the disk schedule writes at its own
        (every 10% of a known total, else every 8th tick as the 2% budget
        allows).  A replay still starts from step 0 (a new process cannot
        resume a script in its loop); the files are the run's state for the
        user, RNG included (CUDA's too)."""
        self.ticks += 1
        cost = self._save_disk(s, step, self.ticks) if self.disk_schedule.due(step, self.ticks, now) else 0.0
        self.policy.taken(step, cost, now)
        self._last_end = self.clock()         # (the write's cost is not a step's)

    def _save_disk(self, s, step: int, n_taken: int) -> float:
        """Write the checkpoint of ``step`` to disk, delete the files the disk
        schedule no longer keeps; returns what it cost (s)."""
        from . import disk
        t0 = time.perf_counter()
        try:
            mods = {s.rec.naming.module_name(m): m for m in s.view.roots()}
            opts = dict(s.view.optimizers())
            path = disk.save(disk.directory_for(s.log.trace_path), step, mods, opts, disk.capture_rng(),
                             warn=lambda line: self._warn_once(s, line))
            self.disk_files.append((step, path))
            drop = set(self.disk_schedule.evict([st for st, _ in self.disk_files]))
            for st, old in [f for f in self.disk_files if f[0] in drop]:
                os.unlink(old)
            self.disk_files = [f for f in self.disk_files if f[0] not in drop]
        except Exception as e:            # never the run's problem
            s.error(f"nndb: could not write the checkpoint of step {step} to disk: {e}")
            self.disk = False
        cost = time.perf_counter() - t0
        self.disk_schedule.taken(step, n_taken, cost, self.clock())
        return cost

    def _warn_once(self, s, line: str) -> None:
        if line not in self._disk_warned:       # (once a run, not at every checkpoint)
            self._disk_warned.add(line)
            s.error(line)

    def delete(self, number: int) -> Checkpoint:
        ck = self.checkpoints.get(number)
        if ck is None:
            raise CommandError(f"no checkpoint number {number}")
        self._drop(ck)
        return ck

    # -- becoming a replica (in the forked process) ---------------------------------------
    def _become_replica(self, s, msg: dict, chan: Channel) -> None:
        from .roles import make_role
        self.replica = True
        self.checkpoints = {}
        s.rec.writer.detach()
        # (the script's own writes go to scratch copies; its reads of files the live run wrote after the
        # checkpoint are noted: they are the present's)
        sandbox.enter(nndb_files=[s.log.trace_path], since=msg["goal"].get("files_since"))
        self.timeline = int(msg.get("timeline", 0))
        s.restore(msg["state"])
        s.rec.tracer.clock.know(msg["goal"].get("handovers"))     # (a respawned one's: Session.attach)
        role = make_role(msg["goal"], chan)
        s.become_replica(role)
        role.begin(s)
        s.sync_hooks()

    # -- travelling (the live run) ---------------------------------------------------------
    def nearest(self, step: int) -> Optional[Checkpoint]:
        best = None
        for ck in self.checkpoints.values():
            if (ck.step < step or ck.step == step and not ck.late) and (best is None or ck.step > best.step):
                best = ck
        return best

    def replay(self, s, goal: dict, start: int) -> dict:
        """Run a replica that starts at or before step ``start`` with ``goal``;
        returns its last message (the session state is taken back).  The
        replica makes the changes made at the live run's prompt since its
        checkpoint again at their steps (nndb.debugger.changes), compares
        every replayed step's loss with the trace's and gives up at the first
        difference (a CommandError here)."""
        ck = self.nearest(start)
        if ck is not None and self.mode != "respawn":
            first = ck.step + 1
            held = ck.changes
        else:
            first, held = 0, 0
        # (the steps a later stage's optimizer took over, known only after the fact: StepClock.know)
        goal = dict(goal, changes=[c.message() for c in s.log.changes[held:]], stale_told=sorted(self.stale_told),
                    handovers=s.rec.tracer.clock.handovers)
        if not goal.get("stats"):             # (replay --verify compares everything itself)
            last = int(goal.get("target", goal.get("end", start)))
            if goal.get("kind") == "goto" and s.last_step is not None:
                # (from its target a goto's replica may run on, `next` or `goto` forward in the
                # past: the recorded steps up to the present are checked as they come too)
                last = max(last, s.last_step)
            goal = dict(goal, expect=recorded_losses(s, first, last))
        if not self.exact and ck is not None and self.mode != "respawn":
            # (a forked replica's threads: a respawned one is a new process, which runs them all;
            # it was warned of before every respawned replay too, cleanrl's under TensorBoard's thread)
            s.error(f"nndb: warning: this replay may not be exact: {self.exact_why}")
            goal = dict(goal, inexact=self.exact_why)        # (a divergence in the last bits names it)
        if ck is None or self.mode == "respawn":
            if self.mode in ("fork", "off"):
                raise CommandError(self._no_checkpoint(start))
            if self.mode == "auto":
                # (why, the first time; after it, that it is so again, as gdb's notices are said once)
                why = (self.blocked if self.blocked != self._told_blocked else
                       "no fork checkpoints in this run ('info checkpoints' says why)") if self.blocked \
                    else _none_at_or_before(start)
                self._told_blocked = self.blocked
                s.error(f"nndb: {why}: replaying from the start in a new process (respawn)")
            goal = dict(goal, replayed_from=None, files_since=self.started)
            with self.watching_files(s) as seen:
                seen["hidden"] = seen.pop("new_since_start", [])
                goal = dict(goal, hidden=seen["hidden"])
                msg = self.wait_for_replica(s, *spawn(s, self, goal))
            return self._checked(self._stale(s, goal, dict(msg, files=seen)))
        goal = dict(goal, replayed_from=ck.step, files_since=ck.taken_at)
        with self.watching_files(s) as seen:
            ck.chan.send({"op": "resume", "goal": goal, "state": s.snapshot(), "timeline": self.timeline})
            msg = self.wait_for_replica(s, ck.chan)
        return self._checked(self._stale(s, goal, dict(msg, files=seen)))

    def _stale(self, s, goal: dict, msg: dict) -> dict:
        """A scan's replica read files the live run rewrote after where it started: said here,
        once a stop (a goto's replica says it itself, as it arrives in the past: Goto.say_stale)."""
        new = [p for p in msg.get("stale_reads") or () if p not in self.stale_told]
        if new and goal.get("kind") != "goto" and msg.get("next") != "diverged":
            s.error(sandbox.stale_note(new, goal.get("replayed_from")))
        self.stale_told.update(new)
        return msg

    @contextlib.contextmanager
    def watching_files(self, s):
        """Around a replica's run: the user's files (the script's directory,
        the working directory) surveyed before and compared after; what the
        replica changed there (a write nndb could not redirect) is said, one
        line.  Yields a dict filled as the replica ends: ``where`` (what was
        compared), ``changed`` ([(path, what)]), ``complete``."""
        survey = self._survey(s)
        seen: dict = {}
        start = self.start_files
        if start is not None and start.roots == survey.roots:
            seen["new_since_start"] = survey.new_since(start)      # (for a replay from the start)
        live = os.getpid()
        try:
            yield seen
        finally:
            if os.getpid() == live:         # (not in a replica forked inside: it goes on with the script)
                changed = survey.changes()
                made = survey.made_dirs(changed)
                changed = [c for c in changed if c[0] not in made]
                seen.pop("new_since_start", None)
                hidden = set(seen.get("hidden") or ())          # (not read by the replay: not named)
                seen.update(where=survey.where(), changed=changed, complete=survey.complete,
                            since_start=[p for p in survey.modified_since(self.started) if p not in hidden])
                if made:
                    s.error(survey.made_report(made))
                if changed:
                    s.error(survey.report(changed))

    @staticmethod
    def _checked(msg: dict) -> dict:
        if msg.get("next") == "diverged":
            files = (msg.get("files") or {}).get("since_start") if msg.get("drift") else None
            if msg.get("drift") and msg.get("stale_reads"):       # (what it did read, where known)
                files = msg["stale_reads"]
            raise CommandError(msg["message"] + sandbox.read_as_now(files))
        return msg

    def _no_checkpoint(self, step: int) -> str:
        if self.mode == "off":
            return self.off_message()
        why = f" ({self.blocked})" if self.blocked else ""
        return f"{_none_at_or_before(step)}{why}"

    def off_message(self) -> str:
        return f"time travel is off in this run ({self.off_reason})"

    def wait_for_replica(self, s, chan: Channel, proc=None, pid: Optional[int] = None) -> dict:
        """Wait for the replica's last message while it has the terminal
        (Ctrl-C and the progress line are the replica's then: roles.Role.progress),
        and take back the session state.  A Ctrl-C the live run got meanwhile (the
        terminal's reaches both; ``kill -INT`` this process's alone) is kept: in
        batch mode it ends the run once the replica is back, as Ctrl-C at a stop's
        commands does (Session.interrupt_at_stop: exit 130; until 2026-12 the
        commands after the interrupted goto ran and the run went on to its end, exit 0)."""
        got = []
        old = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
        try:
            # (SIGTERM ends the replica: ``pid``, a helper forked here, a respawned ``proc``, or the one a
            # checkpoint forks, which it names)
            pids = [p for p in (pid, proc.pid if proc is not None else None) if p is not None]
            with forking.SigtermEnds(*pids) as ends:
                return self._replica_back(s, chan, proc, ends)
        finally:
            signal.signal(signal.SIGINT, old)
            if got:
                s.interrupt_at_stop()

    def _replica_back(self, s, chan: Channel, proc, ends) -> dict:
        last = None
        while True:
            msg = chan.recv()
            if msg is None:
                break
            if msg.get("op") == "replica-started":
                ends.add(int(msg["pid"]))
                continue
            if msg.get("op") in ("handback", "predicted", "fuzzed"):
                last = msg
                if proc is not None:
                    break
            elif msg.get("op") == "replica-exited":
                break
        if proc is not None:
            proc.wait()
            forking.forget_openmp(proc.pid)     # (its Intel OpenMP registration)
            chan.close()
        if last is None and proc is not None and proc.returncode in (safepath.INTERRUPTED, -signal.SIGINT):
            # (Ctrl-C while a respawned replica started, before its session could take it)
            raise CommandError("nndb: interrupted (Ctrl-C); nothing was changed")
        if last is None:
            raise CommandError("nndb: the replica ended without reporting back (it crashed?); "
                               "the live run is unchanged")
        if "state" in last:
            s.restore(last["state"])
        return last

    def travel(self, s, target: int, then: str = "stop", why: str = "", skip: int = 0) -> None:
        """Go to the end of step ``target`` on a replica; come back when it hands
        back, and carry out what it asked for (another goto, quit, run).
        After a hand-back the past it came from is gone: a replay that stops
        then (Ctrl-C, a divergence) says the user is in the present."""
        from_past = False
        while True:
            t0 = time.perf_counter()
            # (present: the live run's last finished step, where the recorded past ends; after the
            # script's own end ("ended": it finished, or raised) it runs on to that end, as the run
            # did; a run that Ctrl-C, SIGTERM or 'kill' ended has no past after its last step)
            ended = not s.live and getattr(s.control, "ended", None) in ("finished", "failed")
            goal = {"kind": "goto", "target": target, "then": then, "why": why, "skip": skip, "present": s.last_step,
                    "ended": ended, "present_inside": present_step(s) != s.last_step}
            if from_past:
                goal["ctrl_c"] = f"takes you to the present (step {present_step(s)})"
            with self._in_the_present_if(from_past, s):
                msg = self.replay(s, goal, target)
            nxt = msg.get("next")
            if nxt == "goto":
                target, then, why, skip = int(msg["target"]), msg.get("then", "stop"), msg.get("why", ""), 0
                from_past = True
                continue
            if nxt == "rc":
                from .search import reverse_continue_target
                floor = msg.get("floor")         # (reverse-step N: stopped by a point on the way, or there)
                with self._in_the_present_if(True, s):
                    found = reverse_continue_target(s, self, int(msg["step"]), bool(msg["at_end"]),
                                                    nth=msg.get("nth"),
                                                    **({} if floor is None else {"floor": int(floor),
                                                                                 "what": msg["what"]}))
                if found is not None:
                    target, then, why, skip = found
                    from_past = True
                    continue
                if floor is not None:
                    target, then, why, skip = int(floor), "stop", msg["why"], 0
                    from_past = True
                    continue
                from .search import unsearched
                where = unsearched(s, self)
                if not msg.get("changed"):
                    # (the recorded run's past: where the search started is replayed again, as it was;
                    # inside a step, to its breakpoint from the end of the step before: it sent the
                    # user to the present)
                    target, why, skip = int(msg["step"]), "", 0
                    if msg.get("at_end", True):
                        then = "stop"
                        why = (f"reverse-continue: no earlier step where a breakpoint or watchpoint held{where}; "
                               "back where you were")
                    else:
                        then, skip = "again", msg.get("nth") or 0
                        s.message(f"No earlier step where a breakpoint or watchpoint held{where}; "
                                  "back where you were.")
                    from_past = True
                    continue
                s.message(f"No earlier step where a breakpoint or watchpoint held{where}; the changed timeline was "
                          "left (it cannot be replayed again).")
            if nxt == "failed":                  # (a batch command failed in the past)
                s.batch_failed(msg["message"])
            elif nxt == "quit":
                s.request_quit()
            elif nxt == "run":
                s.request_restart()
            else:
                if msg.get("short") and msg.get("ended") == "failed":
                    # (the replay raised where the run went on: a file the run wrote since, read as it is
                    # now, is a likely cause, ignite's ModelCheckpoint finding its own files in the
                    # directory it requires empty, in a replay respawned from the start)
                    seen = (msg.get("files") or {}).get("since_start")
                    if seen:
                        s.error("nndb: the replay raised where the run went on" + sandbox.read_as_now(seen))
                s.message(f"Back in the present (timeline 0): step {present_step(s)}."
                          f"  ({time.perf_counter() - t0:.2f} s in the past{files_note(msg)})")
                # (the live run's stop again, after the past's: its displays, as at any stop and
                # as the past showed its own)
                s.show_displays()
            return

    @staticmethod
    @contextlib.contextmanager
    def _in_the_present_if(left_the_past: bool, s):
        """A travel that fails after the past handed back ends in the present: its message says so
        (it had said 'nothing was changed' and 'where you were', of a past that was gone)."""
        try:
            yield
        except CommandError as e:
            if not left_the_past:
                raise
            raise CommandError(f"{e}; you are in the present (timeline 0): step {present_step(s)}") from None

    def hand_back(self, s, nxt: str, **extra) -> None:
        """In a replica: give the terminal back to the live run (this process ends)."""
        from .roles import finish
        finish(s.replica.chan, dict({"op": "handback", "next": nxt, "state": s.snapshot()}, **extra))

    # -- timelines -----------------------------------------------------------------------
    def note_change(self, s, what: str) -> None:
        """A replica changed something: from here on it is a timeline of its own."""
        if not self.replica or self.changed:
            return
        self.changed = True
        origin = self.timeline
        self.timeline = len(self.timelines)
        self.timelines.append({"id": self.timeline, "origin": f"step {s.last_step} of timeline {origin}",
                               "change": what, "status": "left"})
        s.message(f"nndb: changing the past starts timeline {self.timeline} "
                  f"(from step {s.last_step} of timeline {origin}); 'present' returns to the live run")

    def where(self, s) -> str:
        """For the prompt and the toolbar: '' in the present."""
        if not self.replica or s.replica is None or s.replica.kind != "goto":
            return ""
        return f"t{self.timeline}" if self.changed else "past"

    # -- the figures for 'info checkpoints' ------------------------------------------------
    def broken_promise(self, present: Optional[int]) -> Optional[str]:
        """Why the adaptive schedule's replay bound does not hold now (the
        largest gap between checkpoints, up to the present, estimated from the
        median step), or None."""
        st = self.step_time()
        if type(self.policy) is not Adaptive or st is None or present is None or self.mode not in ("auto", "fork"):
            return None
        steps = sorted(c.step for c in self.checkpoints.values()) + [present]
        if len(steps) < 2:
            return None
        gap, a, b = max((b - a, a, b) for a, b in zip(steps, steps[1:]))
        start = self.policy._start
        bound = replay_bound(self.clock() - start if start is not None else 0.0)
        if gap * st <= bound:
            return None
        dear = max((c.cost_s for c in self.checkpoints.values() if c.kind == "auto"), default=None)
        why = (f"{self.evicted_for_memory} checkpoint(s) dropped to stay within --checkpoint-memory"
               if self.evicted_for_memory else self.blocked
               or (f"a checkpoint costs up to {dear * 1000:.0f} ms here, and the schedule "
                   f"({self.policy.budget:.0%} of the run time, {self.policy.tail_budget:.0%} near the present) "
                   f"takes one every {self.policy.interval_s:.3g} s"
                   if dear else "checkpoints are slow to take here"))
        return (f"Warning: the schedule does not keep its replay bound ({bound:.3g} s): steps {a} to {b} are "
                f"about {gap * st:.3g} s of replay apart ({why}).")

    #: How far over the tail bound going back from a stop may be before the
    #: prompt says so (the median step is an estimate; the newest checkpoint
    #: may wait for its predecessor's settling window).
    TAIL_SLACK = 1.25

    def tail_warning(self, present: int) -> Optional[str]:
        """At a stop at the end of step ``present`` (the adaptive schedule):
        why going back a few steps from here replays well over its tail bound
        (schedule.TAIL_S), or None."""
        st = self.step_time()
        earlier = [c.step for c in self.checkpoints.values() if c.step < present]
        if type(self.policy) is not Adaptive or st is None or not earlier:
            return None
        newest = max(earlier)
        back = (present - newest) * st
        bound = self.policy.tail_s
        if back <= bound * self.TAIL_SLACK:
            return None
        why = (f"{self.evicted_for_memory} checkpoint(s) were dropped to stay within --checkpoint-memory"
               if self.evicted_for_memory and self.policy.keeps_tail else
               f"a checkpoint costs {self.policy.cost_s * 1000:.0f} ms here, and keeping one every {bound:g} s "
               f"would take more than {self.policy.tail_budget:.0%} of the run time: one comes every "
               f"{self.policy.interval_s:.3g} s")
        return (f"nndb: warning: going back from step {present} replays from the checkpoint at step {newest} "
                f"or earlier, about {back:.3g} s or more ({bound:g} s is the aim: {why}); "
                f"'info checkpoints' lists them (said once a run)")

    @property
    def settling(self) -> bool:
        """The cost of the last checkpoint is still being measured (its copy-on-write aftermath)."""
        return self._settling is not None

    def step_time(self) -> Optional[float]:
        if not self.step_times:
            return None
        st = sorted(self.step_times)
        return st[len(st) // 2]
