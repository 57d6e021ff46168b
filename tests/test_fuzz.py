"""``fuzz`` (coverage-guided fuzzing, TensorFuzz) and ``nndb fuzz``.

End to end on scripts/examples/fuzz_log_corner.py: a log-space regression
whose hand-written loss takes ``log(1 + out)``, positive on the data, NaN in
a corner of the input cube no training batch reaches; with ``--healthy``
the quantity is positive everywhere."""
import json
import os
import re

import pytest
import torch

from conftest import ROOT, example, nndb, python
from nndb.fuzz.coverage import Coverage
from nndb.fuzz.mutate import mutate, spec_for
from nndb.fuzz.search import FuzzConfig, Outcome, run

PLANTED = example("fuzz_log_corner.py")
TOKENS = os.path.join(ROOT, "tests", "scripts", "fuzz_tokens.py")
DROPOUT = os.path.join(ROOT, "tests", "scripts", "fuzz_dropout.py")
WORKERS = os.path.join(ROOT, "tests", "scripts", "fuzz_loader_workers.py")


@pytest.fixture(autouse=True)
def one_thread():
    """The engine's tiny tensors: one thread (a shared machine's oversubscribed
    threads made the 4000-mutant search test 50 times slower)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


ONE = {"OMP_NUM_THREADS": "1"}      # (subprocesses too: the same env with and without nndb)


def _plain(*args):
    if os.environ.get("OMP_NUM_THREADS") == ONE["OMP_NUM_THREADS"]:
        # (the suite's two workers on two cores: conftest set it before the zygote started, so
        # a child of the zygote has the thread count nndb(env=ONE) gives its run, and imports
        # no torch of its own)
        return python(*args, forked=True)
    import subprocess
    import sys
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=180,
                          env=dict(os.environ, **ONE))


def _digest(out: str) -> str:
    return re.search(r"^params (\w+)$", out, re.M).group(1)


# -- units -----------------------------------------------------------------------------------------
def test_integer_mutation_stays_in_the_vocabulary_and_leaves_the_observed_range():
    ids = torch.randint(0, 20, (64, 7))
    spec = spec_for(ids, vocab=50)
    assert (spec.kind, spec.lo, spec.hi) == ("int", 0, 49)
    g = torch.Generator().manual_seed(0)
    seen = torch.cat([mutate(ids, spec, 0.5, g).flatten() for _ in range(50)])
    assert seen.dtype == ids.dtype and int(seen.min()) >= 0 and int(seen.max()) <= 49
    assert int(seen.max()) > 19                          # beyond what the batch showed, inside the vocabulary
    no_vocab = spec_for(ids)                            # no embedding: the observed min..max
    assert (no_vocab.lo, no_vocab.hi) == (int(ids.min()), int(ids.max()))
    assert spec_for(torch.tensor([3, 59]), vocab=50).hi == 59    # ids past the vocabulary: the observed range


def test_float_mutation_is_bounded_by_the_inputs_range():
    x = torch.rand(32, 5) * 4 - 1
    spec = spec_for(x)
    g = torch.Generator().manual_seed(1)
    m = mutate(x, spec, 0.1, g)
    width = spec.hi - spec.lo
    assert float((m - x).abs().max()) <= 0.1 * width + 1e-6
    assert float(m.min()) >= spec.lo and float(m.max()) <= spec.hi and not torch.equal(m, x)
    assert spec_for(torch.ones(3)).kind == "fixed" and spec_for(torch.zeros(3, dtype=torch.bool)).kind == "fixed"


def test_coverage_keeps_only_vectors_far_from_all_kept():
    c = Coverage(threshold=1.0)
    c.calibrate(torch.tensor([[0.0, 0.0], [10.0, 0.0]]))
    new = c.novel(torch.tensor([[0.5, 0.0], [5.0, 0.0], [5.5, 0.0], [0.0, 3.0]]))
    assert new.tolist() == [False, True, False, True]     # (5.5 is near 5.0, kept just before it)
    assert c.size == 4


def test_coverage_from_a_wide_layer_admits_only_what_goes_beyond():
    """32 tanh units: in many dimensions a mutant's nearest kept vector is its
    parent, about one mutation away, so a threshold from the mutation's size
    admitted about half of all mutants and the corpus filled up.  On the seed
    batch's first principal axis, with the seed rows' own spacing as the
    threshold, a random walk of mutants adds only those that go beyond what
    was reached."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(16, 32, generator=g) / 4
    x = torch.rand(32, 16, generator=g) * 2 - 1
    c = Coverage(threshold=None)
    first = (x + (torch.rand(x.shape, generator=g) * 2 - 1) * 0.2).clamp(-1, 1)
    c.calibrate(torch.tanh(x @ w), torch.tanh(first @ w))
    assert c.size == 32 and c.threshold > 0
    walked = 0
    for _ in range(200):
        x = (x + (torch.rand(x.shape, generator=g) * 2 - 1) * 0.2).clamp(-1, 1)
        walked += int(c.novel(torch.tanh(x @ w)).sum())
    assert 0 < walked < 0.05 * 200 * 32, walked


