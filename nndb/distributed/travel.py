"""``predict`` and ``reverse-continue`` across ranks, answered by a replica job
(nndb.distributed.replica): the live job stays stopped where it is.

Both replay the job from its start, which lands on the live job's values
only when the script is deterministic from its start (seeded; CPU and
gloo).  That is checked, not assumed: at the live job's stop step every
replica rank's loss must equal the live rank's bit for bit
(``float($loss).hex()`` on both); if one differs, nndb says the replica
drifted and gives no answer.

* ``predict [N] [--set KEY=VALUE ...]``: the replica runs to the stop step,
  is checked, takes the changes (``set`` on every rank, as predict's changed
  replica does in one process), sets the live job's points (they are active
  ahead, as in one process) and runs N steps ahead; each rank's loss,
  gradient norm and findings at those steps are read from the replica's
  traces.  With ``--set`` a second replica job runs the baseline, unchanged.
* ``reverse-continue``: the replica sets the live job's points at its start
  and runs to the stop step, noting each step where a rank stopped before
  it; the job then goes to the last of them (``goto``: every rank respawned).
"""
from __future__ import annotations

import glob
import os
import re
import time
from typing import Optional

from ..debugger.hyperparams import HELD_WARNING, NOT_HELD
from ..timetravel.compare import step_grad_norm
from ..timetravel.sandbox import read_as_now
from .replica import ReplicaJob

_LOSS = "p float($loss).hex()"
# each parameter's norm after the step's update, as the rank's record has it (the trace's too): a run
# whose loss is the same but not its model (a constant loss, a model initialised unseeded) drifted
_WEIGHTS = 'p ";".join(f"{k}={float(v.norm).hex()}" for k, v in sorted($weight.items()))'
# what of the live job's points (Console.point_lines) a replica does not set again: no output is shown
_NOT_POINTS = {"display", "undisplay"}


def point_lines(lines: list) -> list:
    from ..commands import TABLE
    from ..errors import CommandError
    out = []
    for ln in lines:
        try:
            if TABLE.lookup(ln.split(None, 1)[0]).name not in _NOT_POINTS:
                out.append(ln)
        except CommandError:
            pass
    return out


def set_points(run, targets_of, ranks: list, lines: list) -> None:
    """The live job's point lines on a job's ranks (a line may carry its
    'commands' block after newlines: typed there line by line)."""
    for line in lines:
        first, *block = line.split("\n")
        targets, text = targets_of(first, ranks)
        for r in targets:
            for typed in [text] + block:
                run.on(r, typed)


def _text(out: list) -> Optional[str]:
    """A command's output as one line, or None if it was an error."""
    if not out or any(err for _, err in out):
        return None
    return " ".join(t for t, _ in out).strip().strip("'\"")


def _show(hexa: Optional[str]) -> str:
    try:
        return repr(float.fromhex(hexa))
    except (TypeError, ValueError):
        return str(hexa)


def written_since(front, started: Optional[float]) -> str:
    """'; it reads files the run wrote since it started, as they are now: a, b' for the
    user's files (the script's directory and the working directory, one level down) changed
    since ``started``: a job started again from the start reads them (a snapshot it resumes
    from), where the run before did not; '' for none."""
    if started is None:
        return ""
    script = getattr(front.target, "file", None)
    roots = dict.fromkeys(os.path.abspath(r) for r in (os.path.dirname(script) if script else None, os.getcwd())
                          if r and os.path.isdir(r))
    own = tuple(os.path.abspath(p) for p in (front.state.run_dir, front.replica_dir) if p)
    found: list = []
    for root in roots:
        for top, dirs, files in os.walk(root):
            depth = os.path.relpath(top, root).count(os.sep) + (top != root)
            dirs[:] = [d for d in dirs if depth < 1 and not d.startswith((".", "nndb-runs")) and d != "__pycache__"
                       and not os.path.join(top, d).startswith(own)]
            for f in files:
                p = os.path.join(top, f)
                try:
                    if not f.startswith(".") and not p.startswith(own) and os.stat(p).st_mtime >= started:
                        found.append(os.path.relpath(p))
                except OSError:
                    pass
    return read_as_now(sorted(dict.fromkeys(found)))


def _since(console, back: int) -> str:
    """``written_since`` the start of the live job's ``back``-th run from the last (1: this
    one's, which a replica job started again; 2: the run before a travel's)."""
    front = getattr(console, "front", None)
    starts = getattr(front, "starts", ())
    return written_since(front, starts[-back]) if len(starts) >= back else ""


def _norms(text: Optional[str]) -> dict:
    """``_WEIGHTS``'s output (or ``trace_weights``'): parameter name -> its norm as float.hex."""
    out = {}
    for part in (text or "").split(";"):
        name, _, value = part.rpartition("=")
        if name:
            out[name] = value
    return out


