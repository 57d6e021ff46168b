"""A TorchFunctionMode that shows nndb the script's torch function calls
(``torch.nn.functional``'s losses, the arithmetic of a hand-written loss),
for the first steps only: ``nndb check`` (nndb.check.capture) and the loss
rules' probe (nndb.rules.loss_watch) both look through it.

``FunctionWatch(on_call)`` runs every call unchanged, then hands
``on_call(func, args, kwargs, out)`` what it saw; an error in ``on_call`` is
kept in ``error`` and switches the watch off, never raised into the script.
While the call runs the mode is off the stack (PyTorch pops it for its own
``__torch_function__``), so what a functional loss does inside is not seen,
nor is what ``on_call`` computes.  ``FunctionWatch(on_call, quiet=tracer)``
lets the calls of nndb's own hooks through unseen, without the trampoline;
better, those hooks take it off the stack while they work (``hide`` /
``show``), so that their tensor calls do not go through PyTorch's mode
dispatch at all (~3 us a call, seen or not: on a sampled GPT step the
statistics', histograms' and probes' ~1,600 calls cost more than the step's
own ~300), and keep it off from an optimizer step's pre hook to its post
hook (an optimizer's arithmetic is no loss; nndb.tracer.hooks.Tracer).

``push()`` / ``remove()`` put it on the (thread-local) mode stack and take it
off again from wherever it is, the modes above it kept in order, so that a
mode the script entered meanwhile still leaves with its own ``with``.

A mode on the stack is part of what torch.compile traces and guards: the
watch leaves the stack as Dynamo starts compiling anything (its compile-start
callback) and is not pushed again (``compiled``), so that compiled code is
traced, and runs, as without nndb.
"""
from __future__ import annotations

import os
import sys
import threading
import types
import weakref
from typing import Callable, Optional

import torch

from .quiet import PROFILING as _PROFILING, profiled, unprofiled
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.overrides import (TorchFunctionMode, _get_current_function_mode_stack, _pop_mode,
                             _push_mode)

_COMPILING = torch.compiler.is_compiling      # (True while torch.compile traces)
_FUNCTORCH = torch._C._functorch.peek_interpreter_stack     # (not None inside a torch.func transform)
_STACK_LEN, _STACK_AT = torch._C._len_torch_function_stack, torch._C._get_function_stack_at
_STACK_POP, _STACK_PUSH = torch._C._pop_torch_function_stack, torch._C._push_on_torch_function_stack

# torch.nn.functional losses: (input, target, ...) -> loss
CLASS_LOSSES = ("cross_entropy", "nll_loss")
BINARY_LOSSES = ("binary_cross_entropy", "binary_cross_entropy_with_logits")
ELEMENTWISE_LOSSES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "soft_margin_loss",
                      "kl_div", "poisson_nll_loss", "gaussian_nll_loss") + BINARY_LOSSES
LOSSES = CLASS_LOSSES + ELEMENTWISE_LOSSES


def functional_loss(func) -> Optional[str]:
    """The name of a torch.nn.functional loss (``"mse_loss"``), or None (kept in LOSS_OF)."""
    name = getattr(func, "__name__", "")
    name = name if name in LOSSES and getattr(func, "__module__", "") == "torch.nn.functional" else None
    if len(LOSS_OF) < 4096:                 # (a few hundred torch functions in a run)
        LOSS_OF[func] = name
    return name


# func -> functional_loss(func), for the functions seen so far: a watch's per-call test is a
# dict lookup (``LOSS_OF.get(func, UNSEEN)``), not a call
LOSS_OF: dict = {}
UNSEEN = object()


