"""The files ``nndb run`` writes: the trace, the report, the on-disk
checkpoints (``TRACE.ckpt/``).  They are resolved to absolute paths once, at
start, and checked before the script runs, so that

* a script that calls ``os.chdir`` does not move them (they land where the
  command line said, relative to the directory nndb was started in);
* an unwritable place fails at once, with exit code 2, not after the whole
  run (where exit 2 would hide the script's own result);
* nndb never destroys a file it did not write: an explicit ``--trace`` that
  exists is refused; ``--force`` overwrites it only if it is an nndb trace
  (HDF5 with the schema's root attribute), never anything else; the trace,
  the report, the checkpoint directory and the script are all different files.

The report is not created before the run (an empty report would look like a
result): its directory is checked with a probe file, created and removed.
What nndb reads (``-x`` files, the rule file) is read at start, before the
script runs, and a respawned replica starts in the start directory, so those
keep the spelling the user gave (their errors show it).
"""
from __future__ import annotations

import os
import stat
import tempfile
from typing import Optional

from .errors import UsageError

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def is_nndb_trace(path: str) -> bool:
    """True if ``path`` is an HDF5 file whose root says it is an nndb trace.
    Anything else (not a regular file, not HDF5, HDF5 of someone else's,
    a file h5py cannot open) is False: never overwritten."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return False
        with open(path, "rb") as fh:
            if fh.read(len(HDF5_SIGNATURE)) != HDF5_SIGNATURE:
                return False
    except OSError:
        return False
    try:
        import h5py
        from .store.schema import FORMAT
        with h5py.File(path, "r") as f:
            fmt = f.attrs.get("nndb_format")
    except Exception:      # (h5py raises OSError, KeyError, RuntimeError... on a damaged file)
        return False
    if isinstance(fmt, bytes):
        fmt = fmt.decode("utf-8", "replace")
    return fmt == FORMAT


def _same(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_writable_dir(path: str, what: str, inside: bool = False) -> None:
    """The directory ``path`` would be written in (``inside``: ``path`` itself)
    can be written: its nearest existing ancestor is a directory where a
    probe file can be created (and is removed at once).  UsageError otherwise."""
    d = path if inside else os.path.dirname(path)
    while d and not os.path.exists(d):
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    if not os.path.isdir(d):
        raise UsageError(f"{what} {path}: {d} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".nndb-probe-", dir=d)
    except OSError as e:
        raise UsageError(f"{what} {path}: cannot create a file in {d}: {e.strerror or e}") from None
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError:
        pass


def checkpoint_dir(trace: str) -> str:
    from .timetravel.disk import directory_for     # (a leaf: os and torch only; no front end)
    return directory_for(trace)


def resolve_trace(trace: Optional[str], force: bool, what: str = "--trace", force_flag: str = "--force") \
        -> Optional[str]:
    """An explicit ``--trace``: absolute, refused if it exists (``--force``:
    unless it is an nndb trace), its directory writable.  (``what`` and
    ``force_flag`` name them in the messages: nndb.record says ``force=True``.)"""
    if trace is None:
        return None
    trace = os.path.abspath(trace)
    if os.path.isdir(trace):
        raise UsageError(f"{what} {trace} is a directory (give a file name)")
    if os.path.lexists(trace):
        if not is_nndb_trace(trace):
            raise UsageError(f"{what} {trace} exists and is not an nndb trace: nndb never overwrites it "
                             f"(not even with {force_flag}); give another path")
        if not force:
            raise UsageError(f"{what} {trace} exists (an nndb trace): give another path, "
                             f"or {force_flag} to overwrite it")
    check_writable_dir(trace, "cannot create trace")
    return trace


def resolve_report(report: Optional[str]) -> Optional[str]:
    if report is None:
        return None
    report = os.path.abspath(report)
    if os.path.isdir(report):
        raise UsageError(f"--report {report} is a directory (give a file name)")
    check_writable_dir(report, "cannot write the report")
    return report


def check_distinct(script: Optional[str], trace: Optional[str], report: Optional[str],
                   inputs: tuple = ()) -> None:
    """The outputs (trace, report, checkpoint directory) are different files,
    and none of them is the script or one of nndb's inputs (-x files, the rule file)."""
    named = []
    if trace is not None:
        named += [("--trace", trace), ("the checkpoint directory", checkpoint_dir(trace))]
    if report is not None:
        named.append(("--report", report))
    others = [("the script", script)] if script else []
    others += [("the input file", p) for p in inputs if p]
    for i, (what, path) in enumerate(named):
        for other, opath in named[i + 1:] + others:
            if _same(path, opath):
                raise UsageError(f"{what} and {other} are the same file ({opath}): give different paths")


def default_dir_writable(directory: str) -> str:
    """The default trace directory (./nndb-runs) as an absolute path, checked writable."""
    d = os.path.abspath(directory)
    check_writable_dir(d, "cannot create a trace in", inside=True)
    return d
