"""Time travel's parts on their own: the channel, the session hand-over, what
blocks fork(), and when a replay is said not to be exact."""
import threading

import pytest

from nndb.debugger import points as P
from nndb.debugger.driver import DebugOptions, build_session
from nndb.debugger.frontend import ScriptedFrontend
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
    s.add_point(P.StepBreak, {"step": 7}, condition="$loss > 1")
    w = s.add_point(P.Watch, {"kind": "grad", "label": "grad", "glob": "fc*", "stat": "norm", "op": ">",
                              "value": 10.0, "consecutive": 3})
    w.hits, w.streak["fc.weight"] = 2, 1
    s.points[1].commands = ["p $loss", "continue"]
    s.new_display("$step", compile("1", "<d>", "eval"))
    s.rules.rule("nonfinite").action = "fail"
    s.rules.set_enabled("dead_relu", False)
    s.queue.append(QueuedLine("info checkpoints", "cmds.nndb", 4))
    s.machine.timelines.append({"id": 1, "origin": "step 3 of timeline 0", "change": "set lr 1", "status": "left"})
    state = s.snapshot()
    t = _session()
    t.restore(state)
    assert [type(p).__name__ for p in t.points.values()] == ["StepBreak", "Watch"]
    assert t.points[1].condition == "$loss > 1" and t.points[1].commands == ["p $loss", "continue"]
    assert t.points[2].hits == 2 and t.points[2].streak == {"fc.weight": 1} and t.points[2].value == 10.0
    assert t.add_point(P.StepBreak, {"step": 9}).number == 3 and [d[:2] for d in t.displays] == [(1, "$step")]
    assert t.new_display("$loss", compile("1", "<d>", "eval")) == 2
    assert t.rules.rule("nonfinite").action == "fail" and not t.rules.rule("dead_relu").enabled
    assert [(q.text, q.source, q.line) for q in t.queue] == [("info checkpoints", "cmds.nndb", 4)]
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
    import nndb.runmeta
    monkeypatch.setattr(nndb.runmeta, "openmp_runtime", lambda: runtime)
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

    m = TimeMachine("auto")
    m.step_times.extend([0.001] * 50)          # the median step: 1 ms
    ck = Checkpoint(1, 10, 0, None, "auto", 0.0, 0.02)
    m.checkpoints[1] = ck
    t0 = 100.0
    median, until = m.step_time(), t0 + m.SETTLE_S
    m._settling = [ck, 0.02, m.SETTLE, until, median, 0.02]
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
    assert m.policy.interval_s == pytest.approx(ck.cost_s / m.policy.budget)

    # a fork with no slower step after it costs the fork
    ck2 = Checkpoint(2, 20, 0, None, "auto", 0.0, 0.03)
    m.checkpoints[2] = ck2
    m._settling = [ck2, 0.03, m.SETTLE, 0.0, 0.001, 0.03]
    m._settle(0.0009, 1.0)
    m._settle(0.0009, 1.001)
    assert m._settling is None and ck2.cost_s == 0.03
