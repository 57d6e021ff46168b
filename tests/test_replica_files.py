"""Replicas never change the user's files (issue 39, item 6), whatever
library writes them: ``torch.save`` (torch's C++ writer opens the path
itself), ``numpy.save``, ``h5py.File(..., "w")`` (the HDF5 library opens the
path itself), safetensors' ``save_file`` (its Rust code does), ``open`` and
``os.replace``.  In a reverse replay and in a
``predict`` the replica's writes go to scratch copies (the past reads its
own write back), and the user's file is byte for byte what it was at the
stop; a write nndb cannot redirect (a subprocess) is named, and nndb then
does not say the files are as they were."""
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import Ran, nndb, python

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork replicas need fork()")

# A step ends in opt.step(); what follows in the iteration comes after the step's end.
LOOP = '''
torch.manual_seed(0)
m = nn.Linear(4, 1)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
x, y = torch.randn(16, 4), torch.randn(16, 1)
for step in range(8):
    opt.zero_grad()
    loss = ((m(x) - y) ** 2).mean()
    loss.backward()
    opt.step()'''

# Each iteration writes its number with the writer named on the command line;
# read() reads it back the same way.
WRITES = '''
import hashlib, os, subprocess, sys
import h5py, numpy as np, torch, torch.nn as nn
WRITER = sys.argv[1]
FILE = {"torch.save": "ckpt.pt", "np.save": "arr.npy", "h5py": "log.h5", "open": "log.txt",
        "os.replace": "state.txt", "subprocess": "sub.txt", "safetensors": "model.safetensors"}[WRITER]
if WRITER == "safetensors":
    from safetensors.torch import load_file, save_file

def write(step):
    if WRITER == "torch.save":
        torch.save({"step": step}, FILE)
    elif WRITER == "np.save":
        np.save(FILE, np.array([step]))
    elif WRITER == "h5py":
        with h5py.File(FILE, "w") as f:
            f["step"] = step
    elif WRITER == "safetensors":
        save_file({"step": torch.tensor([step])}, FILE)
    elif WRITER == "open":
        with open(FILE, "w") as fh:
            fh.write(str(step))
    elif WRITER == "os.replace":
        with open(FILE + ".tmp", "w") as fh:
            fh.write(str(step))
        os.replace(FILE + ".tmp", FILE)
    else:
        subprocess.run(["sh", "-c", f"echo {step} > {FILE}"], check=True)

def read():
    if WRITER == "torch.save":
        return torch.load(FILE, weights_only=True)["step"]
    if WRITER == "np.save":
        return int(np.load(FILE)[0])
    if WRITER == "h5py":
        with h5py.File(FILE, "r") as f:
            return int(f["step"][()])
    if WRITER == "safetensors":
        return int(load_file(FILE)["step"][0])
    return int(open(FILE).read())

def digest():
    return hashlib.sha256(open(FILE, "rb").read()).hexdigest()

''' + LOOP + '''
    write(step)
print("read back", read())
'''

COMMANDS = ["until 5", 'p ("BEFORE", digest())', "rs 3", 'p ("PAST", read())', "present",
            'p ("AFTER_RS", digest())', "predict 2", 'p ("AFTER_PREDICT", digest())', "continue"]


def _run(tmp_path, writer, *extra):
    (tmp_path / "w.py").write_text(WRITES)
    argv = ["run", "--batch", "--nx", "--rules", "none", "--trace", str(tmp_path / "t.h5"), "--force", *extra]
    for c in COMMANDS:
        argv += ["-e", c]
    r = Ran(nndb(*argv, "w.py", writer, cwd=str(tmp_path)), argv + ["w.py", writer])
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    return r


def _printed(r, label):
    m = re.search(rf"\('{label}', '?([0-9a-f]+)'?\)", r.stdout)
    assert m, (label, r.stdout + r.stderr)
    return m.group(1)


