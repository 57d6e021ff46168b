"""Rules that look at the model's modules while it runs, through the probes of
nndb.rules.model_probes: dead ReLUs, saturated Tanh/Sigmoid units, Dropout and
BatchNorm left in eval mode while training, unscaled model inputs, a first
loss far from chance, a loss whose prediction and target broadcast, and a
softmax in front of CrossEntropyLoss.

The activation rules see the module forms (``nn.ReLU``, ``nn.Tanh``...) as they
run, and the functional ones (``F.relu``, ``torch.tanh``, ``x.sigmoid()``: no module
hook sees them) in the graph each backward differentiates, named after the module
whose output they took (``relu(fc1)``: nndb.rules.model_probes.graph_activations).
The loss rules see loss modules when the script
calls them directly (``criterion(out, y)``, as root modules), and also
``torch.nn.functional`` losses and hand-written ones (``((pred - y) **
2).mean()``) through a TorchFunctionMode during the loss probe's steps
(nndb.rules.loss_watch).
"""
from __future__ import annotations

import math
import weakref

import numpy as np
import torch

from ..text import fmt
from . import model_probes  # noqa: F401  (registers the probes)
from .base import Rule, Threshold
from .series import also

_STEPS_WHY = ("consecutive observed steps (in which the layer ran with at least min_samples values per unit) "
              "in which the same units are stuck: one batch can silence a sparse unit by chance, the same "
              "unit five batches running cannot (p^5), and a dead layer stays dead, so waiting costs little")
_MIN_SAMPLES_WHY = ("values per unit in a step (batch x positions) below which the step is not counted: with "
                    "one or two samples a healthy unit is silent half the time")


def _np(t) -> np.ndarray:
    """A probe's tensor as numpy (they are detached results of reductions; a
    bfloat16 one, which numpy has no type for, in float32)."""
    if not isinstance(t, torch.Tensor):
        return np.asarray(t)
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.numpy() if t.device.type == "cpu" else t.cpu().numpy()


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


class _UnitStreaks(Rule):
    """Per-unit streaks of consecutive steps in which a unit was stuck; a
    layer is reported when ``share`` of its units have a streak >= ``steps``."""
    PROBE = ""

    def __init__(self):
        super().__init__()
        self._streak: dict = {}        # (series, convention) -> int array

    def reset(self) -> None:
        self._streak = {}

    def stuck(self, f: dict, conv: str, series: str):
        raise NotImplementedError

    def check(self, ctx):
        facts = ctx.facts.get(self.PROBE)
        if not facts:
            return
        need, share_min = max(1, int(self.params["steps"])), float(self.params["share"])
        min_samples = self.params["min_samples"]
        for series, f in facts.items():
            if not isinstance(f, dict) or f["samples"] < min_samples:
                continue
            hit = None
            for conv in self.conventions(f):
                stuck = self.stuck(f, conv, series)
                if stuck is None:
                    continue
                key = (series, conv)
                count = np.count_nonzero(stuck)
                if count == 0:                     # the usual case: nothing stuck, no streak
                    self._streak.pop(key, None)
                    continue
                old = self._streak.get(key)
                now = stuck.astype(np.int32) if old is None or old.shape != stuck.shape else (old + 1) * stuck
                self._streak[key] = now
                if count < share_min * now.size:   # not enough stuck now: no streak can be long enough
                    continue
                n = np.count_nonzero(now >= need)
                share = n / now.size
                if share >= share_min and (hit is None or share > hit[1]):
                    hit = (conv, share, n, now.size)
            if hit is not None:
                yield self.report(ctx, series, f, *hit, need)

    @staticmethod
    def conventions(f: dict):
        return ()

    def report(self, ctx, series, f, conv, share, n, units, need):
        raise NotImplementedError


