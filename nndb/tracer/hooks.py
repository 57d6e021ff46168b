"""Thin hooks that feed the step clock and the recorder.

Everything is installed through PyTorch's own global hooks and removed on
``uninstall``: module forward pre/post hooks (module call nesting, roots,
activations), optimizer step pre/post hooks (step boundaries, parameters),
and the end of each ``backward()`` with its loss, seen two ways:

* while the step clock has not met an optimizer (the first backward, and
  hand-written updates, where "a backward that reaches a parameter" ends a
  step): per-parameter post-accumulate-grad hooks plus an autograd-engine
  callback, the loss being the root tensors that the engine was asked to
  differentiate, read from the ``_engine_run_backward`` frame on the stack;
  a backward they did not see (it reached no parameter the run has named:
  modules called through ``.forward()``, which no module hook sees) is taken
  by the wrapper below where an optimizer exists (its first step names them);
* from the first optimizer step on: one wrapper around
  ``torch.autograd.backward`` (what ``Tensor.backward`` calls), which hands
  on its roots after the original returns: one call a backward, whatever
  the number of parameters (the per-parameter hooks were one call each, 53
  a step on a small GPT; issue 43).  A backward run inside a backward
  (reentrant checkpointing) is the outer one's.  The wrapper is the one
  thing nndb puts in place of a torch function (from ``install`` on); it
  calls the original with the same arguments and returns what it returns,
  and is put back when the last tracer uninstalls.

The module hooks are in only for the steps that need them (``sync_forward``).

A hook never raises into the user's program: an error inside nndb is
reported once on stderr and recording stops; training goes on untouched.

Why this size: one class, the Tracer, whose hooks read one another's state
(a backward pending, the module depth, the optimizers seen, which way a
backward is seen), and the backward wrapper that feeds it; split, each half
would reach into the other's.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
import time
import traceback
import types
import warnings
import weakref
from typing import Callable, Optional

import torch
from torch.autograd import Variable
from torch.nn.modules import module as _module
from torch.optim import optimizer as _optimizer

from .compiled import never_compiled
from .funcmode import hide as _hide_watches, show as _show_watches
from .quiet import PROFILING as _PROFILING, profiled, unprofiled
from .naming import Naming, user_frame
from .discover import backward_objective, backward_roots, call_args, call_kwargs, find_optimizers  # noqa: F401  (find_optimizers: queries)
from .discover import fires_step_hooks
from .bucket import _PENDING_LOSS
from .recorder import GRAD_OF_INPUTS, SCALED_NODES, UNSCALED, StepRecorder, float_tensors
from .stepclock import Close, Mode, StepClock, call_site
from .within import WithinStep


_ACTIVE: "weakref.WeakSet" = weakref.WeakSet()
# The tracers that see backward() through the wrapper (their parameter hooks are off).
_BY_WRAPPER: list = []
_ORIGINAL_BACKWARD = None        # torch.autograd.backward, while the wrapper is in its place
_ORIGINAL_GRAD = None            # torch.autograd.grad, while its wrapper (_grad) is in its place
_IN_WRAPPER: set = set()         # the threads inside it
_IN_GRAD: set = set()            # the threads inside _grad's call of the original
_CLIPPING: list = []             # the tracers that see clip_grad_norm_ (_clip_grad_norm_)
_ORIGINALS: dict = {}            # torch's clip_grad_norm_ and clip_grads_with_norm_, while nndb's wrappers are in place
_SCALER_ORIGINALS: dict = {}     # torch.amp.GradScaler's scale and step, while nndb's wrappers are in place
_SCALER_SUBCLASSES: dict = {}    # a GradScaler subclass -> (its own scale, nndb's wrapper of it), while in place
_SCALING: "weakref.WeakSet" = weakref.WeakSet()   # the GradScalers that scaled a loss (_scaler_scale)
_SCALED_CLIPS: list = []         # clip_grad_norm_ calls a GradScaler may have scaled the gradients of (_scaled_clip)
_get_ident = threading.get_ident
_perf_counter = time.perf_counter
_ONE = torch.tensor(1.0)
_IN_BACKWARD = torch._C._current_graph_task_id     # -1 outside a backward (checkpointing recomputes in one)
# True while torch.compile traces (Dynamo folds it to a constant): the module hooks
# then do nothing, so that a compiled model's graph is the one it is without nndb (no
# graph break at nndb's code, no trace of it); they see the compiled model from outside
_COMPILING = torch.compiler.is_compiling
# Not None inside a torch.func transform (grad, vmap, jacrev: per-sample gradients, a
# functional_call training step): the module calls there run on functorch's wrapped tensors,
# which have no storage to read; they are the transform's, not the step's forward
_FUNCTORCH = torch._C._functorch.peek_interpreter_stack
# Modules whose forward takes a fused path only where no argument "has a torch function",
# which a function mode on the stack makes every tensor have: in eval mode with no gradient
# to make, MultiheadAttention's native kernel and TransformerEncoder's nested tensors (whose
# output is 0 at padded positions, where the other path's is not).  The function watches are
# off the stack while they run (_forward_pre), so that they take the path they take without nndb.
_FAST_PATHS = (torch.nn.MultiheadAttention, torch.nn.TransformerEncoderLayer, torch.nn.TransformerEncoder)
_COMPILE_HOOKS_WARNING = r"Using `torch.compile\(module\)` when there are global hooks on modules"
_COMPILE_WARNING_FILTERED = False


def _quiet_compile_warning() -> None:
    """torch.compile's module warns at every call that global hooks exist: ours,
    which do nothing inside it; the script's stderr stays as without nndb.  Once
    a process: every change of the filters resets Python's once-per-line
    registries, and the script's own warnings would show again."""
    global _COMPILE_WARNING_FILTERED
    if not _COMPILE_WARNING_FILTERED:
        _COMPILE_WARNING_FILTERED = True
        warnings.filterwarnings("ignore", message=_COMPILE_HOOKS_WARNING, category=UserWarning)
_FORK_HOOK = False
_ENGINE = object()       # (_backward_end_quiet: the loss is the engine's root)
# The backwards with no optimizer that reach no parameter and no leaf tensor given a gradient
# after which the tracer no longer looks for the leaf tensors a script trains by hand
# (Tracer._adopt_leaves): a walk of the graph each.
ADOPT_TRIES = 3
REPLICA_FORK = False     # set by nndb.timetravel around its own fork(): the child is a replica


def _backward_loss(args, kwargs):
    """The loss of a ``torch.autograd.backward`` call: its root tensor, or the objective of
    its several roots; None where that is no tensor."""
    roots = args[0] if args else kwargs.get("tensors")
    if type(roots) is torch.Tensor and _no_gradient(args, kwargs):
        return roots
    objective = backward_objective(*_roots_and_grads(args, kwargs))
    return objective[0] if objective and isinstance(objective[0], torch.Tensor) else None


def graph_leaves(grad_fns) -> list:
    """The leaf tensors (that need grad) a backward from these nodes reaches: its
    ``AccumulateGrad`` nodes' variables, in the order a walk from the roots meets them."""
    out, seen, stack = [], set(), list(reversed(grad_fns))
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        var = getattr(fn, "variable", None)
        if isinstance(var, torch.Tensor):
            out.append(var)
        stack.extend(n for n, _ in reversed(fn.next_functions))
    return out


def owning_modules(leaves, frame) -> list:
    """The modules of the script's variables (``frame``'s and its callers' locals, then its
    globals) that hold some of ``leaves`` as parameters, but the ones inside another of them
    (``layer`` of ``for layer in model``): the models whose modules the script calls through
    ``.forward()``, which no module hook sees.  A ``self`` that is no module counts with the
    modules it holds (``self.module_``, ``self.model``: a trainer object's, where
    ``find_variable_name`` finds the model's name too); a model first called at a step whose
    module hooks were off (activations unrecorded there) was otherwise found nowhere, and its
    parameters were named by their place in the optimizer (``optimizer_6.group0.0``)."""
    ids = {id(t) for t in leaves}
    values, f = [], frame
    while f is not None:
        values += list(f.f_locals.values())
        own = f.f_locals.get("self")
        if own is not None and not isinstance(own, torch.nn.Module):
            try:
                d = object.__getattribute__(own, "__dict__")
            except Exception:            # (no __dict__: slots, a C type)
                d = None
            if isinstance(d, dict):
                values += list(d.values())
        f = f.f_back
    if frame is not None:
        values += list(frame.f_globals.values())
    found: dict = {}
    for v in values:
        if isinstance(v, torch.nn.Module) and id(v) not in found:
            owned = {id(p) for p in v.parameters()}
            if owned & ids:
                found[id(v)] = (v, owned)
    return [m for m, owned in found.values()
            if not any(o is not m and owned < other for o, other in found.values())]


@contextlib.contextmanager
def unseen():
    """What runs inside is the debugger's, not the script's: an expression or
    statement typed at a stop (``p model(x)``, ``display``, ``!stmt``) or a
    point's condition.  Every active tracer's module hooks, function mode
    (the loss probes) and op recorder pass it by, as they pass their own
    hooks' tensor work (``in_hook``), and the module nesting depth that its
    forward post hooks count down is put back.  (They did not: ``p
    model(X)`` at a stop went into the next step's activation statistics,
    ``p F.cross_entropy(probs, y)`` fired ``double_softmax`` at "<nndb>:1",
    and the function mode's trampoline kept the expression's copy of the
    script's namespace alive, with an optimizer the script had replaced.)"""
    saved = [(t, t.in_hook, t.module_depth) for t in list(_ACTIVE)]
    for t, _, _ in saved:
        t.in_hook = True
    try:
        yield
    finally:
        for t, in_hook, depth in saved:
            t.in_hook, t.module_depth = in_hook, depth


