"""Breakpoints and watchpoints: break, tbreak, watch, condition, ignore,
commands, delete, disable, enable, and their ``info`` tables."""
from __future__ import annotations


from .. import globs
from ..errors import CommandError
from ..debugger import evaluate as E
from ..debugger import points as P
from ..debugger.queries import RENAMED_WHY
from .table import Command, Table


def _break_arg(text):
    """The whole grammar, expressions compiled: a batch run checks its
    startup commands with this before the script runs."""
    cls, fields, cond, fail = P.parse_break(text)
    if cls is P.ExprBreak:
        E.compile_expr(fields["expr"])
    if cond is not None:
        E.compile_expr(cond)
    return cls, fields, cond, fail


def _break(s, arg, temporary=False):
    cls, fields, cond, fail = arg
    if cls is P.ModuleBreak:
        _check_glob(s, "module", fields["glob"])
    p = s.points.add(cls, fields, condition=cond, temporary=temporary, fail=fail)
    kind = "Temporary breakpoint" if temporary else "Breakpoint"
    out = f"{kind} {p.number}: {p.what()}" + (f" if {cond}" if cond else "") + (" [fail]" if fail else "")
    if cls is P.StepBreak and s.last_step is not None and fields["step"] <= s.last_step:
        out += (f"\n(step {fields['step']} has already finished in this run, which is at step "
                f"{s.last_step}: it stops a run started again with 'run', and the past run forward "
                f"over it: 'goto', 'continue')")
    return out


def _tbreak(s, arg):
    return _break(s, arg, temporary=True)


def _watch(s, fields):
    fields = dict(fields)
    fail = fields.pop("fail")
    _check_glob(s, fields["kind"], fields["glob"])
    p = s.points.add(P.Watch, fields, fail=fail)
    return f"Watchpoint {p.number}: {p.what()}" + (" [fail]" if fail else "")


def _check_glob(s, kind: str, glob: str) -> None:
    """A glob that matches no name seen yet leaves the point pending, as gdb's
    pending breakpoints wait for a library not loaded yet: a second model
    built at step N, a parameter group added later, are named only then.
    Once names are known the message lists some, which shows a typo."""
    names = s.view.known_names(kind)
    if any(globs.matches(n, glob) for n in s.view.point_names(kind)):
        return
    what = "module" if kind == "module" else f"{kind} tensor"
    renamed = s.view.renamed_matches(kind, glob) if kind in ("param", "grad", "update") else []
    if renamed:
        s.message(f"No {what} is recorded as '{glob}', which names {', '.join(renamed[:4])} as the script "
                  f"does ({RENAMED_WHY}); the point stays pending until a tensor of its name appears: "
                  f"watch {'weight' if kind == 'param' else kind} {renamed[0]} ...")
        return
    some = ", ".join(sorted(names)[:8]) + (" ..." if len(names) > 8 else "")
    seen = f" (there are: {some})" if s.last_step is not None and names else " yet"
    s.message(f"No {what} matches '{glob}'{seen}; the point stays pending until one does.")


def _numbers(text: str, what: str = "breakpoint number") -> list:
    """gdb's list of numbers and ranges: '1 3-5' is [1, 3, 4, 5]."""
    out = []
    for w in text.split():
        if "-" in w.strip("-") and not w.startswith("-"):
            a, b = w.split("-", 1)
            lo, hi = P.parse_int(a, what), P.parse_int(b, what)
            if hi < lo or hi - lo > 10000:
                raise CommandError(f"bad range '{w}'")
            out.extend(range(lo, hi + 1))
        else:
            out.append(P.parse_int(w, what))
    return out


def _targets(s, numbers):
    if not numbers:
        return list(s.points.values())
    return [s.points.by_number(n) for n in numbers]


def _delete_arg(text: str):
    words = text.split()
    if words and "checkpoint".startswith(words[0]) and len(words[0]) >= 2 and words[0] != "-":
        if len(words) != 2:
            raise CommandError("delete checkpoint needs one checkpoint number")
        return ("checkpoint", P.parse_int(words[1], "checkpoint number"))
    return _numbers(text)