class FunctionWatch(TorchFunctionMode):
    """Sees the script's torch function calls; every call goes through unchanged."""

    def __init__(self, on_call: Callable, quiet=None):
        super().__init__()
        self.on_call = on_call
        # the tracer, whose ``in_hook`` (a module hook) or ``busy`` (a step
        # boundary) is set while nndb's own hooks run: their tensor work goes
        # straight through, unseen (on a sampled MLP step it was ~140 of the
        # ~150 calls the mode saw)
        self.quiet = quiet
        self.error: Optional[str] = None
        self._pushed = False
        self.hidden = False              # off the stack while nndb's hook works (hide): show puts it back
        self.on = True                   # False: still on the stack (a removal pending), seeing nothing
        self._depth = 0                  # calls of ours running (PyTorch pops the mode during each)
        self._cleanup = None             # the module pre-hook that removes it at a safe point
        self._thread: Optional[int] = None
        # Dynamo compiled something while it was pushed (or a compiled module is in use): off
        # for good.  With the watch on the stack Dynamo traced into __torch_function__ and
        # guarded on the stack: a compiled train step whose user hook broke the graph had 14
        # graphs where python has 10 (three of nndb's frames compiled, and the step, a ReLU,
        # the hook and the resumed frame compiled again as the watch left the stack)
        self.compiled = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if _CALLBACK is None and "torch._dynamo" in _MODULES:
            # (torch.compile imported it since the push, as a script's first lines do: told
            # before the compiled function's first call, which has torch calls before it)
            _watch_compiles(self)
        if _COMPILING():
            # (torch.compile tracing: the call as it is, no graph break at our frames; and
            # not pushed again, where Dynamo began compiling before its callback was set)
            self.compiled = True
            return func(*args, **(kwargs or {}))
        q = self.quiet
        if q is not None and (q.in_hook or q.busy) or _FUNCTORCH() is not None:
            return func(*args, **(kwargs or {}))
        self._depth += 1
        try:
            func, out = _call_from_caller(func, args, kwargs or {})
        finally:
            self._depth -= 1
        if self.on and self.error is None:
            hidden = _PROFILING() and unprofiled()      # (what on_call computes: no rows in the script's profile)
            try:
                self.on_call(func, args, kwargs or {}, out)
            except Exception as e:          # never into the script: off, and said once by the owner
                self.error = f"{type(e).__name__}: {e}"
            finally:
                if hidden:
                    profiled()
        return out

    def __enter__(self):
        """``with watch:`` is ``push()`` and ``remove()``, so that the tracer it knows takes it off
        the stack as its hooks do (``nndb check``'s LossMode: entered as TorchFunctionMode's,
        it stayed on the stack through a TransformerEncoder's forward, whose fused path it then
        turned off; nndb.tracer.hooks._FAST_PATHS)."""
        self.push()
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def push(self) -> None:
        """On the mode stack of this thread (no-op if it is on already, or once
        Dynamo has compiled something)."""
        if self.compiled:
            return
        self.on = True
        self._cancel_cleanup()
        if not self.pushed:
            _watch_compiles(self)
            if not self.hidden:             # (hidden by a hook that works now: it puts it back)
                _push_mode(self)
            self.pushed, self._thread = True, threading.get_ident()

    @property
    def pushed(self) -> bool:
        """On this thread's mode stack (or hidden from it by nndb's hook for a while)."""
        return self._pushed

    @pushed.setter
    def pushed(self, on: bool) -> None:
        if on != self._pushed and self.quiet is not None:
            self.quiet.watching += 1 if on else -1      # (its hooks hide the watches only where any is on)
        self._pushed = on

    def compile_started(self, *args) -> None:
        """Dynamo's compile-start callback (before it reads the mode stack): off now, for good."""
        try:
            self.compiled = True
            self.remove()
        except Exception as e:      # (never into the script's compile)
            self.error = self.error or f"{type(e).__name__}: {e}"

    def remove(self) -> bool:
        """Off the stack, wherever it is in it; False if it could not be now
        (another thread's stack; or inside one of its own calls, where PyTorch
        has popped it and pushes it back after: then it sees nothing more and
        leaves the stack at the next module call, a safe point)."""
        self.on = False
        if not self.pushed:
            return True
        if threading.get_ident() != self._thread:
            return False
        if self.hidden:                           # (off the stack while a hook works: not put back)
            self.pushed = False
            return True
        stack = _get_current_function_mode_stack()
        if not any(m is self for m in stack):
            if self._depth > 0:                   # inside a call of ours (a step that ends in backward())
                if self._cleanup is None:
                    self._cleanup = register_module_forward_pre_hook(self._remove_at_module_call)
                return False
            self.pushed = False                   # someone popped it already
            return True
        self._cancel_cleanup()
        take_out(self, _pop_mode, _push_mode)
        self.pushed = False
        return True

    def _remove_at_module_call(self, module, args):
        try:
            if not self.on and self._depth == 0:
                self.remove()
        except Exception as e:      # (never into the script)
            self.error = self.error or f"{type(e).__name__}: {e}"
            self._cancel_cleanup()
        return None

    def _cancel_cleanup(self) -> None:
        if self._cleanup is not None:
            self._cleanup.remove()
            self._cleanup = None



