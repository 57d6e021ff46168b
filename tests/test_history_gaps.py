"""Full-tensor history and distributions, the second round: ``compare
--checkpoints`` for a tensor the trace has no histograms of (measured on
replicas), whole tensors of a loop without an optimizer, the room check
counting histograms as they are stored, and the prompt's abbreviations of
``commands`` / ``compare``."""
import importlib.util
import os
import re
import resource
import signal

import h5py
import numpy as np
import pytest

import nndb
from conftest import Ran, nndb as run_nndb, python, ROOT, example
from nndb import histogram as H
from nndb.store import fullstore as F

DYING = f"{ROOT}/tests/scripts/dying_relu_cnn.py"
MANUAL = f"{ROOT}/tests/scripts/manual_sgd_full.py"
LATE_GEN = f"{ROOT}/tests/scripts/gan_late_generator_full.py"


# -- compare --checkpoints on replicas -------------------------------------------------------

@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """The dying layer with histograms only every 11th step and checkpoints every
    10th: the checkpoints' steps have none in the trace, so ``compare`` measures
    them on replicas (step 11 is a full step: the trace's own histogram there is
    what the replica of checkpoint 10 must measure)."""
    d = tmp_path_factory.mktemp("measured")
    trace = str(d / "run.h5")
    cmds = ["break step 35", "continue", "compare act relu1 --checkpoints 4",
            "delete", "continue"]
    argv = ["run", "--batch", "-q", "--nx", "--trace", trace, "--full-every", "11", "--checkpoint-every", "10",
            *[x for c in cmds for x in ("-e", c)], DYING, "--steps", "40"]
    return trace, Ran(run_nndb(*argv, cwd=str(d)), argv), python(DYING, "--steps", "40", forked=True)


def test_compare_at_checkpoints_measures_what_the_trace_lacks_on_replicas(measured):
    trace, ran, plain = measured
    assert ran.returncode == 0, ran.stderr
    out = ran.stdout
    block = out.split("act relu1: step ")[1]
    # checkpoints 10, 20, 30 and the stop's at 35, none a full step: a replica resumed from each
    # runs the step after it and reads the histogram from that step's record
    assert block.startswith("11 against step 36")
    assert "measured on replicas (not in the trace): checkpoint 10 -> step 11, checkpoint 20 -> step 21, " \
           "checkpoint 30 -> step 31, checkpoint 35 -> step 36\n" in block
    line = block.split("share of zeros at each step: ")[1].splitlines()[0]
    shares = [float(x) for x in re.findall(r"\d+: ([\d.]+)%", line)]
    assert len(shares) == 4 and shares == sorted(shares) and shares[0] < 90 and shares[-1] > 98
    # what the replica measured at step 11 is the trace's own histogram of that full step, exactly
    t = nndb.open(trace)
    assert t.histogram_steps("relu1", "act") == [0, 11, 22, 33]
    h11 = t.histogram("relu1", "act", 11)
    zeros = int(re.search(r"^zeros\s+(\d+) \(", block, re.M).group(1))
    assert zeros == h11[H.I_ZERO] and h11.sum() == 1024
    q99 = re.search(r"^q0\.99 \(approx\.\)\s+~(\S+) \[(\S+), (\S+)\]", block, re.M).groups()
    lo, est, hi = H.quantile_bounds(h11, 0.99)
    assert (float(q99[1]), float(q99[2])) == pytest.approx((lo, hi), rel=1e-3)
    t.close()
    # the live run is untouched: the script's own digest, as without nndb
    assert plain.returncode == 0
    digest = [l for l in plain.stdout.splitlines() if l.startswith("digest")]
    assert digest and digest[0] in out.splitlines()
    assert "Traceback" not in ran.stderr


def test_a_checkpoint_that_cannot_be_measured_is_named_with_its_reason():
    from nndb.errors import UsageError
    from nndb.store import distributions as D
    h = H.exact(np.array([0.0, 1.0, 2.0], dtype=np.float32))
    plan = {"kind": "act", "name": "relu1", "checkpoints": [10, 20, 30], "known": True, "have": [10],
            "read": [(10, h)], "missing": [20, 30]}
    data = D.at_checkpoints(plan, {20: {"step": 21, "hist": h.tolist()},
                                   30: {"error": "the script ended (done) before a step after the checkpoint"}})
    assert [s["step"] for s in data["series"]] == [10, 21]
    assert data["measured"] == [{"checkpoint": 20, "step": 21}]
    assert data["skipped"] == [{"step": 30, "why": "the script ended (done) before a step after the checkpoint"}]
    with pytest.raises(UsageError, match=r"1 histogram\(s\) \(step 20: step 21 has no act relu1"):
        D.at_checkpoints(plan, {20: {"error": "step 21 has no act relu1"}, 30: {"error": "x"}})