def _quiet_in_child() -> None:
    """A forked child (a DataLoader worker) inherits the global hooks: it must neither record into the
    parent's trace nor stop for the debugger (a replica nndb forks goes on recording, into memory)."""
    if REPLICA_FORK:
        return
    for t in list(_ACTIVE):
        t._failed = True


def _no_gradient(args, kwargs) -> bool:
    """A ``torch.autograd.backward`` call given no gradient for its roots (``loss.backward()``)."""
    return (args[1] if len(args) > 1 else kwargs.get("grad_tensors", kwargs.get("grad_variables"))) is None


def _roots_and_grads(args, kwargs):
    """(the roots, their gradients) of a ``torch.autograd.backward`` call."""
    tensors = args[0] if args else kwargs.get("tensors")
    grads = args[1] if len(args) > 1 else kwargs.get("grad_tensors", kwargs.get("grad_variables"))
    roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors or ())
    if len(roots) > 1:      # (as the engine takes them: a missing gradient of a scalar root is one)
        grads = [None] * len(roots) if grads is None else \
            [grads] if isinstance(grads, torch.Tensor) else list(grads)
        grads = [_ONE if g is None else g for g in grads]
    return roots, grads


def _backward(*args, **kwargs):
    """``torch.autograd.backward`` while a tracer sees backward() through it."""
    # (put back: torch's own, for a reference taken while the wrapper was in place, from install
    # on: a script's ``from torch.autograd import backward``, called after the recording ended)
    original = _ORIGINAL_BACKWARD or _backward.__wrapped__
    tracers = _BY_WRAPPER
    thread = _get_ident()
    # (a backward inside a backward: the outer one's; and the original calling the wrapper again,
    # through a TorchFunctionMode's dispatch, which calls the module's ``backward``: this one)
    if not tracers or _IN_BACKWARD() != -1 or thread in _IN_WRAPPER:
        return original(*args, **kwargs)
    tracers = tuple(tracers)      # (one that fails leaves the list)
    hooked = None
    hidden = _PROFILING() and unprofiled()
    for t in tracers:
        if t.backward_began is None:
            t.backward_began = _perf_counter()
        # (a later backward of the step, after a loss no optimizer step has taken: did
        # zero_grad() come between?  StepRecorder.later_backward)
        rec = t.recorder
        if rec._in_step is not None and not t.closure_step:
            t._step_raised()
        pending = _PENDING_LOSS in rec._buckets[-1].entries
        if pending or rec.reaching:
            try:
                if pending:
                    rec.later_backward()
                if rec.reaching:        # (no optimizer stepped yet, or several: whose is its loss?)
                    rec.before_backward()
            except Exception:
                t._fail()
        if t._param_hooks:           # (its parameter hooks may see this one: after it, did they?)
            hooked = (hooked or {})
            hooked[t] = t._hook_ends
        if t.within.backward and not t._failed:
            try:
                for cb in t.within.backward:
                    cb(args[0] if args else kwargs.get("tensors"))
            except Exception:
                t._fail()
    if hidden:
        profiled()
    _IN_WRAPPER.add(thread)
    before = None
    for t in tracers:                  # (a loop, not a comprehension: no call of its own, every step)
        if t.lineage is not None:
            before = (before or []) + [t.lineage]
    try:
        out = original(*args, **kwargs)
    finally:
        _IN_WRAPPER.discard(thread)
        # (an op recorder started or stopped at a step end inside the backward: the engine's
        # thread state, put back as it returned, undid its dispatch-mode push or pop)
        for t in tracers:
            if t.lineage is not None:
                before = (before or []) + [t.lineage]
        if before is not None:
            _settle_after_backward(before)
    roots = args[0] if args else kwargs.get("tensors")
    # (loss.backward(): one root tensor, no gradient, no ``inputs=``; Tensor.backward passes
    # inputs=None; ``errD_real.backward(mone)``'s loss is -errD_real: _backward_loss)
    usual = type(roots) is torch.Tensor and len(args) < 6 and kwargs.get("inputs") is None \
        and (args[1] if len(args) > 1 else kwargs.get("grad_tensors", kwargs.get("grad_variables"))) is None
    # (_no_gradient(args, kwargs), inline: every step)
    for t in tracers:
        if t._loss_early is not None:       # (its optimizers stepped inside it: its loss is taken)
            t._loss_early = None
            continue
        if hooked is not None and t in hooked:
            if t._hook_ends == hooked[t]:
                t._backward_unhooked(args, kwargs)
        elif usual and t.lineage is None and not t._failed:
            # (Tracer._backward_returned's usual case, inline: every step; _take_loss's first branch)
            t.busy += 1
            hidden = _PROFILING() and unprofiled()
            try:
                t.recorder.loss(roots)
                for cb in t.within.loss:
                    cb(roots)
            except Exception:
                t._fail()
            finally:
                t.busy -= 1
                if hidden:
                    profiled()
        else:
            t._backward_returned(args, kwargs)
    if SCALED_NODES:
        SCALED_NODES.clear()         # (its losses are taken: the graph is the script's to free)
    return out


def _clip_grad_norm_(*args, **kwargs):
    """``torch.nn.utils.clip_grad_norm_`` while a tracer records what it returns: the
    gradients' total norm before clipping, which the gradients recorded at the optimizer's
    step no longer show (StepRecorder.clip_norm)."""
    if _CLIPPING or _SCALING:
        args, kwargs = _clip_params_listed(args, kwargs)
    out = _ORIGINALS["clip_grad_norm_"](*args, **kwargs)
    if _SCALING:
        _scaled_clip(args, kwargs, out)
    _clipped(out, args[1] if len(args) > 1 else kwargs.get("max_norm"), args[0] if args else kwargs.get("parameters"))
    return out


def _clip_params_listed(args, kwargs):
    """clip_grad_norm_'s arguments with its parameters in a list (a generator, such as
    ``model.parameters()``, is read once: by torch's function, and by _scaled_clip after it)."""
    try:
        if args and not isinstance(args[0], (torch.Tensor, list, tuple)):
            args = (list(args[0]),) + tuple(args[1:])
        elif "parameters" in kwargs and not isinstance(kwargs["parameters"], (torch.Tensor, list, tuple)):
            kwargs = dict(kwargs, parameters=list(kwargs["parameters"]))
    except Exception:
        pass
    return args, kwargs


def _scaled_clip(args, kwargs, total) -> None:
    """A clip_grad_norm_ while a GradScaler scales the losses: the parameters it clipped, and
    which optimizers each scaler had unscaled then (``scaler.unscale_(optimizer)``).  The
    scaler's ``step(optimizer)`` tells whether the clip saw that optimizer's gradients
    still scaled (_scaler_step): an optimizer no scaler steps (a model trained in float32
    beside one under the scaler) has gradients no scaler scaled."""
    try:
        params = args[0] if args else kwargs.get("parameters")
        max_norm = args[1] if len(args) > 1 else kwargs.get("max_norm")
        ids = {id(params)} if isinstance(params, torch.Tensor) else {id(p) for p in params}
        stages = _scaler_stages()
        if stages:
            _SCALED_CLIPS.append((ids, stages, total, max_norm))
            del _SCALED_CLIPS[:-16]      # (clips no scaler's step ever took: the last few are kept)
    except Exception:
        pass


def _clips_of_scaled_gradients(scaler, optimizer) -> list:
    """(total, max_norm) of the clip_grad_norm_ calls (since ``scaler`` last stepped
    ``optimizer``) that clipped some of ``optimizer``'s parameters before ``scaler`` unscaled
    its gradients: they measured and clipped the gradients times the loss scale.  The clips
    of the optimizer's parameters are taken either way."""
    from torch.amp.grad_scaler import OptState
    owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
    found, kept = [], []
    for entry in _SCALED_CLIPS:
        ids, stages, total, max_norm = entry
        if not ids & owned:
            kept.append(entry)
            continue
        for ref, stage in stages:
            if ref() is scaler and stage.get(id(optimizer), OptState.READY) == OptState.READY:
                found.append((total, max_norm))
                break
    _SCALED_CLIPS[:] = kept
    return found


def _clip_grads_with_norm_(*args, **kwargs):
    """``torch.nn.utils.clip_grads_with_norm_`` (parameters, max_norm, total_norm): the
    clipping of those who compute the total norm themselves (accelerate's and so the
    Trainer's ``clip_grad_norm_``); its ``total_norm`` is recorded as ``clip_grad_norm_``'s
    return is.  (torch's own ``clip_grad_norm_`` calls the private name: counted once.)"""
    if _CLIPPING or _SCALING:
        args, kwargs = _clip_params_listed(args, kwargs)
    out = _ORIGINALS["clip_grads_with_norm_"](*args, **kwargs)
    total = args[2] if len(args) > 2 else kwargs.get("total_norm")
    if _SCALING:
        _scaled_clip(args, kwargs, total)
    _clipped(total, args[1] if len(args) > 1 else kwargs.get("max_norm"), args[0] if args else kwargs.get("parameters"))
    return out


def _clipped(total, max_norm=None, params=None) -> None:
    if _CLIPPING and not _COMPILING():
        scaled = _SCALING and _nothing_unscaled()
        for t in tuple(_CLIPPING):
            if t._failed:
                continue
            t.busy += 1             # (nndb's own reading: no function mode sees it)
            hidden = _PROFILING() and unprofiled()
            try:
                t.recorder.clip_norm(total, max_norm, bool(scaled), params)
            except Exception:
                t._fail()
            finally:
                t.busy -= 1
                if hidden:
                    profiled()


def _nothing_unscaled() -> bool:
    """Has no GradScaler that scaled a loss unscaled any optimizer's gradients yet in this
    iteration (``scaler.unscale_(optimizer)``)?  A clip_grad_norm_ now measured gradients still
    times the loss scale (the clip_before_unscale bug), not the gradients' own norm."""
    try:
        from torch.amp.grad_scaler import OptState
        stages = _scaler_stages()
        return len(stages) == len(_SCALING) and all(st == OptState.READY for _, by in stages for st in by.values())
    except Exception:
        return False


