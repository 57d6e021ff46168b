"""Rules over the recorded statistics alone (they would run on a trace too)."""
from __future__ import annotations

import math

import numpy as np

from .base import Rule, Threshold

KIND_ORDER = ("loss", "act", "grad", "param", "update")


class NonFinite(Rule):
    id = "nonfinite"
    severity = "error"
    explanation = "NaN or Inf in the loss, an activation, a gradient or a parameter; says where it appeared first"

    def check(self, ctx):
        # The first tensor of the step, in the order the step produced them
        # (forward: activations in call order; then loss; backward: grads;
        # the step: params and updates), that holds a NaN or an Inf.
        bad = np.flatnonzero((ctx.col("nan_count") > 0) | (ctx.col("inf_count") > 0))
        if bad.size == 0:
            return
        i = int(bad[0])
        name, kind = ctx.names[i]
        nan, inf = float(ctx.col("nan_count")[i]), float(ctx.col("inf_count")[i])
        what = " and ".join(w for w, n in (("NaN", nan), ("Inf", inf)) if n > 0)
        count = int((nan if nan > 0 else 0) + (inf if inf > 0 else 0))
        yield self.finding(ctx, f"{what} first appeared in {kind} {name} ({count} element(s))",
                           tensor=name, kind=kind, nan_count=_num(nan), inf_count=_num(inf))


def _num(x: float):
    return None if math.isnan(x) else x


RULES = [NonFinite]
