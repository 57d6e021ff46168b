"""Command files and the trust rule for ``./.nndbrc`` (gdb's auto-load safe-path).

At start nndb reads, in order: ``~/.nndbrc``; ``./.nndbrc`` if the working
directory is trusted (``nndb trust DIR`` trusts DIR and everything under it);
the ``-x FILE`` files (trusted because named); the ``-e CMD`` commands.
``--nx`` skips both rc files.  An rc file in an untrusted directory is never
read: nndb prints one line with the command that trusts it.

Trusted directories are kept in ``$XDG_CONFIG_HOME/nndb/trusted`` (default
``~/.config/nndb/trusted``): nndb.commands.trust.
"""
from __future__ import annotations

import os
import shlex
from typing import Callable, Optional

from ..errors import CommandError, UsageError
from ..debugger.session import QueuedLine
from .trust import is_trusted, trust, trust_file, trusted_dirs  # noqa: F401  (this module's API too)

RC_NAME = ".nndbrc"


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
            if is_trusted(cwd, warn=message):
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
    return shlex.quote(path)
