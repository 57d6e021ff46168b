"""The checks of ``nndb check``, each a function of the Capture: PASS, FAIL
with the likely cause, or SKIP with the reason it could not be decided.
The thresholds are the constants below (nndb/check/__init__.py lists them).

Why this size: the checklist read in its order (data, shapes, initial loss,
finite loss, gradients, zero-grad, updates), each check a function of a
screen or two with the helpers only it uses beside it; the overfit, which
trains a copy, is in nndb.check.overfit."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch
from torch.utils import _pytree as pytree

from ..text import fmt
from .capture import BINARY_LOSSES, CLASS_LOSSES, SYMMETRIC_LOSSES, Capture, LossCall

RAW_PIXELS_MIN_MAX = 20.0       # a float input in [0, 255] reaching this, whole numbers: raw pixels
WHOLE_FRACTION = 0.99           # ... "whole numbers": this fraction of the values
INPUT_ABS_MAX = 100.0           # a float input beyond +-this is not normalised
CONSTANT_LABELS_MIN = 16        # one label for all of at least this many targets: FAIL
INIT_LOSS_FACTOR = 2.0          # initial loss above max(FACTOR x uniform, uniform + MARGIN): FAIL
INIT_LOSS_MARGIN = 1.0
# A regression loss at the first step above this x the loss of predicting 0 (for MSE: the targets'
# mean square; a fresh model's outputs, uncorrelated with the targets, add their own mean square):
# FAIL (L1: its square root, 3.16x).  10x is outputs of ~3x the targets' RMS; default inits give
# well under 1x (a DDPM's UNet on unit noise: 1.088 against 1.003)
INIT_REGRESSION_FACTOR = 10.0
OVERFIT_BATCH = 32              # samples of the captured batch the replica trains on
OVERFIT_ITERS = 300             # iterations at most
OVERFIT_REL = 0.05              # "close to zero": below 5% of the first loss...
OVERFIT_ABS = 1e-3              # ... or below this
NAMES_SHOWN = 4


@dataclass
class Check:
    name: str
    status: str                 # PASS | FAIL | SKIP
    evidence: str               # the numbers (for SKIP: why it could not be decided)
    cause: str = ""             # FAIL: the likely cause and what to do
    numbers: dict = field(default_factory=dict)


@dataclass
class CheckReport:
    target: str
    steps: int                  # steps of the script that ran
    context: dict               # model, optimizers, loss as found
    checks: list

    @property
    def exit_code(self) -> int:
        """0: every check passed or was skipped; 1: at least one failed."""
        return 1 if any(c.status == "FAIL" for c in self.checks) else 0

    def to_dict(self) -> dict:
        """Plain JSON data (NaN and infinities as the strings "nan", "inf", "-inf")."""
        return _plain({"target": self.target, "steps": self.steps, "context": self.context,
                       "exit_code": self.exit_code, "checks": [asdict(c) for c in self.checks]})


def _plain(x):
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


@dataclass
class Outcome:
    status: str = "finished"    # finished (or stopped after the steps) | raised | exited
    error: str = ""


def _skip(name: str, why: str, outcome: Outcome) -> Check:
    if outcome.status != "finished":
        why += " (the script stopped early)"
    return Check(name, "SKIP", why)


def _no_optimizer(name: str, cap: Capture, outcome: Outcome) -> Check:
    if cap.optimizers:
        return Check(name, "SKIP", "the optimizers hold no parameter that requires grad")
    skips = getattr(getattr(cap.rec, "tracer", None), "scaler_skips", 0)
    if skips:
        what = f"the GradScaler skipped every optimizer step ({skips} of them)"
        if name != "gradients":
            return Check(name, "SKIP", what + " (see gradients)")
        return Check(name, "FAIL", what + ": the gradients held NaN or Inf at every loss scale",
                     "NaN/Inf gradients from a finite loss that no loss scale mends: a sqrt/log/division at zero "
                     "in the backward pass, or gradients that overflow float16 by themselves",
                     {"scaler_skips": skips})
    if outcome.status != "finished":
        return Check(name, "SKIP", "the script stopped before any optimizer step")
    return Check(name, "SKIP", "no torch.optim optimizer stepped (hand-written updates?): "
                 "which parameters should learn is unknown")


def _shape(s) -> str:
    s = tuple(s)
    return "(" + ", ".join(map(str, s)) + ("," if len(s) == 1 else "") + ")"


def _names(cap: Capture, params) -> str:
    names = [cap.param_name(p) for p in params]
    more = len(names) - NAMES_SHOWN
    return ", ".join(names[:NAMES_SHOWN]) + (f" and {more} more" if more > 0 else "")


def _classes(call: LossCall) -> Optional[int]:
    s = call.input_shape
    c = s[1] if len(s) >= 2 else (s[0] if s else None)
    return c if c and c >= 2 else None


SINGLE_CLASS_CAUSE = ("cross-entropy over a single class: the log-softmax of one logit is 0, so the loss and every "
                      "gradient are 0 and nothing learns; give the model one output per class, or for one output "
                      "use binary_cross_entropy_with_logits (or mse_loss for a regression)")


def _single_class(call: Optional[LossCall]) -> bool:
    """A classification loss whose prediction has a class dimension of size 1."""
    if call is None or call.kind not in CLASS_LOSSES:
        return False
    s = call.input_shape
    return (s[1] if len(s) >= 2 else (s[0] if s else None)) == 1


def _all_zero(cap: Capture) -> bool:
    """Was every loss seen exactly 0?"""
    values = [v for _, v in cap.backward_losses if v is not None] or [c.value for c in cap.loss_calls]
    return bool(values) and all(v == 0 for v in values)


def _is_index(t) -> bool:
    return isinstance(t, torch.Tensor) and not t.is_floating_point() and not t.is_complex()


# -- 1. data ----------------------------------------------------------------------------------
def data_check(cap: Capture, outcome: Outcome) -> Check:
    seen, call = cap.model(), cap.primary_loss()
    if seen is None:
        return _skip("data", "no module with parameters was called", outcome)
    chain = cap.chain(call) if call is not None else None
    if chain is not None and len(chain) > 1:
        args = chain[1][1].args            # (the data the first model got, in the loss's forward)
    else:
        args = call.model_args if call is not None and call.model is seen.module else \
            seen.grad_args if seen.grad_args is not None else seen.first_args
    tensors = [t for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor)]
    if not tensors:
        return _skip("data", f"{type(seen.module).__name__}'s inputs hold no tensor", outcome)
    parts, fails, causes, numbers = [], [], [], {"inputs": []}
    for i, (desc, fail, cause, nums) in enumerate(describe_inputs(tensors)):
        label = "inputs" if len(tensors) == 1 else f"inputs[{i}]"
        parts.append(f"{label} {desc}")
        numbers["inputs"].append(nums)
        if fail:
            fails.append(f"{label} {fail}")
            causes.append(cause)
    if call is not None and call.target is not None:
        desc, fail, cause = _describe_target(call)
        if desc:
            parts.append(desc)
        if fail:
            fails.append(fail)
            causes.append(cause)
    if fails:
        return Check("data", "FAIL", "; ".join(fails) + " [" + "; ".join(parts) + "]",
                     "; ".join(dict.fromkeys(causes)), numbers)
    return Check("data", "PASS", "; ".join(parts), numbers=numbers)


# A sparse input (a graph's features, adjacency) is described as the dense tensor it stands
# for, up to this many elements.
_DENSE_MAX = 1 << 24


def describe_inputs(tensors: list) -> list:
    """``_describe_input`` of each of a model's input tensors, in order: those after the first
    may be a mask, or one number a sample of the first's batch."""
    batch = tensors[0].shape[0] if tensors and tensors[0].dim() else None
    return [_describe_input(t, mask_ok=i > 0, per_sample=i > 0 and t.dim() == 1 and t.shape[0] == batch)
            for i, t in enumerate(tensors)]


