"""A trace whose disk fills up: the run goes on to its own exit code, one line
names the trace and the cause, and every step committed before reads back
exactly.  On a real small filesystem (a tmpfs mount, where this machine
allows it) and under ``ulimit -f`` (RLIMIT_FSIZE), through nndb run on a real
training script, and through the writer alone with its room check off (the
disk filling up under a write)."""
import os
import resource
import signal
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, example, nndb
from nndb.errors import TraceError
from nndb.store.reader import TraceReader

FILL = os.path.join(ROOT, "tests", "scripts", "store_fill_disk.py")
STEPS = "600"


def _file_limit(limit: int):
    def apply():        # in the child: a file size limit, and EFBIG instead of death by SIGXFSZ
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MB tmpfs, with all but ``free`` bytes taken: skipped where mounting is not allowed."""
    where = tmp_path / "small"
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(where)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")

    def fill_to(free: int) -> None:
        st = os.statvfs(where)
        with open(where / "filler", "wb") as fh:
            fh.write(b"\0" * max(0, st.f_bavail * st.f_frsize - free))
    try:
        yield where, fill_to
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.fixture(scope="module")
def roomy(tmp_path_factory):
    """The same run as the tests', on a disk with room: what every step must read back as."""
    path = str(tmp_path_factory.mktemp("roomy") / "run.h5")
    r = nndb("run", "--batch", "--trace", path, example("mlp.py"), "--steps", STEPS, timeout=900)
    assert r.returncode == 0, r.stderr
    with TraceReader(path) as t:
        return t.n_steps, np.array(t.steps), t.series(), t.all_stats(), r.stdout


def _one_trace_line(stderr: str, path: str, cause: str) -> int:
    """The one line that says the trace could not be written; the steps it keeps."""
    assert "Traceback" not in stderr and "Segmentation" not in stderr, stderr
    lines = [l for l in stderr.splitlines() if "cannot write trace" in l]
    assert len(lines) == 1, stderr
    line = lines[0]
    assert line.startswith("nndb: ") and path in line and cause in line, line
    return int(line.split("keeps the ")[1].split(" steps")[0])


def _assert_reads_back(path: str, kept: int, roomy) -> None:
    n, steps, series, stats, _ = roomy
    with TraceReader(path) as t:
        assert 0 < t.n_steps == kept < n
        np.testing.assert_array_equal(t.steps, steps[:kept])
        assert t.series() == series[:len(t.series())]
        got = t.all_stats()
        np.testing.assert_array_equal(got, stats[:kept, :got.shape[1]])


def _run_full(path: str, **kw):
    return nndb("run", "--batch", "--trace", path, example("mlp.py"), "--steps", STEPS, timeout=900, **kw)


def test_a_full_tmpfs_keeps_every_committed_step(small_disk, roomy):
    where, fill_to = small_disk
    fill_to(400_000)
    path = str(where / "full.h5")
    r = _run_full(path)
    assert r.returncode == 0, r.stderr                   # the script's own exit code (it finishes)
    assert r.stdout == roomy[4]                          # and it printed what it prints without nndb
    kept = _one_trace_line(r.stderr, path, "No space left on device")
    _assert_reads_back(path, kept, roomy)


def test_a_file_size_limit_keeps_every_committed_step(tmp_path, roomy):
    path = str(tmp_path / "limited.h5")
    r = _run_full(path, preexec_fn=_file_limit(350_000))
    assert r.returncode == 0, r.stderr
    assert r.stdout == roomy[4]
    kept = _one_trace_line(r.stderr, path, "File too large")
    _assert_reads_back(path, kept, roomy)


def test_the_script_exit_code_is_its_own_when_the_disk_fills(tmp_path):
    path = str(tmp_path / "limited.h5")
    script = tmp_path / "exits.py"
    script.write_text("import runpy, sys\nsys.argv = ['mlp.py', '--steps', '1000']\n"
                      f"runpy.run_path({example('mlp.py')!r}, run_name='__main__')\nsys.exit(7)\n")
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, timeout=900)
    # (flushes every 100 steps: some are committed before the file reaches the limit.  The
    # room check keeps 256 KB for HDF5's metadata and counts a block's histograms as stored)
    r = nndb("run", "--batch", "--flush-every", "100", "--trace", path, str(script),
             preexec_fn=_file_limit(600_000), timeout=900)
    assert plain.returncode == 7 and r.returncode == 7, r.stderr
    _one_trace_line(r.stderr, path, "File too large")
    with TraceReader(path) as t:
        assert t.n_steps > 0


# -- the write itself fails (the room check off): data first, then the count ----------------------

def _fill(path: str, *extra, preexec_fn=None):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, FILL, path, "3000", "40", *extra], capture_output=True, text=True,
                          timeout=300, env=env, preexec_fn=preexec_fn)


def _check_values(path: str, out: str) -> None:
    sys.path.insert(0, os.path.dirname(FILL))
    try:
        from store_fill_disk import value
    finally:
        sys.path.pop(0)
    committed = [int(l.split()[1]) for l in out.splitlines() if l.startswith("committed")]
    failed = [l for l in out.splitlines() if l.startswith("failed:")]
    assert len(failed) == 1 and "\n" not in failed[0]
    kept = int(failed[0].split("keeps the ")[1].split(" steps")[0])
    assert kept == (committed[-1] if committed else 0)
    with TraceReader(path) as t:
        assert t.n_steps == kept and list(t.steps) == list(range(kept))
        for s in t.series():
            steps, biggest = t.history(s, "max")
            assert list(steps) == list(range(kept))
            np.testing.assert_array_equal(biggest, [value(int(st), s.id) for st in steps])


@pytest.mark.parametrize("limit", [150_000, 333_333, 600_000])
def test_a_write_that_fails_under_a_file_size_limit_leaves_the_committed_steps(tmp_path, limit):
    path = str(tmp_path / "fill.h5")
    r = _fill(path, "--no-room-check", preexec_fn=_file_limit(limit))
    assert r.returncode == 0, r.stderr
    assert "File too large" in r.stdout, r.stdout[-500:]
    _check_values(path, r.stdout)


def test_a_write_that_fails_on_a_full_tmpfs_leaves_the_committed_steps(small_disk):
    where, fill_to = small_disk
    fill_to(450_000)
    path = str(where / "fill.h5")
    r = _fill(path, "--no-room-check")
    assert r.returncode == 0, r.stderr
    assert "No space left on device" in r.stdout, r.stdout[-500:]
    _check_values(path, r.stdout)


def test_the_room_check_stops_before_the_write(tmp_path):
    path = str(tmp_path / "fill.h5")
    r = _fill(path, preexec_fn=_file_limit(333_333))
    assert r.returncode == 0, r.stderr
    assert "the file size limit" in r.stdout, r.stdout[-500:]
    _check_values(path, r.stdout)
