"""Check 7 of ``nndb check``: can the model overfit one small fixed batch?

On a replica: the deep copy of the model taken at its first forward (its
train/eval modes those of its first forward with autograd on, a training
forward's, not an evaluation's before training) and a fresh optimizer of the
script's class with its hyper-parameters (per param group; a scheduler's
``initial_lr`` stands for the lr, OneCycleLR's ``max_lr`` where it has one, and the
optimizer's own lr for a warmup written by hand).  It trains on the first OVERFIT_BATCH
samples of the captured batch with the script's loss function, for up to
``iters`` iterations, with the global RNG saved and restored (seeded 0
inside, so dropout is repeatable).  The live model and optimizer are never
touched; the script has already stopped when this runs.

Why this size: one question, asked of one copy.  The copy (``_Chain``), its
batch (``_small_batch``), the goal (the least the loss can be on that batch:
``_floor``, ``_sequence_floor``, computed with the copy's own loss function,
``_loss_on``, and its outputs' reach, ``_lookback``), the training, the
retry at a larger lr and the verdict all read the same run; apart, each
would take the others' internals as arguments.
"""
from __future__ import annotations

import contextlib
import math
import warnings

from typing import Optional

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from ..text import fmt
from ..tracer.discover import split_call
from .capture import Capture, Indexed, LossCall
from .checks import NO_LOSS, OVERFIT_ABS, OVERFIT_BATCH, OVERFIT_REL, Check, Outcome, _shape, _skip, describe_inputs