class DeadRelu(_UnitStreaks):
    """A ReLU layer (nn.ReLU, nn.ReLU6) most of whose units output 0 for every
    sample of the batch, step after step: no gradient flows through a dead
    unit, so it never recovers (a too-large learning rate, a very negative
    bias, unscaled inputs).  A unit is one feature of an (N, F) output, one
    channel of an (N, C, H, W) output (zero at every position of every
    sample); an (N, L, F) output is read both ways.  Some silent units are
    normal in a healthy ReLU network.  F.relu / torch.relu calls are read from the
    backward's graph, as ``relu(<the module whose output they took>)``; not one inside a
    checkpointed block (reading it would run the block again), nor one of a parameter
    alone (``F.relu(self.w)``, a weight kept non-negative: no batch, no layer's units)."""
    id = "dead_relu"
    severity = "warning"
    explanation = ("most units of a ReLU layer output 0 for every sample of the batch, for several steps "
                   "running (dead ReLUs: no gradient reaches them)")
    THRESHOLDS = {
        "share": Threshold(0.5, "fraction of the layer's units dead: healthy ReLU nets at init have almost "
                                "none dead for a whole batch, and trained ones are reported with 10-40% of "
                                "units dead in some layers (Lu et al. 2019, 'Dying ReLU and Initialization'); "
                                "half the layer gone is well beyond that and costs real capacity"),
        "steps": Threshold(5, _STEPS_WHY),
        "min_samples": Threshold(8, _MIN_SAMPLES_WHY),
    }
    PROBES = ("relu_units",)
    PROBE = "relu_units"

    @staticmethod
    def conventions(f):
        return f["hi"].keys()

    def stuck(self, f, conv, series):
        return _np(f["hi"][conv]) <= 0          # NaN is not dead (that is nonfinite's business)

    def report(self, ctx, series, f, conv, share, n, units, need):
        what = "channels" if conv == "channels" else "units"
        return self.finding(
            ctx, f"{n} of {units} {what} ({_pct(share)}) of ReLU layer {series} ({f['type']}) output 0 "
                 f"for every sample for {need} steps running: dead ReLUs, no gradient flows through them",
            tensor=series, module_type=f["type"], dead_units=n, units=units, dead_share=round(share, 4),
            steps=need, unit=conv)


class SaturatedActivation(_UnitStreaks):
    """Tanh / Sigmoid units (nn.Tanh, nn.Sigmoid) that pass almost no
    gradient, whichever asymptote each sample sits at.  A unit's gradient
    factor in a step is its mean local derivative over the step's samples
    (batch x positions), relative to the largest there is: tanh' = 1 - y^2,
    sigmoid' / 0.25 = 1 - (2y - 1)^2.  The unit is saturated when that factor
    is below ``gradient`` (0.1): a unit at |tanh| > 0.99 (sigmoid < 0.01 or
    > 0.99) on every sample has a factor below 0.02, whether it sits at +1
    for all samples or flips between +1 and -1 with the sample; a tanh layer
    whose pre-activations have std 20 has ~0.04, one with a sane init
    (std ~1) ~0.6.  The layer is reported when at least ``share`` (half) of
    its units are saturated in ``steps`` (5) observed steps running (steps
    with at least ``min_samples`` values per unit).  A unit is one feature
    of an (N, F) output, one channel of an (N, C, H, W) output; (N, L, F) is
    read both ways.  A Sigmoid whose output goes straight into a loss module
    (a probability head, confident by design) is not judged, nor is a
    torch.sigmoid / torch.tanh call with no operation of parameters between it and
    the loss; the other calls are read from the backward's graph, as
    ``tanh(<the module whose output they took>)``."""
    id = "saturated_activation"
    severity = "warning"
    explanation = ("most units of a Tanh/Sigmoid layer are saturated (near +-1, or 0 and 1, on either side) "
                   "for almost every sample, several steps running: they pass almost no gradient")
    THRESHOLDS = {
        "share": Threshold(0.5, "fraction of the layer's units saturated: as for dead_relu, a few saturated "
                                "units are normal, half the layer is not"),
        "steps": Threshold(5, _STEPS_WHY),
        "min_samples": Threshold(8, _MIN_SAMPLES_WHY),
        "gradient": Threshold(0.1, "a unit's mean local derivative over the step's samples, relative to its "
                                   "largest (tanh' = 1 - y^2, sigmoid'/0.25), below which it is saturated: "
                                   "|tanh| > 0.99 (pre-activation beyond 2.65, the usual cut-off; Glorot & "
                                   "Bengio 2010) on every sample gives < 0.02, on 90% of them ~0.06; a sane "
                                   "init (pre-activations of std ~1) gives ~0.6, std 5 ~0.16"),
    }
    PROBES = ("saturation",)
    PROBE = "saturation"

    def __init__(self):
        super().__init__()
        self._heads: set = set()

    def reset(self) -> None:
        super().reset()
        self._heads = set()

    def check(self, ctx):
        self._heads |= ctx.facts.get(self.PROBE, {}).get("heads", set())
        return super().check(ctx)

    @staticmethod
    def conventions(f):
        return f["sq"].keys()

    def stuck(self, f, conv, series):
        if series in self._heads:
            return None
        factor = 1 - _np(f["sq"][conv]).astype(np.float64) / max(1, f["n"][conv])
        return factor < float(self.params["gradient"])       # NaN is not saturated (nonfinite's business)

    def report(self, ctx, series, f, conv, share, n, units, need):
        return self.finding(
            ctx, f"{n} of {units} units ({_pct(share)}) of {f['type']} layer {series} are saturated (their mean "
                 f"local derivative is below {self.params['gradient']:g} of its largest, at either asymptote) "
                 f"for {need} steps running: they pass almost no gradient",
            tensor=series, module_type=f["type"], saturated_units=n, units=units,
            saturated_share=round(share, 4), steps=need, unit=conv)