def _scaler_stages() -> list:
    """[(weakref to a GradScaler that scaled a loss, {id(optimizer): its unscale stage})]: where
    each scaler is with each optimizer in this iteration (``OptState``: READY until
    ``unscale_(optimizer)``); a scaler without that state (another class's) is left out."""
    out = []
    for scaler in list(_SCALING):
        states = getattr(scaler, "_per_optimizer_states", None)
        if isinstance(states, dict):
            out.append((weakref.ref(scaler), {k: v.get("stage") for k, v in states.items() if isinstance(v, dict)}))
    return out


# name -> (the modules whose attribute nndb's wrapper replaces, the wrapper)
_CLIP_WRAPPERS = {"clip_grad_norm_": (("torch.nn.utils.clip_grad", "torch.nn.utils"), _clip_grad_norm_),
                  "clip_grads_with_norm_": (("torch.nn.utils",), _clip_grads_with_norm_)}


def _wrap_clip(tracer, on: bool) -> None:
    """``clip_grad_norm_`` and ``clip_grads_with_norm_`` seen through nndb's wrappers (in
    torch.nn.utils, and clip_grad_norm_ in its clip_grad module, where the deprecated
    ``clip_grad_norm`` looks it up): a script's ``from torch.nn.utils import clip_grad_norm_``
    made before the recording started keeps torch's own."""
    import sys
    if on and tracer not in _CLIPPING:
        _CLIPPING.append(tracer)
        if not _ORIGINALS:
            for name, (mods, wrapper) in _CLIP_WRAPPERS.items():
                original = getattr(torch.nn.utils, name, None)
                if original is None:            # (a torch without it)
                    continue
                _ORIGINALS[name] = original
                functools.update_wrapper(wrapper, original)
                for mod in mods:
                    setattr(sys.modules[mod], name, wrapper)
            _wrap_scaler(True)
    elif not on and tracer in _CLIPPING:
        _CLIPPING.remove(tracer)
        if not _CLIPPING and _ORIGINALS:
            for name, (mods, wrapper) in _CLIP_WRAPPERS.items():
                for mod in mods:
                    m = sys.modules.get(mod)
                    if name in _ORIGINALS and getattr(m, name, None) is wrapper:    # (not another's wrapper)
                        setattr(m, name, _ORIGINALS[name])
            _ORIGINALS.clear()
            _wrap_scaler(False)


def _scaler_scale(self, outputs):
    """``torch.amp.GradScaler.scale`` while a tracer records: the scaled loss it returns
    remembers the loss it scaled (``_nndb_unscaled``), which the step's ``loss`` is
    (StepRecorder.loss): the script's own number, not the loss times the scale (65536 at
    the start, halved at every skipped step and doubled at every growth)."""
    return _scale_through(_SCALER_ORIGINALS["scale"], self, outputs)


def _scale_through(original, self, outputs):
    """``original(self, outputs)``, a GradScaler class's own ``scale``, its output
    marked with the loss it scaled (_scaler_scale)."""
    out = original(self, outputs)
    if _CLIPPING and out is not outputs:
        # (a list or tuple of losses, which scale() gives back scaled one by one in a list or
        # tuple: ``torch.autograd.backward(scaler.scale([l1, l2]))``'s loss is l1 + l2, not
        # that times the scale)
        pairs = [(outputs, out)] if isinstance(outputs, torch.Tensor) else \
            list(zip(outputs, out)) if isinstance(outputs, (list, tuple)) and isinstance(out, (list, tuple)) \
            else []
        hidden = _PROFILING() and unprofiled()
        try:
            for loss, scaled in pairs:
                if isinstance(loss, torch.Tensor) and isinstance(scaled, torch.Tensor) and scaled is not loss:
                    setattr(scaled, UNSCALED, loss.detach())
                    _SCALING.add(self)
                    scale = getattr(self, "_scale", None)
                    if scaled.grad_fn is not None and isinstance(scale, torch.Tensor) and len(SCALED_NODES) < 16:
                        SCALED_NODES[scaled.grad_fn] = scale
                    for t in _CLIPPING:
                        t.recorder.scaler_seen = True
        except Exception:
            pass
        finally:
            if hidden:
                profiled()
    return out


def _scaler_step(self, optimizer, *args, **kwargs):
    """``torch.amp.GradScaler.step`` while a tracer records: where the scaler found Inf or
    NaN gradients and skipped ``optimizer.step()`` (no step hook ran), the iteration made
    no step: what it recorded for one (its finite loss, its ``clip_grad_norm_`` total of
    Inf) is not the next step's (StepRecorder.scaler_skipped)."""
    tracers = tuple(_CLIPPING)
    if _SCALED_CLIPS:
        try:
            clips = _clips_of_scaled_gradients(self, optimizer)
        except Exception:
            clips = []
        if clips:
            scale = getattr(self, "_scale", None)
            for t in tracers:
                if t.within.scaled_clip and not t._failed:
                    try:
                        for cb in t.within.scaled_clip:
                            cb(optimizer, clips, scale)
                    except Exception:
                        t._fail()
    before = [t.optimizer_posts for t in tracers]
    out = _SCALER_ORIGINALS["step"](self, optimizer, *args, **kwargs)
    for t, n in zip(tracers, before):
        if t.optimizer_posts == n and not t._failed:
            t.scaler_skipped(self, optimizer)
    return out


def _scaler_init(self, *args, **kwargs):
    """``torch.amp.GradScaler.__init__`` while a tracer records: a subclass with a
    ``scale`` of its own (FSDP's ShardedGradScaler, which never calls GradScaler's)
    gets nndb's wrapper of it (_wrap_scaler_subclass), else its scaled loss was
    recorded as the step's loss (the loss times 65536, or the scaler's init_scale)."""
    _SCALER_ORIGINALS["__init__"](self, *args, **kwargs)
    try:
        _wrap_scaler_subclass(type(self))
    except Exception:
        pass


def _wrap_scaler_subclass(klass) -> None:
    base = getattr(torch.amp, "GradScaler", None)
    for k in klass.__mro__:
        if k is base or base is None:
            break
        original = k.__dict__.get("scale")
        if original is None or getattr(original, "_nndb_scale", False) or not callable(original):
            continue

        def wrapper(self, outputs, _original=original):
            return _scale_through(_original, self, outputs)
        functools.update_wrapper(wrapper, original)
        wrapper._nndb_scale = True
        _SCALER_SUBCLASSES[k] = (original, wrapper)
        setattr(k, "scale", wrapper)


def _wrap_scaler(on: bool) -> None:
    """nndb's ``scale``, ``step`` and ``__init__`` in ``torch.amp.GradScaler`` (the class
    torch.cuda.amp's and torch.cpu.amp's derive from; a subclass's own ``scale`` is
    wrapped when one is made: _scaler_init), with the clipping wrappers."""
    cls = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if cls is None:
        return
    wrappers = (("scale", _scaler_scale), ("step", _scaler_step), ("__init__", _scaler_init))
    if on and not _SCALER_ORIGINALS:
        for name, wrapper in wrappers:
            original = cls.__dict__.get(name)
            if original is None:
                continue
            _SCALER_ORIGINALS[name] = original
            functools.update_wrapper(wrapper, original)
            setattr(cls, name, wrapper)
    elif not on and _SCALER_ORIGINALS:
        for name, wrapper in wrappers:
            if name in _SCALER_ORIGINALS and cls.__dict__.get(name) is wrapper:
                setattr(cls, name, _SCALER_ORIGINALS[name])
        _SCALER_ORIGINALS.clear()
        for k, (original, wrapper) in list(_SCALER_SUBCLASSES.items()):
            if k.__dict__.get("scale") is wrapper:
                setattr(k, "scale", original)
        _SCALER_SUBCLASSES.clear()
        _SCALED_CLIPS.clear()


_OPTIM_DIR = os.path.dirname(_optimizer.__file__) + os.sep
_TRACER_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _outer_steps(opt, frame) -> tuple:
    """The code objects of the ``step()`` methods that call ``opt.step()`` as wrappers (from
    ``frame``, inside its first step): the caller (past torch.optim's own wrappers, an LR
    scheduler's) is a method named ``step`` of an object that holds ``opt`` as an attribute,
    holds no other optimizer, looks like an optimizer (``zero_grad`` or ``param_groups``),
    needs no argument (``step(closure=None)``, not a trainer's ``step(batch)``) and whose
    ``step`` has no step hooks (a user's Lookahead, torch's PostLocalSGDOptimizer: it
    never calls Optimizer.__init__); then the same outwards for a wrapper of that wrapper.
    A wrapper with hooks (timm's Lookahead, ZeroRedundancyOptimizer) is seen by them: none."""
    codes, held, f = [], opt, frame
    while f is not None and f.f_code.co_filename.startswith((_OPTIM_DIR, _TRACER_DIR)):
        f = f.f_back
    try:
        while f is not None and len(codes) < 4:
            code = f.f_code
            if code.co_name != "step" or code.co_argcount < 1:
                break
            obj = f.f_locals.get(code.co_varnames[0])
            attrs = getattr(obj, "__dict__", None)
            fn = getattr(type(obj), "step", None)
            for _ in range(4):               # (a decorated step(): @torch.no_grad()'s wrapper)
                if getattr(fn, "__code__", None) is code or not hasattr(fn, "__wrapped__"):
                    break
                fn = fn.__wrapped__
            if getattr(fn, "__code__", None) is not code \
                    or code.co_argcount - len(fn.__defaults__ or ()) > 1 \
                    or code.co_kwonlyargcount > len(fn.__kwdefaults__ or {}) \
                    or obj is None or obj is held or not isinstance(attrs, dict) \
                    or not any(v is held for v in attrs.values()) \
                    or sum(isinstance(v, torch.optim.Optimizer) for v in attrs.values()) > 1 \
                    or getattr(getattr(type(obj), "step", None), "hooked", False) \
                    or not (callable(getattr(type(obj), "zero_grad", None)) or "param_groups" in attrs
                            or isinstance(obj, torch.optim.Optimizer)):
                break
            codes.append(code)
            held, f = obj, f.f_back
    except Exception:
        pass
    return tuple(codes)