@pytest.mark.parametrize("writer", ["torch.save", "np.save", "h5py", "open", "os.replace", "safetensors"])
def test_a_replica_s_writes_go_to_scratch_copies(tmp_path, writer):
    if writer == "safetensors":
        pytest.importorskip("safetensors")       # (Hugging Face's format: its Rust code opens the path itself)
    r = _run(tmp_path, writer)
    # the stop at step 5 comes before that iteration's write: the file holds step 4's
    before = _printed(r, "BEFORE")
    assert _printed(r, "AFTER_RS") == before and _printed(r, "AFTER_PREDICT") == before
    # the past replayed steps 1 and 2 from the checkpoint at step 0, and reads its own write of step 1
    assert _printed(r, "PAST") == "1", r.stdout
    assert re.search(r"Back in the present \(timeline 0\): step 5\. .*its \d+ file write\(s\) went to scratch "
                     r"copies, your files under \S+ are as they were\)", r.stdout), r.stdout
    # the prediction ran the script's two steps, writes and all
    assert re.search(r"Predicted 2 step\(s\) ahead on a replica", r.stdout) and "the script ended" not in r.stdout
    assert "nndb could not send" not in r.stderr, r.stderr
    assert "read back 7" in r.stdout                      # the live run's own writes are real
    assert "as they are now" not in r.stderr, r.stderr    # (the past read its own write: no present file)


@pytest.mark.parametrize("writer", ["torch.save", "safetensors"])
def test_a_respawned_replica_s_torch_save_goes_to_a_scratch_copy(tmp_path, writer):
    if writer == "safetensors":
        pytest.importorskip("safetensors")       # (imported by the script after the sandbox is in)
    r = _run(tmp_path, writer, "--replica", "respawn")
    before = _printed(r, "BEFORE")
    assert _printed(r, "AFTER_RS") == before and _printed(r, "AFTER_PREDICT") == before
    assert _printed(r, "PAST") == "1", r.stdout
    assert "from the start" in r.stdout + r.stderr        # (a respawned replay, not a fork's)
    assert "read back 7" in r.stdout


def test_a_write_nndb_cannot_redirect_is_named(tmp_path):
    r = _run(tmp_path, "subprocess")
    assert _printed(r, "PAST") == "1"                     # (the subprocess wrote the real file)
    line = ("nndb: warning: 1 of your file(s) changed while the replica ran (the replica writing past the scratch "
            "copies nndb gives it: written by a subprocess, a C library that opens the file itself, a low-level call "
            "or a memory map; or another program): sub.txt (changed); the live run is unchanged, those files are "
            "not as they were")
    assert r.stderr.count(line) == 2, r.stderr            # after the reverse replay and after predict
    assert "are as they were)" not in r.stdout
    assert _printed(r, "AFTER_RS") != _printed(r, "BEFORE")


# Appending, and the past going on (next) from where it arrived.
WRITES_FILES = "import torch, torch.nn as nn" + LOOP + '''
    with open("log.txt", "a") as fh:
        fh.write(f"{step}\\n")
    torch.save(m.state_dict(), "ckpt.pt")
    open("last.txt", "w").write(str(step))
'''


def _files_run(tmp_path, commands):
    (tmp_path / "s.py").write_text(WRITES_FILES)
    argv = ["run", "--batch", "--nx", "--rules", "none", "--trace", str(tmp_path / "t.h5"), "--force"]
    for c in commands:
        argv += ["-e", c]
    return Ran(nndb(*argv, "s.py", cwd=str(tmp_path)), argv + ["s.py"])


def test_replicas_leave_the_user_s_files_alone(tmp_path):
    r = _files_run(tmp_path, ["until 5", "rs 3", "next", 'p ("PAST", open("last.txt").read())', "present",
                              "predict 2", 'p ("NOW", open("last.txt").read())', "continue"])
    assert "('PAST', '2')" in r.stdout and "('NOW', '4')" in r.stdout, r.stdout + r.stderr   # (a step ends in opt.step())
    assert re.search(r"file write\(s\) went to scratch copies, your files under \S+ are as they were", r.stdout)
    assert (tmp_path / "log.txt").read_text() == "".join(f"{i}\n" for i in range(8))   # each step once
    assert (tmp_path / "last.txt").read_text() == "7"
    import torch
    saved = torch.load(str(tmp_path / "ckpt.pt"), weights_only=True)
    assert set(saved) == {"weight", "bias"}


