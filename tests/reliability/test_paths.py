"""The files nndb run writes (issue 20, "Nothing lost, nobody in"): an existing
--trace is never overwritten (--force: only an nndb trace), the trace, report,
checkpoint directory and script are different files, every path is resolved
at start (a script's os.chdir moves nothing), and an unwritable report or
trace fails before the script runs, with exit 2."""
import json
import os
import textwrap

import pytest

from conftest import nndb

SCRIPT = "open('ran.txt', 'a').write('ran\\n')\nprint('ran')\n"


def write(path, text):
    path.write_text(textwrap.dedent(text))
    return str(path)


def one_error_line(r, code=2):
    assert r.returncode == code, r.stderr
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("nndb: error: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def a_trace(tmp_path, name="old.h5"):
    """A real nndb trace, made by a run."""
    script = write(tmp_path / "mk.py", "print('made')\n")
    path = tmp_path / name
    r = nndb("run", "--batch", "-q", "--rules", "none", "--trace", str(path), script, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    return path


# -- an existing --trace -------------------------------------------------------------------

def test_trace_is_the_script_is_refused_and_the_script_kept(tmp_path):
    victim = tmp_path / "victim.py"
    victim.write_text(SCRIPT)
    r = nndb("run", "--batch", "--trace", "victim.py", "victim.py", cwd=str(tmp_path))
    assert "--trace and the script are the same file" in one_error_line(r)
    assert victim.read_text() == SCRIPT                    # not turned into HDF5
    assert not (tmp_path / "ran.txt").exists()             # and never run


@pytest.mark.parametrize("force", [False, True])
def test_an_existing_non_trace_is_never_overwritten(tmp_path, force):
    script = write(tmp_path / "s.py", SCRIPT)
    data = tmp_path / "data.h5"
    data.write_bytes(b"\x89HDF\r\n\x1a\n" + b"someone else's data" * 10)
    r = nndb("run", "--batch", *(["--force"] if force else []), "--trace", str(data), script, cwd=str(tmp_path))
    assert "never overwrites" in one_error_line(r)
    assert data.read_bytes().endswith(b"someone else's data")


def test_an_existing_trace_needs_force(tmp_path):
    old = a_trace(tmp_path)
    before = old.read_bytes()
    script = write(tmp_path / "s.py", SCRIPT)
    r = nndb("run", "--batch", "--trace", str(old), script, cwd=str(tmp_path))
    assert "--force" in one_error_line(r)
    assert old.read_bytes() == before
    r = nndb("run", "--batch", "-q", "--force", "--trace", str(old), script, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ran\n"
    from nndb.store.reader import TraceReader
    with TraceReader(str(old)) as t:
        assert t.meta["script"] == script                 # the new run's trace


@pytest.mark.parametrize("args,what", [
    (("--trace", "t.h5", "--report", "t.h5"), "--trace and --report"),
    (("--report", "s.py"), "--report and the script"),
    (("--trace", "r.h5", "--report", "r.ckpt"), "the checkpoint directory and --report"),
    (("--report", "cmds.nndb", "-x", "cmds.nndb"), "--report and the input file"),
])
def test_outputs_and_inputs_must_differ(tmp_path, args, what):
    write(tmp_path / "s.py", SCRIPT)
    (tmp_path / "cmds.nndb").write_text("p 1\n")
    r = nndb("run", "--batch", *args, "s.py", cwd=str(tmp_path))
    assert what in one_error_line(r)
    assert not (tmp_path / "ran.txt").exists()
    assert (tmp_path / "s.py").read_text() == SCRIPT


# -- paths resolved at start ------------------------------------------------------------------

CHDIR = """\
import os, sys, torch
os.chdir(sys.argv[1])                 # the script moves before its first step
torch.manual_seed(0)
m = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for step in range(10):
    loss = m(torch.randn(4, 3)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
print("cwd", os.path.basename(os.getcwd()))
"""


def test_a_script_that_changes_directory_moves_nothing(tmp_path):
    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    start.mkdir(), elsewhere.mkdir()
    write(start / "train.py", CHDIR)
    r = nndb("run", "--batch", "--report", "r.json", "--trace", "t.h5", "--total-steps", "10",
             "--checkpoint-every", "1", "train.py", str(elsewhere), cwd=str(start))
    assert r.returncode == 0, r.stderr
    assert r.stdout == "cwd elsewhere\n"
    assert json.loads((start / "r.json").read_text())["exit"]["code"] == 0
    assert (start / "t.h5").exists()
    ckpts = os.listdir(start / "t.ckpt")                  # the on-disk checkpoints, beside the trace
    assert any(n.startswith("step_") for n in ckpts), ckpts
    assert os.listdir(elsewhere) == []                    # nothing of nndb's where the script went


def test_the_default_trace_stays_under_the_start_directory(tmp_path):
    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    start.mkdir(), elsewhere.mkdir()
    write(start / "train.py", CHDIR)
    r = nndb("run", "--batch", "--rules", "none", "-e", "run", "train.py", str(elsewhere), cwd=str(start))
    # `run` at the first stop (after the chdir) starts the script again: found, and started
    # from the start directory, as the first time
    assert r.returncode == 0, r.stderr
    assert r.stdout == "cwd elsewhere\n", r.stderr
    traces = sorted(os.listdir(start / "nndb-runs"))
    assert len([t for t in traces if t.endswith(".h5")]) == 2, traces
    assert os.listdir(elsewhere) == []


def test_two_default_traces_in_one_second_are_two_files(tmp_path, monkeypatch):
    from nndb.run.config import default_trace_path
    from nndb.run.launcher import Target
    monkeypatch.chdir(tmp_path)
    t = Target(path="s.py")
    paths = {default_trace_path(t) for _ in range(3)}
    assert len(paths) == 3 and all(os.path.isabs(p) and os.path.exists(p) for p in paths)


# -- unwritable places, found before the script runs ------------------------------------------

@pytest.mark.parametrize("where", ["report", "trace"])
def test_unwritable_output_fails_before_the_script(tmp_path, where):
    write(tmp_path / "s.py", SCRIPT)
    blocker = tmp_path / "file"
    blocker.write_text("x")                               # a directory under a file cannot exist (root too)
    bad = str(blocker / "sub" / "out")
    r = nndb("run", "--batch", f"--{where}", bad, "s.py", cwd=str(tmp_path))
    assert bad in one_error_line(r)
    assert r.stdout == "" and not (tmp_path / "ran.txt").exists()


def test_a_report_that_is_a_directory_fails_before_the_script(tmp_path):
    write(tmp_path / "s.py", SCRIPT)
    (tmp_path / "out").mkdir()
    r = nndb("run", "--batch", "--report", "out", "s.py", cwd=str(tmp_path))
    assert r.returncode == 2 and "is a directory" in r.stderr and "Traceback" not in r.stderr   # (click's usage error)
    assert not (tmp_path / "ran.txt").exists()


# -- every output: nndb writes over only its own (issue 41) ------------------------------------

@pytest.mark.parametrize("name", ["common.py", "notes.txt"])
def test_report_never_overwrites_a_file_nndb_did_not_write(tmp_path, name):
    write(tmp_path / "s.py", SCRIPT)
    victim = tmp_path / name
    victim.write_text("import os\n")
    r = nndb("run", "--batch", "--trace", "t.h5", "--report", name, "s.py", cwd=str(tmp_path))
    line = one_error_line(r)
    assert "nndb did not write it" in line and "give another path" in line
    assert victim.read_text() == "import os\n"
    assert not (tmp_path / "ran.txt").exists()


def test_an_earlier_report_is_written_over(tmp_path):
    write(tmp_path / "s.py", SCRIPT)
    for trace in ("a.h5", "b.h5"):
        r = nndb("run", "--batch", "-q", "--trace", trace, "--report", "r.json", "s.py", cwd=str(tmp_path))
        assert r.returncode == 0, r.stderr
        assert json.loads((tmp_path / "r.json").read_text())["trace"] == str(tmp_path / trace)


def test_a_checkpoint_directory_of_someone_elses_is_refused(tmp_path):
    write(tmp_path / "s.py", SCRIPT)
    (tmp_path / "t.ckpt").mkdir()
    (tmp_path / "t.ckpt" / "mine.txt").write_text("keep")
    r = nndb("run", "--batch", "--trace", "t.h5", "s.py", cwd=str(tmp_path))
    assert "checkpoint directory" in one_error_line(r)
    assert not (tmp_path / "ran.txt").exists()


def test_plot_and_inspect_npy_write_only_over_their_own(tmp_path):
    script = write(tmp_path / "train.py", CHDIR.replace("os.chdir(sys.argv[1])", "pass"))
    trace = tmp_path / "t.h5"
    r = nndb("run", "--batch", "-q", "--rules", "none", "--record-full", "param:*", "--trace", str(trace), script,
             cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    png = tmp_path / "p.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\nsomeone's picture")
    r = nndb("plot", str(trace), "--what", "loss", "-o", str(png))
    assert "nndb did not write it" in one_error_line(r)
    assert png.read_bytes().endswith(b"someone's picture")
    for out in ("q.png", "q.svg"):               # nndb's own picture: drawn again over itself
        for _ in range(2):
            r = nndb("plot", str(trace), "--what", "loss", "-o", str(tmp_path / out))
            assert r.returncode == 0, r.stderr
    npy = tmp_path / "w.npy"
    npy.write_text("x")
    r = nndb("inspect", str(trace), "--tensor", "param:weight", "--step", "0", "--npy", str(npy))
    assert "nndb did not write it" in one_error_line(r)
    assert npy.read_text() == "x"
    r = nndb("inspect", str(trace), "--tensor", "param:weight", "--step", "0", "--npy", str(tmp_path / "new.npy"))
    assert r.returncode == 0, r.stderr
    import numpy as np
    assert np.load(tmp_path / "new.npy").shape == (1, 3)


@pytest.mark.parametrize("kind,content,ours", [
    ("report", b'{"nndb_report": 1, "exit": {}}', True),
    ("report", b'{"other": 1}', False),
    ("report", b"import os\n", False),
    ("picture", b"<svg>plain</svg>", False),
    ("fuzz", b"PK\x03\x04 a zip of someone's", False),
    ("dot", b"// nndb lineage graph of step 3\ndigraph {}", True),
    ("dot", b"digraph {}", False),
    ("npy", b"\x93NUMPY", False),
])
def test_nndb_wrote_recognises_only_its_own(tmp_path, kind, content, ours):
    from nndb.errors import UsageError
    from nndb.run.paths import claim_output, nndb_wrote
    f = tmp_path / "out"
    f.write_bytes(content)
    assert nndb_wrote(str(f), kind) is ours
    if ours:
        assert claim_output(str(f), "--x", kind) == str(f)
    else:
        with pytest.raises(UsageError, match="nndb did not write it"):
            claim_output(str(f), "--x", kind)
    assert f.read_bytes() == content


@pytest.mark.parametrize("argv", [["check-trace"], ["export", "--tensorboard", "tb"], ["plot"]])
def test_a_run_directory_given_for_one_trace_names_a_ranks_trace(tmp_path, argv):
    """nndb inspect reads a torchrun job's run directory; check-trace, export and plot said only
    'runs is a directory, not a trace'.  They refuse it in one line that says what to give."""
    (tmp_path / "runs").mkdir()
    for r in (0, 1):
        (tmp_path / "runs" / f"rank{r}.h5").write_bytes(b"")
    r = nndb(*argv[:1], "runs", *argv[1:], cwd=str(tmp_path))
    line = one_error_line(r)
    if "extra" in line:
        pytest.skip(line)
    assert line == ("nndb: error: runs is a directory of 2 trace(s) (rank0.h5, rank1.h5), a distributed job's run "
                    "directory: give one rank's trace (runs/rank0.h5); nndb inspect runs reads the ranks together")