_WATCHES: "weakref.WeakSet" = weakref.WeakSet()     # the watches Dynamo's callback tells
_CALLBACK = None
_MODULES = sys.modules


def _watch_compiles(watch) -> None:
    """Have Dynamo tell ``watch`` when it starts compiling.  Only where the script has
    imported torch._dynamo (torch.compile, or an optimizer's first step): nndb never
    imports it.  One callback for the process, the watches held weakly."""
    global _CALLBACK
    _WATCHES.add(watch)
    dynamo = sys.modules.get("torch._dynamo")
    if _CALLBACK is not None or dynamo is None:
        return
    handler = getattr(dynamo, "callback_handler", None)
    if not hasattr(handler, "register_start_callback"):
        _CALLBACK = False            # (a torch without the callback: ``__torch_function__``'s own test)
        return

    def started(*args):
        for w in list(_WATCHES):
            w.compile_started()
    _CALLBACK = handler.register_start_callback(started) or started


def hide(tracer) -> list:
    """nndb's own work begins (a hook of ``tracer``): the pushed watches told of it
    (``quiet=tracer``) at the top of this thread's mode stack are taken off it, for
    ``show(hidden)`` to put back as the work ends, so that its tensor calls do not go
    through them.  (A watch under the script's own mode stays, and lets them through
    by ``quiet``; one removed meanwhile is not put back, one pushed again is.)"""
    hidden = []
    n = _STACK_LEN()
    while n:
        top = _STACK_AT(n - 1)
        if not isinstance(top, FunctionWatch) or top.quiet is not tracer or not top._pushed or top.hidden:
            break
        _STACK_POP()
        top.hidden = True
        hidden.append(top)
        n -= 1
    return hidden


def show(hidden: list) -> None:
    """The watches ``hide`` took off the stack back on it, in their order (those still pushed)."""
    for w in reversed(hidden):
        w.hidden = False
        if w._pushed:
            _STACK_PUSH(w)


def take_out(mode, pop, push) -> None:
    """``mode`` off a mode stack (torch's function or dispatch modes: ``pop``, ``push``)
    where it is, the modes above it put back in their order."""
    above = []
    while True:
        m = pop()
        if m is mode:
            break
        above.append(m)
    for m in reversed(above):
        push(m)


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_TRAMPOLINES: dict = {}     # (file, line, id(globals)) -> a function that calls from that line
# The trampolines' name: a frame of that name has the script's file and line
# but is nndb's (nndb.tracer.naming.user_frame and the lineage skip it).
TRAMPOLINE = "_nndb_call"


_OVERRIDES = os.path.join(_TORCH_DIR, "overrides.py")