def _delete(s, numbers):
    if isinstance(numbers, tuple):
        from .timetravel import machine
        ck = machine(s, live=False).delete(numbers[1])
        return f"Deleted checkpoint {ck.number} (step {ck.step})."
    if not numbers and s.points and s.interactive and not s.frontend.confirm("Delete all breakpoints? (y or n) "):
        return "Not confirmed."
    for p in _targets(s, numbers):
        s.points.pop(p.number, None)
    s.sync_hooks()
    return None


def _enable(s, numbers, on=True):
    for p in _targets(s, numbers):
        s.points.enable(p, on)
    s.sync_hooks()


def _disable(s, numbers):
    _enable(s, numbers, on=False)


def _condition_arg(text):
    words = text.strip().split(None, 1)
    if not words:
        raise CommandError("condition needs a breakpoint number")
    return P.parse_int(words[0], "breakpoint number"), (words[1].strip() if len(words) > 1 else None)


def _condition(s, arg):
    number, expr = arg
    p = s.points.by_number(number)
    if expr is None:
        p.condition = None
        return f"Breakpoint {number} now unconditional."
    E.compile_expr(expr)
    p.condition = expr
    return None


def _ignore_arg(text):
    words = text.split()
    if len(words) != 2:
        raise CommandError("ignore needs a breakpoint number and a count")
    n, count = P.parse_int(words[0], "breakpoint number"), P.parse_int(words[1], "the count")
    if count < 0:
        raise CommandError("the count cannot be negative")
    return n, count


def _ignore(s, arg):
    number, count = arg
    p = s.points.by_number(number)
    p.ignore_count = count
    if count == 0:
        return f"Will stop next time breakpoint {number} is reached."
    return f"Will ignore next {count} crossings of breakpoint {number}."


def _commands_arg(text):
    t = text.strip()
    return P.parse_int(t, "breakpoint number") if t else None


def _commands(s, number):
    if number is None:
        if not s.points:
            raise CommandError("no breakpoints")
        number = max(s.points)
    p = s.points.by_number(number)
    if s.interactive and s.reading_from_terminal():
        s.message("Type commands for when breakpoint %d is hit, one per line.\nEnd with a line saying just \"end\"." % number)
    lines = s.read_block()
    p.silent = bool(lines) and lines[0] == "silent"
    p.commands = lines[1:] if p.silent else lines
    return None


def info_points(s, watch_only=False):
    rows = []
    for p in sorted(s.points.values(), key=lambda p: p.number):
        if watch_only and not isinstance(p, P.Watch):
            continue
        what = p.what() + (" [fail]" if p.fail else "")
        extra = []
        if p.condition:
            extra.append(f"stop only if {p.condition}")
        if p.hits:
            extra.append(f"breakpoint already hit {p.hits} time{'s' if p.hits != 1 else ''}")
        if p.ignore_count:
            extra.append(f"will ignore next {p.ignore_count} crossings")
        if p.commands or p.silent:
            extra.append("commands: " + "; ".join((["silent"] if p.silent else []) + p.commands))
        rows.append((p.number, p.type_name, p.disp, "y" if p.enabled else "n", what, p.hits,
                     "\n".join(extra)))
    return Table(("Num", "Type", "Disp", "Enb", "What", "Hits", "Notes"), rows,
                 empty="No watchpoints." if watch_only else "No breakpoints or watchpoints.")


