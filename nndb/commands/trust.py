"""The trusted directories (``nndb trust DIR``): whose ``./.nndbrc`` nndb reads.

The list is kept in ``$XDG_CONFIG_HOME/nndb/trusted`` (default
``~/.config/nndb/trusted``) as one JSON object::

    {"format": "nndb-trusted", "version": 1, "directories": ["/abs/dir", ...]}

JSON, so that no path can split into two records (a directory whose name
holds a newline followed by another path once trusted that other path too).
A file of an earlier version (one path per line) is still read, and replaced
by the JSON form at the next ``nndb trust``.  The file is written atomically
with mode 0600; nndb warns when it finds it writable by others (anyone who
can write it can make nndb run commands).

A path with a control character is never trusted (refused by ``nndb trust``,
ignored with a warning in an old file).  The filesystem root, a directory
right under it (``/tmp``, ``/home``), a mount point and the home directory
itself are refused unless ``--force``: trusting one trusts every ``.nndbrc``
below it.
"""
from __future__ import annotations

import json
import os
import stat
import tempfile
import unicodedata
from typing import Callable, Optional

from ..errors import UsageError

FORMAT = "nndb-trusted"
VERSION = 1
Warn = Optional[Callable[[str], None]]


def _config_dir() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "nndb")


def trust_file() -> str:
    return os.path.join(_config_dir(), "trusted")


def bad_character(path: str) -> Optional[str]:
    """The first control (or line/paragraph separator) character of ``path``, shown, else None."""
    for ch in path:
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"):
            return repr(ch)
    return None


def _warn_if_writable(path: str, warn: Warn) -> None:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if warn is not None and mode & (stat.S_IWGRP | stat.S_IWOTH):
        warn(f"nndb: warning: {path} is writable by others (mode {stat.S_IMODE(mode):04o}); "
             f"anyone who can write it can make nndb run commands: chmod 600 {path}")


def _parse(text: str, path: str, warn: Warn) -> list:
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
            dirs = data["directories"] if data.get("format") == FORMAT else None
        except (ValueError, KeyError, AttributeError, TypeError):
            dirs = None
        if not isinstance(dirs, list):
            if warn is not None:
                warn(f"nndb: warning: {path} is not a trust file nndb can read; no directory is trusted")
            return []
        candidates = [d for d in dirs if isinstance(d, str)]
    else:                   # the format before version 1: one path per line
        candidates = [line.rstrip("\n") for line in text.split("\n")]
        candidates = [c for c in candidates if c.strip() and not c.startswith("#")]
    out = []
    for d in candidates:
        bad = bad_character(d)
        if bad is not None or not os.path.isabs(d):
            if warn is not None:
                why = f"it holds the control character {bad}" if bad else "it is not an absolute path"
                warn(f"nndb: warning: ignoring the trusted path {d!r} in {path}: {why}")
            continue
        out.append(d)
    return out


def trusted_dirs(warn: Warn = None) -> list:
    path = trust_file()
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError):
        return []
    _warn_if_writable(path, warn)
    return _parse(text, path, warn)


def is_trusted(directory: str, warn: Warn = None) -> bool:
    d = os.path.realpath(directory)
    for t in trusted_dirs(warn):
        t = os.path.realpath(t)
        if d == t or d.startswith(t.rstrip(os.sep) + os.sep):
            return True
    return False


def _too_wide(d: str) -> Optional[str]:
    """Why trusting ``d`` trusts too much, or None."""
    parent = os.path.dirname(d)
    if parent == d:
        return "it is the filesystem root"
    if os.path.dirname(parent) == parent:
        return "it is right under the filesystem root"
    if d == os.path.realpath(os.path.expanduser("~")):
        return "it is your home directory"
    if os.path.ismount(d):
        return "it is a mount point"
    return None


def _write(dirs: list) -> None:
    directory = _config_dir()
    os.makedirs(directory, mode=0o700, exist_ok=True)
    text = json.dumps({"format": FORMAT, "version": VERSION, "directories": dirs}, indent=1) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=".trusted-", dir=directory)      # (mode 0600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, trust_file())
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def trust(directory: str, force: bool = False, warn: Warn = None) -> str:
    """Add DIR to the trusted directories; returns its absolute path."""
    for name in (directory, os.path.realpath(directory)):
        bad = bad_character(name)
        if bad is not None:
            raise UsageError(f"refusing to trust {name!r}: its path holds the control character {bad}")
    if not os.path.isdir(directory):
        raise UsageError(f"no such directory: {directory}")
    d = os.path.realpath(directory)
    wide = _too_wide(d)
    if wide and not force:
        raise UsageError(f"refusing to trust {d}: {wide}, so every .nndbrc below it would run; "
                         "trust the project's directory, or use --force")
    dirs = trusted_dirs(warn)
    if d in [os.path.realpath(t) for t in dirs]:
        return d
    try:
        _write(dirs + [d])
    except OSError as e:
        raise UsageError(f"cannot write {trust_file()}: {e.strerror or e}") from None
    return d
