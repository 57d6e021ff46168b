"""``catch nan`` armed at the step end (the default): a step whose recorded
NaN/Inf counts went bad is replayed on a replica with every operation
checked, and the run stops at that step's end naming the same operation,
module, source line and step as the per-operation check (``--eager``), which
still stops inside the operation.  Where no replay is possible it says so."""
import json
import os
import re
import textwrap

import pytest

from conftest import Ran, example, nndb
from nndb.store.reader import TraceReader

PHASES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "catchnan_phases.py")


def _line(path: str, marker: str) -> int:
    with open(path) as fh:
        return 1 + next(i for i, line in enumerate(fh) if marker in line)


def _run(tmp_path, script, commands, *flags, name="r", args=()) -> Ran:
    argv = ["run", "--batch", "--nx", "--rules", "none", "--trace", str(tmp_path / f"{name}.h5"),
            "--report", str(tmp_path / f"{name}.json"), *flags]
    for c in commands:
        argv += ["-e", c]
    r = Ran(nndb(*argv, script, *args, cwd=str(tmp_path)), argv)
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    return r


def _stops(tmp_path, name="r") -> list:
    return json.loads((tmp_path / f"{name}.json").read_text())["stops"]


KEYS = ("op", "phase", "module", "file", "line", "node", "step")