def test_search_coverage_walks_where_random_search_does_not():
    """The engine alone on a function that fails only far from the seed: the
    coverage-guided walk gets there, random search from the seed cannot."""
    seed = torch.zeros(8, 4).uniform_(-0.2, 0.2, generator=torch.Generator().manual_seed(0))
    seed[0, 0], seed[1, 0] = -1.0, 1.0                     # the range: [-1, 1]

    def evaluate(inputs):
        x = inputs[0]
        s = x.sum(1, keepdim=True)
        return Outcome(s, {"what": "nan"} if bool((s > 3.0).any()) else None, float(s.mean()))
    spec = [spec_for(seed)]
    guided = run(evaluate, [seed], spec, FuzzConfig(budget=2000, seed=0))
    rnd = run(evaluate, [seed], spec, FuzzConfig(budget=2000, seed=0, random=True))
    assert guided.found is not None and guided.tried < 2000 and guided.corpus > 8
    assert rnd.found is None and rnd.tried == 2000 and rnd.corpus == 8
    assert float(guided.inputs[0].max()) <= 1.0 and float(guided.inputs[0].min()) >= -1.0


def test_options_are_checked_before_anything_runs():
    from nndb.commands import TABLE
    from nndb.errors import CommandError
    for bad, why in (("--against fp8", "fp16 or bf16"), ("--budget 0", "at least 1"), ("--scale 2", "--scale"),
                     ("--until 'loss >'", "syntax error"), ("--tolerance 0.1", "goes with --against"),
                     ("--frobnicate", "unexpected"), ("--save out.txt", ".pt")):
        with pytest.raises(CommandError, match=re.escape(why)):
            TABLE.parse("fuzz " + bad)
    _, a = TABLE.parse("fuzz --until 'loss > 1e3' --budget 50 --random --layers 'model.*'")
    assert (a.until, a.budget, a.random, a.layers) == ("loss > 1e3", 50, True, "model.*")


def test_save_refuses_a_file_nndb_did_not_write(tmp_path):
    from nndb.commands import TABLE
    from nndb.errors import CommandError
    mine = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(2)}, mine)
    with pytest.raises(CommandError, match="nndb did not write it"):
        TABLE.parse(f"fuzz --save {mine}")
    assert torch.load(mine, weights_only=True)["w"].shape == (2,)


# -- end to end ------------------------------------------------------------------------------------
def test_fuzz_at_a_stop_finds_the_nan_and_the_live_run_stays_bit_identical(tmp_path):
    plain = _plain(PLANTED)
    assert plain.returncode == 0
    found = tmp_path / "found.pt"
    r = nndb("run", "--batch", "--trace", str(tmp_path / "t.h5"), "-e", "until 40",
             "-e", f"fuzz --budget 1000 --save {found}", "-e", "continue", PLANTED, cwd=str(tmp_path), env=ONE)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "Fuzzed the batch of step 41 on a replica (coverage-guided, seed 0)" in out
    m = re.search(r"Found: a non-finite loss at mutant (\d+) \(loss nan\)", out)
    assert m and 0 < int(m.group(1)) <= 1000, out
    assert "where: log (forward) at fuzz_log_corner.py:" in out
    line = int(re.search(r"fuzz_log_corner.py:(\d+)", out).group(1))
    assert "torch.log(q)" in open(PLANTED).read().splitlines()[line - 1]
    # the live run: the same parameters, bit for bit, as without nndb and without fuzz
    assert _digest(out) == _digest(plain.stdout)
    # the input found: tensors only, inside the data's range, and it reproduces the NaN at that step
    saved = torch.load(found, weights_only=True)
    x = saved["inputs"][0]
    assert x.shape == (32, 16) and float(x.min()) >= -1 and float(x.max()) <= 1
    assert saved["step"] == 41 and saved["found"] == "nan"
    again = _plain(PLANTED, "--inject", str(found), "--at", "41")
    assert re.search(r"^step 41 loss nan$", again.stdout, re.M), again.stdout
    normal = re.search(r"^step 40 loss (\S+)$", plain.stdout, re.M)
    assert normal and normal.group(1) != "nan"


