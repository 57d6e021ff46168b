"""``gradcheck [MODULE [EXPR]]``: compare a module's analytic gradients with
numerical ones, on its input, in float64, on a deep copy of the module.

The input: with no EXPR, the one the run is stopped on -- a stop in that
module's forward (``break module NAME``, the start stop, or ``step``) has it
as ``$inputs``; with EXPR, EXPR's value in the current frame (a tensor or a
tuple of the forward's positional arguments).  A temporary forward hook
would need the run to go on to the module's next call, so the command asks
for a stop there instead: simpler, and the input is exactly the one the
user is looking at.

The check itself, as data, is nndb.check.gradcheck's; this command finds the
module and its input at the stop and words the verdict.
"""
from __future__ import annotations

from ..errors import CommandError
from ..debugger import evaluate as E
from .table import Command


def _arg(text: str):
    name, _, expr = text.strip().partition(" ")
    return (name or None), expr.strip(), (E.compile_expr(expr) if expr.strip() else None)


def _module(s, name):
    cur = s.here.stop
    here = cur is not None and cur.module is not None and cur.phase == "forward" and s.here.module is not None
    if name is None:
        if not here:
            raise CommandError("gradcheck which module? (stop in a module's forward, or name one: gradcheck NAME)")
        return cur.module, s.here.module
    if here and cur.module == name:
        return name, s.here.module
    for root in s.view.roots():
        for _, m in root.named_modules():
            if s.view.module_name(m) == name:
                return name, m
    raise CommandError(f"no module named '{name}' ('info modules' lists them)")


def _inputs(s, name, code):
    if code is not None:
        value = E.evaluate(code, s.frame, s.view.variables(s.frame))
        return value if isinstance(value, tuple) else (value,)
    cur = s.here.stop
    if cur is not None and cur.module == name and cur.phase == "forward" and isinstance(s.here.payload, tuple):
        return s.here.payload
    raise CommandError(f"no input for {name}: stop in its forward first ('break module {name}', then "
                       f"'continue'), or give one: gradcheck {name} EXPR")


def _gradcheck(s, arg):
    name, _, code = arg
    if s.rec is None:
        raise CommandError("The program is not being run.")
    from ..check.gradcheck import ATOL, EPS, RTOL, gradcheck_module, tracer_quiet   # (nndb.check loads its runner)
    name, module = _module(s, name)
    inputs = _inputs(s, name, code)
    with tracer_quiet(s.rec.tracer):
        result = gradcheck_module(module, inputs)
    verdict = "PASS" if result["ok"] else "FAIL"
    fast = ", fast mode" if result["fast_mode"] else ""
    return (f"gradcheck {name} ({type(module).__name__}, float64 copy): {verdict}: max abs error "
            f"{result['max_abs']:.3g}, max rel error {result['max_rel']:.3g} over {result['sampled']} of "
            f"{result['elements']} input/parameter element(s); torch.autograd.gradcheck "
            f"{'passed' if result['gradcheck'] else 'failed'} (eps {EPS:g}, atol {ATOL:g}, rtol {RTOL:g}{fast})")


COMMANDS = [
    Command("gradcheck", "gradcheck [MODULE [EXPR]]", """Compare MODULE's analytic gradients with numerical ones.
On a float64 deep copy (the live module is never touched), with respect to
its floating inputs and its parameters, by torch.autograd.gradcheck and
nndb's own central differences; prints PASS/FAIL and the max abs/rel error.
The input: the one the run is stopped on in MODULE's forward ($inputs; break
module MODULE, then continue), or EXPR's value (a tensor or a tuple of
arguments).  With no MODULE: the module the run is stopped in.""",
            _gradcheck, _arg, args=("module", "expr"), group="data"),
]
