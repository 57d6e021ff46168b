"""Text renderers for the debugger: command results and stop lines."""
from __future__ import annotations

import linecache
import os

from tabulate import tabulate

from .table import Table
from ..text import fmt, fmt_apart
from ..schema import series_label


def render(result) -> str:
    if result is None:
        return ""
    if isinstance(result, str):
        return result
    if isinstance(result, Table):
        if not result.rows:
            return result.empty
        rows = [[fmt(c) for c in r] for r in result.rows]
        body = tabulate(rows, headers=list(result.headers), tablefmt="plain",
                        disable_numparse=True) if any(result.headers) else \
            tabulate(rows, tablefmt="plain", disable_numparse=True)
        return (result.title + "\n" if result.title else "") + body
    if isinstance(result, (list, tuple)):
        return "\n".join(render(r) for r in result)
    return str(result)


def _loss(session) -> str:
    """The step's loss ("loss 0.6937"); with one per optimizer each by its
    name, ``$loss``'s first ("loss/optimizerD 1.387, loss/optimizerG 0.6935")."""
    if session.view.unrecorded_step():
        return "not recorded (--every, --steps)"
    losses = session.view.losses()
    return ", ".join(f"{name} {fmt(v)}" for name, v in losses) if losses else "no loss recorded"


def _where(session) -> str:
    if not session.here.frames:
        return ""
    frame, lineno = session.here.frames[session.here.frame_index]
    code = frame.f_code
    src = linecache.getline(code.co_filename, lineno, frame.f_globals).strip()
    name = os.path.relpath(code.co_filename) if not code.co_filename.startswith("<") else code.co_filename
    return f"\n> {name}({lineno}){code.co_name}()\n-> {src}"


def _hit(point, detail: dict) -> str:
    if point.type_name == "rule":
        f = point.finding
        return f"Rule {f.rule} ({f.severity}" + (", fail" if point.fail else "") + f"): {f.message}"
    label = "Temporary breakpoint" if point.temporary else point.type_name.capitalize()
    head = f"{label} {point.number}"
    if "error" in detail:
        return f"{head} ({point.what()}): error: {detail['error']}"
    if point.type_name == "watchpoint":
        v = detail.get("value")
        value, threshold = fmt_apart(v, detail["threshold"]) if "op" in detail else (fmt(v), None)
        s = f"{head}: {series_label(detail['tensor'], detail['kind'])} {detail['stat']} = {value}"
        if "op" in detail:
            s += f" ({detail['op']} {threshold})"
        elif detail.get("baseline") is not None:
            sm, base = detail["smoothed"], detail["baseline"]
            s += f" (smoothed {fmt(sm)}, baseline {fmt(base)}, x{fmt(abs(sm / base))})"
        if point.consecutive > 1:
            s += f" for {point.consecutive} steps in a row"
        s += f" at step {detail.get('step')}"
        if detail.get("also"):
            s += f" (also: {', '.join(detail['also'])})"
        return s
    if point.type_name == "catchpoint":
        return catch_line(head, point, detail)
    if point.type_name == "breakpoint" and "module" in detail:
        return f"{head}, module {detail['module']} {detail['phase']}"
    return f"{head}, {point.what()}"


def _at(d: dict) -> str:
    parts = [f"module {d['module']}" if d.get("module") else "", d.get("node") or "",
             f"{os.path.relpath(d['file'])}:{d['line']}" if d.get("file") else ""]
    return ", ".join(p for p in parts if p)


