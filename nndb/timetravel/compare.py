"""``predict``'s rows: a step's gradient norm, and with ``--set`` a baseline
prediction and a changed one, step by step, and the first step where they
differ."""
from __future__ import annotations

import math
from typing import Optional

from ..schema import CLIP_SERIES


def step_grad_norm(norms: list, clipped: Optional[dict] = None) -> tuple:
    """predict's Grad norm of one step from the norms of its ``grad`` series,
    [(name, norm)] (those not measured left out; a NaN one makes it NaN):
    (the gradients' norm before clipping, or None; whether the script clipped;
    why it is None, or None).
    Where the script called clip_grad_norm_, the totals it returned (several
    calls, a GAN's generator's and discriminator's: their root sum of squares,
    each over its own parameters): what the trace's ``clip_grad_norm_`` series
    holds and a Trainer logs as grad_norm; the gradients it left are at most
    max_norm by construction, and say nothing of where the run is going.
    With the gradients of the parameters no call clipped (``clipped``: clip
    series -> the names of the parameters it was given; a clip of the decoder's
    alone is the norm of those), which are as they were; a call over parameters
    an earlier call clipped already measured clipped gradients, and is left out.
    One over some of those and others too (an embedding shared by an encoder
    and a decoder, each clipped over its own parameters) mixed clipped gradients
    with the others': the calls are undone, last first, from the gradients
    recorded at the optimizer's step (after every call), each call's factor
    being its parameters' norm there over the total it returned (``_unclipped``).
    Else the parameters' gradients', the same number unclipped."""
    clips = [(n, v) for n, v in norms if n.startswith(CLIP_SERIES)]
    if not clips:
        values = [v for n, v in norms if not n.startswith(CLIP_SERIES)]
        return (_root_sum_of_squares(values) if values else None), False, \
            (None if values else "no gradient was measured")
    values, seen = [], set()
    known = clipped is not None and all(clipped.get(n) is not None for n, _ in clips)
    calls = sorted(clips, key=lambda c: _clip_order(c[0]))
    for n, v in calls:
        covers = set(clipped[n]) if known else set()
        if known and covers and covers <= seen:
            continue
        if covers & seen:
            value, why = _unclipped([(set(clipped[c]), t) for c, t in calls],
                                    {g: v for g, v in norms if not g.startswith(CLIP_SERIES)})
            return value, True, why
        seen |= covers
        values.append(v)
    if known:
        values += [v for n, v in norms if not n.startswith(CLIP_SERIES) and n not in seen]
    return _root_sum_of_squares(values), True, None


def _root_sum_of_squares(values: list) -> float:
    return math.sqrt(sum(v * v for v in values))


def _unclipped(calls: list, grads: dict) -> tuple:
    """(the gradients' norm before clipping, or None; why not) from the clip calls in
    their order, [(the names of their parameters, the total each returned)], and the
    gradients' norms after every call, {name: norm} (a parameter with no gradient: none,
    as clip_grad_norm_ skips it).  Each call, last first, scaled its parameters'
    gradients by one factor, their norm after it over the total it returned."""
    squares = {n: v * v for n, v in grads.items()}
    for covers, total in reversed(calls):
        if not math.isfinite(total):
            return abs(total), None        # (the norm before clipping was not finite)
        left = sum(squares.get(n, 0.0) for n in covers)
        if left == total * total:
            continue
        if left == 0.0:
            return None, ("clip_grad_norm_ calls overlapping on a parameter left no gradient of a call's "
                          "parameters to undo its clipping from (max_norm 0)")
        factor = total * total / left
        for n in covers:
            if n in squares:
                squares[n] *= factor
    return math.sqrt(sum(squares.values())), None


def _clip_order(name: str) -> int:
    """The call's place in its step: ``clip_grad_norm_`` 1, ``clip_grad_norm_#2`` 2."""
    _, _, k = name.partition("#")
    return int(k) if k.isdigit() else 1


def compare_predictions(base: list, changed: list) -> tuple:
    """(rows, first): one dict a step (step, loss, loss_changed, loss_delta,
    grad_norm, grad_norm_changed, findings of the changed run, clipped in
    either), and the first
    step whose loss or gradient norm differs (None if none does).  Steps are
    paired in order; the shorter prediction ends the comparison."""
    rows, first = [], None
    for a, b in zip(base, changed):
        if first is None and (_differ(a["loss"], b["loss"]) or _differ(a["grad_norm"], b["grad_norm"])):
            first = a["step"]
        rows.append({"step": a["step"], "loss": a["loss"], "loss_changed": b["loss"],
                     "loss_delta": _delta(a["loss"], b["loss"]), "grad_norm": a["grad_norm"],
                     "grad_norm_changed": b["grad_norm"], "findings": b["findings"],
                     "clipped": bool(a.get("clipped") or b.get("clipped"))})
    return rows, first


def _differ(a: Optional[float], b: Optional[float]) -> bool:
    """Do two values of a column differ?  NaN and NaN do not (they showed 'nan' and 'nan'
    and 'They first differ at step 7': NaN != NaN)."""
    return a != b and not (isinstance(a, float) and isinstance(b, float) and a != a and b != b)


def _delta(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None else b - a