def overfit(cap: Capture, outcome: Outcome, iters: int) -> Check:
    call = cap.primary_loss()
    own = cap.output_loss() if call is None or call.model is None else None
    if own is not None:
        # the model returns its loss itself (``logits, loss = model(x, y)``, a Hugging Face
        # model's ``out.loss``): the copy's is the loss, whatever computed it inside
        call = OwnLoss(own, call)
    elif call is None:
        return _skip("overfit", NO_LOSS + ": nndb cannot recompute the loss on a copy", outcome)
    elif call.model is None:
        return _skip("overfit", f"{call.name} was not called on the model's output itself (nor on a view of "
                     "it: a copy, a slice or arithmetic in between?): nndb cannot recompute the loss on a copy",
                     outcome)
    chain = cap.chain(own if own is not None else call)
    seen = cap.models[id(call.model)]
    model_name = type(seen.module).__name__
    if chain is None:
        return _skip("overfit", f"{model_name}'s input is computed with autograd from tensors no model of the "
                     "run made alone (a trainable tensor outside the modules, two models' outputs combined, "
                     "a module fed its own output): nndb cannot rebuild the forward pass on a copy", outcome)
    again = next((s for s, _ in chain if cap.repeated.get(id(s.module), 0) > 1), None)
    if again is not None:
        # (two inputs through one model before its backward: a GAN's discriminator on a real and a
        # fake batch, a decoder's loop over time steps, a siamese pair: one call's loss is a part of
        # the script's, and a model that fits it need not fit the script's).  What is said is what
        # the capture saw, never a guess at the kind of script (it guessed a decoder for GANs).
        return _skip("overfit", _repeated_calls(cap, again.module), outcome)
    stuck = next((s for s, _ in chain if s.replica is None), None)
    if stuck is not None:
        return _skip("overfit", f"{type(stuck.module).__name__} cannot be deep-copied: {stuck.replica_error}",
                     outcome)
    model = _Chain([s.module for s, _ in chain], chain, call.model_keywords)
    replica = _Chain([s.replica for s, _ in chain], chain, call.model_keywords)
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
        opt, warmup = _fresh_optimizer(opts[0], model, replica)
    except Exception as e:
        return _skip("overfit", f"cannot make a fresh {type(opts[0].opt).__name__}: {type(e).__name__}: {e}", outcome)
    args, target, n = _small_batch(call, replica.batch_args())
    # the copy as it starts: put back after _lookback's probe and before a retry (_faster)
    start = {k: v.detach().clone() for k, v in replica.state_dict().items()}
    cut: list = []           # (_lookback: a model that mixes positions and yet looks back fewer)
    if own is None:
        floor = _floor(call, target)
    elif own.call is not None and own.call.target is not None and (n != OVERFIT_BATCH or not (
            own.call.target.is_floating_point() or own.call.kwargs.get("reduction") == "sum")):
        # (the loss the model returned is a loss function's call inside it: on this very batch, or
        # on class indices, whose floor with label smoothing is the same for every target)
        floor = _floor(own.call, own.call.target)
    else:
        floor = (0.0, "")
    inner = own.call if own is not None else call
    if inner is not None and inner.kind == "cross_entropy":
        # next-token targets: tokens with the same prefix in the batch and different next ones
        # keep the loss above 0 for any model (names that start alike, at their first letters)
        seq = _sequence_floor(inner, [t for t in pytree.tree_leaves(args[0]) if isinstance(t, torch.Tensor)],
                              target if own is None else inner.target,
                              lambda x: _lookback(replica, args, x, start, cut), inputs_too=own is not None)
        if seq[0] > floor[0]:
            floor = seq
    if own is not None and floor[0] > 0:
        # (in the call's own units: the model's loss is a multiple of it, a Hugging Face model's
        # sum over the tokens divided by the Trainer's num_items_in_batch)
        ratio = own.value / inner.value if inner.value else math.nan
        floor = (floor[0] * ratio, floor[1]) if math.isfinite(ratio) and ratio > 0 else (0.0, "")
    # every param group's lr (a fine-tune's frozen groups at 0, its backbone's below its head's:
    # group 0's alone read 'SGD(lr=0)' for a head trained at 0.05)
    lrs = list(dict.fromkeys(g.get("lr") for g in opt.param_groups))
    peak = ", its schedule's max_lr" if "max_lr" in opt.param_groups[0] else warmup
    optimizer_text = type(opt).__name__ + (
        f"(lr={', '.join(f'{lr:g}' for lr in lrs)}{peak})" if all(isinstance(lr, (int, float)) for lr in lrs) else "")
    back = {id(q): p for p, q in zip(model.parameters(), replica.parameters())}
    at_zero = [cap.param_name(back[id(q)]) for g in opt.param_groups if g.get("lr") == 0 for q in g["params"]]
    devices = sorted({p.device.index or 0 for p in replica.parameters() if p.device.type == "cuda"})
    no_dropout, rnn_off = _NoDropout(), _rnn_dropout_off(replica)

    def fit(optimizer) -> list:
        with torch.random.fork_rng(devices=devices), torch.enable_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")         # the script's own run has shown its warnings
            torch.manual_seed(0)
            with no_dropout, rnn_off:
                return _train(replica, optimizer, call, args, target, iters, floor[0])
    seq_first = _SeqFirst(replica) if n != OVERFIT_BATCH else None
    try:
        with seq_first or contextlib.nullcontext():
            losses = fit(opt)
    except Exception as e:
        return _skip("overfit", f"training the replica raised {type(e).__name__}: {e}", outcome)
    samples = seq_first.samples(args, n) if seq_first is not None else f"{n} sample(s)"
    if isinstance(call.view, Indexed):
        # (a graph's nodes, all of them in every forward, its loss on the training nodes' rows)
        samples += f" (the loss on {_shape(call.input_shape)} of the output's {_shape(call.view.shape)}, " \
                   "indexed as the script did)"
    setup = f"{samples}, {optimizer_text}"
    if no_dropout.dropped or rnn_off.rnns:
        setup += ", dropout off"
    verdict = _verdict(cap, call, setup, losses, iters, model, floor, at_zero, lrs, cut)
    written = _written_state(replica, start, opt) if verdict.status == "FAIL" else []
    if written:
        more = f" and {len(written) - 4} more" if len(written) > 4 else ""
        return Check("overfit", "SKIP", f"{verdict.evidence.split(' -- ')[0]}; but {model_name}'s forward changes "
                     f"its own state besides what the optimizer trains ({', '.join(written[:4])}{more}: a queue, "
                     "a momentum encoder, as MoCo's): its loss on one batch is not a function of the trained "
                     "parameters alone, and nndb cannot overfit it", numbers=dict(verdict.numbers, written=written))
    if verdict.status == "PASS" or not math.isfinite(verdict.numbers.get("last", math.nan)) \
            or "goal" not in verdict.numbers or not all(isinstance(lr, (int, float)) and lr > 0 for lr in lrs):
        return verdict
    # Not at the goal, not diverged: at FASTER times the learning rate, from the same start
    try:
        replica.load_state_dict(start)
        quick, _ = _fresh_optimizer(opts[0], model, replica)
        for g in quick.param_groups:
            g["lr"] = g["lr"] * FASTER
        again = fit(quick)
    except Exception:
        return verdict              # (what the script's lr gave stands)
    return _faster(verdict, again, lrs, setup, floor)


def _written_state(replica, start: dict, opt) -> list:
    """The names of the replica's tensors that its training changed from ``start`` and that the
    optimizer does not train: parameters it holds frozen or does not hold (MoCo's key encoder, a
    momentum copy its forward updates) and buffers (MoCo's queue of keys); not a normalisation
    layer's running statistics, nor spectral_norm's power-iteration vectors, which a forward
    updates in any model."""
    trained = {id(p) for g in opt.param_groups for p in g["params"] if p.requires_grad}
    statistics = set()
    for m in replica.modules():
        if isinstance(m, torch.nn.modules.batchnorm._NormBase) or type(m).__name__ == "_SpectralNorm":
            statistics.update(id(b) for b in m.buffers(recurse=False))
        for name, b in m.named_buffers(recurse=False):
            if name.endswith(("_u", "_v")) and hasattr(m, name[:-2] + "_orig"):     # (the old spectral_norm's)
                statistics.add(id(b))
    written = []
    for i, stage in enumerate(replica.stages):
        for name, t in stage.state_dict(keep_vars=True).items():
            was = start.get(f"stages.{i}.{name}")
            if id(t) in trained or id(t) in statistics or not isinstance(t, torch.Tensor) or was is None \
                    or t.shape != was.shape:
                continue
            t = t.detach()
            same = torch.allclose(t, was, rtol=0, atol=0, equal_nan=True) if t.is_floating_point() else \
                torch.equal(t, was)
            if not same:        # (named as in its model; with several models, after the model's class)
                written.append(name if len(replica.stages) == 1 else f"{type(stage).__name__}.{name}")
    return written