def _describe_input(t: torch.Tensor, mask_ok: bool = False, per_sample: bool = False):
    """An input's description, and its FAIL and cause ("" if none).  With ``mask_ok`` (an input
    after the first: the data comes first, a mask after it) a float tensor whose only non-finite
    values are -inf and whose finite values are all equal is an additive attention mask
    (nn.Transformer.generate_square_subsequent_mask, a float key-padding mask): not judged.
    With ``per_sample`` (an input after the first holding one number a sample of the first's
    batch: a diffusion model's timesteps, SD3's floats in [0, 1000), a noise level) its range
    is not judged: what it conditions on is scaled by the model (a sinusoidal embedding)."""
    desc = f"{_shape(t.shape)} {str(t.dtype).replace('torch.', '')}"
    nums = {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}
    if t.layout is not torch.strided:
        desc += f" ({str(t.layout).replace('torch.', '')})"
        nums["layout"] = str(t.layout).replace("torch.", "")
        if t.numel() > _DENSE_MAX:
            return desc, "", "", nums
        t = t.to_dense()
    if t.numel() == 0 or t.is_complex():
        return desc, "", "", nums
    if t.dim() == 0:
        # (one number, no batch: a setting given with the data, not data to scale; the Hugging
        # Face Trainer's num_items_in_batch, the batch's token count, 128.0 for 8 x 16 tokens)
        nums.update(scalar=True)
        return desc + f" {fmt(t.item())}, one number: not judged", "", "", nums
    x = t.detach().double()
    if not t.is_floating_point():
        lo, hi = int(x.min()), int(x.max())
        nums.update(min=lo, max=hi)
        return desc + f" values {lo}..{hi}", "", "", nums
    finite = torch.isfinite(x)
    counts = {"NaN": int(torch.isnan(x).sum()), "inf": int(torch.isposinf(x).sum()),
              "-inf": int(torch.isneginf(x).sum())}
    bad = sum(counts.values())
    kinds = ", ".join(f"{n} {k}" for k, n in counts.items() if n)      # e.g. "15 -inf"
    x = x[finite]
    nums.update(nonfinite=bad, nan=counts["NaN"], pos_inf=counts["inf"], neg_inf=counts["-inf"])
    if x.numel() == 0:
        return desc + f" all NaN/Inf ({kinds})", "are all NaN/Inf", "the data pipeline produces NaN/Inf", nums
    lo, hi, mean, std = float(x.min()), float(x.max()), float(x.mean()), float(x.std()) if x.numel() > 1 else 0.0
    if mask_ok and bad and bad == counts["-inf"] and lo == hi:
        nums.update(min=lo, max=hi, additive_mask=True)
        return desc + f" is an additive attention mask ({x.numel()} x {fmt(lo)}, {bad} x -inf): not judged", "", "", nums
    whole = float((x == x.round()).double().mean())
    nums.update(min=lo, max=hi, mean=mean, std=std, whole_fraction=whole)
    if bad:
        desc += f" {kinds} and {x.numel()} finite"
    desc += f" in [{fmt(lo)}, {fmt(hi)}], mean {fmt(mean)}, std {fmt(std)}"
    if bad:
        return desc, f"hold {bad} NaN/Inf value(s) ({kinds})", \
            "the data pipeline produces NaN/Inf: check loading and preprocessing", nums
    if per_sample:
        nums.update(per_sample=True)
        return desc + ", one number a sample (a timestep, a noise level): its range not judged", "", "", nums
    if lo >= 0 and RAW_PIXELS_MIN_MAX <= hi <= 255 and whole >= WHOLE_FRACTION:
        return desc, f"look like raw 0-255 pixels (whole numbers up to {fmt(hi)})", \
            "inputs look like raw 0-255 pixels: normalise them (x / 255, then subtract the mean and divide by the std)", nums
    if max(abs(lo), abs(hi)) > INPUT_ABS_MAX:
        return desc, f"reach {fmt(max(abs(lo), abs(hi)))} (beyond +-{INPUT_ABS_MAX:g})", \
            "inputs are not normalised: standardise each feature (subtract the mean, divide by the std)", nums
    return desc, "", "", nums


