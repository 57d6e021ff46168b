"""Text for ``nndb check``: one line per check (``--json`` prints
CheckReport.to_dict() instead)."""
from __future__ import annotations

from ..text import printable


def text(report) -> str:
    ctx = report.context
    found = [f"model: {ctx['model']}" if ctx.get("model") else "no model seen",
             ("optimizer: " + ", ".join(ctx["optimizers"])) if ctx.get("optimizers") else "no optimizer stepped",
             f"loss: {ctx['loss']}" if ctx.get("loss") else "no loss function seen"]
    if ctx.get("unknown"):
        found = [ctx["unknown"]]
    lines = [f"nndb check {report.target}: {report.steps} step(s); " + ", ".join(found)]
    width = max(len(c.name) for c in report.checks)
    for c in report.checks:
        line = f"{c.status}  {c.name:<{width}}  {c.evidence}"
        if c.status == "FAIL" and c.cause:
            line += f" -- likely cause: {c.cause}"
        lines.append(line)
    counts = {s: sum(c.status == s for c in report.checks) for s in ("PASS", "FAIL", "SKIP")}
    lines.append(f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")
    return printable("\n".join(lines))      # (names and messages from the script)
