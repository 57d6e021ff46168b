"""Cross-rank rules, FSDP shard merging and ``nndb inspect RUNDIR``.

Units: the pure functions on synthetic rows (fast).  End to end: tiny DDP and
FSDP jobs of 2 CPU ranks under ``torch.distributed.run`` with gloo, each rank
under ``nndb run --batch`` (tests/scripts/dist_ddp.py, dist_fsdp.py)."""
import json
import os
import re
import shutil
import subprocess
import sys
from types import SimpleNamespace

import h5py
import numpy as np
import pytest
import torch

from conftest import ROOT, nndb
from nndb.run.config import rank_trace_path
from nndb.rules.crossrank import CrossRankJudge, EpochTracker, judge_job
from nndb.store.merge import merge_raw_rows, merge_stats
from nndb.tracer import stats as S
from nndb.tracer.fingerprint import checksum

SCRIPTS = os.path.join(ROOT, "tests", "scripts")


# -- units -------------------------------------------------------------------------------

def test_checksum_exact_and_cheap_properties():
    a = torch.randn(5, 7)
    b = a.clone()
    assert checksum(a) == checksum(b)
    b[2, 3] = torch.nextafter(b[2, 3], torch.tensor(10.0))      # one ulp
    assert checksum(a) != checksum(b)
    assert checksum(a) != checksum(a.reshape(7, 5))              # the shape is part of it
    assert checksum(a) != checksum(a.double())


def test_rank_trace_path():
    assert rank_trace_path("run.h5", 1, 1) == "run.h5"
    assert rank_trace_path("run.h5", 1, 2) == "run.rank1.h5"
    assert rank_trace_path("out/", 0, 2) == os.path.join("out/", "rank0.h5")


def test_epoch_tracker():
    t = EpochTracker()
    seq = [1, 2, 3, 4, 1, 2, 3, 4]
    hits = [t.feed(i, v) for i, v in enumerate(seq)]
    assert hits[:7] == [None] * 7 and hits[7] == (7, 4)
    t = EpochTracker()                  # the first batch comes back, the rest does not: no epoch repeat
    assert all(t.feed(i, v) is None for i, v in enumerate([1, 2, 3, 4, 1, 5, 6, 7, 8]))
    t = EpochTracker()                  # the same batch every step is not an epoch
    assert all(t.feed(i, 9) is None for i in range(10))


def _row(step, params=None, inputs=None, bn=None, data=None, compute=None, loaders=None):
    r = {"step": step, "inputs": inputs if inputs is not None else [[step, 100 + step]]}
    if params is not None:
        r["params"] = params
        r["bn"] = bn or {}
    if data is not None:
        r.update(data_time=data, compute_time=compute, timed=1)
    if loaders is not None:
        r["loaders"] = loaders
    return r


def _rules(findings):
    return {(f.rule, f.step) for f in findings}


def test_judge_healthy_rows_silent():
    rows = {r: [_row(s, {"w": 5, "b": 6}, [[s, 10 * s + r]], data=0.001, compute=0.02,
                     loaders=[{"sampler": "DistributedSampler", "shuffle": True, "batches": 4}] if s == 0 else None)
                for s in range(12)] for r in (0, 1)}
    assert judge_job(rows) == []


def test_judge_planted_rows():
    loaders = [{"sampler": "DistributedSampler", "shuffle": True, "batches": 4, "samples": 32, "batch_size": 8,
                "drop_last": False}]
    rows = {}
    for r in (0, 1):
        rows[r] = []
        for s in range(12):
            params = {"w": 5 + (r if s >= 4 else 0), "b": 6}
            bn = {"bn": [16, 0.1 + r * 0.01, 1.0, 0.9, 3.0, 77 + r]}
            rows[r].append(_row(s, params, [[s, 1000 * r + s % 4]], bn, data=0.05 if r == 1 else 0.001,
                                compute=0.02 if r == 1 else 0.07, loaders=loaders if s == 0 else None))
    found = judge_job(rows)
    got = _rules(found)
    assert ("rank_divergence", 4) in got
    assert ("unsynced_batchnorm", 0) in got
    assert "epoch_repeats" not in {rule for rule, _ in got}     # (each rank's own: nndb.rules.epochs)
    strag = [f for f in found if f.rule == "straggler"]
    assert [(f.step, f.evidence["rank"], f.evidence["where"]) for f in strag] == [(2, 1, "data loading")]   # steps 0, 1, 2
    div = next(f for f in found if f.rule == "rank_divergence")
    assert div.tensor == "w" and div.severity == "error"