def test_nndb_fuzz_finds_nothing_on_the_healthy_model(tmp_path):
    r = nndb("fuzz", "--step", "41", "--budget", "300", "--json", PLANTED, "--healthy", cwd=str(tmp_path), env=ONE)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["found"] is None and rep["tried"] == 300 and rep["loss_reproduced"] is True
    assert rep["coverage"] > rep["seed_coverage"] == 32
    assert not list(tmp_path.glob("*.pt"))
    # every key docs/report.md lists is there ('saved' and 'location' were left out when
    # nothing was found: a reader's rep["saved"], documented "string or null", raised KeyError)
    assert set(_documented_fuzz_keys()) - set(rep) == set()
    assert rep["saved"] is None and rep["location"] is None


def _documented_fuzz_keys() -> list:
    text = open(os.path.join(ROOT, "docs", "report.md"), encoding="utf-8").read()
    table = text.split("## `nndb fuzz`", 1)[1].split("| key |", 1)[1]
    keys = [k for line in table.splitlines() if line.startswith("| `")
            for k in re.findall(r"`(\w+)`", line.split("|")[1])]
    assert "found" in keys and "saved" in keys and "notes" in keys
    return keys


def test_nndb_fuzz_exit_codes_and_integer_inputs(tmp_path):
    save = tmp_path / "tok.pt"
    r = nndb("fuzz", "--step", "3", "--until", "inputs[0].max() >= 45", "--budget", "200", "--save", str(save),
             "--json", TOKENS, cwd=str(tmp_path), env=ONE)
    assert r.returncode == 1, r.stderr
    rep = json.loads(r.stdout)
    assert rep["found"]["what"] == "condition" and rep["step"] == 3
    assert rep["location"] is None and rep["saved"] == str(save)
    assert rep["inputs"][0]["mutation"] == "int in [0, 49] (the embedding's num_embeddings=50)"
    ids = torch.load(save, weights_only=True)["inputs"][0]
    assert ids.dtype == torch.int64 and int(ids.min()) >= 0 and 45 <= int(ids.max()) <= 49
    # the script ends before the step: one line, exit 2
    r = nndb("fuzz", "--step", "50", TOKENS, cwd=str(tmp_path), env=ONE)
    assert r.returncode == 2 and "before step 50" in r.stderr, r.stderr
    from click.testing import CliRunner
    from nndb.cli import cli
    for bad in (["--against", "fp8"], ["--until", "loss >"], ["--budget", "0"]):
        r = CliRunner().invoke(cli, ["fuzz", "--step", "1", *bad, TOKENS])
        assert r.exit_code == 2 and "Traceback" not in r.output, r.output


def test_a_step_past_the_runs_end_is_one_line_without_fuzzs_own_commands(tmp_path):
    """--step 100 on a 3-step script: one line saying how the script ended and
    after how many steps, exit 2.  (It was preceded by 'nndb: the run ended ...;
    the commands left run at its end': the commands were fuzz's own 'fuzz' and
    'kill', not the user's.)"""
    script = tmp_path / "three.py"
    script.write_text("import torch\ntorch.manual_seed(0)\nm = torch.nn.Linear(4, 1)\n"
                      "opt = torch.optim.SGD(m.parameters(), lr=0.1)\nfor i in range(3):\n"
                      "    loss = m(torch.randn(8, 4)).pow(2).mean()\n    opt.zero_grad()\n"
                      "    loss.backward()\n    opt.step()\n")
    r = nndb("fuzz", "--step", "100", str(script), cwd=str(tmp_path), env=ONE)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == ["nndb: error: the script ended (finished, exit code 0) after 3 step(s), "
                                     "before step 100"], r.stderr
    assert "commands left" not in r.stdout + r.stderr, r.stdout