def _settle_after_backward(recorders: list) -> None:
    for lin in dict.fromkeys(recorders):
        try:
            lin.after_backward()
        except Exception:
            pass


def _grad(*args, **kwargs):
    """``torch.autograd.grad`` while a tracer runs: where a forward pass waits for a backward
    (the steps that record activations) and every input of the call is a leaf tensor that no
    model or optimizer of the run holds, it runs with GRAD_OF_INPUTS up, so that the passes it
    goes through are not taken for the step's (recorder._Pass).  A call of the run's parameters
    hands its loss to the recorder (StepRecorder.grad_loss) as it returns."""
    original = _ORIGINAL_GRAD or _grad.__wrapped__
    # (the original calling the wrapper again, through a TorchFunctionMode's dispatch: this one)
    if not _BY_WRAPPER or _IN_BACKWARD() != -1 or _get_ident() in _IN_GRAD:
        return original(*args, **kwargs)
    tracers = [t for t in _BY_WRAPPER if not t._failed]
    try:
        inputs = args[1] if len(args) > 1 else kwargs.get("inputs")
        if isinstance(inputs, types.GeneratorType):
            # (model.parameters(): read once, as the original reads it, into the tuple it makes)
            inputs = tuple(inputs)
            if len(args) > 1:
                args = (args[0], inputs, *args[2:])
            else:
                kwargs = dict(kwargs, inputs=inputs)
        inputs = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs.values()) if type(inputs) is dict \
            else inputs if isinstance(inputs, (list, tuple)) else ()
        waiting = [t for t in tracers if t.recorder.passes_waiting()]
        of_inputs = bool(inputs) and bool(waiting) and all(
            isinstance(x, torch.Tensor) and x.is_leaf and not isinstance(x, torch.nn.Parameter)
            and not any(t.holds(x) for t in waiting) for x in inputs)
    except Exception:
        inputs, of_inputs = (), False     # (the script's call, as it is: torch says what is wrong with it)
    if not of_inputs:
        thread = _get_ident()
        _IN_GRAD.add(thread)
        try:
            out = original(*args, **kwargs)
        finally:
            _IN_GRAD.discard(thread)
        if inputs and not (args[4] if len(args) > 4 else kwargs.get("create_graph", False)) \
                and not (args[7] if len(args) > 7 else kwargs.get("is_grads_batched", False)):
            for t in tracers:
                t._grad_returned(args, kwargs, inputs)
        return out
    GRAD_OF_INPUTS[0] += 1
    try:
        return original(*args, **kwargs)
    finally:
        GRAD_OF_INPUTS[0] -= 1


def _wrap_backward(tracer, on: bool) -> None:
    """torch.autograd's ``backward`` (_backward) and ``grad`` (_grad) wrapped while a tracer runs."""
    global _ORIGINAL_BACKWARD, _ORIGINAL_GRAD
    if on and tracer not in _BY_WRAPPER:
        _BY_WRAPPER.append(tracer)
        if _ORIGINAL_BACKWARD is None:
            _ORIGINAL_BACKWARD = torch.autograd.backward
            functools.update_wrapper(_backward, _ORIGINAL_BACKWARD)
            torch.autograd.backward = _backward
        if _ORIGINAL_GRAD is None:
            _ORIGINAL_GRAD = torch.autograd.grad
            functools.update_wrapper(_grad, _ORIGINAL_GRAD)
            torch.autograd.grad = _grad
    elif not on and tracer in _BY_WRAPPER:
        _BY_WRAPPER.remove(tracer)
        if not _BY_WRAPPER and _ORIGINAL_BACKWARD is not None:
            if torch.autograd.backward is _backward:       # (someone else's wrapper over ours: left in place)
                torch.autograd.backward = _ORIGINAL_BACKWARD
                _ORIGINAL_BACKWARD = None
        if not _BY_WRAPPER and _ORIGINAL_GRAD is not None:
            if torch.autograd.grad is _grad:
                torch.autograd.grad = _ORIGINAL_GRAD
                _ORIGINAL_GRAD = None


