"""Lineage: which operations made a tensor (``lineage``), which used it
(``consumers``), ``catch nan|inf|nonfinite``, ``origin`` and ``graph``.
A step's lineage comes from the live recorder, the trace, or, asked after
the fact, a replica that replays the step with the recorder on."""
from __future__ import annotations

from ..errors import CommandError, UsageError
from ..run.paths import claim_output
from ..lineage.fetch import lineage_control, resolve_target, step_lineage
from ..debugger import evaluate as E
from ..debugger import points as P
from ..debugger.points import parse_int
from .table import Command

CATCH_USAGE = "catch nan|inf|nonfinite [--eager] [fail]"


def get_lineage(s, step: int, check: bool = False, resolve: tuple = ()):
    """(the step's lineage dict, {expr: tensor id or error}); replayed on a replica if need be."""
    from ..timetravel.lineage_replay import replay_lineage
    return step_lineage(s, step, lambda st, names: replay_lineage(s, s.machine, st, names), check, resolve)


def _target_arg(text: str) -> dict:
    words = text.split()
    out = {"depth": 6, "step": None, "target": None}
    rest = []
    while words:
        w = words.pop(0)
        if w in ("--depth", "--step"):
            if not words:
                raise CommandError(f"{w} needs a number")
            n = parse_int(words.pop(0), w[2:])
            if n < 0 or (w == "--depth" and n < 1):
                raise CommandError(f"bad {w[2:]} {n}")
            out[w[2:]] = n
        else:
            rest.append(w)
    if rest:
        out["target"] = " ".join(rest)
    return out


def _step_of(s, arg) -> int:
    if arg["step"] is not None:
        return arg["step"]
    cur = s.here.stop
    if cur is not None and not cur.at_step_end and cur.step is not None:
        return cur.step
    if s.last_step is None:
        raise CommandError("no step has finished yet")
    return s.last_step


def _resolve(s, arg):
    """(StepGraph, tensor id) of the target: a recorded name, else an expression."""
    def lineage(step, resolve=()):
        return get_lineage(s, step, resolve=resolve)

    def evaluate(expr):
        return E.evaluate(E.compile_expr(expr), s.frame, s.view.variables(s.frame))
    return resolve_target(s, _step_of(s, arg), arg["target"], lineage, None if s.frame is None else evaluate)


def _lineage(s, arg):
    lc = lineage_control(s)
    if arg["target"] in ("on", "off", "on --stats"):
        lc.always = arg["target"] != "off"
        lc.stats = arg["target"] == "on --stats"
        s.sync_hooks()
        return (f"Lineage is recorded from step {s.step_in_progress()} on ('lineage off' stops)."
                if lc.always else "Lineage recording is off (catch points still record while enabled).")
    if arg["target"] is None:
        raise CommandError("lineage what? (a name such as loss or fc1.weight, an expression, or on|off)")
    g, tid = _resolve(s, arg)
    return [f"lineage of {arg['target']} in step {g.step} (t{tid}{_last_of(g, tid)}):"] + \
        g.backward_trace(tid, arg["depth"])


def _last_of(g, tid: int) -> str:
    """', the last of 2 tensors of this name in the step: t272, t710' where the name is several
    (the loss of each backward() under gradient accumulation, whose sum is the step's loss; the
    output of each call of a module)."""
    same = g.namesakes(tid)
    if len(same) < 2 or tid != same[-1]:
        return ""
    shown = same if len(same) <= 6 else [*same[:5], None, same[-1]]
    listed = ", ".join("..." if t is None else f"t{t}" for t in shown)
    return f", the last of {len(same)} tensors of this name in the step: {listed}"


def _consumers(s, arg):
    if arg["target"] is None:
        raise CommandError("consumers of what? (a name or an expression)")
    g, tid = _resolve(s, arg)
    note = _last_of(g, tid)
    return [f"consumers of {arg['target']} in step {g.step}" + (f" (t{tid}{note})" if note else "") + ":"] + \
        g.consumer_trace(tid, arg["depth"])


def _catch_arg(text: str):
    words = text.split()
    fail = "fail" in words
    eager = "--eager" in words
    words = [w for w in words if w not in ("fail", "--eager")]
    if len(words) != 1 or words[0] not in ("nan", "inf", "nonfinite"):
        raise CommandError("catch what? (nan, inf or nonfinite)", CATCH_USAGE)
    return words[0], eager, fail