class EvalModeTraining(Rule):
    """Dropout / BatchNorm modules that run in eval mode (``module.training``
    False) inside a training step: autograd on, a backward pass and an
    optimizer step in the step, the module never in train mode in that step,
    its model (the root module) in eval mode too (``model.eval()`` and no
    ``model.train()`` after it), and it is being trained: a BatchNorm's
    weight or bias is in an optimizer (a BatchNorm without affine
    parameters, or a Dropout: some parameter of its model is).  Then dropout
    is off and BatchNorm normalises with frozen running statistics.

    Not reported: a validation pass under ``torch.no_grad()``; a frozen
    backbone in eval mode whose parameters no optimizer holds; BatchNorm set
    to eval on purpose inside a model that is in train mode (frozen BN
    statistics when fine-tuning); Dropout with p=0 and BatchNorm without
    running statistics (eval changes nothing)."""
    id = "eval_mode_training"
    severity = "warning"
    explanation = ("Dropout/BatchNorm run in eval mode in steps that train the model (model.eval() without "
                   "model.train() after it)")
    THRESHOLDS = {
        "steps": Threshold(2, "consecutive training steps in eval mode: the usual bug (validation, then no "
                              "model.train()) lasts for the rest of the run; one step of slack costs one "
                              "step of delay"),
    }
    PROBES = ("train_mode",)

    def __init__(self):
        super().__init__()
        self._streak: dict = {}
        self._roots: dict = {}

    def reset(self) -> None:
        self._streak = {}
        self._roots = {}

    def _root_of(self, ctx, module):
        r = self._roots.get(id(module))
        if r is not None and r[0]() is module:
            return r[1]()
        for root in (ctx.naming.roots() if ctx.naming is not None else ()):
            if any(m is module for m in root.modules()):
                self._roots[id(module)] = (weakref.ref(module), weakref.ref(root))
                return root
        return None

    @staticmethod
    def _optimized(ctx) -> set:
        return {id(p) for _, opt in ctx.optimizers for g in opt.param_groups for p in g["params"]
                if p.requires_grad}

    @staticmethod
    def _trained(module, root, opt_params) -> bool:
        own = [p for p in (getattr(module, "weight", None), getattr(module, "bias", None))
               if isinstance(p, torch.nn.Parameter)]
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and own:
            return any(id(p) in opt_params for p in own)
        return any(id(p) in opt_params for p in root.parameters())

    def check(self, ctx):
        facts = ctx.facts.get("train_mode", {})
        rec = ctx.record
        if not facts or not (rec.backward_count > 0 and rec.optimizer_steps > 0):
            return
        need = max(1, int(self.params["steps"]))
        opt_params = None
        found: dict = {}                # id(root) -> (root, [(series, fact, steps)]): one finding a model
        for series, f in facts.items():
            module = f["module"]
            bad = module is not None and f["eval"] > 0 and f["train"] == 0 and f["needs_grad"] \
                and self._changes_something(module)
            root = self._root_of(ctx, module) if bad else None
            bad = bad and root is not None and not root.training
            if bad:
                opt_params = self._optimized(ctx) if opt_params is None else opt_params
                bad = self._trained(module, root, opt_params)
            n = self._streak[series] = self._streak.get(series, 0) + 1 if bad else 0
            if n >= need:
                found.setdefault(id(root), (root, []))[1].append((series, f, n))
        for root, mods in found.values():
            # (one model.eval() puts all its Dropout and BatchNorm layers in eval mode: one finding, its
            # layers listed, as update_ratio lists its tensors; a GPT's 7 dropouts were 7 lines)
            rname = ctx.naming.module_name(root)
            series, f, n = mods[0]
            types = [t for t in ("Dropout", "BatchNorm") if any(t in m[1]["type"] for m in mods)]
            kind = " and ".join({"Dropout": "dropout is off", "BatchNorm": "BatchNorm normalises with frozen "
                                 "running statistics instead of the batch's"}[t] for t in types) or "dropout is off"
            others = [f"{m[1]['type']} {m[0]}" for m in mods[1:]]
            yield self.finding(
                ctx, f"{f['type']} {series} ran in eval mode in {n} training steps running ({rname}.training is "
                     f"False: model.eval() without model.train() after it?): {kind}" + also(others),
                module=rname, module_type=f["type"], root=rname, steps=n, eval_calls=f["eval"],
                modules=[m[0] for m in mods], module_types=[m[1]["type"] for m in mods])

    @staticmethod
    def _changes_something(module) -> bool:
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            return bool(module.track_running_stats) and module.running_mean is not None
        return float(getattr(module, "p", 1.0)) > 0


