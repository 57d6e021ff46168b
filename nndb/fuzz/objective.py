"""One mutant's evaluation: the model's forward pass on it, the loss as the
script computed it (nndb.fuzz.tape), the gradients of the loss (for the NaN
objective), the chosen layers' activation vectors for coverage, and whether
the objective is reached:

* ``nan``: a non-finite activation (the first module whose output is not
  finite), loss, or gradient (the first parameter);
* ``until``: a condition on ``loss`` / ``$loss`` (a float), ``output`` (the
  model's output), ``inputs`` (the mutant's input tensors), ``grad_norm``
  (for instance ``loss > 1e3``), true;
* ``against``: the model and its copy in float16 or bfloat16 disagree by
  more than ``tolerance`` (relative to the largest magnitude of the float32
  output, or of the loss), or the copy is not finite where the model is.

It runs on the replica's model in the mode the step ran it in (train or
eval) and changes no parameter (``torch.autograd.grad``, no accumulation).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch.utils import _pytree as pytree

from .search import Outcome

DEFAULT_TOLERANCE = {"float16": 1e-2, "bfloat16": 5e-2}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class Goal:
    until: str = "nan"                # "nan" or a condition's source
    against: Optional[str] = None     # "fp16" | "bf16"
    tolerance: Optional[float] = None
    code: object = None               # the compiled condition

    @property
    def wants_grads(self) -> bool:
        return self.until == "nan" and self.against is None or \
            (self.code is not None and "grad_norm" in self.until)


@dataclass
class Model:
    """What was captured of the step: the model, its call, the loss."""
    module: torch.nn.Module
    names: dict                       # module -> its name (nndb's naming)
    arg_leaves: list                  # the model's call (args, kwargs), flattened
    arg_spec: object
    tensor_at: list                   # indices of arg_leaves that are tensors
    tape: object = None               # nndb.fuzz.tape.Tape, or None: no loss to replay
    loss_key: Optional[tuple] = None
    loss_calls: list = field(default_factory=list)
    param_names: dict = field(default_factory=dict)     # id(parameter) -> its name
    rng: Optional[torch.Tensor] = None    # the CPU RNG state the step's forward began with (dropout)

    def seeded(self) -> None:
        """The RNG as the step's forward found it: each mutant (and the copy in another precision)
        draws the random numbers the step drew (its dropout mask), so that an input found
        reaches the objective when the script itself is given it at that step."""
        if self.rng is not None:
            torch.set_rng_state(self.rng)

    def inputs(self) -> list:
        return [self.arg_leaves[i] for i in self.tensor_at]

    def call(self, module, inputs: list, dtype=None):
        leaves = list(self.arg_leaves)
        for i, t in zip(self.tensor_at, inputs):
            leaves[i] = t.to(dtype) if dtype is not None and t.is_floating_point() else t
        args, kwargs = pytree.tree_unflatten(leaves, self.arg_spec)
        return module(*args, **kwargs)


class Evaluator:
    def __init__(self, m: Model, goal: Goal, layers: list):
        self.m = m
        self.goal = goal
        self.layers = layers                  # [(name, module)]: coverage from their outputs
        self.params = [(n, p) for n, p in m.module.named_parameters() if p.requires_grad]
        self._acts: dict = {}
        self._bad: Optional[str] = None
        self._handles = []
        watched = {id(mod) for _, mod in layers}
        for mod in m.module.modules():
            self._handles.append(mod.register_forward_hook(self._hook(mod, id(mod) in watched)))
        self.low = None
        if goal.against:
            dtype = DTYPES[goal.against]
            self.low = copy.deepcopy(m.module).to(dtype)
            self.dtype = dtype
            self.tolerance = goal.tolerance if goal.tolerance is not None else DEFAULT_TOLERANCE[str(dtype)[6:]]
        self.evaluations = 0

    def close(self) -> None:
        for h in self._handles:
            h.remove()

    def _hook(self, mod, watched: bool):
        name = self.m.names.get(mod) or type(mod).__name__

        def hook(module, args, output):
            if not self._recording:
                return None
            leaves = [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor)]
            if self._bad is None:
                for t in leaves:
                    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                        self._bad = name
                        break
            if watched:
                self._acts.setdefault(id(module), []).extend(t.detach() for t in leaves)
            return None
        return hook

    _recording = False

    def forward(self, inputs: list, hooks: bool = True):
        self.m.seeded()
        if not hooks:
            return self.m.call(self.m.module, inputs)
        self._acts, self._bad, self._recording = {}, None, True
        try:
            return self.m.call(self.m.module, inputs)
        finally:
            self._recording = False

    def loss(self, inputs: list, outputs, before=None):
        m = self.m
        if m.tape is None:
            return None
        outs = [t for t in pytree.tree_leaves(outputs)]
        return m.tape.replay(m.loss_key, inputs, outs, m.loss_calls, before)

    def vectors(self, rows: int, out) -> Optional[torch.Tensor]:
        """Per batch row, the chosen layers' outputs (default: the model's output), concatenated."""
        parts = []
        acts = [t for _, mod in self.layers for t in self._acts.get(id(mod), [])] if self.layers else \
            [t.detach() for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        for t in acts:
            if t.is_floating_point() and t.dim() > 0:
                parts.append(t.reshape(rows, -1) if t.shape[0] == rows else t.reshape(1, -1).expand(rows, -1))
        return torch.cat([p.double() for p in parts], 1) if parts else None

    def __call__(self, inputs: list, rows: int = 1) -> Outcome:
        self.evaluations += 1
        goal = self.goal
        out = self.forward(inputs)
        bad_act = self._bad
        vecs = self.vectors(rows, out)
        loss = self.loss(inputs, out)
        lv = _scalar(loss)
        found = None
        if goal.against:
            found = self._disagree(inputs, out, loss)
        elif goal.code is None:
            if bad_act is not None:
                found = {"what": "nan", "where": "activation", "name": bad_act}
            elif loss is not None and not bool(torch.isfinite(loss.detach()).all()):
                found = {"what": "nan", "where": "loss", "name": "loss"}
            else:
                found = self._bad_grad(loss if loss is not None else out)
        else:
            found = self._condition(out, loss, lv, inputs)
        if found is not None:
            found["loss"] = lv
        return Outcome(vecs, found, lv)

    def grads(self, loss):
        t = loss if isinstance(loss, torch.Tensor) else next(
            (x for x in pytree.tree_leaves(loss) if isinstance(x, torch.Tensor) and x.requires_grad), None)
        if t is None or not t.requires_grad or not self.params:
            return None
        return torch.autograd.grad(t.sum(), [p for _, p in self.params], allow_unused=True)

    def _bad_grad(self, loss) -> Optional[dict]:
        grads = self.grads(loss)
        for (name, p), g in zip(self.params, grads or ()):
            if g is not None and not bool(torch.isfinite(g).all()):
                return {"what": "nan", "where": "gradient", "name": self.m.param_names.get(id(p), name)}
        return None

    def _condition(self, out, loss, lv, inputs) -> Optional[dict]:
        from ..debugger import evaluate as E
        ns = {"loss": lv, "output": _detach(out), "inputs": [t.detach() for t in inputs], "torch": torch,
              "math": math}
        if "grad_norm" in self.goal.until:
            grads = self.grads(loss if loss is not None else out)
            ns["grad_norm"] = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads or () if g is not None)) \
                if grads else math.nan
        g = dict(ns, __builtins__=__builtins__)
        g[E.VARS_NAME] = E.ConvenienceVars(ns)
        try:
            hit = bool(eval(self.goal.code, g, g))
        except Exception as e:          # (the condition cannot be evaluated on this mutant: said once)
            raise ConditionFailed(f"--until '{self.goal.until}': {type(e).__name__}: {e}") from None
        return {"what": "condition", "condition": self.goal.until} if hit else None

    def _disagree(self, inputs, out, loss) -> Optional[dict]:
        self.m.seeded()             # (and its loss replay draws on from there, as the model's did)
        with torch.no_grad():
            low = self.m.call(self.low, inputs, self.dtype)
        a = [t.detach().double() for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        b = [t.detach().double() for t in pytree.tree_leaves(low) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        worst = 0.0
        for x, y in zip(a, b):
            if bool(torch.isfinite(x).all()) and not bool(torch.isfinite(y).all()):
                return {"what": "disagreement", "against": self.goal.against, "relative": math.inf,
                        "tolerance": self.tolerance, "note": f"the {self.goal.against} copy's output is not finite"}
            scale = max(float(x.abs().max()) if x.numel() else 0.0, 1e-12)
            worst = max(worst, float((x - y).abs().max()) / scale if x.numel() else 0.0)
        if loss is not None and self.m.tape is not None:
            lows = [t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                    for t in pytree.tree_leaves(low)]
            with torch.no_grad():
                ll = _scalar(self.m.tape.replay(self.m.loss_key, inputs, lows, self.m.loss_calls))
            lv = _scalar(loss)
            if lv is not None and ll is not None and math.isfinite(lv):
                if not math.isfinite(ll):
                    worst = math.inf
                else:
                    worst = max(worst, abs(lv - ll) / max(abs(lv), 1e-12))
        if worst > self.tolerance:
            return {"what": "disagreement", "against": self.goal.against, "relative": worst,
                    "tolerance": self.tolerance}
        return None


class ConditionFailed(Exception):
    pass


def _scalar(t) -> Optional[float]:
    if not isinstance(t, torch.Tensor) or t.numel() == 0:
        return None
    return float(t.detach().double().mean())


def _detach(out):
    return pytree.tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, out)
