"""What the first steps of the script showed, gathered for ``nndb check``.

``Capture`` is a plain object; the tracer's within-step listeners
(``tracer.within``, nndb.tracer.within: root module inputs, a root's output,
optimizer steps, a backward's loss) and ``LossMode`` (a TorchFunctionMode that sees torch.nn.functional's loss
calls) report to it.  None of them changes what the script computes; an
error in one is kept as a note, never raised into the script.

Why this size: one object that every listener of the first steps reports to, and the records
it keeps for the checks (ModelSeen, Feed, LossCall, OutputLoss, OptimizerSeen); which model
call a backward reached, which loss call made the loss and which optimizer stepped what are
facts about one another, so they are gathered in one place.
"""
from __future__ import annotations

import copy
import math
import weakref
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch.utils import _pytree as pytree

from ..errors import KillRun
from ..rules.loss_watch import BROADCASTING_OPS, Tags, new_batch_dimension, where
from ..tracer.funcmode import BINARY_LOSSES, CLASS_LOSSES, LOSSES, FunctionWatch, functional_loss  # noqa: F401
from ..tracer.recorder import unscaled

LOSS_CALLS_KEPT = 16            # loss-function calls remembered per run
# the losses of |input - target| alone: the same with the two given the other way round
SYMMETRIC_LOSSES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")
_GRAD_CALLS_KEPT = 256          # calls with autograd on kept between two backward()s, for grad_args
_GRAPH_NODES = 100_000          # autograd nodes walked to find which of them a backward() reached


# -- what the first steps showed ----------------------------------------------------------
# torch calls that fill a tensor with one value, and those that copy one (to another device or dtype)
FILLS = {torch.zeros: "torch.zeros", torch.ones: "torch.ones", torch.full: "torch.full",
         torch.zeros_like: "torch.zeros_like", torch.ones_like: "torch.ones_like", torch.full_like: "torch.full_like"}
COPIES = {torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.long, torch.Tensor.type}


def _clone(tree):
    return pytree.tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, tree)


@dataclass
class ModelSeen:
    """A root module with parameters, as first called."""
    module: torch.nn.Module
    # deep copy at its first forward, in the train/eval modes of its first call with autograd on
    # (None: could not copy)
    replica: Optional[torch.nn.Module]
    replica_error: str
    first_args: tuple
    last_args: tuple = ()
    last_feed: object = None                # where its last call's input came from (``Capture._feed``)
    keywords: tuple = ()                    # the names of its last call's inputs given by keyword (the last ones)
    # the inputs of its first call with autograd on whose output a backward() reached, a training
    # forward's (a DQN's calls that pick actions, one state each, come first: under no_grad, or
    # with autograd on and never backed through, cleanrl's), None before one
    grad_args: Optional[tuple] = None


@dataclass
class Feed:
    """One input of a model's call that another model's output is: ``head(backbone(x))``.
    ``model`` made it (its output leaf ``leaf``) from ``args``, itself fed by ``feed``."""
    model: torch.nn.Module
    leaf: int
    args: tuple
    feed: object = None         # a Feed, GRAPH or None, of that model's own call
    arg: int = 0                # which tensor of the fed call's inputs (pytree leaf)
    keywords: tuple = ()        # the names of ``args``' last ones, given by keyword


# An input computed with autograd from something no model of the run made (a trainable tensor
# outside the modules, a sum of two models' outputs): the model's forward is not the whole
# computation from the data, and nndb cannot rebuild it on a copy.
GRAPH = "graph"


@dataclass
class LossCall:
    step: int
    name: str                   # CrossEntropyLoss (a loss module) or F.cross_entropy
    func: Callable
    kind: str                   # the functional's name
    args: list                  # positional args; the input (index 0) left out
    kwargs: dict
    input_shape: tuple
    input_requires_grad: bool
    probs_like: bool            # cross-entropy input rows in [0, 1] summing to 1; with-logits BCE's a sigmoid's output
    target: Optional[torch.Tensor]
    target_pos: Optional[object]     # where the target was: an index into args, or "target"
    value: float
    model: Optional[torch.nn.Module] = None   # the root whose output is the input
    leaf: int = 0               # which tensor of its output (pytree leaf)
    model_args: tuple = ()      # that forward's inputs
    model_feed: object = None   # where they came from: a Feed, GRAPH, or None (the data)
    model_keywords: tuple = ()  # the names of ``model_args``' last ones, given by keyword
    # the input a view of that output leaf (``logits.view(-1, V)``, ``out.squeeze(1)``,
    # ``logits.transpose(1, 2)``): (size, stride, offset in the leaf's storage from the leaf's
    # own, the leaf's shape, the leaf's stride), to take the same view of a copy's output; or
    # the leaf indexed by tensors (``output[mask_train]``: an Indexed)
    view: Optional[object] = None
    out_ref: object = None      # a weak reference to the loss the call returned
    # the autograd node that made it, held until the next backward(): a model's loss that
    # divides it (a Hugging Face model's sum over the tokens over num_items_in_batch) lets go
    # of the tensor the call returned, and no node can be weakly referenced
    out_fn: object = None
    # nll_loss: the median over its input's rows of their exp's sum (1 for log-probabilities)
    exp_sum: Optional[float] = None
    # where the target came from if not the data: "returned by MoCo" (a model's output), "made
    # by torch.zeros at train.py:12" (a contrastive loss's positives, at index 0 of each row)
    target_made: str = ""