class InputRange(Rule):
    """The model's input is not scaled: the first tensor argument of a root
    module that owns parameters (the model called by the script), if
    floating-point, has max(|mean|, std) > ``max_scale`` over the batch, for
    ``steps`` batches running (raw 0-255 pixels: mean ~100, std ~60).
    Integer inputs (token ids, indices for an Embedding) are not data to
    scale and are skipped; so is a model whose first module is a
    normalisation layer (BatchNorm, LayerNorm...: it scales its input).
    Looked at on the first 10 calls, then on one recorded step in 64
    (nndb.cadence.SAMPLE_CALLS, SAMPLE_EVERY), on at most 2^20 values of the
    batch (a strided subset beyond)."""
    id = "input_range"
    severity = "warning"
    explanation = "the model's input is not normalised (e.g. raw 0-255 pixels): |mean| or std far above 1"
    THRESHOLDS = {
        "max_scale": Threshold(10.0, "standardised inputs have |mean| ~0 and std ~1; inputs scaled to [0, 1] or "
                                     "[-1, 1] stay below 1; 10x that is outside any normalisation (raw 8-bit "
                                     "pixels: mean ~100, std ~60; Karpathy's recipe and LeCun et al. 1998, "
                                     "'Efficient BackProp': inputs should have mean ~0 and similar variances)"),
        "steps": Threshold(3, "batches in a row: one batch with a huge outlier can inflate std; a data "
                              "pipeline that does not scale does so on every batch"),
    }
    PROBES = ("model_inputs",)

    def __init__(self):
        super().__init__()
        self._streak: dict = {}

    def reset(self) -> None:
        self._streak = {}

    def check(self, ctx):
        need = max(1, int(self.params["steps"]))
        for root, f in ctx.facts.get("model_inputs", {}).get("roots", {}).items():
            lo, hi, mean, rms, integral = (float(v) for v in _np(f["stats"]))
            std = math.sqrt(max(rms * rms - mean * mean, 0.0))
            scale = max(abs(mean), std)
            bad = math.isfinite(scale) and scale > float(self.params["max_scale"])
            n = self._streak[root] = self._streak.get(root, 0) + 1 if bad else 0
            if n < need or self._normalises_itself(ctx, root):
                continue
            hint = ""
            if integral >= 1 and lo >= 0 and hi <= 255:
                hint = "; integer values in 0..255: raw pixels? divide by 255 (and standardise)"
            elif integral >= 1 and lo >= 0:
                hint = "; non-negative integer values: raw counts or codes?"
            yield self.finding(
                ctx, f"the input of {root} {tuple(f['shape'])} ({f['dtype']}) is not normalised: mean {fmt(mean)}, "
                     f"std {fmt(std)}, range [{fmt(lo)}, {fmt(hi)}] for {n} batches{hint}",
                module=root, min=lo, max=hi, mean=mean, std=std, integer_valued=integral >= 1,
                shape=list(f["shape"]), dtype=f["dtype"], steps=n)

    @staticmethod
    def _normalises_itself(ctx, root: str) -> bool:
        """Is the model's first module (its first activation of the step) a normalisation layer?"""
        rows = [name for name, _ in ctx.rows("act")]
        mine = [n for n in rows if n.startswith(root + ".")] or rows
        return bool(mine) and ctx.module_types.get(mine[0].split("#")[0], "").endswith(_NORMS)


