"""Text renderers of ``nndb inspect``: data in, lines out (tabulate tables).
Numbers go through nndb.text.fmt (``-``: not measured); what came from
the trace is made safe for the terminal (nndb.text) on the way out."""
from __future__ import annotations

import datetime

from tabulate import tabulate

from ..schema import COUNT_STATS
from ..text import fmt
from ..text import printable, printable_line

__all__ = ["fmt", "summary", "series"]


# What the loss probe found the loss to be (trace records "loss_kind"), and what the rules make of it
LOSS_KINDS = {
    "policy_gradient": "a policy-gradient surrogate (it depends on actions sampled from the model's output): "
                       "loss_not_decreasing and loss_explodes do not judge it",
    "moving_target": "chases a moving target (made without gradient by the trained model or a copy of it): "
                     "loss_not_decreasing does not judge it",
}


def _change_place(c: dict) -> str:
    """Where a change made at the prompt was made (nndb.debugger.changes.Change.where)."""
    place, step = c.get("place"), c.get("step")
    return "at the start" if place == "start" else f"at the end of step {step}" if place == "end" \
        else f"inside step {step}"


def summary(data: dict) -> str:
    m = data["meta"]
    end = data.get("end") or {}
    try:
        started = datetime.datetime.fromtimestamp(m.get("start_time", 0)).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError, OverflowError, OSError):
        started = "?"
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
    partial = data.get("partial_steps") or []
    if partial:
        span += (f", step {partial[0]} partial" if len(partial) == 1 else
                 f", steps {', '.join(map(str, partial))} partial") + " (work after the run's last step end, no whole step)"
    lines.append(f"recorded   {data['steps']} step(s){span}, schedule {m.get('schedule', '?')}")
    for e in data.get("events", []):
        lines.append(printable_line(f"event      step {e.get('step')}: {e.get('kind')}: {e.get('message')}"))
    for k in data.get("loss_kinds") or ():
        lines.append(printable_line(f"loss       {LOSS_KINDS.get(k.get('kind'), k.get('kind'))} "
                                    f"({k.get('where')}, seen at step {k.get('step')})"))
    found = data.get("findings") or []
    lines.append(f"findings   {len(found) or 'none'} stored by the live run"
                 + ("" if found else " (nndb check-trace re-checks the trace offline)"))
    lines += [_finding_line(f) for f in found]
    lines += [printable_line(f"change     {c.get('line')!r} {_change_place(c)}") for c in data.get("changes") or ()]
    if data["tensors"]:
        rows = []
        for t in data["tensors"]:
            last, mn, mx = t["last"], t["min"], t["max"]
            bad = sum((d or {}).get(k) or 0 for d in (mx, t.get("partial")) for k in ("nan_count", "inf_count"))
            rows.append([printable_line(t["name"]), printable_line(t["kind"]), t["rows"], fmt(last["mean"]), fmt(last["std"]),
                         fmt(last["norm"]), f"{fmt(mn['norm'])}..{fmt(mx['norm'])}",
                         fmt(last["zero_frac"]), "yes" if bad else ""])
        lines.append("")
        lines.append(tabulate(rows, headers=["tensor", "kind", "steps", "mean", "std", "norm",
                                             "norm min..max", "zero_frac", "nan/inf"],
                              disable_numparse=True))
    return printable("\n".join(lines))


def series(data: dict) -> str:
    kinds = [s["kind"] for s in data["series"]]
    by_step: dict = {}
    for s in data["series"]:
        for step, v in zip(s["steps"], s["values"]):
            by_step.setdefault(step, {})[s["kind"]] = v
    partial = set(data.get("partial_steps") or ())
    rows = [[f"{step} (partial)" if step in partial else step] + [fmt(by_step[step].get(k)) for k in kinds]
            for step in sorted(by_step)]
    # the tensor and statistic once, above a column per kind
    title = f"{data['name']}: {data['stat']}"
    return printable(title + "\n" + tabulate(rows, headers=["step"] + kinds, disable_numparse=True))


def tensor_at(data: dict) -> str:
    from .distributions import tensor_at as render
    return render(data)


def _finding_line(f: dict, rank=None) -> str:
    who = f"rank {rank}  " if rank is not None else ""
    return printable_line(f"  {who}{f.get('severity', '?'):<8} {f.get('rule')} at step {f.get('step')}: "
                          f"{f.get('message')}")


_JOB_STATS = ("count", "mean", "std", "min", "max", "norm", "nan_count", "inf_count")


def _stat_text(stat: str, v) -> str:
    """A statistic's cell: a count whole at any size (fmt gives a large float 4 digits)."""
    return fmt(int(v)) if stat in COUNT_STATS and isinstance(v, float) and v.is_integer() else fmt(v)


def job(data: dict) -> str:
    """``nndb inspect RUNDIR`` (nndb.store.job.job_summary)."""
    lines = [f"job        {data['rundir']}: {data['world_size']} rank(s), script {data['script']}"
             + (f", job id {data['job_id']}" if data.get("job_id") else "")]
    for w in data.get("warnings", ()):
        lines.append(printable_line(f"warning    {w}"))
    rows = [[r["rank"], r["status"], r["steps"],
             ("-" if r["first_step"] is None else f"{r['first_step']}..{r['last_step']}")
             + "".join(f" ({x} partial)" for x in r.get("partial_steps") or ()),
             len(r["findings"]), printable_line(r["trace"])] for r in data["ranks"]]
    lines += ["", tabulate(rows, headers=["rank", "status", "steps", "span", "findings", "trace"],
                           disable_numparse=True)]
    lines.append("")
    cross = data.get("cross_rank_findings") or []
    if data.get("cross_rank_unjudged"):
        lines.append(printable_line(f"cross-rank rules not run: {data['cross_rank_unjudged']}"))
    else:
        lines.append(f"cross-rank findings: {len(cross) or 'none'}")
        lines += [_finding_line(f, (f.get("evidence") or {}).get("rank")) for f in cross]
    per_rank = [(r["rank"], f) for r in data["ranks"] for f in r["findings"]]
    lines.append(f"findings of the ranks' own rules: {len(per_rank) or 'none'}")
    lines += [_finding_line(f, k) for k, f in per_rank]
    if not data["tensors"]:
        return printable("\n".join(lines))
    lines.append("")
    table = []
    if data["tensors"] and "by_rank" in data["tensors"][0]:
        lines.append(f"tensors at step {data['step']} (the last whole step every rank recorded), one row per rank:")
        for t in data["tensors"]:
            for k, st in t["by_rank"].items():
                table.append([printable_line(t["name"]), t["kind"], k] + [_stat_text(c, st[c]) for c in _JOB_STATS])
        headers = ["tensor", "kind", "rank", *_JOB_STATS]
    else:
        lines.append(f"tensors at step {data['step']} (the last whole step every rank recorded), merged across ranks "
                     f"(shards and batches combined; a replicated parameter: rank {data['ranks'][0]['rank']}'s, "
                     f"'differs' where the ranks' replicas are not the same: --ranks shows each):")
        for t in data["tensors"]:
            st = t["stats"]
            table.append([printable_line(t["name"]), t["kind"], t["merge"]] + [_stat_text(c, st[c]) for c in _JOB_STATS])
        headers = ["tensor", "kind", "merged", *_JOB_STATS]
    lines.append(tabulate(table, headers=headers, disable_numparse=True))
    return printable("\n".join(lines))
