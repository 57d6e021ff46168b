"""The relative rule of a watch with no ``OP VALUE``: the band.

The exact rule, for each watched series (values are absolute values of the
watched statistic; a value that was not measured at a step is not a value):

* the *smoothed* value at a step is the median of the series' last
  ``SMOOTH`` (3) values: one odd batch moves it not at all;
* the *baseline* starts as the median of its first ``START`` (3) values and,
  after each step is judged, follows the smoothed value slowly: its
  logarithm moves ``FOLLOW`` (1/20) of the way to the smoothed value's, so a
  steady trend (a loss converging, gradients shrinking with it) is followed
  with about 20 steps of memory, while a jump of x50 in a few steps is not;
* the condition holds when the smoothed value is outside
  [``LOW``, ``HIGH``] = [1/100, 50] times the baseline, and at any value
  that is inf (judged at once, not smoothed);
* a series whose starting baseline is numerically zero, at most
  ``ZERO`` (1e-6) times the largest value of that statistic among all the
  series of its kind at that step (the model's other gradients, for a
  gradient), is not judged against the band (a bias right before a
  BatchNorm has a gradient that is zero but for rounding); its inf values
  still hold.

A plain data object (a replica takes it over as a dict)."""
from __future__ import annotations

import math
import statistics
from typing import Optional

SMOOTH = 3
START = 3
FOLLOW = 0.05
LOW, HIGH = 0.01, 50.0
ZERO = 1e-6


def describe() -> str:
    return f"outside [{LOW:g}, {HIGH:g}] x baseline"


class Band:
    """The state of one watch's band, over the dicts the watch keeps
    (so that ``dataclasses.asdict`` carries it to a replica)."""

    def __init__(self, state: dict):
        self.s = state
        for key in ("recent", "start", "baseline"):
            state.setdefault(key, {})
        state.setdefault("zero", [])

    def judge(self, name: str, value: float, scale: float) -> Optional[dict]:
        """A measured ``value`` of series ``name`` (``scale``: the largest
        finite absolute value of that statistic in the series' kind at this
        step).  None: the condition does not hold; else the numbers that make
        it hold ({"smoothed", "baseline"}; baseline None for an inf)."""
        if math.isinf(value):
            return {"smoothed": value, "baseline": self.s["baseline"].get(name)}
        v = abs(value)
        recent = self.s["recent"].setdefault(name, [])
        recent.append(v)
        del recent[:-SMOOTH]
        if name in self.s["zero"]:
            return None
        base = self.s["baseline"].get(name)
        if base is None:
            start = self.s["start"].setdefault(name, [])
            start.append(v)
            if len(start) < START:
                return None
            base = statistics.median(start)
            del self.s["start"][name]
            if base <= ZERO * scale:
                self.s["zero"].append(name)
                self.s.setdefault("new_zero", []).append((name, base))
                return None
            self.s["baseline"][name] = base
        smoothed = statistics.median(recent)
        hit = None
        if not LOW * base <= smoothed <= HIGH * base:
            hit = {"smoothed": smoothed, "baseline": base}
        if smoothed > 0:
            self.s["baseline"][name] = math.exp(math.log(base) + FOLLOW * (math.log(smoothed) - math.log(base)))
        return hit

    def take_new_zero(self) -> list:
        """[(name, baseline)] of the series found numerically zero since the last call."""
        return self.s.pop("new_zero", [])