def _describe_target(call: LossCall):
    t = call.target
    if t.numel() == 0:
        return "", "", ""
    if call.kind in CLASS_LOSSES and _is_index(t):
        ignore = call.kwargs.get("ignore_index", -100)
        v = t[t != ignore]
        if v.numel() == 0:
            return f"targets all ignore_index {ignore}", "", ""
        lo, hi, n = int(v.min()), int(v.max()), int(v.numel())
        distinct = int(v.unique().numel())
        desc = f"labels {lo}..{hi} ({distinct} distinct of {n})"
        c = _classes(call)
        if c is not None and (lo < 0 or hi >= c):
            return desc, f"labels {lo}..{hi} outside [0, {c})", \
                f"the model has {c} outputs but the labels reach {hi if hi >= c else lo}: " \
                "the output layer's size or the label encoding is wrong"
        if distinct == 1 and call.target_made:
            # (no label pipeline: a contrastive loss's positive, each row's logit 0, MoCo's and SimCLR's)
            return desc + f", {call.target_made}: not data, not judged", "", ""
        if distinct == 1 and n >= CONSTANT_LABELS_MIN:
            return desc, f"all {n} targets are label {lo}", \
                "every target has the same label: check the label pipeline (column, shuffling, sampling)"
        return desc, "", ""
    if call.kind in BINARY_LOSSES and t.is_floating_point():
        lo, hi = float(t.min()), float(t.max())
        desc = f"targets in [{fmt(lo)}, {fmt(hi)}]"
        if lo < 0 or hi > 1:
            return desc, f"binary targets outside [0, 1] ([{fmt(lo)}, {fmt(hi)}])", \
                "binary cross-entropy needs targets in [0, 1]: map the labels to 0/1"
        return desc, "", ""
    return "", "", ""


# -- 2. shapes ------------------------------------------------------------------------------
NO_LOSS = "no loss nndb recomputes was called (a hand-written loss, or one such as ctc_loss: docs/check.md)"


def shapes_check(cap: Capture, outcome: Outcome) -> Check:
    call = cap.primary_loss()
    if cap.broadcasts:
        at, op, a, b, out, made = cap.broadcasts[0]
        return Check("shapes", "FAIL", f"`{op}` at {at}: {_shape(a)} {op} {_shape(b)}, one of them the model's output"
                     f"{' or a per-sample result of it' if made else ''}, "
                     f"broadcast to {_shape(out)}, a new dimension out of the batch",
                     f"silent broadcasting in a hand-written loss: every prediction meets every target over "
                     f"{_shape(out)}; make the shapes equal (reshape one of them)",
                     {"op": op, "shapes": [list(a), list(b)], "broadcast": list(out), "where": at})
    if call is None:
        return _skip("shapes", NO_LOSS + ": prediction and target shapes unknown", outcome)
    if call.target is None:
        return _skip("shapes", f"{call.name} had no target tensor", outcome)
    pred, tgt = tuple(call.input_shape), tuple(call.target.shape)
    nums = {"prediction": list(pred), "target": list(tgt), "loss": call.name}
    ev = f"{call.name}: prediction {_shape(pred)} vs target {_shape(tgt)}"
    if call.kind in CLASS_LOSSES:
        if _is_index(call.target):
            want = pred[:1] + pred[2:] if len(pred) >= 2 else ()
            if tgt == want:
                return Check("shapes", "PASS", ev + f" (class indices, {_classes(call)} classes)", numbers=nums)
            return Check("shapes", "FAIL", ev, f"class-index targets must have shape {_shape(want)}: "
                         "check the target's layout (one-hot? an extra dimension?)", nums)
        if tgt == pred:
            return Check("shapes", "PASS", ev + " (class probabilities)", numbers=nums)
        return Check("shapes", "FAIL", ev, "probability targets must have the prediction's shape", nums)
    if pred == tgt:
        return Check("shapes", "PASS", ev, numbers=nums)
    try:
        both = tuple(torch.broadcast_shapes(pred, tgt))
    except RuntimeError:
        return Check("shapes", "FAIL", ev + " (they do not broadcast)", "make the prediction and target shapes equal", nums)
    nums["broadcast"] = list(both)
    if math.prod(both) == math.prod(pred) == math.prod(tgt):
        # only dimensions of size 1 added ((64,) vs (1, 64)): nothing is repeated, element i meets
        # element i, and the loss is the one of equal shapes
        return Check("shapes", "PASS", ev + f": broadcast to {_shape(both)}, which repeats no element (the shapes "
                     "differ only by dimensions of size 1): each prediction meets its own target", numbers=nums)
    return Check("shapes", "FAIL", ev + f": broadcast to {_shape(both)}",
                 f"silent broadcasting: the loss compares predictions and targets pairwise over {_shape(both)}; "
                 f"make the shapes equal (e.g. target.view{_shape(pred)} or the prediction squeezed)", nums)


