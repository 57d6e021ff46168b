"""On-disk checkpoints: atomic writes, weights_only loading, RNG round trips."""
import os
import random

import numpy as np
import pytest
import torch

from nndb.timetravel import disk


@pytest.fixture(scope="module", autouse=True)
def _warm_torch():
    """The first optimizer step in a process imports torch._dynamo (about
    1.5 s); pay it once here rather than inside whichever test runs first."""
    trained()


def trained():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(16, 4)).pow(2).mean().backward()
        opt.step()
    return model, opt


def assert_tree_equal(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for key in a:
            assert_tree_equal(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_tree_equal(x, y)
    else:
        assert a == b


def test_directory_for():
    assert disk.directory_for("/runs/a.h5") == "/runs/a.ckpt"
    assert disk.directory_for("/runs/a.b.h5") == "/runs/a.b.ckpt"
    assert disk.directory_for("/runs/trace") == "/runs/trace.ckpt"


def test_save_load_round_trip(tmp_path):
    model, opt = trained()
    directory = str(tmp_path / "run.ckpt")
    path = disk.save(directory, 2, {"model": model}, {"opt": opt}, rng=disk.capture_rng())
    assert path == os.path.join(directory, "step_00000002.pt")
    assert os.listdir(directory) == ["step_00000002.pt"]     # no temporary left over

    raw = torch.load(path, weights_only=True, map_location="cpu")
    assert raw["format"] == "nndb-checkpoint" and raw["version"] == 1 and raw["step"] == 2

    data = disk.load(path)
    assert_tree_equal(model.state_dict(), data["modules"]["model"])
    saved = data["optimizers"]["opt"]
    assert_tree_equal(opt.state_dict(), saved)
    assert len(saved["state"]) == 4 and int(saved["state"][0]["step"]) == 2

    fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    fresh.load_state_dict(data["modules"]["model"])
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=1e-2)
    fresh_opt.load_state_dict(saved)
    x = torch.randn(3, 4)
    assert torch.equal(fresh(x), model(x))


def test_save_without_rng_and_overwrite(tmp_path):
    model, _ = trained()
    path = disk.save(str(tmp_path), 5, {"m": model}, {})
    assert disk.load(path)["rng"] is None
    with torch.no_grad():
        model[0].weight.add_(1.0)
    assert disk.save(str(tmp_path), 5, {"m": model}, {}) == path
    assert torch.equal(disk.load(path)["modules"]["m"]["0.weight"], model[0].weight)
    assert sorted(os.listdir(tmp_path)) == ["step_00000005.pt"]


def test_directory_is_a_file(tmp_path):
    blocker = tmp_path / "run.ckpt"
    blocker.write_bytes(b"not a directory")
    model, opt = trained()
    with pytest.raises(OSError, match="cannot create checkpoint directory"):
        disk.save(str(blocker), 1, {"m": model}, {"o": opt})
    assert os.listdir(tmp_path) == ["run.ckpt"]
    assert blocker.read_bytes() == b"not a directory"


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    def broken_save(obj, fh):
        fh.write(b"partial")
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(disk.torch, "save", broken_save)
    model, _ = trained()
    with pytest.raises(OSError, match=r"cannot write checkpoint .*step_00000003\.pt.*disk on fire"):
        disk.save(str(tmp_path), 3, {"m": model}, {})
    assert os.listdir(tmp_path) == []


def test_load_rejects_foreign_files(tmp_path):
    path = str(tmp_path / "other.pt")
    torch.save({"weights": torch.zeros(2)}, path)
    with pytest.raises(ValueError, match="not an nndb checkpoint"):
        disk.load(path)


def test_list_checkpoints_sorted(tmp_path):
    assert disk.list_checkpoints(str(tmp_path / "missing")) == []
    model, _ = trained()
    for step in (30, 2, 100, 7):
        disk.save(str(tmp_path), step, {"m": model}, {})
    (tmp_path / ".step_abc.tmp").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("hi")
    listed = disk.list_checkpoints(str(tmp_path))
    assert [s for s, _ in listed] == [2, 7, 30, 100]
    assert all(p == os.path.join(str(tmp_path), disk.file_name(s)) for s, p in listed)


def draw():
    return (torch.rand(5).tolist(), [random.random() for _ in range(5)], random.gauss(0, 1),
            np.random.rand(5).tolist(), np.random.standard_normal())


def test_rng_round_trip():
    random.gauss(0, 1)                      # leave a cached gaussian in both generators
    np.random.standard_normal()
    state = disk.capture_rng()
    first = draw()
    disk.restore_rng(state)
    assert draw() == first
    assert draw() != first


def test_rng_round_trip_through_disk(tmp_path):
    model, _ = trained()
    path = disk.save(str(tmp_path), 0, {"m": model}, {}, rng=disk.capture_rng())
    first = draw()
    disk.restore_rng(disk.load(path)["rng"])
    assert draw() == first


DROPOUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "device_dropout.py")