_NORMS = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LayerNorm", "GroupNorm", "InstanceNorm1d",
          "InstanceNorm2d", "InstanceNorm3d", "LocalResponseNorm", "RMSNorm")


def _loss_calls(ctx) -> dict:
    return ctx.facts.get("loss_inputs", {}).get("calls", {})


def _label(name: str, f: dict) -> str:
    """``criterion (CrossEntropyLoss)``, or ``F.cross_entropy at train.py:42`` for a function."""
    return name if name.startswith(f["type"]) else f"{name} ({f['type']})"


class InitialLoss(Rule):
    """At step 0 a classifier (nn.CrossEntropyLoss or nn.NLLLoss module, or
    F.cross_entropy / F.nll_loss; input (N, C) or (N, C, ...)) should predict about uniformly: loss ~ ln(C).
    Karpathy, "A Recipe for Training Neural Networks" (2019): "verify loss @
    init"; a first loss far above it means confidently wrong outputs
    (unscaled inputs, a bad init of the last layer).  The loss is recomputed
    from the module's first call at step 0 (its own weight, ignore_index,
    label smoothing; mean reduction), so a script's scaling of the loss does
    not matter.  A lower loss is not reported (a resumed or fine-tuned run
    starts low).  A functional call is recomputed from its own arguments
    (weight, ignore_index, label_smoothing) with mean reduction, and is
    named by the line that calls it."""
    id = "initial_loss"
    severity = "warning"
    explanation = "the first step's classification loss is far above ln(number of classes), the loss at chance"
    THRESHOLDS = {
        "ratio": Threshold(2.0, "loss / ln(C) above which the first loss is 'far' from chance: default "
                                "PyTorch init gives logits of std << 1, so a loss within a few % of ln(C); "
                                "twice ln(C) means logits of magnitude several units"),
        "margin": Threshold(1.0, "and at least this many nats above ln(C): for 2-3 classes twice ln(C) is "
                                 "only ~0.7-1.1 nats of excess, which moderate init logits can reach"),
    }
    PROBES = ("loss_inputs",)

    def check(self, ctx):
        for name, f in _loss_calls(ctx).items():
            first = f.get("first_loss")
            if not first or first[0] is None:
                continue
            loss, classes = float(_np(first[0])), int(first[1])
            chance = math.log(classes)
            if not math.isfinite(loss):
                continue
            if loss > float(self.params["ratio"]) * chance and loss - chance > float(self.params["margin"]):
                yield self.finding(
                    ctx, f"the first loss of {_label(name, f)} ({classes} classes) is {fmt(loss)}, "
                         f"{loss / chance:.1f}x ln({classes}) = {fmt(chance)}, the loss at chance: the initial "
                         f"outputs are confidently wrong (unscaled inputs? last layer's init?)",
                    module=name, loss=loss, classes=classes, chance_loss=chance, ratio=loss / chance)


