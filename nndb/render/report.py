"""The JSON report of a debugging session (``--report FILE.json``); its schema
is documented in docs/report.md and versioned by ``nndb_report``."""
from __future__ import annotations

import json
import os
import tempfile

from ..errors import UsageError
from ..text import json_value

REPORT_VERSION = 1


def build(session, script: str, argv: list, exit_code: int, reason: str, pending=()) -> dict:
    return json_value({
        "nndb_report": REPORT_VERSION,
        "script": script,
        "argv": list(argv),
        "exit": {"code": exit_code, "reason": reason},
        "steps": session.steps_done(),
        "trace": session.log.trace_path,
        "stops": session.log.stops,
        "findings": session.log.findings,
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
