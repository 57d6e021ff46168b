"""Time travel across ranks that a replica job answers (nndb.distributed.travel):
``predict`` and ``reverse-continue`` on a 2-rank gloo job at the prompt,
against an independent torchrun run; the replica's drift check."""
import contextlib
import os
import re
import sys
import time

import pytest

import nndb as nndb_api
from conftest import nndb
from test_distributed_run import _assert_none_left, _commands, _copy, _on_terminal, _reap, _torchrun

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="gloo jobs on Linux")


def _losses(text: str) -> dict:
    """(rank, step) -> the loss the script printed (the last time: a respawned job prints again)."""
    return {(int(r), int(s)): float(v) for r, s, v in
            re.findall(r"rank (\d) step (\d+) loss (\S+)", text.replace("\r", ""))}


def _table(out: str, rank: int) -> list:
    """predict's rows of one rank: [(step, loss, changed loss)]."""
    part = out.replace("\r", "").split(f"-- rank {rank} --")[1].split("-- rank")[0]
    return [(int(a), float(b), float(c)) for a, b, c in re.findall(r"^\s*(\d+)\s+(\S+)\s+(\S+)\s+\S+", part, re.M)
            if b != "Loss"]


def test_catch_nan_on_every_rank_finds_the_batch_s_nan_and_the_all_reduced_one(tmp_path):
    """Under DDP the gradient bucket that torch.empty makes at step 1 (DDP rebuilds its buckets
    after the first backward) is viewed per parameter before anything is written to it: its
    memory's NaN bit patterns (always NaN under torch.use_deterministic_algorithms, which fills
    empty memory with NaN; by chance otherwise) counted as a NaN the step held, and at step 2
    'catch nan' no longer looked for where a NaN came in: neither rank stopped (rank 1's batch
    held the planted NaN; rank 0's gradients the NaN the all-reduce brought), only the
    nonfinite rule spoke.  Batch mode: each rank runs on by itself, nothing depends on which
    rank gets anywhere first."""
    script = _copy(tmp_path, "distrun_nan_rank.py")
    r = nndb("run", "--batch", "-q", "--nproc-per-node", "2", "--trace", "out/", "-e", "catch nan", script,
             "--deterministic", cwd=tmp_path, timeout=150)
    assert r.returncode == 0, r.stderr[-3000:]
    stops = {}
    for rank in (0, 1):
        with nndb_api.open(str(tmp_path / "out" / f"rank{rank}.h5")) as t:
            stops[rank] = [(s["step"], s["reason"], s["detail"]["op"], s["detail"]["phase"], s["detail"]["line"])
                           for s in t.stops]
    planted = next(i for i, l in enumerate(open(script), 1) if "the planted NaN" in l)
    backward = next(i for i, l in enumerate(open(script), 1) if "loss.backward()" in l)
    assert stops[1] == [(2, "catchpoint", "lift_fresh", "forward", planted)], stops
    assert stops[0] == [(2, "catchpoint", "as_strided", "backward", backward)], stops
    # the nonfinite rule on rank 0, whose forward and loss were finite, said 'NaN first appeared in
    # grad module.2.bias' as if its own backward had made it; it names the all-reduce too
    said = {ln[:4]: ln for ln in r.stderr.splitlines() if "nonfinite at step 2" in ln}
    assert said["[r0]"].startswith("[r0] nndb: error: nonfinite at step 2: NaN first appeared in grad "), said
    assert ("this rank's forward and loss were finite: under DDP the gradients' all-reduce brings another "
            "rank's NaN into every rank's gradients") in said["[r0]"], said
    assert "NaN first appeared in act module.0" in said["[r1]"] and "all-reduce" not in said["[r1]"], said
    _assert_none_left(str(tmp_path))


@contextlib.contextmanager
def _prompt_job(tmp_path, name: str, start_timeout: float = 90, flags: tuple = ()):
    """A 2-rank job of tests/scripts/NAME (``nndb run --nproc-per-node 2 FLAGS``) at the
    prompt: yields ``cmd`` (a line typed at the prompt -> what it printed;
    ``cmd.startup``: what the job printed before its first prompt); at the end the
    job is continued to its end and must exit 0."""
    p, master, expect = _on_terminal(tmp_path, _copy(tmp_path, name), ("--nproc-per-node", "2", *flags))
    try:
        startup = expect("(nndb r0) ", timeout=start_timeout)
        cmd = _commands(master, expect)
        cmd.startup = startup.replace("\r", "")
        yield cmd
        os.write(master, b"continue\n")
        expect("nndb: the job ended (exit code 0)")
        p.wait(timeout=60)
    finally:
        _reap(p, master)
    assert p.returncode == 0