def test_a_prediction_in_the_past_leaves_the_past_s_files_alone(tmp_path):
    """predict forks the replica in the past: its writes go to copies of its own,
    and it removes only those (it had removed the past's, issue 39)."""
    r = _files_run(tmp_path, ["until 5", "rs 3", "next", 'p ("PAST", open("last.txt").read())', "predict 2",
                              'p ("AFTER", open("last.txt").read())', 'p ("LOG", open("log.txt").read().split())',
                              "present", "continue"])
    out = r.stdout + r.stderr
    # (a step ends in opt.step(): the past at step 3 has written step 2's lines, on copies of the
    # files as they were at the stop at step 5, the replay's steps 0-2 appended to the log's)
    assert "('PAST', '2')" in r.stdout and "('AFTER', '2')" in r.stdout, out
    assert "('LOG', ['0', '1', '2', '3', '4', '0', '1', '2'])" in r.stdout, out
    assert (tmp_path / "last.txt").read_text() == "7"
    assert (tmp_path / "log.txt").read_text() == "".join(f"{i}\n" for i in range(8))


# Files opened before the loop: a forked replica holds them through the live
# run's file descriptors (one file, one offset), as pytorch/examples'
# language_translation holds its logging.basicConfig(filename=...) log.
OPEN_BEFORE = '''import logging, torch, torch.nn as nn
logging.basicConfig(filename="train.log", level=logging.INFO)
log = open("own.log", "w")
torch.manual_seed(0)
m = nn.Linear(4, 1)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
x, y = torch.randn(16, 4), torch.randn(16, 1)
for step in range(40):
    opt.zero_grad()
    loss = ((m(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    logging.info(f"step {step}")
    log.write(f"step {step}\\n")
    log.flush()
'''


@pytest.mark.parametrize("travel, replica", [(["goto 10", "present"], "fork"), (["predict 3"], "fork"),
                                             (["goto 10", "predict 3", "present"], "fork"),
                                             (["goto 10", "present"], "respawn")])
def test_files_opened_before_a_replica_are_left_alone(tmp_path, travel, replica):
    """Every step a replica replayed or predicted was written into the user's
    log through the live run's file descriptor: 40 lines where 31 were (goto 10
    after until 30), "step 31" and "step 32" after a predict."""
    (tmp_path / "s.py").write_text(OPEN_BEFORE)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "s.py").write_text(OPEN_BEFORE)
    assert python("s.py", cwd=str(plain), forked=True).returncode == 0
    commands = ["until 30", 'p ("LOG", len(open("own.log").readlines()))', *travel, "continue"]
    argv = ["run", "--batch", "--nx", "--rules", "none", "--trace", str(tmp_path / "t.h5"), "--force",
            "--replica", replica]
    for c in commands:
        argv += ["-e", c]
    r = Ran(nndb(*argv, "s.py", cwd=str(tmp_path)), argv + ["s.py"])
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "nndb could not send" not in r.stderr, r.stderr
    assert "('LOG', 30)" in r.stdout, r.stdout        # (the stop at step 30 comes before its line)
    for name in ("own.log", "train.log"):
        assert (tmp_path / name).read_bytes() == (plain / name).read_bytes(), name
    assert (tmp_path / "own.log").read_text().splitlines()[-1] == "step 39"


# What torch.compile's inductor does to build a kernel: it writes the C++ in a temporary directory
# of its own (the precompiled header) and in its cache, and g++, a subprocess, reads it by path.
COMPILES = '''
import os, shutil, subprocess, tempfile
import torch, torch.nn as nn
CACHE = os.environ["TORCHINDUCTOR_CACHE_DIR"]

def build(step):
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "header.hpp"), "w") as fh:
        fh.write(f"tmp {step} ")
    kernel = os.path.join(CACHE, f"k{step}.cpp")
    with open(kernel, "w") as fh:
        fh.write(f"cache {step}")
    out = subprocess.run(["cat", os.path.join(d, "header.hpp"), kernel], capture_output=True, text=True)
    shutil.rmtree(d)
    return out.stdout or out.stderr
''' + LOOP + '''
    build(step)
print("built", build(8))
'''