# -- 3. initial loss ----------------------------------------------------------------------------
def _summed_elements(call: LossCall) -> int:
    """How many loss elements a reduction='sum' call added: the targets, but for a classification
    loss the class-index targets other than ignore_index (a causal LM's padded last position,
    -100: the Hugging Face loss sums 60 of 64 and 3.9 was said where each is 4.16 = ln(64)), and
    one per row of class probabilities (not one per class)."""
    t = call.target
    if t is None or not t.numel():
        return 0
    if call.kind in CLASS_LOSSES:
        if _is_index(t):
            return int((t != call.kwargs.get("ignore_index", -100)).sum())
        c = _classes(call)
        return t.numel() // c if c else t.numel()
    return t.numel()


# nll_loss's input rows are log-probabilities where exp of a row sums to 1 within this (bf16's
# log_softmax: within 1%)
LOG_PROBS_TOL = 0.05


def initial_loss_check(cap: Capture, outcome: Outcome) -> Check:
    call = cap.primary_loss()
    if call is None:
        return _skip("initial-loss", NO_LOSS + ": no reference value", outcome)
    v = call.value
    first = f"the first loss was {fmt(v)}"          # (as the script sees it)
    backward = next((b for _, b in cap.backward_losses if b is not None), None)
    if backward is not None and backward != v:
        # (a loss made of several calls: style transfer's content loss is 0 at the first step,
        # the step's loss 2.8e-06; 'the first loss was 0' read as the step's)
        first = f"its first value was {fmt(v)}; the first backward() loss {fmt(backward)}"
    n = _summed_elements(call) if call.kwargs.get("reduction") == "sum" else 0
    if n:
        v /= n
        first += f", {fmt(v)} a target element (reduction='sum' over {n})"
    if call.kind in CLASS_LOSSES:
        c = _classes(call)
        if c is None and _single_class(call):
            return Check("initial-loss", "FAIL", f"{call.name} on {_shape(call.input_shape)}: one class, so the "
                         f"loss is 0 whatever the model outputs ({first})",
                         SINGLE_CLASS_CAUSE, {"loss": v, "classes": 1})
        if c is None:
            return _skip("initial-loss", f"{call.name} on {_shape(call.input_shape)}: the number of classes "
                         "is unknown", outcome)
        expected, ref = math.log(c), f"ln({c}) = {fmt(math.log(c))}"
    elif call.kind in BINARY_LOSSES:
        expected, ref = math.log(2), f"ln(2) = {fmt(math.log(2))}"
    elif call.kind in SYMMETRIC_LOSSES and (backward is None or backward == call.value):
        # (the step's loss is this call's: of several calls, style transfer's content loss, 0 at the
        # start, plus its style loss, one call's reference says nothing of the sum)
        return _regression_initial_loss(call, v, first, n)
    elif call.kind in SYMMETRIC_LOSSES:
        # (it read 'not a classification loss', where this loss alone is judged against predicting 0)
        return Check("initial-loss", "SKIP", f"{call.name}'s reference, the loss of predicting 0 on its targets, "
                     f"is one call's, and the loss backward() was given is not that call's alone ({first}): "
                     "no reference value")
    else:
        return Check("initial-loss", "SKIP", f"{call.name} is not a classification loss: no reference value "
                     f"({first})")
    nums = {"loss": v, "expected": expected}
    ev = f"{fmt(v)} vs {ref} (a uniform prediction)" + (f" ({first})" if v != call.value else "")
    if not math.isfinite(v):
        return Check("initial-loss", "SKIP", f"the first loss is {v} (see finite-loss)", numbers=nums)
    if call.probs_like and call.kind == "binary_cross_entropy_with_logits":
        return Check("initial-loss", "FAIL", ev + "; but its input is a sigmoid's output, probabilities "
                     "rather than logits",
                     "a sigmoid before binary_cross_entropy_with_logits (BCEWithLogitsLoss), which applies it "
                     "itself: return the logits (drop the sigmoid)", nums)
    if call.probs_like:
        return Check("initial-loss", "FAIL", ev + "; but its input rows are probabilities (in [0, 1], summing to 1)",
                     "a softmax before cross_entropy, which applies log_softmax itself: "
                     "return the logits (drop the softmax)", nums)
    if call.kind == "nll_loss" and v < 0:
        return Check("initial-loss", "FAIL", ev, "nll_loss takes log-probabilities: apply log_softmax to the "
                     "model's output (or use cross_entropy on the logits)", nums)
    if call.kind == "nll_loss" and call.exp_sum is not None and abs(call.exp_sum - 1) > LOG_PROBS_TOL:
        # (raw logits near 0 give a loss near 0, above 0 as often as below: 0.1022 against ln(5)
        # PASSed as 'a pretrained model?', and its overfit PASSed as the loss went negative)
        nums["exp_sum"] = call.exp_sum
        return Check("initial-loss", "FAIL", ev + f"; but its input is not log-probabilities: exp of a row sums "
                     f"to {fmt(call.exp_sum)} (median over rows), not 1",
                     "nll_loss takes log-probabilities: apply log_softmax to the model's output (or use "
                     "cross_entropy on the logits)", nums)
    limit = max(INIT_LOSS_FACTOR * expected, expected + INIT_LOSS_MARGIN)
    nums["limit"] = limit
    if v > limit:
        return Check("initial-loss", "FAIL", ev + f" ({v / expected:.1f}x; limit {fmt(limit)})",
                     "the initial logits are far too large: check the output layer's init or a missing "
                     "input normalisation", nums)
    low = " (lower: a pretrained model?)" if v < 0.5 * expected else ""
    return Check("initial-loss", "PASS", ev + low, numbers=nums)


