"""Time travel's parts on their own: the channel, the session hand-over, what
blocks fork(), and when a replay is said not to be exact."""
import threading

import pytest

from nndb.debugger import points as P
from nndb.driver import DebugOptions, build_session
from nndb.frontends.batch import ScriptedFrontend
from nndb.debugger.session import QueuedLine
from nndb.timetravel import forking
from nndb.timetravel.channel import Channel
from nndb.timetravel.machine import TimeMachine


def test_channel_carries_json_and_reports_a_closed_end():
    a, b = Channel.pair()
    msg = {"op": "resume", "values": [1.5, float("nan"), None], "text": "ü" * 20000}
    assert a.send(msg)
    got = b.recv()
    assert got["op"] == "resume" and got["text"] == msg["text"] and got["values"][0] == 1.5
    assert got["values"][1] != got["values"][1]          # NaN survives (bit-for-bit compares need it)
    a.close()
    assert b.recv() is None


def _session(lines=()):
    return build_session(ScriptedFrontend(list(lines)), DebugOptions(stop_at_start=False))


def test_handover_round_trip_keeps_points_displays_queue_and_input():
    s = _session(["next", "p x"])
    s.points.add(P.StepBreak, {"step": 7}, condition="$loss > 1")
    w = s.points.add(P.Watch, {"kind": "grad", "label": "grad", "glob": "fc*", "stat": "norm", "op": ">",
                              "value": 10.0, "consecutive": 3})
    w.hits, w.streak["fc.weight"] = 2, 1
    s.points[1].commands = ["p $loss", "continue"]
    s.points.new_display("$step", compile("1", "<d>", "eval"))
    s.rules.rule("nonfinite").action = "fail"
    s.rules.set_enabled("dead_relu", False)
    s.input.queue.append(QueuedLine("info checkpoints", "cmds.nndb", 4))
    s.machine.timelines.append({"id": 1, "origin": "step 3 of timeline 0", "change": "set lr 1", "status": "left"})
    state = s.snapshot()
    t = _session()
    t.restore(state)
    assert [type(p).__name__ for p in t.points.values()] == ["StepBreak", "Watch"]
    assert t.points[1].condition == "$loss > 1" and t.points[1].commands == ["p $loss", "continue"]
    # a watch's streaks are the process's own (a replica replays other steps): not handed over
    assert t.points[2].hits == 2 and t.points[2].streak == {} and t.points[2].value == 10.0
    assert t.points.add(P.StepBreak, {"step": 9}).number == 3 and [d[:2] for d in t.points.displays] == [(1, "$step")]
    assert t.points.new_display("$loss", compile("1", "<d>", "eval")) == 2
    assert t.rules.rule("nonfinite").action == "fail" and not t.rules.rule("dead_relu").enabled
    assert [(q.text, q.source, q.line) for q in t.input.queue] == [("info checkpoints", "cmds.nndb", 4)]
    assert t.frontend.lines == ["next", "p x"]
    assert [tl["id"] for tl in t.machine.timelines] == [0, 1]


def test_blockers_name_the_script_threads():
    assert forking.blockers() == [] or all("thread" in b or "worker" in b for b in forking.blockers())
    stop = threading.Event()
    th = threading.Thread(target=stop.wait, name="loader-prefetch", daemon=True)
    th.start()
    try:
        why = forking.blockers()
        assert any("loader-prefetch" in b and "do not survive fork()" in b for b in why), why
    finally:
        stop.set()
        th.join()


def test_threads_python_named_say_what_they_run_and_whose_code_it_is():
    # A SummaryWriter's thread is 'Thread-N' to Python: until 2026-12 nndb said "the script
    # started threads (Thread-1)", which does not say whose it is
    import logging.handlers
    import queue

    class Pump(threading.Thread):
        def run(self):
            stop.wait()

    stop = threading.Event()
    listener = logging.handlers.QueueListener(queue.Queue())
    listener.start()
    own = [threading.Thread(target=stop.wait, name="waiter", daemon=True), Pump(daemon=True)]
    for t in own:
        t.start()
    try:
        names = forking.script_threads()
        assert f"{listener._thread.name.split()[0]} (logging.handlers.QueueListener._monitor)" in names, names
        assert f"{own[1].name} (test_timetravel_units." in names and "Pump)" in names, names
        assert "waiter" in names
        mine = forking.script_threads(own_code=True)      # (Event.wait is the stdlib's: not 'waiter')
        assert mine.endswith(".Pump)") and ", " not in mine, mine
    finally:
        stop.set()
        listener.stop()
        for t in own:
            t.join()


