"""What the loss rules see of losses that are no module: torch.nn.functional
losses (``F.cross_entropy(out, y)``) and hand-written ones
(``((pred - target) ** 2).mean()``), through a TorchFunctionMode
(nndb.tracer.funcmode) that is on the mode stack only during the loss
probe's steps (nndb.cadence.sampled: the first 20 steps, then one in 64) and
off it otherwise, so that it costs nothing then.

``LossWatch`` is the plain object behind the mode, owned by the loss_inputs
probe (nndb.rules.model_probes.LossInputs):

- the model's outputs are *tagged* (the output of a root module with
  parameters, seen after its forward), and so is whatever an op makes of a
  tagged tensor with a row per sample (``per_sample``: the same shape, ``out *
  2``, ``out.float()``, a view; or the batch kept as dim 0 with no new
  dimension, ``F.pairwise_distance(o1, o2)``, ``out.sum(1)``, ``out[:, 0]``);
- a functional loss call is handed to the probe as a loss module's call would
  be (``LossInputs.loss_call``), unless a loss module is making it (the
  module's own call was seen);
- an elementwise ``+ - * /`` of a tagged tensor and another one is reported
  when the broadcast *creates a new dimension* out of the batch: the
  result is bigger than both operands, and the other operand has the batch
  size at a position where the model's output has size 1 or no dimension
  ((N, 1) - (N,) -> (N, N)), and the other operand may be a target (``Tags.target``:
  it needs no gradient).  A bias add ((N, C) + (C,)), a normalisation
  ((N, C) - (C,)) or a per-sample weight ((N, 1) * (N, C)) make nothing
  bigger than both; an outer difference the script builds on purpose
  (``emb[:, None] - emb[None]``) is of reshaped tensors, which are not tagged.

What the loss *is* (``Made``): every tensor an op makes of a model's output
carries a mark, whatever its shape, for the step (and a tensor written into:
a rollout's buffer, ``actions[step] = action``, ``values[step] = value``,
carries what was written: cleanrl's PPO samples its actions into one, and
its loss went unknown for a surrogate); the marks tell
loss_not_decreasing the two losses that are not meant to go down:

- a *policy-gradient surrogate*: the loss depends on a value drawn
  (``torch.multinomial``, ``bernoulli``, ``normal``, ``poisson``: what
  ``torch.distributions`` sample with) from a distribution the model's output
  gives, other than through the input of a model (REINFORCE's
  ``-log_prob(a) * G``, actor-critic, PPO with its actions kept as tensors):
  its value follows the episodes' returns, not the policy's quality;
- a *moving target*: a loss's target, without gradient, is made of the
  output of the trained model itself or of a copy of it (same parameter
  shapes: a DQN's target network, an EMA teacher, pseudo-labels), while
  its prediction has a gradient: the target moves as the model learns.
  The target is a functional loss's, or the operand of a hand-written
  ``pred - target`` of the prediction's shape (``logits -
  logits.max(...).detach()`` stabilises a log-softmax: no target).  A
  fixed teacher of another architecture (distillation) is not one.

The ops are told apart by a dict lookup per call; nothing is computed from
a tensor's values, nothing is raised into the script (the mode keeps the
first error, and the probe reports it).
"""
from __future__ import annotations

import math
import weakref

import torch

from ..tracer.funcmode import CLASS_LOSSES, LOSS_OF, UNSEEN, FunctionWatch, functional_loss
from ..tracer.naming import user_frame

_T = torch._C.TensorBase
BROADCASTING_OPS = {f: sym for fs, sym in (
    ((_T.sub, torch.sub, torch.subtract), "-"),
    ((_T.add, torch.add), "+"),
    ((_T.mul, torch.mul, torch.multiply), "*"),
    ((_T.div, torch.div, torch.true_divide, torch.divide), "/"),
) for f in fs}
TAGS_KEPT = 64                  # tagged tensors per step (a model output and what is made of it)
# What torch.distributions draw samples with (Categorical, Bernoulli, Normal, Poisson, Gamma...)
SAMPLERS = frozenset((torch.multinomial, _T.multinomial, torch.bernoulli, _T.bernoulli, torch.normal,
                      torch.poisson, torch._standard_gamma, torch.binomial))