def _regression_initial_loss(call: LossCall, v: float, first: str, n: int) -> Check:
    """An element-wise regression loss (MSE, L1, smooth L1, Huber) against its value for a
    prediction of 0 on the same targets: a fresh model's outputs, uncorrelated with the targets,
    add to it (their mean square, for MSE); far above it, they are far larger than the targets.
    (It was SKIP, 'no reference value': a DDPM's MSE on unit noise starts at ~1.)"""
    t = call.target
    if t is None or not t.is_floating_point() or tuple(t.shape) != tuple(call.input_shape):
        return Check("initial-loss", "SKIP", f"{call.name}: the targets do not have the prediction's shape: "
                     f"no reference value ({first})")
    try:
        with torch.no_grad():
            ref = call.func(torch.zeros_like(t), t, *[a for a in call.args[2:]], **call.kwargs)
        ref = float(ref.double().mean()) / (n or 1)
    except Exception as e:
        return Check("initial-loss", "SKIP", f"{call.name} of a zero prediction could not be computed "
                     f"({type(e).__name__}: {e}; {first})")
    ev = f"{fmt(v)} vs {fmt(ref)}, the loss of predicting 0 on these targets" + (
        f" ({first})" if v != call.value else "")
    nums = {"loss": v, "expected": ref}
    if not math.isfinite(v) or not math.isfinite(ref) or ref <= 0:
        return Check("initial-loss", "SKIP", ev + (": the targets are all 0" if ref == 0 else ""), numbers=nums)
    # (L1 grows as the outputs' scale, not as its square: the same outputs, 3x the targets)
    limit = (math.sqrt(INIT_REGRESSION_FACTOR) if call.kind == "l1_loss" else INIT_REGRESSION_FACTOR) * ref
    nums["limit"] = limit
    if v > limit:
        return Check("initial-loss", "FAIL", ev + f" ({v / ref:.1f}x; limit {fmt(limit)})",
                     "the initial predictions are far larger than the targets: check the output layer's init "
                     "(a scale or an activation too many?), or the targets' scale", nums)
    return Check("initial-loss", "PASS", ev, numbers=nums)


# -- 4. the loss is finite ------------------------------------------------------------------------
def finite_check(cap: Capture, outcome: Outcome) -> Check:
    values = [(s, v) for s, v in cap.backward_losses if v is not None]
    what = "backward() loss"
    if not values:
        values, what = [(c.step, c.value) for c in cap.loss_calls], "loss-function call"
    if not values:
        return _skip("finite-loss", "no backward() and no loss function call was seen", outcome)
    nums = {"values": [v for _, v in values]}
    bad = next(((s, v) for s, v in values if not math.isfinite(v)), None)
    if bad is not None:
        s, v = bad
        if s == 0:
            cause = ("non-finite at the first step: NaN/Inf in the inputs, a log/sqrt/division of zero or a "
                     "negative number in the loss, or an overflow in the forward pass")
        else:
            lrs = sorted({lr for o in cap.optimizers for lr in (o.lrs[0] if o.lrs else []) if lr is not None})
            cause = (f"the loss was finite at step 0 and diverged by step {s}: the learning rate"
                     + (f" ({', '.join(f'{lr:g}' for lr in lrs)})" if lrs else "") + " is likely too high")
        return Check("finite-loss", "FAIL", f"the loss is {v} at step {s} ({len(values)} {what} value(s))", cause, nums)
    if all(v == 0 for _, v in values):
        cause = SINGLE_CLASS_CAUSE if _single_class(cap.primary_loss()) else (
            "a loss identically 0 gives every parameter a zero gradient and nothing learns: check what the loss "
            "is computed on (a mask or weight of zeros, a target made from the prediction itself)")
        return Check("finite-loss", "FAIL", f"the loss is exactly 0 at every step ({len(values)} {what} "
                     f"value(s) in {cap.steps_done or 1} step(s))", cause, nums)
    return Check("finite-loss", "PASS", f"{len(values)} {what} value(s) in {cap.steps_done or 1} step(s), all "
                 f"finite (first {fmt(values[0][1])}, last {fmt(values[-1][1])})", numbers=nums)


