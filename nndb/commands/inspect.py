"""Looking at the run: print, display, stats, history, where, up, down, list, info."""
from __future__ import annotations

import os
import linecache
import math

from .. import globs
from ..errors import CommandError
from ..text import fmt
from ..render.chart import chart
from ..store.measured import measured_values
from ..schema import COUNT_STATS, HYPER_NAMES, KIND_WORDS, STAT_NAMES, default_stat, model_order
from ..debugger import evaluate as E
from ..debugger import points as P
from .breakpoints import _numbers, info_points
from .rules import info_rules
from .table import Command, Table, no_args


# -- print / display ---------------------------------------------------------------
def _print_arg(text: str):
    t = text.strip()
    full = False
    if t.startswith("/"):
        fmt, _, t = t[1:].partition(" ")
        if fmt not in ("full", "f"):
            raise CommandError(f"unknown print format '/{fmt}' (there is /full)")
        full = True
    if not t:
        raise CommandError("print what?")
    return E.compile_expr(t), full


def _print(s, arg):
    code, full = arg
    value = E.evaluate(code, s.frame, s.view.variables(s.frame))
    return E.safe_repr(value, full=full)


def _pprint_arg(text: str):
    if not text.strip():
        raise CommandError("pp what?")
    return E.compile_expr(text.strip())


def _pprint(s, code):
    value = E.evaluate(code, s.frame, s.view.variables(s.frame))
    return E.safe_pformat(value)


def _display(s, text):
    if not text.strip():
        s.show_displays()
        return None
    code = E.compile_expr(text)
    number = s.points.new_display(text.strip(), code)
    if s.here.stop is not None:
        try:
            return f"{number}: {text.strip()} = {E.safe_repr(E.evaluate(code, s.frame, s.view.variables(s.frame)))}"
        except CommandError as e:
            return f"{number}: {text.strip()} = <error: {e}>"
    return None


def _undisplay_arg(text: str) -> list:
    return _numbers(text, "display number")


def _undisplay(s, numbers):
    if not numbers:
        if s.points.displays and s.interactive and not s.frontend.confirm(
                "Delete all auto-display expressions? (y or n) "):
            return "Not confirmed."
        s.points.displays.clear()
        return None
    missing = [n for n in numbers if not any(d[0] == n for d in s.points.displays)]
    if missing:                       # (all or none, as delete: 'undisplay 1 9' removed 1, then said there is no 9)
        raise CommandError(f"no display number {missing[0]}")
    s.points.displays = [d for d in s.points.displays if d[0] not in numbers]
    return None


# -- statistics ----------------------------------------------------------------------
# The schema's statistics less mean_abs, with the NaN and Inf counts last, where the eye ends.
_LAST = ("nan_count", "inf_count")
STAT_COLUMNS = tuple(n for n in STAT_NAMES if n not in ("mean_abs",) + _LAST) + _LAST


def _stats_arg(text):
    words = text.split()
    kind = glob = None
    if words and words[0] in KIND_WORDS:
        kind = KIND_WORDS[words.pop(0)]
    if words:
        glob = words.pop(0)
    if words:
        raise CommandError(f"unexpected '{' '.join(words)}'")
    return kind, glob


def _stats(s, arg):
    kind, glob = arg
    rec = s.record
    if rec is None:
        raise CommandError("no step has been recorded yet")
    rows = []
    for (name, k), row in zip(rec.names, s.view.stats_of(rec)):
        if kind and k != kind:
            continue
        if glob and not globs.matches(name, glob):
            continue
        vals = dict(zip(P.STATS, measured_values(row, P.STATS)))
        rows.append((name, k, *(int(vals[c]) if c in COUNT_STATS and vals[c] is not None else vals[c]
                                for c in STAT_COLUMNS)))
    # (the model's order, each kind apart: a parameter too large for the host block has its
    # rows before the activations in the record)
    rows = [rows[i] for i in model_order([r[:2] for r in rows], [m[0] for m in s.view.module_summary()], True)]
    empty = "nothing recorded"
    if not rows and kind in ("param", "update") and rec is s.view.unwritten():
        # (a hand-written loop's step that just ended: its values and update are taken at the
        # next step's end, after the script's update; the step before has them)
        empty = (f"step {rec.step}'s weight and update rows are not measured yet: with hand-written updates "
                 f"they are taken at the next step's end, after the update"
                 + (f" (step {rec.step - 1}'s: 'history NAME')" if rec.step > 0 else ""))
    elif not rows and glob:
        raise CommandError(f"no {kind or ''} tensor matches '{glob}' at step {rec.step}".replace("  ", " "))
    return Table(("tensor", "kind", *STAT_COLUMNS), rows,
                 title=f"step {rec.step}" + (" (partial)" if rec.partial else ""), empty=empty)