@pytest.mark.parametrize("replica", ["fork", "respawn"])
def test_a_replica_s_compiler_reads_what_it_wrote_in_its_temporary_directory_and_torch_s_cache(tmp_path, replica):
    """torch.compile with inductor, `--replica respawn`: `rs` failed ('the replay
    ended (failed: BackendCompilerFailed ... CppCompileError ... cc1plus: fatal
    error: /tmp/tmpdrasbuur/header.hpp: No such file or directory)'): the replica's
    writes into the temporary directory it had just made, and into inductor's
    cache, went to scratch copies, which g++, a subprocess, never saw.  Now a
    temporary directory the replica made is its own, and torch.compile's cache
    is torch's: both written for real, and the cache is no user's file changed."""
    (tmp_path / "c.py").write_text(COMPILES)
    cache = tmp_path / "inductor-cache"
    cache.mkdir()
    argv = ["run", "--batch", "--nx", "--rules", "none", "--trace", str(tmp_path / "t.h5"), "--replica", replica,
            "-e", "until 5", "-e", "rs 2", "-e", 'p ("PAST", build(3))', "-e", "present",
            "-e", 'predict 1', "-e", "continue", "c.py"]
    r = Ran(nndb(*argv, cwd=str(tmp_path), env={"TORCHINDUCTOR_CACHE_DIR": str(cache)}), argv)
    assert "('PAST', 'tmp 3 cache 3')" in r.stdout, r.stdout + r.stderr
    assert "built tmp 8 cache 8" in r.stdout
    assert "nndb could not send" not in r.stderr, r.stderr          # (the cache: torch's, not the user's)


# A step that saves a checkpoint, checks it is there, restores it and removes it (Lightning's
# Tuner.lr_find does so with fsspec's exists()); and a file removed at step 3 that the run writes
# again at step 6, so it is there for real when the past at step 5 asks.
CHECKS = '''import os, torch, torch.nn as nn
open("note.txt", "w").write("first")''' + LOOP + '''
    if step == 3:
        torch.save(m.state_dict(), "restore.pt")
        if not os.path.exists("restore.pt") or os.path.getsize("restore.pt") == 0:
            raise FileNotFoundError("Checkpoint file not found: restore.pt")
        m.load_state_dict(torch.load("restore.pt"))
        os.remove("restore.pt")
        os.remove("note.txt")
    if step == 6:
        open("note.txt", "w").write("again")
'''


def test_a_replica_finds_the_file_it_wrote_and_not_the_one_it_removed(tmp_path):
    """'replay --verify' across such a step said 'the replay ended early (failed:
    FileNotFoundError: Checkpoint file not found: restore.pt) after 3 step(s)
    matched': the replica's torch.save went to a scratch copy, but os.stat asked
    the real path, where no file was; and a file it removed was still there for it."""
    (tmp_path / "s.py").write_text(CHECKS)
    argv = ["run", "--batch", "--nx", "--rules", "none", "--trace", str(tmp_path / "t.h5"), "--force"]
    for c in ["until 7", "replay --verify", "goto 5", 'p ("THERE", os.path.exists("restore.pt"), '
              'os.path.isfile("note.txt"))', "present", "continue"]:
        argv += ["-e", c]
    r = Ran(nndb(*argv, "s.py", cwd=str(tmp_path)), argv + ["s.py"])
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert re.search(r"replay --verify 0:8: 8 step\(s\) replayed .*identical to the trace", r.stdout), r.stdout
    # (a step ends in opt.step(): the past at step 5 has run iteration 3's removals, not iteration 6's write)
    assert "('THERE', False, False)" in r.stdout, r.stdout + r.stderr
    assert (tmp_path / "note.txt").read_text() == "again" and not (tmp_path / "restore.pt").exists()