def catch_line(head: str, point, d: dict) -> str:
    what = "NaN" if d.get("nan") else "Inf"
    if "unlocated" in d:
        series = ", ".join(d["series"]) + (f" and {d['more_series']} more" if d.get("more_series") else "")
        return (f"{head} ({point.what()}): step {d['step']} made {what} ({series}), but the operation could "
                f"not be located: {d['unlocated']}\n  ('catch {point.what_kind} --eager' checks every "
                f"operation as the run goes)") + unseen_note(point, d)
    if d.get("entered") is not None:
        whose = d.get("label") or "made by no operation of the step: the batch, or a tensor kept from before it"
        if not d.get("label") and d.get("phase") == "backward" and not d.get("node"):
            # (outside autograd's nodes in a backward: DDP's reducer copying the all-reduced gradient
            # buckets back, where another rank's NaN comes in)
            whose += ", or one a collective filled: DDP's all-reduce of the ranks' gradients"
        s = (f"{head} ({point.what()}): {what} came into step {d['step']} in input {d['entered']} of {d['op']} "
             f"({whose}), in the {d['phase']} pass ({_at(d)})")
    else:
        s = f"{head} ({point.what()}): {d['op']} made {what} in the {d['phase']} pass of step {d['step']} ({_at(d)})"
    s += _inputs(d)
    v = d.get("via")
    if v and v.get("step", d["step"]) != d["step"]:
        s += (f"\n  the run's first Inf; then, in step {v['step']}, {v['op']} turned Inf into NaN "
              f"({v['phase']}, {_at(v)})")
    elif v:
        s += f"\n  then {v['op']} turned it into NaN ({v['phase']}, {_at(v)})"
    if v:
        s += _inputs(v)
    return s + unseen_note(point, d)


def _inputs(d: dict) -> str:
    """The lines of an operation's inputs at a catch stop, each with its name and, for one
    that held NaN/Inf, where those values began (ops.StepLineage.provenance)."""
    s = ""
    for i, x in enumerate(d.get("inputs") or ()):
        stats = ", ".join(f"{k} {fmt(x[k])}" for k in ("min", "max", "mean", "nan", "inf") if k in x)
        notes = [x["label"]] if x.get("label") else []
        what = x.get("held") or ("NaN" if x.get("nan") and not x.get("inf") else "Inf" if not x.get("nan")
                                 else "NaN/Inf")
        if isinstance(x.get("from"), dict):
            f = x["from"]
            notes.append(f"its {what} made by {f['op']} in the {f['phase']} pass, {_at(f)}")
        elif x.get("came_in") is not None and x.get("came_in") == x.get("label"):
            notes.append(f"{what} when the step began")
        elif x.get("came_in") is not None:
            notes.append(f"its {what} came into the step in {x['came_in'] or 'a tensor no operation made'}")
        if x.get("written"):
            notes.append("after the operation wrote it in place")
        s += f"\n  input {i} of {d['op']}: {x['dtype']} {tuple(x['shape'])}" + (f": {stats}" if stats else "") \
            + (f" ({'; '.join(notes)})" if notes else "")
    for name, value in d.get("numbers") or ():
        s += f"\n  {name} of {d['op']}: the number {fmt(value)}"
    return s


def unseen_note(point, d: dict) -> str:
    """A step-end catch after steps that were not recorded: nothing looked at them."""
    u = d.get("unseen")
    if not u:
        return ""
    a, b = u["first"], u["last"]
    steps = f"step {a}" if a == b else f"steps {a}-{b}"
    look = f"'goto {a - 1}' then 'continue' checks them operation by operation" if a > 0 else \
        f"'catch {point.what_kind} --eager' then 'run' checks every operation"
    return (f"\n  ({steps} before it {'was' if a == b else 'were'} not recorded ({u['flag']}) and not looked at: "
            f"a NaN or Inf made there is found first at step {d['step']}; {look})")


def _short_of_goto(session, stop) -> str:
    """A point that stopped a 'goto' forward in the past on its way (it runs as 'until'
    does): the line says so, and where the session is (the hit's line alone did not)."""
    target = getattr(session.replica, "forward_goto", None)
    if target is None or stop.step is None or stop.step > target or (stop.step == target and stop.at_step_end):
        return ""
    m = session.machine
    where = "in the past" if m is None else f"on timeline {m.timeline}" if m.changed else \
        f"in the past (timeline {m.timeline})"
    return f"\n  ({where}: 'goto {target}' stopped on the way, short of step {target}; 'goto {target}' again goes on)"


