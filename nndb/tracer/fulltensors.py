"""Which whole tensors are kept, and the copies taken of them (``--record-full``).

``FullRule``: a kind (param, grad, act), a name glob, every how many steps,
and the precision asked for.  ``FullTensors`` holds the rules and is called by
the recorder at the moments the series are defined: a gradient at its
optimizer's ``step()`` call, before the update (after backward, before the
optimizer and the next ``zero_grad``); a parameter at that step's return;
an activation at its module's forward hook.  A loop without an optimizer
(a hand-written update) ends its steps at ``backward()``: the gradients
are taken there, and the parameters, after the update, at the next step's
end (or the run's), under the step they belong to (``manual_step_end``).  The copy is taken there (a new
host tensor: nothing of the script's is changed or kept alive) and handed to
the trace writer, which bounds what waits (nndb.store.fullstore).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from .. import globs
from ..errors import UsageError
from ..schema import FULL_KINDS, FULL_PRECISIONS as REQUESTABLE, KIND_WORDS


@dataclass(frozen=True)
class FullRule:
    kind: str
    glob: str
    every: int = 1
    precision: str = "fp16"

    def describe(self) -> str:
        return f"{self.kind}:{self.glob} every {self.every} step(s) in {self.precision}"


def parse_rule(spec: str, every: Optional[int] = None, precision: Optional[str] = None) -> FullRule:
    """``KIND:GLOB`` (``grad:conv*``) -> FullRule; UsageError with the reason."""
    kind, sep, glob = spec.partition(":")
    kind = KIND_WORDS.get(kind.strip().lower(), kind.strip().lower())
    if not sep or not glob.strip():
        raise UsageError(f"--record-full takes KIND:GLOB (for example 'grad:conv*'), not {spec!r}")
    if kind not in FULL_KINDS:
        raise UsageError(f"--record-full {spec}: whole tensors are kept of {', '.join(FULL_KINDS)}, "
                         f"not {kind!r}")
    return FullRule(kind, glob.strip(), check_every(every), check_precision(precision))


def check_every(every: Optional[int]) -> int:
    if every is None:
        return 1
    if every < 1:
        raise UsageError(f"--full-tensors-every must be a positive number of steps, not {every}")
    return int(every)


def check_precision(precision: Optional[str]) -> str:
    p = (precision or "fp16").lower()
    if p not in REQUESTABLE:
        raise UsageError(f"--precision takes {'|'.join(REQUESTABLE)}, not {precision!r}")
    return p


class FullTensors:
    """The rules, and the copies taken for the writer.  ``keep(meta, nbytes,
    copy) -> bool`` is the trace writer's ``full_tensor``; ``recorded(step)
    -> bool``, the run's schedule (``--every``, ``--steps``): a step it does
    not record keeps no whole tensor either."""

    def __init__(self, rules=(), keep: Optional[Callable] = None, recorded: Optional[Callable] = None,
                 release: Optional[Callable] = None):
        self.rules: list = list(rules)
        self.keep = keep
        # ``release()``: the tensors kept before step 0 ended (``keep(..., unnamed=True)``, which
        # no flush writes: a reader's at a stop in step 0, the 32-tensor bound) may be written
        # now, under their settled names (``settle``)
        self.release = release
        self.recorded = recorded
        self.kept = 0
        self._pending: Optional[tuple] = None     # (naming, params, step): a hand-written update's parameters
        # (meta, name) of the tensors kept before step 0 ends, while names may still be qualified
        # (a GAN's two models: 'weight' is 'D.weight' from then on): settle() renames them
        self._unsettled: list = []
        # While the step clock learns an iteration (Recorder.mark), the copies taken in each
        # segment after the first, held until the step closes: a step closed after the fact
        # leaves its later segments to the next step, under whose number they are kept (close,
        # called only while something is held: the recorder reads ``held`` itself)
        self.held: list = []

    def set_rules(self, rules) -> None:
        self.rules = list(rules)

    def wants(self, kind: str, step: int) -> bool:
        if self.recorded is not None and not self.recorded(step):
            return False
        for r in self.rules:
            if r.kind == kind and step % r.every == 0:
                return True
        return False

    def rule_for(self, kind: str, name: str, step: int) -> Optional[FullRule]:
        """The last rule that takes ``kind name`` at ``step`` (a later rule overrides)."""
        found = None
        if self.recorded is not None and not self.recorded(step):
            return None
        for r in self.rules:
            if r.kind == kind and step % r.every == 0 and globs.matches(name, r.glob):
                found = r
        return found

    def activation(self, naming, key, output, step: int) -> None:
        """A module's output at its forward hook (``key``: module, use in the pass)."""
        from .recorder import first_float_tensor
        t = output if type(output) is torch.Tensor and not output.is_nested else first_float_tensor(output)
        if t is not None:
            def name():
                base = naming.module_name(key[0])
                return f"{base}#{key[1] + 1}" if key[1] else base
            alias = None if naming.frozen else naming.qualified_alias(key[0])
            if alias is not None and key[1]:
                alias = f"{alias}#{key[1] + 1}"
            self.take("act", name(), step, t, None if naming.frozen else name, alias)

    def params(self, naming, params, kind: str, step: int) -> None:
        """Gradients (at an optimizer's step(), before the update) or values (at its return)."""
        for p in params:
            t = p.grad if kind == "grad" else p
            if t is not None:
                self.take(kind, naming.param_name(p), step, t,
                          None if naming.frozen else (lambda p=p: naming.param_name(p)),
                          None if naming.frozen else naming.qualified_param_alias(p))

    def manual_step_end(self, naming, params, step: int) -> None:
        """A step of a loop without an optimizer ended at its ``backward()``:
        its gradients are taken now; its parameters once the hand-written
        update has run, at the next step's end or the run's (``flush``)."""
        self.flush()
        if self.wants("grad", step):
            self.params(naming, params, "grad", step)
        if self.wants("param", step):
            self._pending = (naming, list(params), step)

    def flush(self) -> None:
        """The parameters a hand-written update has now made (see manual_step_end)."""
        if self._pending is not None:
            naming, params, step = self._pending
            self._pending = None
            self.params(naming, params, "param", step)

    def settle(self) -> None:
        """Step 0 has ended and names are settled (Naming.freeze): the tensors
        kept before, still waiting for the writer, take the names their
        series have (written ones keep theirs)."""
        for meta, name in self._unsettled:
            meta["name"] = name()
            if self.rule_for(meta["kind"], meta["name"], meta["step"]) is None:
                meta["dropped"] = True      # (taken for the name it might have had: it has not)
        self._unsettled = []
        if self.release is not None:
            self.release()

    def mark(self) -> None:
        """A new segment of the open step begins (Recorder.mark)."""
        self.held.append([])

    def close(self, step: int, retro: Optional[int] = None) -> None:
        """``step`` closes (Recorder.close): the copies held from its segments are
        kept, those of the segments from ``retro`` on (a step closed after the fact:
        they start the next step) as step + 1's, if a rule takes them there.  Called
        after ``settle``: a copy taken before step 0 ended takes its settled name."""
        held, self.held = self.held, []
        for i, segment in enumerate(held):
            moved = retro is not None and i + 1 >= retro
            for meta, nbytes, flat, settled_name in segment:
                if settled_name is not None:
                    meta["name"] = settled_name()
                if moved:
                    meta["step"] = step + 1
                if self.rule_for(meta["kind"], meta["name"], meta["step"]) is None:
                    continue
                self._keep(meta, nbytes, flat, None)

    def _keep(self, meta: dict, nbytes: int, flat, settled_name) -> None:
        copy = flat if callable(flat) else (lambda: flat)
        kept = self.keep(meta, nbytes, copy, unnamed=True) if settled_name is not None and \
            self.release is not None else self.keep(meta, nbytes, copy)
        if kept:
            self.kept += 1
            if settled_name is not None:
                self._unsettled.append((meta, settled_name))

    def take(self, kind: str, name: str, step: int, t: torch.Tensor, settled_name=None,
             alias: Optional[str] = None) -> None:
        """Keep a copy of ``t`` as ``kind name`` at ``step`` if a rule asks for it
        (``settled_name()``: its name once step 0 has ended, where it may change;
        ``alias``: the name qualified by its model's variable, which it has then
        if the run has several models: a rule for either takes it, and ``settle``
        drops it if the name it settles on is not the rule's)."""
        if self.keep is None or not isinstance(t, torch.Tensor) or not t.is_floating_point() \
                or t.is_sparse or t.is_complex():
            return
        rule = self.rule_for(kind, name, step) or (self.rule_for(kind, alias, step) if alias else None)
        if rule is None:
            return
        meta = {"name": name, "kind": kind, "step": int(step), "shape": [int(n) for n in t.shape],
                "dtype": str(t.dtype).replace("torch.", ""), "asked": rule.precision}
        nbytes = t.numel() * t.element_size()
        if self.held:
            self.held[-1].append((meta, nbytes, _host_copy(t), settled_name))
        else:
            self._keep(meta, nbytes, lambda: _host_copy(t), settled_name)


def _host_copy(t: torch.Tensor) -> np.ndarray:
    """A flat host copy of ``t``'s values, in a numpy float dtype (bfloat16
    widened to float32, exactly)."""
    with torch.no_grad():
        c = t.detach()
        if c.dtype not in (torch.float16, torch.float32, torch.float64):
            c = c.float()
        c = c.to("cpu", copy=True).reshape(-1)
    return c.numpy()