# The Hugging Face Trainer's save: a directory per checkpoint, made when the step saves
# (os.makedirs), and the files written into it.
SAVES_CHECKPOINTS = '''import json, os, tempfile
import torch, torch.nn as nn''' + LOOP + '''
    if step % 3 == 2:
        d = os.path.join("out", f"checkpoint-{step + 1}")
        os.makedirs(d, exist_ok=True)
        torch.save(m.state_dict(), os.path.join(d, "model.pt"))
        with open(os.path.join(d, "state.json"), "w") as fh:
            json.dump({"step": step}, fh)
    with tempfile.TemporaryDirectory() as t:        # (a temporary directory's files: written for real)
        open(os.path.join(t, "x"), "w").write(str(step))
        assert open(os.path.join(t, "x")).read() == str(step)
'''


def test_a_directory_the_replica_makes_holds_no_file_of_its_for_real(tmp_path):
    """A Trainer-shaped loop run from a directory under /tmp (the temporary
    directory): the Hugging Face Trainer's (save_steps=6) 'predict 2' at step 4
    wrote checkpoint-6's 8 files for real (config.json, model.safetensors,
    optimizer.pt, ...: '18 of your file(s) changed while the replica ran'), as
    every directory a replica made under the temporary directory was taken for
    tempfile.mkdtemp's.  Only mkdtemp's are the replica's own now (a
    TemporaryDirectory's files are still written for real); a checkpoint
    directory is made, its files go to scratch copies."""
    # (pytest's tmp_path is under the temporary directory, as /tmp/hf was; the sandbox holds anywhere)
    (tmp_path / "s.py").write_text(SAVES_CHECKPOINTS)
    commands = ["break step 1", "continue", "predict 4",
                'p ("FILES", sorted(os.listdir("out/checkpoint-3")))', "kill"]
    argv = ["run", "--batch", "--nx", "--rules", "none", "--trace", str(tmp_path / "t.h5")]
    for c in commands:
        argv += ["-e", c]
    r = Ran(nndb(*argv, "s.py", cwd=str(tmp_path)), argv + ["s.py"])
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    assert re.search(r"Predicted 4 step\(s\) ahead on a replica", r.stdout), r.stdout + r.stderr
    assert "('FILES', [])" in r.stdout, r.stdout + r.stderr
    assert os.listdir(tmp_path / "out" / "checkpoint-3") == []          # (killed at step 1: no save yet)
    # (the directory itself is made for real, and named as made)
    assert "nndb: note: the replica made 2 directory(ies), left empty (os.makedirs makes a directory for " \
        "real; what the replica wrote in it went to scratch copies): out, out/checkpoint-3" in r.stderr, r.stderr


def test_a_survey_cut_at_its_limit_names_only_what_changed(tmp_path, monkeypatch):
    """The survey of the user's files stops at Survey.LIMIT entries (20000); a
    script beside its venv (/tmp/hf/venv: transformers' 500 model folders)
    fills it.  The cut fell inside a directory, and the comparison after a
    replica that made one directory (the Trainer's checkpoint-6) moved it by
    one: 'venv/.../models/vitmatte/configuration_vitmatte.py (removed)', a
    file untouched.  Directories are surveyed whole, and the comparison lists
    again those the survey listed (and new ones)."""
    from nndb.timetravel import sandbox
    monkeypatch.setattr(sandbox.Survey, "LIMIT", 25)
    for i in range(6):
        d = tmp_path / "venv" / f"m{i}"
        d.mkdir(parents=True)
        for j in range(5):
            (d / f"f{j}.py").write_text("x")
    survey = sandbox.Survey([str(tmp_path)])
    assert not survey.complete and len(survey.before) <= 25
    (tmp_path / "checkpoint-6").mkdir()
    (tmp_path / "checkpoint-6" / "model.pt").write_text("y")
    changes = survey.changes()
    assert changes == [(str(tmp_path / "checkpoint-6"), "new"),
                       (str(tmp_path / "checkpoint-6" / "model.pt"), "new")], changes
    for i in range(6):          # (and a change in a directory listed is named)
        (tmp_path / "venv" / f"m{i}" / "f0.py").write_text("changed")
    named = [p for p, what in survey.changes() if what == "changed"]
    assert named and all(p.endswith("f0.py") for p in named), named


