"""The JSON report of a debugging session (``--report FILE.json``); its schema
is documented in docs/report.md and versioned by ``nndb_report``."""
from __future__ import annotations

import json
import math
import os
import tempfile

from ..errors import UsageError

REPORT_VERSION = 1


def _clean(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (str, int, bool)) or x is None:
        return x
    if isinstance(x, float):
        return x
    try:
        return float(x)
    except (TypeError, ValueError):
        return str(x)


def build(session, script: str, argv: list, exit_code: int, reason: str, pending=()) -> dict:
    return _clean({
        "nndb_report": REPORT_VERSION,
        "script": script,
        "argv": list(argv),
        "exit": {"code": exit_code, "reason": reason},
        "steps": session.steps_done(),
        "trace": session.trace_path,
        "stops": session.stops,
        "findings": session.findings,
        "pending": [{"id": p.number, "type": p.type_name, "what": p.what(), "fail": p.fail} for p in pending],
    })


def write(path: str, data: dict) -> None:
    """Atomically: a reader never sees half a report."""
    d = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".nndb-report-", dir=d)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, path)
    except OSError as e:
        raise UsageError(f"cannot write the report {path}: {e.strerror or e}") from None