def test_catch_nan_at_the_job_s_prompt_is_set_on_every_rank(tmp_path):
    """'catch nan' at the job's prompt was set on the rank the prompt looked at only (rank 0:
    'info breakpoints' on rank 1 said 'No breakpoints or watchpoints.'): rank 1, whose batch
    holds the NaN, ran on through its NaN loss, and rank 0 stopped where the gradients'
    all-reduce brought the NaN to it.  It goes to every rank, as break and watch do ('info
    breakpoints' on rank 1 lists it), and rank 1 stops at the planted line: rank 0 cannot see
    the NaN before rank 1's backward sends it (rank 0 stopping first, once in a fresh clone's
    suite, was no race: rank 1's catch had missed its NaN, test_catch_nan_on_every_rank_...)."""
    p, master, expect = _on_terminal(tmp_path, _copy(tmp_path, "distrun_nan_rank.py"))
    try:
        expect("(nndb r0) ")
        cmd = _commands(master, expect)
        assert "Catchpoint 1: catch nan" in cmd("catch nan")
        assert "rank 1: at the start, no step finished" in cmd("rank 1")      # (it read 'rank 1: step None')
        assert "catch nan" in cmd("info breakpoints")
        out = cmd("continue")
        assert "nndb: 1 of 2 rank(s) stopped: r1" in out, out
        assert "the planted NaN" in out.split("Catchpoint 1 (catch nan)")[1], out
        os.write(master, b"kill\n")
        expect("nndb: the job ended")
        p.wait(timeout=60)
    finally:
        _reap(p, master)
    _assert_none_left(str(tmp_path))


def test_predict_and_reverse_continue_across_ranks(tmp_path):
    """At the end of step 4 of a 2-rank job: 'predict 3 --set lr=0.5' gives,
    on every rank, the baseline losses of the live job's own steps 5-7 and the
    changed losses of an independent torchrun run whose lr is set to 0.5
    after step 4; the live job is unchanged.  After 'set lr 0.5' at the stop,
    'predict 2' carries the change (the independent run's losses).
    'reverse-continue' replays the job with the breakpoint at step 1 and
    lands there (every rank; the change made at step 4 is not made again);
    from there it finds no earlier stop and stays.  A replica of a job that is
    not deterministic (seeded by the clock) is said to have drifted: no prediction."""
    script = _copy(tmp_path, "distrun_predict.py")
    os.environ["NNDB_TEST_LR_AT"] = "4:0.5"
    try:
        changed = _torchrun(script, cwd=tmp_path)
    finally:
        del os.environ["NNDB_TEST_LR_AT"]
    assert changed.returncode == 0, changed.stderr[-2000:]
    expect_changed = _losses(changed.stdout)
    p, master, expect = _on_terminal(tmp_path, script)

    def cmd(line):
        os.write(master, (line + "\n").encode())
        out = expect("(nndb r")
        expect(") ")
        return out

    try:
        expect("(nndb r0) ")
        cmd("break step 1")
        assert "all 2 rank(s) stopped at the end of step 1" in cmd("continue")
        assert "all 2 rank(s) stopped at the end of step 4" in cmd("until 4")
        t0 = time.time()
        out = cmd("predict 3 --set lr=0.5")
        took = time.time() - t0
        print(out)
        assert "each rank's loss at step 4 equals the live job's bit for bit" in out, out
        rows = {r: _table(out, r) for r in (0, 1)}
        for r in (0, 1):
            assert [s for s, _, _ in rows[r]] == [5, 6, 7], out
            for s, _, lc in rows[r]:
                assert f"{lc:.6g}" == f"{expect_changed[(r, s)]:.6g}", (r, s, out)
        assert "They first differ at step 6." in out       # (lr takes effect at step 5's update)
        out = cmd("p --ranks all $step")
        assert re.findall(r"^r(\d)\s+(\d+)\s*$", out.replace("\r", ""), re.M) == [("0", "4"), ("1", "4")]
        # a change made at the stop is the live job's: the replica makes it too, at the same step
        out = cmd("set lr 0.5")
        out = cmd("predict 2")
        assert "a replica job" in out, out
        for r in (0, 1):
            got = re.findall(r"^\s*(\d+)\s+(\S+)\s+\S+\s+\S+\s*$",
                             out.replace("\r", "").split(f"-- rank {r} --")[1].split("-- rank")[0], re.M)
            assert [(int(s), f"{float(v):.6g}") for s, v in got] == \
                [(s, f"{expect_changed[(r, s)]:.6g}") for s in (5, 6)], out
        out = cmd("reverse-continue")
        assert "the last stop before step 4 was at step 1: rank 0: Breakpoint 1" in out, out
        assert "nndb: all 2 rank(s) stopped at the end of step 1" in out
        assert "'set lr 0.5' (made at the end of step 4) is not made again" in out
        assert "nndb: every rank's loss at step 1 equals the run before's, bit for bit" in out
        out = cmd("p --ranks all $step")
        assert re.findall(r"^r(\d)\s+(\d+)\s*$", out.replace("\r", ""), re.M) == [("0", "1"), ("1", "1")]
        out = cmd("reverse-continue")
        assert "No earlier step where a breakpoint or watchpoint held" in out, out
        (tmp_path / "unseeded").write_text("")            # a replica from now on is seeded by the clock
        out = cmd("predict 1")
        assert "nndb: predict across ranks: the replica job drifted: rank 0's loss at step 1 is" in out, out
        assert "Predicted" not in out                       # no prediction
        (tmp_path / "unseeded").unlink()
        os.write(master, b"delete\n")
        expect(") ")
        os.write(master, b"continue\n")
        out = expect("nndb: the job ended (exit code 0)")
        live = _losses(out)
        for r in (0, 1):
            for s, lb, _ in rows[r]:
                assert f"{lb:.6g}" == f"{live[(r, s)]:.6g}", (r, s)      # the baseline is the live job's future
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
        os.close(master)
    assert p.returncode == 0
    print(f"predict across ranks (two replica jobs): {took:.1f} s")
    _assert_none_left(str(tmp_path))