class LossBroadcast(Rule):
    """A pointwise loss module (nn.MSELoss, L1Loss, SmoothL1Loss, HuberLoss,
    BCELoss, BCEWithLogitsLoss) given a prediction and a target of different
    shapes that broadcast to one bigger than both: (N, 1) against (N,)
    compares every prediction with every target, an (N, N) loss that trains
    towards the mean.  Shapes that differ but broadcast to the bigger one (a
    single target value for every prediction) are not reported: that can be
    meant.  The same for F.mse_loss and the other functional pointwise
    losses, and for a hand-written loss: an elementwise + - * / of the
    model's output (or of a per-sample result an op made of it: the same
    shape, or the batch kept as dim 0, a Siamese pair's distance) and
    another tensor whose broadcast creates a new dimension out of the batch
    (the other operand has the batch size where the output has size 1 or no
    dimension: ``((pred - y) ** 2).mean()`` with pred (N, 1) and y (N,));
    a bias add, (N, C) - (C,) or (N, 1) * (N, C) create nothing bigger and
    are not reported (nndb.rules.loss_watch).  Looked at on the loss probe's
    steps (the first 20, then one in 64); named by the line of the call."""
    id = "loss_broadcast"
    severity = "error"
    explanation = ("a loss's prediction and target shapes differ and broadcast to a bigger shape (e.g. (N, 1) vs "
                   "(N,) -> (N, N)), in a loss module, a functional loss or a hand-written loss")
    THRESHOLDS: dict = {}
    PROBES = ("loss_inputs",)

    def check(self, ctx):
        for name, f in _loss_calls(ctx).items():
            if "shapes" not in f:
                continue
            a, b = f["shapes"]
            try:
                c = tuple(torch.broadcast_shapes(a, b))
            except RuntimeError:
                continue                 # the loss itself raises
            if math.prod(c) > max(math.prod(a), math.prod(b)) and "op" in f:
                yield self.finding(
                    ctx, f"{name}: " + (f"a per-sample result of the model's output, of shape {f['model_shape']},"
                                        if f.get("made_of_output") else
                                        f"the model's output of shape {f['model_shape']}") + " and a tensor of shape "
                         f"{b if tuple(f['model_shape']) == tuple(a) else a} broadcast to {c}, a new dimension "
                         f"out of the batch: every prediction against every target (reshape one of them)",
                    module=name, input_shape=list(a), target_shape=list(b), broadcast_shape=list(c),
                    op=f["op"], model_shape=list(f["model_shape"]))
            elif math.prod(c) > max(math.prod(a), math.prod(b)):
                yield self.finding(
                    ctx, f"{_label(name, f)} compares a prediction of shape {a} with a target of shape "
                         f"{b}: they broadcast to {c}, every prediction against every target",
                    module=name, input_shape=list(a), target_shape=list(b), broadcast_shape=list(c))


