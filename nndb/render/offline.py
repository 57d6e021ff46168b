"""Text for ``nndb check-trace``: the findings in the live run's lines, each
marked with who found it (``[run]``: the live run stored it in the trace;
``[check-trace]``: this re-check; both), then one line for the rules a trace
cannot serve, one for the steps the live rules never saw, and a summary
(``--json`` prints OfflineResult.to_dict() instead)."""
from __future__ import annotations

from ..rules.offline import NEEDS, RUN
from ..text import printable


def found_by(f: dict) -> str:
    """``[run]``, ``[check-trace]`` or ``[run, check-trace]``: who found a finding."""
    return f"[{', '.join(f.get('found_by', ()))}]"


def finding_line(f: dict) -> str:
    """The line a live run prints for a finding (nndb.debugger.stoppoints),
    with who found it."""
    return f"nndb: {f.get('severity')}: {f.get('rule')} at step {f.get('step')} {found_by(f)}: {f.get('message')}"


def text(result) -> str:
    merged = result.all_findings()
    lines = [finding_line(f) for f in merged]
    lines += [f"nndb: {e}" for e in result.errors]
    lines += [f"nndb: {n}" for n in result.notes]
    if result.skipped:
        by_need: dict = {}
        for s in result.skipped:
            by_need.setdefault(s.need, []).append(s.rule)
        lines.append("nndb: not run on a trace: " + "; ".join(
            f"{', '.join(ids)} ({NEEDS[need]})" for need, ids in by_need.items()))
    if result.unchecked:
        lines.append("nndb: not checked, as in the live run: " + "; ".join(
            f"step {step} ({why})" for step, why in result.unchecked))
    n, both = len(merged), sum(1 for f in merged if len(f["found_by"]) > 1)
    run = sum(1 for f in merged if f["found_by"] == [RUN])
    lines.append(f"nndb: {result.trace}: {result.steps_checked} step(s) checked with {len(result.rules_run)} "
                 f"rule(s): {n} finding{'' if n == 1 else 's'} (the run alone: {run}, this re-check alone: "
                 f"{n - run - both}, both: {both})")
    return printable("\n".join(lines))      # (names and messages from a trace)