@dataclass
class Indexed:
    """A loss's input that is a model's output leaf indexed by tensors, ``output[idx_train]``
    (a full-batch graph network's loss on its training nodes, a loss on the masked positions):
    the indices (None for a dimension taken whole, ``out[:, idx]``), as they were at the loss's
    call, and the leaf's shape, to index a copy's output the same way."""
    indices: tuple
    shape: tuple

    def of(self, out: torch.Tensor) -> torch.Tensor:
        if tuple(out.shape) != self.shape:
            raise ValueError(f"the copy's output is {tuple(out.shape)}, not {self.shape} as the script's: "
                             "nndb cannot index it as the loss's input was")
        return out[tuple(slice(None) if i is None else i for i in self.indices)]


@dataclass
class OutputLoss:
    """A backward's loss that a model returned itself (``logits, loss = model(x, y)``, a Hugging
    Face model's ``out.loss``): its output leaf ``leaf`` of the call with inputs ``args``."""
    step: int
    model: torch.nn.Module
    leaf: int
    args: tuple
    feed: object
    keywords: tuple
    call: Optional[LossCall] = None     # the loss function's call that returned it, if one did
    value: float = math.nan             # its value (a multiple of ``call``'s: over num_items_in_batch)


@dataclass
class OptimizerSeen:
    opt: object
    hyper: list                 # per group: its hyper-parameters at the first step
    params: list                # requires_grad parameters, in group order
    before: Optional[list] = None
    lrs: list = field(default_factory=list)


