"""``rank [N]`` in the one command table: the rank you look at.  At the
prompt of ``nndb run --nproc-per-node N`` the job's console
(nndb.distributed.console) switches ranks before a rank's session sees the line;
what reaches one session is one process's view (nndb.commands.rankspec)."""
from __future__ import annotations

from ..run.rank import place
from ..errors import CommandError
from .rankspec import one_process
from .table import Command


def _rank_arg(text: str):
    t = text.strip()
    if not t:
        return None
    if not t.isdigit():
        raise CommandError(f"rank takes a rank number, not {t!r}")
    return int(t)


def _rank(session, n):
    w = place()
    if n is None or n == w.rank:
        return one_process()
    raise CommandError(f"no rank {n}: {one_process()}")


COMMANDS = [
    Command("rank", "rank [N]", """Show the rank you look at, or switch to rank N (several ranks).
The prompt of nndb run --nproc-per-node N is (nndb rN): print, where, stats,
list and the other queries act on rank N; continue resumes every rank.
print/stats/where/list --ranks all|LIST run on every rank (or those listed)
and show one row or block per rank.  Breakpoints, watches, display and the
rule settings apply to every rank, or to rank N alone with "rank N" at the
end (watch loss > 0.7 rank 1).  In one process: rank 0 of 1.""",
            _rank, _rank_arg, group="ranks"),
]