class _Ranks:
    """A stand-in for the live console or a replica job: each rank answers ``p EXPR`` with a value."""

    def __init__(self, values):
        self.values = values

    def _on(self, rank, line):
        v = self.values[rank]
        return [("NameError: $loss is None", True)] if v is None else [(repr(float(v).hex()), False)]

    on = _on


def test_drift_check_bit_for_bit():
    from nndb.distributed.travel import drift
    live = _Ranks({0: 0.6931471805599453, 1: 0.5})
    assert drift(live, _Ranks({0: 0.6931471805599453, 1: 0.5}), [0, 1], 4) is None
    why = drift(live, _Ranks({0: 0.6931471805599453, 1: 0.5000000000000001}), [0, 1], 4)
    assert why.startswith("the replica job drifted: rank 1's loss at step 4 is 0.5000000000000001 there and "
                          "0.5 in the live job")
    assert why.endswith("no answer")
    why = drift(_Ranks({0: None, 1: 0.5}), live, [0, 1], 4)
    assert "rank 0 has no loss at step 4 to check the replica against" in why


def test_replica_command_line():
    from nndb.distributed.replica import replica_argv
    argv = ["run", "--run", "--every", "5", "--rules", "none", "--trace", "x.h5", "-e", "until 3", "--quiet",
            "/a/train.py", "--every", "2", "-e", "x"]
    # its own trace directory, every step recorded, no start-up commands; the script's arguments untouched
    assert replica_argv(argv) == ["run", "--rules", "none", "--quiet", "/a/train.py", "--every", "2", "-e", "x"]
    assert replica_argv(["run", "--trace", "t.h5", "-m", "pkg.train", "--lr", "1"]) == \
        ["run", "-m", "pkg.train", "--lr", "1"]


class _FakeJob:
    """A job that runs to the next of ``until`` and its breakpoint steps; it logs every line."""

    def __init__(self, breaks):
        self.at, self.breaks, self.log = None, breaks, []

    def stop_step(self):
        return self.at

    def on(self, rank, line):
        self.log.append((self.at, rank, line))
        return [("ok", False)]

    def resume(self, line):
        until = int(line.split()[1])
        start = -1 if self.at is None else self.at
        hit = [b for b in self.breaks if start < b < until]
        self.at = hit[0] if hit else until
        self.log.append((self.at, "all", line))
        what = f"Breakpoint 1, step {self.at} finished" if hit else f"Step {self.at} finished, loss 0.5"
        return {0: [(what, False)], 1: [("Interrupted: another rank stopped", False)]}