def test_judge_duplicates_and_live_equals_offline():
    rows = {r: [_row(s, {"w": 1}, [[s, 42 + s]]) for s in range(5)] for r in (0, 1)}
    offline = judge_job(rows)
    assert [(f.rule, f.step) for f in offline] == [("duplicate_batches", 1)]
    live = CrossRankJudge()             # fed as a front process would be, step by step
    for s in range(5):
        live.feed(s, {0: rows[0][s], 1: rows[1][s]})
    assert [f.as_dict() for f in live.findings] == [f.as_dict() for f in offline]


def test_merge_shards_exact():
    t = torch.randn(1001, dtype=torch.float64)
    t[3], t[10], t[500] = 0.0, float("nan"), float("-inf")
    parts = [t[:400], t[400:401], t[401:]]
    full = S.finalize(S.raw_now(t))
    from_rows = S.finalize(merge_raw_rows([S.raw_now(p) for p in parts]))
    from_stats = merge_stats([S.finalize(S.raw_now(p)) for p in parts])
    for got in (from_rows, from_stats):
        np.testing.assert_allclose(got, full, rtol=1e-12, equal_nan=True)
    assert from_stats[7] == 1 and from_stats[8] == 1 and from_stats[0] == 1001


# -- end to end ----------------------------------------------------------------------------

def _job(tmp_path, name, script, *args, timeout=240):
    """A torchrun job (a real subprocess: its start-up is its own), nndb in each rank."""
    out = tmp_path / name
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT
    env["OMP_NUM_THREADS"] = "1"
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        "-m", "nndb", "run", "--batch", "--replica", "off", "--trace", str(out) + "/", os.path.join(SCRIPTS, script),
                        *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=str(tmp_path),
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["rank0.h5", "rank1.h5"]
    return str(out), p


def _inspect(rundir, *extra):
    p = nndb("inspect", rundir, "--json", *extra)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("jobs")
    return {"healthy": _job(tmp, "healthy", "dist_ddp.py")[0],
            "planted": _job(tmp, "planted", "dist_ddp.py", "--no-set-epoch", "--perturb", "3", "--bn",
                            "--slow-rank", "0.05")[0],
            "dup": _job(tmp, "dup", "dist_ddp.py", "--no-sampler", "--epochs", "1")[0]}


def test_healthy_ddp_silent(jobs):
    data = _inspect(jobs["healthy"])
    assert data["world_size"] == 2 and [r["steps"] for r in data["ranks"]] == [12, 12]
    assert data["cross_rank_findings"] == []
    assert all(r["findings"] == [] for r in data["ranks"])
    params = [t for t in data["tensors"] if t["kind"] == "param"]
    assert params and all(t["merge"] == "replicated" for t in params)
    loss = next(t for t in data["tensors"] if t["kind"] == "loss")
    assert loss["merge"] == "batch" and loss["stats"]["count"] == 2          # one backward on each rank


def test_planted_ddp_findings(jobs):
    data = _inspect(jobs["planted"])
    first = {}
    for f in data["cross_rank_findings"]:
        first.setdefault(f["rule"], f)
    assert set(first) == {"rank_divergence", "unsynced_batchnorm", "straggler"}
    assert first["rank_divergence"]["step"] == 4            # changed after step 3's end: seen at step 4's
    assert first["rank_divergence"]["tensor"].endswith("0.weight")
    assert first["straggler"]["evidence"]["rank"] == 1
    assert first["straggler"]["evidence"]["where"] == "data loading"
    assert first["unsynced_batchnorm"]["step"] == 0
    # each rank's epoch that repeats is the finding of its own engine's rule, said once (4 steps an
    # epoch: steps 4-7 repeat 0-3)
    assert [[(f["rule"], f["step"]) for f in r["findings"]] for r in data["ranks"]] == [[("epoch_repeats", 7)]] * 2
    side = _inspect(jobs["planted"], "--ranks")
    w = next(t for t in side["tensors"] if t["kind"] == "param" and t["name"].endswith("0.weight"))
    assert set(w["by_rank"]) == {"0", "1"} and w["by_rank"]["0"]["norm"] != w["by_rank"]["1"]["norm"]
    # merged, the replicas that differ are not called replicated (they were, rank 0's row shown as the
    # model's: imagenet's CPU path under torchrun, which wraps no DDP, trains a model per rank)
    merged = {(t["name"], t["kind"]): t["merge"] for t in data["tensors"]}
    assert merged[(w["name"], "param")] == "differs", merged
    text = nndb("inspect", jobs["planted"]).stdout
    assert "rank_divergence at step 4" in text and "rank 1  warning  straggler" in text


