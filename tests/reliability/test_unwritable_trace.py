"""A trace path nndb cannot create (in /proc, on a read-only file system) is
one `nndb: error:` line and exit 2 before the script runs, never HDF5's own
multi-line text (issue 20)."""
import os
import subprocess

import pytest

from conftest import nndb

SCRIPT = "print('the script ran')\n"


def _check(r, path, cause):
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"nndb: error: cannot create trace {path}: "), r.stderr
    assert lines[0].endswith(cause), r.stderr                 # the OS's words
    for hdf5 in ("HDF5", "Unable to synchronously", "o_flags", "errno ="):   # not HDF5's own text
        assert hdf5 not in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert "the script ran" not in r.stdout


def test_a_trace_in_proc_is_one_line(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    _check(nndb("run", "--batch", "--nx", "--trace", "/proc/nndb-x", str(script)), "/proc/nndb-x", "No such file or directory")


def test_a_trace_on_a_read_only_file_system_is_one_line(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(ro)], capture_output=True)
    if m.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {m.stderr.decode().strip()}")
    try:
        script = tmp_path / "s.py"
        script.write_text(SCRIPT)
        path = os.path.join(str(ro), "t.h5")
        _check(nndb("run", "--batch", "--nx", "--trace", path, str(script)), path, "Read-only file system")
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)
