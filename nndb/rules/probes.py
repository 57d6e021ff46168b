"""Probes: what some rules need beyond the recorded statistics, gathered by
thin hooks while a step runs and handed to the rules at the step's end
(``take(step)`` returns the step's facts and starts afresh).

A probe is installed only while a rule that names it is enabled, and its
callbacks are in the tracer only for the steps it ``wants``.  It hooks in
through the tracer's within-step listener lists (``tracer.within``,
nndb.tracer.within: a module class's list, called after a forward of that
class with its inputs and output; ``"root"`` before a root module's forward;
``"optimizer"`` at each optimizer step; ``"backward"`` as a backward begins) so it adds no
global hook of its own.  A probe
never raises into the script: the tracer's guard catches and reports.

``PROBES`` maps a probe name to its class; rules name probes in ``PROBES``.
"""
from __future__ import annotations


class Probe:
    name = ""
    MODULE_TYPES: tuple = ()          # module classes whose forward calls this probe sees

    def __init__(self, rec):
        self.rec = rec
        self.tracer = rec.tracer
        self.naming = rec.naming
        self.facts: dict = {}
        self.error = None

    # Called (no argument) when the probe fails: the engine's, set as it installs the probe,
    # so that a step end asks the probes for errors only after one failed.
    on_fail = None
    # Called (no argument) when a probe whose callbacks stay in without arming the step (ScaledClip:
    # a rare event) got facts: the engine takes the probes' facts at this step's end.
    on_fact = None

    def fail(self, message: str) -> None:
        """The probe is off, and says ``message`` (once: nndb.rules.engine.take_errors)."""
        self.error = message
        if self.on_fail is not None:
            self.on_fail()

    def held_tensors(self) -> list:
        """The tensors this probe keeps between steps (``info memory``)."""
        return []

    _armed = False                    # its callbacks are in the tracer now
    ROOT = False                      # see every root module's inputs (``root``)
    ROOT_OUTPUT = False               # see every root module's output (``root_output``)
    OPTIMIZER = False                 # see every optimizer step (``optimizer``)
    SCALED_CLIP = False               # see a GradScaler's step after a clip of scaled gradients (``scaled_clip``)
    BACKWARD = False                  # see each backward begin, with its roots (``backward``)

    def _hooks(self) -> list:
        if getattr(self, "_wrapped", None) is None:
            out = [(cls, self._guard(self.forward)) for cls in self.MODULE_TYPES]
            if self.ROOT:
                out.append(("root", self._guard(self.root)))
            if self.ROOT_OUTPUT:
                out.append(("root_output", self._guard(self.root_output)))
            if self.OPTIMIZER:
                out.append(("optimizer", self._guard(self.optimizer)))
            if self.SCALED_CLIP:
                out.append(("scaled_clip", self._guard(self.scaled_clip)))
            if self.BACKWARD:
                out.append(("backward", self._guard(self.backward)))
            self._wrapped = out
        return self._wrapped

    def _guard(self, fn):
        """A probe that fails is switched off (and says so once); the recording goes on."""
        def call(*args):
            if self.error is not None:
                return
            try:
                fn(*args)
            except Exception as e:
                self.fail(f"probe {self.name} failed and is off: {type(e).__name__}: {e}")
        return call

    def wants(self, step: int) -> bool:
        """Is the probe needed during ``step``?  The engine takes its callbacks
        out of the tracer for the steps it does not want (``arm``), so that a
        module call costs it nothing then."""
        return True

    def install(self) -> None:
        self.arm(True)

    def uninstall(self) -> None:
        self.arm(False)

    def arm(self, on: bool) -> None:
        if on == self._armed:
            return
        self._armed = on
        within = self.tracer.within
        if on:
            within.join_all(self._hooks())
        else:
            within.leave_all(self._hooks())

    def forward(self, module, use: int, args, output) -> None:
        """After ``module``'s forward (its ``use``-th call in this forward pass)."""

    def root(self, module, args) -> None:
        """Before a root module's forward (the model called by the script)."""

    def root_output(self, module, output) -> None:
        """After a root module's forward: what it returned."""

    def optimizer(self, opt, when: str) -> None:
        """At an optimizer step: ``when`` is "pre" or "post"."""

    def backward(self, roots) -> None:
        """A backward begins: ``roots``, the tensor or tensors it differentiates (None where
        the tracer does not know them)."""

    def scaled_clip(self, opt, clips: list, scale) -> None:
        """A GradScaler steps ``opt``, whose gradients clip_grad_norm_ clipped ((total it
        returned, max_norm) in ``clips``) while they were still scaled by ``scale``
        (nndb.tracer.within)."""

    def take(self, step: int) -> dict:
        out, self.facts = self.facts, {}
        return out

    def act_name(self, module, use: int) -> str:
        """The activation series name of this call (``act``, ``act#2``)."""
        base = self.naming.module_name(module)
        return f"{base}#{use + 1}" if use else base


PROBES: dict = {}


def register(cls):
    PROBES[cls.name] = cls
    return cls
