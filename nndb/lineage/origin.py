"""``origin NAME``: for a parameter that became non-finite, the step whose
update introduced it, the gradient that carried it, and the operation of that
step where the badness first appeared: lineage across steps.  The trace's
statistics find the step; a replay of that step with the op recorder's
NaN/Inf checks finds the operation."""
from __future__ import annotations

import os

from ..errors import CommandError
from ..text import fmt
from ..tracer.stats import STAT_NAMES
from .graph import StepGraph
from .oprecord import FILE, LINE, MODULE, NODE, PHASE, op_name

_NORM, _NAN, _INF = (STAT_NAMES.index(k) for k in ("norm", "nan_count", "inf_count"))


def _bad(row) -> bool:
    return row is not None and ((row[_NAN] or 0) > 0 or (row[_INF] or 0) > 0)


def _series(s, name: str, kind: str) -> dict:
    steps, block = s.view.history_rows(name, kind)
    return dict(zip(steps, block))


def origin(s, name: str, get_lineage) -> list:
    params = {n for n, k in s.view.series_names() if k == "param"}
    if name not in params:
        near = sorted(p for p in params if name in p)[:6]
        raise CommandError(f"no parameter named '{name}' has been recorded"
                           + (f" (did you mean: {', '.join(near)})" if near else ""))
    rows = _series(s, name, "param")
    bad = [st for st in sorted(rows) if _bad(rows[st])]
    if not bad:
        return [f"{name} has stayed finite in all {len(rows)} recorded step(s)."]
    k = bad[0]
    row = rows[k]
    lines = [f"{name} became non-finite at step {k} (nan {int(row[_NAN])}, inf {int(row[_INF])}): "
             f"the update of step {k} introduced it."]
    before = [st for st in sorted(rows) if st < k]
    if before:
        p = rows[before[-1]]
        lines.append(f"  At step {before[-1]} it was finite (norm {fmt(p[_NORM])}).")
    grads = _series(s, name, "grad")
    g = grads.get(k)
    if g is not None and _bad(g):
        lines.append(f"  Its gradient at step {k} carried it: nan {int(g[_NAN])}, inf {int(g[_INF])}.")
    elif g is not None:
        lines.append(f"  Its gradient at step {k} was finite (norm {fmt(g[_NORM])}): the optimizer's update "
                     f"made it non-finite.")
    data = get_lineage(k, check=True)
    graph = StepGraph(data)
    # a backward operation run by the autograd node of the forward operation that made the
    # value (LogBackward0's division by the 0 the log took, MulBackward0's product with the
    # NaN the forward multiplied by) is that operation's echo, not an origin of its own
    # (``catch nan``'s answer, ops.StepLineage.maker_of)
    echoes = {int(i): int(f) for i, f in (data.get("echoes") or {}).items()}
    made = {}
    for i in data.get("nonfinite", []):
        made.setdefault(graph.ops[i][PHASE], i)
    first = {p: int(i) for p, i in data.get("first_bad", {}).items()}
    if not first:
        lines.append(f"  The replay of step {k} made no non-finite value "
                     f"(it came in from before the step, or the replay differs).")
        return lines
    b = first.get("backward")
    if b is not None:
        if b in echoes:
            how = f"the backward of {_op(graph, echoes[b], short=True)}, which made the value in the forward pass"
        elif b in data.get("nonfinite", []):
            how = "from finite inputs"
        else:
            how = "from a non-finite value that flowed in from the forward pass"
        lines.append(f"  Step {k}'s backward pass: the gradient first went bad at {_op(graph, b)} ({how}).")
    f = made.get("forward")
    if f is not None:
        lines.append(f"  Step {k}'s forward pass: the first non-finite value came from finite inputs at "
                     f"{_op(graph, f)}.")
    o = made.get("optimizer")
    if o is not None:
        lines.append(f"  Step {k}'s optimizer step: a non-finite value from finite inputs at {_op(graph, o)}.")
    return lines


def _op(graph, i: int, short: bool = False) -> str:
    op = graph.ops[i]
    if short:
        return f"{op_name(op)} (op {i})"
    f = op[FILE]
    if f and os.path.isabs(f):
        f = os.path.relpath(f)
    where = ", ".join(x for x in (f"module {op[MODULE]}" if op[MODULE] else "", op[NODE] or "",
                                  f"{f}:{op[LINE]}" if f else "") if x)
    return f"{op_name(op)} (op {i}; {where})"
