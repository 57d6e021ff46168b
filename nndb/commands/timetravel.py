"""Time travel: checkpoints, reverse execution, timelines, predict, bisect
and replay --verify.  The mechanics are nndb.timetravel's; these commands
check where the session is, pick the steps, and turn results into tables."""
from __future__ import annotations

import time

from ..errors import CommandError
from ..debugger import evaluate as E
from ..debugger.modes import State
from ..debugger.points import ModuleBreak, StepBreak, parse_int
from ..timetravel.predict import parse_request
from .control import _count, step_arg
from .table import Command, Table, no_args


def machine(s, live: bool = True):
    m = s.machine
    if m is None:
        raise CommandError("time travel is off in this run (--replica off)")
    if m.mode == "off":
        raise CommandError(m.off_message())
    if s.rec is None or (live and s.control.state is State.NONE):
        raise CommandError("The program is not being run.")
    return m


def position(s) -> tuple:
    """(the last finished step, whether we are at its end rather than inside the next)."""
    if s.last_step is None:
        raise CommandError("no step has finished yet")
    cur = s.here.stop
    return s.last_step, cur is None or cur.at_step_end


def _go(s, target: int, then: str = "stop", why: str = "") -> None:
    from ..timetravel.navigate import go_to
    go_to(s, machine(s), target, then, why)


def _reverse_step(s, n):
    step, at_end = position(s)
    target, why = step - n + (0 if at_end else 1), f"{n} step(s) back"
    # A point may hold at a step end between the two, or a module breakpoint inside a step; a replay
    # searches for it (an unconditional 'break step N' is known to hold at step N only)
    last = step - 1 if at_end else step           # (the last step end crossed)
    points = [p for p in s.points.values() if p.enabled]
    known = all(isinstance(p, StepBreak) and not p.condition for p in points)
    crossed = any(target < p.step <= last for p in points) if known else \
        last > target or any(isinstance(p, ModuleBreak) for p in points)
    if target >= 0 and crossed:
        # gdb's reverse-step N stops at a breakpoint on the way, as next N does forward (it went
        # straight to the step N back)
        m, what = machine(s), f"reverse-step {n}"
        if m.replica:
            m.hand_back(s, "rc", step=step, at_end=at_end, changed=m.changed, floor=target, what=what, why=why,
                        nth=s.ordinal())
        from ..timetravel.search import reverse_continue_target
        # (inside a step, at a module breakpoint's hit: its earlier hits in the step first, as rc)
        found = reverse_continue_target(s, m, step, at_end, floor=target, what=what, nth=s.ordinal())
        if found is not None:
            m.travel(s, *found)
            return
    _go(s, target, why=why)


def _goto(s, step):
    machine(s)
    _go(s, step, why=f"goto {step}")


_goto_arg = step_arg("goto")


def _reverse_continue(s, _):
    m = machine(s)
    step, at_end = position(s)
    if not s.points:          # (asked in the past too: a hand-back would leave it for nothing)
        raise CommandError("no breakpoints or watchpoints: nothing to go back to")
    if m.replica:
        m.hand_back(s, "rc", step=step, at_end=at_end, changed=m.changed, nth=s.ordinal())
    from ..timetravel.search import reverse_continue_target
    # (inside a step, at a module breakpoint's hit: its earlier hits in the step first)
    target = reverse_continue_target(s, m, step, at_end, nth=s.ordinal())
    if target is None:
        from ..timetravel.search import unsearched
        s.message(f"No earlier step where a breakpoint or watchpoint held{unsearched(s, m)}.")
        return
    m.travel(s, *target)


def _present(s, _):
    m = machine(s)
    if not m.replica:
        raise CommandError("already in the present (the live run)")
    m.hand_back(s, "present")


def _timelines(s, _):
    m = machine(s, live=False)
    rows = []
    for t in m.timelines:
        status = t.get("status", "")
        if t["id"] == m.timeline and m.replica:
            status = "here" + (f", at step {s.last_step}" if s.last_step is not None else "")
        elif t["id"] == 0:
            status = "present" + ("" if m.replica else ", here") + \
                (f", at step {s.last_step}" if not m.replica and s.last_step is not None else "")
        rows.append((t["id"], t["origin"], t.get("change") or "-", status))
    return Table(("Timeline", "From", "Change", "Status"), rows)


def _checkpoint(s, _):
    m = machine(s)
    if m.replica:
        raise CommandError("checkpoints are taken on the live run ('present' returns to it)")
    if s.control.state is not State.LIVE or s.here.stop is None or not s.here.stop.at_step_end:
        raise CommandError("a checkpoint is taken at a step end: use 'finish' or 'next' first")
    ck = m.take(s, s.last_step, "manual")
    if ck == "replica":
        stop = s.replica.arrived(s, s.here.stop)
        if stop is None:
            s.set_continue()
        else:
            from ..render import debug as render
            s.here.stop = stop
            s.message(render.stop_line(s, stop))
        return None
    if ck is None and m.blocked:
        raise CommandError(f"no checkpoint: {m.blocked}")
    if ck is None:
        return None                 # (over --checkpoint-memory: dropped at once, and said why)
    return f"Checkpoint {ck.number} at the end of step {ck.step} ({ck.cost_s * 1000:.1f} ms)."