# The marks of Made: made of a model's output; of a sample drawn from one; of a moving target
MODEL, SAMPLE, MOVING = 1, 2, 4
MADE_KEPT = 8192                # marked tensors per step (an episode of REINFORCE: ~10 a time step)
TARGET_OPS = frozenset(f for f, sym in BROADCASTING_OPS.items() if sym == "-")
# A write into a tensor the script made before (a rollout's buffer, ``actions[step] = action``):
# what it holds now is made of what was written (an in-place op returns the tensor: its output)
SETITEM = _T.__setitem__


class Tags(dict):
    """id(tensor) -> weakref: the tensors tagged in a step (a model's outputs and the
    per-sample results made of them), at most TAGS_KEPT; the live rule's and nndb check's."""

    def tag(self, t, made: bool = False) -> None:
        """``made``: ``t`` is made of a model's output, not one itself."""
        if len(self) < TAGS_KEPT:
            self[id(t)] = (weakref.ref(t), made)

    def tagged(self, t) -> bool:
        e = self.get(id(t))
        return e is not None and e[0]() is t

    def made(self, t) -> bool:
        """Is the tagged ``t`` made of a model's output in another shape (not the output itself,
        nor a same-shape result of it, ``out * 2``)?"""
        return self[id(t)][1]

    def carry(self, args, out) -> None:
        """Tag ``out``, made of ``args``, if it is a per-sample result of a tagged one of its
        first two (``per_sample``)."""
        for a in args[:2]:
            if isinstance(a, torch.Tensor) and self.tagged(a) and per_sample(a, out):
                if not self.tagged(out):       # (``out.float()`` of a float32 output: the output)
                    self.tag(out, made=self.made(a) or out.shape != a.shape)
                return

    @staticmethod
    def target(t) -> bool:
        """Can ``t`` be what a tagged tensor is compared with, a target?  Not where it needs a
        gradient: a prediction against itself or another prediction, made on purpose (``s -
        s[:, None]``, a pairwise ranking's score differences); a target network's output, with
        no gradient (a DQN's ``q - (r + gamma * target_net(s2).max(1)[0])``), is one, as the
        batch's labels are."""
        return not t.requires_grad


def per_sample(a: torch.Tensor, out: torch.Tensor) -> bool:
    """Is ``out``, made of ``a`` (a model's output, dim 0 its batch), still one row per sample:
    the same shape (``out * 2``, a view), or the batch kept as dim 0 with no new dimension (a
    per-sample reduction, ``F.pairwise_distance(o1, o2)``, ``out.sum(1)``; ``out[:, 0]``,
    ``out.squeeze(1)``; ``q.gather(1, a)``)?  A Siamese network's contrastive loss on the
    distance of its two outputs, ``label * d ** 2`` with label (N, 1) and d (N,), was no
    loss_broadcast finding: d was no model output."""
    if out.shape == a.shape:
        return True
    return 1 <= out.dim() <= a.dim() and out.shape[0] == a.shape[0] >= 2


class Made(dict):
    """id(tensor) -> (weakref, marks, the model whose output it is made of): what ops made
    of a model's output in a step (any shape), at most MADE_KEPT."""

    def mark(self, t, marks: int, model) -> None:
        if len(self) < MADE_KEPT or id(t) in self:
            self[id(t)] = (weakref.ref(t), marks, model)

    def of(self, t):
        """(marks, model) of ``t``, or None."""
        e = self.get(id(t))
        return (e[1], e[2]) if e is not None and e[0]() is t else None


def where() -> str:
    """The script's line that made the call: ``train.py:42``."""
    f = user_frame(2)
    if f is None:
        return "?"
    import os
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"