COMMANDS = [
    Command("break", P.BREAK_USAGE, """Set a breakpoint.
  break step N                     stop when training step N has finished
  break module GLOB [forward]      stop before a matching module's forward runs
  break module GLOB backward       stop when a matching module's backward starts
  break if EXPR                    stop at any step end where EXPR is true
A trailing "if EXPR" adds a condition; a trailing "fail" makes a hit fail the
run (exit code 4).  Several ranks: on every rank; a trailing "rank N" sets it
on rank N only (the others stop with it: all-stop).  EXPR is Python in the script's frame; $step, $loss,
$grad['NAME'].norm, $act['NAME'].zero_frac ... give the step's statistics ($loss: with one loss per
optimizer, the first one's; $losses['loss/NAME'].mean the others').""",
            _break, _break_arg, aliases=("b", "br"), args=("sub:step|module|if", "module", "sub:forward|backward|fail"),
            group="breakpoints", ranks="suffix"),
    Command("tbreak", P.BREAK_USAGE.replace("break ", "tbreak "), "Set a temporary breakpoint: deleted when it first stops the run.",
            _tbreak, _break_arg, aliases=("tb",), args=("sub:step|module|if", "module", "sub:forward|backward|fail"),
            group="breakpoints", ranks="suffix"),
    Command("watch", P.WATCH_USAGE, """Stop when a recorded statistic of matching tensors crosses a value.
  watch grad conv*                          smoothed norm leaves [1/100, 50] x baseline
  watch grad *.weight norm > 1e3
  watch act fc3 zero_frac == 1 consecutive 3   all zero three steps in a row
  watch loss nan_count > 0
STAT is one of the recorded statistics (default norm; the loss's: mean, its value); OP one of > >= < <= == !=.
Without OP VALUE (the relative rule): the smoothed value, the median of the
last 3, is judged against a baseline that starts as the median of the first 3
and follows the smoothed value slowly (its log moves 1/20 of the way per step);
it holds outside [1/100, 50] x baseline, or at an inf.  A tensor whose starting
baseline is at most 1e-6 x the largest of its kind is numerically zero: named
once, and not judged against the band.
A watch hits when its condition has held K steps in a row (consecutive K,
default 1), then again only after it was false (edge-triggered, as in gdb);
"always" hits every K steps while it holds.
A trailing "fail" makes a hit fail the run (exit code 4).  Several ranks: on
every rank; a trailing "rank N" watches rank N only (the others stop with it).""",
            _watch, P.parse_watch, args=("kind", "tensor", "stat", "op"), group="breakpoints", ranks="suffix"),
    Command("condition", "condition N [EXPR]", "Stop at breakpoint N only if EXPR is true; no EXPR removes the condition.",
            _condition, _condition_arg, args=("point", "expr"), group="breakpoints", ranks="suffix"),
    Command("ignore", "ignore N COUNT", "Do not stop at breakpoint N the next COUNT times it is hit.",
            _ignore, _ignore_arg, args=("point",), group="breakpoints", ranks="suffix"),
    Command("commands", "commands [N]", """Give a breakpoint commands to run at each of its stops.
N defaults to the last one set; one command per line, ending with "end".  A first line "silent" stops
the usual message.  An empty list removes them.  A command that resumes the run ends the list;
after rs, goto or rc the rest of it runs in the past.  An error in a command ends the list (gdb: the
rest is not run, and the error line says so); the run goes on, in batch mode too.  Several ranks: on every rank (its breakpoint
N), or on rank R alone with "commands N rank R".""",
            _commands, _commands_arg, args=("point",), group="breakpoints", ranks="suffix"),
    Command("delete", "delete [N...] | delete checkpoint N",
            "Delete breakpoints/watchpoints N... (all if none are given), or a checkpoint.",
            _delete, _delete_arg, aliases=("d",), args=("point",), group="breakpoints", ranks="suffix"),
    Command("disable", "disable [N...]", "Disable breakpoints/watchpoints N... (all if none are given).",
            _disable, _numbers, aliases=("dis",), args=("point",), group="breakpoints", ranks="suffix"),
    Command("enable", "enable [N...]", "Enable breakpoints/watchpoints N... (all if none are given).",
            _enable, _numbers, aliases=("en",), args=("point",), group="breakpoints", ranks="suffix"),
]
