"""The bottom toolbar: the step, the last loss and why the run stopped."""
from __future__ import annotations

from ..text import fmt
from ..text import printable_line


def toolbar_text(session) -> str:
    if session is None:
        return ""
    parts = []
    m = getattr(session, "machine", None)
    where = m.where(session) if m is not None else ""
    if where:
        parts.append(f"timeline {m.timeline} (in the past)")
    cur = session.here.stop
    if session.control.state == "live" and cur is not None and not cur.at_step_end:
        parts.append(f"step {cur.step} (in progress)")
    elif session.last_step is not None:
        parts.append(f"step {session.last_step}")
    else:
        parts.append("step -")
    try:
        loss = session.view.last_loss()
    except Exception:
        loss = None
    parts.append(f"loss {fmt(loss)}")
    if cur is not None:
        why = cur.kind
        if cur.hits:
            why = ", ".join(f"{p.type_name} {p.number}" for p, _ in cur.hits)
        if cur.module:
            why += f" at {cur.module} {cur.phase}"
        parts.append(f"stopped: {why}")
    else:
        parts.append(session.control.state)
    return printable_line(" " + "  |  ".join(parts) + " ")
