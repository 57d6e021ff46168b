"""Lineage: which operations made a tensor (``lineage``), which used it
(``consumers``), ``catch nan|inf|nonfinite``, ``origin`` and ``graph``.
A step's lineage comes from the live recorder, the trace, or, asked after
the fact, a replica that replays the step with the recorder on."""
from __future__ import annotations

from ...errors import CommandError, TraceError
from .. import evaluate as E
from .. import points as P
from ..points import parse_int
from .table import Command

CATCH_USAGE = "catch nan|inf|nonfinite [fail]"


def _control(s):
    if s.lineage is None:
        raise CommandError("lineage is not available in this session")
    return s.lineage


def _recorded(s, step: int, whole: bool = True):
    """The step's lineage in the trace (flushed or not), None if it has none;
    ``whole=False``: only whether it has one (its JSON is not read)."""
    if s.rec is None:
        return None
    try:
        with s.trace_reader() as reader:
            if not whole:
                return step in reader.lineage_steps() or None
            data = reader.lineage(step)
    except TraceError:
        return None
    if data is not None:
        data.pop("step", None)
    return data


def get_lineage(s, step: int, check: bool = False, resolve: tuple = ()):
    """(the step's lineage dict, {expr: tensor id or error})."""
    lc = _control(s)
    if not resolve:
        data = lc.live(step)
        if data is None:
            data = _recorded(s, step)
        if data is not None and (not check or data.get("checked", True)):
            return dict(data, step=step), {}
    if s.machine is None or s.rec is None:
        raise CommandError(f"step {step} has no recorded lineage and time travel is off")
    if s.last_step is None or step > s.last_step:
        raise CommandError(f"step {step} has not finished yet")
    res = s.machine.replay(s, {"kind": "scan", "from": step, "end": step, "lineage": [step],
                               "resolve": list(resolve)}, step - 1)
    data = res["result"]["lineage"].get(str(step))
    if data is None:
        raise CommandError(f"the replay of step {step} recorded no lineage ({res.get('ended') or 'no step'})")
    if not _recorded(s, step, whole=False):
        s.rec.writer.lineage(step, data)
    return dict(data, step=step), res["result"].get("resolved", {})


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
    cur = s.current
    if cur is not None and not cur.at_step_end and cur.step is not None:
        return cur.step
    if s.last_step is None:
        raise CommandError("no step has finished yet")
    return s.last_step


def _resolve(s, arg):
    """(StepGraph, tensor id) of the target: a recorded name, else an expression."""
    from ...lineage.graph import StepGraph
    step = _step_of(s, arg)
    target = arg["target"]
    try:
        data, _ = get_lineage(s, step)
        g = StepGraph(data)
        tid = g.resolve(target)
        if tid is not None:
            return g, tid
    except CommandError:
        if s.frame is None:
            raise
        g = None
    if s.frame is None:
        raise CommandError(f"no tensor named '{target}' in step {step}'s lineage")
    value = E.evaluate(E.compile_expr(target), s.frame, s.variables(s.frame))
    tid = s.lineage.find(value, step) if s.lineage is not None else None
    if tid is not None and g is not None:
        return g, tid
    data, resolved = get_lineage(s, step, resolve=(target,))
    r = resolved.get(target)
    if not isinstance(r, int):
        names = ", ".join(StepGraph(data).names()[:8])
        raise CommandError(r or f"'{target}' is neither a recorded name ({names}) nor a tensor of step {step}")
    return StepGraph(data), r


def _lineage(s, arg):
    lc = _control(s)
    if arg["target"] in ("on", "off", "on --stats"):
        lc.always = arg["target"] != "off"
        lc.stats = arg["target"] == "on --stats"
        s.sync_hooks()
        return (f"Lineage is recorded from step {s._step_in_progress()} on ('lineage off' stops)."
                if lc.always else "Lineage recording is off (catch points still record while enabled).")
    if arg["target"] is None:
        raise CommandError("lineage what? (a name such as loss or fc1.weight, an expression, or on|off)")
    g, tid = _resolve(s, arg)
    return [f"lineage of {arg['target']} in step {g.step} (t{tid}):"] + g.backward_trace(tid, arg["depth"])


def _consumers(s, arg):
    if arg["target"] is None:
        raise CommandError("consumers of what? (a name or an expression)")
    g, tid = _resolve(s, arg)
    return [f"consumers of {arg['target']} in step {g.step}:"] + g.consumer_trace(tid, arg["depth"])


def _catch_arg(text: str):
    words = text.split()
    fail = bool(words) and words[-1] == "fail"
    if fail:
        words = words[:-1]
    if len(words) != 1 or words[0] not in ("nan", "inf", "nonfinite"):
        raise CommandError("catch what? (nan, inf or nonfinite)", CATCH_USAGE)
    return words[0], fail


def _catch(s, arg):
    kind, fail = arg
    _control(s)
    p = s.add_point(P.CatchPoint, {"what_kind": kind}, fail=fail)
    return f"Catchpoint {p.number}: {p.what()} (every operation's output is checked while it is enabled)"


def _origin(s, name):
    if not name:
        raise CommandError("origin needs a parameter name")
    from ...lineage.origin import origin
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
    from ...lineage.graph import StepGraph
    step = _step_of(s, arg)
    g = StepGraph(get_lineage(s, step)[0])
    if arg["dot"]:
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
the operation that made the Inf behind it, if any.  Reports the operation,
module, source line and the inputs' statistics.""",
            _catch, _catch_arg, args=("sub:nan|inf|nonfinite",), group="lineage"),
    Command("origin", "origin NAME", """Trace a non-finite parameter back to where it came from.
The step whose update introduced it, the gradient that carried it, and the
operation of that step's backward pass where the gradient first went bad.""",
            _origin, args=("tensor",), group="lineage"),
    Command("graph", "graph [--ops] [--step N] [--dot FILE]",
            "Show a step's module graph (or, with --ops, its operations), as text or Graphviz dot.",
            _graph, _graph_arg, args=("sub:--ops|--step|--dot",), group="lineage"),
]
