"""What each rank does on its own in a job's prompt: --lineage and --export
(every rank records its own lineage in its own trace and exports to its own
place: tensorboard:DIR -> DIR/rank<R>; mlflow: the run <name>-rank<R>),
``commands`` on every rank's breakpoint, and a module breakpoint that stops
one rank inside a step while the others wait where they are."""
import os
import sys

import pytest

from nndb.export.targets import ExportTarget
from nndb.store.reader import TraceReader
from test_distributed_run import _assert_none_left, _commands, _copy, _digests, _on_terminal

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="gloo jobs on Linux")


def test_an_export_target_for_a_rank():
    tb = ExportTarget("tensorboard", "/x/tb")
    assert tb.for_rank(1) == ExportTarget("tensorboard", "/x/tb/rank1")
    assert ExportTarget("mlflow", "file:/m", "exp").for_rank(0) == ExportTarget("mlflow", "file:/m", "exp",
                                                                                 "nndb-rank0")
    assert ExportTarget("mlflow", "file:/m", "exp", "run").for_rank(2).run_name == "run-rank2"


def test_commands_on_every_rank_a_module_breakpoint_on_one_and_per_rank_lineage_and_export(tmp_path):
    """``commands`` given once runs on every rank's breakpoint; a module
    breakpoint on rank 1 stops it inside step 2, and rank 0 is left where
    it is (waiting in a collective), shown by its stack (gdb's all-stop).
    With --lineage and --export each rank records its lineage in its own
    trace and exports to its own directory (one job for all of it)."""
    import re
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    script = _copy(tmp_path, "distrun_ddp_mlp.py")
    p, master, expect = _on_terminal(tmp_path, script, ("--nproc-per-node", "2", "--lineage", "1:3",
                                                        "--export", "tensorboard:tb"))

    cmd = _commands(master, expect)

    try:
        expect("(nndb r0) ", timeout=150)
        cmd("break step 1")
        os.write(master, b"commands\n")
        assert "on every rank), one per line" in expect(">")
        os.write(master, b"p $step * 100\n")
        expect(">")
        out = cmd("end")
        assert "error" not in out.lower(), out
        out = cmd("continue")
        assert "\n100\n" in out and "nndb: all 2 rank(s) stopped at the end of step 1" in out, out
        cmd("rank 1")
        assert "commands: p $step * 100" in cmd("info breakpoints")      # (rank 1's breakpoint has them too)
        cmd("delete")
        out = cmd("break module *0 rank 1")
        assert "Breakpoint" in out, out
        out = cmd("continue")
        assert ("nndb: rank 0 did not stop: it waits in distrun_ddp_mlp.py:43 (loss.backward()), inside "
                "autograd's backward (where DDP all-reduces the gradients)") in out, out
        assert "Breakpoint 2, module module.0 forward (step 2)" in out
        assert "nndb: 1 of 2 rank(s) stopped: r1" in out
        out = cmd("p --ranks all $step")
        assert re.search(r"^r0\s+rank 0 is not at a stop: it waits in ", out, re.M), out
        assert re.search(r"^r1\s+2\s*$", out, re.M), out                      # (inside step 2)
        out = cmd("where --ranks all")
        assert "rank 0 (pid" in out and "distrun_ddp_mlp.py" in out, out
        cmd("delete")
        os.write(master, b"continue\n")
        out = expect("nndb: the job ended (exit code 0)")
        assert len(set(_digests(out.replace("\r", "")).values())) == 1
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
        os.close(master)
    assert p.returncode == 0
    (run_dir,) = os.listdir(tmp_path / "nndb-runs")
    assert sorted(os.listdir(tmp_path / "tb")) == ["rank0", "rank1"]
    names = []
    for rank in (0, 1):
        with TraceReader(str(tmp_path / "nndb-runs" / run_dir / f"rank{rank}.h5")) as t:
            assert t.meta["rank"] == rank and t.end["steps"] == 6
            assert t.lineage_steps() == [1, 2]
            names.append(sorted({op[0] for op in t.lineage(2)["ops"]}))
            assert {"addmm.default", "allreduce_.default"} <= set(names[-1]), names[-1]     # (DDP's too)
        acc = ea.EventAccumulator(str(tmp_path / "tb" / f"rank{rank}"), size_guidance={ea.SCALARS: 0})
        acc.Reload()
        loss_tags = [tag for tag in acc.Tags()["scalars"] if tag.startswith("loss")]
        assert loss_tags, acc.Tags()["scalars"]
        assert sorted(e.step for e in acc.Scalars(loss_tags[0])) == list(range(6))
    assert names[0] == names[1]             # (the same model on both ranks)
    _assert_none_left(str(tmp_path))