# -- 5. gradients, 6. updates ------------------------------------------------------------------------
def _optimized(cap: Capture) -> list:
    out, seen = [], set()
    for o in cap.optimizers:
        for p in o.params:
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def gradients_check(cap: Capture, outcome: Outcome) -> Check:
    params = _optimized(cap)
    if not params:
        return _no_optimizer("gradients", cap, outcome)
    none = [p for p in params if id(p) not in cap.got_grad]
    zero = [p for p in params if id(p) in cap.got_grad and id(p) not in cap.nonzero and id(p) not in cap.nonfinite]
    unused_bias = _biases_the_loss_ignores(cap, params, zero)
    zero = [p for p in zero if p not in unused_bias]
    behind = _behind_zero_factors(cap, params, zero)
    zero = [p for p in zero if id(p) not in behind]
    nonfinite = [p for p in params if id(p) in cap.nonfinite]
    good = sum(id(p) in cap.nonzero for p in params)
    nums = {"params": len(params), "no_grad": [cap.param_name(p) for p in none],
            "zero_grad": [cap.param_name(p) for p in zero], "nonfinite_grad": [cap.param_name(p) for p in nonfinite],
            "zero_grad_bias_unused": [cap.param_name(p) for p in unused_bias]}
    ev = f"{good}/{len(params)} parameter tensor(s) the optimizer holds got a non-zero, finite gradient"
    # what the optimizers hold frozen (requires_grad=False: a fine-tune's backbone, or a layer frozen by
    # mistake) is not judged, and said so: the count above is of the trainable ones only
    held = {id(p) for p in params}
    frozen = list({id(p): p for o in cap.optimizers for g in o.opt.param_groups for p in g["params"]
                   if id(p) not in held and not p.requires_grad}.values())
    if frozen:
        nums["frozen"] = [cap.param_name(p) for p in frozen]
        ev += f"; {len(frozen)} more it holds frozen (requires_grad=False), not judged: {_names(cap, frozen)}"
    if behind:
        nums["zero_grad_behind_zero_factor"] = [cap.param_name(p) for p in behind.values()]
        mods = {cap.param_name(p).rpartition(".")[0] for p in behind.values()}
        factors = [q for q in _zero_factors(cap, params) if cap.param_name(q).rpartition(".")[0] in mods]
        ev += (f"; all-zero gradient behind a factor that starts at zero, not judged in one step: "
               f"{_names(cap, list(behind.values()))} ({_names(cap, factors)} start all zeros, as LoRA's B "
               "does: no gradient reaches the other factor until they move; from the second step on it does: "
               "--steps 2 checks it)")
    if unused_bias:
        ev += (f"; all-zero gradient, as the loss does not depend on it: {_names(cap, unused_bias)} (its "
               "layer's weight got one: the layer's output gradients sum to 0 over the batch, as in a loss "
               "of differences such as a WGAN critic's D(fake).mean() - D(real).mean())")
    # backward() did give them a gradient, gone by optimizer.step(): zero_grad() between the two
    # (it read 'detached or unused in the forward pass')
    cleared = [p for p in none + zero if id(p) in cap.reached and id(p) not in cap.nonzero]
    gone = {id(p) for p in cleared}
    none = [p for p in none if id(p) not in gone]
    zero = [p for p in zero if id(p) not in gone]
    if cleared and good:
        # some, while the others kept theirs: the script drops those on purpose (p.grad = None after
        # backward(): a layer frozen for a while, DINO's last layer in its first epoch); it FAILed
        # as 'a zero_grad() between loss.backward() and optimizer.step()'
        nums["dropped_grad"] = [cap.param_name(p) for p in cleared]
        ev += (f"; {len(cleared)} more got a gradient from backward() that the script dropped before "
               f"optimizer.step() while the others kept theirs (frozen for now), not judged: {_names(cap, cleared)}")
        cleared = []
    if not (none or zero or nonfinite or cleared):
        return Check("gradients", "PASS", ev, numbers=nums)
    problems, causes = [], []
    if cleared:
        nums["cleared_grad"] = [cap.param_name(p) for p in cleared]
        problems.append(f"a gradient from backward() but none left at optimizer.step(): {_names(cap, cleared)}")
        causes.append(f"{_names(cap, cleared)} got a gradient in backward() that was gone (None or zeroed) when "
                      "optimizer.step() ran: a zero_grad() between loss.backward() and optimizer.step(); reset "
                      "the gradients before backward()")
    # (the script's own hook on the parameter's gradient made it None or zeros: the causes below
    # read 'detached or unused in the forward pass', 'dead ReLUs upstream' of a first layer)
    hooked = [p for p in none + zero if _script_grad_hook(p)]
    if none:
        problems.append(f"no gradient: {_names(cap, none)}")
    if zero:
        problems.append(f"all-zero gradient: {_names(cap, zero)}")
    if hooked:
        causes.append(f"{_names(cap, hooked)}: the script's own hook on its gradient (register_hook, "
                      "register_post_accumulate_grad_hook) left it None or zeros: check what the hook returns or sets")
        none = [p for p in none if not any(p is h for h in hooked)]
        zero = [p for p in zero if not any(p is h for h in hooked)]
    # (a model whose every call ran without autograd: a reentrant checkpoint given inputs that need
    # no gradient never runs its recomputation; it read 'detached ... or unused in the forward pass')
    unrun = [p for p in none if _ran_without_autograd(cap, p)]
    if unrun:
        causes.append(f"{_names(cap, unrun)} got no gradient: the model holding them ran only without autograd "
                      "(torch.no_grad(), torch.inference_mode(), or torch.utils.checkpoint(use_reentrant=True) "
                      "given inputs none of which requires grad: use_reentrant=False, or an input that does)")
        none = [p for p in none if not any(p is q for q in unrun)]
    if none:
        causes.append(f"{_names(cap, none)} got no gradient: detached (.detach(), .data, no_grad, a numpy "
                      "round trip) or unused in the forward pass")
    if zero:
        if _all_zero(cap):
            why = "the loss is exactly 0 at every step (see finite-loss)"
        elif _has_relu(cap):
            why = "dead ReLUs or a saturated activation upstream (check the init and biases)"
        else:
            why = "a saturated activation or a factor of zero upstream (check the init and biases)"
        causes.append(f"{_names(cap, zero)} got all-zero gradients: {why}")
    if nonfinite:
        problems.append(f"NaN/Inf gradient (in some step): {_names(cap, nonfinite)}")
        causes.append("NaN/Inf gradients: a non-finite loss, or a sqrt/log/division at zero in the forward pass")
    return Check("gradients", "FAIL", ev + "; " + "; ".join(problems), "; ".join(causes), nums)


