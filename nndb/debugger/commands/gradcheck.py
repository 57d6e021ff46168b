"""``gradcheck [MODULE [EXPR]]``: compare a module's analytic gradients with
numerical ones, on its input, in float64, on a deep copy of the module.

The input: with no EXPR, the one the run is stopped on -- a stop in that
module's forward (``break module NAME``, the start stop, or ``step``) has it
as ``$inputs``; with EXPR, EXPR's value in the current frame (a tensor or a
tuple of the forward's positional arguments).  A temporary forward hook
would need the run to go on to the module's next call, so the command asks
for a stop there instead: simpler, and the input is exactly the one the
user is looking at.

What is checked: the derivatives of the module's floating outputs with
respect to its floating inputs and its parameters, through a float64 deep
copy (``torch.func.functional_call``), so the live module, its gradients and
the global RNG are never touched; dropout sees the same mask in every
evaluation (the RNG is forked and seeded per call).  The verdict is
``torch.autograd.gradcheck`` (eps 1e-6, atol 1e-5, rtol 1e-3; its fast mode
above FULL_LIMIT elements) together with the central differences nndb takes
itself on up to SAMPLED elements (all of them for a small module), which
give the max abs/rel error shown.
"""
from __future__ import annotations

import contextlib
import copy

from ...errors import CommandError
from .. import evaluate as E
from .table import Command

EPS, ATOL, RTOL = 1e-6, 1e-5, 1e-3
FULL_LIMIT = 300        # elements (inputs + parameters) up to which gradcheck compares every one
SAMPLED = 64            # elements nndb differentiates numerically itself for the error figures


def _arg(text: str):
    name, _, expr = text.strip().partition(" ")
    return (name or None), expr.strip(), (E.compile_expr(expr) if expr.strip() else None)


def _module(s, name):
    cur = s.current
    here = cur is not None and cur.module is not None and cur.phase == "forward" and s._module is not None
    if name is None:
        if not here:
            raise CommandError("gradcheck which module? (stop in a module's forward, or name one: gradcheck NAME)")
        return cur.module, s._module
    if here and cur.module == name:
        return name, s._module
    for root in s.roots():
        for _, m in root.named_modules():
            if s.module_name(m) == name:
                return name, m
    raise CommandError(f"no module named '{name}' ('info modules' lists them)")


def _inputs(s, name, code):
    if code is not None:
        value = E.evaluate(code, s.frame, s.variables(s.frame))
        return value if isinstance(value, tuple) else (value,)
    cur = s.current
    if cur is not None and cur.module == name and cur.phase == "forward" and isinstance(s._payload, tuple):
        return s._payload
    raise CommandError(f"no input for {name}: stop in its forward first ('break module {name}', then "
                       f"'continue'), or give one: gradcheck {name} EXPR")


def _gradcheck(s, arg):
    name, _, code = arg
    if s.rec is None:
        raise CommandError("The program is not being run.")
    name, module = _module(s, name)
    inputs = _inputs(s, name, code)
    with _tracer_quiet(s.rec.tracer):
        result = gradcheck_module(module, inputs)
    verdict = "PASS" if result["ok"] else "FAIL"
    fast = ", fast mode" if result["fast_mode"] else ""
    return (f"gradcheck {name} ({type(module).__name__}, float64 copy): {verdict}: max abs error "
            f"{result['max_abs']:.3g}, max rel error {result['max_rel']:.3g} over {result['sampled']} of "
            f"{result['elements']} input/parameter element(s); torch.autograd.gradcheck "
            f"{'passed' if result['gradcheck'] else 'failed'} (eps {EPS:g}, atol {ATOL:g}, rtol {RTOL:g}{fast})")


@contextlib.contextmanager
def _tracer_quiet(tracer):
    """The copy's thousands of forward calls are not the run's: the tracer's
    hooks pass them by (its re-entrancy guard), and its module nesting depth,
    which their post hooks count down, is put back afterwards."""
    saved = tracer._in_hook, tracer._module_depth
    tracer._in_hook = True
    try:
        yield
    finally:
        tracer._in_hook, tracer._module_depth = saved


