"""The in-memory and on-disk checkpoint schedules (pure logic, no torch)."""
from itertools import pairwise

import pytest

from nndb.timetravel.schedule import (
    MIN_COST_S,
    Adaptive,
    DiskSchedule,
    KnownTotal,
    make_policy,
)


def drive_known(policy, steps, pinned=frozenset()):
    """Feed ``steps`` through due/taken/evict; return (taken, live)."""
    taken, live = [], []
    for step in steps:
        if policy.due(step, 0.0):
            policy.taken(step, 0.01, 0.0)
            taken.append(step)
            live.append(step)
        for gone in policy.evict(live, pinned):
            assert gone not in pinned
            live.remove(gone)
    return taken, live


def test_known_total_1000_marks_and_limits():
    policy = KnownTotal(1000)
    taken, live = drive_known(policy, range(1000))
    early = [0, 50, 100, 150]
    middle = list(range(200, 800, 100))
    late = list(range(800, 1000, 20))
    assert taken == early + middle + late
    assert live == early + middle + late
    assert sum(1 for s in live if 200 <= s < 800) <= KnownTotal.MIDDLE_KEEP
    assert sum(1 for s in live if s >= 800) <= KnownTotal.LATE_KEEP


def test_known_total_skipped_steps_keep_their_checkpoint():
    # A tracer that only sees every 7th step takes the first step past each mark.
    taken, _ = drive_known(KnownTotal(1000), range(0, 1000, 7))
    assert taken[:5] == [0, 56, 105, 154, 203]
    assert len(taken) == 20


def test_known_total_small_total_clamps_intervals_to_one():
    policy = KnownTotal(10)
    assert policy.intervals == (1, 1, 1)
    taken, live = drive_known(policy, range(10))
    assert taken == live == list(range(10))


def test_known_total_overshoot_keeps_last_late_and_pins():
    policy = KnownTotal(100)                # late marks every 2 steps from 80, forever
    pinned = {84}
    _, live = drive_known(policy, range(300), pinned)
    assert [s for s in live if s < 20] == [0, 5, 10, 15]
    assert [s for s in live if 20 <= s < 80] == list(range(20, 80, 10))
    late = [s for s in live if s >= 80]
    assert 84 in late
    assert [s for s in late if s != 84] == list(range(260, 300, 2))
    assert len(late) == KnownTotal.LATE_KEEP + 1


def test_known_total_evict_middle_limit():
    policy = KnownTotal(1000)
    middle = list(range(200, 800, 40))      # 15 middle ones, e.g. after manual additions
    drop = policy.evict([0] + middle + [900], pinned={200})
    assert drop == middle[1:5]              # 200 is pinned: the last 10 unpinned stay


class Clock:
    """A fake monotonic clock."""

    def __init__(self):
        self.now = 0.0


def drive_adaptive(policy, n_steps, step_s=0.001, cost_s=0.01, pinned=frozenset(), check=None):
    clock, taken, live = Clock(), [], []
    for step in range(n_steps):
        clock.now += step_s
        if policy.due(step, clock.now):
            clock.now += cost_s
            policy.taken(step, cost_s, clock.now)
            taken.append(step)
            live.append(step)
            for gone in policy.evict(live, pinned):
                live.remove(gone)
            if check:
                check(live, step)
    return taken, live


def test_adaptive_spacing_follows_budget():
    taken, _ = drive_adaptive(Adaptive(budget=0.05, max_live=1000), 5000)
    assert taken[0] == 0
    spacing = {b - a for a, b in pairwise(taken)}
    assert spacing <= {199, 200, 201}       # 0.01 s / 5% = 0.2 s = 200 steps of 1 ms
    taken, _ = drive_adaptive(Adaptive(max_live=1000), 5000)     # the default: 2% (schedule.BUDGET)
    assert {b - a for a, b in pairwise(taken)} <= {499, 500, 501}


def test_adaptive_cost_floor():
    taken, _ = drive_adaptive(Adaptive(budget=0.05, max_live=1000), 1000, cost_s=0.0)
    gaps = {b - a for a, b in pairwise(taken)}
    expected = MIN_COST_S / 0.05 / 0.001    # 40 steps
    assert all(abs(g - expected) <= 1 for g in gaps)


def test_adaptive_at_least_one_step_apart():
    policy = Adaptive()
    assert policy.due(0, 0.0)
    policy.taken(0, 0.01, 0.0)
    assert not policy.due(0, 100.0)
    assert policy.due(1, 100.0)


