"""Whole tensors over time and their distributions: ``record full`` (which
tensors the run keeps whole from now on) and ``compare`` (two histograms of
one series from the trace).  The data is nndb.store.distributions'; the rules
nndb.tracer.fulltensors'."""
from __future__ import annotations

from ..errors import CommandError, NndbError
from ..schema import FULL_KINDS
from ..debugger import points as P
from .table import Command, PictureFile


def _record_arg(text: str):
    words = text.split()
    if not words or words[0] != "full":
        raise CommandError("record takes 'full': record full KIND GLOB [--every N] [--precision P] | record full off")
    words = words[1:]
    if not words:
        return ("list",)
    if words == ["off"]:
        return ("off",)
    every = precision = None
    rest = []
    i = 0
    while i < len(words):
        w = words[i]
        if w in ("--every", "--precision"):
            if i + 1 >= len(words):
                raise CommandError(f"{w} needs a value")
            if w == "--every":
                every = P.parse_int(words[i + 1], "--every")
            else:
                precision = words[i + 1]
            i += 2
            continue
        rest.append(w)
        i += 1
    if len(rest) != 2:
        raise CommandError("record full KIND GLOB [--every N] [--precision fp16|bf16|fp32]")
    from ..tracer.fulltensors import parse_rule
    try:
        rule = parse_rule(f"{rest[0]}:{rest[1]}", every, precision)
    except NndbError as e:
        raise CommandError(str(e).replace("--record-full ", "")) from None
    return ("add", rule)


def _record(s, arg):
    rec = s.rec
    if rec is None or not s.live:
        raise CommandError("The program is not being run.")
    ft = rec.recorder.fulltensors
    if ft is None:
        raise CommandError("this run cannot keep whole tensors")
    if arg[0] == "off":
        n = len(ft.rules)
        ft.set_rules([])
        return f"Whole tensors: no longer kept ({n} rule(s) removed); the trace keeps those written."
    if arg[0] == "add":
        ft.set_rules(ft.rules + [arg[1]])
        cur = s.here.stop
        if cur is None or cur.at_step_end:
            # (the module hooks go in or out only at a step boundary: never while a forward runs them)
            rec.tracer.sync_forward()
    if not ft.rules:
        return "Whole tensors: none kept (record full KIND GLOB)."
    lines = ["Whole tensors kept from now on:" if arg[0] == "add" else "Whole tensors kept:"]
    lines += [f"  {r.describe()}" for r in ft.rules]
    lines.append(f"  ({ft.kept} kept so far; stored in the trace, read back with p $full['NAME', STEP])")
    return lines


def _compare_arg(text: str):
    words = text.split()
    png = None
    if "--png" in words:
        i = words.index("--png")
        if i + 1 >= len(words):
            raise CommandError("--png needs a file name")
        png = words[i + 1]
        del words[i:i + 2]
    checkpoints = None
    if "--checkpoints" in words:
        i = words.index("--checkpoints")
        if i + 1 >= len(words):
            raise CommandError("--checkpoints needs K")
        checkpoints = P.parse_int(words[i + 1], "--checkpoints")
        del words[i:i + 2]
    from ..store.distributions import parse_kind
    try:
        kind = parse_kind(words[0]) if words else None
    except NndbError as e:
        raise CommandError(str(e)) from None
    if kind is None or len(words) < 2:
        raise CommandError("compare KIND NAME STEP_A STEP_B | compare KIND NAME --checkpoints K")
    name = words[1]
    if checkpoints is not None:
        if len(words) != 2:
            raise CommandError("compare KIND NAME --checkpoints K takes no steps")
        return kind, name, None, checkpoints, png
    if len(words) != 4:
        raise CommandError("compare KIND NAME STEP_A STEP_B")
    return kind, name, (P.parse_int(words[2], "STEP_A"), P.parse_int(words[3], "STEP_B")), None, png


def _checkpoint_steps(s) -> list:
    m = s.machine
    if m is None or m.mode == "off":
        raise CommandError("there are no checkpoints in this run (time travel is off)")
    from ..timetravel.inventory import checkpoint_inventory
    steps = {i.step for i in checkpoint_inventory(m)} | {step for step, _ in m.disk_files}
    return sorted(x for x in steps if x is not None)


def _measure(s, plan: dict) -> dict:
    """The histograms the trace lacks at checkpoints, measured on replicas
    (nndb.timetravel.measure); from the live run only."""
    if not plan["missing"]:
        return {}
    if s.machine.replica or not s.live:
        why = "not measured here: only the live run measures on replicas ('present' first)"
        return {c: {"error": why} for c in plan["missing"]}
    from ..timetravel.measure import histograms_at
    return histograms_at(s, s.machine, plan["kind"], plan["name"], plan["missing"])


def _compare(s, arg):
    kind, name, steps, k, png = arg
    from ..store import distributions as D
    from ..render.distributions import compare as render
    if not s.log.trace_path:
        raise CommandError("no trace yet: nothing has been recorded")
    try:
        with s.view.trace_reader() as reader:
            if steps is not None:
                data = D.compare(reader, kind, name, *steps)
            else:
                plan = D.checkpoint_plan(reader, kind, name, _checkpoint_steps(s), k)
        if steps is None:
            data = D.at_checkpoints(plan, _measure(s, plan))
        out = [render(data)]
        if png:
            from ..extras import require
            from ..render.plot import draw_compare
            require("plot", "compare --png")
            out.append(PictureFile(draw_compare(data, png)))
    except NndbError as e:
        raise CommandError(str(e)) from None
    return out


COMMANDS = [
    Command("record", "record full KIND GLOB [--every N] [--precision fp16|bf16|fp32] | record full off",
            f"""Keep whole tensors in the trace from the step in progress on.
KIND is one of {', '.join(FULL_KINDS)}; GLOB matches names (conv*).  A gradient is
copied at its optimizer's step() (after backward, before the update), a
parameter at step()'s return, an activation at its module's forward; without
an optimizer, a gradient at the backward() that ends the step, a parameter
after the hand-written update.
fp16 (default) keeps a per-tensor scale; a tensor it cannot hold within its
stated error is stored wider (docs/trace-format.md).  'record full' lists the
rules; 'record full off' stops; read back with p $full['NAME', STEP].""",
            _record, _record_arg, args=("sub:full", "kind", "tensor"), group="data"),
    Command("compare", "compare KIND NAME STEP_A STEP_B [--png FILE] | compare KIND NAME --checkpoints K",
            """Compare one tensor's distribution at two steps (its histograms in the trace).
Histograms are taken at full steps (--full-every).  Shows approximate
quantiles (with their bins), the share of zeros, NaN/Inf counts, the
Kolmogorov-Smirnov statistic and a histogram; --png FILE draws it.
--checkpoints K: the last K checkpoints, the first and last compared: the
histogram in the trace at a checkpoint's step (a full step), else one
measured on a replica resumed from the checkpoint, from the step after it
(the live run is not touched).""",
            _compare, _compare_arg, args=("kind", "tensor"), group="data"),
]
