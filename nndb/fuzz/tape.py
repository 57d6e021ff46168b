"""The script's loss computation, recorded once and replayed on mutants.

From the end of the model's forward pass to ``loss.backward()``, a
TorchFunctionMode notes every torch function call the script makes (the
arithmetic of a hand-written loss, ``F.cross_entropy``, a loss module's
functional call): the function, its arguments, and where each tensor
argument came from: the model's output, the model's input, an earlier call
on the tape, a parameter (used as it is), or anything else (kept as a
constant: the targets).  ``replay`` runs the calls the loss depends on again,
with a mutant's model output and inputs in their places, so the loss is
computed as the script computed it.

What is not replayed: Python arithmetic on numbers taken out of tensors
(``.item()``), control flow that depends on values, and randomness inside
the loss (each is replayed with the value of the recorded step).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from ..lineage.ops import script_location

BACKWARD = {torch.Tensor.backward, torch.autograd.backward}
MAX_CALLS = 4096          # a tape longer than this is not a loss computation: recording stops


@dataclass
class Call:
    func: Callable
    spec: object              # the pytree spec of (args, kwargs)
    leaves: list              # a leaf, or ("ref", key) for a tensor of the model or the tape
    where: tuple              # the script's (file, line)


class Tape(TorchFunctionMode):
    """``on_backward(tape, loss)`` is called at ``loss.backward()``, before it runs."""

    def __init__(self, inputs: list, outputs: list, on_backward: Callable):
        super().__init__()
        self.calls: list = []
        self.refs: dict = {}          # id(tensor) -> key ("in", i) | ("out", i) | ("call", k, j)
        self._alive: list = []        # the tensors of refs, kept alive (an id is not reused)
        self.on_backward = on_backward
        self.overflow = False
        for i, t in enumerate(inputs):
            self._name(t, ("in", i))
        for i, t in enumerate(outputs):
            self._name(t, ("out", i))

    def _name(self, t, key) -> None:
        if isinstance(t, torch.Tensor):
            self.refs[id(t)] = key
            self._alive.append(t)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in BACKWARD:
            loss = args[0] if args else kwargs.get("tensors")
            if isinstance(loss, torch.Tensor):
                self.on_backward(self, loss)
        out = func(*args, **kwargs)
        if not self.overflow:
            if len(self.calls) >= MAX_CALLS:
                self.overflow = True
            else:
                self._note(func, args, kwargs, out)
        return out

    def _note(self, func, args, kwargs, out) -> None:
        leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        coded = []
        for x in leaves:
            if isinstance(x, torch.Tensor):
                key = self.refs.get(id(x))
                if key is not None:
                    coded.append(("ref", key))
                elif isinstance(x, torch.nn.Parameter):
                    coded.append(x)                        # used as it is: gradients reach it
                else:
                    coded.append(x.detach().clone())       # a constant (a target)
            else:
                coded.append(x)
        k = len(self.calls)
        self.calls.append(Call(func, spec, coded, script_location(sys._getframe(2))))
        for j, t in enumerate(pytree.tree_leaves(out)):
            self._name(t, ("call", k, j))

    # -- what the loss needs ----------------------------------------------------------------
    def key_of(self, t) -> Optional[tuple]:
        return self.refs.get(id(t)) if isinstance(t, torch.Tensor) else None

    def needed(self, key: tuple) -> list:
        """The calls (indices, in order) that ``key`` depends on."""
        want, stack = set(), [key]
        while stack:
            k = stack.pop()
            if k[0] != "call" or k[1] in want:
                continue
            want.add(k[1])
            for x in self.calls[k[1]].leaves:
                if isinstance(x, tuple) and len(x) == 2 and x[0] == "ref":
                    stack.append(x[1])
        return sorted(want)

    def constants(self, calls: list) -> list:
        """The constant tensors the given calls use (the targets, mostly)."""
        return [x for k in calls for x in self.calls[k].leaves
                if isinstance(x, torch.Tensor) and not isinstance(x, torch.nn.Parameter)]

    def replay(self, key: tuple, inputs: list, outputs: list, calls: list,
               before: Optional[Callable[[int], None]] = None):
        """The value of ``key`` computed again from ``inputs`` and ``outputs``."""
        values: dict = {}

        def value(k):
            if k[0] == "in":
                return inputs[k[1]]
            if k[0] == "out":
                return outputs[k[1]]
            return values[k]

        for idx in calls:
            c = self.calls[idx]
            if before is not None:
                before(idx)
            leaves = [value(x[1]) if isinstance(x, tuple) and len(x) == 2 and x[0] == "ref"
                      else (x.clone() if isinstance(x, torch.Tensor) and not isinstance(x, torch.nn.Parameter)
                            else x)
                      for x in c.leaves]
            args, kwargs = pytree.tree_unflatten(leaves, c.spec)
            out = c.func(*args, **kwargs)
            for j, t in enumerate(pytree.tree_leaves(out)):
                values[("call", idx, j)] = t
        return value(key)