def test_a_refusal_at_the_stop_is_said_as_it_is_not_as_the_script_ending(tmp_path):
    """fuzz's own refusal at its stop (a DataLoader worker process: no fork) is the
    line nndb fuzz prints, and --step 0 (the run's first stop is inside step 0, where
    fuzz cannot start) is refused up front: both read 'nndb: error: the script ended
    (killed, exit code 2) after N step(s), before step M', which it had not."""
    r = nndb("fuzz", "--step", "2", WORKERS, cwd=str(tmp_path), env=ONE)
    assert r.returncode == 2, r.stderr
    errors = [l for l in r.stderr.splitlines() if l.startswith("nndb: error:")]
    assert len(errors) == 1 and errors[0].startswith(
        "nndb: error: fuzz needs a fork() replica, and this process cannot be forked safely: "), r.stderr
    assert "script ended" not in r.stderr
    r = nndb("fuzz", "--step", "0", TOKENS, cwd=str(tmp_path), env=ONE)
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert r.stderr.splitlines() == ["nndb: error: --step 0: fuzzing starts at a step end, with the next step's "
                                     "batch, and no step ends before step 0: the first batch it can fuzz is step "
                                     "1's (--step 1)"], r.stderr


def test_a_save_path_that_cannot_be_written_keeps_the_input_elsewhere_and_says_where(tmp_path):
    """--save passed the checks at start, but its directory is gone when the
    input is found: the input goes to ./nndb-fuzz-stepN.pt, the report says
    why, and the exit code is the objective's (before: an internal error, then
    'the script ended before step 3', the input lost)."""
    (tmp_path / "out").mkdir()
    script = tmp_path / "gone.py"
    script.write_text("import os, runpy, sys\nos.rmdir(sys.argv[1])\nrunpy.run_path(sys.argv[2], run_name='__main__')\n")
    r = nndb("fuzz", "--step", "3", "--until", "inputs[0].max() >= 45", "--budget", "200",
             "--save", str(tmp_path / "out" / "x.pt"), str(script), str(tmp_path / "out"), TOKENS,
             cwd=str(tmp_path), env=ONE)
    assert r.returncode == 1, r.stderr
    assert "internal error" not in r.stderr + r.stdout and "before step" not in r.stderr
    kept = tmp_path / "nndb-fuzz-step3.pt"
    assert f"cannot write {tmp_path / 'out' / 'x.pt'}: No such file or directory; the input found is saved in {kept}" \
        in r.stdout, r.stdout
    assert f"input saved: {kept}" in r.stdout
    ids = torch.load(kept, weights_only=True)["inputs"][0]
    assert 45 <= int(ids.max()) <= 49


def test_against_fp16_finds_the_overflow_and_bf16_the_rounding():
    """The --against objective on a model whose output leaves float16's range
    for large inputs (bf16 has float32's range, but 8 bits of mantissa)."""
    from torch.utils import _pytree as pytree
    from nndb.fuzz.objective import Evaluator, Goal, Model
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 2)
    with torch.no_grad():
        lin.weight.fill_(3e4)
    x = torch.full((3, 4), 0.1)
    leaves, spec = pytree.tree_flatten(((x,), {}))
    m = Model(lin, {lin: "lin"}, leaves, spec, [0])
    ev = Evaluator(m, Goal(against="fp16"), [])
    assert ev(m.inputs(), 3).found is None                         # 1.2e4: fine in float16
    hit = ev([torch.full((3, 4), 1.0)], 3).found                   # 1.2e5: inf in float16
    assert hit["what"] == "disagreement" and hit["relative"] == float("inf")
    assert Evaluator(m, Goal(against="bf16"), [])([torch.full((3, 4), 1.0)], 3).found is None
    tight = Evaluator(m, Goal(against="bf16", tolerance=1e-6), [])([torch.full((3, 4), 0.123)], 3).found
    assert tight is not None and 1e-6 < tight["relative"] < 1e-2


