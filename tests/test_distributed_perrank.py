"""--lineage and --export under ``nndb run --nproc-per-node``: every rank
records its own lineage in its own trace and exports to its own place
(tensorboard:DIR -> DIR/rank<R>; mlflow: the run <name>-rank<R>)."""
import os
import sys

import pytest

from conftest import nndb
from nndb.export.targets import ExportTarget
from nndb.store.reader import TraceReader
from test_distributed_run import _assert_none_left, _copy, _digests

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="gloo jobs on Linux")


def test_each_rank_records_its_lineage_and_exports_to_its_own_directory(tmp_path):
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    script = _copy(tmp_path, "distrun_ddp_mlp.py")
    r = nndb("run", "--batch", "-q", "--nproc-per-node", "2", "--lineage", "1:3", "--export", "tensorboard:tb",
             script, cwd=tmp_path, timeout=150)
    assert r.returncode == 0, r.stderr[-3000:]
    digests = _digests(r.stdout)
    assert sorted(digests) == [0, 1] and len(set(digests.values())) == 1
    (run_dir,) = os.listdir(tmp_path / "nndb-runs")
    assert sorted(os.listdir(tmp_path / "tb")) == ["rank0", "rank1"]
    names = []
    for rank in (0, 1):
        with TraceReader(str(tmp_path / "nndb-runs" / run_dir / f"rank{rank}.h5")) as t:
            assert t.meta["rank"] == rank
            assert t.lineage_steps() == [1, 2]
            names.append(sorted({op[0] for op in t.lineage(2)["ops"]}))
            assert {"addmm.default", "allreduce_.default"} <= set(names[-1]), names[-1]     # (DDP's too)
            assert t.end["steps"] == 6
        acc = ea.EventAccumulator(str(tmp_path / "tb" / f"rank{rank}"), size_guidance={ea.SCALARS: 0})
        acc.Reload()
        loss_tags = [tag for tag in acc.Tags()["scalars"] if tag.startswith("loss")]
        assert loss_tags, acc.Tags()["scalars"]
        assert sorted(e.step for e in acc.Scalars(loss_tags[0])) == list(range(6))
    assert names[0] == names[1]             # (the same model on both ranks)
    _assert_none_left(str(tmp_path))


def test_an_export_target_for_a_rank():
    tb = ExportTarget("tensorboard", "/x/tb")
    assert tb.for_rank(1) == ExportTarget("tensorboard", "/x/tb/rank1")
    assert ExportTarget("mlflow", "file:/m", "exp").for_rank(0) == ExportTarget("mlflow", "file:/m", "exp",
                                                                                 "nndb-rank0")
    assert ExportTarget("mlflow", "file:/m", "exp", "run").for_rank(2).run_name == "run-rank2"