def test_replay_makes_the_changes_at_their_steps_and_notes_the_stops():
    from nndb.debugger.changes import Change
    from nndb.distributed.travel import to_step
    job, hits = _FakeJob([1, 3]), []
    changes = [Change("set lr 0.2", None, "start"), Change("set lr 0.3 rank 1", 2), Change("set lr 0.4", 4)]
    from nndb.distributed.console import Console
    assert to_step(job, [0, 1], 4, changes, Console._targets, hits=hits) is None
    assert [x for x in job.log if x[2].startswith("set")] == \
        [(None, 0, "set lr 0.2"), (None, 1, "set lr 0.2"), (2, 1, "set lr 0.3"), (4, 0, "set lr 0.4"),
         (4, 1, "set lr 0.4")]
    assert hits == [(1, "rank 0: Breakpoint 1, step 1 finished"), (3, "rank 0: Breakpoint 1, step 3 finished")]
    assert job.stop_step() == 4


def test_without_run_flag():
    from nndb.distributed.travel import without_run_flag
    assert without_run_flag(["run", "--run", "-q", "/a/t.py", "--run"]) == ["run", "-q", "/a/t.py", "--run"]


def test_travel_checked_against_the_run_before():
    from nndb.distributed.travel import check_travel
    now = _Ranks({0: 0.25, 1: 0.5})
    assert check_travel(now, [0, 1], 2, {0: (0.25).hex(), 1: (0.5).hex()}) == \
        "nndb: every rank's loss at step 2 equals the run before's, bit for bit"
    why = check_travel(now, [0, 1], 2, {0: (0.25).hex(), 1: (0.5000001).hex()})
    assert why.startswith("nndb: this run drifted: rank 1's loss at step 2 is 0.5 now and 0.5000001 in the run "
                          "before")
    assert "cannot be checked" in check_travel(now, [0, 1], 2, {0: (0.25).hex(), 1: None})


class _Model(_Ranks):
    """Each rank answers ``p float($loss).hex()`` with its loss, and the parameter norms'
    line (travel._WEIGHTS) with ``norms``'s (rank -> {name: norm}; None: not measured)."""

    def __init__(self, values, norms):
        super().__init__(values)
        self.norms = norms

    def on(self, rank, line):
        if "$weight" not in line:
            return self._on(rank, line)
        n = self.norms[rank]
        if n is None:
            return [("TypeError: float() argument must be a string or a real number", True)]
        return [(repr(";".join(f"{k}={float(v).hex()}" for k, v in sorted(n.items()))), False)]


def test_a_run_whose_loss_is_the_same_but_not_its_model_drifted():
    """The DDP tutorial's multigpu_torchrun.py initialises its model unseeded and its loss,
    cross-entropy over one class, is 0 at every step: 'goto 1' said 'every rank's loss at step 1
    equals the run before's, bit for bit' where module.bias's norm was 0.1188 and 0.1079 in
    the run before, and predict answered from a replica job of another model.  The
    parameters' norms are checked after the loss: a step not measured is not judged."""
    from nndb.distributed.travel import check_travel, drift
    norms = {0: {"w": 0.75, "b": 0.125}, 1: {"w": 0.75, "b": 0.125}}
    live = _Model({0: 0.0, 1: 0.0}, norms)
    other = _Model({0: 0.0, 1: 0.0}, {0: norms[0], 1: {"w": 0.75, "b": 0.25}})
    assert drift(live, _Model({0: 0.0, 1: 0.0}, norms), [0, 1], 1) is None
    why = drift(live, other, [0, 1], 1)
    assert why.startswith("the replica job drifted: rank 1's parameters at step 1 are not the live job's, its loss "
                          "the same (b's norm is 0.25 there and 0.125 in the live job)"), why
    assert why.endswith("no answer")
    assert drift(live, _Model({0: 0.0, 1: 0.0}, {0: None, 1: None}), [0, 1], 1) is None
    before = {0: (0.0).hex(), 1: (0.0).hex()}
    weights = {0: "b=%s;w=%s" % ((0.125).hex(), (0.75).hex()), 1: "b=%s;w=%s" % ((0.25).hex(), (0.75).hex())}
    why = check_travel(live, [0, 1], 1, before, weights)
    assert why.startswith("nndb: this run drifted: rank 1's parameters at step 1 are not the run before's, its "
                          "loss the same (b's norm is 0.125 now and 0.25 in the run before)"), why
    assert check_travel(live, [0, 1], 1, before, {0: weights[0], 1: None}) == \
        "nndb: every rank's loss at step 1 equals the run before's, bit for bit"


