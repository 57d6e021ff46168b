"""Exploding, vanishing and absent gradients, from the recorded gradient norms.

Three views of a weight tensor's gradient at a step, each a flag; a streak of
``steps`` consecutive flagged observed steps (nndb.rules.base.observed) reports the tensor (one finding
per optimizer: its worst tensor, the others listed):

* relative to the tensor's own early value (median of its first 5 recorded
  nonzero norms);
* absolute (a ceiling; a floor while the loss is still high);
* across layers: the ratio of the largest to the smallest RMS gradient among
  the weight tensors of one optimizer.  Backprop multiplies gradients on their
  way to the input, so which of the two comes first in parameter order (about
  forward order) says exploding (largest first) or vanishing (smallest first).

Only weight tensors count (>= 2-D and ``min_elements``: biases and norm scales
have small, noisy gradients) that the step trains (an update row: a fixed
network's gradients are applied by no one), and only nonzero gradients: an
exactly-zero gradient is a frozen or dead layer, not a vanishing one.

``zero_gradients`` is the other end: every gradient of the step exactly 0,
step after step, so nothing can learn (a constant loss, a cross-entropy over a
single class, a loss cut from the model).

Under ``clip_grad_norm_`` the gradients recorded are the clipped ones; the total
norm it returned (the ``grad`` series schema.CLIP_SERIES) is judged by
``exploding_gradient`` with the same thresholds.

Why this size: one family of rules over one column of every step (the gradient
norms), sharing the layout-derived eligibility, the layer spread, the block
judgement and the per-tensor streaks; split, each half would import the
other's internals.
"""
from __future__ import annotations

import math

import numpy as np

from ..schema import CLIP_SERIES
from ..text import fmt
from ..tracer.stats import scalar_of
from .base import Rule, Threshold
from .series import MIN_ELEMENTS, Streaks, Tensors, adaptive_eps, also, fit, layout, live_share, num

_EARLY = 5      # recorded steps whose median is a tensor's own reference value
_STEPS = Threshold(3, "consecutive recorded steps: a single spiky batch is not a trend; three in a row are")


def _spread(ctx, lay, me: int, limit: float):
    """{optimizer: (ratio, hi, lo, rms hi, rms lo)} (layout positions) where the
    largest RMS weight gradient is over ``limit`` x the smallest; shared by
    the two rules of a step."""
    def compute():
        e = _spread_eligible(ctx, lay, me)
        if e.size < 2:
            return {}
        # RMS over the entries a gradient reaches: an embedding's gradient is zero
        # outside the rows of the batch's tokens (a rare word's row almost never
        # has one), which the RMS over the whole table would count as vanishing
        touched = lay.take(ctx, "grad", "count")[e] * live_share(ctx, lay)[e]
        rms = lay.take(ctx, "grad", "norm")[e] / np.sqrt(np.maximum(touched, 1))
        pos = rms > 0
        r = rms[pos]
        if r.size < 2 or not r.max() > limit * r.min():        # the usual case: one check for all
            return {}
        grp = lay.groups(ctx)[e]
        out = {}
        for key in np.unique(grp[pos]).tolist():
            idx = np.flatnonzero(pos & (grp == key))
            if idx.size < 2:
                continue
            hi, lo = idx[np.argmax(rms[idx])], idx[np.argmin(rms[idx])]
            if rms[hi] > limit * rms[lo]:
                out[key] = (float(rms[hi] / rms[lo]), int(e[hi]), int(e[lo]), float(rms[hi]), float(rms[lo]))
        return out
    return lay.per_step(ctx, ("spread", me, limit), compute)


def _spread_block(block, lay, e: np.ndarray, limit: float) -> bool:
    """Could ``_spread`` find a layer spread over ``limit`` at some step of the
    block?  (The coarse test of ``_spread``, for every step at once; the
    groups are then looked at step by step.)  Also True when a step measured
    which gradient entries are zero (``live_share`` learns from it: step by
    step).  The RMS gradients' extremes are the block's, shared by the two rules."""
    if e.size < 2:
        return False

    def extremes():
        """(positive RMS gradients, largest, smallest) a step; None: step by step."""
        if np.isfinite(block.take(lay, "grad", "zero_frac")).any():
            return None
        t = lay.owner
        live = t.live[lay.slots] if t.live.shape[0] >= t.n_slots else fit(t.live, t.n_slots, 1.0)[lay.slots]
        rms = block.take(lay, "grad", "norm")[:, e] / \
            np.sqrt(np.maximum(block.take(lay, "grad", "count")[:, e] * live[e], 1))
        pos = rms > 0
        return pos.sum(axis=1), np.where(pos, rms, -np.inf).max(axis=1), np.where(pos, rms, np.inf).min(axis=1)
    got = block.derived(("spread", id(lay), id(e)), extremes)
    if got is None:
        return True
    n, hi, lo = got
    return bool(((n >= 2) & (hi > limit * lo)).any())