def _other_weights(a: Optional[str], b: Optional[str], in_a: str, in_b: str) -> Optional[str]:
    """'NAME's norm is X IN_A and Y IN_B' for the first parameter whose norm differs between two
    ``_WEIGHTS`` outputs; None where they agree or one of them is not measured."""
    a, b = _norms(a), _norms(b)
    for name in sorted(a.keys() & b.keys()):
        if a[name] != b[name]:
            return f"{name}'s norm is {_show(a[name])} {in_a} and {_show(b[name])} {in_b}"
    return None


def drift(console, job: ReplicaJob, ranks: list, step: int) -> Optional[str]:
    """None if every replica rank's loss and parameters at ``step`` equal the live rank's bit for
    bit; else why not."""
    for r in ranks:
        live = _text(console.on(r, _LOSS))
        if live is None:
            return (f"rank {r} has no loss at step {step} to check the replica against (no backward at that "
                    f"step?): no answer")
        there = _text(job.on(r, _LOSS))
        if there != live:
            return (f"the replica job drifted: rank {r}'s loss at step {step} is {_show(there)} there and "
                    f"{_show(live)} in the live job (the script is not deterministic from its start, or the "
                    f"job was changed at a stop{_since(console, 1)}): no answer")
        other = _other_weights(_text(job.on(r, _WEIGHTS)), _text(console.on(r, _WEIGHTS)), "there",
                               "in the live job")
        if other:
            return (f"the replica job drifted: rank {r}'s parameters at step {step} are not the live job's, "
                    f"its loss the same ({other}) (the script is not "
                    f"deterministic from its start, or the job was changed at a stop{_since(console, 1)}): "
                    f"no answer")
    return None


def _failed(job: ReplicaJob, what: str) -> str:
    why = "; ".join(n for n in job.notes if n.strip())
    return f"the replica job ended {what}" + (f" ({why})" if why else "")


def hit_line(out: dict) -> Optional[str]:
    """What a point (or rule) that stopped a job said: the first stop line of a
    rank that did not stop for run control (``until``) or for another rank."""
    for r in sorted(out):
        said = [t for t, err in out[r] if not err and t.strip()]
        if said and not said[0].startswith(("Step ", "Interrupted", "Stopped at the start")):
            return f"rank {r}: {said[0].strip().splitlines()[0]}"
    return None


def without_run_flag(argv: list) -> list:
    """The ranks' command line without ``--run`` (a replay is driven from its start stop)."""
    i = next((j for j, a in enumerate(argv) if j > 0 and not a.startswith("-")), len(argv))
    return [a for j, a in enumerate(argv) if not (j < i and a == "--run")]


def fresh_trace(path: str) -> str:
    """A path beside ``path`` (a job's ``--trace``: ``DIR/``, or a file the ranks' names are made
    from, run.h5 -> run.rank0.h5) that no run has written, for the job run again: ``DIR.t1/``,
    ``run.t1.h5`` (t2, ... where taken).  The run before keeps its traces: the travel is checked
    against them, and a user who gave --trace kept them for a reason."""
    is_dir = path.endswith(os.sep)
    stem, ext = (path.rstrip(os.sep), "") if is_dir else os.path.splitext(path)
    stem = re.sub(r"\.t\d+$", "", stem)
    n = 1
    while True:
        cand = f"{stem}.t{n}{ext}"
        if not os.path.exists(cand) and not glob.glob(glob.escape(f"{stem}.t{n}") + ".rank*" + ext):
            return cand + (os.sep if is_dir else "")
        n += 1


def with_trace(argv: list, old: str, new: str) -> list:
    """The ranks' command line with nndb's ``--trace old`` made ``--trace new``."""
    for j in range(len(argv) - 1):
        if argv[j] == "--trace" and argv[j + 1] == old:
            return argv[:j + 1] + [new] + argv[j + 2:]
    return list(argv)


def _change(run, ranks: list, targets_of, change) -> Optional[str]:
    targets, text = targets_of(change.line, ranks)
    for r in targets:
        out = run.on(r, text)
        if any(err for _, err in out):
            return f"the change {change.describe()} failed on rank {r} in the replay: " + " ".join(t for t, _ in out)
    return None