def info_checkpoints(s):
    m = machine(s, live=False)
    if m.replica:
        return "Checkpoints belong to the live run: 'present', then 'info checkpoints' there."
    from ..timetravel.inventory import checkpoint_inventory, total_private_kib
    infos = checkpoint_inventory(m)
    total = total_private_kib(infos)
    rows = [(i.number, i.step, i.kind, i.pid, f"{i.cost_s * 1000:.1f} ms", _mib(i.private_kib), _mib(i.pss_kib))
            for i in infos]
    st = m.step_time()
    lines = [f"Policy: {m.policy.describe()}; {m.disk_schedule.describe()}."]
    if m.blocked:
        lines.append(f"Fork checkpoints are off: {m.blocked}.")
    lines.append(f"Replays: {'exact' if m.exact else 'NOT exact'} ({m.exact_why or m.mode}).")
    if rows:
        lines.append(f"Memory of the checkpoints: {total / 1024:.1f} MiB private in all"
                     + (f"; median step {st * 1000:.1f} ms." if st else "."))
    warning = m.broken_promise(s.last_step)
    if warning:
        lines.append(warning)
    if m.memory_kib:
        lines.append(f"Memory budget: {m.memory_kib / 1024:.0f} MiB (--checkpoint-memory)"
                     + (f"; {m.evicted_for_memory} checkpoint(s) dropped to keep it." if m.evicted_for_memory else "."))
    for step, path in m.disk_files:
        lines.append(f"On disk: step {step}: {path}")
    return [Table(("Num", "Step", "Kind", "Pid", "Fork", "Private", "PSS"), rows,
                  empty="No checkpoints."), *lines]


def _mib(kib) -> str:
    return "?" if kib is None else f"{kib / 1024:.1f} MiB"


def _predict(s, request):
    m = machine(s)
    if s.control.state is not State.LIVE:
        raise CommandError("predict runs ahead of a live run")
    from ..timetravel.predict import predict
    from ..timetravel.settings import changes_for
    n = request.steps
    changes = changes_for(s, request.sets)
    t0 = time.perf_counter()
    base = predict(s, m, n, [])
    if base.error:
        raise CommandError(base.error)
    changed = predict(s, m, n, changes) if changes else None
    if changed is not None and changed.error:
        raise CommandError(changed.error)
    took = time.perf_counter() - t0
    out = render_prediction(n, [f"set {c.setting.key} {c.setting.value}" for c in changes], base, changed, took)
    for c in changes:
        out.insert(0, f"--set {c.setting.label} is: {c.line}")       # exactly what the replica changes
    for c in changes:
        # (a schedule of the script's own, param_group['lr'] = ... at each step, sets it back
        # before the replica's next step: the prediction is the unchanged run's)
        if getattr(c.edit, "hold", None) is False and changed is not None and \
                any(note.startswith(f"{c.setting.label} did not hold") for note in changed.undone):
            out.append(f"  (the script or a scheduler sets {c.edit.key} before each step: '{c.line} --hold' "
                       f"here, then 'predict {n}', predicts with it held; 'unset {c.edit.key}' lets go of it)")
    return out


def render_prediction(n, sets, base, changed, took):
    """A prediction as predict shows it (one process, or one rank of a job):
    ``base`` and ``changed`` (None without --set) are
    nndb.timetravel.predict.Prediction; ``sets``: the changes as 'set KEY VALUE'."""
    def f(x):
        return "-" if x is None else f"{x:.6g}"
    out = []
    # (the norm before clipping: where the script clipped, clip_grad_norm_'s totals; the header says so)
    clipped = any(r.get("clipped") for r in base.rows + (changed.rows if changed is not None else []))
    gn = "Grad norm before clipping" if clipped else "Grad norm"
    if changed is None:
        rows = [(r["step"], f(r["loss"]), f(r["grad_norm"]), ", ".join(r["findings"]) or "-")
                for r in base.rows]
        out.append(Table(("Step", "Loss", gn, "Findings"), rows,
                         title=f"Predicted {len(rows)} step(s) ahead on a replica ({took:.2f} s); "
                               "the live run is unchanged:", empty="No step finished."))
    else:
        from ..timetravel.compare import compare_predictions
        label = ", ".join(x[4:] for x in sets)
        pairs, first = compare_predictions(base.rows, changed.rows)
        rows = [(r["step"], f(r["loss"]), f(r["loss_changed"]), f(r["loss_delta"]), f(r["grad_norm"]),
                 f(r["grad_norm_changed"]), ", ".join(r["findings"]) or "-") for r in pairs]
        out.append(Table(("Step", "Loss", f"Loss ({label})", "Δ loss", gn, f"{gn} ({label})",
                          f"Findings ({label})"), rows,
                         title=f"Predicted {len(rows)} step(s): baseline and {label} on replicas "
                               f"({took:.2f} s); the live run is unchanged:", empty="No step finished."))
        out.append(f"They first differ at step {first}." if first is not None
                   else f"No difference in {len(rows)} step(s).")
    missing = {}
    for r in base.rows + (changed.rows if changed is not None else []):
        if r["grad_norm"] is None and r.get("grad_norm_missing"):
            missing.setdefault(r["grad_norm_missing"], []).append(r["step"])
    for why, steps in missing.items():
        out.append(f"{gn} '-' at step {', '.join(str(x) for x in sorted(set(steps)))}: {why}.")
    for name, res in (("", base), (" (changed)", changed)):
        if res is None:
            continue
        if res.stopped:
            out.append(f"The prediction{name} stopped: {res.stopped}.")
        if res.ended:
            out.append(f"The prediction{name} ended early: {res.ended}.")
    for note in base.live_undone:
        out.append(f"Warning: in the prediction, {note}.")
    for note in changed.undone if changed is not None else []:
        out.append(f"Warning: the change {note}.")
    return out


