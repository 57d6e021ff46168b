"""A series drawn as a terminal chart: columns of block characters, eighths
for the top of each, the extremes on the y axis and the first and last step
under it.  Plain text (no colour, no escape sequence), so it reads the same
in a log; the REPL's ``history`` shows it under the numbers.  No plotting
library: a dozen lines of arithmetic do not need one."""
from __future__ import annotations

import math
from typing import Optional, Sequence

from ..text import fmt

EIGHTHS = " ▁▂▃▄▅▆▇█"


def _columns(steps: Sequence[int], values: Sequence[Optional[float]], width: int) -> list:
    """Per column: the mean of its steps' finite values, NaN if they are all
    NaN or Inf, None if nothing was measured there."""
    pts = [(int(s), v) for s, v in zip(steps, values) if v is not None]
    if not pts:
        return []
    first, last = pts[0][0], pts[-1][0]
    n = min(width, last - first + 1)
    buckets: list = [[] for _ in range(n)]
    for s, v in pts:
        buckets[min(n - 1, (s - first) * n // (last - first + 1))].append(float(v))
    out = []
    for b in buckets:
        finite = [x for x in b if math.isfinite(x)]
        out.append(sum(finite) / len(finite) if finite else (math.nan if b else None))
    return out


def chart(steps: Sequence[int], values: Sequence[Optional[float]], height: int = 8, width: int = 60) -> list:
    """Lines of a bar chart of ``values`` (None: not measured, left blank;
    NaN or Inf: ``!`` on the top row) over ``steps``; [] with nothing to draw."""
    cols = _columns(steps, values, width)
    finite = [c for c in cols if c is not None and math.isfinite(c)]
    if not finite:
        return []
    lo, hi = min(finite), max(finite)
    log = lo > 0 and hi / lo > 1e3
    scale = (lambda x: math.log10(x)) if log else (lambda x: x)
    base, top = scale(lo), scale(hi)
    span = top - base
    # a column's height in eighths of a row: 1 (the least, still seen) to height * 8
    levels = [None if c is None else -1 if not math.isfinite(c)
              else (height * 8 if span == 0 else 1 + round((scale(c) - base) / span * (height * 8 - 1)))
              for c in cols]
    labels = [fmt(hi), fmt(lo)]
    pad = max(map(len, labels))
    lines = []
    for row in range(height - 1, -1, -1):
        cells = []
        for lv in levels:
            if lv is None:
                cells.append(" ")
            elif lv < 0:
                cells.append("!" if row == height - 1 else " ")
            else:
                cells.append(EIGHTHS[max(0, min(8, lv - row * 8))])
        label = labels[0] if row == height - 1 else labels[1] if row == 0 else ""
        lines.append(f"{label:>{pad}} │{''.join(cells)}")
    first = str(int([s for s, v in zip(steps, values) if v is not None][0]))
    last = str(int([s for s, v in zip(steps, values) if v is not None][-1]))
    axis = " " * pad + " └" + "─" * len(cols)
    under = " " * (pad + 2) + first + " " * max(1, len(cols) - len(first) - len(last)) + last
    return lines + [axis, under + ("  (step; log scale)" if log else "  (step)")]
