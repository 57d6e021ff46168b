"""A replica never changes the user's files.

A replica (a forked or respawned copy of the run: the past, a scan, a
prediction) runs the script's own code again, and that code writes files:
its log, ``torch.save`` of its checkpoint, ``savefig`` of its plots.  In a
replica, every file the script opens for writing (``open``/``io.open`` in a
writing mode: what ``torch.save``, ``numpy.save``, ``pathlib`` and matplotlib
use) goes to a scratch copy under a directory of the replica's own, which is
removed when the replica ends; later reads of that path in the replica read
the copy.  ``os.remove``/``unlink`` of a real file and ``os.rename``/``replace``
from one leave the real file as it is.  What the script writes through C
libraries (h5py, a subprocess) is not redirected.

A replica forked from a replica (``predict`` or ``fuzz`` in the past) has a
sandbox of its own over its parent's: it reads the parent's scratch copies,
writes copies of its own, and removes only its own directory as it ends (it
had removed its parent's, and the past's next write, the REPL's history
among them, failed: issue 39).
"""
from __future__ import annotations

import builtins
import io
import os
import shutil

_PASS = ("/dev/", "/proc/", "/sys/")


class Sandbox:
    def __init__(self, root: str, base: "Sandbox | None" = None):
        self.root = os.path.realpath(root)
        self.pid = os.getpid()
        # real path -> its scratch copy (a parent replica's copies are read, never written)
        self.moved: dict = dict(base.moved) if base is not None else {}
        self.writes = 0
        self._open = base._open if base is not None else builtins.open
        self._base_roots = (base.root,) + base._base_roots if base is not None else ()

    def _real(self, file) -> str | None:
        if isinstance(file, int):
            return None
        p = os.path.abspath(os.fspath(file))
        if p.startswith(_PASS) or any(p == r or p.startswith(r + os.sep) for r in (self.root,) + self._base_roots):
            return None
        return p

    def _own(self, scratch: str) -> bool:
        return scratch.startswith(self.root + os.sep)

    def _copy_of(self, p: str, keep: bool) -> str:
        scratch = self.moved.get(p)
        if scratch is None or not self._own(scratch):
            source = p if scratch is None else scratch       # (a parent replica's copy: this one's starts from it)
            scratch = os.path.join(self.root, p.lstrip(os.sep))
            os.makedirs(os.path.dirname(scratch), exist_ok=True)
            if keep and os.path.isfile(source):
                shutil.copyfile(source, scratch)
            self.moved[p] = scratch
        return scratch

    def open(self, file, mode="r", *args, **kwargs):
        p = self._real(file)
        if p is not None:
            if any(c in mode for c in "wax+"):
                self.writes += 1
                file = self._copy_of(p, keep="w" not in mode)      # (appending or updating starts from the file)
            elif p in self.moved:
                file = self.moved[p]
        return self._open(file, mode, *args, **kwargs)

    def remove(self, path, *args, **kwargs):
        p = self._real(path) if not (args or kwargs) else None      # (dir_fd: nndb's own cleanup)
        if p is None:
            return _os_remove(path, *args, **kwargs)
        scratch = self.moved.pop(p, None)
        if scratch is not None and self._own(scratch) and os.path.exists(scratch):
            _os_remove(scratch)

    def rename(self, src, dst, *args, **kwargs):
        s, d = (self._real(src), self._real(dst)) if not (args or kwargs) else (None, None)
        if s is None and d is None:
            return _os_rename(src, dst, *args, **kwargs)
        source = self.moved.pop(s, s) if s is not None else src
        target = self._copy_of(d, keep=False) if d is not None else dst
        if os.path.isfile(source):
            shutil.copyfile(source, target)

    def install(self) -> None:
        builtins.open = io.open = self.open
        os.remove = os.unlink = self.remove
        os.rename = os.replace = self.rename


_os_remove, _os_rename = os.remove, os.rename


ACTIVE: "Sandbox | None" = None
CLEANUP: list = []      # [(pid, directory)] a replica made (removed as it ends: cleanup())


def scratch_dir(prefix: str) -> str:
    """A directory of this replica's own, removed as it ends (``cleanup``)."""
    import tempfile
    root = tempfile.mkdtemp(prefix=prefix)
    CLEANUP.append((os.getpid(), root))
    return root


def cleanup() -> None:
    """Remove the directories this process made (a parent replica's stay: they are still in use)."""
    me = os.getpid()
    for pid, d in CLEANUP:
        if pid == me:
            shutil.rmtree(d, ignore_errors=True)


def enter() -> Sandbox:
    """In a replica process only: from now on its writes go to a scratch
    directory, removed as the replica ends.  In a replica forked from a
    replica, a sandbox of its own over the parent's."""
    global ACTIVE
    if ACTIVE is None or ACTIVE.pid != os.getpid():
        ACTIVE = Sandbox(scratch_dir("nndb-replica-files-"), base=ACTIVE)
        ACTIVE.install()
    return ACTIVE