# A model that does not fit its batch at the script's learning rate in the iterations given is
# trained again, from the same start, at FASTER times it.  A learning rate chosen for a long
# run is often too small to fit one batch in 300 iterations: a healthy DCGAN discriminator
# at Adam's 0.0002 (0.6092 -> 0.3460) and a healthy classifier alike (0.6841 -> 0.4352) FAILed
# 'cannot fit one small batch'; at 0.002 both fit it.  What cannot fit at either (dead units, a
# softmax before cross_entropy, a learning rate of 0) stays FAIL, with both runs said.
FASTER = 10


class _SeqFirst:
    """How many samples a whole batch holds where the model reads its sequences time first: a
    recurrent layer or an attention without ``batch_first`` takes (time, batch, features), so a
    language model's (35, 20) tokens are 20 sequences, not 35 samples (word_language_model's
    shape said '9 sample(s)' for 16 sequences of 9 tokens).  The first such layer's input, seen
    as the copy trains, tells the batch size; the input's dimension of that size is its batch's
    (a CRNN's (B, C, H, W) images feed its LSTM (W, B, C): B samples, as said without this)."""

    def __init__(self, replica):
        self.batch = None
        self.layers = [m for m in replica.modules()
                       if isinstance(m, (torch.nn.RNNBase, torch.nn.MultiheadAttention)) and not m.batch_first]
        self.handles = []

    def __enter__(self):
        self.handles = [m.register_forward_pre_hook(self._seen) for m in self.layers]
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()

    def _seen(self, module, args):
        x = args[0] if args else None
        if self.batch is None and isinstance(x, torch.Tensor) and x.dim() == 3:
            self.batch = x.shape[1]

    def samples(self, args, n):
        """'N sample(s)' of the batch (``n``: its first input's first dimension)."""
        first = next((t for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor)), None)
        if self.batch is None or first is None or first.dim() < 2 or first.shape[0] == self.batch \
                or first.shape[1] != self.batch:
            return f"{n} sample(s)"
        return f"{self.batch} sample(s) ({first.shape[0]} time steps each, time first)"


def _goal_text(goal: float, floor: tuple) -> str:
    low, what = floor
    if low:
        return (f"goal < {fmt(goal)}: {fmt(low)}, {what}, the least the loss can be, plus "
                f"{OVERFIT_REL:.0%} of the first loss above it or {OVERFIT_ABS:g}")
    return f"goal < {fmt(goal)}: {OVERFIT_REL:.0%} of the first loss or {OVERFIT_ABS:g}"