# diffusers' train_unconditional.py shape: the output directory is made where the first sample
# is saved (os.makedirs(output_dir, exist_ok=True), then numpy.save of the images).
SAMPLES_LATER = "import os, numpy as np, torch, torch.nn as nn" + LOOP + '''
    if step == 5:
        os.makedirs("out", exist_ok=True)
        np.save(os.path.join("out", "samples.npy"), np.array([step]))
        open(os.path.join("out", "last.txt"), "w").write(str(step))
'''


@pytest.mark.parametrize("replica", ["fork", "respawn"])
def test_a_directory_a_replica_makes_under_the_temporary_directory_is_the_user_s(tmp_path, replica):
    """A script kept under /tmp (pytest's tmp_path is) whose output directory is made in the step a
    prediction runs: 'predict 3' at step 3 wrote out/samples.npy and out/last.txt into the user's
    directory (any directory made under the temporary directory was taken for the replica's own
    tempfile.mkdtemp), and said so: '3 of your file(s) changed while the replica ran'."""
    (tmp_path / "s.py").write_text(SAMPLES_LATER)
    argv = ["run", "--batch", "--nx", "--rules", "none", "--trace", str(tmp_path / "t.h5"), "--force",
            "--replica", replica, "-e", "until 3", "-e", "predict 3",
            "-e", 'p ("SEEN", sorted(os.listdir("out")) if os.path.isdir("out") else None)', "-e", "continue"]
    r = Ran(nndb(*argv, "s.py", cwd=str(tmp_path)), argv + ["s.py"])
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert re.search(r"Predicted 3 step\(s\) ahead on a replica", r.stdout), r.stdout + r.stderr
    # the directory is made for real, empty; its files went to scratch copies
    assert "('SEEN', [])" in r.stdout, r.stdout + r.stderr
    assert "samples.npy" not in r.stderr and "last.txt" not in r.stderr, r.stderr
    assert (tmp_path / "out" / "last.txt").read_text() == "5"          # (the live run's own)


def test_a_directory_the_replica_made_is_named_as_made_not_as_written_past_the_copies(tmp_path):
    """The directory a prediction's os.makedirs made (for real, by design) was named in the warning
    for writes past the scratch copies ('out (new)', its causes a subprocess, a C library, a memory
    map; 'those files are not as they were')."""
    (tmp_path / "s.py").write_text(SAMPLES_LATER)
    argv = ["run", "--batch", "--nx", "--rules", "none", "--trace", str(tmp_path / "t.h5"), "--force",
            "-e", "until 3", "-e", "predict 3", "-e", "predict 3", "-e", "continue"]
    r = Ran(nndb(*argv, "s.py", cwd=str(tmp_path)), argv + ["s.py"])
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    note = ("nndb: note: the replica made 1 directory(ies), left empty (os.makedirs makes a directory for real; "
            "what the replica wrote in it went to scratch copies): out")
    # (the second prediction found the directory there: it made none)
    assert r.stderr.count(note) == 1 and "changed while the replica ran" not in r.stderr, r.stderr


# A script that wants its output directory empty at its start (ignite's ModelCheckpoint,
# require_empty=True by default) and saves into it as it trains.
EMPTY_OUTPUT_DIR = '''
import os
import torch, torch.nn as nn
os.makedirs("out", exist_ok=True)
if os.listdir("out"):
    raise ValueError(f"files already in out: {sorted(os.listdir('out'))}")
''' + LOOP + '''
    if step % 3 == 2:
        torch.save(m.state_dict(), f"out/model_{step}.pt")
    print("step", step, repr(loss.item()))
'''


