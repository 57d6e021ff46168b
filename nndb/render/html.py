"""HTML renderers for notebooks (``_repr_html_`` of nndb.api's objects): data
in, HTML out.  A trace is untrusted input: every string that came from it
(names, messages, the script's path) is escaped here, and numbers are
formatted by nndb.text, never interpolated raw."""
from __future__ import annotations

from html import escape

from ..text import fmt

# Tables longer than this show their first rows and say how many were left out.
MAX_ROWS = 50


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return escape(fmt(value))
    return escape(str(value))


def table(headers: list, rows: list, max_rows: int = MAX_ROWS) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>" for row in rows[:max_rows])
    more = f"<p>({len(rows) - max_rows} more rows not shown)</p>" if len(rows) > max_rows else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"


def trace_summary(data: dict) -> str:
    """``Trace.summary()`` as HTML: a heading line and a table of the tensors."""
    span = "" if data["first_step"] is None else f" (steps {data['first_step']}..{data['last_step']})"
    partial = data.get("partial_steps") or []
    if partial:     # (the work after the run's last step end: no whole step)
        span += f", {'step' if len(partial) == 1 else 'steps'} {', '.join(map(str, partial))} partial"
    lines = [
        f"<b>nndb trace</b> <code>{escape(str(data['path']))}</code>",
        f"script <code>{escape(str(data['script']))}</code>",
        f"status {escape(str(data['status']))}, {data['steps']} recorded step(s){span}, "
        f"{data['findings']} finding(s), {data['stops']} stop(s)"
        + (f", {data['changes']} change(s) made at the prompt" if data.get("changes") else ""),
    ]
    rows = [(t.name, t.kind, "x".join(str(n) for n in t.shape) if t.shape else None, t.module)
            for t in data["tensors"]]
    return "<div>" + "<br>".join(lines) + table(["tensor", "kind", "shape", "module"], rows) + "</div>"


def findings_table(findings: list) -> str:
    """The findings (dicts as the session report has them) as an HTML table."""
    if not findings:
        return "<p>no findings</p>"
    rows = [(f.get("step"), f.get("severity"), f.get("rule"), f.get("tensor") or f.get("module"), f.get("message"))
            for f in findings]
    return table(["step", "severity", "rule", "tensor", "message"], rows)
