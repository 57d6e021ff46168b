"""The numerical gradient check behind ``gradcheck [MODULE [EXPR]]``: a
module's analytic gradients against numerical ones, on given inputs, in
float64, on a deep copy of the module.

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

from ..errors import CommandError

EPS, ATOL, RTOL = 1e-6, 1e-5, 1e-3
FULL_LIMIT = 300        # elements (inputs + parameters) up to which gradcheck compares every one
SAMPLED = 64            # elements nndb differentiates numerically itself for the error figures


@contextlib.contextmanager
def tracer_quiet(tracer):
    """The copy's thousands of forward calls are not the run's: the tracer's
    hooks pass them by (its re-entrancy guard), and its module nesting depth,
    which their post hooks count down, is put back afterwards."""
    saved = tracer.in_hook, tracer.module_depth
    tracer.in_hook = True
    try:
        yield
    finally:
        tracer.in_hook, tracer.module_depth = saved


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
        errors = sampled_errors(f, diff, outs)
    except CommandError:
        raise
    except Exception as e:
        raise CommandError(f"the module raised in the check: {type(e).__name__}: {e}") from None
    return {"ok": bool(passed) and errors["ok"], "gradcheck": bool(passed), "fast_mode": fast,
            "elements": elements, **errors}


def sampled_errors(f, diff, outs) -> dict:
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