def test_cuda_blocks_fork(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert any("CUDA is initialised" in b for b in forking.blockers())


@pytest.mark.parametrize("runtime,threads,exact", [
    ("libgomp.so.1", 2, False),                 # GNU OpenMP: a forked replica runs 1 thread
    ("libgomp.so.1", 1, True),
    ("libgomp.so.1,libiomp5.so", 2, True),      # libiomp5 preloaded takes over
    ("libiomp5.so", 4, True),
])
def test_exactness_depends_on_the_openmp_runtime_and_threads(monkeypatch, runtime, threads, exact):
    import torch
    import nndb.run.meta
    monkeypatch.setattr(nndb.run.meta, "openmp_runtime", lambda: runtime)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    ok, why = forking.exactness()
    assert ok is exact
    if not exact:
        assert "may differ in the last bits" in why and "intel-openmp" in why


def test_trace_metadata_records_what_decides_a_replay(tmp_path):
    from conftest import run_in_process
    from nndb.store.reader import TraceReader
    script = tmp_path / "s.py"
    script.write_text("import random, torch\nm = torch.nn.Linear(2, 1)\no = torch.optim.SGD(m.parameters(), 0.1)\n"
                      "for _ in range(2):\n    o.zero_grad(); m(torch.ones(1, 2)).sum().backward(); o.step()\n")
    import random
    expected = random.getstate()
    run_in_process(tmp_path, str(script), rules="none")
    with TraceReader(str(tmp_path / "run.h5")) as r:
        rep = r.meta["replay"]
    assert rep["num_threads"] >= 1 and rep["openmp"] and isinstance(rep["fork_exact"], bool)
    assert rep["python_random"][1] == list(expected[1])      # the generator's state before the script ran
    assert rep["numpy_random"][0] == "MT19937" and len(rep["numpy_random"][1]) == 624


def test_a_checkpoint_costs_what_the_steps_after_it_took_for_a_while():
    """The fork, plus each later step's time beyond the median step before the
    fork, for at least SETTLE steps and SETTLE_S seconds; a step faster than
    the median takes some back; never less than the fork itself."""
    from nndb.timetravel.machine import Checkpoint
    from nndb.timetravel.schedule import Settling

    m = TimeMachine("auto")
    m.step_times.extend([0.001] * 50)          # the median step: 1 ms
    ck = Checkpoint(1, 10, 0, None, "auto", 0.0, 0.02)
    m.checkpoints[1] = ck
    t0 = 100.0
    median, until = m.step_time(), t0 + m.SETTLE_S
    m._settling = Settling(ck, 0.02, m.SETTLE, until, median)
    now, ends = t0, []
    # the first step after the fork copies pages (21 ms), then steps of 1.2 ms, one of 0.5 ms
    for took in [0.021, 0.0012, 0.0005] + [0.0012] * 1000:
        now += took
        ends.append(now)
        m._settle(took, now)
        if m._settling is None:
            break
    steps = len(ends)
    assert ends[-2] < until <= ends[-1] and steps > 100      # every step of SETTLE_S, well past SETTLE
    extra = 0.020 + 0.0002 - 0.0005 + 0.0002 * (steps - 3)
    assert ck.cost_s == pytest.approx(0.02 + extra)
    assert m.policy.cost_s == pytest.approx(ck.cost_s)          # (what the schedule spaces them by)

    # a fork with no slower step after it costs the fork
    ck2 = Checkpoint(2, 20, 0, None, "auto", 0.0, 0.03)
    m.checkpoints[2] = ck2
    m._settling = Settling(ck2, 0.03, m.SETTLE, 0.0, 0.001)
    m._settle(0.0009, 1.0)
    m._settle(0.0009, 1.001)
    assert m._settling is None and ck2.cost_s == 0.03


def test_a_checkpoint_is_not_charged_the_runs_own_slow_steps():
    """The window (about 1 s: the CNN's copy-on-write goes on for ~100 steps)
    holds the run's observed steps and writer blocks, which are not the
    checkpoint's: what a step takes beyond the median on average before the
    fork (schedule.regular_excess) is taken off each step of the window."""
    from nndb.timetravel.machine import Checkpoint
    from nndb.timetravel.schedule import Settling

    m = TimeMachine("auto")
    assert m.SETTLE_S >= 1.0
    rhythm = [0.001] * 31 + [0.005]                # 1 ms steps, one observed step of 5 ms in 32
    from nndb.timetravel.schedule import regular_excess

    def regular():
        return regular_excess(m.step_time(), m._since_sum, m._since_n)
    assert regular() == 0.0                        # (nothing timed yet)
    now = 0.0
    for took in rhythm * 4:                        # (what at_step_end keeps of a step outside a window)
        now += took
        m.step_times.append(took)
        m._since_sum += took
        m._since_n += 1
    assert m.step_time() == 0.001
    assert regular() == pytest.approx(0.004 / 32)
    ck = Checkpoint(1, 10, 0, None, "auto", 0.0, 0.02)
    m.checkpoints[1] = ck
    m._settling = Settling(ck, 0.02, m.SETTLE, now + m.SETTLE_S, m.step_time(), regular())
    # after the fork: 30 ms of faults spread over the first 4 steps, then the run's rhythm
    steps = 0
    for took in [0.009, 0.009, 0.009, 0.007] + rhythm[4:] + rhythm * 40:
        now += took
        steps += 1
        m._settle(took, now)
        if m._settling is None:
            break
    assert now >= m.SETTLE_S and steps > 32 * 20           # the window held dozens of observed steps
    # charged the fork and the faults (4 steps of 8, 8, 8 and 6 ms over the
    # median); the observed steps the window holds, at most one's worth off
    assert ck.cost_s == pytest.approx(0.02 + 0.030, abs=0.004)
    uncorrected = 0.02 + 0.030 + 0.004 * (steps // 32)     # what the median alone would have charged
    assert uncorrected > 3 * ck.cost_s
    assert m.policy.cost_s == pytest.approx(ck.cost_s)          # (what the schedule spaces them by)


def test_the_first_checkpoint_is_charged_its_copy_on_write_against_the_steps_after_it():
    """At step 0 no step was timed before the fork: the window's steps are
    measured against the median of the BASELINE steps after it.  (Charged
    the fork alone, the bench MLP's first checkpoint cost 12 of ~120 ms and
    the next came ten times too soon.)"""
    from nndb.timetravel.machine import Checkpoint
    from nndb.timetravel.schedule import BASELINE, Settling

    m = TimeMachine("auto")
    assert m.step_time() is None
    ck = Checkpoint(1, 0, 0, None, "auto", 0.0, 0.01)
    m.checkpoints[1] = ck
    m._settling = Settling(ck, 0.01, m.SETTLE, m.SETTLE_S, None)
    now, window = 0.0, []
    # copy-on-write: 30 ms, then 5 ms, then steps of 2 ms; once the window
    # has closed, steps of 1 ms (one slow one among them: the median holds)
    for took in [0.030, 0.005] + [0.002] * 600:
        now += took
        window.append(took)
        m._settle(took, now)
        if m._settling.baseline is not None:
            break
    assert now >= m.SETTLE_S and ck.cost_s == 0.01          # the window closed: no cost yet
    for i in range(BASELINE):
        now += 0.001
        m._settle(0.009 if i == 3 else 0.001, now)
        assert (m._settling is None) == (i == BASELINE - 1)
    assert ck.cost_s == pytest.approx(0.01 + sum(window) - 0.001 * len(window))
    assert m.policy.cost_s == pytest.approx(ck.cost_s)          # (what the schedule spaces them by)
    assert not m.step_times           # (the baseline's steps are not the run's median either)


def test_an_adaptive_checkpoint_lets_the_writer_thread_write_the_buffered_steps_first(tmp_path, monkeypatch):
    """A due checkpoint with PREFLUSH_STEPS or more steps buffered hands them
    to the writer's thread and forks at the first step end after it is done
    (or PREFLUSH_WAIT_S later); with fewer, or on a schedule of steps, at once."""
    from types import SimpleNamespace
    from nndb.store.writer import TraceWriter
    from nndb.tracer.recorder import StepRecord

    w = TraceWriter(str(tmp_path / "t.h5"), {}, flush_steps=10 ** 6, flush_secs=1e9)
    gate = threading.Event()
    real_write = w._write
    monkeypatch.setattr(w, "_write", lambda block: (gate.wait(5), real_write(block)))
    m = TimeMachine("auto")
    taken = []
    monkeypatch.setattr(m, "take", lambda s, step, kind: taken.append(step))
    s = SimpleNamespace(rec=SimpleNamespace(writer=w))
    step = 0
    m.at_step_end(s, step)                  # step 0: due, nothing buffered: at once
    assert taken == [0]
    m.policy.taken(0, 0.0, m.clock())       # (the fake take: the next one is due 0.1 s later)
    import numpy as np
    for step in range(1, m.PREFLUSH_STEPS + 5):
        w.append(StepRecord(step, 0.1, 1, 1, [("x", "act")], np.zeros((1, 9))))
    import time
    time.sleep(0.15)
    m.at_step_end(s, step)                  # due, 36 buffered: handed to the thread, not taken
    assert taken == [0] and not w._rows and w.busy
    m.at_step_end(s, step + 1)
    assert taken == [0]                     # still writing
    gate.set()
    w._thread.join()
    m.at_step_end(s, step + 2)              # written: taken now
    assert taken == [0, step + 2] and w.steps_written == m.PREFLUSH_STEPS + 4
    w.close("finished", 0)


def test_checkpoint_memory_is_walked_only_when_the_resident_sizes_pass_the_cap(monkeypatch):
    """PSS (a walk of the pages, 8-10 ms a checkpoint) is read only when the
    checkpoints' resident sizes (a bound on it, read for nothing) add up to
    more than --checkpoint-memory; then automatic ones are dropped by PSS."""
    from nndb.timetravel.machine import Checkpoint

    m = TimeMachine("auto", memory_kib=1000)
    for n in range(1, 5):
        m.checkpoints[n] = Checkpoint(n, 10 * n, 100 + n, None, "auto", 0.0, 0.01)
    walked, dropped = [], []
    monkeypatch.setattr(forking, "resident_kib", lambda pid: 250)
    monkeypatch.setattr(forking, "memory_kib", lambda pid: walked.append(pid) or {"pss": 400, "private": 1})
    monkeypatch.setattr(m, "_drop", lambda c: (dropped.append(c.step), m.checkpoints.pop(c.number)))
    m._keep_within_memory()
    assert walked == [] and dropped == []          # 4 x 250 KiB <= 1000: no walk, none dropped
    monkeypatch.setattr(forking, "resident_kib", lambda pid: 300)
    m._keep_within_memory()
    assert walked and dropped == [20, 30]          # by PSS: 4 x 400, then 3 x 400, then 2 (first, newest)


def test_a_checkpoint_that_fails_to_fork_a_replica_ends_instead_of_running_on():
    """A checkpoint whose fork of a replica fails (out of memory) must end
    there: an exception out of its loop would let it run the rest of the
    program as a second live run."""
    import os
    live, ours = Channel.pair()
    pid = os.fork()
    if pid == 0:
        try:
            live.close()

            def no_memory(close=()):
                raise OSError(12, "Cannot allocate memory")
            forking.fork = no_memory
            forking.checkpoint_loop(ours)
        finally:
            os._exit(3)                        # out of the loop: what must not happen
    ours.close()
    live.send({"op": "resume"})
    _, status = os.waitpid(pid, 0)
    live.close()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 1


def test_info_checkpoints_says_when_dear_checkpoints_break_the_replay_goal():
    """A 100 ms checkpoint waits 4 s (the tail's, 2.5%; 5 s at the 2%
    budget): on 1 ms steps that is 4000 steps of replay against a 2 s goal,
    and 'info checkpoints' says so with the cost that made it."""
    from nndb.timetravel.machine import Checkpoint
    from nndb.timetravel.schedule import Settling

    m = TimeMachine("auto")
    m.step_times.extend([0.001] * 50)
    m.checkpoints[1] = Checkpoint(1, 0, 0, None, "auto", 0.0, 0.1)
    m.policy.taken(0, 0.1, m.clock())
    assert m.broken_promise(1000) is None                   # 1 s of replay: within the goal
    warning = m.broken_promise(5000)
    assert "does not keep its replay bound (2 s)" in warning and "steps 0 to 5000" in warning
    assert "costs up to 100 ms" in warning and "takes one every 4 s" in warning


class _ScanMachine:
    """A time machine whose scan replicas report canned point hits."""

    def __init__(self, checkpoints, hits, mode="fork"):
        from types import SimpleNamespace
        self.mode = mode
        self.checkpoints = {i: SimpleNamespace(number=i, step=st, kind="auto", pid=0, cost_s=0.001)
                            for i, st in enumerate(checkpoints)}
        self.hits = hits
        self.scans = []

    def replay(self, s, request, step):
        self.scans.append((request["from"], request["end"]))
        return {"result": {"hits": [h for h in self.hits if request["from"] <= h["step"] <= request["end"]]}}


def _hit(step, at_end, points=(1,)):
    return {"step": step, "at_step_end": at_end, "points": list(points)}


def test_reverse_continue_searches_the_newest_segment_first():
    from nndb.timetravel.search import reverse_continue_target
    m = _ScanMachine([0, 5], [_hit(2, True), _hit(7, True)])
    assert reverse_continue_target(None, m, 9, True) == (7, "stop", "reverse-continue: 1 held", 0)
    assert m.scans == [(5, 9)]
    m = _ScanMachine([0, 5], [_hit(2, True), _hit(7, True)])
    assert reverse_continue_target(None, m, 7, True) == (2, "stop", "reverse-continue: 1 held", 0)
    assert m.scans == [(5, 7), (0, 4)]


def test_reverse_continue_stops_before_a_module_hit_and_finds_none_before_the_first():
    from nndb.timetravel.search import reverse_continue_target
    m = _ScanMachine([0], [_hit(3, False, ())])
    assert reverse_continue_target(None, m, 6, True) == (2, "points", "reverse-continue: a rule held", 0)
    m = _ScanMachine([0], [_hit(0, False)])
    assert reverse_continue_target(None, m, 6, True)[:2] == (0, "stop")
    assert reverse_continue_target(None, _ScanMachine([0], [_hit(6, True)]), 6, True) is None
    assert reverse_continue_target(None, _ScanMachine([0], [_hit(6, True)]), 6, False) == \
        (6, "stop", "reverse-continue: 1 held", 0)


def test_reverse_continue_with_a_module_breakpoint_scans_the_step_of_a_newer_checkpoint():
    """A checkpoint at the end of step 6 (the stop rc starts from): a module breakpoint's hit in
    step 6's forward is in the older segment, which now ends with step 6, not 5."""
    from types import SimpleNamespace
    from nndb.debugger.points import ModuleBreak
    from nndb.timetravel.search import reverse_continue_target

    class Resumed(_ScanMachine):
        """A replica resumed at the end of step ``first`` sees no hit inside that step."""
        def replay(self, s, request, first):
            seen = self.hits
            self.hits = [h for h in seen if h["step"] > first or h["at_step_end"]]
            try:
                return super().replay(s, request, first)
            finally:
                self.hits = seen

    s = SimpleNamespace(points={1: ModuleBreak(number=1, glob="0")})
    m = Resumed([0, 6], [_hit(6, False, ())])
    assert reverse_continue_target(s, m, 6, True) == (5, "points", "reverse-continue: a rule held", 0)
    assert m.scans == [(6, 6), (0, 6)]
    m = Resumed([0, 6], [_hit(6, False, ())])                  # (none: step ends alone are searched)
    assert reverse_continue_target(None, m, 6, True) is None and m.scans == [(6, 6), (0, 5)]
    # step 0's forward, before the first checkpoint, is replayed from the start where a replica may respawn
    # (it said None: 'No earlier step' where the breakpoint held there), and shown at step 0's end
    m = Resumed([0], [_hit(0, False, ())], mode="auto")
    assert reverse_continue_target(s, m, 3, True)[:2] == (0, "stop") and m.scans == [(0, 3), (0, 0)]
    m = Resumed([0], [_hit(0, False, ())], mode="auto")           # (from step 0's end: nothing before it)
    assert reverse_continue_target(s, m, 0, True) is None and m.scans == []
    m = Resumed([0], [_hit(0, False, ())])                          # (fork: nothing replays step 0)
    assert reverse_continue_target(s, m, 3, True) is None and m.scans == [(0, 3)]


def test_reverse_continue_without_checkpoints_scans_from_the_start():
    """No fork checkpoint (DataLoader workers: auto falls back to respawn; --replica respawn):
    the steps before the first checkpoint are scanned from the start (they were never searched)."""
    from nndb.timetravel.search import reverse_continue_target
    m = _ScanMachine([], [_hit(2, True), _hit(4, True)], mode="auto")
    assert reverse_continue_target(None, m, 4, True) == (2, "stop", "reverse-continue: 1 held", 0)
    assert m.scans == [(0, 4)]
    m = _ScanMachine([6], [_hit(2, True), _hit(9, True)], mode="auto")    # (the first checkpoint late)
    assert reverse_continue_target(None, m, 9, True)[0] == 2 and m.scans == [(6, 9), (0, 5)]
    m = _ScanMachine([], [_hit(2, True)], mode="respawn")
    assert reverse_continue_target(None, m, 2, True) is None and m.scans == [(0, 2)]
    assert reverse_continue_target(None, _ScanMachine([], [_hit(2, True)]), 4, True) is None   # fork: none


def test_go_to_travels_back_and_refuses_the_future():
    from types import SimpleNamespace
    from nndb.errors import CommandError
    from nndb.timetravel.navigate import go_to
    went = []
    m = SimpleNamespace(replica=False, travel=lambda s, *a: went.append(a))
    s = SimpleNamespace(last_step=4)
    go_to(s, m, 2, why="back")
    assert went == [(2, "stop", "back")]
    with pytest.raises(CommandError, match="has not run yet"):
        go_to(s, m, 5)
    with pytest.raises(CommandError, match="before the end of step 0"):
        go_to(s, m, -1)


def test_go_to_on_a_replica_runs_forward_itself():
    from types import SimpleNamespace
    from nndb.timetravel.navigate import go_to
    resumed = []
    s = SimpleNamespace(last_step=4, set_until=lambda step: resumed.append(("until", {"until": step})),
                        input=SimpleNamespace(keep_point_commands=False))
    go_to(s, SimpleNamespace(replica=True), 6)
    assert resumed == [("until", {"until": 6})]
    assert s.input.keep_point_commands          # (the commands after it in a breakpoint's list run where it stops)
    # (on the recorded run's timeline, not past the present: the live run's last step)
    s.replica = SimpleNamespace(present=5)
    from nndb.errors import CommandError
    with pytest.raises(CommandError, match=r"step 6 has not run yet \(the present is step 5\)"):
        go_to(s, SimpleNamespace(replica=True, changed=False), 6)
    go_to(s, SimpleNamespace(replica=True, changed=True), 6)          # (a changed timeline runs on)
    assert resumed[-1] == ("until", {"until": 6}) and s.replica.forward_goto == 6


def test_compare_predictions_pairs_steps_and_finds_the_first_difference():
    from nndb.timetravel.compare import compare_predictions
    base = [{"step": 3, "loss": 1.0, "grad_norm": 2.0, "findings": []},
            {"step": 4, "loss": 0.5, "grad_norm": 1.0, "findings": []}]
    changed = [{"step": 3, "loss": 1.0, "grad_norm": 2.0, "findings": []},
               {"step": 4, "loss": None, "grad_norm": 3.0, "findings": ["nan-loss"]}]
    rows, first = compare_predictions(base, changed)
    assert first == 4
    assert rows[0]["loss_delta"] == 0.0 and rows[1]["loss_delta"] is None
    assert rows[1]["grad_norm_changed"] == 3.0 and rows[1]["findings"] == ["nan-loss"]
    assert compare_predictions(base, base)[1] is None
    assert compare_predictions(base, changed[:1]) == (rows[:1], None)


def test_checkpoint_inventory_reads_each_checkpoints_memory():
    import os
    from nndb.timetravel.inventory import checkpoint_inventory, total_private_kib
    m = _ScanMachine([5, 0], [])
    m.checkpoints[0].pid = os.getpid()
    m.checkpoints[1].pid = -1                       # (no such process: its memory is unknown)
    infos = checkpoint_inventory(m)
    assert [i.step for i in infos] == [0, 5]
    assert infos[0].private_kib is None and infos[0].pss_kib is None
    if os.path.exists("/proc/self/smaps_rollup"):
        assert infos[1].private_kib > 0
    assert total_private_kib(infos) == (infos[1].private_kib or 0)


def test_ctrl_c_in_a_replica_s_replay_gives_up_instead_of_stopping_there():
    """Ctrl-C while a replica replays (or scans, or predicts) ends its work:
    the role says so and the live run's command fails; elsewhere it stops."""
    s = _session()
    calls = []

    class Replaying:
        kind, replaying = "goto", True

        def interruptible(self):
            return True

        def interrupted(self, session):
            calls.append(session)

    s.live, s.replica = True, Replaying()
    assert s.request_interrupt() and calls == [s] and not s.control.interrupt_requested
    s.replica = None
    s.rec = None
    s.sync_hooks = lambda: None
    assert s.request_interrupt() and s.control.interrupt_requested            # the live run: stop at the next point


def test_progress_line_counts_steps_and_estimates_the_rest():
    from nndb.timetravel.roles import progress_line
    assert progress_line(100, 400, 2.0) == ("nndb: replaying: 100 of 400 step(s), about 6 s left; "
                                            "Ctrl-C stops it and leaves you where you were")
    assert "left" not in progress_line(0, 400, 1.0)
    assert progress_line(3, 300, 1.0, "predicting", "takes you to the present (step 20)") == (
        "nndb: predicting: 3 of 300 step(s), about 99 s left; Ctrl-C stops it and takes you to the present (step 20)")


def test_a_replica_counts_its_steps_as_its_stop_line_does():
    """From the checkpoint's step (the issue's 'replaying: 27 of 28' then '33 step(s) replayed')."""
    from nndb.timetravel.roles import Goto, Scan
    assert Goto(None, {"target": 33, "replayed_from": 0}).replayed(27) == (27, 33)
    assert Goto(None, {"target": 33, "replayed_from": None}).replayed(33) == (34, 34)    # (from the start)
    assert Scan(None, {"from": 4, "end": 20, "replayed_from": 2}).replayed(20) == (18, 18)


def test_a_replay_that_differs_in_the_last_bits_where_replays_are_inexact_says_why():
    """Without intel-openmp (GNU OpenMP, two threads) a forked replica computes on one thread:
    'goto 8' on a Hugging Face Trainer run gave up with 'loss recorded 5.11756706237793,
    replayed 5.1175665855407715 (likely cause: randomness the checkpoint does not hold, a file
    that changed since, or threads); ... it read the files the run wrote since it started as
    they are now: run/bi/checkpoint-6/config.json ...', files the replay never read, and the
    reason the live run knew and had just warned of left out.  A difference in the last bits,
    where the live run said replays are not exact, is put down to that, with no files."""
    from nndb.timetravel.roles import Role
    why = ("the GNU OpenMP runtime cannot run 2 threads in a forked process: replicas run with 1 thread "
           "and may differ in the last bits (install intel-openmp to replay exactly)")
    role = Role(None, {"inexact": why, "replayed_from": 0})
    assert role._cause(8, 5.11756706237793, 5.1175665855407715) == \
        f"replays are not exact here, and the two differ in the last bits: {why}"
    assert role.in_last_bits
    # more than the last bits, or replays that are exact: what a replay cannot hold, as before
    assert role._cause(8, 5.1175, 5.2).startswith("randomness the checkpoint does not hold")
    assert not role.in_last_bits
    exact = Role(None, {"replayed_from": 0})
    assert exact._cause(8, 5.11756706237793, 5.1175665855407715).startswith("randomness")
    assert not exact.in_last_bits
