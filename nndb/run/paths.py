"""The files nndb writes: the trace, the report, the on-disk checkpoints
(``TRACE.ckpt/``) of ``nndb run``; the pictures of ``nndb plot`` and
``compare --png``; ``fuzz --save``; ``inspect --npy``; ``lineage graph --dot``.
Each goes through ``claim_output`` (the trace through ``resolve_trace``)
before anything is written, the one place that keeps the rule: nndb never
destroys a file it did not write.  An output that exists is overwritten only
if nndb recognises it as its own output of that kind (``nndb_wrote``: the
trace's root attribute, the report's ``nndb_report`` key, the stamp nndb puts
into its pictures and fuzz inputs, the first line of its dot files); anything
else is refused with exit code 2 and the line says what to do.  A ``.npy``
carries no stamp, so an existing one is always refused.

``nndb run``'s files are resolved to absolute paths once, at start, and
checked before the script runs, so that

* a script that calls ``os.chdir`` does not move them (they land where the
  command line said, relative to the directory nndb was started in);
* an unwritable place fails at once, with exit code 2, not after the whole
  run (where exit 2 would hide the script's own result);
* an explicit ``--trace`` that exists is refused; ``--force`` overwrites it
  only if it is an nndb trace (HDF5 with the schema's root attribute, however
  its run ended: a killed run's trace is still flagged open for writing),
  never anything else; the trace, the report, the checkpoint directory and
  the script are all different files.

The report is not created before the run (an empty report would look like a
result): its directory is checked with a probe file, created and removed.
What nndb reads (``-x`` files, the rule file) is read at start, before the
script runs, and a respawned replica starts in the start directory, so those
keep the spelling the user gave (their errors show it).
"""
from __future__ import annotations

import json
import os
import re
import stat
import tempfile
from typing import Callable, Optional

from ..errors import UsageError

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
        from ..store.reader import open_hdf5
        from ..schema import FORMAT
        with open_hdf5(path) as f:
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


# The stamps nndb puts into what it writes, found in a file's first bytes.
PNG_STAMP = b"\x00\x00\x00\x0dtEXtSoftware\x00nndb"  # (matplotlib's savefig(metadata={"Software": "nndb"}))
SVG_STAMP = b"<dc:title>nndb</dc:title>"                 # (savefig(metadata={"Creator": "nndb"}))
FUZZ_STAMP = "nndb_fuzz_input"      # a key of the dict fuzz --save writes (torch.save puts data.pkl first)
PICTURE_METADATA = {".png": {"Software": "nndb"}, ".svg": {"Creator": "nndb"}}
_HEAD = 4096


def _head(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(_HEAD)


def _is_report(path: str) -> bool:
    with open(path, "rb") as fh:
        if fh.read(1) != b"{":
            return False
        fh.seek(0)
        data = json.load(fh)
    return isinstance(data, dict) and "nndb_report" in data


def _is_picture(path: str) -> bool:
    head = _head(path)
    return (head.startswith(b"\x89PNG") and PNG_STAMP in head) or SVG_STAMP in head


def _is_fuzz_input(path: str) -> bool:
    head = _head(path)
    return head.startswith(b"PK") and FUZZ_STAMP.encode() in head


def _is_dot(path: str) -> bool:
    from ..lineage.graph import DOT_STAMP
    return _head(path).startswith(DOT_STAMP.encode())


OUTPUT_KINDS: dict[str, Optional[Callable[[str], bool]]] = {
    "trace": is_nndb_trace, "report": _is_report, "picture": _is_picture, "fuzz": _is_fuzz_input,
    "dot": _is_dot, "npy": None}


def nndb_wrote(path: str, kind: str) -> bool:
    """``path`` is a regular file that nndb wrote as an output of ``kind``
    (one of OUTPUT_KINDS).  Anything it cannot tell is False."""
    recognise = OUTPUT_KINDS[kind]
    if recognise is None:
        return False
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        return bool(recognise(path))
    except (OSError, ValueError, UnicodeDecodeError):
        return False


def claim_output(path: str, what: str, kind: str) -> str:
    """An output file about to be written, as an absolute path: not a
    directory, its directory writable, and, if it exists, nndb's own output
    of ``kind``.  UsageError (exit 2) otherwise; ``what`` names it in the line."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        raise UsageError(f"{what} {path} is a directory (give a file name)")
    if os.path.lexists(path) and not nndb_wrote(path, kind):
        raise UsageError(f"{what} {path} exists and nndb did not write it: nndb never overwrites it; "
                         f"give another path, or remove the file first")
    check_writable_dir(path, f"cannot write {what}")
    return path


_CHECKPOINT_FILE = re.compile(r"^(step_\d+\.pt|\.step_.*\.tmp)$")


def checkpoint_dir(trace: str) -> str:
    """The checkpoint directory of a trace: ``run.h5`` -> ``run.ckpt``."""
    root, ext = os.path.splitext(trace)
    return (root if ext == ".h5" else trace) + ".ckpt"


def claim_checkpoint_dir(trace: str) -> None:
    """The trace's checkpoint directory, if it exists, is nndb's: a directory
    holding only checkpoint files (which a run overwrites); UsageError else."""
    d = checkpoint_dir(trace)
    if not os.path.lexists(d):
        return
    try:
        foreign = not os.path.isdir(d) or os.path.islink(d) or \
            any(not _CHECKPOINT_FILE.match(n) for n in os.listdir(d))
    except OSError:
        foreign = True
    if foreign:
        raise UsageError(f"the checkpoint directory {d} of --trace {trace} exists and holds what nndb did not "
                         f"write: nndb never overwrites it; give another --trace, or move it away")


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
    claim_checkpoint_dir(trace)
    return trace


def resolve_report(report: Optional[str]) -> Optional[str]:
    """``--report``: written over only if it is an earlier nndb report."""
    if report is None:
        return None
    return claim_output(report, "--report", "report")


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