def _zero_factors(cap: Capture, params: list) -> list:
    """The trainable parameters that were all zeros at their model's first forward (its copy
    then: nndb.check.capture.ModelSeen.replica) and got a non-zero gradient: a factor that
    starts at zero (LoRA's B, ReZero's alpha)."""
    start = {}
    for seen in cap.models.values():
        if seen.replica is not None:
            for p, q in zip(seen.module.parameters(), seen.replica.parameters()):
                start[id(p)] = q
    return [p for p in params if id(p) in cap.nonzero and id(p) in start
            and start[id(p)].numel() and not torch.count_nonzero(start[id(p)].detach())]


def _behind_zero_factors(cap: Capture, params: list, zero: list) -> dict:
    """{id: parameter} of the parameters among ``zero`` (all-zero gradients) whose module holds a
    factor that starts at zero (_zero_factors), where one optimizer step ran: their gradient
    passes through that factor's value (LoRA's A through B = 0, x @ A.T @ B.T), 0 until it has
    moved.  (``nndb check --steps 1`` on a healthy LoRA fine-tune FAILed 'dead ReLUs or a
    saturated activation upstream' for every A.)  With more steps, a zero there is judged."""
    if not zero or cap.steps_done != 1:
        return {}
    prefixes = {cap.param_name(q).rpartition(".")[0] for q in _zero_factors(cap, params)}
    return {id(p): p for p in zero if cap.param_name(p).rpartition(".")[0] in prefixes}


def _biases_the_loss_ignores(cap: Capture, params: list, zero: list) -> list:
    """The biases among ``zero`` (all-zero gradients) whose layer's weight got a non-zero
    gradient.  A bias's gradient is the sum of its layer's output gradients over the batch,
    the weight's those gradients times the inputs: a non-zero weight gradient means the
    gradients reached the layer (no dead unit, no saturation upstream), and they summed to
    exactly 0: the loss does not depend on the bias (a WGAN critic's last bias under
    D(fake).mean() - D(real).mean()), which is no training bug."""
    if not zero:
        return []
    by_name = {cap.param_name(p): p for p in params}
    out = []
    for p in zero:
        name = cap.param_name(p)
        if name == "bias" or name.endswith(".bias"):
            weight = by_name.get(name[:-len("bias")] + "weight")
            if weight is not None and id(weight) in cap.nonzero:
                out.append(p)
    return out


def _ran_without_autograd(cap: Capture, p) -> bool:
    """Is ``p`` held by a model the run called, never with autograd on?"""
    return any(i not in cap.with_grad and any(q is p for q in seen.module.parameters())
               for i, seen in cap.models.items())


def _script_grad_hook(p) -> bool:
    """Has the script hooked ``p``'s gradient itself (a tensor hook, which may return another
    gradient, or a post-accumulate-grad hook, which may change or drop ``.grad``)?  nndb's own
    hooks (its probes', the tracer's) are not the script's."""
    for hooks in (getattr(p, "_backward_hooks", None), getattr(p, "_post_accumulate_grad_hooks", None)):
        for fn in list((hooks or {}).values()):
            fn = getattr(fn, "func", fn)                  # (a functools.partial)
            module = getattr(getattr(fn, "__func__", fn), "__module__", None) or ""
            if not module.startswith("nndb."):
                return True
    return False


def grad_reset_check(cap: Capture, outcome: Outcome) -> Check:
    """Was each optimizer's .grad reset between its steps?  The live
    stale_grad rule's probe and thresholds, on the steps the check ran; one
    stale step is enough here (the check runs a few steps; the live rule
    waits for two in a row)."""
    from ..rules.grad_rules import StaleGrad
    if not _optimized(cap):
        return _no_optimizer("zero-grad", cap, outcome)
    checks = cap.reset_checks
    if not checks and not cap.backward_losses:
        # (gradients by torch.autograd.grad or torch.func, written to .grad by the script: it
        # said 'with a non-zero gradient: none was' of steps that had one)
        return _skip("zero-grad", "no backward() ran: the script wrote .grad itself (torch.autograd.grad, "
                     "torch.func), and nothing was added to a gradient left from a step before", outcome)
    if not checks:
        return _skip("zero-grad", "the gradients' reset is seen from an optimizer's second step on, with a "
                     "non-zero gradient: none was (more steps: --steps N)", outcome)
    tol, share = (StaleGrad.THRESHOLDS[k].default for k in ("tol", "min_share"))
    stale = [c for c in checks if StaleGrad.is_stale(c, tol, share)]
    nums = {"checked": [{k: c[k] for k in ("step", "optimizer", "param", "r_stale", "r_reset", "calls") if k in c}
                        for c in checks]}
    within = [c for c in stale if c.get("within")]
    if within:
        c = within[0]
        return Check("zero-grad", "FAIL", f"at step {c['step']}, {c['param']}.grad held the gradient of the calls "
                     f"of {c['optimizer']}'s closure before each of its {c['calls']} calls", "gradients are not "
                     "reset between the calls of a closure (zero_grad missing in it): each call's gradient is "
                     "the sum of all so far; call optimizer.zero_grad() at the start of the closure", nums)
    if stale:
        c = stale[0]
        return Check("zero-grad", "FAIL", f"at step {c['step']}, {c['param']}.grad held the last step's gradient "
                     f"plus the new one ({c['optimizer']}; residual {fmt(c['r_stale'])} against last + new, "
                     f"{fmt(c['r_reset'])} against the new alone; {len(stale)} of {len(checks)} step(s) checked)",
                     "gradients are not reset between optimizer steps (zero_grad missing): each step uses the "
                     "sum of all gradients so far; call optimizer.zero_grad() once per step (after step() when "
                     "accumulating over several backward passes)", nums)
    opts = ", ".join(dict.fromkeys(c["optimizer"] for c in checks))
    return Check("zero-grad", "PASS", f"{opts}: .grad was reset between optimizer steps ({len(checks)} step(s) "
                 "checked)", numbers=nums)