def gradcheck_module(module, inputs: tuple) -> dict:
    """The comparison, as data: ok, gradcheck, max_abs, max_rel, sampled, elements, fast_mode."""
    import torch
    from torch.utils import _pytree as pytree
    try:
        replica = copy.deepcopy(module).double()
    except Exception as e:
        raise CommandError(f"cannot copy the module: {type(e).__name__}: {e}") from None
    leaves, spec = pytree.tree_flatten(tuple(inputs))
    floating = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    leaves = [t.detach().to(torch.float64) if i in floating else t for i, t in enumerate(leaves)]
    pnames = [n for n, p in replica.named_parameters() if p.requires_grad]
    params = dict(replica.named_parameters())
    diff = [leaves[i].clone().requires_grad_(True) for i in floating] + \
        [params[n].detach().clone().requires_grad_(True) for n in pnames]
    if not diff:
        raise CommandError("nothing to differentiate: the module has no floating input and no trainable parameter")
    k = len(floating)

    def f(*xs):
        args = list(leaves)
        for i, x in zip(floating, xs[:k]):
            args[i] = x
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            out = torch.func.functional_call(replica, dict(zip(pnames, xs[k:])), tuple(pytree.tree_unflatten(args, spec)))
        return tuple(t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point())

    try:
        with torch.enable_grad():
            outs = f(*diff)
        if not any(t.requires_grad for t in outs):
            raise CommandError("the module's output does not depend differentiably on its input or parameters")
        elements = sum(t.numel() for t in diff)
        fast = elements > FULL_LIMIT
        passed = torch.autograd.gradcheck(f, tuple(diff), eps=EPS, atol=ATOL, rtol=RTOL, raise_exception=False,
                                          fast_mode=fast, check_undefined_grad=False)
        errors = _sampled_errors(f, diff, outs)
    except CommandError:
        raise
    except Exception as e:
        raise CommandError(f"the module raised in the check: {type(e).__name__}: {e}") from None
    return {"ok": bool(passed) and errors["ok"], "gradcheck": bool(passed), "fast_mode": fast,
            "elements": elements, **errors}


def _sampled_errors(f, diff, outs) -> dict:
    """Central differences of a fixed random projection of the outputs, on up
    to SAMPLED elements, against its analytic gradient."""
    import torch
    g = torch.Generator().manual_seed(0)
    proj = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in outs]

    def scalar(outputs):
        return sum((o * v).sum() for o, v in zip(outputs, proj))

    grads = torch.autograd.grad(scalar(outs), diff, allow_unused=True)
    coords = [(j, i) for j, t in enumerate(diff) for i in range(t.numel())]
    if len(coords) > SAMPLED:
        pick = torch.randperm(len(coords), generator=g)[:SAMPLED].tolist()
        coords = [coords[i] for i in sorted(pick)]
    max_abs = max_rel = 0.0
    ok = True
    with torch.no_grad():
        for j, i in coords:
            flat = diff[j].view(-1)
            orig = float(flat[i])
            flat[i] = orig + EPS
            up = float(scalar(f(*diff)))
            flat[i] = orig - EPS
            down = float(scalar(f(*diff)))
            flat[i] = orig
            num = (up - down) / (2 * EPS)
            ana = float(grads[j].reshape(-1)[i]) if grads[j] is not None else 0.0
            err = abs(ana - num)
            max_abs = max(max_abs, err)
            scale = max(abs(ana), abs(num))
            if scale > 1e-8:
                max_rel = max(max_rel, err / scale)
            ok = ok and err <= ATOL + RTOL * abs(num)
    return {"ok": ok, "max_abs": max_abs, "max_rel": max_rel, "sampled": len(coords)}


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