def test_a_replica_job_leaves_the_scripts_files_and_names_those_it_read(tmp_path):
    """predict's replica job ran the script from its start in the user's directory: it
    rewrote the file the live job writes (the DDP tutorial's snapshot.pt), and its drift,
    from reading that file at its start (the tutorial resumes from it), was blamed on a
    script that is not deterministic.  Its writes now go to scratch copies, and the drift
    names the file."""
    with _prompt_job(tmp_path, "distrun_resumes.py") as cmd:
        assert "all 2 rank(s) stopped at the end of step 3" in cmd("until 3")
        before = (tmp_path / "snapshot.txt").read_bytes()
        out = cmd("predict 1")
        assert "the replica job drifted" in out and "it read the files the run wrote since it started as " \
            "they are now: snapshot.txt" in out, out
        assert (tmp_path / "snapshot.txt").read_bytes() == before == b"step 2 lr 0.1\n"      # (step 3 ends in its step())
    assert (tmp_path / "snapshot.txt").read_bytes() == b"step 5 lr 0.1\n"
    _assert_none_left(str(tmp_path))


@pytest.mark.xdist_group("distrun_join")          # (conftest's distrun_join_plain: one torchrun job for both)
def test_predict_past_a_rank_out_of_inputs_under_join(tmp_path, distrun_join_plain):
    """At step 3 of a job whose rank 0 runs out of inputs after step 4
    (Join: it then shadows rank 1's collectives and comes to no stop
    again), 'predict 4' waited for ever for rank 0 to stop at step 7.  Now
    the replica settles as the live job does: rank 0's one step ahead and
    why it ended, rank 1's four, each loss the one torchrun's run prints."""
    expect_loss = _losses(distrun_join_plain.stdout)
    with _prompt_job(tmp_path, "distrun_join.py", start_timeout=150) as cmd:
        cmd("break step 3")
        assert "all 2 rank(s) stopped at the end of step 3" in cmd("continue")
        out = cmd("predict 4")
        rows = {r: _table(out, r) for r in (0, 1)}
        assert [s for s, _, _ in rows[0]] == [4] and [s for s, _, _ in rows[1]] == [4, 5, 6, 7], out
        for r in (0, 1):
            for s, loss, _ in rows[r]:
                assert f"{loss:.6g}" == f"{expect_loss[(r, s)]:.6g}", (r, s, out)
        assert ("The prediction ended early: rank 0 came to no stop: it waits in torch.distributed.all_reduce"
                in out), out
        out = cmd("p --ranks all $step")
        assert re.findall(r"^r(\d)\s+(\d+)\s*$", out, re.M) == [("0", "3"), ("1", "3")], out
        cmd("delete")
    _assert_none_left(str(tmp_path))


def test_predict_set_that_the_script_undoes_across_ranks(tmp_path):
    """A loop that sets the lr itself before every step (a warmup written into
    each param_group) undoes 'predict --set lr=...': across ranks predict says
    so under each rank's table, as it does in one process (it said nothing:
    'No difference in 2 step(s).' alone, as if the lr changed nothing)."""
    with _prompt_job(tmp_path, "distrun_warmup.py") as cmd:
        assert "all 2 rank(s) stopped at the end of step 2" in cmd("until 2")
        out = cmd("predict 2 --set lr=0.5")
        assert "No difference in 2 step(s)." in out, out
        for r in (0, 1):
            part = out.split(f"-- rank {r} --")[1].split("-- rank")[0]
            assert "Warning: the change 'set lr 0.5' did not hold: opt stepped with lr 0.05 in groups 0, 1 " \
                   "at step 3: the script sets it itself" in part, out


def test_eval_commands_run_at_the_jobs_prompt(tmp_path):
    """``nndb run --nproc-per-node 2 -e ... -x FILE`` at a terminal: the
    commands run at the job's one prompt, across the ranks, as if typed there.
    Each rank ran them by itself: '-e "p --ranks all $step"' was refused with
    "this session sees only rank 0 of 2, on its own (--batch: ...)" though no
    --batch was given, and a '-e kill' ended the job with nothing shown."""
    (tmp_path / "cmds.nndb").write_text("# at the first prompt\necho from the file\\n\n")
    flags = ("-x", "cmds.nndb", "-e", "until 2", "-e", "p --ranks all $step * 10")
    with _prompt_job(tmp_path, "distrun_warmup.py", flags=flags) as cmd:
        out = cmd.startup
        assert "from the file" in out and "nndb: all 2 rank(s) stopped at the end of step 2" in out, out
        assert re.findall(r"^r(\d)\s+(\d+)\s*$", out, re.M) == [("0", "20"), ("1", "20")], out
        assert "on its own" not in out, out
        out = cmd("p --ranks all $step")
        assert re.findall(r"^r(\d)\s+(\d+)\s*$", out, re.M) == [("0", "2"), ("1", "2")], out