def _faster(verdict: Check, losses: list, lrs: list, setup: str, floor: tuple) -> Check:
    """The overfit's verdict after the retry at FASTER times the learning rate (``losses``)."""
    nums = verdict.numbers
    first, last, goal = nums["first"], losses[-1], nums["goal"]
    at = ", ".join(f"{lr * FASTER:g}" for lr in lrs)
    nums = dict(nums, faster_lr=lrs[0] * FASTER, faster_last=last, faster_iterations=len(losses))
    if math.isfinite(last) and last <= goal:
        return Check("overfit", "PASS", f"{setup}: loss {fmt(first)} -> {fmt(nums['last'])} after {nums['iterations']} "
                     f"iteration(s); at {FASTER}x the lr ({at}) {fmt(first)} -> {fmt(last)} in {len(losses)}: the "
                     f"model fits one batch, at the script's lr in more iterations ({_goal_text(goal, floor)})", numbers=nums)
    again = f"; at {FASTER}x the lr ({at}) {fmt(first)} -> {fmt(last) if math.isfinite(last) else last} " \
            f"after {len(losses)} iteration(s)"
    low = floor[0]
    quarter = losses[-max(2, len(losses) // 4):]
    if "causes_seen" not in nums and all(math.isfinite(v) for v in losses) and last - low <= 0.5 * (first - low) and \
            quarter[-1] - low <= (1 - STILL_FALLING) * (quarter[0] - low):
        # (most of the way down at the larger lr and still falling fast: a slow optimiser, not a model
        # that cannot fit; makemore's bigram under AdamW: 3.296 -> 2.191 at 0.005 in 300, goal 1.964,
        # reached in 585)
        return Check("overfit", "SKIP", f"{verdict.evidence.split(' -- ')[0]}{again}, still falling "
                     f"({1 - (quarter[-1] - low) / (quarter[0] - low):.0%} in the last {len(quarter)}): more "
                     f"iterations tell (--overfit-iters N)", numbers=nums)
    return Check("overfit", verdict.status, verdict.evidence + again, verdict.cause, nums)


def _repeated_calls(cap: Capture, module) -> str:
    """Why the overfit is skipped for a model called several times before one backward: the
    calls, the loss calls on its outputs in the first step, and the optimizers."""
    name = cap.rec.naming.module_name(module)
    who = f"{name} ({type(module).__name__})" if name else type(module).__name__
    losses = [c.name for c in cap.loss_calls if c.step == 0 and c.model is module]
    said = f"{who} was called {cap.repeated[id(module)]} times with autograd on before one backward"
    if len(losses) > 1:
        said += f", {len(losses)} loss calls on its outputs in the first step ({', '.join(losses)})"
    if len(cap.optimizers) > 1:
        said += f"; {len(cap.optimizers)} optimizers stepped"
    return said + ": the loss backpropagated is made of several forward passes, and nndb overfits one " \
                  "forward's loss, a part of it"


# Dropout is off in the replica, as practitioners turn regularisation off to overfit one batch:
# with it the loss stays noisy and high (mnist_rnn's LSTM, Dropout 0.25 and 0.5, Adadelta lr 0.1:
# 2.351 -> 0.6272 in 300 iterations and FAIL; without, 0.0136 in 156).  A TorchFunctionMode makes
# torch.nn.functional's dropouts the identity (as in eval mode: nn.Dropout's and F.dropout's in a
# forward alike) and an attention's dropout_p 0, without touching BatchNorm's train mode.
_DROPOUTS = {getattr(torch.nn.functional, n) for n in (
    "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")
    if hasattr(torch.nn.functional, n)}


class _NoDropout(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.dropped = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _DROPOUTS:
            p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
            training = kwargs.get("training", args[2] if len(args) > 2 else True)
            if training and p:
                self.dropped = True
                return args[0] if args else kwargs["input"]
        elif func is torch.nn.functional.scaled_dot_product_attention:
            if kwargs.get("dropout_p") or (len(args) > 4 and args[4]):
                self.dropped = True
                kwargs = {**kwargs, "dropout_p": 0.0} if len(args) <= 4 else kwargs
                args = args[:4] + (0.0,) + tuple(args[5:]) if len(args) > 4 else args
        return func(*args, **kwargs)


class _rnn_dropout_off:
    """nn.LSTM/GRU/RNN's dropout between layers (given to the fused kernel, not F.dropout): 0
    on the replica while it trains (a deep copy: the script's model keeps its own)."""

    def __init__(self, replica):
        self.rnns = [m for m in replica.modules() if isinstance(m, torch.nn.RNNBase) and m.dropout and m.training]
        self.saved = [m.dropout for m in self.rnns]

    def __enter__(self):
        for m in self.rnns:
            m.dropout = 0.0
        return self

    def __exit__(self, *exc):
        for m, d in zip(self.rnns, self.saved):
            m.dropout = d
        return False


def _fresh_optimizer(seen_opt, model, replica):
    """The replica's optimizer, and what its lr is where the script's was not it (a warmup by
    hand's: said on the check's line)."""
    pmap = {id(p): q for p, q in zip(model.parameters(), replica.parameters())}
    groups, warmed = [], []
    for gi, (g, hyper) in enumerate(zip(seen_opt.opt.param_groups, seen_opt.hyper)):
        ps = [pmap[id(p)] for p in g["params"] if id(p) in pmap and p.requires_grad]
        if ps:
            h = dict(hyper)
            if "initial_lr" in h:
                h["lr"] = h["initial_lr"]
            if isinstance(h.get("max_lr"), (int, float)):
                # OneCycleLR's: its initial_lr is the warm start, max_lr / 25 by default, where the
                # script spends a few steps (a healthy model's overfit FAILed at 1.117 -> 0.3164)
                h["lr"] = h["max_lr"]
            elif "initial_lr" not in h:
                peak = _hand_warmup_peak(seen_opt, gi)
                if peak is not None:
                    warmed.append(h["lr"])
                    h["lr"] = peak
            groups.append({**h, "params": ps})
    if not groups:
        raise ValueError("it holds none of the model's trainable parameters")
    cls = type(seen_opt.opt)
    try:
        opt = cls(groups, **seen_opt.opt.defaults)
    except TypeError:
        opt = cls(groups)
    note = (", the optimizer's own: the script's warmup by hand set "
            + ", ".join(f"{lr:g}" for lr in dict.fromkeys(warmed)) + " at its first step") if warmed else ""
    return opt, note


def _hand_warmup_peak(seen_opt, group: int):
    """A warmup written by hand (``param_group["lr"] = lr`` each step, rising over the
    captured steps, with no scheduler's ``initial_lr``): its first lr is a warm start (LLMs
    from scratch's appendix D: 1e-05 on the way to 0.001, where AdamW's overfit FAILed 11.04
    -> 10.80 and passes at 0.001).  The lr it rises to is the optimizer's own, its
    constructor's ``defaults["lr"]``, as a scheduler's ``initial_lr`` is (at least the
    highest lr seen); None where the lr did not rise."""
    seen = [step[group] for step in seen_opt.lrs
            if group < len(step) and isinstance(step[group], (int, float))]
    if len(seen) < 2 or max(seen) <= seen[0]:
        return None
    own = seen_opt.opt.defaults.get("lr")
    return max(seen + ([own] if isinstance(own, (int, float)) and not isinstance(own, bool) else []))


class OwnLoss:
    """An OutputLoss as the overfit's LossCall: the loss is the model's output leaf itself."""
    own = True
    view = None
    target = None
    target_pos = None
    probs_like = False

    def __init__(self, out, inner):
        self.model, self.leaf, self.model_args, self.model_keywords = out.model, out.leaf, out.args, out.keywords
        self.probs_like = bool(inner is not None and inner.probs_like)
        self.input_shape = ()
        self.name = "the loss it returns"


class _Chain(torch.nn.Module):
    """The models a loss's input went through, called as the script called them
    (``head(backbone(x))``: backbone, then head on its output), on their own inputs of that
    forward otherwise.  One model alone is called as it is.  Called with a tuple per model: the
    first's inputs, then each later one's (its fed input left in place: replaced)."""

    def __init__(self, modules, chain, keywords: tuple = ()):
        super().__init__()
        self.stages = torch.nn.ModuleList(modules)
        self.feeds = [feed for _, feed in chain]         # (None for the first)
        # each model's inputs of the loss's forward: the first's are the fed one's Feed.args
        self.inputs = [feed.args for _, feed in chain[1:]] + [None]
        # the names of each one's inputs given by keyword (its last ones): the last's, the loss's call's
        self.keywords = [feed.keywords for _, feed in chain[1:]] + [keywords]

    def batch_args(self) -> list:
        """The inputs of the models before the last, as the loss's forward gave them."""
        return list(self.inputs[:-1])

    def forward(self, *per_stage):
        a, kw = split_call(per_stage[0], self.keywords[0])
        out = self.stages[0](*a, **kw)
        for module, feed, args, names in zip(self.stages[1:], self.feeds[1:], per_stage[1:], self.keywords[1:]):
            x, k = pytree.tree_leaves(out)[feed.leaf], 0
            flat, spec = pytree.tree_flatten(args)
            for i, t in enumerate(flat):
                if isinstance(t, torch.Tensor):
                    if k == feed.arg:
                        flat[i] = x
                    k += 1
            a, kw = split_call(pytree.tree_unflatten(flat, spec), names)
            out = module(*a, **kw)
        return out


def _small_batch(call: LossCall, earlier: list):
    """The inputs of each model the loss's input went through (``earlier``: those before the
    model of the loss, then ``call.model_args``), cut to their first OVERFIT_BATCH samples,
    where every input and the target share the batch dimension (dim 0) and none is sparse (a
    graph's adjacency and features: its nodes, not a batch to cut); else the whole captured
    batch.  Returned as one tuple of inputs per model."""
    per_stage = [a if isinstance(a, tuple) else (a,) for a in earlier + [call.model_args]]
    target = call.target
    leaves = [t for t in pytree.tree_leaves(per_stage) if isinstance(t, torch.Tensor)]
    if isinstance(call, OwnLoss):
        # (the loss the model returns: its targets are among its inputs)
        b = leaves[0].shape[0] if leaves and leaves[0].dim() > 0 else None
        ok = b is not None and b > OVERFIT_BATCH
    else:
        b = call.input_shape[0] if call.input_shape else None
        # (a view of the output that mixes its samples, (B, T, V) -> (B*T, V): the whole batch)
        ok = (b is not None and b > OVERFIT_BATCH and target is not None and target.dim() > 0
              and target.shape[0] == b and (call.view is None or _keeps_batch(call.view)))
    ok = ok and all(t.dim() > 0 and t.shape[0] == b and t.layout is torch.strided for t in leaves)
    if not ok:
        if leaves and leaves[0].dim() > 0 and (isinstance(call, OwnLoss) or call.view is not None):
            b = leaves[0].shape[0]          # (the model's samples, not the (B*T, V) view's rows)
        return per_stage, target, b if b is not None else "all"
    cut = pytree.tree_map(lambda t: t[:OVERFIT_BATCH] if isinstance(t, torch.Tensor) else t, per_stage)
    return cut, target[:OVERFIT_BATCH] if target is not None else None, OVERFIT_BATCH


def _keeps_batch(view: tuple) -> bool:
    """Does a view of the output (LossCall.view) keep its samples apart along dim 0, each row of
    the view within one sample's (``out.squeeze(1)``, ``logits.transpose(1, 2)``, ``logits[:, -1]``),
    so that a copy's output on fewer samples has the same view on them?  (Not one indexed by
    tensors: its indices are into the whole batch's.)"""
    if isinstance(view, Indexed):
        return False
    size, stride, rel, shape, strides = view
    if not size or not shape or size[0] != shape[0] or stride[0] != strides[0]:
        return False
    return rel + sum((n - 1) * st for n, st in zip(size[1:], stride[1:])) < max(strides[0], 1)


def _view(out: torch.Tensor, view: tuple) -> torch.Tensor:
    """The view of the copy's output ``out`` that the script took of its model's (LossCall.view)."""
    if isinstance(view, Indexed):
        return view.of(out)
    size, stride, rel, shape, strides = view
    if tuple(out.stride()) == strides and tuple(out.shape) == shape:
        return out.as_strided(size, stride, out.storage_offset() + rel)
    if tuple(out.stride()) == strides and tuple(out.shape[1:]) == shape[1:] and _keeps_batch(view):
        return out.as_strided((out.shape[0],) + size[1:], stride, out.storage_offset() + rel)
    raise ValueError(f"the copy's output is {tuple(out.shape)} with strides {tuple(out.stride())}, not "
                     f"{shape} with {strides} as the script's: nndb cannot take the loss's view of it")


def _loss_fn(call: LossCall, target):
    if isinstance(call, OwnLoss):
        def own_loss(output):
            loss = pytree.tree_leaves(output)[call.leaf]
            return loss.mean() if loss.dim() else loss
        return own_loss
    on = _loss_on(call, target)

    def loss_of(output):
        pred = pytree.tree_leaves(output)[call.leaf]
        if call.view is not None:
            pred = _view(pred, call.view)
        return on(pred)
    return loss_of


def _loss_on(call: LossCall, target):
    """The script's loss function, on a prediction shaped as its input (after any view)."""
    def loss_of(pred):
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
    where a pos_weight moves the minimum off the targets; a cross-entropy's class weight moves it to
    the prediction proportional to weight x target, the loss taken there)."""
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
                if not (t.is_floating_point() or smooth > 0):
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
                weight = kw.get("weight")
                if weight is not None:
                    # (the loss is sum_c w_c p_c (-log q_c) per target: least at q proportional to w * p)
                    shape = [1] * probs.dim()
                    shape[c_dim] = classes
                    probs = probs * weight.detach().double().to(probs.device).reshape(shape)
                    probs = probs / probs.sum(c_dim, keepdim=True)
                ideal = probs.clamp_min(1e-300).log().to(torch.float32 if not t.is_floating_point() else t.dtype)
            else:
                return 0.0, ""
            value = float(_loss_on(call, target)(ideal).detach().double())
    except Exception:
        return 0.0, ""
    if not math.isfinite(value) or value <= 0:
        return 0.0, ""
    return value, "the targets' entropy"


def _sequence_floor(call: LossCall, inputs: list, target, lookback=lambda x: None,
                    inputs_too: bool = False) -> tuple:
    """(the least value a cross-entropy over next tokens can take on this batch, what it is), or
    (0, ""): where an input of the first model is a (B, T) tensor of token ids and the targets
    (``target`` laid out as it, its first B rows where it is a larger batch's; with
    ``inputs_too``, a loss computed inside the model, or else another (B, T) integer input) are
    those tokens shifted by one (``y[:, t] == x[:, t + 1]`` wherever not ignored), the
    targets' entropy given their prefixes x[:, :t+1]: the loss of a model that knows the whole
    batch by heart, at each prefix the targets' mix in the batch (label smoothing mixed in);
    their sum under ``reduction='sum'``.  A Hugging Face causal LM is given its input ids as
    labels and shifts them inside: its loss call's target is the shifted one (a batch of names
    alike in their first tokens FAILed 'cannot fit' at that floor, its input ids no target).
    Where the model's output at a position depends on the last ``lookback(x)`` tokens only (a
    bigram's on one, an n-gram MLP's on n), the entropy given those: all it can know."""
    kw = dict(call.kwargs)
    if kw.get("weight") is not None or not call.input_shape or len(call.input_shape) < 2:
        return 0.0, ""
    ignore = kw.get("ignore_index", -100)
    smooth = float(kw.get("label_smoothing") or 0.0)
    classes = call.input_shape[1]
    tokens = [t for t in inputs if t.dim() == 2 and not t.is_floating_point() and not t.is_complex()
              and t.dtype is not torch.bool and t.shape[1] > 1]
    total = kw.get("reduction") == "sum"
    for x in tokens:
        ys = []
        if target is not None and not target.is_floating_point() and target.numel() % x.shape[1] == 0 \
                and target.numel() >= x.numel():
            ys.append(target.reshape(-1, x.shape[1])[:x.shape[0]])
        if target is None or inputs_too:
            ys += [t for t in tokens if t is not x and t.shape == x.shape]
        for y in ys:
            y = y.to(x.device)
            kept = y[:, :-1] != ignore
            if not bool(kept.any()) or not torch.equal(y[:, :-1][kept], x[:, 1:][kept]):
                continue
            back = lookback(x)
            mean, n = _prefix_entropy(x.tolist(), y.tolist(), ignore, smooth, classes, back)
            if back is not None:
                what = f"the targets' entropy given the last {back} token(s) before each in the batch, as far " \
                       "back as the model's outputs look"
            else:
                what = "the targets' entropy given their prefixes in the batch"
            return (mean * n if total else mean), what
    return 0.0, ""


def _lookback(replica, args, x, start: dict, cut: Optional[list] = None) -> Optional[int]:
    """How many tokens back the copy's outputs at a position depend on, where fewer than the
    sequence's length (a bigram's: 1); None where they depend on all, or it cannot tell.  Told
    by changing the batch's first tokens and seeing which positions of the (B, T, ...) outputs
    change (the parameters nudged by 0.01 noise and put back, dropout off, no gradient, the RNG
    put back; BatchNorm in train mode mixes the batch: all change, None).  A healthy bigram FAILed overfit: its goal was the entropy given
    whole prefixes (0.3081), below what a model of one token can reach (1.892).  ``start``: the
    copy's state_dict as it was (BatchNorm's statistics too), put back after.

    A model made to read the whole context (attention over the T positions, a recurrent layer)
    whose outputs still look back fewer tokens has its context cut short (a mask of the
    diagonal where ``tril`` was meant, a hidden state reset at each token): that is no floor but
    the bug overfitting one batch is there to find (a GPT whose mask hid every earlier token
    PASSed at 'the last 1 token(s)'); None, and what was seen goes into ``cut``."""
    if x.dim() != 2 or x.shape[1] < 2 or bool((x.min() == x.max()).item()):
        return None
    alt = x.clone()
    alt[:, 0] = torch.where(x[:, 0] == x.min(), x.max(), x.min())
    other = pytree.tree_map(lambda t: alt if t is x else t, args)
    params = [p for p in replica.parameters() if p.is_floating_point()]
    devices = sorted({p.device.index or 0 for p in params if p.device.type == "cuda"})
    mixes = _Mixes(x.shape[1])
    with torch.random.fork_rng(devices=devices), torch.no_grad(), _NoDropout():
        try:
            torch.manual_seed(0)
            for p in params:          # (a table that starts at zero, a bigram's, depends on nothing yet)
                p.add_(torch.randn_like(p), alpha=0.01)
            with mixes:
                a = replica(*args)
            b = replica(*other)
        finally:
            replica.load_state_dict(start)
    changed = None
    for u, v in zip(pytree.tree_leaves(a), pytree.tree_leaves(b)):
        if isinstance(u, torch.Tensor) and u.is_floating_point() and u.dim() >= 2 and u.shape[:2] == x.shape:
            d = (u != v).reshape(x.shape[0], x.shape[1], -1).any(dim=2).any(dim=0)
            changed = d if changed is None else changed | d
    if changed is None or not bool(changed[0]):
        return None
    reach = int(torch.nonzero(changed).max()) + 1
    if reach >= x.shape[1]:
        return None
    layer = next((type(m).__name__ for m in replica.modules()
                  if isinstance(m, (torch.nn.RNNBase, torch.nn.MultiheadAttention))), None)
    what = f"an {layer}" if layer and layer[0] in "AEIOU" else f"a {layer}" if layer else mixes.seen
    if what is None:
        return reach
    if cut is not None and not cut:
        cut.append(f"its outputs at a position depend on the last {reach} token(s) only, though it has "
                   f"{what} over the {x.shape[1]} positions: a mask or state that cuts the context short")
    return None


class _Mixes(TorchFunctionMode):
    """Sees whether a forward weighs positions against each other: attention's (..., T, T)
    softmax, ``scaled_dot_product_attention``, ``multi_head_attention_forward``."""

    def __init__(self, positions: int):
        super().__init__()
        self.positions = positions
        self.seen: Optional[str] = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.seen is None:
            name = getattr(func, "__name__", "")
            if name in ("scaled_dot_product_attention", "multi_head_attention_forward"):
                self.seen = f"a {name}"
            elif name == "softmax" and isinstance(out, torch.Tensor) and out.dim() >= 3 and \
                    out.shape[-1] == out.shape[-2] == self.positions:
                self.seen = "an attention (a softmax of position against position)"
        return out


def _prefix_entropy(xs: list, ys: list, ignore: int, smooth: float, classes: int,
                    back: Optional[int] = None) -> tuple:
    """(The targets' entropy given each position's prefix (``back``: its last ``back`` tokens),
    the number of targets)."""
    prefix: dict = {}
    groups: dict = {}
    for xrow, yrow in zip(xs, ys):
        pid = 0
        for t, (tok, nxt) in enumerate(zip(xrow, yrow)):
            pid = prefix.setdefault((pid, tok), len(prefix) + 1) if back is None else \
                prefix.setdefault(tuple(xrow[max(0, t - back + 1):t + 1]), len(prefix) + 1)
            if nxt != ignore:
                counts = groups.setdefault(pid, {})
                counts[nxt] = counts.get(nxt, 0) + 1
    total, n_all = 0.0, 0
    for counts in groups.values():
        n = sum(counts.values())
        ps = [(1 - smooth) * c / n + smooth / classes for c in counts.values()]
        h = -sum(p * math.log(p) for p in ps if p > 0)
        if smooth > 0 and classes > len(ps):
            q = smooth / classes
            h -= (classes - len(ps)) * q * math.log(q)
        total += n * h
        n_all += n
    return (total / n_all if n_all else 0.0), n_all


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
             floor: tuple = (0.0, ""), at_zero: tuple = (), lrs: tuple = (), cut: list = ()) -> Check:
    """``at_zero``: the names of the parameters the replica's optimizer holds at lr 0; ``lrs``: its
    groups' learning rates; ``cut``: what _lookback saw of a context cut short, a cause of its own."""
    first, last = losses[0], losses[-1]
    low, what = floor
    if not math.isfinite(first):
        return Check("overfit", "SKIP", f"{setup}: the first loss is {first} (see finite-loss)")
    if first == 0:
        return Check("overfit", "SKIP", f"{setup}: the loss is 0 before any training, so there is nothing to "
                     "fit (see finite-loss)")
    finite = [v for v in losses if math.isfinite(v)]
    if first < 0 or (getattr(call, "kind", None) == "nll_loss" and min(finite) < 0):
        # (nll_loss on what is not log-probabilities, raw logits: no least value; it 'fit' its batch
        # as the loss went below 0: 0.1022 -> -0.01664 in 3 iterations, a PASS)
        said = (f"the first loss is below 0 ({fmt(first)}): {OVERFIT_REL:.0%} of it is no goal" if first < 0 else
                f"nll_loss went below 0 ({fmt(first)} -> {fmt(min(finite))}): on what is not log-probabilities it "
                "has no least value to come down to")
        return Check("overfit", "SKIP", f"{setup}: {said} (see initial-loss)",
                     numbers={"first": first, "best": min(finite), "iterations": len(losses)})
    # (where the loss cannot go below a floor, the way from the first loss down to it)
    goal = low + max(OVERFIT_REL * (first - low), OVERFIT_ABS)
    nums = {"first": first, "last": last, "best": min(finite), "goal": goal, "iterations": len(losses)}
    goal_text = _goal_text(goal, floor)
    if low:
        nums["floor"] = low
    if math.isfinite(last) and last <= goal:
        return Check("overfit", "PASS", f"{setup}: loss {fmt(first)} -> {fmt(last)} in {len(losses)} "
                     f"iteration(s) ({goal_text})", numbers=nums)
    if not math.isfinite(last):
        return Check("overfit", "FAIL", f"{setup}: loss {fmt(first)} -> {last} at iteration {len(losses)}",
                     "the training diverges even on one batch: the learning rate is too high for this model "
                     "and data (unnormalised inputs make it worse)", nums)
    # Still falling fast where the iterations ran out, most of the way down already: a slow
    # optimiser (plain SGD at a modest learning rate), not a model that cannot fit
    quarter = finite[-max(2, len(finite) // 4):]
    if len(finite) == len(losses) and last - low <= SLOW_SHARE * (first - low) and \
            quarter[-1] - low <= (1 - STILL_FALLING) * (quarter[0] - low):
        return Check("overfit", "SKIP", f"{setup}: loss {fmt(first)} -> {fmt(last)} after {len(losses)} iteration(s), "
                     f"still falling ({1 - (quarter[-1] - low) / (quarter[0] - low):.0%} in the last {len(quarter)}), not yet at the "
                     f"goal ({goal_text}): more iterations tell (--overfit-iters N)", numbers=nums)
    hints = list(cut)
    # (the replica's: a warmup from 0, diffusers' cosine schedule's, is overfit at its base lr, and
    # the script's first step at lr 0 is no cause of it: it was named as one)
    if lrs and all(lr == 0 for lr in lrs):
        hints.append("the learning rate is 0")
    elif at_zero:
        hints.append(f"parameters in a param group at lr 0 stay as they are: {', '.join(at_zero)} (see updates)")
    if call.probs_like:
        hints.append("a sigmoid before binary_cross_entropy_with_logits keeps the loss from going low"
                     if getattr(call, "kind", None) == "binary_cross_entropy_with_logits"
                     else "a softmax before cross_entropy keeps the loss from going low")
    inputs = [t for t in pytree.tree_leaves(model.inputs[0] if len(model.inputs) > 1 else call.model_args)
              if isinstance(t, torch.Tensor)]
    if any(d[1] for d in describe_inputs(inputs)):       # (as the data check)
        hints.append("unnormalised inputs (see data)")
    model_params = [p for p in model.parameters() if p.requires_grad]
    orphans = {id(p) for p in cap.unheld_with_grad()}
    if any(id(p) in orphans for p in model_params):
        hints.append(f"parameters no optimizer holds stay as they are: "
                     f"{', '.join(cap.param_name(p) for p in model_params if id(p) in orphans)} (see updates)")
    if any(id(p) in cap.reached and id(p) not in cap.nonzero for p in model_params):
        hints.append("the gradients are cleared between backward() and optimizer.step() (see gradients)")
    elif any(id(p) in cap.got_grad and id(p) not in cap.nonzero | cap.nonfinite for p in model_params):
        hints.append("dead units: some parameters get all-zero gradients (see gradients)")
    generic = ("a bug in the model (a detached or dead path), too little capacity, a learning rate far too "
               "small or too large, or inputs that do not match their labels")
    if hints:
        nums["causes_seen"] = len(hints)          # (what the capture saw: _faster does not overrule it)
    hints.append(("otherwise " if hints else "") + generic)
    return Check("overfit", "FAIL", f"{setup}: loss {fmt(first)} -> {fmt(last)} after {len(losses)} iteration(s), "
                 f"best {fmt(min(finite))} ({goal_text})",
                 "the model cannot fit one small batch: " + "; ".join(hints), nums)
