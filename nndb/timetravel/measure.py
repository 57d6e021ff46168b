"""Histograms the trace does not have, measured on replicas: ``compare KIND
NAME --checkpoints K`` for a tensor (or a step) that was not recorded with a
histogram.

For each checkpoint at step C, a replica resumed from it runs the script on
with every statistic and every activation measured (the role
``nndb.timetravel.roles.Measure``), and the
histogram of the series is read from the first record after the
checkpoint: step C+1's, as the trace would have recorded it there (a
parameter after that step's update, a gradient before it, an activation in
that step's forward, which the parameters of checkpoint C computed).  Each
replayed step's loss is checked against the trace's as in every replay.  The
live run only waits; the replica ends after reporting.
"""
from __future__ import annotations

from ..errors import CommandError


def histograms_at(s, machine, kind: str, name: str, steps: list) -> dict:
    """{checkpoint step: {"step": the step measured, "hist": [counts]} or
    {"error": why}}: ``kind name`` measured on a replica resumed from each
    checkpoint."""
    out = {}
    for c in steps:
        goal = {"kind": "measure", "after": int(c), "target": int(c) + 1, "name": name, "series_kind": kind}
        try:
            msg = machine.replay(s, goal, int(c))
        except CommandError as e:
            out[c] = {"error": str(e).removeprefix("nndb: ")}
            continue
        out[c] = msg.get("result") or {"error": "the replica reported nothing"}
    return out