def new_batch_dimension(t: torch.Tensor, other: torch.Tensor, out_shape) -> bool:
    """Does ``t`` (the model's output: its dim 0 is the batch) op ``other`` broadcast
    to ``out_shape`` by spreading the batch along a new dimension?"""
    n, r = t.shape[0] if t.dim() else 0, len(out_shape)
    if n < 2 or math.prod(out_shape) <= max(t.numel(), other.numel()):
        return False
    t_at, o_at = r - t.dim(), r - other.dim()          # where each operand's dim 0 lands in the result
    for j, size in enumerate(other.shape):
        q = o_at + j
        if size == n and q != t_at and (q < t_at or t.shape[q - t_at] == 1):
            return True
    return False


class LossWatch:
    def __init__(self, probe):
        self.probe = probe
        self.mode = FunctionWatch(self.on_call, quiet=probe.tracer)
        self._tags = Tags()               # id(tensor) -> weakref: the model's outputs and what is made of them
        self._module_call = None            # (weakref input, weakref target) of the loss module being called
        self._root_types: set = set()       # model classes whose forward output the probe sees
        self._made = Made()                 # what ops made of the model's outputs this step
        self._roots: "weakref.WeakSet" = weakref.WeakSet()   # the root modules with parameters called
        self.surrogate = None               # (kind, where): what the step's backward() was given

    # -- on and off --------------------------------------------------------------
    def start(self) -> None:
        # (not once torch.compile is in use: the mode leaves the stack as Dynamo starts
        # compiling, and LossInputs.root takes it off as a compiled module is called, before
        # its compiled forward runs; FunctionWatch.compiled.  No loss marks for such a run.)
        self.mode.push()

    def stop(self) -> None:
        self.mode.remove()
        for cls in self._root_types:
            self.probe.tracer.within.leave(cls, self.model_output)
        self._root_types.clear()
        self.new_step()

    def new_step(self) -> None:
        self._tags.clear()
        self._made.clear()
        self._module_call = None
        self.surrogate = None

    # -- what the probe hands on ----------------------------------------------------
    def model_called(self, module) -> None:
        """A root module with parameters is about to run: see its output."""
        cls = type(module)
        self._roots.add(module)
        if cls not in self._root_types:
            self._root_types.add(cls)
            self.probe.tracer.within.join(cls, self.model_output)

    def loss_module_called(self, x, y) -> None:
        self._module_call = (weakref.ref(x), weakref.ref(y))

    def model_output(self, module, use, args, output) -> None:
        if self.probe.tracer.module_depth != 0 or self.probe.error is not None:
            return                          # a submodule of another model: not the model's output
        for t in (output,) if isinstance(output, torch.Tensor) else _leaves(output):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                # (a model's output is its own: what its input was made of does not pass through)
                self._made.mark(t, MODEL, weakref.ref(module))
                if t.dim() >= 1:
                    self._tags.tag(t)

    # -- the mode's calls ------------------------------------------------------------
    def on_call(self, func, args, kwargs, out) -> None:
        if self.probe.tracer.in_hook:      # nndb's own tensor work in a hook
            return
        if self._made:
            self._mark(func, args, kwargs, out)
        op = BROADCASTING_OPS.get(func)
        if op is not None:
            self._binary(op, args, out)
        else:
            name = LOSS_OF.get(func, UNSEEN)
            if name is UNSEEN:
                name = functional_loss(func)
            if name is not None:
                self._functional(func, name, args, kwargs)
                return
        if self._tags and args and isinstance(out, torch.Tensor):
            self._tags.carry(args, out)

    def _mark(self, func, args, kwargs, out) -> None:
        """Carry the marks of ``func``'s tensor arguments to its outputs; a sample drawn
        from a model's output, a target made of the trained model's, a backward() of a
        loss that has either: the step's ``surrogate``."""
        made, marks, model, target = self._made, 0, None, None
        for a in _tensors(args, kwargs):
            e = made.of(a)
            if e is not None:
                marks |= e[0]
                model = model or e[1]
                if not a.requires_grad:
                    target = e
        if not marks:
            return
        if func is _BACKWARD or func is _AUTOGRAD_BACKWARD:
            if marks & (SAMPLE | MOVING) and self.surrogate is None:
                self.surrogate = ("policy_gradient" if marks & SAMPLE else "moving_target", where())
                self.probe.surrogate(*self.surrogate)
            return
        if func in SAMPLERS:
            marks |= SAMPLE
        elif target is not None and not marks & MOVING and self._compares(func, args) \
                and self._trained_or_copy(target[1]):
            marks |= MOVING
        if func is SETITEM and isinstance(args[0], torch.Tensor):
            e = made.of(args[0])
            made.mark(args[0], marks | (e[0] if e else 0), model or (e[1] if e else None))
            return
        for o in (out,) if isinstance(out, torch.Tensor) else out if isinstance(out, (tuple, list)) else ():
            if isinstance(o, torch.Tensor):
                made.mark(o, marks, model)

    @staticmethod
    def _compares(func, args) -> bool:
        """Does ``func`` compare a prediction with a gradient to a target: a functional loss, or
        a hand-written ``pred - target`` of one shape (not ``logits - logits.max(...).detach()``,
        a stabilised log-softmax, whose operand without gradient is no target)?"""
        if len(args) < 2 or not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args[:2]):
            return False
        if func in TARGET_OPS:
            a, b = args[0], args[1]
            return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
        return functional_loss(func) is not None

    def _trained_or_copy(self, ref) -> bool:
        """Is the model ``ref`` (a weakref) one an optimizer trains, or a copy of one
        (the same parameter shapes: a target network, an EMA teacher)?"""
        m = ref() if ref is not None else None
        if m is None:
            return False
        trained = {id(p) for o in self.probe.tracer.optimizers() for g in o.param_groups for p in g["params"]}
        if not trained:
            return False

        def shapes(module):
            return [tuple(p.shape) for p in module.parameters()]
        if any(id(p) in trained for p in m.parameters()):
            return True
        mine = shapes(m)
        return any(r is not m and any(id(p) in trained for p in r.parameters()) and shapes(r) == mine
                   for r in list(self._roots))

    def _binary(self, op, args, out) -> None:
        if not self._tags or len(args) < 2 or not isinstance(out, torch.Tensor):
            return
        a, b = args[0], args[1]
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return
        for t, other in ((a, b), (b, a)):
            if self._tags.tagged(t) and self._tags.target(other) and new_batch_dimension(t, other, tuple(out.shape)):
                key = f"`{op}` at {where()}"
                self.probe.hand_written(key, op, tuple(a.shape), tuple(b.shape), tuple(t.shape), self._tags.made(t))
                return

    def _functional(self, func, name, args, kwargs) -> None:
        x = args[0] if args else kwargs.get("input")
        y = args[1] if len(args) > 1 else kwargs.get("target")
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
            return
        mc = self._module_call
        if mc is not None and mc[0]() is x and mc[1]() is y:
            return                          # a loss module's own call: seen as the module
        key = f"F.{name} at {where()}"
        recompute = _mean_loss(func, args, kwargs) if name in CLASS_LOSSES else None
        self.probe.loss_call(key, f"F.{name}", x, y, pointwise=name not in CLASS_LOSSES,
                             cross_entropy=name == "cross_entropy", recompute=recompute)


_BACKWARD = torch.Tensor.backward
_AUTOGRAD_BACKWARD = torch.autograd.backward


def _tensors(args, kwargs):
    """The tensors among a call's arguments, and in its lists and tuples (``torch.cat([...])``)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, torch.Tensor):
                    yield b
    if kwargs:
        for a in kwargs.values():
            if isinstance(a, torch.Tensor):
                yield a


def _leaves(output):
    from torch.utils import _pytree as pytree
    return pytree.tree_leaves(output)


def _mean_loss(func, args, kwargs):
    """``func`` (F.cross_entropy / F.nll_loss) again on the call's arguments, mean reduction."""
    import inspect

    def recompute(x, y):
        try:
            bound = inspect.signature(func).bind(*args, **kwargs)
            bound.arguments.update(input=x, target=y, reduction="mean")
            bound.arguments.pop("size_average", None)
            bound.arguments.pop("reduce", None)
            return func(**bound.arguments).float()
        except Exception:
            return None
    return recompute

