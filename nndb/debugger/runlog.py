"""What the session keeps of its runs for the report and the traces' events:
how many runs it started and the current one's trace, the stops, the rule
findings, the changes made at the live run's prompt, the points whose fail
action hit, and what 'fuzz' found.

Owned by the session (``session.log``); nndb.render.report builds the
report from it, and time travel hands the changes to the replicas."""
from __future__ import annotations

from typing import Optional


class RunLog:
    """``runs``: the runs started (run N > 1 writes its own trace:
    driver.next_trace_path); ``trace_path``: the current run's trace;
    ``stops`` and ``findings``: the report's entries (dicts), also kept as
    the trace's events; ``changes``: [changes.Change], what the live run's
    prompt changed (each replay makes them again); ``failed_points``: the
    points (numbers, or a rule's id) whose fail action hit; ``fuzz_reports``:
    what each 'fuzz' found (nndb fuzz reports the last); ``at_exception``:
    the findings being added were judged as the script raised."""

    def __init__(self):
        self.runs = 0
        self.trace_path: Optional[str] = None
        self.stops: list = []
        self.findings: list = []
        self.changes: list = []
        self.failed_points: list = []
        self.fuzz_reports: list = []
        self.at_exception = False

    def add_stop(self, stop) -> list:
        """The report's entries of ``stop`` (a stoppoints.Stop): one per hit
        point, or one for the stop itself; appended and returned."""
        entries = []
        if stop.hits:
            for p, detail in stop.hits:
                pid = p.number if p.number is not None else p.rule.id     # a rule: its id
                entries.append({"step": stop.step, "reason": p.type_name, "id": pid,
                                "detail": dict(detail, what=p.what(), fail=p.fail)})
        else:
            detail = {}
            if stop.exception is not None:
                detail = {"exception": type(stop.exception).__name__, "message": str(stop.exception)}
            if stop.module:
                detail["module"] = stop.module
            entries.append({"step": stop.step, "reason": stop.kind.value, "id": None, "detail": detail})
        self.stops.extend(entries)
        return entries