class DoubleSoftmax(Rule):
    """nn.CrossEntropyLoss applies log-softmax itself: its input must be
    logits.  Reported when the input is the output of an nn.Softmax module
    (or of a softmax function call), or looks like probabilities: every value
    in [0, 1] and every row (along the class dimension) summing to 1 within
    ``tol`` (checked on up to 64 rows).  Gradients are then tiny and the loss
    cannot go below ln(e + C - 1) - 1 (1.46 for 10 classes): it plateaus.
    F.cross_entropy calls are judged the same way (nndb.rules.loss_watch)."""
    id = "double_softmax"
    severity = "error"
    explanation = ("CrossEntropyLoss / F.cross_entropy is given probabilities (softmax already applied): "
                   "softmax twice")
    THRESHOLDS = {
        "tol": Threshold(1e-3, "largest |row sum - 1| of a float32 softmax output is ~1e-6 x C; logits "
                               "never sum to 1 in every row by chance. 20x this for float16/bfloat16 "
                               "inputs (8-bit mantissa)"),
    }
    PROBES = ("loss_inputs",)

    def check(self, ctx):
        for name, f in _loss_calls(ctx).items():
            src = f.get("softmax_from")
            probs = f.get("probs")
            if probs is None:
                continue
            lo, hi, err = (float(v) for v in _np(probs))
            tol = float(self.params["tol"]) * (20 if f.get("dtype") in ("float16", "bfloat16") else 1)
            looks = lo >= 0 and hi <= 1 and err <= tol
            if src is None and not looks:
                continue
            why = f"it is the output of {src}" if src is not None else \
                f"its values are in [{fmt(lo)}, {fmt(hi)}] and its rows sum to 1 (within {err:.1g})"
            yield self.finding(
                ctx, f"{name} ({f['type']}) is given probabilities, not logits: {why}; it applies "
                     f"log-softmax itself, so softmax runs twice (tiny gradients, the loss plateaus)",
                module=name, softmax_module=src, min=lo, max=hi, row_sum_error=err, classes=f.get("classes"))


class ClipBeforeUnscale(Rule):
    """clip_grad_norm_ under a GradScaler must come after ``scaler.unscale_(optimizer)``
    (PyTorch's AMP examples, 'Gradient clipping'): before it, the gradients are still the
    loss scale (65536 at the start) times the true ones, so the total norm it returns is
    scale x the true norm and it clips them to ``max_norm`` there, to max_norm / scale
    once the scaler's step unscales them: every step clipped to almost nothing (or never,
    with a max_norm sized for the scaled norms).  Seen live, at the scaler's
    ``step(optimizer)`` after such a clip of that optimizer's parameters (an optimizer no
    scaler steps has gradients no scaler scaled); the order unscale_ then clip, a run
    without a scaler and a disabled scaler are not reported."""
    id = "clip_before_unscale"
    severity = "error"
    explanation = ("clip_grad_norm_ under a GradScaler before scaler.unscale_(optimizer): it measures and clips "
                   "the gradients times the loss scale, so the norm it returns is the scale's and max_norm "
                   "becomes max_norm / scale")
    THRESHOLDS: dict = {}
    PROBES = ("scaled_clip",)

    def check(self, ctx):
        for f in ctx.facts.get("scaled_clip", {}).get("clips", ()):
            opt = f["optimizer"]()
            name = next((n for n, o in ctx.optimizers if o is opt), "the optimizer")
            total, max_norm, scale = f["total"], f["max_norm"], f["scale"]
            true = f" (the gradients' own: {fmt(total / scale)})" if total is not None and scale else ""
            clipped = f", clipping them to {max_norm:g} / {scale:g} = {fmt(max_norm / scale)}" \
                if max_norm is not None and scale and total is not None and total > max_norm else ""
            yield self.finding(
                ctx, f"clip_grad_norm_ clipped {name}'s gradients before scaler.unscale_({name}): they "
                     f"were still multiplied by the loss scale ({scale:g}), so it returned a total norm "
                     f"of {fmt(total)}{true}{clipped}; call scaler.unscale_(optimizer) before clipping",
                module=name, total_norm=total, max_norm=max_norm, scale=scale)


RULES = [DeadRelu, SaturatedActivation, EvalModeTraining, InputRange, InitialLoss, LossBroadcast, DoubleSoftmax,
         ClipBeforeUnscale]