def to_step(run, ranks: list, step: int, changes: list, targets_of, hits: Optional[list] = None) -> Optional[str]:
    """Run a job (a replica, or the console's own, respawned) from its start
    stop to the end of ``step``, making the live job's changes (``set`` at a
    stop: [nndb.debugger.changes.Change], as one process's replays make its
    own) where they were made (those made at ``step`` too); ``hits``: a list
    to note [(step, line)] in, each stop of a point before ``step``;
    ``targets_of(line, ranks)``: a line's ranks and text (Console.targets).
    None, or why it could not."""
    from ..debugger.changes import due
    made: set = set()
    for _ in range(2 * step + len(changes) + 4):
        at = run.stop_step()
        if at not in made:
            made.add(at)
            for change in due(changes, at):
                why = _change(run, ranks, targets_of, change)
                if why:
                    return why
        if at == step:
            return None
        if at is not None and at > step:
            return f"the replay stopped past step {step}, at step {at}"
        until = min([c.replay_at for c in changes if c.replay_at is not None and (at is None or c.replay_at > at)]
                    + [step])
        out = run.resume(f"until {until}")
        if not out:
            return _failed(run, f"before step {step}") if isinstance(run, ReplicaJob) else \
                f"the job ended before step {step}"
        held = getattr(run, "held", None)
        if held:
            r = min(held)
            return f"rank {r} came to no stop before step {step}: it waits in {held[r]}"
        now, line = run.stop_step(), hit_line(out)
        if hits is not None and now is not None and now < step and line:
            hits.append((now, line))
    return f"the replay did not reach step {step}"


def _set(job: ReplicaJob, rank: int, setting) -> list:
    """predict's --set KEY=VALUE (a nndb.timetravel.predict.Setting) as the
    set command, typed on one replica rank: as in one process, OPTIMIZER.KEY
    names an optimizer, else a variable."""
    key, value = setting.key, setting.value
    oname, dot, hyper = key.partition(".")
    if not dot:
        return job.on(rank, f"set {key} {value}")
    out = job.on(rank, f"set {hyper} {value} optimizer {oname}")
    if any(err for _, err in out) and any("no optimizer named" in t for t, _ in out):
        out = job.on(rank, f"set var {key} {value}")
    return out


def _ahead(console, ranks: list, step: int, n: int, sets: tuple):
    """One replica job run ``n`` steps ahead of ``step``, making ``sets``
    ([Setting]) first: {rank: Prediction} or why not (a str)."""
    from ..timetravel.predict import Prediction
    job = ReplicaJob(console.front, console.argv)
    try:
        if not job.start():
            return _failed(job, "at its start")
        why = to_step(job, ranks, step, console.changes, console.targets) or drift(console, job, ranks, step)
        if why:
            return why
        for setting in sets:
            for r in ranks:
                out = _set(job, r, setting)
                if any(err for _, err in out):
                    return f"--set {setting.label}: " + " ".join(t for t, _ in out)
        set_points(job, console.targets, ranks, point_lines(console.point_lines))
        out = job.resume(f"until {step + n}")
        at, hit = job.stop_step(), hit_line(out)
        stopped = f"{hit} (step {at})" if out and hit else None
        ended = _failed(job, f"before step {step + n}") if not out else None
        held = dict(job.held)
        job.end()
        return {r: Prediction(_rows(path, step + 1, step + n), stopped=stopped,
                              ended=(f"rank {r} came to no stop: it waits in {held[r]} (out of inputs under Join?)"
                                     if r in held else ended), undone=_undone(out.get(r, ())))
                for r, path in job.traces().items() if r in ranks}
    finally:
        job.close()


def _undone(said) -> list:
    """The --set changes a replica rank said did not hold (the script set the
    value back: its own lr schedule), from its output [(text, is_error)], as
    one process's prediction has them (Prediction.undone)."""
    return [line.strip().replace(HELD_WARNING, "", 1) for text, err in said if err
            for line in text.splitlines() if line.startswith(HELD_WARNING) and NOT_HELD in line]


def _rows(path: str, first: int, last: int) -> list:
    """predict's rows of steps first..last from a replica rank's trace (Prediction.rows)."""
    from ..store.reader import TraceReader
    rows = {}
    with TraceReader(path) as t:
        losses = {s.name: s for s in t.series() if s.kind == "loss"}
        grads = [s for s in t.series() if s.kind == "grad"]
        loss_at = dict(zip(*t.history(next(iter(losses.values())), "mean"))) if losses else {}
        norms: dict = {}
        for s in grads:
            for st, v in zip(*t.history(s, "norm")):
                if v == v:
                    norms.setdefault(int(st), []).append((s.name, float(v)))
        found: dict = {}
        for f in t.records("finding"):
            found.setdefault(f.get("step"), set()).add(f.get("rule"))
        for st in [int(x) for x in t.steps if first <= x <= last]:
            grad_norm, clipped, why = step_grad_norm(norms.get(st, []))
            rows[st] = {"step": st, "loss": float(loss_at[st]) if st in loss_at else None,
                        "grad_norm": grad_norm, "clipped": clipped, "grad_norm_missing": why,
                        "findings": sorted(found.get(st, ()))}
    return [rows[s] for s in sorted(rows)]