class Capture:
    """The plain object the probes and the loss mode report to.

    Why this size: one record of what `nndb check`'s short run saw (the models, their calls
    and outputs, the losses, the optimizers, each parameter's gradients from backward() to
    step()), written by the hooks and read whole by the checks; split, each part would be
    written by the same hooks and read by the same checks."""

    def __init__(self, rec, steps: int):
        self.rec = rec
        self.steps = steps
        self.steps_done = 0
        self.models: dict = {}              # id(module) -> ModelSeen
        self.outputs: dict = {}             # id(module) -> (output leaves, args) of its last call
        self.loss_calls: list = []
        self.output_losses: list = []       # OutputLoss: a backward's loss a model returned
        self._calls: dict = {}              # id(model) -> its calls with autograd on since the last backward
        self.with_grad: set = set()         # id(model): called with autograd on in some step
        # [id(model), its inputs, its output's grad_fns]: the calls with autograd on since the last
        # backward of the models without grad_args yet
        self._grad_calls: list = []
        self.repeated: dict = {}            # id(model) -> the most such calls before one backward (2 or more)
        self.backward_losses: list = []     # (step, value or None)
        self.optimizers: list = []          # OptimizerSeen, in the order first stepped
        self.got_grad: set = set()          # id(param): a gradient in some step
        # id(param): backward() accumulated a non-zero gradient into it (seen from the optimizer's
        # first step on), whether or not .grad still held it at optimizer.step()
        self.reached: set = set()
        # id(param) -> param: a trainable parameter of a model the run called with a non-zero .grad
        # at an optimizer step (those no optimizer holds never change: left out of the optimizer?)
        self.model_grads: dict = {}
        self._grad_hooks: list = []
        self.nonzero: set = set()           # ... a finite one with a non-zero element, in some step
        self.grad_rms: dict = {}            # id(param) -> the largest RMS of its finite gradients
        self.nonfinite: set = set()         # ... a NaN/Inf one, in some step
        self.changed: dict = {}             # id(param) -> largest relative change
        # id(param) -> (largest update norm / weight norm after it, the step): update_ratio's measure,
        # for the weights it judges (2-D and up, MIN_ELEMENTS or more, not grown from exactly 0,
        # not under an optimizer of many iterations a step: LBFGS)
        self.rewrites: dict = {}
        self.reset_checks: list = []        # the grad_reset probe's facts, each with its "step"
        self._reset_probe = None
        self.errors: list = []
        self._last_root = None
        self._output_types: set = set()
        self._hooks: list = []
        # a hand-written loss's broadcast that spreads the batch along a new dimension
        # ((N, 1) - (N,) -> (N, N)), as the live loss_broadcast rule sees it: [(where, op, a, b, out)]
        self.broadcasts: list = []
        self._tags = Tags()               # id -> weakref: this step's model outputs and per-sample results
        # id -> (weakref, "made by torch.zeros at train.py:12", its _version then): the tensors a
        # factory filled with one value this step (and their copies: .to(device), .long()), which a
        # loss's target may be (made_by)
        self._filled: dict = {}
        # id(module) -> the leaves of its last output that are inputs it was given (labels it hands
        # back, ``return self.net(x), y``: the data's, not made by it)
        self._handed_back: dict = {}

    # -- installing -------------------------------------------------------------------
    def install(self) -> None:
        t = self.rec.tracer
        self.rec.listeners.append(self)          # (joins the run's step pipeline)
        root, optimizer = self._guard(self.root), self._guard(self.optimizer)

        def on_root(module, args):
            self._stop_if_done()
            root(module, args)

        def on_optimizer(opt, when):
            self._stop_if_done()
            optimizer(opt, when)

        def on_no_loss():
            self.backward_losses.append((self.steps_done, None))
        self._hooks = [("root", on_root), ("optimizer", on_optimizer), ("loss", self._guard(self.backward_loss)),
                       ("no_loss", on_no_loss)]
        for key, cb in self._hooks:
            t.within.join(key, cb)
        # Was .grad reset between optimizer steps?  The live stale_grad rule's
        # probe (a tensor hook on one sample parameter per optimizer), read here
        # at each step's end.
        from ..rules.grad_rules import GradReset
        self._reset_probe = GradReset(self.rec)
        self._reset_probe.install()

    def uninstall(self) -> None:
        t = self.rec.tracer
        if self in self.rec.listeners:
            self.rec.listeners.remove(self)
        for key, cb in self._hooks:
            t.within.leave(key, cb)
        for h in self._grad_hooks:
            h.remove()
        self._grad_hooks = []
        if self._reset_probe is not None:
            self._reset_probe.uninstall()
            if self._reset_probe.error and len(self.errors) < 3:
                self.errors.append(self._reset_probe.error)
        self.outputs.clear()

    def _guard(self, fn):
        """A probe never raises into the script: its error is kept and shown as a note."""
        def call(*args):
            try:
                fn(*args)
            except Exception as e:
                if len(self.errors) < 3:
                    self.errors.append(f"{fn.__name__}: {type(e).__name__}: {e}")
        return call

    def on_step(self, end) -> None:
        if end.step is not None:
            self.step_end(end.step)

    def step_end(self, step: int) -> None:
        if self._reset_probe is not None:
            self.reset_checks += [dict(c, step=step) for c in self._reset_probe.take(step).get("checks", ())]
        self.steps_done = step + 1
        self.outputs.clear()                 # hold no activation between steps
        self._tags.clear()
        self._filled.clear()

    def _stop_if_done(self) -> None:
        """The steps are done: the script is unwound at its next module call
        or optimizer step (so what it prints after the last step shows)."""
        if self.steps_done >= self.steps:
            raise KillRun()

    # -- probes -----------------------------------------------------------------------
    def root(self, module, args) -> None:
        self._last_root = module
        if self.steps_done >= self.steps or next(module.parameters(), None) is None:
            return
        keywords = tuple(getattr(args, "keywords", ()))     # (nndb.tracer.discover.CallArgs)
        if torch.is_grad_enabled():
            self._calls[id(module)] = self._calls.get(id(module), 0) + 1
            self.with_grad.add(id(module))
        args = tuple(args)
        feed = self._feed(module, args)
        seen = self.models.get(id(module))
        if seen is None:
            replica, err = None, ""
            try:
                replica = _deepcopy(module)
            except Exception as e:
                err = f"{type(e).__name__}: {e}"
            seen = self.models[id(module)] = ModelSeen(module, replica, err, _clone(args))
            seen.last_args = seen.first_args
        else:
            seen.last_args = _clone(args)
        if seen.grad_args is None and torch.is_grad_enabled() and len(self._grad_calls) < _GRAD_CALLS_KEPT:
            self._grad_calls.append([id(module), seen.last_args, ()])
        seen.last_feed, seen.keywords = feed, keywords
        if type(module) not in self._output_types:
            self._output_types.add(type(module))
            cb = self._guard(self.output)
            self._hooks.append((type(module), cb))
            self.rec.tracer.within.join(type(module), cb)

    def _feed(self, module, args):
        """Where this call's inputs came from: None (none was computed with autograd: the data,
        or features of a frozen module), a ``Feed`` (one of them is another model's output of this
        step, the others not computed with autograd: ``head(backbone(x))``), else GRAPH."""
        leaves = [t for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor)]
        made = [i for i, t in enumerate(leaves) if t.grad_fn is not None]
        if not made:
            return None
        if len(made) == 1:
            t = leaves[made[0]]
            for mid, (outs, margs, mfeed) in self.outputs.items():
                if mid != id(module):
                    for j, o in enumerate(outs):
                        if o is t:
                            return Feed(self.models[mid].module, j, margs, mfeed, made[0],
                                        self.models[mid].keywords)
        return GRAPH

    def output(self, module, use, args, output) -> None:
        seen = self.models.get(id(module))
        if seen is not None and seen.module is module and self.steps_done < self.steps:
            self.outputs[id(module)] = (pytree.tree_leaves(output), seen.last_args, seen.last_feed)
            given = {id(a) for a in pytree.tree_leaves(args) if isinstance(a, torch.Tensor)}
            self._handed_back[id(module)] = {i for i, t in enumerate(self.outputs[id(module)][0]) if id(t) in given}
            if self._grad_calls and self._grad_calls[-1][0] == id(module) and not self._grad_calls[-1][2]:
                self._grad_calls[-1][2] = tuple(t.grad_fn for t in self.outputs[id(module)][0]
                                                if isinstance(t, torch.Tensor) and t.grad_fn is not None)
            for t in self.outputs[id(module)][0]:
                if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.is_floating_point():
                    self._tags.tag(t)

    def tensor_op(self, func, args, out) -> None:
        """A torch call while the steps run: a broadcasting op of the model's output (or a
        per-sample result made of it) that makes a new dimension of its batch is kept (loss_watch)."""
        if not self._tags or self.steps_done >= self.steps or not args or not isinstance(out, torch.Tensor):
            return
        op = BROADCASTING_OPS.get(func)
        if op is not None and len(args) >= 2 and isinstance(args[0], torch.Tensor) and isinstance(args[1], torch.Tensor):
            a, b = args[0], args[1]
            for t, other in ((a, b), (b, a)):
                if self._tags.tagged(t) and self._tags.target(other) and new_batch_dimension(t, other, tuple(out.shape)):
                    if len(self.broadcasts) < 8:
                        self.broadcasts.append((where(), op, tuple(a.shape), tuple(b.shape), tuple(out.shape),
                                                self._tags.made(t)))
                    return
            return
        self._tags.carry(args, out)

    def filled(self, func, args, out) -> None:
        """A torch call while the steps run: a tensor made of one value (``torch.zeros(n,
        dtype=torch.long)``), or a copy of one, is noted (made_by)."""
        if self.steps_done >= self.steps or not isinstance(out, torch.Tensor):
            return
        if len(self._filled) >= 64:         # (kept small: those still alive)
            self._filled = {k: v for k, v in self._filled.items() if v[0]() is not None}
            if len(self._filled) >= 64:
                return
        name = FILLS.get(func)
        if name is not None:
            self._filled[id(out)] = (weakref.ref(out), f"made by {name} at {where()}", out._version)
        elif args and isinstance(args[0], torch.Tensor) and self._unchanged(args[0]):
            self._filled[id(out)] = (weakref.ref(out), self._filled[id(args[0])][1], out._version)

    def _unchanged(self, t) -> bool:
        """Is ``t`` a tensor ``filled`` noted, as it was made (not written into since: a label
        buffer made by torch.zeros and then filled in from the data is the data's)?"""
        made = self._filled.get(id(t))
        return made is not None and made[0]() is t and t._version == made[2]

    def made_by(self, target) -> str:
        """Where a loss's target came from if not the data: a model's output (MoCo's forward
        returns its logits and its labels), or a tensor filled with one value in the step
        (SimCLR's ``torch.zeros(n, dtype=torch.long)``: each row's positive at index 0); ""."""
        if not isinstance(target, torch.Tensor):
            return ""
        link = self._output_of(target)
        if link is not None and link[1] not in self._handed_back.get(link[0], ()):
            return f"returned by {type(self.models[link[0]].module).__name__}"
        return self._filled[id(target)][1] if self._unchanged(target) else ""

    def backward_loss(self, tensor) -> None:
        if self.steps_done < self.steps:
            for mid, n in self._calls.items():
                if n > 1:
                    self.repeated[mid] = max(n, self.repeated.get(mid, 0))
            self._calls = {}
            if self._grad_calls:
                self._backed(tensor)
            loss = unscaled(tensor)             # (a GradScaler's scaled loss: the loss it scaled)
            t = loss.detach()
            self.backward_losses.append((self.steps_done, float(t.double().mean()) if t.numel() else None))
            self._note_output_loss(loss)
            for c in self.loss_calls:
                c.out_fn = None             # (a node holds its graph: none past its backward)

    def _note_output_loss(self, loss) -> None:
        """The backward's ``loss`` where a model returned it (or a multiple of it: ``loss / 4``)."""
        scaled = _scaled_from(loss)
        for mid, (leaves, margs, mfeed) in self.outputs.items():
            for i, o in enumerate(leaves):
                if o is loss or (isinstance(o, torch.Tensor) and o.numel() == 1 and
                                 any(o.grad_fn is fn for fn in scaled)):
                    seen = self.models[mid]
                    # (the call whose loss the model returned, or a multiple of it: a Hugging
                    # Face model's sum over the tokens divided by the Trainer's num_items_in_batch)
                    within = [o.grad_fn, *_scaled_from(o)]
                    made = next((c for c in self.loss_calls if c.step == self.steps_done and (
                        c.out_ref is not None and c.out_ref() is o
                        or c.out_fn is not None and any(c.out_fn is fn for fn in within))), None)
                    self.output_losses.append(OutputLoss(self.steps_done, seen.module, i, margs, mfeed,
                                                         seen.keywords, made, float(o.detach().double().mean())))
                    return

    def _backed(self, tensor) -> None:
        """Each model's first call since the last backward whose output ``tensor``'s graph holds
        gives its ``grad_args``."""
        calls, self._grad_calls = self._grad_calls, []
        wanted = {id(fn) for _, _, fns in calls for fn in fns}
        seen, todo = set(), [getattr(tensor, "grad_fn", None)]
        while todo and len(seen) < _GRAPH_NODES and not wanted <= seen:
            fn = todo.pop()
            if fn is None or id(fn) in seen:
                continue
            seen.add(id(fn))
            todo.extend(nxt for nxt, _ in getattr(fn, "next_functions", ()))
        for mid, args, fns in calls:
            model = self.models.get(mid)
            if model is not None and model.grad_args is None and any(id(fn) in seen for fn in fns):
                model.grad_args = args
                if model.replica is not None:       # (its training forward's modes: _same_modes)
                    _same_modes(model.replica, model.module)

    def loss_call(self, func, args, kwargs, out) -> None:
        if self.steps_done >= self.steps or len(self.loss_calls) >= LOSS_CALLS_KEPT:
            return
        args, kwargs = list(args), dict(kwargs)
        inp = args[0] if args else kwargs.pop("input", None)
        if not isinstance(inp, torch.Tensor):
            return
        if args:
            args[0] = None
        target_pos = 1 if len(args) > 1 else ("target" if "target" in kwargs else None)
        target = args[1] if target_pos == 1 else kwargs.get("target")
        link = self._output_of(inp)
        if link is None and func.__name__ in SYMMETRIC_LOSSES and isinstance(target, torch.Tensor):
            # (the prediction given second: F.mse_loss(noise, noise_pred), a DDPM tutorial's; the
            # loss is the same either way round, and it is the model's output that is judged)
            link = self._output_of(target)
            if link is not None:
                inp, target = target, inp
        made = self.made_by(target)
        target = target.detach().clone() if isinstance(target, torch.Tensor) else None
        if target_pos is not None and target_pos != "target":
            args[1] = None
        root = self._last_root
        from_module = isinstance(root, torch.nn.modules.loss._Loss)
        name = type(root).__name__ if from_module else f"F.{func.__name__}"
        value = float(out.detach().double().mean()) if isinstance(out, torch.Tensor) and out.numel() else math.nan
        call = LossCall(self.steps_done, name, func, func.__name__, args, kwargs, tuple(inp.shape),
                        inp.requires_grad, _probs_like(inp, func.__name__), target, target_pos, value)
        call.target_made = made
        if isinstance(out, torch.Tensor):
            call.out_ref, call.out_fn = weakref.ref(out), out.grad_fn
        if func.__name__ == "nll_loss":
            call.exp_sum = _exp_sum(inp)
        if link is not None:
            mid, i, view = link
            margs, mfeed = self.outputs[mid][1:]
            call.model, call.leaf, call.model_args, call.model_feed = self.models[mid].module, i, margs, mfeed
            call.model_keywords, call.view = self.models[mid].keywords, view
        self.loss_calls.append(call)
        if from_module:
            self._last_root = None

    def _output_of(self, x) -> Optional[tuple]:
        """(id of the model, its output leaf, LossCall.view) where ``x`` is a model's output of
        this step or a view of one (the last model to have it), else None."""
        found = None
        for mid, (leaves, _, _) in self.outputs.items():
            for i, t in enumerate(leaves):
                view = None if t is x else _view_of(x, t) or _indexed_of(x, t)
                if t is x or view is not None:
                    found = (mid, i, view)
        return found

    def optimizer(self, opt, when: str) -> None:
        if self.steps_done >= self.steps:
            return
        seen = next((s for s in self.optimizers if s.opt is opt), None)
        if seen is None:
            hyper = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
            params = [p for g in opt.param_groups for p in g["params"] if p.requires_grad]
            seen = OptimizerSeen(opt, hyper, params)
            self.optimizers.append(seen)
            for p in params:
                if hasattr(p, "register_post_accumulate_grad_hook"):
                    self._grad_hooks.append(p.register_post_accumulate_grad_hook(self._reached_hook))
        self._note_grads(seen.params)
        if when == "pre":
            for m in list(self.models.values()):
                for p in m.module.parameters():
                    if p.requires_grad and id(p) not in self.model_grads and p.grad is not None and \
                            not p.grad.is_sparse and bool((p.grad != 0).any()):
                        self.model_grads[id(p)] = p
            seen.before = [p.detach().clone() for p in seen.params]
            seen.lrs.append([_number(g.get("lr")) for g in opt.param_groups])
        elif seen.before is not None:
            for p, b in zip(seen.params, seen.before):
                if not torch.equal(p.detach(), b):
                    scale = max(float(b.double().norm()), float(p.detach().double().norm()))
                    change = float((p.detach() - b).double().norm()) / scale
                    self.changed[id(p)] = max(change, self.changed.get(id(p), 0.0))
                    self._note_rewrite(seen.opt, p, b)
            seen.before = None

    def _note_rewrite(self, opt, p, before) -> None:
        from ..rules.series import MIN_ELEMENTS, MULTI_ITERATION
        if type(opt).__name__ in MULTI_ITERATION or p.dim() < 2 or p.numel() < MIN_ELEMENTS.default \
                or not bool(before.any()):
            return
        after = p.detach().double()
        w = float(after.norm())
        ratio = float((after - before.double()).norm()) / w if w > 0 else math.inf
        if ratio > self.rewrites.get(id(p), (-1.0, 0))[0]:
            self.rewrites[id(p)] = (ratio, self.steps_done)

    def _reached_hook(self, p) -> None:
        try:
            g = p.grad
            if g is not None and id(p) not in self.reached and not g.is_sparse and bool((g != 0).any()):
                self.reached.add(id(p))
        except Exception:                    # (a hook in the script's backward never raises)
            pass

    def _note_grads(self, params) -> None:
        for p in params:
            g = p.grad
            if g is None:
                continue
            self.got_grad.add(id(p))
            v = g.coalesce().values() if g.is_sparse else g.detach()
            if not bool(torch.isfinite(v).all()):
                self.nonfinite.add(id(p))
            elif bool((v != 0).any()):
                self.nonzero.add(id(p))
                rms = float(v.double().norm()) / math.sqrt(max(p.numel(), 1))   # (a sparse one's: over the whole)
                self.grad_rms[id(p)] = max(rms, self.grad_rms.get(id(p), 0.0))

    # -- what the checks ask --------------------------------------------------------------
    def unheld_with_grad(self) -> list:
        """Parameters backward() gave a gradient that no optimizer holds."""
        held = {id(p) for o in self.optimizers for g in o.opt.param_groups for p in g["params"]}
        return [p for i, p in self.model_grads.items() if i not in held]

    def primary_loss(self) -> Optional[LossCall]:
        """The training loss: the first linked to a model and differentiable, else the first."""
        calls = [c for c in self.loss_calls if c.step == 0] or self.loss_calls
        for want in (lambda c: c.model is not None and c.input_requires_grad,
                     lambda c: c.input_requires_grad, lambda c: True):
            hit = next((c for c in calls if want(c)), None)
            if hit is not None:
                return hit
        return None

    def output_loss(self) -> Optional[OutputLoss]:
        """The first step's backward loss that a model returned itself, if one did."""
        return next((o for o in self.output_losses if o.step == 0), None) or \
            next(iter(self.output_losses), None)

    def chain(self, call) -> Optional[list]:
        """The models the loss's input (a LossCall's; an OutputLoss's: the loss itself) went
        through, from the data on: [(ModelSeen, Feed or None)], the first fed by the data (its
        Feed None), each later one by the one before (``head(backbone(x))``: backbone, then head);
        None where an input was computed with autograd from something else (``GRAPH``), or
        nothing links the loss to a model."""
        if call.model is None:
            return None
        out, model = [], call.model
        feed = call.feed if isinstance(call, OutputLoss) else call.model_feed
        while True:
            if feed == GRAPH or len(out) > len(self.models):
                return None
            out.append((self.models[id(model)], feed))
            if feed is None:
                return out[::-1]
            model, feed = feed.model, feed.feed

    def model(self) -> Optional[ModelSeen]:
        """The model the checks look at: the first the data went into on the way to the training
        loss (``backbone`` in ``head(backbone(x))``)."""
        call = self.primary_loss()
        if call is not None and call.model is not None:
            chain = self.chain(call)
            return chain[0][0] if chain else self.models[id(call.model)]
        if self.optimizers:
            held = {id(p) for p in self.optimizers[0].params}
            for seen in self.models.values():
                if any(id(p) in held for p in seen.module.parameters()):
                    return seen
        return next(iter(self.models.values()), None)

    def param_name(self, p) -> str:
        try:
            return self.rec.naming.param_name(p)
        except Exception:
            return f"<parameter {tuple(p.shape)}>"


