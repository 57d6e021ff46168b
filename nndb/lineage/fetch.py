"""Where a step's lineage comes from when a command asks for it: the live
op recorder, the trace, or a replay of the step (which this package cannot
drive: the caller passes it in), and which tensor a name or an expression
means in it."""
from __future__ import annotations

from typing import Callable, Optional

from ..errors import CommandError, TraceError
from .graph import StepGraph

# replay(step, resolve) -> (the step's lineage dict, {expr: tensor id or error}): a replica's
Replay = Callable[[int, tuple], tuple]


def lineage_control(s):
    """The session's LineageControl (an error if this session has none)."""
    if s.lineage is None:
        raise CommandError("lineage is not available in this session")
    return s.lineage


def recorded_lineage(s, step: int, whole: bool = True) -> Optional[dict]:
    """The lineage the trace holds for a step (flushed or not), or None;
    ``whole=False``: only whether it has one (its JSON is not read)."""
    if s.rec is None:
        return None
    try:
        with s.view.trace_reader() as reader:
            if not whole:
                return {} if step in reader.lineage_steps() else None
            data = reader.lineage(step)
    except TraceError:
        return None
    if data is not None:
        data.pop("step", None)
    return data


def step_lineage(s, step: int, replay: Replay, check: bool = False, resolve: tuple = ()) -> tuple:
    """(the step's lineage dict, {expr: tensor id or error}): live or recorded
    if it is there (and NaN/Inf-checked, with ``check``), else replayed;
    always replayed to ``resolve`` expressions, which only a replica can see."""
    lc = lineage_control(s)
    if not resolve:
        data = lc.live(step)
        if data is None:
            data = recorded_lineage(s, step)
        if data is not None and (not check or data.get("checked", True)):
            return dict(data, step=step), {}
    data, resolved = replay(step, tuple(resolve))
    return dict(data, step=step), resolved


def resolve_target(s, step: int, target: str, lineage: Callable,
                   evaluate: Optional[Callable[[str], object]]) -> tuple:
    """(StepGraph, tensor id) of ``target`` in step ``step``: a recorded name,
    else an expression's value (``evaluate``; None where there is no frame to
    evaluate it in).  ``lineage(step, resolve=())`` is step_lineage bound to
    the session and its replay."""
    try:
        data, _ = lineage(step)
        g = StepGraph(data)
        tid = g.resolve(target)
        if tid is not None:
            return g, tid
    except CommandError:
        if evaluate is None:
            raise
        g = None
    if evaluate is None:
        raise CommandError(f"no tensor named '{target}' in step {step}'s lineage")
    value = evaluate(target)
    tid = s.lineage.find(value, step) if s.lineage is not None else None
    if tid is not None and g is not None:
        return g, tid
    data, resolved = lineage(step, resolve=(target,))
    r = resolved.get(target)
    if not isinstance(r, int):
        names = ", ".join(StepGraph(data).names()[:8])
        raise CommandError(r or f"'{target}' is neither a recorded name ({names}) nor a tensor of step {step}")
    return StepGraph(data), r