class Tracer:
    """Watches an unmodified training script through global hooks.

    ``on_step_end(step)`` is called at every step boundary (the recording's
    step pipeline, nndb.tracer.pipeline, hands the step on), in the thread and
    under the frame of the code that ended the step (the debugger stops
    there).  ``on_error(msg)`` reports an internal error once; ``on_note(kind, msg)``
    tells the user and the trace's events what the step clock could not do as the
    script's iterations are (``steps_joined``: a closed step not reopened).

    Why this size: each global hook (module calls, backward, optimizer steps)
    keeps its handles and the little state that says where in the step the
    script is, and they read one another's (a backward pending, the module
    depth, the optimizers seen); the consumers it calls are one attribute each.
    """

    def __init__(self, recorder: StepRecorder, naming: Naming,
                 on_step_end: Optional[Callable[[int], None]] = None,
                 on_error: Optional[Callable[[str], None]] = None,
                 on_note: Optional[Callable[[str, str], None]] = None):
        self.recorder = recorder
        self.naming = naming
        self.clock = StepClock()
        self.on_step_end = on_step_end
        # The consumers within a step (the rules' probes, the op recorder's loss label,
        # the debugger's stops in modules, the first gradient's time): listener lists.
        self.within = WithinStep()
        # The op recorder (nndb.lineage.ops) while it runs: module_pre(module, args),
        # module_post(module, args, output), optimizer(opt, "pre"|"post").  Fed from
        # these hooks: registering global hooks of its own from inside one (a step
        # ends in an optimizer hook) would change the dict PyTorch is iterating.
        self.lineage = None
        self.on_error = on_error or (lambda msg: print(msg, file=sys.stderr))
        self.on_note = on_note
        self._handles: list = []
        self._fwd_handles: list = []            # the global module hooks, while in (sync_forward)
        self._param_handles: dict = {}          # id(param) -> (weakref, hook handle or None)
        self._param_hooks = True                # per-parameter hooks (else: the backward wrapper)
        # A parameter registered on a module since the last optimizer step (pruning's weight_orig,
        # prune.remove's weight again, a parametrization's original): the names are looked
        # for again there (Naming.refresh), as a tensor may now be held at another path.
        self._params_registered = False
        self.module_depth = 0
        self._calls: dict = {}                  # module -> calls within the current root forward
        self._ran: set = set()                  # modules whose forward ran with grad in this step (not in a backward)
        self._backward_pending = False
        self._hook_ends = 0             # backwards whose end the parameter hooks saw (_backward_end)
        # The graph task of a backward whose loss was taken as an optimizer stepped inside it
        # (the "optimizer in backward" recipe: _opt_pre), None otherwise: not taken again at its end.
        self._loss_early: Optional[int] = None
        self.optimizer_posts = 0            # optimizer steps returned (_scaler_step)
        # An optimizer whose step() another object's step() calls and then goes on (a Lookahead,
        # torch's PostLocalSGDOptimizer, with no step hooks of their own) -> the code objects of
        # those step()s, found at its first step (_outer_steps); its post hook waits for the
        # outermost to return (_defer_post): the step ends there, with what it did after.
        self._wrapped_by: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._wrapping = False                  # (any: one attribute read a step in other loops)
        self._deferred: Optional[list] = None   # the posts waiting for it, while it runs
        self._on_return = None                  # the profile function that waits for it
        self.scaler_skips = 0               # optimizer steps a GradScaler skipped (nndb check reads it)
        self._skipping = None               # weakref to an optimizer stepping a scaler's skipped step (_scaler_skips)
        # backward() calls that reached no named parameter while no optimizer existed (tensors
        # trained by hand outside any nn.Module): no step is seen in such a loop
        self.unseen_backwards = 0
        self.adopt_tries = 0             # backwards looked through in vain for leaves to adopt (_adopt_leaves)
        # perf_counter() when the step's first backward began (its first gradient, while the
        # parameter hooks see it), None before: the step's forward time ends there (read by
        # the fingerprints at the step end; the tracer sets it back after the step's listeners)
        self.backward_began: Optional[float] = None
        self._forward_key = None        # what decided the module hooks at the last optimizer step (_opt_post)
        self._opt_seen: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # -> its param_groups count
        # the same, in the order first seen, as weak references (read at every step end:
        # list(map(weakref.ref.__call__, tracer.optimizer_refs)), where a None says one went)
        self.optimizer_refs: list = []
        self._known_optimizers: Optional[weakref.WeakSet] = None
        self._preexisting: Optional[weakref.WeakSet] = None      # (preexisting_optimizers)
        # (_earlier_owner: until the first backward ends, the parameters it reaches)
        self._first_backward = True
        self._grad_params: list = []
        # > 0 while a step boundary is being decided and recorded: nndb's
        # signal handling waits for it, so a Ctrl-C never loses half a step.
        self.busy = 0
        self.closure_step = False               # the optimizer step running was given a closure
        self.closure_calls = 0                  # calls of the optimizers' closures so far (_counted)
        self.in_closure = 0                     # > 0 while an optimizer calls its closure
        self._failed = False
        self.in_hook = False
        # Function watches (nndb.tracer.funcmode: the loss rules' on their steps) pushed that
        # know this tracer: while any is, the hooks take them off the mode stack as they work,
        # and from an optimizer step's pre hook to its post hook (an optimizer's arithmetic is
        # no loss; unless the step evaluates a closure, LBFGS's, which computes the loss): _held.
        self.watching = 0
        self._held: Optional[list] = None
        self._fast_paths: list = []             # (module, the watches hidden while it runs): _FAST_PATHS
        self._thread = threading.get_ident()

    # -- what the debugger asks of the tracer ---------------------------------
    def stop_in_modules(self, callback: Optional[Callable], backward: bool = False) -> None:
        """Call ``callback(module, phase, payload)`` at every module forward
        (and, with ``backward``, at every module's backward), or no more (None):
        the "module" listeners (WithinStep) are this one callback, or none."""
        self.within.module[:] = [callback] if callback is not None else []
        self.within.version += 1
        self.within.module_backward = callback is not None and backward

    @contextlib.contextmanager
    def idle(self):
        """nndb is waiting at a prompt inside a hook: signals may interrupt it."""
        busy, self.busy = self.busy, 0
        try:
            yield
        finally:
            self.busy = busy

    # -- install / uninstall -----------------------------------------------
    def install(self) -> None:
        global _FORK_HOOK
        if not _FORK_HOOK and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_quiet_in_child)
            _FORK_HOOK = True
        _ACTIVE.add(self)
        self.preexisting_optimizers()
        self._handles = [
            _optimizer.register_optimizer_step_pre_hook(self._opt_pre),
            _optimizer.register_optimizer_step_post_hook(self._opt_post),
            _module.register_module_parameter_registration_hook(self._param_registered),
        ]
        self.want_forward(True)
        _wrap_backward(self, True)       # (a backward the parameter hooks cannot see: _backward_unhooked)
        _wrap_clip(self, True)

    def preexisting_optimizers(self) -> "weakref.WeakSet":
        """The optimizers alive before the run started (an earlier run's, in a notebook or a test):
        one referrer scan, by the first to ask (the session as it attaches, or ``install``)."""
        if self._preexisting is None:
            self._preexisting = weakref.WeakSet(find_optimizers())
        return self._preexisting

    def _earlier_owner(self) -> bool:
        """Does an optimizer alive before the run (a notebook's earlier cell; a module a restarted
        run took from sys.modules) hold a parameter the backward that just ended reached?  Then,
        while none has stepped in this run, it may be this run's: that backward does not end step
        0 as a hand-written update would.  (One that holds none: each backward ends a step.)"""
        reached = {id(p) for p in self._grad_params}
        return bool(reached) and any(id(q) in reached for o in self.preexisting_optimizers()
                                     for g in o.param_groups for q in g["params"])

    def uninstall(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self.want_forward(False)
        self._param_hooks_off()
        _wrap_backward(self, False)
        _wrap_clip(self, False)
        self._param_handles = {}

    def want_forward(self, on: bool) -> None:
        self._forward_key = None            # (the next optimizer step decides again: sync_forward)
        if on and not self._fwd_handles:
            # (always_call: a forward that raises still ends its call: _forward_raised)
            self._fwd_handles = [_module.register_module_forward_pre_hook(self._forward_pre),
                                 _module.register_module_forward_hook(self._forward_post, always_call=True)]
            _quiet_compile_warning()
        elif not on and self._fwd_handles:
            for h in self._fwd_handles:
                h.remove()
            self._fwd_handles = []

    def sync_forward(self) -> None:
        """At an optimizer step (a safe point: no module's forward is iterating PyTorch's global
        module hooks): the module hooks are in only for the steps that need them (a module call
        costs nothing between them).  Needed for: activations (the steps ``Cadence.acts``
        names), the rules' probes, the op recorder, a stop point in a module, and naming the
        models until step 0 ends (a model first called on a step without them: at the next).
        What it reads is _opt_post's key too (which asks only when that changed): keep the two
        together."""
        rec = self.recorder
        within = self.within
        # (twice a step: the usual answer, "off, and off already", asks nothing further)
        on = bool(not self.naming._frozen or (rec.recording and rec.acts)
              or (rec.fulltensors is not None and rec.fulltensors.rules and rec.wants_forward())
              or within.forward or within.root or within.module
              or self.lineage is not None)
        if on != bool(self._fwd_handles):
            self.want_forward(on)

    def finish(self, raised: bool = False) -> None:
        """The script is over: close the open step if anything happened in it
        (``raised``: the script raised, its forward passes are the step's)."""
        if self._failed:
            return
        if self._deferred is not None:
            self._outer_returned()
        self.busy += 1
        hidden = _PROFILING() and unprofiled()
        try:
            rec = self.recorder
            if raised:
                rec.keep_passes()
            if rec.has_open_work():
                close = self.clock.finish()
                rec.close(close.step, final=True)
            rec.finish()
            self._flush_full()
        except Exception:
            self._fail()
        finally:
            self.busy -= 1
            if hidden:
                profiled()

    # -- guard -------------------------------------------------------------
    def _fail(self) -> None:
        if not self._failed:
            self._failed = True
            tb = traceback.format_exc(limit=-3).rstrip().splitlines()
            self.on_error("nndb: internal error in the tracer; recording stopped, "
                          f"training goes on: {tb[-1] if tb else '?'}")
            try:
                self.uninstall()
            except Exception:
                pass

    # -- module hooks --------------------------------------------------------
    def _forward_pre(self, module, args):
        # (activation checkpointing recomputes a forward in the backward: recorded already if it ran with grad)
        if _COMPILING() or self._failed or self.in_hook or _FUNCTORCH() is not None \
                or (module in self._ran and _IN_BACKWARD() != -1) \
                or self.naming.compiled_bodies and self._compiled_body(module):
            return None
        hidden = _PROFILING() and unprofiled()
        off = None
        try:
            if self.module_depth == 0:
                if self.recorder._in_step is not None and not self.closure_step:
                    self._step_raised()
                if self.watching:
                    off = _hide_watches(self)     # (its tensor calls: no mode sees them)
                self._calls = {}
                if not self.naming.knows(module):
                    self.naming.add_root(module, user_frame(2))
                self._watch_params(module)     # (also parameters new in it: a head replaced, assign=True)
                rec = self.recorder
                if rec.acts and rec.recording and torch.is_grad_enabled():
                    rec.pass_began()           # (its activations wait for a backward through them)
                if self.within.root:
                    self.in_hook = True          # (the probes' own tensor work is not the step's)
                    # (a batch given by keyword, model(input_ids=..., labels=...): after the positional)
                    seen = call_args(args, call_kwargs())
                    try:
                        for cb in self.within.root:
                            cb(module, seen)
                    finally:
                        self.in_hook = False
        except Exception:
            self._fail()
        if off:
            _show_watches(off)
        if self.watching and isinstance(module, _FAST_PATHS):
            off = _hide_watches(self)             # (until its call ends: _forward_post)
            if off:
                self._fast_paths.append((module, off))
        if hidden:
            profiled()
        self.module_depth += 1
        if self.lineage is not None:
            self.lineage.module_pre(module, args)
        for cb in self.within.module:
            cb(module, "forward", args)
        return None

    def _forward_post(self, module, args, output):
        fast = self._fast_paths
        if fast and fast[-1][0] is module:
            _show_watches(fast.pop()[1])
        if _COMPILING() or _FUNCTORCH() is not None or (module in self._ran and _IN_BACKWARD() != -1) \
                or self.naming.compiled_bodies and self._compiled_body(module):
            return None
        if output is None and sys.exc_info()[1] is not None:
            self._forward_raised(module, args)
            return None
        self.module_depth = max(0, self.module_depth - 1)
        if self._failed or self.in_hook:
            return None
        if torch.is_grad_enabled() and _IN_BACKWARD() == -1:
            self._ran.add(module)
        if self.lineage is not None:
            self.lineage.module_post(module, args, output)
        hidden = _PROFILING() and unprofiled()
        off = _hide_watches(self) if self.watching else None
        if self.lineage is None:
            self._forward_post_quiet(module, args, output)
        else:                            # (the op recorder off the dispatch stack)
            self._quietly(self._forward_post_quiet, module, args, output)
        if self.module_depth == 0:
            self._calls = {}             # (no module held past its pass: a model the script lets go dies)
            if self.recorder._pass is not None:
                try:
                    self.recorder.pass_ended()
                except Exception:
                    self._fail()
            if self.within.root_output:
                self.in_hook = True          # (the probes' own tensor work is not the step's)
                try:
                    for cb in self.within.root_output:
                        cb(module, output)
                except Exception:
                    self._fail()
                finally:
                    self.in_hook = False
        if off:
            _show_watches(off)
        if hidden:
            profiled()
        return None

    def _forward_raised(self, module, args) -> None:
        """``module``'s forward raised (PyTorch calls the post hook, registered ``always_call``,
        as the exception leaves each module's call, with no output): its call ends, and at the
        root its pass.  The depth stayed up until the step's end, so a pass the script ran
        after catching the exception was no root's: its activations went into the raised
        pass's, which never ended, and the step had none (layers 'l0', 'l1' missing at each
        step whose first forward raised)."""
        self.module_depth = max(0, self.module_depth - 1)
        if self._failed or self.in_hook:
            return
        if self.lineage is not None:
            self._quietly(self.lineage.module_post, module, args, None)
        if self.module_depth == 0:
            self._calls = {}
            if self.recorder._pass is not None:
                try:
                    self.recorder.pass_ended()
                except Exception:
                    self._fail()

    def _compiled_body(self, module) -> bool:
        """Is ``module`` a ``torch.compile``'d module's ``_orig_mod``?  Its call is the compiled
        module's own, with the same output (recorded once, under the script's name for it): its
        hooks run as Python, outside the compiled forward."""
        body = self.naming.compiled_bodies.get(id(module))
        return body is not None and body() is module

    def _forward_post_quiet(self, module, args, output) -> None:
        try:
            self.in_hook = True
            # A module reused within one forward pass (one ReLU applied after two
            # layers) gets one series per use: act, act#2, ...
            # A module no model holds, made in the forward that calls it (Hugging Face's
            # ``loss_fct = CrossEntropyLoss()`` in a model's forward): a new object at each
            # call, one series by its class and its use among them in the pass, as one
            # module held by the model would be (each micro-batch's object was a series of
            # its own under the same name: the step kept one micro-batch's loss).
            who = module if self.module_depth == 0 or self.naming.knows(module) else type(module)
            idx = self._calls.get(who, 0)
            self._calls[who] = idx + 1
            if not (self.naming.views and self.naming.is_view(module)):     # (a slice: its layers' rows)
                self.recorder.activation((who, idx), output)
            forward = self.within.forward
            if forward:
                for cb in forward.get(type(module), ()):
                    cb(module, idx, args, output)
            if self.within.module_backward:
                self._watch_backward(module, output)
        except Exception:
            self._fail()
        finally:
            self.in_hook = False

    def _quietly(self, fn, *args) -> None:
        """``fn(*args)``, with the op recorder (if on) off the dispatch stack:
        nndb's own tensor work is not the step's lineage."""
        lin = self.lineage
        if lin is None:
            fn(*args)
        else:
            with lin.paused():
                fn(*args)

    def _watch_backward(self, module, output) -> None:
        """A stop point at the module's backward: a hook on its output's gradient; on a module
        with several outputs that need one, a hook once every gradient the backward makes of
        them has come (``register_full_backward_pre_hook``'s ``grad_output``: a tuple, None for
        an output no gradient reached).  The first output's alone missed the backward of a
        module whose first output the loss does not use (an encoder's GRU, ``_, h = gru(x)``:
        ``break module encoder backward`` never stopped)."""
        if not torch.is_grad_enabled():
            return
        if isinstance(output, torch.Tensor):
            outs = [output] if output.requires_grad else []
        else:
            outs = [t for t in float_tensors(output) if t.requires_grad]
        if not outs:
            return

        def hook(grad, module=module, one=len(outs) == 1):      # (no output held: a tensor's hook)
            if self.within.module_backward and not self._failed:
                for cb in self.within.module:
                    cb(module, "backward", grad if one else tuple(grad))
            return None
        if len(outs) > 1:
            try:
                torch.autograd.graph.register_multi_grad_hook(outs, hook, mode="all")
                return
            except Exception:           # (an output it refuses: the first one's gradient alone, as before)
                hook = functools.partial(hook, one=True)
        outs[0].register_hook(hook)

    # -- backward --------------------------------------------------------------
    def _watch_params(self, module) -> None:
        new = [p for p in module.parameters() if self._hook_param(p)]
        if new and self.naming.knows(module):
            self.naming.refresh()       # (new parameters in a known model: named by their place in it)

    def _hook_param(self, p) -> bool:
        """Is ``p`` new?  Then noted, with a gradient-accumulated hook while backward's end is
        seen that way (``_param_hooks``), once per tensor (by id and a weakref: a tensor that
        replaced a freed one may have its id)."""
        held = self._param_handles.get(id(p))
        if not p.requires_grad or not p.is_leaf or (held is not None and held[0]() is p):
            return False
        self._param_handles[id(p)] = (weakref.ref(p), p.register_post_accumulate_grad_hook(self._grad_accumulated)
                                      if self._param_hooks else None)
        return True

    def _param_hooks_off(self) -> None:
        """An optimizer steps now: backward() is seen by the wrapper from here on."""
        self._param_hooks = False
        for _, h in self._param_handles.values():
            if h is not None:
                h.remove()
        self._param_handles = {i: (ref, None) for i, (ref, _) in self._param_handles.items()}
        if not self._failed:
            _wrap_backward(self, True)

    def _backward_unhooked(self, args, kwargs) -> None:
        """The wrapper's, while the parameter hooks see backward(): a backward that none of
        them saw (it reached no parameter this run has named: a model whose modules the script
        calls through ``.forward()``, which no module hook sees, before an optimizer names its
        parameters at its first step).  Where an optimizer exists and none has stepped, the
        optimizer's step ends the step: the loss is the step's.  In a hand-written loop (no
        optimizer) a backward ends a step only where it reaches a parameter: here, one of
        tensors trained outside any module (``_adopt_leaves``).  So also once such a loop has
        made steps (``Mode.MANUAL``): a backward that reaches none of its parameters reaches
        new ones, made again (a notebook's init cell run again, a second model trained by hand
        after the first: ``W = torch.randn(..., requires_grad=True)``; its steps went unseen)."""
        if self._failed or self.clock.mode not in (Mode.UNKNOWN, Mode.MANUAL):
            return
        if self._optimizer_count() == 0:
            if not self._adopt_leaves(args, kwargs):
                self.unseen_backwards += 1      # (said at the run's end if no step was ever seen: Recording)
            return
        if self.clock.mode is Mode.UNKNOWN:
            self._backward_returned(args, kwargs)

    def _adopt_leaves(self, args, kwargs) -> bool:
        """A backward with no optimizer that reached no parameter: a loop of tensors trained by
        hand outside any module (``w -= lr * w.grad``, the first lesson of "What is torch.nn
        really?").  The leaf tensors that need grad which it reached are the run's parameters
        from here on (``Naming.adopt``: named by the script's variables), watched as a module's
        are, and this backward ends a step as a watched one would.  Tried until ADOPT_TRIES
        such backwards found none (a walk of the graph each); False: none found."""
        if self.adopt_tries >= ADOPT_TRIES:
            return False
        self.busy += 1
        hidden = _PROFILING() and unprofiled()
        try:
            roots = _roots_and_grads(args, kwargs)[0]
            leaves = graph_leaves([r.grad_fn for r in roots if isinstance(r, torch.Tensor)])
            inputs = kwargs.get("inputs", args[5] if len(args) > 5 else None)
            if inputs is not None:          # (``inputs=``: only those get gradients)
                wanted = {id(t) for t in ([inputs] if isinstance(inputs, torch.Tensor) else inputs)}
                leaves = [t for t in leaves if id(t) in wanted]
            leaves = [t for t in leaves if t.grad is not None and not t.grad.is_sparse]
            if not leaves:
                self.adopt_tries += 1
                return False
            frame = user_frame(3)
            for module in owning_modules(leaves, frame):     # (a model called through .forward())
                self.naming.add_root(module, frame)
            for p in leaves:
                if not self.naming.has_path(p):
                    self.naming.adopt(p, frame, along=leaves)
                self._hook_param(p)
            self._backward_end_quiet(_backward_loss(args, kwargs))
            return True
        except Exception:
            self._fail()
            return False
        finally:
            self.busy -= 1
            if hidden:
                profiled()

    def _backward_returned(self, args, kwargs) -> None:
        """The wrapper's: a backward() returned (the parameter hooks are off, so an optimizer
        has stepped: the step clock knows its mode, and a backward never ends a step), where
        the wrapper does not take the loss itself (``inputs=``, several roots, the op recorder
        running)."""
        if self._failed:
            return
        lin = self.lineage
        paused = lin.paused() if lin is not None else None     # (nndb's own work is not the step's lineage)
        self.busy += 1
        hidden = _PROFILING() and unprofiled()
        try:
            if paused is not None:
                paused.__enter__()
            inputs = kwargs.get("inputs", args[5] if len(args) > 5 else None)
            if inputs is not None and not self._reaches_parameter(inputs):
                return          # (``inputs=[x]``, no parameter: as the parameter hooks, not a step's backward)
            self._take_loss(_backward_loss(args, kwargs))
        except Exception:
            self._fail()
        finally:
            self.busy -= 1
            if hidden:
                profiled()
            if paused is not None:
                paused.__exit__(None, None, None)

    def _grad_accumulated(self, param) -> None:
        if self._first_backward:
            self._grad_params.append(param)
        if self._failed or self._backward_pending:
            return
        try:
            self._backward_pending = True
            if self.backward_began is None:
                self.backward_began = _perf_counter()
            if _get_ident() not in _IN_WRAPPER:      # (the wrapper's backward: its listeners were called)
                for cb in self.within.backward:
                    cb(None)
            Variable._execution_engine.queue_callback(self._backward_end)
        except Exception:
            self._fail()

    def _backward_end(self) -> None:
        self._backward_pending = False
        self._hook_ends += 1
        if self._failed:
            return
        if self.lineage is None:
            self._backward_end_quiet()
        else:
            self._quietly(self._backward_end_quiet)

    def holds(self, t: torch.Tensor) -> bool:
        """Is ``t`` a parameter of the run: of a model it named, or held by an optimizer?"""
        if self.naming.has_path(t):
            return True
        return any(t is p for o in (self._known_optimizers or ()) for g in o.param_groups for p in g["params"])

    def _reaches_parameter(self, inputs) -> bool:
        ts = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs.values()) if isinstance(inputs, dict) \
            else list(inputs)
        held = self._param_handles
        return any(isinstance(t, torch.Tensor) and id(t) in held and held[id(t)][0]() is t for t in ts)

    def _grad_returned(self, args, kwargs, inputs) -> None:
        """A ``torch.autograd.grad`` call (no ``create_graph``) returned: where one of its inputs
        is a parameter of the run, its objective is a loss the step may apply (recorder.grad_loss)."""
        if not self.recorder.recording or self.in_hook:
            return
        try:
            if not any(isinstance(x, torch.Tensor) and self.holds(x) for x in inputs):
                return
            outputs = args[0] if args else kwargs.get("outputs")
            grads = args[2] if len(args) > 2 else kwargs.get("grad_outputs")
            roots = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs or ())
            loss = backward_objective(roots, grads)
            loss = loss[0] if len(loss) == 1 else None
            if isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.is_floating_point():
                self.recorder.grad_loss(loss)
        except Exception:
            self._fail()

    def _take_loss(self, loss) -> None:
        """A backward's loss (None: its root is no tensor) to the recorder and the loss listeners."""
        if loss is not None:
            self.recorder.loss(loss)
            for cb in self.within.loss:
                cb(loss)
        else:
            self.recorder.backward_without_loss()
            for cb in self.within.no_loss:
                cb()

    def _backward_end_quiet(self, loss=_ENGINE) -> None:
        """A watched backward ended (``loss``: its root as the wrapper saw it; by default the
        engine's, read in its callback)."""
        self.busy += 1
        hidden = _PROFILING() and unprofiled()
        try:
            if loss is _ENGINE:
                if self._loss_early is not None:
                    loss = _ENGINE          # (taken as an optimizer stepped inside this backward)
                else:
                    roots = backward_roots()
                    loss = roots[0] if roots and isinstance(roots[0], torch.Tensor) else None
            if loss is not _ENGINE:
                self._take_loss(loss)
            n = self._optimizer_count() if self.clock.mode is Mode.UNKNOWN else 1
            if self._first_backward:
                if n == 0 and self._earlier_owner():
                    n = 1           # (undecided: the optimizer made before the run may step next)
                self._first_backward = False
                self._grad_params = []
            close = self.clock.backward_end(n)
            if self.clock.mode is Mode.MANUAL:
                self.recorder.manual = True
            if close is not None:
                self._close(close)
        except Exception:
            self._fail()
        finally:
            self.busy -= 1
            if hidden:
                profiled()

    def _optimizer_count(self, opt=None, fresh: bool = False) -> int:
        """Optimizers of this run: scanned once and reused, unless an optimizer
        steps that the last scan did not see (or ``fresh``).  One that was alive before the
        run started (an earlier run's, in a notebook or a test process) counts once it
        steps in this run, or, counted as an optimizer steps, where it holds a parameter
        of a model this run has called (a notebook's GAN: both optimizers made in a cell
        before the ``%%nndb`` one; were the generator's not counted, the discriminator's
        first step would end step 0 alone and every later step hold one iteration's
        generator step and the next's discriminator step).  (Counted at a backward, it
        does not: a loop that updates by hand beside such an optimizer would wait for it.)
        One whose ``step()`` fires no step hooks is not counted: it never steps as nndb sees it
        (a wrapper that never ran ``Optimizer.__init__``, accelerate's AcceleratedOptimizer and so
        every Hugging Face Trainer's, is seen through the optimizer it holds; counted, it was a
        second optimizer the first step waited for, and step 0 was closed after the fact, in
        step 1's optimizer step, its lr step 1's: 0.000333 for the Trainer's logged 0.0)."""
        if fresh or self._known_optimizers is None or (opt is not None and opt not in self._known_optimizers):
            earlier = self.preexisting_optimizers()
            stepping = opt is not None or fresh
            has_path = self.naming.has_path
            self._known_optimizers = weakref.WeakSet(
                o for o in find_optimizers() if fires_step_hooks(o) and (
                    o not in earlier or o in self._opt_seen
                    or (stepping and any(has_path(q) for g in o.param_groups for q in g["params"]))))
        return len(self._known_optimizers)

    # -- optimizer hooks -------------------------------------------------------
    def _param_registered(self, module, name, param):
        self._params_registered = True
        return None

    def _opt_pre(self, opt, args, kwargs):
        if self._failed:
            return None
        if getattr(opt, "found_inf", None) is not None and self._scaler_skips(opt):
            return None
        # (an optimizer step that evaluates a closure, LBFGS's, runs forward and loss inside it;
        # ``args`` are step's own, the optimizer first)
        self.closure_step = len(args) > 1 or kwargs.get("closure") is not None
        lin = self.lineage
        paused = lin.paused() if lin is not None else None     # (nndb's own work is not the step's lineage)
        self.busy += 1
        hidden = _PROFILING() and unprofiled()
        off = _hide_watches(self) if self.watching else None
        try:
            if paused is not None:
                paused.__enter__()
            sync = self.closure_step            # (a closure's forward runs inside this step())
            if self._deferred is not None:
                self._outer_returned()          # (another step before the wrapper returned)
            if self._opt_seen.get(opt) != len(opt.param_groups):
                self._first_sight(opt)          # (again after add_param_group: its parameters named and watched)
                codes = _outer_steps(opt, sys._getframe(1))
                if codes:
                    self._wrapped_by[opt] = codes
                    self._wrapping = True
                sync = True
            if self._params_registered:
                self._params_registered = False
                self.naming.refresh()
            clock = self.clock
            mode = clock.mode
            alive = clock._closer is not None and clock._closer() is not None
            if (mode is Mode.SINGLE or mode is Mode.CYCLE) and alive and not clock._others:
                close = None        # (the loop as it was: the clock's optimizer_pre has nothing to do)
            else:
                needs_count = mode in (Mode.UNKNOWN, Mode.MANUAL) or (mode is not Mode.LEARNING and not alive)
                n = self._optimizer_count(opt) if needs_count else 2
                site = call_site(user_frame(2)) if clock.wants_site else None
                close = clock.optimizer_pre(opt, n, self.closure_step or _IN_BACKWARD() != -1, site)
                manual = clock.mode is Mode.MANUAL
                if self._param_hooks and not manual and clock.mode is not Mode.UNKNOWN:
                    self._param_hooks_off()
                if clock.absorbing is not None:
                    # (the last hand-written step's update: its record, which waits for it, is
                    # written as this step returns, _opt_post; it measured none, 0, before it)
                    manual = True
                elif self.recorder.manual and not manual:
                    self.recorder.end_manual()
                    self._flush_full()
                    sync = True
                self.recorder.manual = manual
                if close is not None:
                    self._close(close)
                    sync = True
            if sync:
                self.sync_forward()
            if self._loss_early is None and _IN_BACKWARD() != -1:
                self._loss_in_backward()
            if clock.absorbing is None:
                self.recorder.optimizer_pre(opt, self._known_optimizers or ())
            if self.lineage is not None or self.within.optimizer:
                self._tell_optimizer(opt, "pre")
        except Exception:
            self._fail()
        finally:
            self.busy -= 1
            if off:
                if self.closure_step or self._failed:
                    _show_watches(off)
                else:                       # (off while the optimizer steps: back as its post hook returns)
                    self._held = (self._held or []) + off
            if hidden:
                profiled()
            if paused is not None:
                paused.__exit__(None, None, None)
        return self._counted(args, kwargs) if self.closure_step and not self._failed else None

    def _step_raised(self) -> None:
        """An optimizer's ``step()`` (no closure) raised, and the script went on (its own check
        of the gradients, caught): its post hook never ran.  What its pre hook began ends at the
        next forward pass or backward: the function watches it took off the mode stack go back
        (the loss rules saw nothing of the next iteration), and the next losses are a step's, not
        the later calls of a closure (only the next backward's was taken: the step's loss read
        the first of its two backward passes)."""
        held, self._held = self._held, None
        if held:
            _show_watches(held)
        self.recorder.step_raised()

    def _counted(self, args, kwargs):
        """(args, kwargs) of an optimizer's ``step`` with its closure made to count its calls
        in ``closure_calls`` (where one call's backward passes end and the next's begin: the
        stale_grad probe asks whether the closure reset the gradients before each); None where
        the closure is not one."""
        if kwargs.get("closure") is not None:
            closure, pos = kwargs["closure"], False
        elif len(args) > 1 and callable(args[1]):
            closure, pos = args[1], True
        else:
            return None

        def counted(*a, **k):
            self.closure_calls += 1
            self.in_closure += 1
            try:
                return closure(*a, **k)
            finally:
                self.in_closure -= 1
        if pos:
            return (args[0], counted, *args[2:]), kwargs
        return args, dict(kwargs, closure=counted)

    def scaler_skipped(self, scaler, opt) -> None:
        """A GradScaler skipped the optimizer's step (_scaler_step): the iteration is no step
        (StepRecorder.scaler_skipped), unless the scale it ran at was below 1 already: then
        no loss scale mends its NaN or Inf gradients (a NaN the backward makes, sqrt at 0; an
        overflow of the gradients themselves), and the scaler would skip every step from here
        on, a run nndb would record nothing of.  Such an iteration is a step of its own (one
        optimizer, or none stepped yet): its loss, its gradients (NaN, no optimizer took them)
        and its clip total are the step's, seen by ``nonfinite`` and ``catch nan``."""
        self.busy += 1
        hidden = _PROFILING() and unprofiled()
        self.scaler_skips += 1
        try:
            scale = getattr(scaler, "_scale", None)
            if isinstance(scale, torch.Tensor) and scale.numel() == 1 and float(scale) < 1.0 \
                    and self.clock.mode in (Mode.SINGLE, Mode.UNKNOWN) and not self.recorder.manual:
                # (its gradients are this iteration's, whatever the marks of the last say: a new
                # .grad after zero_grad() may take the id of the one it replaced)
                # (nor are they covered by the skips before it: StepRecorder.scaler_skipped)
                marks, covered = self.recorder._grad_marks, self.recorder._buckets[-1].covered
                for p in self.recorder._plan(opt).params:
                    marks.pop(id(p), None)
                    covered.discard(id(p))
                self._close(self.clock._close())
            else:
                self.recorder.scaler_skipped(opt, self._known_optimizers or ())
        except Exception:
            self._fail()
        finally:
            self.busy -= 1
            if hidden:
                profiled()

    def _scaler_skips(self, opt) -> bool:
        """An optimizer that applies a GradScaler's work itself (``fused=True``: torch's
        ``_step_supports_amp_scaling``) is stepped by ``scaler.step()`` with the scaler's
        ``found_inf`` as an attribute, and leaves its parameters as they were where that is
        not 0: the iteration made no step, as where the scaler skips ``step()`` itself
        (_scaler_step).  Read once a step (a host transfer on an accelerator)."""
        try:
            found = opt.found_inf
            if not (isinstance(found, torch.Tensor) and found.numel() == 1 and float(found) != 0.0):
                return False
            self._skipping = weakref.ref(opt)
            return True
        except Exception:
            return False

    def _loss_in_backward(self) -> None:
        """An optimizer steps inside a backward (PyTorch's "optimizer in backward" recipe: each
        parameter's optimizer stepped by its post-accumulate-grad hook, no step() after
        backward()): the backward's loss is the step's that its optimizers make, so it is
        taken now, from the engine's frame, before they step and the step ends within this
        backward.  Taken at its end, it came after the step and went to the next (whose
        zero_grad, also in the hooks, then dropped it as a loss no optimizer applied): every
        step but the run's last had no loss."""
        self._loss_early = _IN_BACKWARD()
        roots = backward_roots()
        self._take_loss(roots[0] if roots and isinstance(roots[0], torch.Tensor) else None)

    def _opt_post(self, opt, args, kwargs, held=False):
        if self._wrapping and not held and not self._failed and opt in self._wrapped_by \
                and self._defer_post(opt, args, kwargs):
            return None             # (``held``: _outer_returned, the wrapper's step() returned)
        if self._skipping is not None and self._skipping() is opt:
            self._skipping = None          # (a step the optimizer skipped itself: _scaler_skips)
            self.scaler_skips += 1
            if not self._failed:
                self.busy += 1
                hidden = _PROFILING() and unprofiled()
                try:
                    self.recorder.scaler_skipped(opt, self._known_optimizers or ())
                except Exception:
                    self._fail()
                finally:
                    self.busy -= 1
                    if hidden:
                        profiled()
            return None
        self.optimizer_posts += 1           # (did a GradScaler's step() step the optimizer: _scaler_step)
        if self._failed:
            return None
        lin = self.lineage
        paused = lin.paused() if lin is not None else None
        self.busy += 1
        hidden = _PROFILING() and unprofiled()
        off = _hide_watches(self) if self.watching else None
        if self._held is not None:          # (off since the step's pre hook: back as this one returns)
            off, self._held = (off or []) + self._held, None
        try:
            if paused is not None:
                paused.__enter__()
            if self.clock.absorbing is not None:
                self._manual_update_ends(opt)
                return None
            self.recorder.optimizer_post(opt)
            if self.lineage is not None or self.within.optimizer:
                self._tell_optimizer(opt, "post")
            # (the first iteration of several optimizers: once each has stepped, counted afresh,
            # since one may have been made after the count as learning began, the step ends here)
            n = self._optimizer_count(None, fresh=True) \
                if self.clock.mode is Mode.LEARNING and self.clock.completes_iteration(opt) else None
            close = self.clock.optimizer_post(opt, n)
            if self.clock.mark:
                self.recorder.mark()
            if close is not None:
                self._close(close)
            # The module hooks for the next forward (sync_forward), asked again only when what
            # decides them may have changed: the recorder's answers, the listeners within a
            # step, the op recorder, the naming's freeze; whole tensors' rules ask every step.
            rec = self.recorder
            key = (rec.recording, rec.acts, self.within.version, self.lineage, self.naming._frozen)
            if key != self._forward_key or (rec.fulltensors is not None and rec.fulltensors.rules):
                self._forward_key = key
                self.sync_forward()
        except Exception:
            self._fail()
        finally:
            self.busy -= 1
            if off:
                _show_watches(off)
            if hidden:
                profiled()
            if paused is not None:
                paused.__exit__(None, None, None)
        return None

    def _manual_update_ends(self, opt) -> None:
        """The first step of an optimizer after hand-written updates, which applied the
        gradients of the backward that ended the last step (StepClock.optimizer_pre), returns:
        that step's record, waiting for its update, is written now, with this one (it was
        written as the optimizer began, with an update of 0, and the optimizer's step was a
        step of its own, with no loss and the same gradients)."""
        self.clock.optimizer_post(opt)
        self.recorder.end_manual()
        self.recorder.manual = False
        self._flush_full()
        if self.lineage is not None or self.within.optimizer:
            self._tell_optimizer(opt, "post")
        self.sync_forward()

    def _defer_post(self, opt, args, kwargs) -> bool:
        """``opt``'s step returns inside a step() of another object that holds it and goes on
        after it (a Lookahead's slow-weight update, PostLocalSGDOptimizer's model averaging):
        its post hook (the step's end: parameters, updates, the stop) waits for the outermost
        such call to return, seen by a profile function on its frame for as long as it runs
        (none where another profiler is in place: the step then ends here, as it did)."""
        if self._deferred is not None:
            self._deferred.append((opt, args, kwargs))
            return True
        codes = self._wrapped_by.get(opt)
        if sys.getprofile() is not None:
            return False
        f, outer = sys._getframe(2), None
        for _ in range(16):
            if f is None:
                break
            if f.f_code in codes:
                outer = f
            f = f.f_back
        if outer is None:
            return False
        self._deferred = [(opt, args, kwargs)]

        def on_return(frame, event, arg):
            if frame is outer and event == "return":
                self._outer_returned()
        self._on_return = on_return
        sys.setprofile(on_return)
        return True

    def _outer_returned(self) -> None:
        """The wrapper's step() returned (_defer_post): the posts it held back run now."""
        if self._on_return is not None and sys.getprofile() is self._on_return:
            sys.setprofile(None)
        self._on_return = None
        deferred, self._deferred = self._deferred or [], None
        for opt, args, kwargs in deferred:
            self._opt_post(opt, args, kwargs, True)

    def _tell_optimizer(self, opt, when: str) -> None:
        """The op recorder and the rules' probes see each optimizer step ("pre"/"post")."""
        if self.lineage is not None:
            self.lineage.optimizer(opt, when)
        for cb in self.within.optimizer:
            cb(opt, when)

    def optimizers(self) -> list:
        """The optimizers that have stepped in this run."""
        out = list(map(weakref.ref.__call__, self.optimizer_refs))     # (no Python frame per optimizer)
        if None in out:                  # (an optimizer the script let go of)
            self.optimizer_refs[:] = [r for r in self.optimizer_refs if r() is not None]
            out = [o for o in out if o is not None]
        return out

    def _first_sight(self, opt) -> None:
        frame = user_frame(3)
        if opt not in self._opt_seen:
            self.optimizer_refs.append(weakref.ref(opt))
            self.clock.seen(opt, call_site(frame))
        self._opt_seen[opt] = len(opt.param_groups)
        self.naming.refresh()
        # Parameters of no model a module hook saw (a model that runs inside a torch.compile'd
        # training step, where the hooks do nothing; one called through .forward()): their
        # model, a variable of the script's, is a root as a called one is (named '0.weight' as
        # uncompiled, listed by `info params`), not loose tensors ('model.0.weight')
        unseen = [p for g in opt.param_groups for p in g["params"] if not self.naming.has_path(p)]
        if unseen:
            for module in owning_modules(unseen, frame):
                self.naming.add_root(module, frame)
        oname = self.naming.optimizer_name(opt, frame)
        for gi, g in enumerate(opt.param_groups):
            for pi, p in enumerate(g["params"]):
                self.naming.note_param(p, frame, fallback=lambda: f"{oname}.group{gi}.{pi}")
                self._hook_param(p)

    def _flush_full(self) -> None:
        ft = self.recorder.fulltensors
        if ft is not None:
            ft.flush()

    def _close(self, close: Close) -> None:
        # No forward pass is running at a step boundary (a forward that raised ended its
        # calls too: _forward_raised).
        self.module_depth, self._ran = 0, set()
        ft = self.recorder.fulltensors
        if ft is not None and ft.rules and self.recorder.manual:
            # (no optimizer: a hand-written update; the whole gradients and parameters are taken here)
            ft.manual_step_end(self.naming, self.naming.root_params(), close.step)
        # (one closing optimizer, another stepping in some steps only: a WGAN's critic and
        # generator; the closer's loss is the step's $loss, at every step alike)
        clock = self.clock
        # (clock.closer, inline: every step)
        lead = clock._closer() if clock.mode is Mode.SINGLE and clock._closer is not None else None
        if clock.joins and clock.joins.get(close.step):
            self._joined(close.step, told=close.retro is None)
        self.recorder.close(close.step, retro=close.retro, lead=lead)
        if self.on_step_end is not None:
            self.on_step_end(close.step)
        self.backward_began = None

    def _joined(self, step: int, told: bool) -> None:
        """``step`` holds alone the first step of an optimizer that joined the closer's
        iteration after that iteration's step had closed (StepClock._decide): its loss is
        ``loss/<optimizer>`` from here (the closer's is ``loss``), and the user is told
        (not again by a replica ``told`` of it, which closes the step at its own end)."""
        self.naming.loss_qualified = True
        opt = self.clock.closer
        if self.on_note is not None and opt is not None and not told:
            name = self.naming.optimizer_name(opt)
            self.on_note("steps_joined", f"step {step} holds {name}'s first step alone: it first "
                         f"stepped after step {step - 1}, the step of its iteration, had closed (a closed step is "
                         f"not reopened); from step {step + 1} on a step is one iteration, {name}'s step its last "
                         f"(this extra step moves the later steps' numbers on by one)")


# Hooks that run inside a compiled step or optimizer step: never compiled themselves
for _fn in (_backward, Tracer._opt_pre, Tracer._opt_post, Tracer._param_registered,
            Tracer._grad_accumulated, Tracer._backward_end):
    never_compiled(_fn)
for _fn in (Tracer._forward_pre, Tracer._forward_post, _clipped):
    never_compiled(_fn, inlined=False)