def test_a_model_with_dropout_is_fuzzed_with_the_steps_own_random_draws(tmp_path):
    """Each mutant used to draw a new dropout mask (the RNG went on from mutant to mutant): the
    step's own batch gave a loss the script never computed (0.0169944 for the script's
    0.015153354965150356 at step 30), the NaN found at step 41 was not NaN when the script was
    given the input (loss 0.040329) nor on the locating replay ("not located"), and --against fp16
    compared two different masks (0.54 apart at mutant 0).  The RNG is now the forward's own."""
    plain = _plain(DROPOUT)
    step30 = float(re.search(r"^step 30 loss (\S+)$", plain.stdout, re.M).group(1))
    found = tmp_path / "found.pt"
    r = nndb("fuzz", "--step", "30", "--json", "--save", str(found), DROPOUT, cwd=str(tmp_path), env=ONE)
    assert r.returncode == 1, r.stderr
    rep = json.loads(r.stdout)
    assert rep["seed_loss"] == step30
    assert rep["found"]["what"] == "nan" and rep["location"]["op"] == "log"
    again = _plain(DROPOUT, "--inject", str(found), "--at", "30")
    assert re.search(r"^step 30 loss nan$", again.stdout, re.M), again.stdout
    r = nndb("fuzz", "--step", "30", "--against", "fp16", "--budget", "20", "--json", DROPOUT,
             cwd=str(tmp_path), env=ONE)
    assert r.returncode == 0, r.stdout
    assert json.loads(r.stdout)["found"] is None


def test_a_model_called_with_keyword_arguments_only_is_one_clear_line(tmp_path):
    """model(x=batch): the global module hooks see no positional tensor.  The line was 'fuzzing
    failed: RuntimeError: the model's inputs cannot be mutated (...) (File ".../fuzz.py", line
    169, in _fuzz)': nndb's own file and line, and not why."""
    script = tmp_path / "kw.py"
    script.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.fc = torch.nn.Linear(4, 1)\n"
        "    def forward(self, x=None):\n"
        "        return self.fc(x)\n"
        "m = M(); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for step in range(4):\n"
        "    loss = m(x=torch.randn(8, 4)).pow(2).mean()\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n")
    r = nndb("fuzz", "--step", "2", str(script), cwd=str(tmp_path), env=ONE)
    assert r.returncode == 2, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("nndb: error:")]
    assert errors == ["nndb: error: fuzz: m was called with no tensor among its positional arguments: fuzz sees "
                      "those only (a call such as model(x=batch) gives it none); the live run is unchanged"], r.stderr


@pytest.mark.parametrize("sig,code,why", [("SIGINT", 130, "interrupted (Ctrl-C)"), ("SIGTERM", 143, "terminated (SIGTERM)")])
def test_ctrl_c_or_sigterm_during_nndb_fuzz_ends_it_with_its_exit_code(tmp_path, sig, code, why):
    """Ctrl-C at the terminal reaches the whole process group, the fuzzing replica with the live
    run: the replica's script ended "interrupted" and nndb fuzz said 'the script ended
    (interrupted: KeyboardInterrupt) before the model's next forward pass' and exited 2, where
    docs/fuzz.md promises 130 at Ctrl-C.  SIGTERM to nndb's process alone (``timeout``, a job
    scheduler) was put off while the live run waited: the replica went on for its whole budget
    (a million mutant batches here)."""
    import signal
    import subprocess
    import time
    from conftest import nndb_started
    p = nndb_started("fuzz", "--step", "41", "--budget", "1000000", PLANTED, "--healthy", cwd=str(tmp_path),
                     env=ONE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        while "-> opt.step()" not in p.stdout.readline():      # (the stop at the end of step 40)
            pass
        time.sleep(1)                                           # (the replica fuzzes)
        if sig == "SIGINT":
            os.killpg(p.pid, signal.SIGINT)
        else:
            os.kill(p.pid, signal.SIGTERM)
        p.wait(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    err = p.stderr.read()
    assert p.returncode == code, err
    assert err.strip().splitlines()[-1] == f"nndb: error: fuzz {why}; the live run is unchanged"
    assert not list(tmp_path.glob("*.pt"))


def test_layers_on_a_model_without_submodules_says_so(tmp_path):
    """A model that is one nn.Linear: '--layers' matched nothing and the line listed what there
    was as '(have: )'."""
    script = os.path.join(ROOT, "tests", "scripts", "fuzz_one_layer.py")
    r = nndb("fuzz", "--step", "3", "--layers", "0", script, cwd=str(tmp_path), env=ONE)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "nndb: error: fuzz: --layers 0: no module of fc matches (fc has no submodules: leave --layers out, "
        "its output is the default); the live run is unchanged")