def _spread_eligible(ctx, lay, me: int) -> np.ndarray:
    """``_eligible`` less the embedding tables: an embedding's gradient is a sum over the
    batch's tokens, row by row (BERT's token-type table: one row, every token), not a product
    of the layers above it; beside a last layer that reads one position its RMS is 1e4x
    larger in a healthy model, step after step."""
    def compute():
        e = _eligible(ctx, lay, me)
        try:
            types = ctx.module_types
        except Exception:            # (a trace from before it kept the classes: the names tell, nndb.rules.offline)
            types = {}
        keep = [not _embedding(lay.names[i], types) for i in e.tolist()]
        return e[np.array(keep, dtype=bool)] if e.size else e
    return lay.derived(("spread_eligible", me), compute)


def _embedding(param: str, module_types: dict) -> bool:
    """Is ``param`` an embedding table's (nn.Embedding's, by the module's class where the run
    saw it, else by its name: ``*embed*.weight``)?"""
    module = param.rsplit(".", 1)[0] if "." in param else ""
    kind = module_types.get(module)
    if kind is not None:
        name = kind if isinstance(kind, str) else getattr(kind, "__name__", "")
        return "Embedding" in name
    return "embed" in module.rsplit(".", 1)[-1].lower()


def _eligible(ctx, lay, me: int) -> np.ndarray:
    """Layout positions of the weight tensors with a gradient row that the step trains (an update
    row: an optimizer that stepped holds them, or the script updates them by hand).  A gradient
    nothing applies harms nothing: a fixed network's the loss runs through (neural style
    transfer's VGG, whose weights get gradients while Adam steps the image alone: 'exploding',
    2.1e5x between its first and last conv layers' gradients, one from five losses, the other
    from one) is no layer of the training (param_not_updated names a layer left out)."""
    return lay.derived(("grad_eligible", me),
                       lambda: np.flatnonzero(lay.weightlike(ctx, me) & (lay.g >= 0) & (lay.u >= 0)))