def test_a_replay_from_the_start_does_not_find_the_files_the_run_made_since(tmp_path):
    """A replay respawned from the start saw the directory as it is now, with the files the
    live run saved since it started: the script's check that its output directory is empty
    (ignite's ModelCheckpoint, require_empty=True) raised there, and 'goto 1' went back to the
    present.  The files the run made since it started are not there for the replay (os.listdir,
    os.stat, open); it reaches step 1 with the run's loss, and the run's files are as they were."""
    (tmp_path / "e.py").write_text(EMPTY_OUTPUT_DIR)
    argv = ["run", "--batch", "--nx", "--rules", "none", "--trace", str(tmp_path / "t.h5"), "--force",
            "--replica", "respawn", "-e", "until 6", "-e", "goto 1", "-e", "p $loss", "-e", "continue"]
    r = Ran(nndb(*argv, "e.py", cwd=str(tmp_path)), argv + ["e.py"])
    assert r.returncode == 0, r
    losses = [line.split()[2] for line in r.stdout.splitlines() if line.startswith("step ")]
    assert "In the past (timeline 0): step 1 finished" in r.stdout and losses[1] in r.stdout.split(
        "In the past", 1)[1].splitlines()[3], r
    assert "replay ended" not in r.stderr and "raised where the run went on" not in r.stderr, r.stderr
    assert "your files under" in r.stdout and "are as they were" in r.stdout, r.stdout
    assert sorted(os.listdir(tmp_path / "out")) == ["model_2.pt", "model_5.pt"]


# A log the script appends to after each step and reads back (its line count)
APPEND_LOG = '''
import torch, torch.nn as nn
open("log.txt", "w").close()
''' + LOOP + '''
    with open("log.txt", "a") as f:
        f.write(f"{step}\\n")
    lines = len(open("log.txt").readlines())
    print("step", step, "lines", lines)
'''


@pytest.mark.parametrize("replica", ["fork", "respawn"])
def test_a_replay_that_reads_a_file_the_run_wrote_after_its_start_says_so(tmp_path, replica):
    """A forked replica reads the user's files as they are now: 'goto 3' from step 6 (the
    checkpoint at step 0) replayed a script that appends a line to its log after each step and
    reads the count back, and 'p lines' in the past said 10 where the run had 4 at step 3 (the
    replay appended to the present's log of 6 lines), with no word of it.  Nothing can give the
    replica the file as it was: the replay says which files it read as they are now, written by
    the live run after the checkpoint.  A replay respawned from the start truncates the log
    itself, as the run did: it reads its own, 4 lines, and says nothing."""
    (tmp_path / "a.py").write_text(APPEND_LOG)
    argv = ["run", "--batch", "--nx", "--rules", "none", "--trace", str(tmp_path / "t.h5"), "--force",
            "--replica", replica, "-e", "until 6", "-e", "goto 3", "-e", "next", "-e", "p ('LINES', lines)",
            "-e", "present", "-e", "continue"]
    r = Ran(nndb(*argv, "a.py", cwd=str(tmp_path)), argv + ["a.py"])
    assert r.returncode == 0 and "Traceback" not in r.stderr, r
    if replica == "fork":
        assert ("nndb: warning: the replay read 1 file(s) the live run wrote after the checkpoint at step 0, where "
                "it started, as they are now, not as they were at the steps it replayed: log.txt; what the past "
                "read from them (and made of it) may differ from the run's") in r.stderr, r
        assert r.stderr.count("as they are now") == 1 and "('LINES', 10)" in r.stdout, r
    else:
        assert "as they are now" not in r.stderr and "('LINES', 4)" in r.stdout, r
    assert (tmp_path / "log.txt").read_text() == "".join(f"{i}\n" for i in range(8))   # (the run's own log)


# A script that raises if the state file it starts from is not fresh, and rewrites it as it
# trains: a file there at the run's start, which a replay from the start reads as it is now.
STALE_STATE = '''
import torch, torch.nn as nn
if open("state.txt").read() != "fresh":
    raise ValueError("state.txt is not fresh")
''' + LOOP + '''
    if step == 2:
        open("state.txt", "w").write("used")
    print("step", step, repr(loss.item()))
'''