def _bisect(s, expr):
    if not expr:
        raise CommandError("bisect needs an expression, e.g. bisect $loss > 10")
    E.compile_expr(expr)
    m = machine(s)
    from ..timetravel.search import bisect
    return bisect(s, m, expr)


def _replay_arg(text):
    words = text.split()
    if not words or words[0] != "--verify":
        raise CommandError("replay needs --verify", "replay --verify [A:B]")
    if len(words) > 2:
        raise CommandError(f"unexpected '{' '.join(words[2:])}'")
    if len(words) == 1:
        return None
    a, sep, b = words[1].partition(":")
    if not sep:
        raise CommandError(f"'{words[1]}' is not a range A:B")
    lo = parse_int(a, "the first step") if a else None
    hi = parse_int(b, "the last step") if b else None
    if lo is not None and hi is not None and hi <= lo:
        raise CommandError(f"the range {words[1]} is empty")
    return lo, hi


def _replay(s, rng):
    m = machine(s)
    from ..timetravel.search import verify
    return verify(s, m, rng)


COMMANDS = [
    Command("reverse-step", "reverse-step [N]", """Go back N training steps (default 1), to the end of that step.
A breakpoint or watchpoint that held on the way stops it there (gdb's
reverse-step N; 'rs' again goes on).
A replica is resumed from the nearest checkpoint and replayed silently; the
tensors, the script's frame and its variables are as they were then.
'continue' and 'next' replay forward from there; 'present' returns.""",
            _reverse_step, _count, aliases=("rs",), group="time travel"),
    Command("reverse-next", "reverse-next [N]", "Go back N training steps (as reverse-step: steps are the unit).",
            _reverse_step, _count, aliases=("rn",), group="time travel"),
    Command("reverse-continue", "reverse-continue", """Go back to the last earlier step where a breakpoint or watchpoint held.
It is found by replaying from the checkpoints, newest first.""",
            _reverse_continue, no_args, aliases=("rc",), group="time travel"),
    Command("goto", "goto STEP", """Go to the end of a recorded step (back in time, or forward on this timeline).
Forward in the past it runs as 'until STEP' does (a breakpoint on the way stops it),
up to the present; past it only on a timeline that was changed.""",
            _goto, _goto_arg, group="time travel"),
    Command("present", "present", "Leave the past: back to the live run, where it was stopped.",
            _present, no_args, group="time travel"),
    Command("timelines", "timelines", """List the timelines: the live run (0) and those made by changing the past.
A timeline starts when 'set' or 'py' changes something on a replica in the past.""",
            _timelines, no_args, group="time travel"),
    Command("checkpoint", "checkpoint", "Take a checkpoint of the live run now (at a step end).",
            _checkpoint, no_args, group="time travel"),
    Command("predict", "predict [N] [--set KEY=VALUE ...]", """Run N steps (default 1) ahead on a replica: loss, gradient norm, findings.
The gradient norm is before clipping: where the script calls clip_grad_norm_,
the total it returns (the trace's clip_grad_norm_ series, a Trainer's logged
grad_norm), with the gradients of the parameters it did not clip, and the
column says so.  Breakpoints, watchpoints and rules are
active there.  With --set (e.g. --set lr=1e-4), a changed replica and an
unchanged one run side by side, and the first step where they differ is
shown.  The live run is never changed.""",
            _predict, parse_request, args=("sub:--set",), group="time travel"),
    Command("bisect", "bisect EXPR", """Find the first step at which EXPR became true.
EXPR is evaluated at step ends ($loss, $grad, the script's variables): a binary
search over the checkpoints, then one replay of the bracket found.""",
            _bisect, args=("expr",), group="time travel"),
    Command("replay", "replay --verify [A:B]", """Replay recorded steps A to B-1 and compare their statistics with the trace.
A:B leaves B out, as --steps does; A defaults to the first checkpoint, B to the
step after the present.  Every statistic is compared bit for bit; the first
divergence is printed; a replay that compared nothing is an error.""",
            _replay, _replay_arg, args=("sub:--verify",), group="time travel"),
]