def _late_note(session, stop) -> str:
    """A step end the live run came to after the fact (Session.closed_late): another
    optimizer took the steps over, or the first of several optimizers stepped again."""
    why = session.closed_late(stop.step) if stop.at_step_end else None
    if why is None:
        return ""
    n = stop.step
    cause, after = {
        "handover": ("another optimizer took the steps over", f"; 'goto {n}' shows step {n}'s own end"),
        "repeat": ("an optimizer that stepped in it stepped again (no step holds two steps of one optimizer)",
                   f"; 'goto {n}' shows step {n}'s own end"),
        "newcomer": ("its closing optimizer stepped again after another's first step, which it holds (nndb waits "
                     "a step to see whether that one steps in every iteration)", f"; 'goto {n}' shows step {n}'s own end"),
    }.get(why, ("the first optimizer stepped again (so nndb learns which optimizers make a step)", ""))
    if why == "join":
        return (f"\n  (step {n} holds alone the first step of an optimizer that joined the iteration after step "
                f"{n - 1}, the iteration's step, had closed (a closed step is not reopened); it was closed after the "
                f"fact, as that optimizer stepped again: the run is in step {n + 1}, in that optimizer's step, its "
                f"variables and .grad step {n + 1}'s; 'goto {n}' shows step {n}'s own end)")
    return (f"\n  (step {n} was closed after the fact, as {cause}: the run is in step {n + 1}'s first "
            f"optimizer step, its variables and .grad step {n + 1}'s{after})")


def stop_line(session, stop) -> str:
    where = _late_note(session, stop) + _where(session)
    if stop.kind == "exception":
        return f"Post-mortem: {type(stop.exception).__name__}: {stop.exception}{where}"
    if stop.at_step_end:
        at = f"step {stop.step} finished, {_loss(session)}"
    else:
        at = f"step {stop.step}, module {stop.module} {stop.phase}"
    if stop.hits:
        lines = [_hit(p, d) for p, d in stop.hits if not p.silent]
        where = _short_of_goto(session, stop) + where
        if len(lines) == 1 and not stop.at_step_end and stop.module:
            # (on the hit's first line, unless it names the step: after a catch's last input
            # line, "other of mul: the number 0 (step 1)" read as the number's)
            head, nl, rest = lines[0].partition("\n")
            step = "" if f"step {stop.step} " in head else f" (step {stop.step})"
            return f"{head}{step}{nl}{rest}{where}"
        if len(lines) == 1 and stop.at_step_end and lines[0].endswith(f"step {stop.step}") \
                and "Watchpoint" not in lines[0]:
            return f"{lines[0]} finished, {_loss(session)}{where}"
        replayed = [d.get("via", {}).get("step", d["step"])
                    for _, d in stop.hits if d.get("located") == "replay"]
        if replayed and stop.at_step_end:
            k = replayed[0]
            back = f"'goto {k - 1}' then 'continue' stops inside the operation" if k > 0 else \
                "'catch --eager' then 'run' stops inside the operation"
            at += f"; found by a replay of step {k} with every operation checked: {back}"
        return "\n".join(lines) + f"\n  ({at}){where}"
    if stop.kind == "start":
        what = f"module {stop.module} is about to run its forward" if stop.module else f"step {stop.step} finished"
        return f"Stopped at the start of the run ({what}); 'continue' runs it, 'help' lists the commands{where}"
    if stop.kind == "interrupt":
        return f"Interrupted: {at}{where}"
    if stop.kind == "set_trace":
        return f"Stopped at nndb.set_trace() during step {stop.step}{where}"
    if stop.kind == "past":
        m = session.machine
        tl = f"timeline {m.timeline}" if m is not None else "the past"
        return f"In the past ({tl}): {at} ({stop.note}){where}"
    m = session.machine
    if m is not None and m.where(session) == "past":   # (run on in the recorded past: next, goto to a later step;
        # a timeline changed at the prompt is one of its own, "(nndb t1)", no past)
        return f"In the past (timeline {m.timeline}): {at}{where}"
    return f"{at[0].upper()}{at[1:]}{where}"