def _history_arg(text):
    words = text.split()
    last = 20
    if "--last" in words:
        i = words.index("--last")
        if i + 1 >= len(words):
            raise CommandError("--last needs a count")
        last = P.parse_int(words[i + 1], "the count")
        if last < 1:
            raise CommandError("the count must be at least 1")
        del words[i:i + 2]
    kind = None
    if len(words) >= 2 and words[0] in KIND_WORDS:
        kind = KIND_WORDS[words.pop(0)]
    if not words:
        raise CommandError("history needs a tensor name")
    name = words.pop(0)
    stat = None                 # (the series' default_stat, once its kind is known)
    if words:
        stat = words.pop(0)
        if stat not in P.STATS:
            raise CommandError(f"unknown statistic '{stat}' (one of: {', '.join(P.STATS)})")
    if words:
        raise CommandError(f"unexpected '{' '.join(words)}'")
    return kind, name, stat, last


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values, width: int = 60) -> str:
    """One character per value: a bar for a finite one, ``!`` for NaN or Inf,
    a space where nothing was measured (None)."""
    vals = [None if v is None else float(v) for v in values]
    if len(vals) > width:              # keep the shape: one bucket mean per character
        step = len(vals) / width
        vals = [_mean(vals[int(i * step):max(int((i + 1) * step), int(i * step) + 1)]) for i in range(width)]
    finite = [v for v in vals if v is not None and math.isfinite(v)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
    out = []
    for v in vals:
        if v is None:
            out.append(" ")
        elif not math.isfinite(v):
            out.append("!")
        elif hi == lo:
            out.append(SPARKS[3])
        else:
            out.append(SPARKS[min(len(SPARKS) - 1, int((v - lo) / (hi - lo) * len(SPARKS)))])
    return "".join(out)


def _mean(xs):
    """A bucket's mean of its finite values; NaN if it has only NaN or Inf; None if nothing was measured."""
    f = [x for x in xs if x is not None and math.isfinite(x)]
    if f:
        return sum(f) / len(f)
    return math.nan if any(x is not None for x in xs) else None


def _hyper_history(s, name, last):
    """``history lr`` (``weight_decay``, ``momentum``, ``beta1``, ``beta2``): each param
    group's value at the recorded steps, a column a group, as ``nndb inspect --series lr``
    shows it (the trace's hyper rows; it said "no tensor named 'lr' has been recorded")."""
    with s.view.trace_reader() as reader:
        groups = reader.hyper_values(name)
        steps = [int(x) for x in reader.steps]
    if not groups or not steps:
        if name == "lr":
            raise CommandError("no learning rate recorded yet (no optimizer has stepped)")
        raise CommandError(f"no {name} recorded yet (no param group of an optimizer that has stepped has one)")
    partial = s.view.partial_steps()
    rows = [(_step(st, partial), *[None if math.isnan(v[i]) else float(v[i]) for _, _, v in groups])
            for i, st in enumerate(steps)]
    return [f"{name}, {len(steps)} recorded step(s) {steps[0]}..{steps[-1]}, a column a param group",
            Table(("step", *[f"{opt}.group{g}" for opt, g, _ in groups]), rows[-last:])]


def _step(step: int, partial: set):
    """A history row's step, ``N (partial)`` for a row that is no whole step, as
    ``nndb inspect --series`` marks it."""
    return f"{step} (partial)" if step in partial else step


def _history(s, arg):
    kind, name, stat, last = arg
    if name in HYPER_NAMES and kind is None and stat is None and not s.view.kinds_of(name):
        return _hyper_history(s, name, last)
    if kind is None:
        kinds = s.view.kinds_of(name)
        if len(kinds) > 1:          # (a parameter's name: its param, update and grad)
            return _histories(s, name, kinds, stat, last)
    steps, values, kind = s.view.history(name, kind, stat)
    stat = stat or default_stat(kind)
    if len(steps) == 0:
        return f"{name} ({kind}): nothing recorded yet"
    partial = s.view.partial_steps()
    rows = [(_step(int(a), partial), b) for a, b in zip(steps[-last:], values[-last:])]
    wsteps, wvalues = _whole(steps, values, partial)
    numbers = [v for v in wvalues if v is not None and not math.isnan(v)]     # (an Inf is an extreme)
    what = name if name == kind else f"{name} ({kind})"          # (the loss: "loss", not "loss (loss)")
    lines = [f"{what} {stat}, {len(steps)} recorded step(s) {int(steps[0])}..{int(steps[-1])}"
             + _partial_said(steps, partial)
             + (f", min {fmt(min(numbers))} max {fmt(max(numbers))}" if numbers else ""),
             sparkline(wvalues)]
    # At the prompt, the whole series as a chart under its last values; batch
    # mode (logs, CI) keeps to the numbers.
    chart_lines = chart([int(x) for x in wsteps], wvalues) if s.interactive and wsteps else []
    return [*lines, Table(("step", stat), rows), *chart_lines]


def _whole(steps, values, partial: set) -> tuple:
    """(steps, values) of the whole steps: a partial row's values are no step's, so the
    sparkline, min, max and chart leave it out (it stays in the table, marked), as
    ``nndb inspect``'s table and the plots do."""
    keep = [i for i, st in enumerate(steps) if int(st) not in partial]
    return [steps[i] for i in keep], [values[i] for i in keep]


def _partial_said(steps, partial: set) -> str:
    """', step N partial' for the partial rows among ``steps`` (as inspect's recorded line)."""
    here = [int(x) for x in steps if int(x) in partial]
    if not here:
        return ""
    return f", step {here[0]} partial" if len(here) == 1 else f", steps {', '.join(map(str, here))} partial"


def _histories(s, name, kinds, stat, last):
    """One statistic of a name recorded as several kinds, side by side (as
    ``nndb inspect --series`` shows it): a sparkline a kind, the last K steps."""
    got = [(k, *s.view.history(name, k, stat)[:2]) for k in kinds]
    stat = stat or default_stat(kinds[0])
    steps = sorted({int(x) for _, st, _ in got for x in st})
    partial = s.view.partial_steps()
    lines = [f"{name} {stat} ({', '.join(kinds)}), {len(steps)} recorded step(s) {steps[0]}..{steps[-1]}"
             + _partial_said(steps, partial) if steps else f"{name} ({', '.join(kinds)}): nothing recorded yet"]
    if not steps:
        return lines
    width = max(len(k) for k in kinds)
    at = {}
    for k, st, values in got:
        wvalues = _whole(list(st), list(values), partial)[1]
        numbers = [v for v in wvalues if v is not None and not math.isnan(v)]
        lines.append(f"{k:<{width}}  {sparkline(wvalues)}"
                     + (f"  min {fmt(min(numbers))} max {fmt(max(numbers))}" if numbers else ""))
        at[k] = dict(zip((int(x) for x in st), values))
    rows = [(_step(x, partial), *(at[k].get(x) for k in kinds)) for x in steps[-last:]]
    return [*lines, Table(("step", *kinds), rows)]


# -- the script's stack ----------------------------------------------------------------
def _frame_line(s, i, marker=True):
    frame, lineno = s.here.frames[i]
    code = frame.f_code
    mark = "> " if (marker and i == s.here.frame_index) else "  "
    src = linecache.getline(code.co_filename, lineno, frame.f_globals).strip()
    # (the file as a stop shows it: relative to the working directory)
    name = code.co_filename if code.co_filename.startswith("<") else os.path.relpath(code.co_filename)
    return [f"{mark}{name}({lineno}){code.co_name}()", f"-> {src}" if src else "->"]


def _need_frames(s):
    if not s.here.frames:
        raise CommandError("no stack: the script is not stopped in a frame")


def _where(s, _):
    _need_frames(s)
    lines = []
    for i in range(len(s.here.frames)):
        lines.extend(_frame_line(s, i))
    return lines


def _move(s, n):
    """As pdb and gdb: a count past the end goes as far as there is; only a move from the end is refused."""
    _need_frames(s)
    if n < 0 and s.here.frame_index == 0:
        raise CommandError("Oldest frame")
    if n > 0 and s.here.frame_index == len(s.here.frames) - 1:
        raise CommandError("Newest frame")
    new = min(max(0, s.here.frame_index + n), len(s.here.frames) - 1)
    s.here.frame_index = new
    s.here.list_position = None
    return _frame_line(s, new)


def _up(s, n):
    return _move(s, -n)


def _down(s, n):
    return _move(s, n)


def _count1(text):
    t = text.strip()
    return P.parse_int(t, "the count") if t else 1


def _list_arg(text):
    """``LINE``, ``FIRST,LAST`` (pdb's and gdb's range; a LAST below FIRST is a count, as in
    pdb) or ``.`` (around the current line); None: go on from the last listing."""
    t = text.strip()
    if not t:
        return None
    if t == ".":
        return "."
    if "," in t:
        a, _, b = t.partition(",")
        first = P.parse_int(a.strip(), "the first line")
        last = P.parse_int(b.strip(), "the last line")
        if last < first:
            last = first + last
        if first < 1 or last < first:
            raise CommandError(f"bad range {t}: lines count from 1")
        return first, last
    return P.parse_int(t, "the line")


def _source_lines(s, frame, first: int, last: int, lineno: int) -> list:
    filename = frame.f_code.co_filename
    lines = []
    for n in range(first, last + 1):
        src = linecache.getline(filename, n, frame.f_globals)
        if not src:
            break
        mark = "->" if n == lineno else "  "
        lines.append(f"{n:4d} {mark} {src.rstrip()}")
    if not lines:
        # ('list 9999' lists 9994-10004: it said "line 9994 is past the end", a line not asked for)
        n = len(linecache.getlines(filename, frame.f_globals))
        raise CommandError(f"lines {first}-{last} are past the end of {filename} ({n} lines)")
    s.here.list_position = ((filename, s.here.frame_index), first + len(lines))
    return lines


def _list(s, line):
    _need_frames(s)
    frame, lineno = s.here.frames[s.here.frame_index]
    filename = frame.f_code.co_filename
    if isinstance(line, tuple):
        return _source_lines(s, frame, line[0], line[1], lineno)
    if line == ".":
        first = max(1, lineno - 5)
    elif line is not None:
        first = max(1, line - 5)
    elif s.here.list_position is not None and s.here.list_position[0] == (filename, s.here.frame_index):
        first = s.here.list_position[1]
    else:
        first = max(1, lineno - 5)
    return _source_lines(s, frame, first, first + 10, lineno)


def _longlist(s, _):
    _need_frames(s)
    frame, lineno = s.here.frames[s.here.frame_index]
    import inspect as pyinspect
    try:
        if frame.f_code.co_name == "<module>":       # (pdb: the module's whole source)
            lines, first = pyinspect.findsource(frame)[0], 1
        else:
            lines, first = pyinspect.getsourcelines(frame)
    except (OSError, TypeError) as e:
        raise CommandError(f"no source for {frame.f_code.co_name}: {e}")
    return _source_lines(s, frame, max(1, first), max(1, first) + len(lines) - 1, lineno)


# -- info ----------------------------------------------------------------------------------
def _info_step(s):
    cur = s.here.stop
    rec = s.record
    rows = [("state", s.control.state)]
    if cur is not None:
        rows.append(("stopped", cur.kind + (f" in {cur.module} {cur.phase}" if cur.module else "")))
    rows.append(("last finished step", s.last_step if s.last_step is not None else "-"))
    if s.live:
        rows.append(("step in progress", s.step_in_progress()))
    if rec is not None:
        rows.append(("last recorded step", rec.step))
        rows.append(("backward passes", rec.backward_count))
        rows.append(("optimizer steps", rec.optimizer_steps))
        # (that step's, as the two rows above: at a stop inside the next step $loss is not
        # measured, and the row said '-' under a step whose loss the trace holds)
        loss = s.view.last_loss()
        rows.append(("loss", "-" if loss is None else loss))
    if s.rec is not None:
        rows.append(("step clock", s.rec.tracer.clock.mode.name.lower()))
    rows.append(("trace", s.log.trace_path or "-"))
    return Table(("", ""), rows)


def _info_modules(s):
    return Table(("module", "type", "params"), s.view.module_summary(), empty="No module has run yet.")


def _info_params(s):
    rows = [(name, shape, dtype, "y" if grad else "n", norm, gnorm)
            for name, shape, dtype, grad, norm, gnorm in s.view.param_summary()]
    return Table(("param", "shape", "dtype", "grad", "norm", "grad norm"), rows,
                 empty="No parameters seen yet.")


def _info_optimizer(s):
    rows = [(name, type(opt).__name__, gi, n, ", ".join(f"{k}={v!r}" for k, v in hyper.items()))
            for name, opt, gi, n, hyper in s.view.optimizer_groups()]
    table = Table(("optimizer", "type", "group", "params", "hyper-parameters"), rows,
                  empty="No optimizer has stepped yet.")
    held = s.holds.held()
    if not held:
        return table
    return [table, Table(("optimizer", "group", "held", "value", "by"),
                         [(n, gi, k, repr(v), line) for n, gi, k, v, line in held],
                         title="Held (set again before each step until 'unset HYPER'):")]


def _info_locals(s):
    _need_frames(s)
    frame = s.frame
    rows = []
    for k, v in frame.f_locals.items():
        if k.startswith("__") and k.endswith("__"):
            continue
        r = E.safe_repr(v)
        first = r.splitlines()[0] if r else r
        if first != r:
            first += " ..."          # a model's or optimizer's repr spans lines: the table stays one row each
        rows.append((k, first if len(first) <= 120 else first[:117] + "..."))
    return Table(("name", "value"), rows, empty="No locals.")


def _info_display(s):
    return Table(("Num", "Expression"), [(n, src) for n, src, _ in s.points.displays],
                 empty="There are no auto-display expressions now.")


INFO = {
    "breakpoints": lambda s: info_points(s),
    "watchpoints": lambda s: info_points(s, watch_only=True),
    "display": _info_display,
    "step": _info_step,
    "modules": _info_modules,
    "params": _info_params,
    "optimizer": _info_optimizer,
    "locals": _info_locals,
    "rules": info_rules,
    "checkpoints": lambda s: _info_checkpoints(s),
    "memory": lambda s: _info_memory(s),
}


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.1f} MiB"


