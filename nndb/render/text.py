"""Text renderers: data in, lines out (tabulate tables)."""
from __future__ import annotations

import datetime
import math

from tabulate import tabulate


def fmt(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float):
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        if x == int(x) and abs(x) < 1e15:
            return str(int(x))
        return f"{x:.4g}"
    return str(x)


def summary(data: dict) -> str:
    m = data["meta"]
    end = data.get("end") or {}
    started = datetime.datetime.fromtimestamp(m.get("start_time", 0)).strftime("%Y-%m-%d %H:%M:%S")
    lines = [
        f"trace      {data['trace']} (schema v{data['schema_version']})",
        f"script     {m.get('script')}  argv {' '.join(m.get('argv', [])[1:]) or '-'}",
        f"started    {started} on {m.get('hostname')} (pid {m.get('pid')}, rank {m.get('rank')}/{m.get('world_size')})",
        f"versions   python {m.get('python')}, torch {m.get('torch')}, numpy {m.get('numpy')}, nndb {m.get('nndb_version')}",
        f"threads    {m.get('num_threads')} ({m.get('openmp')}), device {m.get('device')}",
    ]
    if m.get("git_commit"):
        lines.append(f"git        {m['git_commit'][:12]}{' (dirty)' if m.get('git_dirty') else ''}")
    status = data["status"]
    if end:
        status += f", exit {end.get('exit_code')}" + (f" ({end['reason']})" if end.get("reason") else "")
    else:
        status += " (the run is still writing, or was killed: data up to its last flush)"
    lines.append(f"status     {status}")
    span = "" if data["first_step"] is None else f" (steps {data['first_step']}..{data['last_step']})"
    lines.append(f"recorded   {data['steps']} step(s){span}, schedule {m.get('schedule', '?')}")
    for e in data.get("events", []):
        lines.append(f"event      step {e.get('step')}: {e.get('kind')}: {e.get('message')}")
    if data["tensors"]:
        rows = []
        for t in data["tensors"]:
            last, mn, mx = t["last"], t["min"], t["max"]
            bad = (mx.get("nan_count") or 0) + (mx.get("inf_count") or 0)
            rows.append([t["name"], t["kind"], t["rows"], fmt(last["mean"]), fmt(last["std"]),
                         fmt(last["norm"]), f"{fmt(mn['norm'])}..{fmt(mx['norm'])}",
                         fmt(last["zero_frac"]), "yes" if bad else ""])
        lines.append("")
        lines.append(tabulate(rows, headers=["tensor", "kind", "steps", "mean", "std", "norm",
                                             "norm min..max", "zero_frac", "nan/inf"],
                              disable_numparse=True))
    return "\n".join(lines)


def series(data: dict) -> str:
    kinds = [s["kind"] for s in data["series"]]
    by_step: dict = {}
    for s in data["series"]:
        for step, v in zip(s["steps"], s["values"]):
            by_step.setdefault(step, {})[s["kind"]] = v
    rows = [[step] + [fmt(by_step[step].get(k)) for k in kinds] for step in sorted(by_step)]
    headers = ["step"] + [f"{data['name']} {k} {data['stat']}" for k in kinds]
    return tabulate(rows, headers=headers, disable_numparse=True)
