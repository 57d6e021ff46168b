"""Room on the trace's disk, and a file that must not be written again.

The writer asks ``check_room`` before each block, so that a full disk or the
process's file size limit (``ulimit -f``) stops the recording between two
blocks, with the file whole, rather than in the middle of one.  When a write
fails all the same (the disk filled up under us), ``detach_file`` points the
file's descriptor at /dev/null: HDF5's close then flushes its metadata
nowhere, and the file stays as its last committed block left it."""
from __future__ import annotations

import errno
import os
import resource


class NoRoom(Exception):
    """Not enough room for the next block (the message says which limit)."""


def check_room(path: str, f, need: int) -> None:
    try:
        size = max(os.path.getsize(path), int(f.id.get_filesize()))
    except (OSError, ValueError, RuntimeError):
        return              # the write itself will tell
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if soft != resource.RLIM_INFINITY and size + need > soft:
        raise NoRoom(f"{os.strerror(errno.EFBIG)} (the file size limit, ulimit -f, is {soft} bytes)")
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return
    if st.f_bavail * st.f_frsize < need:
        raise NoRoom(f"{os.strerror(errno.ENOSPC)} ({st.f_bavail * st.f_frsize} bytes free, "
                     f"the next block needs up to {need})")


def detach_file(f) -> None:
    """Send every later write of HDF5 file ``f`` (its close's included) to /dev/null."""
    try:
        fd = f.id.get_vfd_handle()
        null = os.open(os.devnull, os.O_RDWR)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)
    except Exception:
        pass


def reason(e: Exception) -> str:
    """An OSError's or h5py error's cause, in a few words, on one line."""
    text = " ".join(str(e).split()) or type(e).__name__
    # h5py error texts look like "Unable to create file (unable to open file: ..., errno = 13,
    # error message = 'Permission denied', ...)", over several lines
    if "error message = '" in text:
        return text.split("error message = '", 1)[1].split("'", 1)[0]
    if isinstance(e, OSError) and e.strerror:
        return " ".join(str(e.strerror).split())
    return text