def predict(console, arg: str, ranks: list, step: int) -> None:
    from ..commands.timetravel import render_prediction
    from ..errors import CommandError
    from ..render.debug import render
    from ..timetravel.predict import parse_request
    try:
        request = parse_request(arg)
    except CommandError as e:
        console.say(str(e))
        return
    n, sets = request.steps, request.sets
    t0 = time.perf_counter()
    base = _ahead(console, ranks, step, n, [])
    changed = _ahead(console, ranks, step, n, sets) if sets and not isinstance(base, str) else None
    for res in (base, changed):
        if isinstance(res, str):
            console.say(f"nndb: predict across ranks: {res}")
            return
    took = time.perf_counter() - t0
    labels = [f"set {st.key} {st.value}" for st in sets]
    console.say(f"nndb: predicted on {'two replica jobs' if sets else 'a replica job'} (every rank respawned "
                f"and replayed from the start; each rank's loss at step {step} equals the live job's bit for "
                f"bit); the live job is unchanged")
    for r in ranks:
        console.say(f"-- rank {r} --")
        console.say(render(render_prediction(n, labels, base[r], changed[r] if changed else None, took)))


def reverse_continue(console, ranks: list, step: int) -> None:
    points = point_lines(console.point_lines)
    if not points:
        console.say("no breakpoints or watchpoints: nothing to go back to")
        return
    hits = []
    job = ReplicaJob(console.front, console.argv)
    try:
        if not job.start():
            console.say(f"nndb: reverse-continue across ranks: {_failed(job, 'at its start')}")
            return
        set_points(job, console.targets, ranks, points)
        why = to_step(job, ranks, step, console.changes, console.targets, hits=hits)
        if why:
            console.say(f"nndb: reverse-continue across ranks: {why}")
            return
        why = drift(console, job, ranks, step)
    finally:
        job.close()
    if why:
        console.say(f"nndb: reverse-continue across ranks: {why}")
        return
    if not hits:
        console.say(f"No earlier step where a breakpoint or watchpoint held (the job replayed from its start "
                    f"to step {step}); the job stays at step {step}.")
        return
    at, what = hits[-1]
    console.travel("goto", str(at), ranks)
    console.say(f"nndb: reverse-continue: the last stop before step {step} was at step {at}: {what}")


def _at_step(t, kind: str, stat: str, step: int) -> list:
    """(name, float.hex) of each series of ``kind`` in trace ``t`` recorded at ``step``, by name."""
    out = []
    for s in sorted((s for s in t.series() if s.kind == kind), key=lambda s: s.name):
        at = dict(zip(*t.history(s, stat)))
        if step in at:
            out.append((s.name, float(at[step]).hex()))
    return out


def _from_traces(paths: dict, read) -> dict:
    """rank -> ``read(trace)`` of its trace, or None (an unreadable trace: the check is not made)."""
    from ..store.reader import TraceReader
    out = {}
    for r, path in paths.items():
        out[r] = None
        try:
            with TraceReader(path) as t:
                out[r] = read(t)
        except Exception:
            pass
    return out


def trace_losses(paths: dict, step: int) -> dict:
    """rank -> the loss its trace holds for ``step`` (float.hex, as ``_LOSS`` prints it), or None."""
    def loss(t):
        first = next((s for s in t.series() if s.kind == "loss"), None)
        return None if first is None else dict(_at_step(t, "loss", "mean", step)).get(first.name)
    return _from_traces(paths, loss)


def trace_weights(paths: dict, step: int) -> dict:
    """rank -> its trace's parameter norms at ``step`` (as ``_WEIGHTS`` prints them), or None."""
    return _from_traces(paths, lambda t: ";".join(f"{n}={v}" for n, v in _at_step(t, "param", "norm", step)) or None)


def check_travel(console, ranks: list, step: int, before: dict, weights: Optional[dict] = None) -> str:
    """After a travel to ``step``: each rank's loss there against the trace of the run before
    (``before``), then its parameters' norms (``weights``, ``trace_weights``')."""
    for r in ranks:
        then = before.get(r)
        if then is None:
            return (f"nndb: rank {r}'s trace of the run before holds no loss at step {step}: this run's values "
                    f"cannot be checked against it")
        now = _text(console.on(r, _LOSS))
        if now != then:
            return (f"nndb: this run drifted: rank {r}'s loss at step {step} is {_show(now)} now and "
                    f"{_show(then)} in the run before (the script is not deterministic from its start"
                    f"{_since(console, 2)}): the values here are not the first pass's")
    for r in ranks:
        other = _other_weights(_text(console.on(r, _WEIGHTS)), (weights or {}).get(r), "now", "in the run before")
        if other:
            return (f"nndb: this run drifted: rank {r}'s parameters at step {step} are not the run before's, "
                    f"its loss the same ({other}) "
                    f"(the script is not deterministic from its start{_since(console, 2)}): the values here "
                    f"are not the first pass's")
    return f"nndb: every rank's loss at step {step} equals the run before's, bit for bit"
