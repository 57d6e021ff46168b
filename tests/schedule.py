"""The order the suite's work goes out in, under pytest-xdist's ``--dist
loadgroup`` (pyproject's addopts): the slowest work first.

Two workers take units of work (a test, or every test of an ``xdist_group``)
from one queue, in its order, as they become free.  When a long unit comes
last, one worker runs it while the other has finished: the run takes that
much longer.  So conftest's collection hook hands the queue over sorted by
what each unit took in a measured run (``durations.json``, slowest first;
greedy longest-first scheduling), and keeps the tests of a module that share
a module-scoped fixture in one unit, so that the fixture is computed once
(otherwise each worker computes it again whenever it runs one of them).

xdist marks a group's tests by adding ``@GROUP`` to their node ids, by
writing ``item._nodeid``; from pytest 9.2 on, a node id is read from
``item._id`` and that write changes nothing: every test became its own unit,
and the rule matrix was computed on both workers (337 s and 254 s in one
run).  ``order`` writes the ``@GROUP`` node id itself where pytest has
``_id``.

``durations.json`` maps a test's node id to the seconds it took (setup, call
and teardown), from a run with ``--durations=0``::

    python -m pytest -q --durations=0 | tee run.txt
    python tests/schedule.py run.txt > tests/durations.json

A test that is not in it counts as ``UNKNOWN`` seconds; the file only
orders the work, so a stale one costs time, never a result.
"""
from __future__ import annotations

import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DURATIONS = os.path.join(HERE, "durations.json")
UNKNOWN = 1.0           # (the median test of the suite takes about a second)
LISTED = 0.5            # tests faster than this are left out of durations.json


def load(path: str = DURATIONS) -> dict:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def _group_of(item) -> str:
    for mark in item.iter_markers("xdist_group"):
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    return ""


def _uses_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(defs and defs[-1].scope in ("module", "package") for defs in info.name2fixturedefs.values())


def _tag(item, group: str) -> None:
    """The node id xdist's scheduler reads the group from: ``NODEID@GROUP``."""
    try:
        from _pytest.nodeid import NodeId       # (pytest >= 9.2; before it, xdist's own write works)
    except ImportError:
        return
    if hasattr(item, "_id") and not item.nodeid.endswith("@" + group):
        item._id = NodeId.parse(f"{item.nodeid}@{group}")


def order(items: list, seconds: dict, mark) -> None:
    """Sort ``items`` in place: whole units, the slowest unit first.  A test
    of a module-scoped fixture's module with no group of its own is put in
    the module's group (``mark(name)`` makes the xdist_group marker)."""
    for item in items:
        if not _group_of(item) and _uses_module_fixture(item):
            item.add_marker(mark(item.nodeid.split("::")[0]))
    unit = {}
    cost: dict = {}
    first: dict = {}
    for i, item in enumerate(items):
        u = unit[id(item)] = _group_of(item) or item.nodeid
        cost[u] = cost.get(u, 0.0) + seconds.get(item.nodeid, UNKNOWN)
        first.setdefault(u, i)
        if _group_of(item):
            _tag(item, u)
    place = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda it: (-cost[unit[id(it)]], first[unit[id(it)]], place[id(it)]))


def _without_group(nodeid: str) -> str:
    """The node id without the ``@group`` xdist adds to it (as xdist splits it)."""
    at = nodeid.rfind("@")
    return nodeid[:at] if at > nodeid.rfind("]") else nodeid


_LINE = re.compile(r"^\s*([0-9.]+)s (setup|call|teardown)\s+(\S+)\s*$")


def from_report(text: str) -> dict:
    """Seconds per node id (setup + call + teardown) from pytest's ``--durations=0`` lines."""
    out: dict = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            nodeid = _without_group(m.group(3))
            out[nodeid] = out.get(nodeid, 0.0) + float(m.group(1))
    return {k: round(v, 1) for k, v in sorted(out.items()) if v >= LISTED}


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        json.dump(from_report(fh.read()), sys.stdout, indent=0, sort_keys=True)
    sys.stdout.write("\n")
