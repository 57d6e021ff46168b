"""When to take an in-memory checkpoint, and which ones to drop.

A checkpoint is taken at a step boundary ("after step s finished"). The
tracer asks ``policy.due(step, now)`` after every step, reports each
checkpoint it took with ``policy.taken(...)``, then asks
``policy.evict(live_steps, pinned)`` which automatic checkpoints to let go.

Two policies share that interface:

* ``KnownTotal`` when the run's length is known: the schedule practitioners
  use by hand -- sparse early, sparser in the middle, dense at the end where
  most bugs show up, with per-phase limits on how many are kept.
* ``Adaptive`` when it is not: spend at most a fixed fraction of the wall
  time on checkpoints (a little more, when they are dear, to keep the
  newest a few seconds from the present) and keep a bounded number, dense
  near the present and sparser with age.

``DiskSchedule`` is the much coarser schedule for checkpoints written to disk.

Pinned checkpoints are the user's explicit choice: they are never dropped
and do not count against any limit (otherwise pinning one would silently
evict another). They still count as neighbours when ``Adaptive`` measures
gaps, since they are real points the user can travel to.
"""
from __future__ import annotations

import math

#: Floor on a checkpoint's cost: a fork's real cost includes the
#: copy-on-write page faults that follow it, which the fork call itself
#: does not see.
MIN_COST_S = 0.002

#: The default share of the wall time for automatic checkpoints: small,
#: because a checkpoint's true cost (its copy-on-write faults after the fork,
#: counted for TimeMachine.SETTLE_S) is several times what the fork itself
#: takes (the measurements: docs/performance.md).
BUDGET = 0.02

#: The replay goal (adaptive schedule): going back to any step should replay
#: at most REPLAY_BOUND_FRACTION of the run's time so far or REPLAY_BOUND_S,
#: whichever is more.  It holds whenever checkpoints are cheap enough for the
#: budget to take them that often (a checkpoint costing under
#: BUDGET x REPLAY_BOUND_S, 40 ms); when they are dearer the budget wins --
#: the overhead of recording is a promise to every run, the replay bound only
#: to the runs that travel -- and ``info checkpoints`` says how far apart they
#: are (``TimeMachine.broken_promise``).  Time at the prompt is not run time.
REPLAY_BOUND_S = 2.0
REPLAY_BOUND_FRACTION = 0.05

#: The tail (adaptive schedule): wherever the run stops, going back a few
#: steps replays at most TAIL_S seconds -- the newest checkpoint is never
#: older than that.  When a checkpoint costs more than BUDGET x TAIL_S (80
#: ms: a fork measured at 85-462 ms on a loaded machine spaced them 4-23 s
#: apart, and a 300-step CNN replayed 289 steps, 31.5 s, for 'rs 5' at its
#: end), the schedule takes one every TAIL_S anyway as long as that costs at
#: most TAIL_BUDGET of the run time; dearer still, one every cost /
#: TAIL_BUDGET, and the prompt says so once (``TimeMachine.tail_warning``).
TAIL_S = 4.0
TAIL_BUDGET = 0.05


def replay_bound(run_time: float) -> float:
    """The most seconds of replay the adaptive schedule allows, ``run_time``
    seconds into the run."""
    return max(REPLAY_BOUND_S, REPLAY_BOUND_FRACTION * run_time)


