"""What passes between the live run and a replica when the terminal changes
hands: the breakpoints, watchpoints and displays (gdb does not roll them
back: one set through the past is still set in the present), the commands
still queued (``-x`` files, ``-e``), a scripted front end's unread lines, and
the list of timelines.  Plain JSON-able data, never pickled objects."""
from __future__ import annotations

import dataclasses

from ..debugger import evaluate as E
from ..debugger import points as P
from ..debugger.session import QueuedLine

_POINT_TYPES = {cls.__name__: cls for cls in (P.StepBreak, P.ModuleBreak, P.ExprBreak, P.Watch, P.CatchPoint)}


def _point(p) -> dict:
    d = dataclasses.asdict(p)
    d["type"] = type(p).__name__
    return d


def export_state(s) -> dict:
    fe = s.frontend
    return {
        "points": [_point(p) for p in s.points.values() if type(p).__name__ in _POINT_TYPES],
        "next_number": s._next_number,
        "displays": [[n, src] for n, src, _ in s.displays],
        "next_display": s._next_display,
        "queue": [[q.text, q.source, q.line] for q in s.queue],
        "last_command": s.last_command,
        "lines": list(fe.lines) if isinstance(getattr(fe, "lines", None), list) else None,
        "answers": list(fe.answers) if isinstance(getattr(fe, "answers", None), list) else None,
        "timelines": s.machine.timelines if s.machine is not None else [],
    }


def import_state(s, state: dict) -> None:
    points = {}
    for d in state.get("points", []):
        d = dict(d)
        cls = _POINT_TYPES.get(d.pop("type", ""))
        if cls is None:
            continue
        points[d["number"]] = cls(**d)
    s.points = points
    s._next_number = max(s._next_number, int(state.get("next_number", 1)))
    s.displays = []
    for n, src in state.get("displays", []):
        try:
            s.displays.append((n, src, E.compile_expr(src)))
        except Exception:
            pass
    s._next_display = max(s._next_display, int(state.get("next_display", 1)))
    s.queue.clear()
    s.queue.extend(QueuedLine(t, src, line) for t, src, line in state.get("queue", []))
    s.last_command = state.get("last_command")
    fe = s.frontend
    if state.get("lines") is not None and isinstance(getattr(fe, "lines", None), list):
        fe.lines[:] = state["lines"]
    if state.get("answers") is not None and isinstance(getattr(fe, "answers", None), list):
        fe.answers[:] = state["answers"]
    if s.machine is not None and state.get("timelines"):
        s.machine.timelines = state["timelines"]
    s.sync_hooks()
