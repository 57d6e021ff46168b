"""Check 7 of ``nndb check``: can the model overfit one small fixed batch?

On a replica: the deep copy of the model taken at its first forward (its
train/eval modes as the script had them) and a fresh optimizer of the
script's class with its hyper-parameters (per param group; a scheduler's
``initial_lr`` stands for the lr, OneCycleLR's ``max_lr`` where it has one).  It trains on the first OVERFIT_BATCH
samples of the captured batch with the script's loss function, for up to
``iters`` iterations, with the global RNG saved and restored (seeded 0
inside, so dropout is repeatable).  The live model and optimizer are never
touched; the script has already stopped when this runs.
"""
from __future__ import annotations

import math
import warnings

import torch
from torch.utils import _pytree as pytree

from .capture import Capture, LossCall
from .checks import NO_LOSS, OVERFIT_ABS, OVERFIT_BATCH, OVERFIT_REL, Check, Outcome, _describe_input, _skip


def overfit(cap: Capture, outcome: Outcome, iters: int) -> Check:
    call = cap.primary_loss()
    if call is None:
        return _skip("overfit", NO_LOSS + ": nndb cannot recompute the loss on a copy", outcome)
    if call.model is None:
        return _skip("overfit", f"{call.name} was not called on the model's output itself (a reshape or slice "
                     "in between?): nndb cannot recompute the loss on a copy", outcome)
    chain = cap.chain(call)
    seen = cap.models[id(call.model)]
    model_name = type(seen.module).__name__
    if chain is None:
        return _skip("overfit", f"{model_name}'s input is computed with autograd from tensors no model of the "
                     "run made alone (a trainable tensor outside the modules, two models' outputs combined, "
                     "a module fed its own output): nndb cannot rebuild the forward pass on a copy", outcome)
    stuck = next((s for s, _ in chain if s.replica is None), None)
    if stuck is not None:
        return _skip("overfit", f"{type(stuck.module).__name__} cannot be deep-copied: {stuck.replica_error}",
                     outcome)
    model, replica = _Chain([s.module for s, _ in chain], chain), _Chain([s.replica for s, _ in chain], chain)
    if len(chain) > 1:
        model_name = " -> ".join(type(s.module).__name__ for s, _ in chain)
        if len(list(model.parameters())) != len(list(replica.parameters())):
            return _skip("overfit", f"{model_name} share parameters: their copies would not", outcome)
    model_params = {id(p) for p in model.parameters()}
    opts = [o for o in cap.optimizers if any(id(p) in model_params for p in o.params)]
    if len(opts) != 1:
        return _skip("overfit", f"{len(opts)} optimizers hold {model_name}'s parameters: "
                     + ("no optimizer stepped" if not opts else "nndb overfits with one"), outcome)
    try:
        opt = _fresh_optimizer(opts[0], model, replica)
    except Exception as e:
        return _skip("overfit", f"cannot make a fresh {type(opts[0].opt).__name__}: {type(e).__name__}: {e}", outcome)
    args, target, n = _small_batch(call, replica.batch_args())
    floor = _floor(call, target)
    lr = opt.param_groups[0].get("lr")
    peak = ", its schedule's max_lr" if "max_lr" in opt.param_groups[0] else ""
    setup = f"{n} sample(s), {type(opt).__name__}" + (f"(lr={lr:g}{peak})" if isinstance(lr, (int, float)) else "")
    devices = sorted({p.device.index or 0 for p in replica.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices), torch.enable_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")         # the script's own run has shown its warnings
        torch.manual_seed(0)
        try:
            losses = _train(replica, opt, call, args, target, iters, floor[0])
        except Exception as e:
            return _skip("overfit", f"training the replica raised {type(e).__name__}: {e}", outcome)
    return _verdict(cap, call, setup, losses, iters, model, floor)


def _fresh_optimizer(seen_opt, model, replica):
    pmap = {id(p): q for p, q in zip(model.parameters(), replica.parameters())}
    groups = []
    for g, hyper in zip(seen_opt.opt.param_groups, seen_opt.hyper):
        ps = [pmap[id(p)] for p in g["params"] if id(p) in pmap and p.requires_grad]
        if ps:
            h = dict(hyper)
            if "initial_lr" in h:
                h["lr"] = h["initial_lr"]
            if isinstance(h.get("max_lr"), (int, float)):
                # OneCycleLR's: its initial_lr is the warm start, max_lr / 25 by default, where the
                # script spends a few steps (a healthy model's overfit FAILed at 1.117 -> 0.3164)
                h["lr"] = h["max_lr"]
            groups.append({**h, "params": ps})
    if not groups:
        raise ValueError("it holds none of the model's trainable parameters")
    cls = type(seen_opt.opt)
    try:
        return cls(groups, **seen_opt.opt.defaults)
    except TypeError:
        return cls(groups)


class _Chain(torch.nn.Module):
    """The models a loss's input went through, called as the script called them
    (``head(backbone(x))``: backbone, then head on its output), on their own inputs of that
    forward otherwise.  One model alone is called as it is.  Called with a tuple per model: the
    first's inputs, then each later one's (its fed input left in place: replaced)."""

    def __init__(self, modules, chain):
        super().__init__()
        self.stages = torch.nn.ModuleList(modules)
        self.feeds = [feed for _, feed in chain]         # (None for the first)
        # each model's inputs of the loss's forward: the first's are the fed one's Feed.args
        self.inputs = [feed.args for _, feed in chain[1:]] + [None]

    def batch_args(self) -> list:
        """The inputs of the models before the last, as the loss's forward gave them."""
        return list(self.inputs[:-1])

    def forward(self, *per_stage):
        out = self.stages[0](*per_stage[0])
        for module, feed, args in zip(self.stages[1:], self.feeds[1:], per_stage[1:]):
            x, k = pytree.tree_leaves(out)[feed.leaf], 0
            flat, spec = pytree.tree_flatten(args)
            for i, t in enumerate(flat):
                if isinstance(t, torch.Tensor):
                    if k == feed.arg:
                        flat[i] = x
                    k += 1
            out = module(*pytree.tree_unflatten(flat, spec))
        return out


def _small_batch(call: LossCall, earlier: list):
    """The inputs of each model the loss's input went through (``earlier``: those before the
    model of the loss, then ``call.model_args``), cut to their first OVERFIT_BATCH samples,
    where every input and the target share the batch dimension (dim 0) and none is sparse (a
    graph's adjacency and features: its nodes, not a batch to cut); else the whole captured
    batch.  Returned as one tuple of inputs per model."""
    per_stage = [a if isinstance(a, tuple) else (a,) for a in earlier + [call.model_args]]
    target = call.target
    b = call.input_shape[0] if call.input_shape else None
    leaves = [t for t in pytree.tree_leaves(per_stage) if isinstance(t, torch.Tensor)]
    ok = (b is not None and b > OVERFIT_BATCH and target is not None and target.dim() > 0
          and target.shape[0] == b and all(t.dim() > 0 and t.shape[0] == b and t.layout is torch.strided
                                           for t in leaves))
    if not ok:
        return per_stage, target, b if b is not None else "all"
    cut = pytree.tree_map(lambda t: t[:OVERFIT_BATCH] if isinstance(t, torch.Tensor) else t, per_stage)
    return cut, target[:OVERFIT_BATCH], OVERFIT_BATCH


def _loss_fn(call: LossCall, target):
    def loss_of(output):
        pred = pytree.tree_leaves(output)[call.leaf]
        args, kwargs = list(call.args), dict(call.kwargs)
        if args:
            args[0] = pred
        else:
            kwargs["input"] = pred
        if call.target_pos == "target":
            kwargs["target"] = target
        elif call.target_pos is not None:
            args[call.target_pos] = target
        loss = call.func(*args, **kwargs)
        return loss.mean() if loss.dim() else loss
    return loss_of


def _floor(call: LossCall, target) -> tuple:
    """(the least value the loss can take on these targets, what it is): the targets' entropy for
    binary cross-entropy on targets strictly between 0 and 1 (gray pixels, as an autoencoder's),
    cross-entropy on probability targets (distillation, mixup) or with label_smoothing: the loss
    at the prediction equal to the targets, which no model gets below.  (0, "") otherwise (and
    where a class weight or pos_weight moves the minimum off the targets)."""
    kw = dict(call.kwargs)
    if target is None or not isinstance(target, torch.Tensor) or not target.is_floating_point() and \
            call.kind != "cross_entropy":
        return 0.0, ""
    try:
        with torch.no_grad():
            t = target.detach()
            if call.kind == "binary_cross_entropy":
                if not bool(((t > 0) & (t < 1)).any()):
                    return 0.0, ""
                ideal = t.clamp(0, 1)
            elif call.kind == "binary_cross_entropy_with_logits":
                if kw.get("pos_weight") is not None or not bool(((t > 0) & (t < 1)).any()):
                    return 0.0, ""
                ideal = torch.logit(t.clamp(0, 1).double(), eps=1e-12).to(t.dtype)
            elif call.kind == "cross_entropy":
                smooth = float(kw.get("label_smoothing") or 0.0)
                if kw.get("weight") is not None or not (t.is_floating_point() or smooth > 0):
                    return 0.0, ""
                c_dim = 1 if len(call.input_shape) >= 2 else 0
                classes = call.input_shape[c_dim]
                if t.is_floating_point():
                    probs = t
                else:
                    ignore = kw.get("ignore_index", -100)
                    idx = torch.where(t == ignore, torch.zeros_like(t), t).long()
                    probs = torch.nn.functional.one_hot(idx, classes).movedim(-1, c_dim).to(torch.float64)
                probs = probs.double() * (1 - smooth) + smooth / classes
                ideal = probs.clamp_min(1e-300).log().to(torch.float32 if not t.is_floating_point() else t.dtype)
            else:
                return 0.0, ""
            value = float(_loss_fn(call, target)(ideal).detach().double())
    except Exception:
        return 0.0, ""
    if not math.isfinite(value) or value <= 0:
        return 0.0, ""
    return value, "the targets' entropy"


def _train(replica, opt, call: LossCall, args, target, iters: int, floor: float = 0.0) -> list:
    loss_of = _loss_fn(call, target)

    def closure():
        opt.zero_grad(set_to_none=True)
        loss = loss_of(replica(*args))
        loss.backward()
        return loss

    threshold, losses = None, []
    lbfgs = isinstance(opt, torch.optim.LBFGS)
    for _ in range(iters):
        if lbfgs:
            loss = opt.step(closure)
        else:
            loss = closure()
            opt.step()
        v = float(loss.detach())
        losses.append(v)
        if not math.isfinite(v):
            break
        if threshold is None:
            threshold = floor + max(OVERFIT_REL * (v - floor), OVERFIT_ABS)
        if v <= threshold:
            break
    return losses


# Inconclusive rather than failed: the loss came down to at most SLOW_SHARE of its first value
# and fell by STILL_FALLING or more over the last quarter of the iterations (a healthy MLP under
# SGD at lr 0.05: 1.496 -> 0.1446 in 300, 0.0748 needed, still falling)
SLOW_SHARE = 0.2
STILL_FALLING = 0.1


def _verdict(cap: Capture, call: LossCall, setup: str, losses: list, iters: int, model,
             floor: tuple = (0.0, "")) -> Check:
    first, last = losses[0], losses[-1]
    low, what = floor
    if not math.isfinite(first):
        return Check("overfit", "SKIP", f"{setup}: the first loss is {first} (see finite-loss)")
    if first == 0:
        return Check("overfit", "SKIP", f"{setup}: the loss is 0 before any training, so there is nothing to "
                     "fit (see finite-loss)")
    # (where the loss cannot go below a floor, the way from the first loss down to it)
    goal = low + max(OVERFIT_REL * (first - low), OVERFIT_ABS)
    finite = [v for v in losses if math.isfinite(v)]
    nums = {"first": first, "last": last, "best": min(finite), "goal": goal, "iterations": len(losses)}
    goal_text = f"goal < {goal:.3g}: {OVERFIT_REL:.0%} of the first loss or {OVERFIT_ABS:g}"
    if low:
        nums["floor"] = low
        goal_text = (f"goal < {goal:.4g}: {low:.4g}, {what}, the least the loss can be, plus "
                     f"{OVERFIT_REL:.0%} of the first loss above it or {OVERFIT_ABS:g}")
    if math.isfinite(last) and last <= goal:
        return Check("overfit", "PASS", f"{setup}: loss {first:.4g} -> {last:.4g} in {len(losses)} "
                     f"iteration(s) ({goal_text})", numbers=nums)
    if not math.isfinite(last):
        return Check("overfit", "FAIL", f"{setup}: loss {first:.4g} -> {last} at iteration {len(losses)}",
                     "the training diverges even on one batch: the learning rate is too high for this model "
                     "and data (unnormalised inputs make it worse)", nums)
    # Still falling fast where the iterations ran out, most of the way down already: a slow
    # optimiser (plain SGD at a modest learning rate), not a model that cannot fit
    quarter = finite[-max(2, len(finite) // 4):]
    if len(finite) == len(losses) and last - low <= SLOW_SHARE * (first - low) and \
            quarter[-1] - low <= (1 - STILL_FALLING) * (quarter[0] - low):
        return Check("overfit", "SKIP", f"{setup}: loss {first:.4g} -> {last:.4g} after {len(losses)} iteration(s), "
                     f"still falling ({1 - (quarter[-1] - low) / (quarter[0] - low):.0%} in the last {len(quarter)}), not yet at the "
                     f"goal ({goal_text}): more iterations tell (--overfit-iters N)", numbers=nums)
    hints = []
    lrs = [lr for o in cap.optimizers for step in o.lrs[:1] for lr in step]
    if lrs and all(lr == 0 for lr in lrs):
        hints.append("the learning rate is 0")
    if call.probs_like:
        hints.append("a softmax before cross_entropy keeps the loss from going low")
    inputs = [t for t in pytree.tree_leaves(model.inputs[0] if len(model.inputs) > 1 else call.model_args)
              if isinstance(t, torch.Tensor)]
    if any(_describe_input(t, mask_ok=i > 0)[1] for i, t in enumerate(inputs)):       # (as the data check)
        hints.append("unnormalised inputs (see data)")
    model_params = [p for p in model.parameters() if p.requires_grad]
    if any(id(p) in cap.got_grad and id(p) not in cap.nonzero | cap.nonfinite for p in model_params):
        hints.append("dead units: some parameters get all-zero gradients (see gradients)")
    generic = ("a bug in the model (a detached or dead path), too little capacity, a learning rate far too "
               "small or too large, or inputs that do not match their labels")
    hints.append(("otherwise " if hints else "") + generic)
    return Check("overfit", "FAIL", f"{setup}: loss {first:.4g} -> {last:.4g} after {len(losses)} iteration(s), "
                 f"best {min(finite):.4g} ({goal_text})",
                 "the model cannot fit one small batch: " + "; ".join(hints), nums)