def test_adaptive_eviction_invariants_and_spread():
    max_live = 20

    def check(live, newest):
        assert len(live) <= max_live
        assert live[0] == 0 and live[-1] == newest

    taken, live = drive_adaptive(Adaptive(budget=0.05, max_live=max_live), 50_000, check=check)
    assert len(taken) > 200 and len(live) == max_live
    gaps = [b - a for a, b in pairwise(live[:-1])]    # the newest gap is young by nature
    assert max(gaps) / min(gaps) <= 3
    assert live[len(live) // 2] > 10_000     # spread over the run, not piled at its end


def test_adaptive_pinned_never_evicted_and_not_counted():
    policy, clock, live, pinned = Adaptive(budget=0.05, max_live=5), Clock(), [], set()
    for step in range(20_000):
        clock.now += 0.001
        if policy.due(step, clock.now):
            clock.now += 0.01
            policy.taken(step, 0.01, clock.now)
            live.append(step)
            if len(live) in (2, 3, 4) and step < 1000:
                pinned.add(step)            # the user pins three early ones
            for gone in policy.evict(live, pinned):
                assert gone not in pinned
                live.remove(gone)
            assert pinned <= set(live)
            assert sum(1 for s in live if s not in pinned) <= 5
    assert len(pinned) == 3
    assert len(live) == 5 + len(pinned)


def test_adaptive_evict_tie_drops_oldest_and_spares_ends():
    policy = Adaptive(max_live=3)
    assert policy.evict([0, 10, 20, 30]) == [10]          # 10 and 20 tie: the oldest goes
    assert Adaptive(max_live=4).evict([0, 10, 12, 30, 40]) == [10]   # smallest merged gap
    assert Adaptive(max_live=4).evict([0, 10, 20, 25, 30]) == [25]
    assert policy.evict([0, 10, 20, 30], pinned={10}) == []   # pins do not count
    assert Adaptive(max_live=2).evict([0, 10, 20, 30], pinned={10}) == [20]
    assert Adaptive(max_live=3).evict([0, 10, 20, 30, 40]) == [10, 30]   # then 0-20-40


def test_make_policy_and_validation():
    assert isinstance(make_policy(100), KnownTotal)
    assert isinstance(make_policy(None), Adaptive)
    p = make_policy(None, budget=0.1, max_live=7)
    assert (p.budget, p.max_live) == (0.1, 7)
    assert "known total of 100" in make_policy(100).describe()
    assert "adaptive" in p.describe()
    with pytest.raises(ValueError):
        KnownTotal(0)
    with pytest.raises(ValueError):
        Adaptive(budget=0)
    with pytest.raises(ValueError):
        Adaptive(max_live=1)


def test_disk_schedule_known_total():
    sched = DiskSchedule(1000)
    written = []
    for n, step in enumerate(range(0, 1000, 3), start=1):
        if sched.due(step, n):
            sched.taken(step, n)
            written.append(step)
    assert written == [102, 201, 300, 402, 501, 600, 702, 801, 900]
    assert "every 100 steps" in sched.describe()


def test_disk_schedule_unknown_total():
    sched = DiskSchedule(None)
    written = []
    for n in range(1, 30):                  # n-th in-memory checkpoint, at step 10 * n
        if sched.due(10 * n, n):
            sched.taken(10 * n, n)
            written.append(n)
    assert written == [8, 16, 24]
    assert "every 8th" in sched.describe()


def test_adaptive_budget_wins_over_the_replay_bound_when_checkpoints_are_dear():
    """A 1 s checkpoint waits 50 s at a 2% budget, although the replay goal
    (5% of the run time, at least 2 s) would want one sooner: the overhead is
    promised to every run.  A cheap one comes as often as the budget allows."""
    from nndb.timetravel.schedule import Adaptive, replay_bound
    p = Adaptive()
    p.taken(0, 1.0, 0.0)
    assert p.interval_s == pytest.approx(50.0) and not p.due(5, 49.9) and p.due(5, 50.0)
    assert replay_bound(0.0) == 2.0 < p.interval_s
    p.taken(100, 1.0, 200.0)
    assert p.interval_s == pytest.approx(50.0) and replay_bound(200.0) == 10.0
    p.taken(101, 0.01, 201.0)                 # a cheap checkpoint: well within the replay goal
    assert p.interval_s == pytest.approx(0.5)
