"""``predict --set``: a baseline prediction and a changed one, step by step,
and the first step where they differ."""
from __future__ import annotations

from typing import Optional


def compare_predictions(base: list, changed: list) -> tuple:
    """(rows, first): one dict a step (step, loss, loss_changed, loss_delta,
    grad_norm, grad_norm_changed, findings of the changed run), and the first
    step whose loss or gradient norm differs (None if none does).  Steps are
    paired in order; the shorter prediction ends the comparison."""
    rows, first = [], None
    for a, b in zip(base, changed):
        if first is None and (_differ(a["loss"], b["loss"]) or _differ(a["grad_norm"], b["grad_norm"])):
            first = a["step"]
        rows.append({"step": a["step"], "loss": a["loss"], "loss_changed": b["loss"],
                     "loss_delta": _delta(a["loss"], b["loss"]), "grad_norm": a["grad_norm"],
                     "grad_norm_changed": b["grad_norm"], "findings": b["findings"]})
    return rows, first


def _differ(a: Optional[float], b: Optional[float]) -> bool:
    """Do two values of a column differ?  NaN and NaN do not (they showed 'nan' and 'nan'
    and 'They first differ at step 7': NaN != NaN)."""
    return a != b and not (isinstance(a, float) and isinstance(b, float) and a != a and b != b)


def _delta(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None else b - a