def _has_relu(cap: Capture) -> bool:
    """Does the model hold a ReLU module (one whose units can die)?"""
    seen = cap.model()
    return seen is not None and any(isinstance(m, (torch.nn.ReLU, torch.nn.ReLU6))
                                    for m in seen.module.modules())


def updates_check(cap: Capture, outcome: Outcome) -> Check:
    params = _optimized(cap)
    if not params:
        return _no_optimizer("updates", cap, outcome)
    # A gradient of RMS below the live param_not_updated rule's min_grad_rms counts as zero (the
    # bias of a Linear before a BatchNorm: ~3e-9, which SGD's update rounds away)
    from ..rules.stats_rules import ParamNotUpdated
    floor = ParamNotUpdated.THRESHOLDS["min_grad_rms"].default
    tiny = [p for p in params if id(p) in cap.nonzero and cap.grad_rms.get(id(p), 0.0) < floor]
    moving = [p for p in params if id(p) in cap.nonzero and cap.grad_rms.get(id(p), 0.0) >= floor]
    if not moving:
        return _skip("updates", "no parameter got a usable gradient (see gradients)", outcome)
    still = [p for p in moving if id(p) not in cap.changed]
    lrs = sorted({lr for o in cap.optimizers for step in o.lrs for lr in step if lr is not None})
    lr_text = "lr " + ", ".join(f"{lr:g}" for lr in lrs) if lrs else "lr unknown"
    changes = [cap.changed[id(p)] for p in moving if id(p) in cap.changed]
    nums = {"params": len(moving), "unchanged": [cap.param_name(p) for p in still], "lr": lrs}
    if changes:
        nums.update(min_rel_change=min(changes), max_rel_change=max(changes))
    if still:
        if lrs and all(lr == 0 for lr in lrs):
            cause = "the learning rate is 0 (a warmup that starts at 0? check more steps with --steps)"
        else:
            cause = ("optimizer.step() leaves them as they were: their param group's lr is 0, a GradScaler "
                     "skips the steps, or the updates are below the dtype's resolution")
        return Check("updates", "FAIL", f"{len(still)}/{len(moving)} parameter tensor(s) with a gradient did not "
                     f"change in optimizer.step(): {_names(cap, still)} ({lr_text})", cause, nums)
    from ..rules.stats_rules import UpdateRatio
    rewrite = UpdateRatio.THRESHOLDS["rewrite"].default
    rewritten = sorted(((r, s, p) for p in moving for r, s in [cap.rewrites.get(id(p), (0.0, 0))] if r >= rewrite),
                       key=lambda x: -x[0])
    if rewritten:
        # (the live update_ratio's rewrite, at once: it spoke at step 0 of mnist_rnn at Adadelta lr 1000,
        # whose every weight changed by 0.994..1.069 of its norm, where this check PASSed)
        r, s, p = rewritten[0]
        nums["rewritten"] = {cap.param_name(q): ratio for ratio, _, q in rewritten}
        return Check("updates", "FAIL", f"{len(rewritten)}/{len(moving)} parameter tensor(s) rewritten by "
                     f"optimizer.step(): {cap.param_name(p)}'s update at step {s} is {fmt(r)}x the norm of the "
                     f"weight it leaves, at or above {rewrite:g} (update_ratio's rewrite; healthy ~1e-3); "
                     f"{_names(cap, [q for _, _, q in rewritten])} ({lr_text})",
                     "the learning rate is far too high: every step rewrites the weights", nums)
    left = ""
    orphans = cap.unheld_with_grad()
    if orphans:
        # (said, not failed: a fine-tune may pass only its head to the optimizer; a model whose last
        # layer was left out of it PASSed without a word, and only its overfit FAILed)
        nums["unheld_with_grad"] = [cap.param_name(p) for p in orphans]
        left += (f"; no optimizer holds {_names(cap, orphans)}, though backward() gives them a gradient: they "
                 "never change (left out of the optimizer? or frozen on purpose: requires_grad_(False) says so)")
    if tiny:
        nums["tiny_grad"] = [cap.param_name(p) for p in tiny]
        left = (f"; not judged: {_names(cap, tiny)}, whose gradient's RMS stayed below {floor:g} (counted as "
                "zero, as param_not_updated does: a bias the loss barely depends on by construction, as one "
                "before a BatchNorm, or an attention key's bias, which the softmax's shift leaves unchanged)")
    return Check("updates", "PASS", f"{len(moving)}/{len(moving)} parameter tensor(s) changed in optimizer.step() "
                 f"(relative change {fmt(min(changes))}..{fmt(max(changes))}; {lr_text}){left}", numbers=nums)
