"""How a command line names ranks: the ``--ranks all|LIST`` option of the
queries that take it (``print``, ``stats``, ``where``, ``list``:
Command.ranks == "option") and the trailing ``rank N`` of the points
(Command.ranks == "suffix"); ``rank [N]`` itself is nndb.commands.ranks.

At the prompt of ``nndb run --nproc-per-node N`` the job's console
(nndb.distributed.console) carries these out across the ranks before a rank's
session sees the line, with the same syntax (``split_ranks``).  What reaches
one session is one process's view: a single process is rank 0 of 1, and a
rank under plain torchrun (batch mode) sees only itself; both say so
plainly rather than pretend to show other ranks.
"""
from __future__ import annotations

import os

import re
from dataclasses import dataclass
from typing import Any, Optional

from ..run.rank import place
from ..errors import CommandError

_OPTION = re.compile(r"(?:^|\s)--ranks(?:\s*=\s*|\s+)(\S+)")
_SUFFIX = re.compile(r"(?:^|\s+)rank\s+(\d+)\s*$")


def split_ranks(text: str) -> tuple[Optional[str], str]:
    """'--ranks all x.sum()' -> ('all', 'x.sum()'); no option: (None, text)."""
    m = _OPTION.search(text)
    if m is None:
        if re.search(r"(?:^|\s)--ranks\s*$", text):
            raise CommandError("--ranks takes all or a list of ranks (0,1)")
        return None, text
    return m.group(1), (text[:m.start()] + " " + text[m.end():]).strip()


def split_suffix(text: str) -> tuple[Optional[str], str]:
    """'loss > 0.7 rank 1' -> ('1', 'loss > 0.7'); no suffix: (None, text)."""
    m = _SUFFIX.search(text)
    if m is None:
        return None, text
    return m.group(1), text[:m.start()].strip()


def chosen(spec: str, ranks: list) -> list:
    """The ranks ``spec`` names among ``ranks`` (CommandError: a bad spec or a rank not there)."""
    if spec == "all":
        return list(ranks)
    try:
        wanted = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise CommandError(f"--ranks takes all or a list of ranks (0,1), not {spec!r}") from None
    missing = [r for r in wanted if r not in ranks]
    if missing or not wanted:
        raise CommandError(f"no rank {missing[0] if missing else spec} (ranks: {', '.join(map(str, ranks))})")
    return wanted


@dataclass(frozen=True)
class OnRanks:
    """A parsed line that carried ``--ranks SPEC``: run ``value`` on those ranks."""
    spec: str
    value: Any


def one_process() -> str:
    w = place()
    if not w.distributed:
        return "one process: rank 0 of 1"
    if any(os.environ.get(k) for k in ("NNDB_FRONT_SOCKET", "NNDB_FRONT_PUBLISH", "NNDB_FRONT_FROM_STORE")):
        # (a rank of nndb run --nproc-per-node N --batch: it was "plain torchrun", under nndb's own launcher)
        return (f"rank {w.rank} of {w.world_size}, on its own (--batch: each rank runs the -e/-x commands "
                f"by itself; without --batch, nndb run --nproc-per-node N holds one prompt for all)")
    return (f"rank {w.rank} of {w.world_size}, on its own (plain torchrun: no prompt holds the other ranks; "
            f"nndb run --nproc-per-node N holds one for all)")


def on_this_process(spec: str, batch: bool = False) -> bool:
    """``--ranks SPEC`` (or a point's ``rank N``) in one session: does the line run here?
    One process, or a prompt of a rank's own (``nndb.set_trace``): only this process's own
    rank can be meant.  A rank of a job in batch mode, where every rank runs the -e/-x
    lines by itself: those lines are the job's, so a line for other ranks is theirs (skipped
    here: it was an error on every other rank, which ended the job with exit code 2 while
    the rank named took the line), and ``--ranks all`` is each rank's own answer, each
    line said with its rank (``[r1] ``); a rank the job does not have is an error on all."""
    w = place()
    if batch and w.distributed and w.world_size > 1:
        return w.rank in chosen(spec, list(range(w.world_size)))
    try:
        chosen(spec, [w.rank])
    except CommandError as e:
        raise CommandError(f"{e}: this session is {one_process()}") from None
    if spec == "all" and w.distributed:
        raise CommandError(f"--ranks all: this session sees only {one_process()}")
    return True


