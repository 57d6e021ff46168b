"""The tracer's within-step consumers as listener lists: what nndb's parts
join to see a step while it runs, the counterpart of the step end's
pipeline (nndb.tracer.pipeline).  The tracer calls each list at its event,
in the order joined; an event nobody listens to costs a test of an empty
list, and the module hooks are in only while someone listens to module
calls (a module class's list, ``root`` or ``module``: nndb.tracer.hooks.Tracer.sync_forward).

The events (``join(event, callback)``, ``leave(event, callback)``):

* a module class: ``(module, use, args, output)`` after a forward of that
  class (``use``: its call's number within the forward pass) — the rules'
  probes (nndb.rules.probes), ``nndb check``'s model outputs;
* ``"root"``: ``(module, args)`` before a root module's forward (the model the
  script calls); ``"root_output"``: ``(module, output)`` after it;
* ``"optimizer"``: ``(optimizer, "pre" | "post")`` at an optimizer step;
* ``"loss"``: ``(tensor)`` a backward's loss, after the recorder took it — the
  op recorder's label (nndb.lineage.ops), ``nndb check``;
* ``"no_loss"``: ``()`` a backward whose root is no tensor;
* ``"scaled_clip"``: ``(optimizer, clips, scale)`` a GradScaler's ``step(optimizer)``
  after clip_grad_norm_ clipped that optimizer's gradients before the scaler unscaled
  them (clips: (the total it returned, its max_norm) each; the scaler's scale tensor) — the rules' probe
  (nndb.rules.model_probes.ScaledClip);
* ``"backward"``: ``(roots)`` a backward begins, before it runs (its graph and the
  tensors autograd saved are still there): ``roots`` the tensor or tensors it
  differentiates, None where the tracer does not know them (a backward seen by a
  parameter's hook) — the activation probes' functional calls
  (nndb.rules.model_probes.graph_activations);
* ``"module"``: ``(module, "forward" | "backward", inputs | grad_output)`` at
  every module call, and with ``module_backward`` at its backward too — the
  debugger's stop points in modules.

A callback never raises into the script: the tracer's guard catches it
(a probe has a guard of its own, which switches only that probe off).
"""
from __future__ import annotations

from typing import Callable

EVENTS = ("root", "root_output", "optimizer", "loss", "no_loss", "backward", "module", "scaled_clip")


class WithinStep:
    def __init__(self):
        self.forward: dict = {}             # module class -> [callback]
        self.root: list = []
        self.root_output: list = []
        self.optimizer: list = []
        self.loss: list = []
        self.no_loss: list = []
        self.backward: list = []
        self.scaled_clip: list = []
        self.module: list = []
        self.module_backward = False        # "module" listeners see backward calls too
        self.version = 0                    # moves at every join and leave (the tracer's module hooks follow)

    def join(self, event, callback: Callable) -> None:
        """``callback`` is called at ``event`` (a module class or one of EVENTS) from now on
        (once: joining again changes nothing)."""
        self.join_all(((event, callback),))

    def leave(self, event, callback: Callable) -> None:
        """No more calls of ``callback`` at ``event`` (a callback not joined: nothing)."""
        self.leave_all(((event, callback),))

    def join_all(self, pairs) -> None:
        """``join(event, callback)`` for each (event, callback) of ``pairs``, in one call (a
        probe's module classes: ~30 of them, joined and left as the rules' steps come and go)."""
        forward = self.forward
        for event, callback in pairs:
            calls = forward.setdefault(event, []) if isinstance(event, type) else \
                getattr(self, event) if event in EVENTS else self._list(event)     # (no call a probe's event)
            if callback not in calls:
                calls.append(callback)
                self.version += 1

    def leave_all(self, pairs) -> None:
        """``leave(event, callback)`` for each (event, callback) of ``pairs``, in one call."""
        forward = self.forward
        for event, callback in pairs:
            by_class = isinstance(event, type)
            calls = forward.get(event) if by_class else getattr(self, event) if event in EVENTS else self._list(event)
            if calls is not None and callback in calls:
                calls.remove(callback)
                self.version += 1
            if by_class and not calls:
                forward.pop(event, None)

    def _list(self, event: str) -> list:
        if event not in EVENTS:
            raise ValueError(f"no such event within a step: {event!r} (a module class or one of {EVENTS})")
        return getattr(self, event)