class _Gradients(Rule):
    direction = ""
    EVERY_STEP = True       # (the norms are recorded on every step: a runaway between observed steps shows)
    # On a trace (nndb.rules.offline) they run where it records the optimizers.
    READS_OPTIMIZERS = "which optimizer holds each parameter, and the parameters' shapes"

    def reset(self):
        self.own = Tensors()
        self.early = np.zeros((0, _EARLY))      # slot -> first recorded nonzero grad norms
        self.early_n = np.zeros(0, dtype=np.int64)
        self.ref = np.zeros(0)                  # slot -> median of ``early`` (NaN until known)
        self.thr = np.zeros(0)                  # slot -> the norm beyond which it is flagged (from ref)
        self._thr_params = None
        self.streaks = Streaks(int(self.params["steps"]))
        self.done_groups: set = set()
        self._fill_layouts: list = []           # layouts seen (a new one may bring new tensors)
        self._filling = 0                       # references are filled for this many more steps
        self._loss = None

    def check(self, ctx):
        t, lay = layout(ctx, self.own)
        p = self.params
        me = int(p["min_elements"])
        if t.n_slots > self.streaks.n:
            n = t.n_slots
            self.streaks.grow(n)
            self.early, self.early_n = fit(self.early, n, np.nan), fit(self.early_n, n, 0)
            self.ref, self.thr = fit(self.ref, n, np.nan), fit(self.thr, n, np.nan)
            self._thr_params = None
        e = _eligible(ctx, lay, me)
        if e.size == 0:
            return
        se = lay.derived(("grad_eligible_slots", me), lambda: lay.slots[e])
        g = lay.take(ctx, "grad", "norm")[e]
        if lay not in self._fill_layouts:     # new tensors may have come: look for 50 more steps
            self._fill_layouts = self._fill_layouts[-15:] + [lay]
            self._filling = _EARLY * 10
        if self._filling:            # the tensors' own references: medians of their first nonzero norms
            self._filling -= 1       # (a tensor without 5 nonzero norms in 50 steps goes without)
            self._fill(se, g)
        if self._thr_params != p:           # new references, or thresholds changed (rule set)
            self._thr_params = dict(p)
            self.thr = self._thresholds(self.ref)
        flags = self._flags(ctx, lay, e, g, se)
        st = self.streaks.update(se, flags, ctx.step, g)
        if st is None:
            return
        hit = np.flatnonzero(st >= int(p["steps"]))
        if hit.size == 0:
            return
        groups = lay.groups(ctx)
        for grp in dict.fromkeys(groups[e[hit]].tolist()):      # one finding per optimizer
            if grp in self.done_groups:
                continue
            self.done_groups.add(grp)
            same = [int(j) for j in hit if groups[e[j]] == grp]
            k = self._worst(same, g)
            others = [lay.names[e[j]] for j in same if j != k]
            yield self._report(ctx, lay, e, se, k, g, others)

    def check_block(self, block):
        t, lay = block.layout(self.own)
        p = self.params
        if self.streaks.active or self._filling or t.n_slots > self.streaks.n or lay not in self._fill_layouts:
            return None                  # (a streak runs, references are being learnt: step by step)
        me = int(p["min_elements"])
        e = _eligible(block.last, lay, me)
        if e.size == 0:
            return True
        g = block.take(lay, "grad", "norm")[:, e]
        if self._thr_params != p:
            self._thr_params = dict(p)
            self.thr = self._thresholds(self.ref)
        flags = self._flags_block(block, lay, e, g, lay.slots[e])
        es = _spread_eligible(block.last, lay, me)
        if flags is None or np.count_nonzero(flags) or \
                _spread_block(block, lay, es, float(p["spread"])):
            return None
        self.streaks.i += block.k       # (what Streaks.update does on a step with nothing flagged)
        return True

    def _flags_block(self, block, lay, e, g, se):
        """(steps, tensors) flags of ``_flags`` but the layer spread; None: judge step by step."""
        raise NotImplementedError

    def _fill(self, se, g) -> None:
        todo = self.early_n[se] < _EARLY
        if not np.count_nonzero(todo):
            self._filling = 0
            return
        fill = todo & (g > 0) & np.isfinite(g)
        if np.count_nonzero(fill):
            s = se[fill]
            self.early[s, self.early_n[s]] = g[fill]
            self.early_n[s] += 1
            done = s[self.early_n[s] == _EARLY]
            if done.size:
                self.ref[done] = np.median(self.early[done], axis=1)
                self._thr_params = None

    def _thresholds(self, ref: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _flags(self, ctx, lay, e, g, se) -> np.ndarray:
        raise NotImplementedError

    def _why(self, ctx, lay, e, g, k) -> tuple:
        """(criteria that hold for position ``k``, its group's layer spread or None)."""
        raise NotImplementedError

    def _worst(self, cand: list, g) -> int:
        raise NotImplementedError

    def _report(self, ctx, lay, e, se, k, g, others):
        slot, name, ref = se[k], lay.names[e[k]], float(self.ref[se[k]])
        reasons, sp = self._why(ctx, lay, e, g, k)
        since = int(self.streaks.since[slot])
        ev = {"grad_norm": num(g[k]), "early_median": num(ref),
              "ratio_to_early": num(g[k] / ref) if ref > 0 else None, "criteria": reasons,
              "steps": [since, ctx.step], "recent_norms": self.streaks.recent(slot)}
        if sp is not None:
            ev["layer_spread"] = {"ratio": sp[0], "largest": lay.names[sp[1]], "largest_rms": sp[3],
                                  "smallest": lay.names[sp[2]], "smallest_rms": sp[4]}
        if self._loss is not None:
            ev["loss"], ev["early_loss"] = self._loss
        ev["also"] = others
        p = self.params
        said = {"relative": f"{fmt(g[k] / ref)}x its early median {fmt(ref)}" if ref > 0 else "",
                "absolute": (f"above {p['ceiling']:g}" if self.direction == "exploding" else f"below {p['floor']:g}"),
                "inf": "holds Inf",
                "cross_layer": (f"{fmt(sp[0])}x between the RMS gradients of {lay.names[sp[1]]} and "
                                f"{lay.names[sp[2]]}" if sp is not None else "")}
        detail = "; ".join(s for s in (said[r] for r in reasons) if s)
        msg = (f"{self.direction} gradient in {name}: norm {fmt(g[k])} at step {ctx.step} ({detail}), "
               f"for {p['steps']:g} recorded steps in a row since step {since}{also(others)}")
        return self.finding(ctx, msg, tensor=name, **ev)

    def _cross(self, ctx, lay, e, g, earlier: str):
        """Flags of the tensors that make their optimizer's layer spread too
        wide: the largest (``earlier`` = "largest") or smallest RMS gradient,
        when it is in the earlier layer of the two; None if none."""
        spread = _spread(ctx, lay, int(self.params["min_elements"]), float(self.params["spread"]))
        cross = None
        for key, (_, hi, lo, _, rms_lo) in spread.items():
            if earlier == "smallest" and not self._adaptive_starves(ctx, key, rms_lo):
                continue
            if (hi < lo) == (earlier == "largest"):
                cross = np.zeros(e.size, dtype=bool) if cross is None else cross
                cross[np.searchsorted(e, hi if earlier == "largest" else lo)] = True
        return cross

    def _adaptive_starves(self, ctx, key: int, rms_lo: float) -> bool:
        """May a layer spread of optimizer ``key`` hold back its smallest
        gradient's updates?  Under SGD it does (the update is lr x gradient);
        under Adam's family the update is normalised element by element, and a
        gradient 1000x below another's moves its weights about as much, until
        its RMS falls to the optimizer's eps (``eps_margin`` x eps)."""
        opts = ctx.optimizers
        if key < 0 or key >= len(opts):
            return True
        eps = adaptive_eps(opts[key][1])
        return eps is None or rms_lo < float(self.params.get("eps_margin", 1)) * eps

    def _group_spread(self, ctx, lay, e, k):
        spread = _spread(ctx, lay, int(self.params["min_elements"]), float(self.params["spread"]))
        return spread.get(int(lay.groups(ctx)[e[k]]))


class ExplodingGradient(_Gradients):
    id = "exploding_gradient"
    severity = "warning"
    explanation = ("a weight's gradient norm keeps growing out of range: far above its own early value, above "
                   "an absolute ceiling, Inf, or far above the other layers' gradients (early layers largest); "
                   "under clip_grad_norm_, the total norm it returns (the gradients before clipping: where "
                   "it clipped, total above max_norm, the gradients the optimizer applies do not show it), "
                   "judged by the same thresholds (not a total of gradients a GradScaler had not unscaled: "
                   "the loss scale's, clip_before_unscale's)")
    direction = "exploding"
    THRESHOLDS = {
        "relative": Threshold(1e4, "x the median of the tensor's first 5 recorded gradient norms: four orders "
                                   "of magnitude; healthy examples grow at most ~200x (a GAN's generator, whose "
                                   "gradients start near 0 while the discriminator is untrained)"),
        "min_norm": Threshold(1.0, "and at least this norm for the relative and the layer-spread tests: a "
                                   "gradient below the usual clipping norm (clip_grad_norm_ max_norm=1) is not "
                                   "exploding, however small it started (zero-initialised heads start from ~0) "
                                   "or however far below it another layer's is (PPO's actor tower, its head "
                                   "scaled 0.01, beside its critic's: 1.9e4x, at 0.08 under clipping to 0.5)"),
        "ceiling": Threshold(1e3, "absolute gradient norm of one tensor: 100-1000x the usual clipping norms "
                                  "(1 for transformers, 5-10 for RNNs: Pascanu et al. 2013, 'On the difficulty "
                                  "of training recurrent neural networks'); healthy examples peak at ~10.  Not "
                                  "under Adam's family, whose updates do not scale with the gradient: a loss "
                                  "weighted by a constant (fast_neural_style's style_weight 1e10) has gradients "
                                  "of 1e5 that shrink as it trains"),
        "spread": Threshold(1e3, "ratio of the largest to the smallest RMS weight gradient within one "
                                 "optimizer, when the largest is in the earlier layer (backprop multiplies the "
                                 "gradient up on its way to the input); healthy examples stay below ~150"),
        "min_elements": MIN_ELEMENTS,
        "steps": _STEPS,
    }

    # -- under clipping: clip_grad_norm_'s total norm (schema.CLIP_SERIES) -----------------
    # The gradients recorded are those the optimizer applies, after clipping: a gradient
    # growing out of range under clip_grad_norm_ shows only in the total norm it returns.
    # Judged as a weight's norm is: against the median of its first 5 nonzero values
    # (``relative``, at least ``min_norm``), the ``ceiling`` (not under Adam's family),
    # Inf (a NaN total is not judged: nonfinite's); ``steps`` flagged recorded steps in a
    # row report it, once per series.  The
    # finding says whether the call clipped (total > its max_norm: StepRecord.clips, the
    # trace's ``clips`` rows); a call that measured gradients a GradScaler had not unscaled
    # (the loss scale times theirs) is not judged.

    def reset(self):
        super().reset()
        self.clips: dict = {}        # series name -> {"early", "ref", "run", "since", "recent", "done"}
        # id of a step's names list -> (that list, [(row, name)] of its clip series): the recorder
        # reuses a list per set of series, and two alternate (the observed steps' and the others')
        self._clip_at: dict = {}

    def check(self, ctx):
        yield from super().check(ctx)
        rows = self._clip_rows(ctx.names)
        if rows:
            yield from self._check_clips(ctx, rows)

    def check_block(self, block):
        rows = self._clip_rows(block.names)
        if rows and not self._clips_quiet(block, rows):
            return None              # (judged step by step: nothing changed yet)
        return super().check_block(block)

    def _clip_rows(self, names) -> list:
        got = self._clip_at.get(id(names))
        if got is None or got[0] is not names:
            if len(self._clip_at) >= 16:
                self._clip_at.clear()
            got = self._clip_at[id(names)] = (names, [(i, n) for i, (n, k) in enumerate(names)
                                                      if k == "grad" and n.startswith(CLIP_SERIES)])
        return got[1]

    def _clip_limit(self, c: dict, adaptive: bool) -> float:
        p = self.params
        rel = max(p["relative"] * c["ref"], p["min_norm"]) if c["ref"] is not None else math.inf
        return rel if adaptive else min(rel, p["ceiling"])

    def _clips_adaptive(self, ctx) -> bool:
        """Every optimizer of Adam's family (no absolute ceiling then)."""
        opts = ctx.optimizers
        return bool(opts) and all(adaptive_eps(o) is not None for _, o in opts)

    def _clips_quiet(self, block, rows) -> bool:
        """Nothing to do for the clip series over the block: references known, no streak
        running, no value flagged (``check`` on each step would change nothing).  (A block
        is a live run's: its records' raw rows.)"""
        adaptive = self._clips_adaptive(block.last)
        for i, name in rows:
            c = self.clips.get(name)
            if c is None:
                return False         # (its first step: learnt step by step)
            if c["done"]:
                continue
            if c["run"] or c["ref"] is None:
                return False
            for r in block.records:
                v = scalar_of(r.raw[i])
                if v is None or not (v < self._clip_limit(c, adaptive) or math.isnan(v)):
                    return False
        return True

    def _check_clips(self, ctx, rows):
        p = self.params
        adaptive = None
        for i, name in rows:
            c = self.clips.setdefault(name, {"early": [], "ref": None, "run": 0, "since": None,
                                              "recent": [], "done": False})
            if c["done"]:
                continue
            limit, scaled = (getattr(ctx.record, "clips", None) or {}).get(name, (None, False))
            if scaled:
                continue                     # (the loss scale times the norm: clip_before_unscale's)
            v = abs(ctx.mean_of(i))          # (the one value: NaN, or Inf, as it was)
            if math.isnan(v):
                # A gradient that holds NaN: nonfinite's incident, no exploding one (its total
                # is NaN from then on: 'exploding gradient before clipping ... total norm of nan
                # (holds NaN) ... it clipped them to max_norm 0.5' came after nonfinite's
                # 'NaN first appeared in loss' on every run that clipped; clipping by a NaN
                # total clips nothing, it makes every gradient NaN).  Not judged, as a weight's
                # NaN gradient norm is not.
                continue
            if c["ref"] is None and math.isfinite(v) and v > 0:
                c["early"].append(v)
                if len(c["early"]) == _EARLY:
                    c["ref"] = float(np.median(c["early"]))
            if adaptive is None:
                adaptive = self._clips_adaptive(ctx)
            if v < self._clip_limit(c, adaptive):
                c["run"], c["since"], c["recent"] = 0, None, []
                continue
            c["run"] += 1
            c["since"] = ctx.step if c["since"] is None else c["since"]
            c["recent"] = (c["recent"] + [[ctx.step, num(v)]])[-int(p["steps"]):]
            if c["run"] < int(p["steps"]):
                continue
            c["done"] = True
            ref = c["ref"]
            if not math.isfinite(v):
                why, criteria = "is Inf", ["inf"]
            elif ref is not None and v > p["relative"] * ref:
                why, criteria = f"{fmt(v / ref)}x its early median {fmt(ref)}", ["relative"]
            else:
                why, criteria = f"above {p['ceiling']:g}", ["absolute"]
            # (whether it clipped: total > max_norm, known live; a trace does not keep max_norm)
            clipped = None if limit is None else not v <= limit
            if clipped:
                what = ("exploding gradient before clipping", f"it clipped them to max_norm {limit:g}, so the "
                        f"norms of the gradients the optimizer applies do not show it")
            elif clipped is None:
                what = ("exploding gradient", "that is the gradients' norm before clipping, which the gradients "
                        "recorded at the optimizer's step do not show where it clipped them")
            else:
                what = ("exploding gradient", f"it did not clip them (max_norm {limit:g}): the optimizer "
                        f"applies them as they are")
            yield self.finding(
                ctx, f"{what[0]}: {name} returned a total norm of {fmt(v)} at step "
                     f"{ctx.step} ({why}), for {p['steps']:g} recorded steps in a row since step {c['since']}; "
                     f"{what[1]}",
                tensor=name, grad_norm=num(v), early_median=num(ref) if ref is not None else None,
                ratio_to_early=num(v / ref) if ref else None, criteria=criteria,
                steps=[c["since"], ctx.step], recent_norms=c["recent"], before_clipping=True, max_norm=limit,
                clipped=clipped, also=[])

    def _thresholds(self, ref):
        p = self.params
        rel = np.fmax(p["relative"] * ref, p["min_norm"])          # NaN (no reference yet) -> min_norm
        # (under Adam's family: the relative test alone, none while the reference is unknown)
        self.thr_adaptive = np.where(np.isnan(ref), np.inf, rel)
        return np.where(np.isnan(ref), p["ceiling"], np.fmin(rel, p["ceiling"]))

    def _limits(self, ctx, lay, e, se):
        """The norm above which each eligible tensor is flagged: its threshold, and without
        the absolute ceiling where an optimizer of Adam's family holds it."""
        adaptive = self._adaptive(ctx, lay, e)
        return np.where(adaptive, self.thr_adaptive[se], self.thr[se]) if adaptive.any() else self.thr[se]

    def _adaptive(self, ctx, lay, e):
        def compute():
            opts, groups = ctx.optimizers, lay.groups(ctx)
            fam = [adaptive_eps(o) is not None for _, o in opts]
            return np.array([0 <= k < len(fam) and fam[k] for k in groups[e]], dtype=bool)
        return lay.derived(("grad_adaptive", e.size, len(ctx.optimizers)), compute)

    def _flags(self, ctx, lay, e, g, se):
        flags = g > self._limits(ctx, lay, e, se)
        if lay.any_nonzero(ctx, "inf_count"):
            flags |= lay.take(ctx, "grad", "inf_count")[e] > 0
        cross = self._cross(ctx, lay, e, g, "largest")
        # (the largest gradient of a spread is exploding only at min_norm or above, as for the
        # relative test: PPO's critic head, 0.08 under clip_grad_norm_(0.5), is 1.9e4x its actor's
        # hidden layer, damped by the actor's 0.01-scaled head, in another tower)
        return flags if cross is None else flags | (cross & (g >= self.params["min_norm"]))

    def _flags_block(self, block, lay, e, g, se):
        return (g > self._limits(block.last, lay, e, se)) | (block.take(lay, "grad", "inf_count")[:, e] > 0)

    def _why(self, ctx, lay, e, g, k):
        p, ref = self.params, float(self.ref[lay.slots[e[k]]])
        sp = self._group_spread(ctx, lay, e, k)
        inf = lay.take(ctx, "grad", "inf_count")[e[k]] > 0
        reasons = [w for w, holds in (
            ("relative", ref > 0 and g[k] > p["relative"] * ref and g[k] >= p["min_norm"]),
            ("absolute", g[k] > p["ceiling"] and not self._adaptive(ctx, lay, e)[k]), ("inf", inf),
            ("cross_layer", sp is not None and sp[1] == e[k] and g[k] >= p["min_norm"])) if holds]
        return reasons, sp

    def _worst(self, cand, g):
        return max(cand, key=lambda j: (g[j] if math.isfinite(g[j]) else math.inf))


class VanishingGradient(_Gradients):
    id = "vanishing_gradient"
    severity = "warning"
    explanation = ("a weight's gradient norm shrinks to almost nothing while the loss is still high, or is "
                   "orders of magnitude below the later layers' gradients (under Adam's family, whose updates "
                   "do not scale with the gradient, only once it nears the optimizer's eps)")
    direction = "vanishing"
    THRESHOLDS = {
        "relative": Threshold(1e-3, "x the median of the tensor's first 5 recorded gradient norms (while the "
                                    "loss is still high): three orders of magnitude; healthy examples shrink "
                                    "at most ~70x, and then because their loss went down"),
        "floor": Threshold(1e-7, "absolute gradient norm of one weight tensor (while the loss is still high): "
                                 "about float32's relative precision, so lr * grad no longer changes weights of "
                                 "order 1; healthy examples stay above 1e-2"),
        "loss_drop": Threshold(0.5, "the loss is 'still high' while it has come down by less than this share "
                                    "of its early level (median of its first 5 recorded values)"),
        "spread": Threshold(1e3, "ratio of the largest to the smallest RMS weight gradient within one "
                                 "optimizer, when the smallest is in the earlier layer (saturating "
                                 "activations, tiny init); healthy examples stay below ~150 (a transformer's "
                                 "embeddings vs its head)"),
        "eps_margin": Threshold(1.0, "under Adam's family (per-element normalised updates) the layer spread "
                                     "counts only while the smallest RMS gradient is below this x the "
                                     "optimizer's eps, where its steps shrink to half of lr and less: above "
                                     "it, a gradient 1000x below another's still moves its weights about as "
                                     "much (word_language_model's LSTM under Adam: a spread of 1.2e3 at an RMS "
                                     "gradient of 2.8e-7, 28x eps, the loss falling)"),
        "min_elements": MIN_ELEMENTS,
        "steps": _STEPS,
    }

    def reset(self):
        super().reset()
        self.loss_ref: dict = {}                # loss name -> first values, then their median

    def _loss_high(self, ctx, lay):
        """Has some loss come down by less than ``loss_drop`` of its early level?"""
        if lay.loss_rows.size == 0:
            return None
        vals = [ctx.mean_of(i) for i in lay.loss_rows.tolist()]
        out = None
        for name, v in zip(lay.loss_names, vals):
            if not math.isfinite(v):
                continue
            ref = self.loss_ref.setdefault(name, [])
            if len(ref) < _EARLY:
                ref.append(v)
                early = float(np.median(ref))
                if len(ref) == _EARLY:
                    ref.append(early)            # the median, once known
            else:
                early = ref[-1]
            if early - v < float(self.params["loss_drop"]) * abs(early):
                out = (v, early)
        return out

    def _loss_high_block(self, block, lay):
        """(steps,) bool: ``_loss_high`` of each step, and its value at the last
        one; None while a loss's early level is still being learnt or a loss
        has no finite element (step by step)."""
        k = block.k
        if lay.loss_rows.size == 0:
            return np.zeros(k, dtype=bool), None
        refs = [self.loss_ref.get(name) for name in lay.loss_names]
        if any(r is None or len(r) <= _EARLY for r in refs):
            return None
        v = block.loss_means(lay)
        if v is None:
            return None
        early = np.array([r[-1] for r in refs])
        with np.errstate(all="ignore"):
            high = np.isfinite(v) & (early - v < float(self.params["loss_drop"]) * np.abs(early))
        last = None
        for j in np.flatnonzero(high[-1]).tolist():
            last = (float(v[-1, j]), float(early[j]))
        return high.any(axis=1), last

    def _flags_block(self, block, lay, e, g, se):
        loss = self._loss_high_block(block, lay)
        if loss is None:
            return None
        high, self._loss = loss
        return (g < self.thr[se]) & (g > 0) & high[:, None]

    def _thresholds(self, ref):
        p = self.params
        return np.where(np.isnan(ref), p["floor"], np.fmax(p["relative"] * ref, p["floor"]))

    def _flags(self, ctx, lay, e, g, se):
        self._loss = self._loss_high(ctx, lay)
        flags = ((g < self.thr[se]) & (g > 0)) if self._loss is not None else None
        cross = self._cross(ctx, lay, e, g, "smallest")
        if flags is None:
            return cross if cross is not None else np.zeros(e.size, dtype=bool)
        return flags if cross is None else flags | cross

    def _why(self, ctx, lay, e, g, k):
        p, ref = self.params, float(self.ref[lay.slots[e[k]]])
        sp = self._group_spread(ctx, lay, e, k)
        high = self._loss is not None and g[k] > 0
        reasons = [w for w, holds in (
            ("relative", high and ref > 0 and g[k] < p["relative"] * ref), ("absolute", high and g[k] < p["floor"]),
            ("cross_layer", sp is not None and sp[2] == e[k])) if holds]
        return reasons, sp

    def _worst(self, cand, g):
        return min(cand)           # the earliest layer: the farthest from the loss


# Where a layer's weight is, under the names a model gives it: plain, pruned (torch.nn.utils.prune) or
# under the old spectral_norm (weight_orig), the old weight_norm's two tensors, parametrized
# (weight_norm's two tensors, spectral_norm's, orthogonal's).
_WEIGHT_NAMES = ("weight", "weight_orig", "weight_g", "weight_v", "parametrizations.weight.original",
                 "parametrizations.weight.original0", "parametrizations.weight.original1")


def _ignored_biases(lay, has: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Of ``g`` (steps x the positions in ``has``: gradient norms), the biases whose gradient
    is exactly 0 while their layer's weight's is not 0 at that step.  A bias's gradient is
    the sum over the batch of its layer's output gradients, the weight's those gradients
    times the inputs: a weight's gradient other than 0 means the gradients reached the layer
    (no dead unit, no zero factor after it) and summed to exactly 0: the loss does not depend
    on the bias (a WGAN critic's last bias under D(fake).mean() - D(real).mean()), which is
    no training bug.  (nndb check's gradients check leaves them alone for the same reason.)"""
    def compute():
        """(the biases' columns, their weights' columns one after the other, where each
        bias's weights start in them): one weight or more a bias (weight_g and weight_v)."""
        pos = np.flatnonzero(has)
        at = {lay.names[k]: j for j, k in enumerate(pos)}
        biases, weights, starts = [], [], []
        for j, k in enumerate(pos):
            name = lay.names[k]
            if name == "bias" or name.endswith(".bias"):
                stem = name[:-len("bias")]
                w = [at[stem + n] for n in _WEIGHT_NAMES if stem + n in at]
                if w:
                    biases.append(j)
                    starts.append(len(weights))
                    weights.extend(w)
        return np.array(biases, dtype=np.int64), np.array(weights, dtype=np.int64), np.array(starts, dtype=np.int64)
    out = np.zeros(g.shape, dtype=bool)
    biases, weights, starts = lay.derived(("weight_of_bias", has.tobytes()), compute)
    if biases.size:              # (all biases at once: a weight's gradient other than 0, any of a bias's weights)
        out[:, biases] = (g[:, biases] == 0) & np.logical_or.reduceat(np.abs(g[:, weights]) > 0, starts, axis=1)
    return out


class ZeroGradients(Rule):
    id = "zero_gradients"
    severity = "error"
    explanation = ("every gradient is exactly 0, step after step: nothing learns (a constant loss such as a "
                   "cross-entropy over a single class, a loss that does not depend on the parameters); or some "
                   "tensors' gradients are, while others' are not: those learn nothing (a layer pruned or "
                   "masked to zero, everything after it cut off by a zero weight or a factor 0); a bias whose layer's "
                   "weight has a gradient is left alone: the loss does not depend on it (a WGAN critic's last "
                   "bias)")
    THRESHOLDS = {
        "steps": Threshold(10, "consecutive recorded steps on which every gradient recorded, or one tensor's "
                               "whole gradient, is exactly 0: a healthy run has no such step (a ReLU net whose "
                               "units all died is dead_relu's first, and this one's when it stays so; a branch "
                               "initialised to give no gradient, ReZero's gate or LoRA's B = 0, has one at "
                               "its first step only)"),
    }
    EVERY_STEP = True               # (the gradient norms are recorded on every step)

    def reset(self):
        self.own = Tensors()
        self.run = 0                   # recorded steps in a row with every gradient exactly 0
        self.since = None
        self.losses: list = []         # the loss of each of those steps (one loss) while they run
        self.classes = None            # the class count a classification loss was called with, if seen
        self.done = False
        # a tensor whose gradient has been exactly 0 at every step so far while others' are not:
        # slot -> steps in a row; the slots told; those that ever had a gradient other than 0
        # (a task head used now and then, its .grad zeroed in place between: left to grad_none's
        # reading of gaps)
        self.zeros = Streaks(1)
        self.told = np.zeros(0, dtype=bool)
        self.ever = np.zeros(0, dtype=bool)

    def _zero(self, g: np.ndarray) -> bool:
        return g.size > 0 and not np.count_nonzero(g)

    def check_block(self, block):
        if self.done:
            return True
        t, lay = block.layout(self.own)
        has = lay.g >= 0
        g = block.take(lay, "grad", "norm")[:, has]
        if self.zeros.active or t.n_slots > self.zeros.n:
            return None
        zero = (g == 0) & ~_ignored_biases(lay, has, g)
        slots = lay.slots[has]
        if np.count_nonzero(zero) and np.count_nonzero(zero & ~(self.told[slots] | self.ever[slots])):
            return None            # (a tensor's gradient 0 from its start, not told yet: judged step by step)
        if g.shape[1] == 0 or not zero.all(axis=1).any():
            self.run, self.since, self.losses = 0, None, []
            self.zeros.i += block.k            # (what Streaks.update does on a step with nothing flagged)
            self.ever[slots] |= (~zero).any(axis=0)
            return True
        return None

    def check(self, ctx):
        if self.done:
            return
        # (the loss probe's facts, on its steps: the first ones)
        for f in ctx.facts.get("loss_inputs", {}).get("calls", {}).values():
            first = f.get("first_loss")
            n = f.get("classes") if f.get("classes") is not None else first[1] if first else None
            if n is not None:
                self.classes = int(n)
        t, lay = layout(ctx, self.own)
        has = lay.g >= 0
        norms = lay.take(ctx, "grad", "norm")
        g = norms[has]
        zero = None
        if g.size and np.count_nonzero(g):
            zero = has & (norms == 0)
            zero[has] &= ~_ignored_biases(lay, has, g[None, :])[0]
        yield from self._tensors(ctx, t, lay, zero)
        self.ever[lay.slots[has]] |= g != 0
        if not self._zero(g):
            self.run, self.since, self.losses = 0, None, []
            return
        self.run += 1
        if self.since is None:
            self.since = ctx.step
        if lay.loss_rows.size == 1:
            self.losses.append(ctx.mean_of(int(lay.loss_rows[0])))
        if self.run < int(self.params["steps"]):
            return
        self.done = True
        cause, constant = "", None
        if len(self.losses) == self.run and len(set(self.losses)) == 1:
            constant = self.losses[0]
            cause = f"; the loss is exactly {constant + 0.0:.6g} at every one of them: a constant loss has no gradient"
            if self.classes == 1:
                cause += (" (the classification loss is over a single class: cross-entropy of one logit is 0 "
                          "whatever the model outputs; more than one class, or a loss for one output such as "
                          "BCEWithLogitsLoss or MSELoss)")
        elif self.classes == 1:
            cause = "; the classification loss is over a single class: cross-entropy of one logit is 0"
        yield self.finding(
            ctx, f"every gradient ({g.size} tensor(s)) has been exactly 0 for {self.run} recorded steps in a row "
                 f"since step {self.since}: nothing learns{cause}",
            tensors=int(g.size), steps=[self.since, ctx.step], constant_loss=constant, classes=self.classes)

    def _tensors(self, ctx, t, lay, zero):
        """Some tensors' whole gradients exactly 0 while others' are not (``zero``: layout
        positions; None: none, or every one, the finding above), at every step since their
        first, ``steps`` in a row: each told once, those of a step in one finding."""
        if t.n_slots > self.zeros.n:
            self.zeros.grow(t.n_slots)
            self.told, self.ever = fit(self.told, t.n_slots, False), fit(self.ever, t.n_slots, False)
        flags = zero & ~(self.told[lay.slots] | self.ever[lay.slots]) if zero is not None \
            else np.zeros(len(lay.names), dtype=bool)
        st = self.zeros.update(lay.slots, flags, ctx.step)
        if st is None:
            return
        new = np.flatnonzero(st == int(self.params["steps"]))
        if not new.size:
            return
        self.told[lay.slots[new]] = True
        names = [lay.names[k] for k in new]
        since = int(self.zeros.since[lay.slots[new[0]]])
        learning = int(np.count_nonzero(lay.take(ctx, "grad", "norm")[lay.g >= 0]))
        yield self.finding(
            ctx, f"{names[0]}'s gradient has been exactly 0 for {self.params['steps']:g} recorded steps in a row "
                 f"since step {since}, while {learning} other tensor(s) have gradients: it learns nothing "
                 f"(pruned or masked to zero, or cut off after it: ReLUs dead for every sample, a zero "
                 f"weight, a factor 0){also(names[1:])}",
            tensor=names[0], steps=[since, ctx.step], also=names[1:])
