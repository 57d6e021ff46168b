"""What the tracer finds in the process rather than being told: the
optimizers it holds, and what a running backward differentiates (the
step's loss), read from the autograd engine's Python frame."""
from __future__ import annotations

import gc
import sys

import torch

from .recorder import unscaled


def backward_objective(roots: list, grads) -> list:
    """The tensors a backward differentiates, as the step's loss: one root as
    it is, but a scalar one given a scalar gradient other than 1 times it
    (WGAN's ``errD_real.backward(mone)``: -errD_real, the objective whose
    gradient the engine computes); several scalar roots
    (``torch.autograd.backward([l1, l2])``) as the one objective they make,
    sum of gradient_i x root_i (l1 + l2, as the script would write it); else
    the first root (no scalar objective).  A root a GradScaler scaled counts as
    the loss it scaled (``scaler.scale([l1, l2])``: l1 + l2, not that times
    the scale; one root stays as it is, which the recorder reads so)."""
    if len(roots) < 2:
        if roots and isinstance(grads, (tuple, list)) and len(grads) == 1:
            grads = grads[0]
        r = roots[0] if roots else None
        if isinstance(grads, torch.Tensor) and isinstance(r, torch.Tensor) and grads.numel() == 1 \
                and r.numel() == 1 and not bool(grads == 1):
            with torch.no_grad():
                return [(unscaled(r).detach() * grads).to(r.dtype)]
        return roots
    if not isinstance(grads, (tuple, list)) or len(grads) != len(roots) or \
            not all(isinstance(t, torch.Tensor) and t.numel() == 1 for t in (*roots, *grads)):
        return roots[:1]
    total = None
    with torch.no_grad():
        for r, g in zip(roots, grads):
            r = unscaled(r)
            term = r.detach() if bool(g == 1) else r.detach() * g
            total = term if total is None else total + term
    return [total]


def _subclasses(cls) -> set:
    out, todo = {cls}, [cls]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in out:
                out.add(sub)
                todo.append(sub)
    return out


def find_optimizers() -> list:
    """The torch.optim.Optimizer objects the process holds.  Instances of
    Python classes refer to their class, so one C-level referrer scan finds
    them; it is slow (docs/performance.md), so the tracer does it about once
    per run, when the step clock must choose how steps end."""
    classes = _subclasses(torch.optim.Optimizer)
    return [o for o in gc.get_referrers(*classes) if type(o) in classes]


def fires_step_hooks(opt) -> bool:
    """Does ``opt.step()`` run torch's optimizer step hooks (the global ones nndb's step clock
    listens to)?  ``Optimizer.__init__`` wraps its class's ``step`` so (marking it ``hooked``); a
    subclass that never runs it (a wrapper holding the script's optimizer: accelerate's
    AcceleratedOptimizer) steps unseen, through what it holds."""
    return bool(getattr(getattr(type(opt), "step", None), "hooked", False))


def _engine_outputs(frame, depth: int):
    """``t_outputs`` of the ``_engine_run_backward`` frame at or above ``frame``."""
    for _ in range(depth):
        if frame is None:
            return None
        if frame.f_code.co_name == "_engine_run_backward":      # (several roots: their one objective)
            loc = frame.f_locals
            return backward_objective(list(loc.get("t_outputs") or ()), (loc.get("args") or ((),))[0])
        frame = frame.f_back
    return None


def backward_roots():
    """The tensors the running backward() differentiates, from the engine's frame."""
    outs = _engine_outputs(sys._getframe(1), 40)
    if outs is not None:
        return outs
    # Device threads run the callback without the caller's frames; the caller
    # is blocked in run_backward in some other thread.
    for frame in sys._current_frames().values():
        outs = _engine_outputs(frame, 60)
        if outs is not None:
            return outs
    return []


_MODULE_FILE = torch.nn.modules.module.__file__


class CallArgs(tuple):
    """A root module call's inputs as the ``root`` listeners see them: the positional ones, then
    the values of those given by keyword, whose names ``keywords`` holds (in the call's order), so
    that a listener calling the module again passes each as the script did
    (``model(input_ids=x, labels=y)``: ``labels`` is no positional argument of its forward)."""
    keywords: tuple = ()


def call_args(args: tuple, kw: dict) -> tuple:
    """``args``, then ``kw``'s values, as a CallArgs naming them (``args`` itself without any)."""
    if not kw:
        return args
    out = CallArgs(args + tuple(kw.values()))
    out.keywords = tuple(kw)
    return out


def split_call(args: tuple, keywords: tuple) -> tuple:
    """(positional, keyword dict) of a call's inputs as CallArgs listed them."""
    n = len(args) - len(keywords)
    return tuple(args[:n]), dict(zip(keywords, args[n:]))


def call_kwargs(depth: int = 2) -> dict:
    """The keyword arguments of the module call whose global forward pre-hook is running
    (``depth``: frames up from the caller to torch's call): a model called as
    ``model(input_ids=..., labels=...)`` (every Hugging Face model) passes its batch so, and
    a global hook is given the positional ones alone.  {} where the frame is not torch's."""
    try:
        f = sys._getframe(depth)
        if f.f_code.co_filename == _MODULE_FILE:
            kw = f.f_locals.get("kwargs")
            return kw if isinstance(kw, dict) else {}
    except Exception:
        pass
    return {}
