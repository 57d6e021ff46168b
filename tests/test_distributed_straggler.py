"""A compute straggler under DDP: its slowness hides in the other ranks' wait
inside the gradients' all-reduce (every rank's step time is equal), so the
``straggler`` rule reads each rank's forward time (to the step's first
gradient: no collective before it).  Units on rows; the live judge in the
front (nndb.distributed.judge) against the offline one; end to end on 2 gloo ranks
through ``nndb run --nproc-per-node 2 --batch``: the planted job (rank 1
sleeps in its forward) names rank 1 and "compute", live and in ``nndb
inspect RUNDIR --ranks``; the healthy job is silent both ways."""
import json
import os
import random
import subprocess
import sys

import pytest

from conftest import ROOT, nndb
from nndb.distributed.judge import LiveJudge
from nndb.rules.crossrank import judge_job

SCRIPTS = os.path.join(ROOT, "tests", "scripts")


def _row(rank, step, data, compute, forward=None):
    r = {"step": step, "inputs": [[step, 1000 * step + rank]], "data_time": data,
         "compute_time": compute, "timed": 1}
    if forward is not None:
        r["forward_time"] = forward
    return r


def _ddp_rows(slow_forward: float) -> dict:
    """Two ranks under DDP: equal step times (rank 0 waits for rank 1 in its
    backward's all-reduce), rank 1's forward ``slow_forward`` s longer."""
    return {r: [_row(r, s, 0.001, 0.02 + slow_forward, 0.004 + (slow_forward if r == 1 else 0.0))
                for s in range(10)] for r in (0, 1)}


def test_compute_straggler_found_from_the_forward_time():
    found = [f for f in judge_job(_ddp_rows(0.05)) if f.rule == "straggler"]
    assert [(f.step, f.evidence["rank"], f.evidence["where"]) for f in found] == [(2, 1, "compute")]
    assert "forward (to the first gradient, before any all-reduce) 54.0 ms against the median rank's 29.0 ms" \
        in found[0].message
    assert judge_job(_ddp_rows(0.0)) == []
    # without forward times (an older trace): the step times are equal, nothing to say
    old = {r: [dict(row, forward_time=None) for row in rows] for r, rows in _ddp_rows(0.05).items()}
    assert judge_job(old) == []
    # a data-loading straggler is still one (its forward is as fast as the others')
    data = {r: [_row(r, s, 0.05 if r == 1 else 0.001, 0.02, 0.004) for s in range(10)] for r in (0, 1)}
    assert [(f.evidence["rank"], f.evidence["where"]) for f in judge_job(data)] == [(1, "data loading")]


def test_live_judge_equals_offline_whatever_order_the_rows_come_in():
    rows = _ddp_rows(0.05)
    rows[0].append({"step": 12, "inputs": [[10, 1], [11, 2], [12, 3]]})      # (the run's end: its own steps)
    rows[1].append({"step": 11, "inputs": [[10, 4], [11, 5]]})
    offline = [f.as_dict() for f in judge_job(rows)]
    for seed in range(5):
        said = []
        live = LiveJudge(2, said.append)
        queues = {r: list(v) for r, v in rows.items()}
        rng = random.Random(seed)
        while any(queues.values()):                 # each rank in step order, the ranks interleaved at random
            r = rng.choice([r for r, q in queues.items() if q])
            live.add(r, queues[r].pop(0))
        live.finish()
        assert [f.as_dict() for f in live.findings] == offline
        assert len(said) == len(offline) and "straggler at step 2 (across ranks): rank 1" in said[0]


def _front_job(tmp_path, name, *args):
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("NNDB_DEBUG", None)
    report = tmp_path / f"{name}.json"
    p = subprocess.run([sys.executable, "-m", "nndb", "run", "--batch", "-q", "--nproc-per-node", "2",
                        "--report", str(report),
                        os.path.join(SCRIPTS, "dist_ddp.py"), *args], capture_output=True, text=True,
                       timeout=240, env=env, cwd=str(tmp_path), stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    with open(report) as fh:
        report = json.load(fh)
    return report["run_dir"], p.stderr, report


def _offline(run_dir):
    p = nndb("inspect", run_dir, "--ranks", "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["cross_rank_findings"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="gloo jobs on Linux")
def test_planted_compute_straggler_live_and_offline_and_healthy_silent(tmp_path):
    run_dir, err, report = _front_job(tmp_path, "planted", "--slow-forward", "0.05", "--bn")   # (BN: DDP broadcasts)
    live = report["cross_rank_findings"]
    strag = [f for f in live if f["rule"] == "straggler"]
    assert [(f["evidence"]["rank"], f["evidence"]["where"]) for f in strag] == [(1, "compute")], live
    assert "straggler at step" in err and "(across ranks): rank 1 is a straggler" in err
    assert "its compute: its forward" in strag[0]["message"]
    assert _offline(run_dir) == live                    # the same judge over the traces: the same findings
    run_dir, err, report = _front_job(tmp_path, "healthy")
    assert report["cross_rank_findings"] == [] and "across ranks" not in err
    assert _offline(run_dir) == []
