"""Command files and the trust rule for ``./.nndbrc`` (gdb's auto-load safe-path).

At start nndb reads, in order: ``~/.nndbrc``; ``./.nndbrc`` if the working
directory is trusted (``nndb trust DIR`` trusts DIR and everything under it);
the ``-x FILE`` files (trusted because named); the ``-e CMD`` commands.
``--nx`` skips both rc files.  An rc file in an untrusted directory is never
read: nndb prints one line with the command that trusts it.

Trusted directories are kept one per line in ``$XDG_CONFIG_HOME/nndb/trusted``
(default ``~/.config/nndb/trusted``).
"""
from __future__ import annotations

import os
from typing import Callable, Optional

from ..errors import CommandError, UsageError
from .session import QueuedLine

RC_NAME = ".nndbrc"


def _config_dir() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "nndb")


def trust_file() -> str:
    return os.path.join(_config_dir(), "trusted")


def trusted_dirs() -> list:
    try:
        with open(trust_file(), encoding="utf-8") as fh:
            return [line.strip() for line in fh if line.strip() and not line.startswith("#")]
    except OSError:
        return []


def is_trusted(directory: str) -> bool:
    d = os.path.realpath(directory)
    for t in trusted_dirs():
        t = os.path.realpath(t)
        if d == t or d.startswith(t.rstrip(os.sep) + os.sep):
            return True
    return False


def trust(directory: str) -> str:
    """Add DIR to the trusted directories; returns its absolute path."""
    if not os.path.isdir(directory):
        raise UsageError(f"no such directory: {directory}")
    d = os.path.realpath(directory)
    if d in [os.path.realpath(t) for t in trusted_dirs()]:
        return d
    try:
        os.makedirs(_config_dir(), exist_ok=True)
        with open(trust_file(), "a", encoding="utf-8") as fh:
            fh.write(d + "\n")
    except OSError as e:
        raise UsageError(f"cannot write {trust_file()}: {e.strerror or e}") from None
    return d


def read_command_file(path: str) -> list:
    """The commands of a file, as queued lines that know their FILE:LINE."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as e:
        reason = getattr(e, "strerror", None) or str(e)
        raise CommandError(f"cannot read command file {path}: {reason}") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if s and not s.startswith("#"):
            out.append(QueuedLine(s, source=path, line=n))
    return out


def startup_lines(command_files: list, eval_commands: list, no_rc: bool,
                  message: Callable[[str], None], cwd: Optional[str] = None) -> list:
    """Everything to run at the first stop, in order."""
    lines: list = []
    cwd = cwd or os.getcwd()
    if not no_rc:
        home_rc = os.path.join(os.path.expanduser("~"), RC_NAME)
        if os.path.isfile(home_rc):
            lines += read_command_file(home_rc)
        local_rc = os.path.join(cwd, RC_NAME)
        if os.path.isfile(local_rc) and os.path.realpath(local_rc) != os.path.realpath(home_rc):
            if is_trusted(cwd):
                lines += read_command_file(local_rc)
            else:
                message(f"nndb: not reading {local_rc}: the directory is not trusted; "
                        f"to trust it, run: nndb trust {_quote(os.path.realpath(cwd))}")
    for path in command_files:
        try:
            lines += read_command_file(path)
        except CommandError as e:
            raise UsageError(str(e)) from None
    lines += [QueuedLine(c) for c in eval_commands]
    return lines


def first_error(table, lines: list) -> Optional[str]:
    """Batch mode checks its startup commands before the script runs: each
    line must name a command and its arguments must parse (what needs the run,
    a tensor's name or an expression's value, is checked when it runs).  The
    lines of a ``commands`` block are skipped; they run at a stop."""
    in_block = False
    for q in lines:
        if in_block:
            in_block = q.text.strip() != "end"
            continue
        try:
            parsed = table.parse(q.text)
        except CommandError as e:
            return q.where() + str(e)
        in_block = parsed is not None and parsed[0].name == "commands"
    return None


def _quote(path: str) -> str:
    import shlex
    return shlex.quote(path)