def _info_memory(s):
    from ..debugger.memory import report
    r = report(s)
    rows = [("process (host, resident)", _mib(r["rss_bytes"])),
            ("nndb's tensors kept between steps (host)", _mib(r["nndb_host_tensor_bytes"]))]
    if s.machine is not None and getattr(s.machine, "checkpoints", None):
        from ..timetravel.inventory import checkpoint_inventory, total_private_kib
        rows.append(("checkpoints (private, their own processes)",
                     _mib(total_private_kib(checkpoint_inventory(s.machine)) * 1024)))
    for d in r["devices"]:
        dev = f"{d['device']} ({d['name']})"
        rows += [(f"{dev}: allocated (script and nndb)", _mib(d["allocated_bytes"])),
                 (f"{dev}: reserved by the allocator", _mib(d["reserved_bytes"])),
                 (f"{dev}: peak allocated", _mib(d["peak_allocated_bytes"])),
                 (f"{dev}: nndb's tensors kept between steps", _mib(d["nndb_held_bytes"]))]
    lines = [] if r["devices"] else ["CUDA: not initialised in this process (no GPU memory in use)."]
    return [Table(("memory", ""), rows), *lines]


def _info_checkpoints(s):
    from .timetravel import info_checkpoints
    return info_checkpoints(s)