# (script, its arguments, what the first catch nan hit is: op, phase, module, node, line marker or number, step)
CASES = {
    "forward": (example("nan_lr.py"), (), ("addmm", "forward", "2", None, 34, 6)),
    "backward": (PHASES, ("--phase", "backward"), ("div", "backward", "dist", "SqrtBackward0", "BACKWARD LINE", 3)),
    "optimizer": (PHASES, ("--phase", "optimizer"), ("addcdiv_", "optimizer", None, None, "STEP LINE", 3)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_step_end_catch_names_what_the_eager_check_names(tmp_path, case):
    script, args, (op, phase, module, node, line, step) = CASES[case]
    if isinstance(line, str):
        line = _line(script, line)
    cheap = _run(tmp_path, script, ["catch nan", "continue", "kill"], name="cheap", args=args)
    eager = _run(tmp_path, script, ["catch nan --eager", "continue", "kill"], name="eager", args=args)
    a, b = _stops(tmp_path, "cheap")[0], _stops(tmp_path, "eager")[0]
    assert a["reason"] == b["reason"] == "catchpoint" and a["step"] == b["step"] == step, (cheap.stdout, eager.stdout)
    da, db = a["detail"], b["detail"]
    assert {k: da[k] for k in KEYS} == {k: db[k] for k in KEYS}
    assert (da["op"], da["phase"], da["module"], da["line"], da["step"]) == (op, phase, module, line, step)
    assert da["file"].endswith(os.path.basename(script))
    if node is not None:
        assert da["node"] == node
    assert da["located"] == "replay" and "located" not in db
    # the eager check stops inside the step, at the operation's line; the step-end catch at the step's end
    assert f"found by a replay of step {step} with every operation checked" in cheap.stdout
    ran_at = db.get("via", db)["line"]               # (a NaN from an Inf: where the NaN was made)
    # (the hit names its step on its first line, its inputs follow, then where it stopped)
    assert re.search(rf"of step {step} \(.*\n(  .*\n)*> \S+\({ran_at}\)", eager.stdout), eager.stdout


def test_healthy_steps_run_without_the_op_recorder(tmp_path):
    """The cost: with the catch point armed at the step end, only the step
    that went bad has its operations recorded (by the replay); armed eagerly,
    every step up to the stop does."""
    _run(tmp_path, example("nan_lr.py"), ["catch nan", "continue", "kill"], name="cheap")
    _run(tmp_path, example("nan_lr.py"), ["catch nan --eager", "continue", "kill"], name="eager")
    with TraceReader(str(tmp_path / "cheap.h5")) as a, TraceReader(str(tmp_path / "eager.h5")) as b:
        assert a.lineage_steps() == [6]
        assert b.lineage_steps() == [0, 1, 2, 3, 4, 5]


def test_goto_then_continue_stops_inside_the_operation(tmp_path):
    """What the stop at the step's end says to do works: in the past the catch
    point checks every operation and stops in the one that made the NaN."""
    r = _run(tmp_path, PHASES, ["catch nan", "continue", "goto 2", "continue", "where", "present", "kill"],
             args=("--phase", "backward"))
    assert "'goto 2' then 'continue' stops inside the operation" in r.stdout
    past = r.stdout.split("In the past")[1].split("Back in the present")[0]
    assert re.search(r"Catchpoint 1 \(catch nan\): div made Inf in the backward pass of step 3 "
                     r"\(module dist, SqrtBackward0, \S+:\d+\)", past), r.stdout
    assert "-> loss.backward()" in past


def test_without_time_travel_the_catch_point_checks_every_operation(tmp_path):
    r = _run(tmp_path, example("nan_lr.py"), ["catch nan", "continue", "kill"], "--replica", "off")
    assert "every operation's output is checked while it is enabled (no step can be replayed here: " \
           "--replica off)" in r.stdout
    stop = _stops(tmp_path)[0]
    assert stop["detail"]["op"] == "addmm" and stop["step"] == 6 and "located" not in stop["detail"]
    assert re.search(r"of step 6 \(.*\n(  .*\n)*> ", r.stdout), r.stdout     # inside the step, not at its end


UNSEEDED = textwrap.dedent('''
    import os, torch, torch.nn as nn
    # seeded by the OS's entropy: a replay from the start differs (a script that seeds
    # nothing replays exactly: a respawned replica starts torch's generator where the run's did)
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    model = nn.Sequential(nn.Linear(4, 3), nn.Softmax(dim=1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
        p = model(x)
        onehot = nn.functional.one_hot(y, 3).float()
        if step == 3:
            p = p * onehot
        loss = -(onehot * torch.log(p)).sum(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
''')


def test_a_replay_that_diverges_says_the_operation_was_not_located(tmp_path):
    script = tmp_path / "unseeded.py"
    script.write_text(UNSEEDED)
    r = _run(tmp_path, str(script), ["catch nan", "continue", "kill"], "--replica", "respawn")
    assert re.search(r"Catchpoint 1 \(catch nan\): step 3 made NaN \(loss.*\), but the operation could not be "
                     r"located: the replay diverged from the recorded run at step 0", r.stdout), r.stdout
    assert "'catch nan --eager' checks every operation as the run goes" in r.stdout
    stop = _stops(tmp_path)[0]
    assert stop["reason"] == "catchpoint" and stop["step"] == 3 and "diverged" in stop["detail"]["unlocated"]
    assert "op" not in stop["detail"]                 # no operation named: none was found


def test_catch_arguments():
    from nndb.commands.lineage import _catch_arg
    from nndb.errors import CommandError
    assert _catch_arg("nan") == ("nan", False, False)
    assert _catch_arg("inf --eager fail") == ("inf", True, True)
    assert _catch_arg("nonfinite fail --eager") == ("nonfinite", True, True)
    with pytest.raises(CommandError, match="catch what"):
        _catch_arg("nan --eagre")


# -- the step-end policy, as a unit ------------------------------------------------------------

def _record(step, bad=()):
    """A StepRecord of loss and fc.weight's grad; ``bad``: {name: (nan, inf)}."""
    import numpy as np
    from nndb.tracer import stats as S
    from nndb.tracer.recorder import StepRecord
    names = [("loss", "loss"), ("fc.weight", "grad")]
    raw = np.zeros((2, S.N_RAW))
    for i, (n, _) in enumerate(names):
        nan, inf = dict(bad).get(n, (0, 0))
        raw[i, S.RAW_FIELDS.index("nnan")], raw[i, S.RAW_FIELDS.index("ninf")] = nan, inf
    return StepRecord(step, 0.0, 1, 1, names, raw)


# one op (a log) that made an Inf from finite inputs, then a mul that made NaN of it
_OPS = [["log", "forward", [0], [1], [[3]], ["float32"], None, "t.py", 11, None],
        ["mul", "forward", [1, 2], [3], [[3]], ["float32"], None, "t.py", 12, None]]
_EVENTS = [[0, {"nan": False, "inf": True, "in_nan": False, "in_inf": False, "origin": None, "inputs": []}],
           [1, {"nan": True, "inf": False, "in_nan": False, "in_inf": True, "origin": 0, "inputs": []}]]


def test_the_step_end_check_replays_the_step_where_a_series_first_went_bad():
    from nndb.debugger.points import CatchPoint
    from nndb.lineage.catchstep import StepEndCatch
    nan, inf = CatchPoint(number=1, what_kind="nan"), CatchPoint(number=2, what_kind="inf")
    replayed = []

    def replay(step):
        replayed.append(step)
        return {"ops": _OPS, "events": _EVENTS}

    c = StepEndCatch()
    check = lambda rec: c.check(rec, lambda: [nan, inf], replay, lambda p, d: True)   # noqa: E731
    assert check(_record(0)) == [] and replayed == []                           # finite: no replay
    hits = check(_record(1, {"loss": (1, 0)}))
    assert replayed == [1]
    assert [(p.number, d["op"], d["line"], d.get("via", {}).get("op")) for p, d in hits] == \
        [(2, "log", 11, None), (1, "log", 11, "mul")]                          # in the order the ops ran
    assert check(_record(2, {"loss": (1, 0)})) == [] and replayed == [1]       # already bad: not again
    check(_record(3, {"loss": (1, 0), "fc.weight": (0, 2)}))                   # a new series went bad
    assert replayed == [1, 3]
    check(_record(4))
    check(_record(5, {"loss": (1, 0)}))                                         # bad again after a finite step
    assert replayed == [1, 3, 5]


def test_the_step_end_check_says_when_it_cannot_locate_the_operation():
    from nndb.debugger.points import CatchPoint
    from nndb.errors import CommandError
    from nndb.lineage.catchstep import StepEndCatch
    nan, inf = CatchPoint(number=1, what_kind="nan"), CatchPoint(number=2, what_kind="inf")

    def replay(step):
        raise CommandError("nndb: time travel is off in this run (--replica off)")

    hits = StepEndCatch().check(_record(4, {"fc.weight": (3, 0)}), lambda: [nan, inf], replay,
                                lambda p, d: True)
    assert [p.number for p, _ in hits] == [1]                # only NaN: the inf point does not fire
    d = hits[0][1]
    assert d["step"] == 4 and d["unlocated"] == "time travel is off in this run (--replica off)"
    assert d["series"] == ["grad fc.weight"] and "op" not in d
    # a replay that finds no operation making the value (a NaN in the batch): the step where it
    # first appeared is the stop, saying so (it was a note, and no stop)
    hits = StepEndCatch().check(_record(4, {"loss": (1, 0)}), lambda: [nan], lambda st: {"ops": [], "events": []},
                                lambda p, d: True)
    assert [p.number for p, _ in hits] == [1]
    assert hits[0][1]["step"] == 4 and "came in with the step's data" in hits[0][1]["unlocated"]
