"""A replica never changes the user's files, or says which ones it changed.

A replica (a forked or respawned copy of the run: the past, a scan, a
prediction) runs the script's own code again, and that code writes files:
its log, ``torch.save`` of its checkpoint, ``numpy.save``, an HDF5 file,
``savefig`` of its plots.  In a replica, every write through the Python entry
points that write files goes to a scratch copy under a directory of the
replica's own, removed when the replica ends, and later reads of that path
in the replica read the copy:

* ``open``/``io.open`` in a writing mode (what ``numpy.save``, ``pathlib``,
  ``zipfile``, ``shutil.copyfile`` and matplotlib use), ``os.open`` with a
  writing flag (``Path.touch``, ``tempfile``), ``os.truncate``;
* ``torch.save`` to a path (torch's C++ writer opens the path itself:
  ``torch.serialization._open_zipfile_writer`` is given the scratch path);
* ``h5py.File`` (the HDF5 library opens the path itself:
  ``h5py._hl.files.make_fid`` is given the scratch path);
* ``safetensors`` (its Rust code opens the path itself: Hugging Face's
  ``save_file``/``save_model``/``load_file``, for torch and numpy): its
  ``serialize_file`` is given the scratch path, its ``safe_open`` the copy
  to read (a ``safe_open`` the script imported by name before the replica
  began reads the real file);
* ``os.remove``/``unlink``/``rename``/``replace`` and ``shutil.rmtree``
  leave the real files as they are; ``os.chmod``/``os.utime`` of a real
  file change its scratch copy.

What the replica asks of a path (``os.stat``/``os.lstat``: ``os.path.exists``,
``isfile``, ``getsize``, ``pathlib``'s ``exists()``, fsspec's) is answered as
its own writes left it: a file it wrote, the copy's; one it removed or renamed
away, no file (a real file stays, but not for the replica), as is reading it.
(Before, a file the replica wrote was not there for ``os.path.exists`` unless
the real one was, and one it removed still was: a step that saves a
checkpoint, checks that it exists, restores and removes it, as Lightning's
``Tuner.lr_find`` does, failed every replay past it with ``FileNotFoundError``.)
A directory's listing (``os.listdir``, ``os.scandir``: ``glob``, ``pathlib``)
is the real one's less what is not there for the replica.  A replay from the
script's start (respawned) does not find the files the live run made since it
started (``Sandbox.hide``).  A file the live run wrote after the replica's start
(its checkpoint's time, or the run's start) is read as it is now, as nothing
can give it as it was: such reads are noted (``Sandbox.stale``) and said.

A file the script opened before the replica began (its log, a ``logging``
handler's) is open in the replica through the live run's file descriptor,
which shares the live run's file and offset: as the replica begins, each
such descriptor open for writing is pointed (``dup2``) at a scratch copy of
the file at the same offset (``Sandbox.take_open_files``; Linux, where
/proc/self/fd names them).  The live run's descriptor is its own: its file
and offset are untouched.

What no Python entry point sees (another C library that opens a path itself,
``torch.jit.save``, a subprocess, ``posix.open``, a memory map made before
the replica began) is not redirected: nothing portable can redirect it
without privileges (a mount namespace) or a preloaded C library.  So the
live run also looks: ``Survey`` notes the size, modification time and inode
of every file under the script's directory and the working directory before
a replica starts, and compares after it ended; what changed is said, one
line, and "your files are as they were" is said only of what was compared.
Directories a replica makes (``os.makedirs``) are made for real (an empty
directory; the comparison names it on a line of its own, ``Survey.made_dirs``);
those ``tempfile.mkdtemp`` makes are the replica's own, written for real.

A replica forked from a replica (``predict`` or ``fuzz`` in the past) has a
sandbox of its own over its parent's: it reads the parent's scratch copies,
writes copies of its own, and removes only its own directory as it ends (it
had removed its parent's, and the past's next write, the REPL's history
among them, failed: issue 39).

Why this size: one promise, that a replica leaves the user's files as they were
and sees them as the run did, kept at every Python entry point that writes,
removes, stats or lists a file, and checked by the survey where none can be:
the parts must agree on what a path is for the replica.
"""
from __future__ import annotations