def test_duplicate_batches(jobs):
    data = _inspect(jobs["dup"])
    assert [(f["rule"], f["step"]) for f in data["cross_rank_findings"]] == [("duplicate_batches", 1)]


def test_fsdp_shards_merged(tmp_path):
    rundir, p = _job(tmp_path, "fsdp", "dist_fsdp.py")
    truth = json.loads([l for l in p.stdout.splitlines() if l.startswith("{")][0])
    data = _inspect(rundir)
    params = {t["name"]: t for t in data["tensors"] if t["kind"] == "param"}
    assert set(params) == set(truth)
    for name, want in truth.items():
        got = params[name]
        assert got["merge"] == "shards" and got["stats"]["count"] == want["count"]
        assert got["stats"]["norm"] == pytest.approx(want["norm"], rel=1e-6)
    assert data["cross_rank_findings"] == []        # shards differ by design: no divergence


def test_inspect_bad_run_directories(jobs, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    for d, words in ((empty, "holds no rank traces"),):
        p = nndb("inspect", str(d))
        assert p.returncode == 2 and words in p.stderr and len(p.stderr.strip().splitlines()) == 1
    missing = tmp_path / "missing"
    missing.mkdir()
    shutil.copy(os.path.join(jobs["healthy"], "rank0.h5"), missing / "rank0.h5")
    p = nndb("inspect", str(missing))
    assert p.returncode == 2 and "lacks the trace of rank 1 of 2" in p.stderr
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(os.path.join(jobs["healthy"], "rank0.h5"), mixed / "rank0.h5")
    shutil.copy(os.path.join(jobs["planted"], "rank1.h5"), mixed / "rank1.h5")
    p = nndb("inspect", str(mixed))
    assert p.returncode == 2 and "mixes jobs" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    killed = tmp_path / "killed"
    shutil.copytree(jobs["healthy"], killed)
    with h5py.File(killed / "rank1.h5", "r+") as f:      # as a killed rank leaves it: no /end committed
        names = json.loads(f["committed"].attrs["names"])
        c = f["committed"][:]
        c[names.index("end")] = 0
        f["committed"][:] = c
    p = nndb("inspect", str(killed))
    assert p.returncode == 0 and "rank 1's trace is incomplete" in p.stdout



def test_python_api_job(jobs):
    import nndb
    with nndb.open(jobs["planted"]) as job:
        assert job.world_size == 2 and sorted(job.ranks) == [0, 1]
        assert {f["rule"] for f in job.findings} == {"rank_divergence", "unsynced_batchnorm", "straggler"}
        assert [f["rule"] for f in job.ranks[1].findings] == ["epoch_repeats"]


def test_epoch_repeats_one_process_live_and_on_the_trace(tmp_path):
    trace = str(tmp_path / "run.h5")
    p = nndb("run", "--batch", "--trace", trace, "--report", str(tmp_path / "r.json"),
             os.path.join(SCRIPTS, "planted_epoch_repeats_reseeded_loader.py"))
    assert p.returncode == 0, p.stderr
    assert "epoch_repeats at step 9: the batches of steps 5-9 repeat those of steps 0-4" in p.stderr
    c = nndb("check-trace", trace, "--json")
    found = [f for f in json.loads(c.stdout)["findings"] if f["rule"] == "epoch_repeats"]
    assert [f.pop("found_by") for f in found] == [["run", "check-trace"]]    # the run's, found again
    live = [f for f in json.load(open(tmp_path / "r.json"))["findings"] if f["rule"] == "epoch_repeats"]
    assert found == live and len(found) == 1 and found[0]["step"] == 9


def test_epoch_repeats_under_gradient_accumulation(tmp_path):
    """Two micro-batches a step: an epoch of 8 batches repeats in 4 steps, and the chance
    was read as 1/4! (no loader of 4 batches), far over epoch_chance: a rank that skipped
    set_epoch under no_sync() accumulation went unreported.  The chance is now that of the
    batches the steps start with (8 of 32 samples' 4-sample batches: once in 3.8e+16)."""
    script = os.path.join(SCRIPTS, "planted_epoch_repeats_accumulation.py")
    p = nndb("run", "--batch", "--trace", str(tmp_path / "run.h5"), script)
    assert p.returncode == 0, p.stderr
    assert ("epoch_repeats at step 7: the batches of steps 4-7 repeat those of steps 0-3 (the same samples "
            "in each batch) while the loader shuffles (a reshuffle repeats them once in 3.791e+16)") in p.stderr
    healthy = nndb("run", "--batch", "--trace", str(tmp_path / "ok.h5"), script, "--set-epoch")
    assert healthy.returncode == 0 and "warning" not in healthy.stderr, healthy.stderr
    loaders = [{"sampler": "DistributedSampler", "shuffle": True, "batches": 8, "samples": 32, "batch_size": 4,
                "drop_last": False}]
    rows = {r: [_row(s, {"w": 5}, [[s, 1000 * r + (s % 4 if r == 1 else s)]], loaders=loaders if s == 0 else None)
                for s in range(12)] for r in (0, 1)}
    assert [_epoch_rule(rows[r]) for r in (0, 1)] == [[], [7]]
    # an ordered loader of 8 batches, 2 a step, repeats by design beside a shuffled one of 16: the
    # loaders of the fewest batches a step decide
    ordered = [dict(loaders[0], shuffle=False), dict(loaders[0], batches=16, samples=64)]
    rows = [_row(s, {"w": 5}, [[s, s % 4]], loaders=ordered if s == 0 else None) for s in range(12)]
    assert _epoch_rule(rows) == []


def _epoch_rule(rows: list) -> list:
    """The steps ``epoch_repeats`` (a rank's own rule, nndb.rules.epochs) reports on one rank's
    rows, as its batches probe hands them over."""
    from nndb.rules.crossrank import shuffles
    from nndb.rules.epochs import EpochRepeats
    loaders = next(r["loaders"] for r in rows if "loaders" in r)
    facts = {"inputs": [i for r in rows for i in r["inputs"]], "shuffle": shuffles(loaders), "loaders": loaders}
    return [f.step for f in EpochRepeats().check(SimpleNamespace(facts={"batches": facts}))]


def test_an_epoch_that_repeats_is_its_rank_s_finding_said_once(tmp_path):
    """A job whose DistributedSampler shuffles every epoch alike (no set_epoch): each rank's own
    rule says its epoch repeats ('[r0] nndb: warning: epoch_repeats at step 7: the batches of
    steps 4-7 repeat ...'), and the front's rules across ranks said it again for each rank
    ('nndb: warning: epoch_repeats at step 7 (across ranks): rank 0's batches of steps 4-7
    ...'): four lines, and in 'nndb inspect RUNDIR' four findings, for one cause.  A rank's
    epoch is its own finding: said once a rank, live and in inspect."""
    script = os.path.join(SCRIPTS, "dist_ddp.py")
    r = nndb("run", "--batch", "--nproc-per-node", "2", "--trace", "out/", "--report", "job.json", script,
             "--no-set-epoch", "--epochs", "2", cwd=tmp_path, timeout=150)
    assert r.returncode == 0, r.stderr[-3000:]
    said = [ln for ln in r.stderr.splitlines() if "epoch_repeats" in ln]
    assert sorted(ln.split(":")[0] for ln in said) == ["[r0] nndb", "[r1] nndb"], said
    assert json.loads((tmp_path / "job.json").read_text())["cross_rank_findings"] == []
    data = _inspect(str(tmp_path / "out"))
    assert data["cross_rank_findings"] == []
    assert [[(f["rule"], f["step"]) for f in k["findings"]] for k in data["ranks"]] == [[("epoch_repeats", 7)]] * 2


def test_divergence_from_the_first_step_compared_says_the_replicas_may_never_have_agreed():
    """Replicas seeded per rank with the gradients all-reduced by hand (no DDP to broadcast
    rank 0's parameters) differ at step 0: 'the replicas have diverged' sent the user after a
    skipped all-reduce; it now names the per-rank initialisation too.  Replicas that agreed
    first keep the diverged wording."""
    never = {r: [_row(s, {"w": 5 + r, "b": 6}, [[s, 10 * s + r]]) for s in range(3)] for r in (0, 1)}
    (f,) = [f for f in judge_job(never) if f.rule == "rank_divergence"]
    assert f.step == 0 and "they differ from the first step compared" in f.message, f.message
    assert "torch.manual_seed(rank)" in f.message and "have diverged" not in f.message
    later = {r: [_row(s, {"w": 5 + (r if s >= 2 else 0), "b": 6}, [[s, 10 * s + r]]) for s in range(3)]
             for r in (0, 1)}
    (f,) = [f for f in judge_job(later) if f.rule == "rank_divergence"]
    assert f.step == 2 and "the replicas have diverged (a gradient not all-reduced" in f.message, f.message


def test_judge_takes_no_divergence_under_model_averaging():
    """Replicas that differ between averages (Local SGD: a row says the job holds one of
    torch's model averagers) are not a divergence; the same rows without it are."""
    rows = {r: [_row(s, {"w": 5 + (r if s % 4 else 0), "b": 6}, [[s, 10 * s + r]]) for s in range(9)]
            for r in (0, 1)}
    assert ("rank_divergence", 1) in _rules(judge_job(rows))
    rows[1][0]["averaging"] = True
    assert judge_job(rows) == []


@pytest.mark.parametrize("how", ["optimizer", "manual"])
def test_local_sgd_has_no_divergence_finding(tmp_path, how):
    """torch's Local SGD (PostLocalSGDOptimizer, or a PeriodicModelAverager the script
    calls after each step): after the warm-up the replicas differ at every step end, by
    design (they are averaged every 4 steps, after the step).  The job said, and inspect
    too, 'error rank_divergence at step 2: ... the replicas have diverged (a gradient not
    all-reduced ...)'."""
    rundir, p = _job(tmp_path, how, "dist_localsgd.py", *(["--manual"] if how == "manual" else []))
    rows = re.findall(r"^rank (\d) step (\d+) loss \S+ params (\w+)$", p.stdout, re.M)
    by = {(int(r), int(s)): d for r, s, d in rows}
    assert by[(0, 3)] != by[(1, 3)] and by[(0, 6)] == by[(1, 6)], p.stdout    # (the replicas do differ)
    data = _inspect(rundir)
    assert data["cross_rank_findings"] == []
    assert all(r["findings"] == [] for r in data["ranks"])
    if how == "optimizer":
        # The step ends as PostLocalSGDOptimizer.step() returns, after its averaging: at steps
        # 2, 6 and 10 the ranks' parameters are one (it ended as the inner SGD's step()
        # returned: the traces held each rank's before averaging, 1.6431252 on rank 1 at step
        # 2 where both ranks' weight was 1.6469641).
        import nndb as api
        norms = [api.open(os.path.join(rundir, f"rank{r}.h5")).history("module.0.weight", "param", "norm")[1]
                 for r in (0, 1)]
        for s in (2, 6, 10):
            assert by[(0, s)] == by[(1, s)] and norms[0][s] == norms[1][s], (s, norms)
        assert norms[0][3] != norms[1][3]


def test_a_partial_last_row_is_named_and_the_tensors_are_of_the_last_whole_step(tmp_path):
    """A job whose ranks end with an evaluation's backward() after their last step keep it as
    a partial row (step 4 of 4 whole steps, 0..3).  `nndb inspect RUNDIR` showed the span
    '0..4' and 'tensors at step 4 (the last step every rank recorded)': the merged table was
    that backward's (its gradient accumulated onto step 3's, no loss of a step), not a step's."""
    rundir, p = _job(tmp_path, "evalbw", "dist_ddp.py", "--epochs", "1", "--eval-backward")
    last = {int(m.group(1)): float(m.group(2))
            for m in re.finditer(r"rank (\d) last step's loss ([-+]?\d+\.\d+(?:[eE][-+]?\d+)?)", p.stdout)}
    # (a number, not \S+: the ranks' lines may come out on one line, 'rank 0 ... 1.066rank 1 ...')
    assert sorted(last) == [0, 1], p.stdout
    data = _inspect(rundir)
    assert [(r["first_step"], r["last_step"], r["partial_steps"]) for r in data["ranks"]] == [(0, 4, [4])] * 2
    assert data["step"] == 3
    loss = next(t for t in data["tensors"] if t["kind"] == "loss")
    assert loss["stats"]["count"] == 2
    assert loss["stats"]["mean"] == pytest.approx((last[0] + last[1]) / 2, rel=1e-6)
    text = nndb("inspect", rundir).stdout
    assert "0..4 (4 partial)" in text and "tensors at step 3 (the last whole step every rank recorded)" in text