def _call_from_caller(func, args, kwargs):
    """``(function, function(*args, **kwargs))``, called from a frame that has the caller's
    file, line and globals, so that a warning the call raises (PyTorch's
    ``stacklevel=2`` ones, and those its C++ code raises) names the script's
    line, as without nndb, not this module's; its once-per-line registry is
    the script's module's.

    The caller is the code that called the torch function (past torch's
    dispatch to this mode): for a function written in Python (``F.dropout2d``),
    the frame above its own, which called ``handle_torch_function``; for one
    in C++ (``torch.mm``), the frame the mode was called from.  That frame may
    be torch's own (``nn.Dropout2d.forward``), as the warning's line is then
    without nndb (it was the script's line above it: mnist_rnn's dropout2d
    warning named main.py:34 and :37, twice, not dropout.py:176 once).

    The function called is the one whose frame called ``handle_torch_function``
    where ``func`` is a wrapper the script put in its place (``F.relu =
    counting(F.relu)``, as a FLOP counter patches them): torch hands a mode the
    module's attribute, the wrapper, and calling it ran the wrapper a second time
    inside the first (a counter of F.relu calls read 2 a step under nndb, 1 under
    python)."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename == __file__ or frame.f_code.co_name == TRAMPOLINE):
        frame = frame.f_back
    if frame is not None and frame.f_code.co_filename == _OVERRIDES:
        while frame is not None and frame.f_code.co_filename == _OVERRIDES:
            frame = frame.f_back
        if frame is not None:
            func = _wrapped_by_the_script(func, frame.f_code, frame.f_back)
            frame = frame.f_back            # (past the function's own frame)
    if frame is None:
        return func, func(*args, **kwargs)
    g = frame.f_globals
    key = (frame.f_code.co_filename, frame.f_lineno, id(g))
    call = _TRAMPOLINES.get(key)
    if call is None or call.__globals__ is not g:
        src = "\n" * (frame.f_lineno - 1) + f"def {TRAMPOLINE}(f, a, k): return f(*a, **k)\n"
        ns: dict = {}
        exec(compile(src, frame.f_code.co_filename, "exec"), ns)
        call = _TRAMPOLINES[key] = types.FunctionType(ns[TRAMPOLINE].__code__, g, TRAMPOLINE)
        if len(_TRAMPOLINES) > 4096:          # (a script that calls from ever new lines: keep it bounded)
            _TRAMPOLINES.clear()
            _TRAMPOLINES[key] = call
    return func, call(func, args, kwargs)     # (a traceback through here: nndb.run.launcher.user_traceback)


_WRAPPED: dict = {}     # code object of a torch function -> the function (or None: not found)


def _wrapped_by_the_script(func, code, caller):
    """The torch function whose code ``code`` is, where ``func`` (what torch handed the mode)
    is a Python function of code outside torch: a wrapper the script (or a library of its)
    put in its place.  ``func`` itself otherwise: torch's own dispatchers (``max_pool2d``'s
    boolean_dispatch hands its ``_max_pool2d`` the dispatcher) stay as torch calls them.
    The function is looked for where a wrapper keeps it (``__wrapped__``, its closure, the
    variables of ``caller``, the frame that called it, and the wrapper's module), then among
    every object (not those a ``gc.freeze()`` set aside); not found, ``func``."""
    fcode = getattr(func, "__code__", None)
    if fcode is None or fcode is code or fcode.co_filename.startswith(_TORCH_DIR):
        return func
    if code in _WRAPPED:
        real = _WRAPPED[code]
        return real if real is not None else func

    def places():
        f = func
        while (f := getattr(f, "__wrapped__", None)) is not None:
            yield f
        for cell in getattr(func, "__closure__", None) or ():
            try:
                yield cell.cell_contents
            except ValueError:          # (an empty cell)
                pass
        if caller is not None:
            yield from caller.f_locals.values()
        yield from getattr(func, "__globals__", {}).values()
        import gc
        yield from gc.get_referrers(code)
    real = next((f for f in places() if isinstance(f, types.FunctionType) and f.__code__ is code), None)
    if len(_WRAPPED) < 4096:
        _WRAPPED[code] = real
    return real if real is not None else func