INFO_ALIASES = {"b": "breakpoints", "break": "breakpoints", "watch": "watchpoints"}


def _info_arg(text):
    w = text.split()
    if len(w) != 1:
        raise CommandError("info what? (" + " | ".join(INFO) + ")")
    word = INFO_ALIASES.get(w[0], w[0])
    if word in INFO:
        return word
    hits = [k for k in INFO if k.startswith(word)]
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise CommandError(f'ambiguous info command "{w[0]}": {", ".join(hits)}')
    raise CommandError(f'undefined info command: "{w[0]}".  Try "help info".')


def _info(s, what):
    return INFO[what](s)


COMMANDS = [
    Command("print", "print[/full] [--ranks all|LIST] EXPR", """Evaluate EXPR in the script's current frame and show the result.
A tensor shows as one line (shape, dtype, device, statistics); /full prints
every element.  $step, $loss, $grad['NAME'] ... are nndb's variables.
--ranks all|LIST (several ranks): one row per rank, side by side.""",
            _print, _print_arg, aliases=("p",), args=("expr",), group="data", ranks="option"),
    Command("pp", "pp EXPR", """Evaluate EXPR as print does and pretty-print the result (pdb's pp).
A long list or dict is one item a line (Python's pprint); a tensor is the one line of print.""",
            _pprint, _pprint_arg, args=("expr",), group="data"),
    Command("display", "display [EXPR]", "Show EXPR at every stop (with no EXPR, show them all now).",
            _display, aliases=(), args=("expr",), group="data", ranks="suffix"),
    Command("undisplay", "undisplay [N...]", "Stop showing display expressions N... (all if none are given).",
            _undisplay, _undisplay_arg, group="data", ranks="suffix"),
    Command("stats", "stats [--ranks all|LIST] [KIND] [GLOB]", """A table of the last recorded step's statistics (KIND: grad weight update act loss).
--ranks all|LIST (several ranks): one table per rank.""",
            _stats, _stats_arg, args=("kind", "tensor"), group="data", ranks="option"),
    Command("history", "history [KIND] NAME [STAT] [--last K]", """One tensor's recorded statistic (default norm; the loss's: mean, its value) over the steps.
A sparkline of the whole series and its last K values (default 20); at the
prompt (not in batch mode), the whole series as a chart under them.  A
parameter's name without KIND: its param, update and grad side by side.
history lr: each param group's learning rate at the recorded steps (also
weight_decay, momentum, beta1, beta2: those the groups have).""",
            _history, _history_arg, args=("tensor", "stat"), group="data"),
    Command("where", "where [--ranks all|LIST]", """The script's stack (nndb's own frames are hidden); > marks the current frame.
--ranks all|LIST (several ranks): every rank's stack.""",
            _where, no_args, aliases=("bt", "backtrace", "w"), group="stack", ranks="option"),
    Command("up", "up [N]", "Move N frames up the stack (towards the outermost).",
            _up, _count1, group="stack"),
    Command("down", "down [N]", "Move N frames down the stack (towards the stop).",
            _down, _count1, group="stack"),
    Command("list", "list [--ranks all|LIST] [LINE | FIRST,LAST | .]", """Show 11 source lines around the current line (again: the next 11).
With LINE, around it; FIRST,LAST: those lines (a LAST below FIRST is a count,
as in pdb); '.': around the current line again.
--ranks all|LIST (several ranks): each rank's lines.""",
            _list, _list_arg, aliases=("l",), group="stack", ranks="option"),
    Command("longlist", "longlist", "Show the whole source of the current function (pdb's ll; at the top level, the script's).",
            _longlist, no_args, aliases=("ll",), group="stack"),
    Command("info", "info " + "|".join(INFO), """Show something about the session or the run: its points, the step, the model, the rules, time travel.
  info breakpoints   info watchpoints   info display
  info step          the current step, why the run stopped, the last loss
  info modules       info params        info optimizer (hyper-parameters per param group)
  info locals        the current frame's variables
  info rules         the diagnostic rules: severity, action, enabled, findings, thresholds
  info checkpoints   time travel's checkpoints: step, cost, memory; the schedule
  info memory        the process's memory, each CUDA device's, and what nndb keeps""",
            _info, _info_arg, aliases=("i",), args=("info",), group="data"),
]
