"""Text for ``nndb check-trace``: the findings in the live run's lines, then
one line for the rules a trace cannot serve, one for the steps the live rules
never saw, and a summary (``--json`` prints OfflineResult.to_dict() instead)."""
from __future__ import annotations

from ..rules.offline import NEEDS
from ..safetext import printable


def finding_line(f) -> str:
    """The line a live run prints for a finding (nndb.debugger.stoppoints)."""
    return f"nndb: {f.severity}: {f.rule} at step {f.step}: {f.message}"


def text(result) -> str:
    lines = [finding_line(f) for f in result.findings]
    lines += [f"nndb: {e}" for e in result.errors]
    if result.skipped:
        by_need: dict = {}
        for s in result.skipped:
            by_need.setdefault(s.need, []).append(s.rule)
        lines.append("nndb: not run on a trace: " + "; ".join(
            f"{', '.join(ids)} ({NEEDS[need]})" for need, ids in by_need.items()))
    if result.unchecked:
        lines.append("nndb: not checked, as in the live run: " + "; ".join(
            f"step {step} ({why})" for step, why in result.unchecked))
    n = len(result.findings)
    lines.append(f"nndb: {result.trace}: {result.steps_checked} step(s) checked with {len(result.rules_run)} "
                 f"rule(s): {n} finding{'' if n == 1 else 's'}")
    return printable("\n".join(lines))      # (names and messages from a trace)