def _same_modes(replica: torch.nn.Module, module: torch.nn.Module) -> None:
    """Put ``replica``'s modules in the train/eval modes ``module``'s have now, its training
    forward's.  A script that evaluates before it trains (``model.eval()`` and a validation
    pass under no_grad, Lightning's sanity check) made the copy in eval mode: BatchNorm with
    its initial running statistics, no dropout, and ``overfit`` trained that (2.403 where the
    step's loss was 2.493, SKIP 'still falling' or FAIL 'cannot fit' on a healthy CNN)."""
    modes = {name: m.training for name, m in module.named_modules()}
    for name, m in replica.named_modules():
        if name in modes:
            m.training = modes[name]


def _deepcopy(module: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``module``.  A tensor attribute computed with autograd, which deepcopy
    refuses (torch.nn.utils.prune's ``weight``: weight_orig x mask; the old weight_norm's and
    spectral_norm's ``weight``), is copied detached: the module's forward pre-hook computes it
    again from the copied parameters at each call."""
    memo: dict = {}
    for m in module.modules():
        for v in vars(m).values():
            if isinstance(v, torch.Tensor) and v.grad_fn is not None:
                memo[id(v)] = v.detach().clone()
    return copy.deepcopy(module, memo)


# A one-number loss times or over a number: gradient accumulation's ``loss / accumulation_steps``
# (nanoGPT's, accelerate's accelerator.backward, the Hugging Face Trainer's)
_SCALINGS = ("MulBackward0", "MulBackward1", "DivBackward0", "DivBackward1")


def _scaled_from(loss) -> list:
    """The grad_fns of the tensors the one-number tensor ``loss`` is a multiple of (``loss / 4``:
    the loss the model returned; a model may scale its own loss too, so every one down the chain
    of products and quotients by a number, or by a tensor out of the graph)."""
    out = []
    fn = getattr(loss, "grad_fn", None) if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None
    for _ in range(4):
        if fn is None or type(fn).__name__ not in _SCALINGS:
            break
        inputs = [f for f, _ in fn.next_functions if f is not None]
        if len(inputs) != 1:
            break
        fn = inputs[0]
        out.append(fn)
    return out


def _view_of(inp: torch.Tensor, t) -> Optional[tuple]:
    """Where ``inp`` is a view of the model's output ``t`` (``logits.view(-1, V)``,
    ``out.squeeze(1)``, ``logits.transpose(1, 2)``, ``logits[:, -1]``): how to take it of another
    output laid out as ``t`` (``LossCall.view``); None otherwise (a copy: ``.float()``, a
    ``reshape`` of a non-contiguous output).  ``t`` contiguous, so that every element of its
    storage span that the view reads is one of ``t``'s."""
    if not isinstance(t, torch.Tensor) or inp._base is None or inp.layout is not torch.strided \
            or t.layout is not torch.strided or inp.dtype != t.dtype or inp.device != t.device \
            or not t.is_contiguous() or t.numel() == 0 or inp.numel() == 0:
        return None
    try:
        if inp.untyped_storage().data_ptr() != t.untyped_storage().data_ptr():
            return None
    except Exception:
        return None
    rel = inp.storage_offset() - t.storage_offset()
    last = rel + sum((n - 1) * abs(st) for n, st in zip(inp.shape, inp.stride()))
    if rel < 0 or any(st < 0 for st in inp.stride()) or last >= t.numel():
        return None
    return tuple(inp.shape), tuple(inp.stride()), rel, tuple(t.shape), tuple(t.stride())


def _indexed_of(inp: torch.Tensor, t) -> Optional[Indexed]:
    """Where ``inp`` is the model's output ``t`` indexed by tensors (``output[mask_train]``,
    ``logits[:, idx]``: autograd's IndexBackward0 of ``t`` itself), the Indexed that indexes
    another output the same way; None otherwise."""
    fn = inp.grad_fn
    if not isinstance(t, torch.Tensor) or fn is None or t.grad_fn is None \
            or type(fn).__name__ != "IndexBackward0" or not fn.next_functions:
        return None
    src, nr = fn.next_functions[0]
    if src is not t.grad_fn or nr != t.output_nr:
        return None
    try:
        indices = tuple(None if i is None else i.detach().clone() for i in fn._saved_indices)
    except Exception:                    # (a saved tensor freed or changed in place)
        return None
    return Indexed(indices, tuple(t.shape))


def _number(x) -> Optional[float]:
    """A hyper-parameter as a float (a 0-d tensor too), or None."""
    try:
        return float(x) if isinstance(x, (int, float, torch.Tensor)) and not isinstance(x, bool) else None
    except (TypeError, ValueError, RuntimeError):
        return None


# binary_cross_entropy_with_logits on a sigmoid's output, through views (a sigmoid before the
# with-logits loss made its initial loss 0.9217 against ln(2) = 0.693, a PASS).  By the autograd
# graph, not by value: a small GAN discriminator's fresh logits were all in [0, 1] (32 of them)
VIEW_NODES = ("ViewBackward0", "ReshapeAliasBackward0", "UnsafeViewBackward0", "SqueezeBackward0",
              "SqueezeBackward1", "SqueezeBackward2", "UnsqueezeBackward0", "SelectBackward0",
              "SliceBackward0", "TBackward0", "TransposeBackward0", "PermuteBackward0",
              "CloneBackward0", "ExpandBackward0")


def _sigmoid_output(inp: torch.Tensor) -> bool:
    fn = inp.grad_fn
    while fn is not None and type(fn).__name__ in VIEW_NODES:
        fn = next((f for f, _ in fn.next_functions if f is not None), None)
    return fn is not None and type(fn).__name__ == "SigmoidBackward0"


def _exp_sum(inp: torch.Tensor) -> Optional[float]:
    """The median over an nll_loss input's rows (its class dim: 1, or 0 unbatched) of their
    exp's sum: 1 for log-probabilities (log_softmax's output), ~C for raw logits near 0."""
    if not inp.is_floating_point() or inp.dim() < 1 or not inp.numel():
        return None
    x = inp.detach().double().exp().sum(1 if inp.dim() >= 2 else 0).flatten()
    x = x[torch.isfinite(x)]
    return float(x.median()) if x.numel() else None


def _probs_like(inp: torch.Tensor, kind: str) -> bool:
    if not inp.is_floating_point():
        return False
    x = inp.detach()
    if kind == "binary_cross_entropy_with_logits":
        return _sigmoid_output(inp)
    if kind != "cross_entropy" or inp.dim() < 2:
        return False
    return bool(x.min() >= 0) and bool(x.max() <= 1) and \
        bool(torch.allclose(x.double().sum(1), torch.ones((), dtype=torch.float64), atol=1e-3))


class LossMode(FunctionWatch):
    """Sees torch.nn.functional's loss calls (nndb.tracer.funcmode); every call goes through unchanged."""

    def __init__(self, capture: Capture):
        guarded = capture._guard(capture.loss_call)

        op = capture._guard(capture.tensor_op)
        filled = capture._guard(capture.filled)

        def on_call(func, args, kwargs, out):
            if functional_loss(func) is not None:
                guarded(func, args, kwargs, out)
                return
            if capture._tags:
                op(func, args, out)
            if func in FILLS or func in COPIES and capture._filled:
                filled(func, args, out)
            if capture.steps_done >= capture.steps and torch.is_grad_enabled() \
                    and capture._last_root is None and not capture.optimizers:
                # The steps are done: a loop of bare tensors, with no module call or optimizer
                # step to be unwound at (Capture._stop_if_done), is unwound at its first torch
                # call with autograd on (its hand-written update after the last step runs under
                # no_grad; the next step's forward does not)
                raise KillRun()
        # (nndb's own tensor work at a step end is not the script's: the tracer's busy flag)
        super().__init__(on_call, quiet=capture.rec.tracer)
        self.capture = capture