import builtins
import errno
import io
import os
import shutil
import stat
import sys

_PASS = ("/dev/", "/proc/", "/sys/")
_FDS = "/proc/self/fd"
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class Sandbox:
    def __init__(self, root: str, base: "Sandbox | None" = None):
        self.root = os.path.realpath(root)
        self.pid = os.getpid()
        # real path -> its scratch copy (a parent replica's copies are read, never written)
        self.moved: dict = dict(base.moved) if base is not None else {}
        # real paths (files or directories) the replica removed or renamed away: not there for it
        self.gone: set = set(base.gone) if base is not None else set()
        # real files made since the run started, not there for a replay from the start (``hide``)
        self.hidden: set = set(base.hidden) if base is not None else set()
        self.writes = 0
        # Files read as they are now where the live run rewrote them after the replica's start
        # (``since``, ns: its checkpoint's time; the run's start for a replay respawned from it):
        # what the replayed steps read is then not what the run's read (a log it appends to and
        # reads back, a data file rewritten each epoch).  Nothing can give the replica the file
        # as it was; ``stale`` names them, for a warning (``stale_note``).
        self.since: "int | None" = base.since if base is not None else None
        self.stale: dict = dict(base.stale) if base is not None else {}      # (ordered: a set)
        self.from_now: set = set(base.from_now) if base is not None else set()   # copies of such files
        self._open = base._open if base is not None else builtins.open
        # Directories of no user's: the temporary directories this replica made (and its parent's),
        # and torch.compile's cache, written for real: a compiler that runs as a subprocess (g++
        # for inductor's kernels) reads what was written there by path, which a scratch copy hid
        self.made: list = list(base.made) if base is not None else []
        self.caches = torch_caches()

    def _real(self, file) -> str | None:
        """The absolute path of a user's file, or None for what passes
        (a file descriptor, /dev, /proc, the replica's own directories)."""
        if isinstance(file, int):
            return None
        p = os.path.abspath(os.fsdecode(os.fspath(file)))
        if p.startswith(_PASS):
            return None
        for own in (self.root, *(d for _, d in CLEANUP), *OWN, *self.made, *self.caches):  # (a parent replica's too)
            if p == own or p.startswith(own + os.sep):
                return None
        return p

    def mkdir(self, path, *args, **kwargs):
        """Made for real; one ``tempfile.mkdtemp`` makes (its caller) is the replica's own: what
        it writes there is written for real.  (Any directory made under the temporary directory
        was: a script run from /tmp/work wrote its checkpoint directory's files for real.)"""
        p = None if "dir_fd" in kwargs or isinstance(path, int) else os.path.abspath(os.fsdecode(os.fspath(path)))
        again = p is not None and self._is_gone(p)          # (removed here: made again, for the replica)
        self.gone.discard(p)
        try:
            _os_mkdir(path, *args, **kwargs)
        except FileExistsError:
            if not again:
                raise
        if p is not None and sys._getframe(1).f_code is _mkdtemp_code():
            self.made.append(p)

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
                if (source == p and self._rewritten(p)) or (source != p and p in self.from_now):
                    self.from_now.add(p)
            self.moved[p] = scratch
        return scratch

    def write_path(self, file, keep: bool):
        """Where a write to ``file`` goes: its scratch copy (one more write
        counted), or ``file`` itself when it is not a user's file.  ``keep``:
        the copy starts from the file's content (appending, updating)."""
        p = self._real(file)
        if p is None:
            return file
        self.writes += 1
        if not keep:
            self.from_now.discard(p)             # (written whole: the replica's own content)
        scratch = self._copy_of(p, keep)        # (a file it removed starts empty: not there for stat)
        self.gone.discard(p)
        return scratch

    def _is_gone(self, p: str) -> bool:
        return p not in self.moved and (p in self.hidden or any(p == g or p.startswith(g + os.sep)
                                                                for g in self.gone))

    def hide(self, paths) -> None:
        """A replay from the script's start (respawned) does not find the files the live run
        made since it started (``Survey.new_since``: ignite's ModelCheckpoint, which requires
        its directory empty, raised at the replay's start on the run's own checkpoints; a script
        that resumes from a checkpoint it finds would have resumed from the run's latest): for
        the replica they are not there, as a file it removed is not, until it writes them."""
        self.hidden.update(paths)

    def _listing(self, real_call, scandir: bool):
        """os.listdir/os.scandir (``glob``, ``pathlib``'s ``iterdir`` and ``glob``): the real
        directory's entries but those not there for the replica (removed, or hidden)."""
        def listing(path=".", *args, **kwargs):
            got = real_call(path, *args, **kwargs)
            if isinstance(path, int) or not (self.gone or self.hidden):
                return got
            d = os.path.abspath(os.fsdecode(os.fspath(path)))
            if scandir:
                return _Listed(got, lambda e: not self._is_gone(os.path.join(d, os.fsdecode(e.name))))
            return [n for n in got if not self._is_gone(os.path.join(d, os.fsdecode(n)))]
        return listing

    @staticmethod
    def _no_file(file):
        return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), file)

    def _rewritten(self, p: str) -> bool:
        """The real file ``p`` was modified since the replica's start (``since``).  (Not a hidden
        file or one in a hidden directory, as the survey leaves them out: the prompt's history,
        ``.nndb_history``, which the live run appends to, is nndb's; ``~/.cache`` is libraries'.)"""
        if self.since is None or any(part.startswith(".") for part in p.split(os.sep)):
            return False
        try:
            return _os_stat(p).st_mtime_ns >= self.since
        except OSError:
            return False

    def read_path(self, file, reads: bool = True):
        """Where a read of ``file`` goes: its scratch copy once written here;
        one the replica removed is not there (FileNotFoundError).  ``reads``:
        its content is read (not a stat), noted where it is the present's."""
        p = self._real(file)
        if p is None:
            return file
        if self._is_gone(p):
            raise self._no_file(file)
        scratch = self.moved.get(p)
        if reads and (p in self.from_now if scratch is not None else self._rewritten(p)):
            self.stale[p] = None
        return file if scratch is None else scratch

    def _stat(self, real_call):
        """os.stat/os.lstat (os.path.exists, isfile, getsize, pathlib) as the
        replica's writes left the path: its copy's, or no file where it removed it."""
        def stat(path, *args, **kwargs):
            if "dir_fd" not in kwargs and not isinstance(path, int) and (self.gone or self.moved or self.hidden):
                path = self.read_path(path, reads=False)
            return real_call(path, *args, **kwargs)
        return stat

    def open(self, file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+"):
            file = self.write_path(file, keep="w" not in mode)     # (appending or updating starts from the file)
        else:
            file = self.read_path(file)
        return self._open(file, mode, *args, **kwargs)

    def os_open(self, path, flags, *args, **kwargs):
        if "dir_fd" not in kwargs:
            path = (self.write_path(path, keep=not flags & os.O_TRUNC) if flags & _WRITE_FLAGS
                    else self.read_path(path))
        return _os_open(path, flags, *args, **kwargs)

    def truncate(self, path, length):
        return _os_truncate(self.write_path(path, keep=True), length)

    def _metadata(self, real_call):
        def change(path, *args, **kwargs):
            if "dir_fd" not in kwargs and self._real(path) is not None:
                path = self._copy_of(self._real(path), keep=True)
            return real_call(path, *args, **kwargs)
        return change

    def remove(self, path, *args, **kwargs):
        p = self._real(path) if not (args or kwargs) else None      # (dir_fd: nndb's own cleanup)
        if p is None:
            return _os_remove(path, *args, **kwargs)
        if self._is_gone(p):
            raise self._no_file(path)       # (removed here already; a real file that is not there now may
                                            # be one the live run removed since the checkpoint: left alone)
        scratch = self.moved.pop(p, None)
        if scratch is not None and self._own(scratch) and os.path.exists(scratch):
            _os_remove(scratch)
        self.gone.add(p)

    def rename(self, src, dst, *args, **kwargs):
        s, d = (self._real(src), self._real(dst)) if not (args or kwargs) else (None, None)
        if s is None and d is None:
            return _os_rename(src, dst, *args, **kwargs)
        if s is not None and self._is_gone(s):
            raise self._no_file(src)
        source = self.moved.pop(s, s) if s is not None else src
        target = self.write_path(d, keep=False) if d is not None else dst
        if os.path.isfile(source):
            shutil.copyfile(source, target)
        if s is not None:
            self.gone.add(s)

    def rmtree(self, path, *args, **kwargs):
        p = self._real(path)
        if p is None:
            return _rmtree(path, *args, **kwargs)
        for real in [r for r in self.moved if r == p or r.startswith(p + os.sep)]:
            scratch = self.moved.pop(real)
            if self._own(scratch) and os.path.isfile(scratch):
                _os_remove(scratch)
        self.gone.add(p)

    def _h5_make_fid(self, real_make_fid):
        def make_fid(name, mode, *args, **kwargs):
            if isinstance(name, (str, bytes, os.PathLike)):
                # r: read; r+ and a: update (the copy starts from the file); w, w-, x: a new file
                to = (self.read_path(name) if mode in (None, "r")
                      else self.write_path(name, keep=mode in ("r+", "a")))
                name = os.fsencode(to) if isinstance(name, bytes) else to     # (h5py passes bytes)
            return real_make_fid(name, mode, *args, **kwargs)
        return make_fid

    def _new_file(self, file):
        return self.write_path(file, keep=False)          # (written whole: the copy starts empty)

    @staticmethod
    def _path_arg(real, to, at: int = 0):
        """``real`` with its positional argument ``at``, a path (not a buffer), sent through
        ``to`` (``_new_file`` or ``read_path``)."""
        def call(*args, **kwargs):
            if len(args) > at and isinstance(args[at], (str, bytes, os.PathLike)):
                args = args[:at] + (to(args[at]),) + args[at + 1:]
            return real(*args, **kwargs)
        return call

    def _safetensors(self) -> None:
        """safetensors' writer and reader, where the script can import it (the modules
        imported now, before the script's own import in a respawned replica: it then
        binds the wrapped ones)."""
        import importlib.util
        import sys
        if "safetensors" not in sys.modules:
            try:
                if importlib.util.find_spec("safetensors") is None:
                    return
            except (ImportError, ValueError):
                return
        try:
            import safetensors
            mods = [safetensors]
            for sub in ("safetensors.torch", "safetensors.numpy"):
                try:
                    mods.append(importlib.import_module(sub))
                except ImportError:
                    pass
        except Exception:          # (a broken install: the live run's comparison names what it writes)
            return
        native = _NATIVE.setdefault("safetensors", (getattr(safetensors, "serialize_file", None),
                                                    getattr(safetensors, "safe_open", None)))
        for m in mods:
            if native[0] is not None and hasattr(m, "serialize_file"):
                # (serialize_file(tensors, filename, metadata)): the path is the second argument
                m.serialize_file = self._path_arg(native[0], self._new_file, at=1)
            if native[1] is not None and hasattr(m, "safe_open"):
                m.safe_open = self._path_arg(native[1], self.read_path)

    def take_open_files(self, nndb_files=()) -> None:
        """The files the script opened before the replica began (its log, a
        ``logging`` handler's file) are open here through the live run's file
        descriptors, sharing its file and offset: each one open for writing
        is pointed (``dup2``) at its scratch copy, made from the file as it is
        now and at the same offset, so the file objects holding it write the
        copy.  Standard input and output and ``nndb_files`` (the trace) are
        left as they are; Linux only (/proc/self/fd), elsewhere the live run's
        comparison names what such a file wrote."""
        if not os.path.isdir(_FDS):
            return
        import fcntl
        skip = {os.path.realpath(p) for p in nndb_files if p}
        copies = {scratch: real for real, scratch in self.moved.items()}      # (a parent replica's, taken over already)
        stdio = stdio_files()     # (the run's output sent to a file, a copy of its descriptor: the role's, Role.begin)
        for fd in sorted(int(name) for name in os.listdir(_FDS)):
            try:
                flags = fcntl.fcntl(fd, fcntl.F_GETFL)
                st = os.fstat(fd)
                if (flags & os.O_ACCMODE == os.O_RDONLY or not stat.S_ISREG(st.st_mode)
                        or (st.st_dev, st.st_ino) in stdio):
                    continue
                path = os.readlink(f"{_FDS}/{fd}")
                real = copies.get(path) or self._real(path)
                if real is None or path in skip:
                    continue
                taken = self._own(self.moved.get(real, ""))          # (a second descriptor of the same file)
                scratch = self.write_path(real, keep=False)
                if not taken:
                    shutil.copyfile(f"{_FDS}/{fd}", scratch)         # (the descriptor's file, even one unlinked)
                    if self.since is not None and st.st_mtime_ns >= self.since:
                        self.from_now.add(real)
                copy = _os_open(scratch, flags & (os.O_ACCMODE | os.O_APPEND | os.O_SYNC))
                try:
                    os.lseek(copy, os.lseek(fd, 0, os.SEEK_CUR), os.SEEK_SET)
                    os.dup2(copy, fd, inheritable=os.get_inheritable(fd))
                finally:
                    os.close(copy)
            except OSError:       # (closed meanwhile: os.listdir's own descriptor among them)
                continue

    def install(self) -> None:
        builtins.open = io.open = self.open
        os.open = self.os_open
        os.truncate = self.truncate
        os.chmod, os.utime = self._metadata(_os_chmod), self._metadata(_os_utime)
        os.remove = os.unlink = self.remove
        os.rename = os.replace = self.rename
        os.stat, os.lstat = self._stat(_os_stat), self._stat(_os_lstat)
        os.listdir, os.scandir = self._listing(_os_listdir, False), self._listing(_os_scandir, True)
        os.mkdir = self.mkdir
        shutil.rmtree = self.rmtree
        import h5py._hl.files as h5files          # (nndb imports both before any replica)
        import torch.serialization as ts
        # (a replica's replica wraps torch's and h5py's own functions, not its parent's wrappers)
        if hasattr(ts, "_open_zipfile_writer"):
            ts._open_zipfile_writer = self._path_arg(_NATIVE.setdefault("torch", ts._open_zipfile_writer),
                                                     self._new_file)
        if hasattr(h5files, "make_fid"):
            h5files.make_fid = self._h5_make_fid(_NATIVE.setdefault("h5py", h5files.make_fid))
        self._safetensors()


_os_remove, _os_rename, _os_open, _os_truncate = os.remove, os.rename, os.open, os.truncate
_os_chmod, _os_utime, _rmtree = os.chmod, os.utime, shutil.rmtree
_os_mkdir = os.mkdir
_os_stat, _os_lstat = os.stat, os.lstat
_os_listdir, _os_scandir = os.listdir, os.scandir


class _Listed:
    """An ``os.scandir`` iterator less the entries ``keep`` refuses (a context manager, as
    ``glob`` uses it)."""

    def __init__(self, it, keep):
        self._it, self._keep = it, keep

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            e = next(self._it)
            if self._keep(e):
                return e

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self._it.close()


def _mkdtemp_code():
    import tempfile
    return tempfile.mkdtemp.__code__


def _temp_root() -> str:
    import tempfile
    return os.path.abspath(tempfile.gettempdir())


def torch_caches() -> list:
    """torch.compile's cache directories (torch's, content-addressed: no user's files)."""
    return [os.path.abspath(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or _inductor_cache())]


def _inductor_cache() -> str:
    """torch.compile's (inductor's) cache directory where TORCHINDUCTOR_CACHE_DIR is not set:
    torch's default (torch._inductor.runtime.cache_dir_utils, not imported for it)."""
    import getpass
    import re
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return os.path.join(_temp_root(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))
_NATIVE: dict = {}      # torch's, h5py's and safetensors' writers as they were before any sandbox


ACTIVE: "Sandbox | None" = None
CLEANUP: list = []      # [(pid, directory)] a replica made (removed as it ends: cleanup())
OWN: list = []          # directories the live run made for a replica's answer (fuzz --save): written for real


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


def enter(nndb_files=(), since: "float | None" = None) -> Sandbox:
    """In a replica process only: from now on its writes go to a scratch
    directory, removed as the replica ends, those through the files the
    script holds open included (but ``nndb_files``: the trace).  In a replica
    forked from a replica, a sandbox of its own over the parent's.
    ``since`` (time.time()): where the replica's state was taken (a
    checkpoint's time, the run's start): a file read that the live run
    rewrote after it is noted (``Sandbox.stale``)."""
    global ACTIVE
    if ACTIVE is None or ACTIVE.pid != os.getpid():
        ACTIVE = Sandbox(scratch_dir("nndb-replica-files-"), base=ACTIVE)
        if since is not None:
            ACTIVE.since = int(since * 1e9)
        ACTIVE.take_open_files(nndb_files)
        ACTIVE.install()
    return ACTIVE


def stdio_files() -> set:
    """(device, inode) of the files standard input and output are."""
    seen = set()
    for fd in (0, 1, 2):
        try:
            st = os.fstat(fd)
            seen.add((st.st_dev, st.st_ino))
        except OSError:
            pass
    return seen


class Survey:
    """The user's files before a replica runs, to compare after it ended
    (in the live run, which waits meanwhile): size, modification time and
    inode of every file and directory under ``roots`` (the script's
    directory, the working directory), at most LIMIT entries, leaving out
    hidden directories, ``__pycache__``, the paths in ``skip`` (the trace
    and its checkpoints, which are nndb's), torch.compile's cache (a replica
    writes it for real: ``Sandbox``) and the files the output goes to
    (``nndb run ... > log``: the replica's output is the run's)."""

    LIMIT = 20000

    def __init__(self, roots, skip=()):
        real = sorted({os.path.realpath(r) for r in roots if r and os.path.isdir(r)})
        self.roots = [r for r in real if not any(r.startswith(o + os.sep) for o in real if o != r)]
        self.skip = tuple(os.path.realpath(p) for p in (*skip, *torch_caches()) if p)
        self.stdio = stdio_files()        # the terminal's files: a log the run's output is sent to
        self.before, self.listed, self.complete = self._scan()
        self.after: dict = {}           # (the scan of changes(): what made_dirs reads)

    def _scan(self, within=None) -> tuple:
        """(entries, the directories listed, whether all were) under the roots, each directory
        whole: the first that would pass LIMIT is left out, with all after it.  ``within``: the
        directories the survey listed, the only ones listed again but for those new since
        (whose every entry is new)."""
        seen: dict = {}
        listed = set()
        todo = list(self.roots)
        while todo:
            d = todo.pop()
            if within is not None and d not in within and (d in self.before or d in self.roots):
                continue
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            found = {}
            for e in entries:
                if e.path.startswith(self.skip) or e.name == "__pycache__":
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) in self.stdio:
                    continue
                is_dir = e.is_dir(follow_symlinks=False)
                found[e.path] = (is_dir, st.st_size, st.st_mtime_ns, st.st_ino)
                if is_dir and not e.name.startswith("."):
                    todo.append(e.path)
            if within is None and len(seen) + len(found) > self.LIMIT:
                # (a directory cut short named the rest of it 'removed' when a new entry moved
                # the cut: a venv's transformers/models/vitmatte/configuration_vitmatte.py)
                return seen, listed, False
            seen.update(found)
            listed.add(d)
        return seen, listed, True

    def new_since(self, start: "Survey") -> list:
        """The files (not directories) of this survey that ``start``, an earlier one of the
        same roots, did not find: those made since (in a directory it listed, or in one made
        since under one it listed; not under a directory it left out for its LIMIT)."""
        def listed_at_start(d: str) -> bool:
            while d not in start.listed:
                if d in start.before or d in start.roots or os.path.dirname(d) == d:
                    return False            # (there at the start, not listed: past the LIMIT)
                d = os.path.dirname(d)
            return True
        return sorted(p for p, e in self.before.items()
                      if not e[0] and p not in start.before and listed_at_start(os.path.dirname(p)))

    def modified_since(self, t: float) -> list:
        """The files (not directories) of the survey last modified at or after ``t``
        (time.time()), sorted: what the live run wrote since it started (not a hidden
        file: the prompt's history, ``.nndb_history``, is nndb's, not the script's)."""
        ns = int(t * 1e9)
        return sorted(p for p, (is_dir, _, mtime, _) in self.before.items()
                      if not is_dir and mtime >= ns and not os.path.basename(p).startswith("."))

    def changes(self) -> list:
        """[(path, "changed" | "new" | "removed")] since the survey, sorted
        by path (a directory whose entries changed is named by them)."""
        after = self.after = self._scan(within=None if self.complete else self.listed)[0]
        out = []
        for p in sorted(set(self.before) | set(after)):
            a, b = self.before.get(p), after.get(p)
            if a is None:
                out.append((p, "new"))
            elif b is None:
                out.append((p, "removed"))
            elif a != b and not (a[0] and b[0] and a[3] == b[3]):
                out.append((p, "changed"))
        return out

    def made_dirs(self, changes: list) -> list:
        """The new directories among ``changes`` that hold nothing but new directories: what the
        replica's ``os.makedirs`` made, for real (``Sandbox.mkdir``), the files it wrote there
        going to scratch copies.  (They were named as files the replica wrote past its scratch
        copies: a prediction across diffusers' first sample, out (new), out/unet (new) ...)"""
        new = {p for p, what in changes if what == "new" and self.after.get(p, (False,))[0]}
        return [d for d in sorted(new) if all(q in new for q in self.after if q.startswith(d + os.sep))]

    def where(self) -> str:
        return " and ".join(self.roots)

    def _names(self, paths: list, limit: int = 5) -> str:
        shown = ", ".join(os.path.relpath(p, self.roots[0]) if p.startswith(self.roots[0] + os.sep) else p
                          for p in paths[:limit])
        return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")

    def made_report(self, dirs: list) -> str:
        """One line naming the directories the replica made (``made_dirs``)."""
        return (f"nndb: note: the replica made {len(dirs)} directory(ies), left empty (os.makedirs makes a "
                f"directory for real; what the replica wrote in it went to scratch copies): {self._names(dirs)}")

    def report(self, changes: list, limit: int = 5) -> str:
        """One warning line naming what changed."""
        shown = ", ".join(f"{self._names([p])} ({what})" for p, what in changes[:limit])
        more = f" and {len(changes) - limit} more" if len(changes) > limit else ""
        # (another program writing there meanwhile looks the same: a second experiment logging
        # into the directory was said to be the replica's doing)
        return (f"nndb: warning: {len(changes)} of your file(s) changed while the replica ran (the replica "
                f"writing past the scratch copies nndb gives it: {UNREDIRECTED}; or another program): "
                f"{shown}{more}; the live run is unchanged, those files are not as they were")


# What writes a replica's files past the sandbox (Survey.report says it)
UNREDIRECTED = ("written by a subprocess, a C library that opens the file itself, a low-level call or a memory map"
                + ("" if os.path.isdir(_FDS) else ", or through a file the script opened before the replica began"))


def stale_note(paths, src) -> str:
    """The warning for files a replay read as they are now (``Sandbox.stale``), where the live
    run rewrote them after the replay's start (``src``: the checkpoint's step, None: the start)."""
    names = [os.path.relpath(p) for p in paths]
    start = f"the checkpoint at step {src}" if src is not None else "the run's start"
    return (f"nndb: warning: the replay read {len(names)} file(s) the live run wrote after {start}, where it "
            f"started, as they are now, not as they were at the steps it replayed: "
            + ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            + "; what the past read from them (and made of it) may differ from the run's")


def read_as_now(paths) -> str:
    """'; it read the files the run wrote since it started as they are now: a, b' (a drift's
    likely cause: a replica reads a file as it is now, not as it was at its checkpoint or
    the run's start: a snapshot the script resumes from and saves over), '' for none."""
    if not paths:
        return ""
    names = [os.path.relpath(p) for p in paths]
    return ("; it read the files the run wrote since it started as they are now: "
            + ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else ""))