def test_a_replay_that_raises_where_the_run_went_on_names_the_files_the_run_wrote(tmp_path):
    """A file there at the run's start and rewritten since is read by a replay from the start
    as it is now: the script raised there, and 'goto 1' said only 'the replay ended (failed:
    ...) before reaching step 1', as if the script failed.  It names the files the run wrote
    since it started, read as they are now, as a divergence does."""
    (tmp_path / "e.py").write_text(STALE_STATE)
    (tmp_path / "state.txt").write_text("fresh")
    argv = ["run", "--batch", "--nx", "--rules", "none", "--trace", str(tmp_path / "t.h5"), "--force",
            "--replica", "respawn", "-e", "until 6", "-e", "goto 1", "-e", "continue"]
    r = Ran(nndb(*argv, "e.py", cwd=str(tmp_path)), argv + ["e.py"])
    assert r.returncode == 0, r
    assert "nndb: the replay ended (failed: ValueError: state.txt is not fresh) before reaching step 1" \
        in r.stderr, r.stderr
    assert "nndb: the replay raised where the run went on; it read the files the run wrote since it started as " \
           "they are now: state.txt" in r.stderr, r.stderr
    assert (tmp_path / "state.txt").read_text() == "used"


def test_files_made_since_the_start_are_not_there_for_a_replay_through_any_listing(tmp_path, monkeypatch):
    """Survey.new_since names the files made since an earlier survey (in a directory made
    since too, not under one cut at the LIMIT), and a sandbox that hides them answers as for a
    file never made: os.listdir, os.scandir (glob, pathlib), os.path.exists, open, and a write
    starts a file of its own (run in a process of its own: the sandbox stays installed)."""
    from nndb.timetravel import sandbox
    monkeypatch.setattr(sandbox.Survey, "LIMIT", 12)
    (tmp_path / "keep.txt").write_text("there at the start")
    for i in range(3):
        (tmp_path / "big" / f"d{i}").mkdir(parents=True)
        for j in range(4):
            (tmp_path / "big" / f"d{i}" / f"f{j}").write_text("x")
    start = sandbox.Survey([str(tmp_path)])
    assert not start.complete
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model_2.pt").write_text("run's")
    (tmp_path / "late.txt").write_text("run's")
    listed = [d for d in (tmp_path / "big").iterdir() if str(d) in start.listed]
    unlisted = [d for d in (tmp_path / "big").iterdir() if str(d) not in start.listed]
    assert unlisted, "the LIMIT left no directory out"
    assert listed, "the LIMIT left every directory out"
    (unlisted[0] / "new").write_text("past the cut: not named")
    (listed[0] / "f9").write_text("in a directory listed: named")
    monkeypatch.setattr(sandbox.Survey, "LIMIT", 20000)       # (the later survey whole)
    new = sandbox.Survey([str(tmp_path)]).new_since(start)
    assert new == sorted([str(tmp_path / "late.txt"), str(tmp_path / "out" / "model_2.pt"),
                          str(listed[0] / "f9")]), new
    code = f'''
import glob, json, os, pathlib, sys
from nndb.timetravel import sandbox
os.chdir({str(tmp_path)!r})
box = sandbox.enter()
box.hide({new!r})
out = {{"listdir": sorted(os.listdir(".")), "out": os.listdir("out"), "glob": glob.glob("out/*"),
        "iterdir": [p.name for p in pathlib.Path("out").iterdir()], "pglob": [p.name for p in pathlib.Path(".").glob("*.txt")],
        "exists": os.path.exists("late.txt"), "keep": open("keep.txt").read()}}
try:
    open("late.txt").read()
except FileNotFoundError:
    out["open"] = "missing"
with open("late.txt", "a") as f:
    f.write("replica's")
out["appended"] = open("late.txt").read()
print(json.dumps(out))
'''
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got == {"listdir": ["big", "keep.txt", "out"], "out": [], "glob": [], "iterdir": [], "pglob": ["keep.txt"],
                   "exists": False, "keep": "there at the start", "open": "missing", "appended": "replica's"}, got
    assert (tmp_path / "late.txt").read_text() == "run's"
