"""One picture of a trace, chosen by name (``nndb plot`` and the REPL's
``plot``): the data gathered (nndb.render.plotdata), then drawn (nndb.render.plot)."""
from __future__ import annotations

import json
import os
from typing import Optional

from ..errors import UsageError
from .plot import draw
from . import plotdata as D

MAX_REPORT_BYTES = 16 << 20


def gather(reader, what: str, kind: Optional[str] = None, stat: str = "norm", glob: Optional[str] = None,
           findings=(), stops=()):
    """The data of one picture (what: one of data.WHATS)."""
    if what == "heatmap":
        return D.heatmap(reader, kind or "grad", stat, glob, findings, stops)
    if what == "loss":
        return D.loss(reader, findings, stops)
    if what == "history":
        if not glob:
            raise UsageError("a history needs the tensor's name (--glob NAME)")
        return D.history(reader, glob, kind or "param", findings, stops)
    if what == "ratio":
        return D.ratio(reader, glob, findings, stops)
    raise UsageError(f"unknown picture {what!r}; one of: {', '.join(D.WHATS)}")


def picture(reader, what: str, kind: Optional[str] = None, stat: str = "norm", glob: Optional[str] = None,
            findings=(), stops=(), output: Optional[str] = None) -> str:
    """Draw one picture; returns the file written (by default beside the trace)."""
    data = gather(reader, what, kind, stat, glob, findings, stops)
    if output is None:
        shown_kind = {"heatmap": kind or "grad", "history": None}.get(what)
        output = D.default_name(reader.path, what, shown_kind, stat if what == "heatmap" else None, glob)
    return draw(data, output)


def stops_of_report(path: str) -> list:
    """The stops of an ``nndb run --report`` file ([{"step", "reason"}]), read as untrusted JSON."""
    try:
        if os.path.getsize(path) > MAX_REPORT_BYTES:
            raise UsageError(f"{path} is too large for an nndb report")
        with open(path, encoding="utf-8") as fh:
            report = json.load(fh)
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read the report {path}: {getattr(e, 'strerror', None) or e}") from None
    if not isinstance(report, dict) or "nndb_report" not in report or not isinstance(report.get("stops"), list):
        raise UsageError(f"{path} is not an nndb report")
    return [s for s in report["stops"] if isinstance(s, dict)]