def test_without_fork_checkpoints_the_disk_ones_are_still_written_and_resume_the_run(tmp_path):
    """Where fork checkpoints are off (CUDA initialised: scripts/gpu_check.py
    checks it on a device; here --replica respawn, the same path) the disk
    schedule still writes at every 10% of a known total, a travel's replica
    writes none, and a checkpoint resumes the script bit for bit: its model,
    optimizer and RNG (dropout draws from it) are the run's after that step."""
    from conftest import nndb, python
    trace = str(tmp_path / "run.h5")
    r = nndb("run", "--batch", "--replica", "respawn", "--total-steps", "20", "--trace", trace,
             "-e", "break step 15", "-e", "continue", "-e", "goto 3", "-e", "present", "-e", "info checkpoints",
             "-e", "continue", DROPOUT, "--steps", "20", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "In the past (timeline 0): step 3 finished" in r.stdout
    ckdir = tmp_path / "run.ckpt"
    names = sorted(os.listdir(ckdir))
    assert names == [disk.file_name(s) for s in range(2, 20, 2)]
    assert f"On disk: step 14: {ckdir / disk.file_name(14)}" in r.stdout      # info checkpoints lists them
    # the replica (replaying 0..3 after step 15) wrote none: step 2's file is older than step 14's
    assert os.stat(ckdir / disk.file_name(2)).st_mtime_ns <= os.stat(ckdir / disk.file_name(14)).st_mtime_ns
    recorded = [line for line in r.stdout.splitlines() if line.startswith("step ")]
    assert len(recorded) == 20
    resumed = python(DROPOUT, "--steps", "20", "--resume", str(ckdir / disk.file_name(10)), forked=True)
    assert resumed.returncode == 0, resumed.stderr
    lines = resumed.stdout.splitlines()
    assert lines[0] == "resumed after step 10, cuda rng states: 0"
    assert lines[1:] == recorded[11:]
    # without the RNG the dropout masks differ: the same resume with torch's state of step 2
    ck = torch.load(ckdir / disk.file_name(10), weights_only=True)
    ck["rng"] = torch.load(ckdir / disk.file_name(2), weights_only=True)["rng"]
    torch.save(ck, tmp_path / "wrong_rng.pt")
    other = python(DROPOUT, "--steps", "20", "--resume", str(tmp_path / "wrong_rng.pt"), forked=True)
    assert other.stdout.splitlines()[1:] != recorded[11:]


def test_a_run_of_unknown_length_writes_disk_checkpoints_on_its_ticks_and_lists_them(tmp_path):
    """Every 8th tick writes (here a tick a step: --checkpoint-every 1, fork
    checkpoints off), as often as a write's cost allows at 2% of the run time
    (how many: the machine's speed; which are kept when more than 10 were
    written: test_timetravel_schedule), the first kept, and `info checkpoints`
    lists what is on disk."""
    import re

    from conftest import nndb
    r = nndb("run", "--batch", "--replica", "respawn", "--checkpoint-every", "1", "--trace", str(tmp_path / "run.h5"),
             "-e", "break step 199", "-e", "continue", "-e", "info checkpoints", "-e", "continue",
             DROPOUT, "--steps", "200", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    steps = [s for s, _ in disk.list_checkpoints(str(tmp_path / "run.ckpt"))]
    assert 1 <= len(steps) <= 10 and steps[0] == 7, steps
    assert all(b - a >= 8 for a, b in zip(steps, steps[1:])), steps
    assert [int(m) for m in re.findall(r"^On disk: step (\d+):", r.stdout, re.M)] == steps
    assert "the newest 10 kept" in r.stdout