def test_a_checkpoint_whose_next_step_is_the_next_checkpoints_is_not_compared_twice(tmp_path):
    """Checkpoints every step, histograms every 11th: a replica from checkpoint 10
    would measure step 11, which checkpoint 11's own histogram in the trace already
    is (the comparison read 'share of zeros at each step: ... 11: x%, 11: x%')."""
    trace = str(tmp_path / "run.h5")
    cmds = ["break step 11", "continue", "compare act relu1 --checkpoints 3", "delete", "continue"]
    argv = ["run", "--batch", "-q", "--nx", "--trace", trace, "--full-every", "11", "--checkpoint-every", "1",
            *[x for c in cmds for x in ("-e", c)], DYING, "--steps", "12"]
    ran = Ran(run_nndb(*argv, cwd=str(tmp_path)), argv)
    assert ran.returncode == 0, ran.stderr
    block = ran.stdout.split("act relu1: step ")[1]
    assert block.startswith("10 against step 11")
    assert "checkpoints at steps 9, 10, 11\n" \
           "  measured on replicas (not in the trace): checkpoint 9 -> step 10\n" \
           "  checkpoint 10: the step after it is checkpoint 11's, in the trace (not measured twice)\n" in block
    line = block.split("share of zeros at each step: ")[1].splitlines()[0]
    assert re.findall(r"(\d+): [\d.]+%", line) == ["10", "11"]


# -- whole tensors of a loop without an optimizer ------------------------------------------------