def _catch(s, arg):
    kind, eager, fail = arg
    lc = lineage_control(s)
    p = s.points.add(P.CatchPoint, {"what_kind": kind, "eager": eager}, fail=fail)
    if lc.eager():
        how = "every operation's output is checked while it is enabled"
        if not eager:
            how += " (no step can be replayed here" + (": --replica off" if s.machine is not None and
                                                        s.machine.mode == "off" and s.replica is None else "") + ")"
    else:
        how = ("each step's NaN/Inf counts are checked; a step that went non-finite is replayed to find the "
               "operation, and the run stops at that step's end ('--eager' stops inside the operation)")
    return f"Catchpoint {p.number}: {p.what()} ({how})"


def _origin(s, name):
    if not name:
        raise CommandError("origin needs a parameter name")
    from ..lineage.origin import origin
    if s.rec is None:
        raise CommandError("The program is not being run.")
    return origin(s, name, lambda step, check: get_lineage(s, step, check=check)[0])


def _graph_arg(text: str) -> dict:
    words = text.split()
    out = {"ops": False, "step": None, "dot": None}
    while words:
        w = words.pop(0)
        if w == "--ops":
            out["ops"] = True
        elif w in ("--step", "--dot") and words:
            v = words.pop(0)
            out[w[2:]] = parse_int(v, "the step") if w == "--step" else v
        else:
            raise CommandError(f"unexpected '{w}'", "graph [--ops] [--step N] [--dot FILE]")
    return out


def _graph(s, arg):
    from ..lineage.graph import StepGraph
    step = _step_of(s, arg)
    g = StepGraph(get_lineage(s, step)[0])
    if arg["dot"]:
        try:
            claim_output(arg["dot"], "--dot", "dot")
        except UsageError as e:
            raise CommandError(str(e)) from None
        try:
            with open(arg["dot"], "w") as fh:
                fh.write(g.dot(arg["ops"]))
        except OSError as e:
            raise CommandError(f"cannot write {arg['dot']}: {e.strerror or e}") from None
        return f"Wrote the {'op' if arg['ops'] else 'module'} graph of step {step} to {arg['dot']}."
    return g.op_graph() if arg["ops"] else g.module_graph()


COMMANDS = [
    Command("lineage", "lineage on [--stats]|off  |  lineage NAME|EXPR [--depth D] [--step N]",
            """Show which operations made a tensor, down to parameters and the batch.
NAME is a recorded name (loss, a parameter, a module: its output, t12); EXPR a
tensor in the script's frame.  A step whose lineage was not recorded is
replayed on a replica with the op recorder on.  'lineage on' records every
step from now ('off' stops), with --stats every op's output statistics too;
--lineage STEPS records chosen steps.""",
            _lineage, _target_arg, args=("sub:on|off", "tensor"), group="lineage"),
    Command("consumers", "consumers NAME|EXPR [--depth D] [--step N]",
            "Show the operations that used a tensor, and theirs (lineage's forward direction).",
            _consumers, _target_arg, args=("tensor",), group="lineage"),
    Command("catch", CATCH_USAGE, """Stop at the first operation whose output is not finite while its inputs were.
Forward, backward or the optimizer's; 'nan' stops where a NaN appears and names
the operation that made the Inf behind it, if any (an Inf from an earlier
step: the operation that made the run's first Inf that lasted).  Reports the operation,
module, source line and the statistics of its inputs (and of the NaN's
operation's, each input saying where its NaN/Inf began).  Cheap enough to leave on:
each step's recorded NaN/Inf counts are checked, a step that went bad is
replayed on a replica with every operation checked, and the run stops at
the end of that step.  --eager checks every operation as the run goes and
stops inside the operation (as it does anyway in the past and with
--replica off).""",
            _catch, _catch_arg, args=("sub:nan|inf|nonfinite",), group="lineage", ranks="suffix"),
    Command("origin", "origin NAME", """Trace a non-finite parameter back to where it came from.
The step whose update introduced it, the gradient that carried it, and the
operation of that step's backward pass where the gradient first went bad.""",
            _origin, args=("tensor",), group="lineage"),
    Command("graph", "graph [--ops] [--step N] [--dot FILE]",
            "Show a step's module graph (or, with --ops, its operations), as text or Graphviz dot.",
            _graph, _graph_arg, args=("sub:--ops|--step|--dot",), group="lineage"),
]