def _percent(total: int, pct: int) -> int:
    """``pct``% of ``total`` rounded half up (not banker's rounding, and in
    integers so 5% of 30 is 2 rather than a float's whim), at least 1."""
    return max(1, (total * pct + 50) // 100)


class Policy:
    """The interface both in-memory policies implement."""

    def due(self, step: int, now: float) -> bool:
        """Should a checkpoint be taken after step ``step``?
        ``now`` is ``time.monotonic()``."""
        raise NotImplementedError

    def taken(self, step: int, cost_s: float, now: float) -> None:
        """A checkpoint was taken after ``step``; it cost ``cost_s`` seconds
        and finished at ``now``."""
        raise NotImplementedError

    def evict(self, steps: list[int], pinned: set[int] = frozenset()) -> list[int]:
        """Given the sorted steps of the live automatic checkpoints, which to
        drop now (never a pinned one)."""
        raise NotImplementedError

    def describe(self) -> str:
        """One line for ``info checkpoints``."""
        raise NotImplementedError


class KnownTotal(Policy):
    """The practitioners' schedule for a run of ``total_steps`` steps.

    ========  ===============  ==========  =====================
    phase     steps            every       kept
    ========  ===============  ==========  =====================
    early     < 20% of total   5%          all
    middle    20% .. 80%       10%         the last 10
    late      >= 80%           2%          the last 20
    ========  ===============  ==========  =====================

    Marks are the phase's first step plus multiples of its interval; the late
    phase goes on past ``total_steps`` (a run that overshoots its declared
    length keeps its last 20). ``due`` compares with the last step taken, so
    a step that is skipped (a tracer that only sees every k-th step) does not
    lose its checkpoint: the first step at or past the next mark takes it.
    """

    EARLY_PCT, MIDDLE_PCT, LATE_PCT = 5, 10, 2
    MIDDLE_KEEP, LATE_KEEP = 10, 20

    def __init__(self, total_steps: int):
        if total_steps < 1:
            raise ValueError(f"total_steps must be at least 1, not {total_steps}")
        self.total_steps = total_steps
        self.middle_start = -(-total_steps * 20 // 100)    # ceil: "steps < 20%" are early
        self.late_start = -(-total_steps * 80 // 100)
        self.intervals = (_percent(total_steps, self.EARLY_PCT),
                          _percent(total_steps, self.MIDDLE_PCT),
                          _percent(total_steps, self.LATE_PCT))
        self._last: int | None = None

    def _phases(self) -> list[tuple[int, float, int]]:
        """(first step, end step exclusive, interval) of each phase."""
        early, middle, late = self.intervals
        return [(0, self.middle_start, early),
                (self.middle_start, self.late_start, middle),
                (self.late_start, math.inf, late)]

    def phase(self, step: int) -> int:
        """0 early, 1 middle, 2 late."""
        return 0 if step < self.middle_start else 1 if step < self.late_start else 2

    def next_mark(self, after: int) -> int:
        """The first mark strictly after step ``after``."""
        for start, end, every in self._phases():
            k = (after - start) // every + 1 if after >= start else 0
            mark = start + k * every
            if mark < end:
                return mark
        raise AssertionError("unreachable: the late phase never ends")

    def due(self, step: int, now: float) -> bool:
        if self._last is None:
            return True                     # step 0 (or the first step seen)
        return step > self._last and step >= self.next_mark(self._last)

    def taken(self, step: int, cost_s: float, now: float) -> None:
        self._last = step if self._last is None else max(self._last, step)

    def evict(self, steps: list[int], pinned: set[int] = frozenset()) -> list[int]:
        limits = (None, self.MIDDLE_KEEP, self.LATE_KEEP)
        drop: list[int] = []
        for phase, limit in enumerate(limits):
            if limit is None:
                continue
            free = [s for s in sorted(steps) if self.phase(s) == phase and s not in pinned]
            drop.extend(free[:max(0, len(free) - limit)])
        return sorted(drop)

    def describe(self) -> str:
        early, middle, late = self.intervals
        return (f"known total of {self.total_steps} steps: every {early} steps before step "
                f"{self.middle_start} (all kept), every {middle} until step {self.late_start} "
                f"(last {self.MIDDLE_KEEP} kept), then every {late} (last {self.LATE_KEEP} kept)")


class Adaptive(Policy):
    """For runs of unknown length: keep checkpointing under ``budget`` of the
    wall time and at most ``max_live`` automatic checkpoints alive, the
    newest never more than ``tail_s`` of run time old where that costs at
    most ``tail_budget``.

    After a checkpoint costing ``c`` seconds that finished at time ``t`` the
    next is due once ``now - t >= c / budget`` (and at least one step later),
    with ``c`` floored at ``MIN_COST_S``, or sooner for the tail: after
    ``max(tail_s, c / tail_budget)`` when that is shorter. Measuring from the
    end of the checkpoint keeps the overhead at ``budget / (1 + budget)``
    (``tail_budget`` at most when checkpoints are dear). The whole-run
    replay bound does not shorten the interval (it did until 2026-12: on a
    sub-millisecond step a checkpoint's ~50-150 ms then came every 2 s, 5-7%
    of the run instead of 2%); the tail does, since going back a few steps
    from wherever the run stops is what travelling does most.

    Eviction is dense near the present and sparser with age, as a log
    scale: it drops, one at a time, the checkpoint whose removal leaves the
    smallest gap relative to that gap's distance from the newest
    checkpoint (ties: the oldest), never the first nor the newest.  Taken
    every k steps, the last five stay k apart, then 2k, 4k, ... back to the
    first.  (Until 2026-12 the survivors were spread evenly over the run:
    20 kept of 150 taken 2 steps apart were ~15 apart at the end too.)
    """

    def __init__(self, budget: float = BUDGET, max_live: int = 20, tail_s: float = TAIL_S,
                 tail_budget: float = TAIL_BUDGET):
        if not 0 < budget <= 1:
            raise ValueError(f"budget is a fraction of the wall time in (0, 1], not {budget}")
        if max_live < 2:
            raise ValueError(f"max_live must be at least 2 (the first and the newest), not {max_live}")
        self.budget = budget
        self.max_live = max_live
        self.tail_s = tail_s
        self.tail_budget = max(tail_budget, budget)
        self._last: int | None = None
        self._last_time = 0.0
        self._start: float | None = None
        self._cost = MIN_COST_S

    @property
    def interval_s(self) -> float:
        """Seconds to wait after the last checkpoint before the next (``now``:
        the run's clock, pauses left out)."""
        return min(self._cost / self.budget, max(self.tail_s, self._cost / self.tail_budget))

    @property
    def cost_s(self) -> float:
        """The last checkpoint's cost, as the schedule counts it (floored at MIN_COST_S)."""
        return self._cost

    @property
    def keeps_tail(self) -> bool:
        """The newest checkpoint is at most ``tail_s`` of run time old at every step end."""
        return self.interval_s <= self.tail_s

    def due(self, step: int, now: float) -> bool:
        if self._last is None:
            return True                     # step 0 (or the first step seen)
        return step > self._last and now - self._last_time >= self.interval_s

    def taken(self, step: int, cost_s: float, now: float) -> None:
        self._last = step if self._last is None else max(self._last, step)
        self._last_time = now
        if self._start is None:
            self._start = now
        self._cost = max(cost_s, MIN_COST_S)

    def evict(self, steps: list[int], pinned: set[int] = frozenset()) -> list[int]:
        live = sorted(steps)
        excess = sum(1 for s in live if s not in pinned) - self.max_live
        drop: list[int] = []
        while excess > 0:
            best = None                     # (merged gap / its age, index): min picks the oldest on ties
            for i in range(1, len(live) - 1):
                if live[i] not in pinned:
                    gap = live[i + 1] - live[i - 1]
                    score = gap / (live[-1] - live[i - 1])
                    if best is None or score < best[0]:
                        best = (score, i)
            if best is None:
                break                       # only the first, the newest and pins remain
            drop.append(live.pop(best[1]))
            excess -= 1
        return sorted(drop)

    def describe(self) -> str:
        return (f"adaptive: at most {self.budget:.0%} of the run time on checkpoints, or "
                f"{self.tail_budget:.0%} to keep the newest within {self.tail_s:g} s of replay "
                f"(next {self.interval_s:.3g} s of run time after the last), "
                f"aiming at a replay of at most {REPLAY_BOUND_FRACTION:.0%} of the run time or "
                f"{REPLAY_BOUND_S:g} s, whichever is more; {self.max_live} kept, dense near the present")


class Every(Adaptive):
    """``--checkpoint-every N`` (steps) or ``Ns`` (seconds of run time): the
    user's interval; the kept ones are chosen as Adaptive's (dense near the
    present)."""

    def __init__(self, steps: int | None = None, seconds: float | None = None, max_live: int = 20):
        super().__init__(max_live=max_live)
        self.steps, self.seconds = steps, seconds

    def due(self, step: int, now: float) -> bool:
        if self._last is None:
            return True
        if self.steps is not None:
            return step - self._last >= self.steps
        return step > self._last and now - self._last_time >= self.seconds

    def describe(self) -> str:
        every = f"{self.steps} steps" if self.steps is not None else f"{self.seconds:g} s of run time"
        return f"every {every} (--checkpoint-every), {self.max_live} kept, dense near the present"


def parse_every(text: str) -> tuple:
    """``--checkpoint-every``: "N" steps or "Ns" seconds -> (steps, seconds)."""
    t = text.strip()
    try:
        if t.endswith("s"):
            v = float(t[:-1])
            if v > 0:
                return None, v
        else:
            v = int(t)
            if v >= 1:
                return v, None
    except ValueError:
        pass
    raise ValueError(f"--checkpoint-every takes N (steps, at least 1) or Ns (seconds), not '{text}'")


def make_policy(total_steps: int | None, budget: float = BUDGET, max_live: int = 20,
                every: str | None = None) -> Policy:
    """``Every`` with --checkpoint-every, ``KnownTotal`` when the run's length
    is known, ``Adaptive`` otherwise."""
    if every:
        steps, seconds = parse_every(every)
        return Every(steps, seconds, max_live=max_live)
    if total_steps:
        return KnownTotal(total_steps)
    return Adaptive(budget=budget, max_live=max_live)


#: A checkpoint taken with no step timed before it (a run's first, at step
#: 0) has no median step to measure the steps after its fork against: the
#: median of the BASELINE steps after its settling window stands in.
BASELINE = 16


#: Steps timed before a fork, at least, for ``regular_excess`` (two observed steps' rhythm).
REGULAR_MIN = 64


def regular_excess(median, total: float, n: int) -> float:
    """What a step took beyond the ``median`` step on average over ``n``
    steps taking ``total`` seconds (the run's observed steps, the trace
    writer's blocks): Settling's ``regular``; 0 with fewer than REGULAR_MIN."""
    if median is None or n < REGULAR_MIN:
        return 0.0
    return max(0.0, total / n - median)


class Settling:
    """A checkpoint's cost being measured: its fork (``fork_s``) plus each
    later step's time beyond the median step, for at least ``steps`` steps
    and until ``until`` on the run's clock (the copy-on-write faults of the
    pages the run writes go on for a while after the fork); a step faster
    than the median takes some back; never less than the fork.

    ``regular`` is what a step takes beyond the median anyway, on average
    (the observed steps, the trace writer's blocks: the run's mean step less
    its median, before the fork), taken off each step of the window: a
    window long enough for the faults (about 1.2 s on the bench's CNN) holds
    dozens of observed steps, which are not the checkpoint's.

    ``median`` is the median step before the fork; None when there was none
    (the first checkpoint of a run): the window's steps are then kept, and
    once it has closed the median of the next BASELINE steps is the
    reference.  (The fork's cost alone, which the first checkpoint was
    charged before 2026-12, was a tenth of its real cost on the bench's MLP
    (12 of ~150 ms): the second checkpoint came ten times too soon.)  A run's
    first steps are its slowest (nndb looks at every one of the first
    cadence.SETTLE), so this errs on the dear side: the next checkpoint
    comes a little later, never sooner."""

    def __init__(self, checkpoint, fork_s: float, steps: int, until: float, median, regular: float = 0.0):
        self.checkpoint = checkpoint
        self.fork_s = fork_s
        self.regular = regular
        self.left = steps
        self.until = until
        self.median = median
        self.excess = 0.0                     # sum of (step - median) so far
        self.window: list = []                # the window's steps, while there is no median
        self.baseline: list | None = None     # the steps after the window (no median): collecting

    def step(self, took: float, now: float):
        """One more step's time; the checkpoint's cost once known, else None."""
        if self.baseline is not None:
            self.baseline.append(took)
            if len(self.baseline) < BASELINE:
                return None
            b = sorted(self.baseline)
            self.excess = sum(self.window) - b[len(b) // 2] * len(self.window)
            return self.so_far()
        if self.median is None:
            self.window.append(took)
        else:
            self.excess += took - self.median - self.regular   # (not clipped at 0 a step: the noise would only add up)
        self.left -= 1
        if self.left > 0 or now < self.until:
            return None
        if self.median is None:
            self.baseline = []
            return None
        return self.so_far()

    def so_far(self) -> float:
        """The cost measured until now (with no median yet: the fork's)."""
        return max(self.fork_s + self.excess, self.fork_s)


class DiskSchedule:
    """When to also write a checkpoint to disk (much coarser: disk costs
    seconds and survives the process, so a handful per run is enough).

    With a known total: every 10% of the steps, the first at 10% (step 0 is
    cheap to recompute and would only cost disk), all kept. Without: every
    ``every_in_memory``-th in-memory checkpoint (or tick, where fork
    checkpoints are off), no sooner than ``budget`` of the run time allows
    after the last write's cost, and the newest ``keep`` files kept (older
    ones deleted as ``Adaptive`` drops checkpoints: dense near the present,
    the first kept): a run of unknown length on a large model would
    otherwise fill the disk (300 MB of state every ~25 s, before 2026-12).
    Like ``KnownTotal``, ``due`` compares with the last disk checkpoint, so
    skipped steps lose nothing.
    """

    def __init__(self, total_steps: int | None, every_in_memory: int = 8, budget: float = BUDGET,
                 keep: int = 10):
        if every_in_memory < 1:
            raise ValueError(f"every_in_memory must be at least 1, not {every_in_memory}")
        self.total_steps = total_steps or None
        self.interval = _percent(total_steps, 10) if self.total_steps else None
        self.every_in_memory = every_in_memory
        self.budget = budget
        self.keep = keep
        self._last_step = 0                 # marks start at 0, so the first is at 10%
        self._last_taken = 0
        self._last_time: float | None = None
        self._cost = 0.0

    def due(self, step: int, n_taken: int, now: float = 0.0) -> bool:
        """Should a disk checkpoint be written after ``step``? ``n_taken`` is
        how many in-memory checkpoints (ticks) were taken so far, the one just
        taken included; ``now`` the run's clock."""
        if self.interval is not None:
            next_mark = (self._last_step // self.interval + 1) * self.interval
            return step >= next_mark
        if self._last_time is not None and now - self._last_time < self._cost / self.budget:
            return False
        return n_taken - self._last_taken >= self.every_in_memory

    def taken(self, step: int, n_taken: int, cost_s: float = 0.0, now: float = 0.0) -> None:
        """A disk checkpoint that cost ``cost_s`` was written after ``step``
        (the clock then ``now``), with ``n_taken`` as passed to ``due``."""
        self._last_step = max(self._last_step, step)
        self._last_taken = max(self._last_taken, n_taken)
        self._last_time, self._cost = now, cost_s

    def evict(self, steps: list[int]) -> list[int]:
        """The steps of written files to delete (none with a known total)."""
        if self.interval is not None or len(steps) <= self.keep:
            return []
        return Adaptive(max_live=self.keep).evict(steps)

    def describe(self) -> str:
        if self.interval is not None:
            return f"on disk every {self.interval} steps"
        return (f"on disk every {self.every_in_memory}th in-memory checkpoint, at most {self.budget:.0%} of "
                f"the run time, the newest {self.keep} kept")