def test_a_hand_written_update_keeps_whole_gradients_and_parameters(tmp_path):
    """No torch.optim: the step ends at backward(); the gradients are taken there
    and the parameters after the update (at the next step's end, or the run's),
    each exactly the script's own values (fp32 keeps them bit for bit)."""
    trace = str(tmp_path / "m.h5")
    argv = ["run", "--batch", "-q", "--trace", trace, "--record-full", "grad:*", "--record-full", "param:0.*",
            "--precision", "fp32", MANUAL, "5"]
    ran = Ran(run_nndb(*argv), argv)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == python(MANUAL, "5", forked=True).stdout            # the same digest as without nndb
    spec = importlib.util.spec_from_file_location("manual_sgd_full", MANUAL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    seen = {}
    mod.train(5, lambda step, grads, params: seen.__setitem__(step, (grads, params)))
    t = nndb.open(trace)
    kept = {(e["kind"], e["name"]): sorted(x["step"] for x in t.full_tensors() if (x["kind"], x["name"]) ==
                                           (e["kind"], e["name"])) for e in t.full_tensors()}
    assert set(kept) == {("grad", n) for n in ("0.weight", "0.bias", "2.weight", "2.bias")} | \
        {("param", "0.weight"), ("param", "0.bias")}
    assert all(steps == [0, 1, 2, 3, 4] for steps in kept.values())
    for step, (grads, params) in seen.items():
        for name, g in grads.items():
            assert np.array_equal(t.tensor(name, "grad", step), g.numpy()), (name, step)
        for name in ("0.weight", "0.bias"):
            # after the step's own update: the last step's too, taken at the run's end
            assert np.array_equal(t.tensor(name, "param", step), params[name].numpy()), (name, step)
    t.close()


def test_whole_tensors_of_a_step_closed_after_the_fact_are_the_next_steps(tmp_path):
    """A generator that first steps in iteration 2: step 3 holds its first step alone,
    and step k + 1 is iteration k from step 4 on, as the statistics have it.  The whole
    tensors taken in an iteration before the step it began was closed after the fact
    kept the old number: the discriminator's gradient and weight of iteration 3 were
    step 3's (where the statistics have none of it) and step 4 had none ('the trace
    keeps grad D.0.weight at steps 0, 1, 2, 3, 5, ...'); the generator's output was
    missing at steps 1 and 4 and step 3, which runs no forward, had iteration 3's."""
    trace = str(tmp_path / "g.h5")
    argv = ["run", "--batch", "-q", "--nx", "--trace", trace, "--record-full", "grad:*0.weight",
            "--record-full", "param:*0.weight", "--record-full", "act:gen", "--precision", "fp32", LATE_GEN]
    ran = Ran(run_nndb(*argv), argv)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == python(LATE_GEN, forked=True).stdout            # the same digest as without nndb
    spec = importlib.util.spec_from_file_location("gan_late_generator_full", LATE_GEN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    seen = {}
    mod.train(7, lambda i, name, kind, t: seen.__setitem__((name, kind, i), t.numpy()))
    t = nndb.open(trace)
    iteration = {0: 0, 1: 1, 2: 2, 4: 3, 5: 4, 6: 5, 7: 6}                  # (step 3: the generator's alone)
    for kind, name in (("grad", "disc.0.weight"), ("param", "disc.0.weight"), ("act", "gen")):
        kept = sorted(x["step"] for x in t.full_tensors() if (x["kind"], x["name"]) == (kind, name))
        assert kept == sorted(iteration), (kind, name, kept)
        if kind != "act":
            measured = list(t.history(name, kind, "norm")[0])
            assert measured == sorted(iteration), (kind, name, measured)    # (the statistics' steps)
        for step, i in iteration.items():
            assert np.array_equal(t.tensor(name, kind, step).reshape(-1),
                                  seen[("disc.0.weight" if kind != "act" else "gen", kind, i)].reshape(-1)), \
                (kind, name, step)
    t.close()


def test_a_glob_for_the_qualified_name_keeps_step_0_too(tmp_path):
    """Two models: names are qualified ('disc.0.weight') once step 0 ends, and a rule
    written with them matched nothing in step 0 ('the trace keeps grad D.0.weight at
    steps 1, 2, ...' on a GAN: step 0 silently missing).  One model: its names stay
    unqualified, and a glob with the model's variable keeps nothing, step 0 included."""
    trace = str(tmp_path / "g.h5")
    argv = ["run", "--batch", "-q", "--nx", "--trace", trace, "--record-full", "grad:disc.0.weight",
            "--record-full", "act:gen.1", "--precision", "fp32", LATE_GEN, "3"]
    ran = Ran(run_nndb(*argv), argv)
    assert ran.returncode == 0, ran.stderr
    t = nndb.open(trace)
    assert sorted((x["kind"], x["name"], x["step"]) for x in t.full_tensors()) == \
        [("act", "gen.1", i) for i in range(3)] + [("grad", "disc.0.weight", i) for i in range(3)]
    spec = importlib.util.spec_from_file_location("gan_late_generator_full", LATE_GEN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    seen = {}
    mod.train(3, lambda i, name, kind, t: seen.__setitem__((name, kind, i), t.numpy()))
    assert np.array_equal(t.tensor("disc.0.weight", "grad", 0), seen[("disc.0.weight", "grad", 0)])
    t.close()
    trace = str(tmp_path / "m.h5")
    argv = ["run", "--batch", "-q", "--nx", "--trace", trace, "--record-full", "grad:model.0.weight",
            "--record-full", "param:0.bias", MANUAL, "3"]
    ran = Ran(run_nndb(*argv), argv)
    assert ran.returncode == 0, ran.stderr
    t = nndb.open(trace)
    assert sorted((x["kind"], x["name"], x["step"]) for x in t.full_tensors()) == \
        [("param", "0.bias", i) for i in range(3)]
    t.close()


# -- the room check counts histograms as stored ---------------------------------------------------

def test_the_room_check_counts_histogram_blocks_as_they_are_stored(tmp_path):
    """A block of histogram rows takes ~1/15 of its 1.6 KB a series once
    shuffled and deflated: the room estimate is at least what the file grows
    by for it, and not far above (it was the uncompressed size, ~15x)."""
    rng = np.random.default_rng(0)
    path = str(tmp_path / "h.h5")
    with h5py.File(path, "w", libver="latest") as f:
        ds = F.create(f)
        written = 0
        for block in range(3):
            pending = F.FullPending()
            for step in range(10):
                vals = [(rng.standard_normal(3000) * 10.0 ** rng.integers(-4, 2) * (rng.random(3000) < 0.6))
                        .astype(np.float32) for _ in range(20)]
                pending.hists.append((step, list(range(20)), np.stack([H.exact(v) for v in vals])))
            need = pending.bytes_needed(written)
            f.flush()
            before, stored = os.path.getsize(path), F.stored_bytes(ds)
            written = pending.write(ds, written)
            f.flush()
            grew = os.path.getsize(path) - before
            assert F.stored_bytes(ds) - stored <= need
            if block:            # (the first block also allocates the dataset's index: the margin's part)
                assert grew <= need <= 2 * grew, (grew, need)
            assert need < 10 * 20 * 1600 / 8            # (uncompressed it was 10 rows x 20 series x 1.6 KB)


def test_with_room_to_spare_no_histogram_is_deflated_for_the_room_check(tmp_path, monkeypatch):
    """The room check counts a block's histograms as deflated (hist_bytes, which deflates
    them as HDF5 will) only where their size before compression would not fit: far from
    any limit each chunk was deflated twice, 0.9% of a recorded MLP step's instructions.
    The histograms are written all the same, and near a limit the exact count decides
    (test_a_tight_file_size_limit_keeps_the_steps_that_fit_with_their_histograms)."""
    import torch
    from nndb.store import fullstore
    measured = []
    real = fullstore.hist_bytes
    monkeypatch.setattr(fullstore, "hist_bytes", lambda block: measured.append(block.shape) or real(block))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randint(0, 2, (32,))
    path = tmp_path / "h.h5"
    with nndb.record(path, rules=None, full_every=1, flush_every=10) as rec:
        for _ in range(40):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    assert measured == []
    t = rec.trace
    assert t.histogram_steps("0.weight", "param") == list(range(40))
    # the bound the check used first: the histograms' chunks before compression, above the deflated count
    pending = fullstore.FullPending()
    pending.hists.append((0, [0, 1, 2], np.zeros((3, F.K.HIST_BINS), dtype=np.int64)))
    assert pending.bytes_needed(0, exact=False) > pending.bytes_needed(0) > 0
    assert measured == [(1, 3, F.K.HIST_BINS)]


def _file_limit(limit: int):
    def apply():        # (in the child: EFBIG rather than death by SIGXFSZ)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_tight_file_size_limit_keeps_the_steps_that_fit_with_their_histograms(tmp_path):
    """Histograms at every step under a 1 MB limit, in blocks of 50 steps: each
    block takes ~160 KB, its histograms ~80 KB of it.  Counted uncompressed
    (2.1 MB a block) not one block fitted: the trace kept 0 steps.  Counted as
    stored, recording stops at the block that would not fit with the room kept
    for HDF5's metadata (ROOM_MARGIN) and twice the rows' growth rate: 150."""
    path = str(tmp_path / "limited.h5")
    argv = ["run", "--batch", "-q", "--replica", "off", "--flush-every", "50", "--flush-secs", "1000",
            "--full-every", "1", "--trace", path, example("mlp.py"), "--steps", "220"]
    ran = Ran(run_nndb(*argv, preexec_fn=_file_limit(1_000_000), timeout=300), argv)
    assert ran.returncode == 0, ran.stderr
    said = [l for l in ran.stderr.splitlines() if "cannot write trace" in l]
    assert len(said) == 1 and "File too large" in said[0], ran.stderr
    kept = int(said[0].split("keeps the ")[1].split(" steps")[0])
    assert kept >= 150 and os.path.getsize(path) > 0.55 * 1_000_000, (kept, os.path.getsize(path))
    t = nndb.open(path)
    assert list(t.steps) == list(range(kept)) and t.histogram_steps("loss", "loss") == list(range(kept))
    t.close()


# -- abbreviations at the prompt ----------------------------------------------------------------

def test_com_is_ambiguous_as_in_gdb_and_names_the_abbreviation_of_each():
    from nndb.commands import TABLE
    from nndb.errors import CommandError
    with pytest.raises(CommandError) as e:
        TABLE.lookup("com")
    assert str(e.value) == 'ambiguous command "com": commands (comm), compare (comp)'
    assert TABLE.lookup("comm").name == "commands" and TABLE.lookup("comp").name == "compare"
    assert TABLE.lookup("compare").name == "compare" and TABLE.lookup("commands").name == "commands"
    # an alias is named where it is the shortest word for a command
    with pytest.raises(CommandError, match=r"reverse-continue \(rc\), reverse-next \(rn\), reverse-step \(rs\)"):
        TABLE.lookup("rev")
    # every abbreviation an error names resolves to its command
    for c in TABLE.commands:
        assert TABLE.lookup(TABLE.shortest_prefix(c.name)).name == c.name
