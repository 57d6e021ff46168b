"""Rules over the recorded statistics (they also run on a trace, nndb.rules.offline; the
gradient, update and not-updated rules read the optimizers too, which traces keep since they
were recorded):
non-finite values, exploding and vanishing gradients, the update/weight ratio,
parameters that are not updated, a loss that does not go down; and, through a
small probe of the BatchNorm buffers (nndb.rules.bn_probe), running statistics
out of range.

They run on the observed steps (nonfinite and loss_not_decreasing on every
recorded step; nndb.rules.base), so they read whole columns of the step
(``ctx.col``) through index arrays built once per list of series
(nndb.rules.series), and keep per-tensor history in numpy arrays indexed by a
slot fixed for the run: no Python loop over the series of a step, and on a
step where nothing is suspicious a handful of numpy calls per rule.

Why this size: it is one family, the rules that read nothing but the
recorded statistics of the parameters and the loss, and they share the
layout and streak machinery of nndb.rules.series; split, each part would
import the same helpers and the catalogue would list two homes for one kind.

What the recording gives them (nndb.tracer.recorder): ``count``, ``norm``,
``nan_count`` and ``inf_count`` on every recorded step (the loss: all ten);
the rest at full steps; a parameter an optimizer holds has
``param``, ``grad`` and ``update`` rows, one no optimizer holds only ``param``
and ``grad``; a frozen parameter (no ``.grad``) has no ``grad`` row.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Optional

import numpy as np

from ..cadence import observed
from ..schema import CLIP_SERIES, series_label
from ..text import fmt
from .base import Rule, Threshold
from .bn_probe import BatchNormStats
from .gradient_norms import ExplodingGradient, VanishingGradient, ZeroGradients
from .series import (MIN_ELEMENTS, MULTI_ITERATION, Restarts, Streaks, Tensors, also, block_medians, by_group, family, fit,
                     layout, learn_live_share, live_share, lr_number, num, optimizer_lr, theil_sen, trains_nothing)

KIND_ORDER = ("act", "loss", "grad", "param", "update")     # the order a step produces them


class NonFinite(Rule):
    id = "nonfinite"
    severity = "error"
    explanation = ("NaN or Inf in an activation, the loss, a gradient or a parameter; says where it appeared "
                   "first (once per incident: what a NaN spreads to on later steps is not reported again; in a "
                   "step of several optimizers' passes, an activation summed over them and the first "
                   "optimizer's loss, both bad, are named both: which came first is not known)")

    EVERY_STEP = True
    ROW_ORDER = True        # (on a trace: it names the first tensor in the step's recording order)

    def reset(self):
        self._prev = None              # (step, names, context) of the previous recorded step, if it was clean
        self._bad_before = False       # the previous recorded step already held a NaN/Inf
        self._first = True             # no recorded step seen yet

    def resumed(self):
        self._prev, self._bad_before, self._first = None, False, False

    def check_block(self, block):
        if block.any_nonfinite():
            return None
        c = block.last
        self._prev, self._bad_before, self._first = (c.step, c.names, c), False, False
        return True

    def check(self, ctx):
        first, self._first = self._first, False
        if not ctx.nonfinite:
            self._prev, self._bad_before = (ctx.step, ctx.names, ctx), False
            return
        nan, inf = ctx.col("nan_count"), ctx.col("inf_count")
        prev, self._prev = self._prev, None
        was_bad, self._bad_before = self._bad_before, True
        if was_bad:                    # the same incident going on: NaN spreads to everything
            return
        bad = np.flatnonzero((nan > 0) | (inf > 0)).tolist()
        # The first tensor in the order the step produced them: forward
        # (activations in call order), loss, backward (gradients, last layer
        # first), the update (parameters, then updates).
        names = ctx.names

        def order(j):
            kind = names[j][1]
            rank = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
            return rank, (-j if kind == "grad" else j)
        i = min(bad, key=order)
        name, kind = names[i]
        n_nan, n_inf = float(nan[i]), float(inf[i])
        what = " and ".join(w for w, n in (("NaN", n_nan), ("Inf", n_inf)) if n > 0)
        by_kind: dict = {}
        for j in bad:
            by_kind[names[j][1]] = by_kind.get(names[j][1], 0) + 1
        evidence = {"kind": kind, "nan_count": num(n_nan), "inf_count": num(n_inf),
                    "elements": num(ctx.col("count")[i]), "nonfinite_tensors": by_kind}
        msg = f"{what} first appeared in {series_label(name, kind)} ({int(n_nan + n_inf)} element(s))"
        if prev is not None and (name, kind) in prev[1]:
            before = float(prev[2].col("norm")[prev[1].index((name, kind))])
            evidence["previous_step"], evidence["previous_norm"] = prev[0], num(before)
            msg += f"; its norm at step {prev[0]} was {fmt(before)}"
        losses = [j for j, (_, k) in enumerate(names) if k == "loss"]
        if kind == "act" and len(losses) > 1 and losses[0] in bad:
            # Several optimizers' passes one after the other (a GAN's generator, then its
            # discriminator), each activation summed over them: the first optimizer's loss
            # went bad, and the activation may have only in a later pass, through parameters
            # that loss's update made NaN (a NaN generator loss read 'NaN first appeared in
            # act D.0', the discriminator's first layer on the fake batch of its own pass).
            lead = names[losses[0]][0]
            evidence["or_loss"] = lead
            msg += (f"; or in {series_label(lead, 'loss')}: the step ran {len(losses)} optimizers' passes in turn "
                    f"and an activation's statistics add up over them, so whether it went bad before that loss "
                    f"is not known ('catch nan' replays the step to find the operation)")
        if kind == "grad" and not ({"act", "loss"} & set(by_kind)) and \
                "DistributedDataParallel" in set(ctx.module_types.values()):
            # (a rank of a DDP job whose own forward and loss were finite: the gradients' all-reduce
            # brings one rank's NaN into every rank's gradients; it read as this rank's own)
            evidence["all_reduce"] = True
            msg += (f"; this rank's forward and loss were finite: under DDP the gradients' all-reduce brings "
                    f"another rank's {what} into every rank's gradients (that rank's finding says where it "
                    f"began; 'catch nan' names the collective here), unless this rank's backward made it")
        # Steps not recorded right before this one (--every, --steps) may have held it first:
        # 'first appeared' is then only among the recorded steps, and the message says so.
        gap = (prev[0] + 1, ctx.step - 1) if prev is not None else (0, ctx.step - 1) if first else None
        if gap is not None and gap[0] <= gap[1]:
            evidence["not_recorded"] = list(gap)
            steps = f"step {gap[0]} was" if gap[0] == gap[1] else f"steps {gap[0]}-{gap[1]} were"
            msg += f" ({steps} not recorded (--every, --steps): it may have appeared there)"
        yield self.finding(ctx, msg, tensor=name, **evidence)


class UpdateRatio(Rule):
    id = "update_ratio"
    severity = "warning"
    explanation = ("the update / weight norm ratio of a weight tensor stays far from ~1e-3: the learning rate "
                   "is far too high (weights rewritten every step) or far too low (nothing moves); not judged "
                   "under LBFGS, whose one step() is many curvature-scaled iterations")
    THRESHOLDS = {
        "high": Threshold(0.2, "update norm / weight norm above this: CS231n ('Neural Networks Part 3', "
                               "Karpathy) puts a healthy ratio around 1e-3; 0.2 is 200x that, and above what "
                               "the healthy examples (Adam at lr 5e-2 on a small head included) reach after "
                               "their first steps (~0.15)"),
        "rewrite": Threshold(0.9, "update norm / weight norm (the weight after the update) at or above this at "
                                  "any step, the first included, and at once: the update is about as large as "
                                  "the weight itself, which it rewrites in one step (a run at SGD lr 5000 dies "
                                  "of overflow in 6 steps, sooner than warmup and steps allow); a tensor that "
                                  "grew from exactly 0 is left out"),
        "low": Threshold(1e-6, "below this: 1000x under 1e-3, about float32's resolution of the weights "
                               "(an update this small is mostly rounded away); not where the ratio is low "
                               "only because a schedule annealed the learning rate from its peak (ratio x "
                               "the optimizer's highest lr so far / its lr now at or above this: the last "
                               "steps of a cosine or OneCycle schedule, whose lr ends near 0, where a "
                               "healthy 1000-step run reaches 1e-7), nor where the update moves only the "
                               "rows of a table that the batch used (an embedding's: the ratio over the "
                               "entries the gradient reaches, its share of nonzero entries at the last full "
                               "step, at or above this; a "
                               "500,000-row sparse table under SparseAdam at lr 1e-4 read 4e-7 over the "
                               "whole table, 5e-5 over its rows)"),
        "warmup": Threshold(3, "first recorded steps of each weight's updates not judged (a later training "
                               "stage's optimizer starts its own): Adam's first steps are ~lr per element "
                               "whatever the gradient, and the ratio starts high for every tensor; the low "
                               "side is also not judged while an optimizer's learning rate is still rising "
                               "(an LR warmup)"),
        "peer": Threshold(100, "times 'low': a weight at the same learning rate whose ratio is at least this "
                               "(1e-4 at the defaults), and at most 'high', at the step a low ratio is reported "
                               "shows that the learning rate moves weights: the low one gets too little gradient "
                               "(a spatial transformer's localization net behind its last layer, initialised to "
                               "0 for the identity transform, read 1e-7 while the classifier read 5e-4 at SGD lr "
                               "0.01), and the finding says so, not that the learning rate is far too low"),
        "min_elements": MIN_ELEMENTS,
        "steps": Threshold(3, "consecutive recorded steps beyond the threshold"),
        "trend_steps": Threshold(30, "recorded losses whose trend qualifies a high ratio: going down steadily "
                                     "(Sen's 95% bound on the Theil-Sen slope below 0) makes it an info finding "
                                     "(high learning rate, clipped, training: the recipe of a recurrent LM at "
                                     "SGD lr 20 with clipping 0.25); rising or oscillating, the rule's severity"),
    }
    EVERY_STEP = True            # (the norms are recorded on every step)
    # Losses needed before a high ratio is reported while the loss neither falls
    # nor rises clearly (the first six steps' losses are often just noise).
    TREND_MIN = 10
    # On a trace (nndb.rules.offline) it runs where the trace records the optimizers.
    READS_OPTIMIZERS = "which optimizer holds each parameter, its learning rate, and the parameters' shapes"

    def reset(self):
        self.own = Tensors()
        self.streaks = Streaks(int(self.params["steps"]))
        self.zero_init = np.zeros(0, dtype=bool)   # slot -> its first update was all of it (grew from 0)
        self.seen = np.zeros(0, dtype=bool)        # slot -> a first nonzero update was seen
        self.said = np.zeros(0, dtype=bool)        # slot -> reported (its streak may go on)
        self.peak = np.zeros((0, 2))               # slot -> (largest ratio above ``high``, its step); 0: none
        self.first = np.zeros(0, dtype=np.int64)   # slot -> the recorded step (1, 2 ...) of its first update; 0: none yet
        self._rewrites: set = set()                # optimizers (layout groups) whose rewriting update was reported
        self._detect = (None, 0)                   # (layout, steps left) while first updates are awaited
        self._lr = None
        self._peak_lr: dict = {}                   # optimizer name -> its highest learning rate so far
        self._steps = 0                            # recorded steps seen
        self._losses = np.full(max(int(self.params["trend_steps"]), 6), np.nan)   # ring of the last losses

    def _warming(self, ctx) -> bool:
        """Has an optimizer's learning rate gone up since the last time asked (an LR warmup)?"""
        lrs = optimizer_lr(ctx)
        warming = self._lr is not None and any(lr > self._lr.get(k, lr) for k, lr in lrs.items())
        self._lr = lrs
        return warming

    def _annealed(self, ctx, lay, e) -> np.ndarray:
        """For the weights ``e``: their optimizer's highest learning rate so far / its
        learning rate now (1: not below its peak; inf: annealed to 0)."""
        lrs = optimizer_lr(ctx)
        ratio = []
        for name, _ in ctx.optimizers:
            now, peak = lrs.get(name), self._peak_lr.get(name)
            ratio.append(1.0 if now is None or peak is None or now >= peak else peak / now if now > 0 else np.inf)
        ratio.append(1.0)                          # (-1: a weight no optimizer holds)
        return np.asarray(ratio)[lay.groups(ctx)[e]]

    def check(self, ctx):
        t, lay = layout(ctx, self.own)
        p = self.params
        me = int(p["min_elements"])
        peaks = self._peak_lr
        for name, lr in optimizer_lr(ctx).items():
            if lr > peaks.get(name, -np.inf):
                peaks[name] = lr
        if t.n_slots > self.streaks.n:
            self.streaks.grow(t.n_slots)
            self.zero_init, self.seen = fit(self.zero_init, t.n_slots, False), fit(self.seen, t.n_slots, False)
            self.said, self.peak = fit(self.said, t.n_slots, False), fit(self.peak, t.n_slots, 0.0)
            self.first = fit(self.first, t.n_slots, 0)
        e = self._eligible(ctx, lay, me)
        if e.size == 0:
            return
        live = live_share(ctx, lay)[e]     # (learnt at each step that measures it: the full steps)
        se = lay.derived(("update_eligible_slots", me), lambda: lay.slots[e])
        u, w = lay.take(ctx, "update", "norm")[e], lay.take(ctx, "param", "norm")[e]
        with np.errstate(all="ignore"):
            r = u / w
        if self._detect[0] is not lay:
            self._detect = (lay, 50)
        if self._detect[1]:        # a tensor whose first update is all of it started at exactly 0
            self._detect = (lay, self._detect[1] - 1)
            unseen = ~self.seen[se]
            first = unseen & (u > 0) & np.isfinite(r)
            if np.count_nonzero(first):
                # (and whose values stay small: an update that makes elements of RMS >= 1 out of
                # almost nothing, Adam at lr 1e9, rewrote a tensor whatever it started from)
                n = np.maximum(lay.take(ctx, "param", "count")[e][first], 1)
                self.zero_init[se[first]] = (np.abs(u[first] - w[first]) <= 1e-6 * w[first]) & (w[first] < np.sqrt(n))
                self.seen[se[first]] = True
            elif not np.count_nonzero(unseen):
                self._detect = (lay, 0)
        if lay.loss_rows.size == 1:      # (several losses, a GAN's: no one trend to read)
            self._losses[self._steps % self._losses.size] = ctx.mean_of(int(lay.loss_rows[0]))
        self._steps += 1
        fresh = (u > 0) & (self.first[se] == 0)
        if np.count_nonzero(fresh):
            self.first[se[fresh]] = self._steps
        hi = (r > p["high"]) & ~self.zero_init[se]
        if np.count_nonzero(hi):
            peak = self.peak[se]
            up = hi & (r > peak[:, 0])
            if np.count_nonzero(up):
                self.peak[se[up]] = np.stack([r[up], np.full(np.count_nonzero(up), float(ctx.step))], axis=1)
            rewrite = hi & (r >= p["rewrite"]) & ~self.said[se]
            if np.count_nonzero(rewrite):
                yield from self._rewritten(ctx, lay, e, se, np.flatnonzero(rewrite), r, u, w)
        if self._steps <= int(p["warmup"]):
            return
        # (a weight whose updates began later, a second stage's: its own first steps are not judged)
        young = self._steps - self.first[se] < int(p["warmup"])
        if np.count_nonzero(young):
            hi = hi & ~young
        lo = (r < p["low"]) & (u > 0) & ~young
        if np.count_nonzero(lo) and self._warming(ctx):
            lo[:] = False
        if np.count_nonzero(lo):
            # (a ratio low only because the update moves the few rows of an embedding table that
            # the batch used, nn.Embedding(sparse=True) under SparseAdam: judged over the entries
            # the gradient reaches, as vanishing_gradient judges its RMS; a gradient all 0 where
            # that share was measured, a layer behind a gate initialised to 0, tells nothing)
            with np.errstate(all="ignore"):
                lo &= ~((live > 0) & (r / np.sqrt(live) >= p["low"]))
        if np.count_nonzero(lo):
            # (a ratio low only by the schedule's decay from the peak lr: the schedule's end, not
            # a learning rate far too low)
            with np.errstate(all="ignore"):
                lo &= ~(r * self._annealed(ctx, lay, e) >= p["low"])
        st = self.streaks.update(se, hi | lo, ctx.step, r)
        if st is None:
            return
        new = np.flatnonzero((st >= int(p["steps"])) & ~self.said[se])
        if new.size == 0:
            return
        groups = lay.groups(ctx)[e]
        for idx in by_group(new, groups, hi).values():      # one finding per optimizer and side
            k = max(idx, key=lambda j: r[j]) if hi[idx[0]] else min(idx, key=lambda j: r[j])
            slot, side, name = se[k], ("high" if hi[k] else "low"), lay.names[e[k]]
            # a ratio that was far above 1e-3 before it fell this low: the weights blew up
            was = max(idx, key=lambda j: self.peak[se[j], 0]) if side == "low" else k
            blew = side == "low" and self.peak[se[was], 0] > p["high"]
            trend, first, last, n = self._loss_trend() if side == "high" else (None, None, None, 0)
            peer = self._peer(ctx, lay, e, idx, r, k) if side == "low" and not blew else None
            if side == "high" and trend in (None, "unsteady") and n < self.TREND_MIN:
                continue           # too few losses to read a trend from yet: asked again next step
            self.said[se[idx]] = True
            since = int(self.streaks.since[slot])
            others = [lay.names[e[j]] for j in idx if j != k]
            msg = (f"update/weight ratio of {name} is {fmt(r[k])} at step {ctx.step}, "
                   f"{'above' if side == 'high' else 'below'} {p[side]:g} for {int(st[k])} recorded steps "
                   f"in a row since step {since} (healthy: ~1e-3)")
            if blew:
                pk, at = self.peak[se[was]]
                msg += (f"; earlier the ratio of {lay.names[e[was]]} reached {fmt(pk)} at step {int(at)}: the "
                        f"weights were rewritten by updates as large as themselves, and the updates have since "
                        f"died out (saturated or dead units pass no gradient): the learning rate is far too high")
            elif peer is not None:
                g = lay.take(ctx, "grad", "norm")[e[k]]
                msg += (f", while {lay.names[e[peer]]}, at the same learning rate ({optimizer_lr(ctx, name):g}), "
                        f"moves at {fmt(r[peer])}: not the learning rate, but too little gradient reaches it (norm "
                        f"{fmt(g)}): a layer after it that starts at 0 (a gate, a spatial transformer's last layer "
                        f"set to the identity), saturated or dead units on its path, or a loss that barely "
                        f"depends on it")
            elif trend == "falling":
                msg += (f", while the loss goes down steadily ({_rate(first, last, n)}): "
                        "a high learning rate that still trains (bounded by clipping or a schedule?); worth "
                        "watching, not yet a fault")
            else:
                during = (f", and the loss rises ({_rate(first, last, n)})"
                          if trend == "rising" else
                          f", and the loss does not go down steadily (flat or oscillating over the last {n} steps)"
                          if trend == "unsteady" else "")
                msg += f"{during}: the learning rate is probably far too {side}"
            f = self.finding(ctx, msg + also(others), tensor=name, side=side, ratio=num(r[k]), update_norm=num(u[k]),
                             weight_norm=num(w[k]), steps=[since, ctx.step], recent_ratios=self.streaks.recent(slot),
                             lr=optimizer_lr(ctx, name), loss_trend=trend, also=others,
                             peak=[num(self.peak[se[was], 0]), int(self.peak[se[was], 1])] if blew else None,
                             peer=[lay.names[e[peer]], num(r[peer])] if peer is not None else None)
            if trend == "falling":
                f.severity = "info"
            yield f

    def _rewritten(self, ctx, lay, e, se, flagged, r, u, w):
        """The findings of updates as large as the weights (``flagged``: positions in ``e``), one per optimizer."""
        p = self.params
        groups = lay.groups(ctx)[e]
        for (group, _), idx in by_group(flagged, groups, np.ones(len(e), dtype=bool)).items():
            self.said[se[idx]] = True
            if group in self._rewrites:
                continue           # (one such finding per optimizer: its learning rate is the one cause)
            self._rewrites.add(group)
            k = max(idx, key=lambda j: r[j])
            name, others = lay.names[e[k]], [lay.names[e[j]] for j in idx if j != k]
            yield self.finding(
                ctx, f"update/weight ratio of {name} is {fmt(r[k])} at step {ctx.step}: the update (norm "
                     f"{fmt(u[k])}) is as large as the weight it leaves (norm {fmt(w[k])}), at or above "
                     f"{p['rewrite']:g}: every step rewrites the weights (healthy: ~1e-3): the learning rate is "
                     f"far too high" + also(others),
                tensor=name, side="high", ratio=num(r[k]), update_norm=num(u[k]), weight_norm=num(w[k]),
                steps=[ctx.step, ctx.step], lr=optimizer_lr(ctx, name), loss_trend=None, also=others)

    def _peer(self, ctx, lay, e, flagged, r, k) -> Optional[int]:
        """The weight (a position in ``e``) with the largest healthy ratio (from 'peer' x 'low' to
        'high') at the learning rate of ``k``, flagged low with ``flagged``; None: none."""
        p = self.params
        lr = optimizer_lr(ctx, lay.names[e[k]])
        if lr is None:
            return None
        ok = (r >= p["peer"] * p["low"]) & (r <= p["high"]) & ~self.zero_init[lay.slots[e]]
        ok[flagged] = False
        best = None
        for j in np.flatnonzero(ok).tolist():
            if (best is None or r[j] > r[best]) and optimizer_lr(ctx, lay.names[e[j]]) == lr:
                best = j
        return best

    @staticmethod
    def _eligible(ctx, lay, me: int) -> np.ndarray:
        """The weight tensors judged: recorded with update and value, and held by no optimizer
        whose step() is many iterations of its own (MULTI_ITERATION: LBFGS)."""
        def compute():
            ok = lay.weightlike(ctx, me) & (lay.u >= 0) & (lay.p >= 0)
            multi = [k for k, (_, opt) in enumerate(ctx.optimizers) if family(opt) in MULTI_ITERATION]
            if multi:
                ok &= ~np.isin(lay.groups(ctx), multi)
            return np.flatnonzero(ok)
        return lay.derived(("update_eligible", me), compute)

    def check_block(self, block):
        t, lay = block.layout(self.own)
        p = self.params
        if self.streaks.active or t.n_slots > self.streaks.n:
            return None
        e = self._eligible(block.last, lay, int(p["min_elements"]))
        if e.size == 0:
            return True
        if self._steps < int(p["warmup"]):
            return None                 # (the warmup: step by step)
        learn_live_share(block, lay)
        se = lay.slots[e]
        u, w = block.take(lay, "update", "norm")[:, e], block.take(lay, "param", "norm")[:, e]
        with np.errstate(all="ignore"):
            r = u / w
        if np.count_nonzero((r > p["high"]) & ~self.zero_init[se]) or np.count_nonzero((r < p["low"]) & (u > 0)):
            return None
        left = self._detect[1] if self._detect[0] is lay else 50
        if left:                        # first updates awaited: as check counts them down, if none comes
            unseen = ~self.seen[se]
            if np.count_nonzero(unseen[None, :] & (u > 0) & np.isfinite(r)):
                return None
            left = max(left - block.k, 0) if np.count_nonzero(unseen) else 0
        k, ring = block.k, self._losses
        if lay.loss_rows.size == 1:
            v = block.loss_means(lay)
            if v is None:
                return None
            at = (self._steps + np.arange(k)) % ring.size
            if k <= ring.size:
                ring[at] = v[:, 0]
            else:
                for i, x in zip(at.tolist(), v[:, 0].tolist()):
                    ring[i] = x
        self._detect = (lay, left)
        unseen = self.first[se] == 0                # (their first updates, as check notes them)
        if np.count_nonzero(unseen):
            pos = u[:, unseen] > 0
            has = pos.any(axis=0)
            if np.count_nonzero(has):
                self.first[se[unseen][has]] = self._steps + 1 + np.argmax(pos, axis=0)[has]
        self._steps += k
        self.streaks.i += k             # (what Streaks.update does on a step with nothing flagged)
        return True

    def _loss_trend(self) -> tuple:
        """(falling | rising | unsteady | None, first, last, values) of the last
        ``trend_steps`` recorded losses: the sign of the Theil-Sen slope where
        Sen's 95% bounds agree on it; ``first`` and ``last``: the fitted line at
        the window's ends (the medians of the first and last three losses once
        read "falls (0.6935 -> 1.046)" where the level jumped inside the window).
        None: too few (fewer than 6 finite)."""
        ring, i = self._losses, self._steps
        v = ring[:i] if i <= ring.size else np.roll(ring, -(i % ring.size))
        v = v[np.isfinite(v)]
        if v.size < 6:
            return None, None, None, int(v.size)
        x = np.arange(v.size, dtype=np.float64)
        slope, lo, hi = theil_sen(v, x)
        trend = "falling" if hi < 0 else "rising" if lo > 0 else "unsteady"
        at0 = float(np.median(v - slope * x))
        return trend, at0, at0 + float(slope) * (v.size - 1), int(v.size)


# How far a norm summed in float32 (a step that measures count, norm and the NaN/Inf counts
# alone) may be from the same tensor's norm summed in float64 (a full step, which measures
# the mean too), relative: at least 1e-6 (about 1e-7 for small tensors, nndb.tracer.stats),
# and a few rounding errors per sqrt(element): a 512 x 512 x 3 x 3 conv's (2.4 M elements,
# summed as one block) were 1.4e-6 apart.
_NORM_SUMS_AGREE = 1e-6
_ROUNDINGS = 4 * 2.0 ** -24


def _same_norm(now: np.ndarray, then: np.ndarray, mixed: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Are the norms of an unchanged value?  Exactly equal, or, where one of the two steps was
    a full step and the other not (``mixed``), equal to the precision of float32 sums: a layer
    left out of the optimizer read 9.245893236894252 at step 0 and 9.245892851918873 after."""
    with np.errstate(invalid="ignore"):
        tol = np.maximum(_NORM_SUMS_AGREE, _ROUNDINGS * np.sqrt(np.nan_to_num(count)))
        return (now == then) | (mixed & (np.abs(now - then) <= tol * np.abs(then)))


def _rate(first: float, last: float, n: int) -> str:
    """The loss's trend as its rate a step: the fitted line's ends could read as losses it never
    had (a loss rising from 0.2 to 14 fitted from -1.738 to 12.41)."""
    return f"by {(last - first) / max(n - 1, 1):+.3g} a step over the last {n} steps"


class ParamNotUpdated(Rule):
    id = "param_not_updated"
    severity = "warning"
    explanation = ("a parameter gets a nonzero gradient step after step but never changes: its optimizer's "
                   "learning rate is 0, or no optimizer holds it: left out of the optimizer, or kept fixed on "
                   "purpose (a feature extractor, style transfer's VGG) while it still requires grad, so its "
                   "gradients are computed for nothing")
    THRESHOLDS = {
        "steps": Threshold(5, "consecutive recorded steps: an LR schedule may start at exactly 0 for a step "
                              "(linear warmup from 0); five steps without any change are not a schedule"),
        "min_grad_rms": Threshold(1e-7, "gradients with a smaller RMS count as zero (a converged model's last "
                                        "gradients; LBFGS's own zero updates, at a learning rate above 0, are "
                                        "its convergence tests and never count)"),
    }
    # On a trace (nndb.rules.offline) it runs where the trace records the optimizers.
    READS_OPTIMIZERS = "which optimizer holds each parameter, its learning rate, and the parameters' shapes"

    EVERY_STEP = True            # (the norms are recorded on every step)

    def reset(self):
        self.own = Tensors()
        self.streaks = Streaks(1)
        self.prev = np.zeros((0, 3))          # slot -> (param norm, param mean, grad norm) at the last step

    def check(self, ctx):
        t, lay = layout(ctx, self.own)
        if t.n_slots > self.streaks.n:
            self.streaks.grow(t.n_slots)
            self.prev = fit(self.prev, t.n_slots, np.nan)
        held, unheld = self._held(lay)
        flags = None
        # held by an optimizer: its update is exactly 0 (with no optimizer, a parameter left out
        # of a hand-written update is one that stays while others change: FGSM's eval loop had
        # every parameter "not updated")
        zero = lay.take(ctx, "update", "norm")[held] == 0
        if zero.size and trains_nothing(ctx, lay):
            zero = zero & False
        if np.count_nonzero(zero):
            flags = np.zeros(len(lay.names), dtype=bool)
            k = held[zero]
            flags[k] = self._has_grad(ctx, lay, k) & ~self._below_resolution(ctx, lay, k) & ~self._converged(ctx, lay, k)
        # held by none (param and grad rows only): the value did not change
        # while a new gradient came (a stale .grad kept between a GAN's
        # generator steps is not a new one)
        if unheld.size:
            su = lay.slots[unheld]
            pn, pm = lay.take(ctx, "param", "norm")[unheld], lay.take(ctx, "param", "mean")[unheld]
            g = lay.take(ctx, "grad", "norm")[unheld]
            prev = self.prev[su]
            mixed = np.isnan(pm) != np.isnan(prev[:, 1])
            same = _same_norm(pn, prev[:, 0], mixed, lay.take(ctx, "param", "count")[unheld]) & \
                ((pm == prev[:, 1]) | np.isnan(pm) | np.isnan(prev[:, 1]))
            stuck = same & (g != prev[:, 2]) & self._has_grad(ctx, lay, unheld)
            self.prev[su] = np.stack([pn, pm, g], axis=1)
            if np.count_nonzero(stuck):
                flags = np.zeros(len(lay.names), dtype=bool) if flags is None else flags
                flags[unheld[stuck]] = True
        # held by none and no gradient yet (a frozen backbone): its value, so that the step
        # its first gradient comes (unfrozen but never given to an optimizer) is judged too
        # (it was not: "since step 7" of a backbone unfrozen at step 6, found a step late)
        frozen = lay.derived("frozen", lambda: np.flatnonzero((lay.u < 0) & (lay.g < 0) & (lay.p >= 0)))
        if frozen.size:
            pn, pm = lay.take(ctx, "param", "norm")[frozen], lay.take(ctx, "param", "mean")[frozen]
            self.prev[lay.slots[frozen]] = np.stack([pn, pm, np.full(len(frozen), np.nan)], axis=1)
        st = self.streaks.update(lay.slots, flags if flags is not None else np.zeros(len(lay.names), dtype=bool),
                                 ctx.step)
        if st is None:
            return
        new = np.flatnonzero(st == int(self.params["steps"]))
        g = lay.take(ctx, "grad", "norm")
        for idx in by_group(new, lay.groups(ctx), lay.u >= 0).values():
            k = idx[0]          # one finding per optimizer (one cause: its lr), the others listed
            name, held_k = lay.names[k], bool(lay.u[k] >= 0)
            since = int(self.streaks.since[lay.slots[k]])
            others = [lay.names[j] for j in idx[1:]]
            lr = optimizer_lr(ctx, name) if held_k else None
            streak = f"{self.params['steps']:g} observed steps in a row since step {since}"
            if held_k:
                why = f"its update is exactly 0 (learning rate {lr:g})" if lr is not None else "its update is exactly 0"
                text = f"{name} has a gradient (norm {fmt(g[k])}) but was not updated for {streak}: {why}{also(others)}"
            else:
                # (no update was asked for: it was left out of the optimizer, or is not meant to
                # train at all, a fixed network that still requires grad; either is said)
                it, was, its = ("they", "were", "their") if others else ("it", "was", "its")
                text = (f"{name} has a gradient (norm {fmt(g[k])}) and its value has not changed for {streak}: "
                        f"no optimizer that has stepped holds it{also(others)}; either {it} {was} left out of the "
                        f"optimizer, or {it} {'are' if others else 'is'} kept fixed (a feature extractor, a loss "
                        f"network) and {its} gradients are computed for nothing (requires_grad_(False) spares them)")
            yield self.finding(
                ctx, text,
                tensor=name, grad_norm=num(g[k]), in_optimizer=held_k, lr=lr, steps=[since, ctx.step],
                also=others)

    @staticmethod
    def _held(lay) -> tuple:
        """Layout positions of the parameters an optimizer holds, and of those none holds."""
        return (lay.derived("held", lambda: np.flatnonzero((lay.u >= 0) & (lay.g >= 0))),
                lay.derived("unheld", lambda: np.flatnonzero((lay.u < 0) & (lay.g >= 0) & (lay.p >= 0))))

    def check_block(self, block):
        t, lay = block.layout(self.own)
        if self.streaks.active or t.n_slots > self.streaks.n:
            return None
        held, unheld = self._held(lay)
        if unheld.size or np.count_nonzero(block.take(lay, "update", "norm")[:, held] == 0):
            return None                 # (values compared from step to step, or an update of exactly 0)
        self.streaks.i += block.k       # (what Streaks.update does on a step with nothing flagged)
        return True

    @staticmethod
    def _converged(ctx, lay, k: np.ndarray) -> np.ndarray:
        """Held by an optimizer that stops by its own tests (MULTI_ITERATION: LBFGS returns
        without a move once the loss or the step changes by less than tolerance_change, the
        gradient's largest element is under tolerance_grad): its zero update at a learning
        rate above 0 is its convergence, not a parameter left out."""
        own = set()
        for _, opt in ctx.optimizers:
            if family(opt) in MULTI_ITERATION:
                for group in opt.param_groups:
                    lr = lr_number(group.get("lr"))
                    if lr is not None and lr > 0:
                        own.update(ctx.param_name(p) for p in group["params"])
        return np.array([lay.names[j] in own for j in k.tolist()], dtype=bool)

    @staticmethod
    def _below_resolution(ctx, lay, k: np.ndarray) -> np.ndarray:
        """Would lr x gradient round away against the values (RMS under half a float32 ulp of theirs:
        a converged model's last gradients)?  A learning rate of 0, or not known: never."""
        g, pn = lay.take(ctx, "grad", "norm")[k], lay.take(ctx, "param", "norm")[k]
        lrs = [optimizer_lr(ctx, lay.names[j]) or 0.0 for j in k.tolist()]
        return np.array([lr > 0 and lr * a < 2.0 ** -24 * b for lr, a, b in zip(lrs, g, pn)], dtype=bool)

    def _has_grad(self, ctx, lay, k: np.ndarray) -> np.ndarray:
        """A gradient above min_grad_rms at layout positions ``k``."""
        thr = lay.derived(("grad_thr", self.params["min_grad_rms"]), lambda: float(self.params["min_grad_rms"])
                          * np.sqrt(np.maximum(lay.take(ctx, "grad", "count"), 1)))
        with np.errstate(invalid="ignore"):
            return lay.take(ctx, "grad", "norm")[k] > thr[k]


# -- the loss -------------------------------------------------------------------------------------

def loss_kind(ctx) -> Optional[dict]:
    """What the loss probe saw the step's loss is, where it is not meant to go down
    ({"kind": "policy_gradient" | "moving_target", "where"}; nndb.rules.loss_watch), or None;
    on a trace, its "loss_kind" record at the same step (nndb.rules.offline.trace_facts)."""
    return (ctx.facts.get("loss_inputs") or {}).get("surrogate")


class LossNotDecreasing(Rule):
    id = "loss_not_decreasing"
    severity = "warning"
    explanation = ("the loss has not gone down over the run so far: its robust trend (Theil-Sen slope of block "
                   "medians) cannot have brought it down by margin, even at its confidence bound, and the last "
                   "window is not below the first by margin either; a new model trained in the same process "
                   "(a k-fold loop's next fold, a sweep's next trial: a step that updates none of the "
                   "parameters the last one did) starts a run of its own (new optimizers over the same "
                   "parameters do not: a fine-tuning stage at a lower learning rate hardly moves a converged "
                   "loss, and is judged with the stage before); not judged where the loss is not "
                   "meant to go down: a policy-gradient surrogate (it depends on actions sampled from the "
                   "model's own output: REINFORCE, actor-critic) or a loss chasing a moving target (its target "
                   "made, without gradient, by the trained model or a copy of it: a DQN's target network), as "
                   "the loss probe sees on its steps; nor on steps that train nothing (no optimizer, and no "
                   "parameter changed: FGSM's attack, a backward per example for its input's gradient)")
    THRESHOLDS = {
        "min_steps": Threshold(50, "recorded steps with a finite loss before judging: short runs and slow "
                                   "starts (warmup) are left alone; a fine-tuned head over frozen features "
                                   "(Adam, lr 3e-3) has lost only ~4% by step 30, but 10% by step 80"),
        "window": Threshold(10, "loss values in the first and last windows, whose medians (a spike or two "
                                "does not move them) give the level and the drop so far"),
        "margin": Threshold(0.03, "share of the first window's median: the loss must have come down by less "
                                  "than this, and the trend must allow no more than this over the run at its "
                                  "confidence bound; slow healthy learners lose >= 2% per 30 steps, so the "
                                  "trend's bound clears 3% as soon as the noise allows, a flat loss does not; "
                                  "nor is a loss whose slope is surely negative (the other bound) and whose "
                                  "trend has brought it down by half the margin, nor one that falls steadily "
                                  "(see horizon)"),
        "z": Threshold(1.96, "normal quantile of Sen's confidence bound on the slope (95%, two-sided): the "
                             "noisier the loss, the wider the bound and the longer the run must be before a "
                             "flat loss is called flat"),
        "horizon": Threshold(10, "a loss that falls steadily (the slope's bound nearest 0 is at least half the "
                                 "slope) is going down, not flat, where its trend brings it down by margin "
                                 "within this many times the steps it has run: makemore's bigram (AdamW at lr "
                                 "5e-4) loses 0.6-0.8% in its first 50 steps, as steadily, and 3% by step "
                                 "~200; labels without signal drift down by as much, unsteadily (their bound "
                                 "at most a third of the slope); a learning rate 1e5 times too small (0.01% in "
                                 "50 steps) would take 17,000 and is still said"),
    }

    EVERY_STEP = True               # (cheap: one value per step, judged on the observed steps)
    BLOCKS = 40                     # block medians the trend is fitted to (Theil-Sen is O(n^2) in points)
    KEEP = 4096                     # values kept; beyond, every other one (the stride doubles)

    def reset(self):
        self.own = Tensors()
        self.restarts = Restarts()
        # {"kind", "where"}: the loss is not meant to go down (kept over a new model's run: a sweep of seeds)
        self.surrogate = None
        self._forget()

    def _forget(self):
        """A new run starts (the first, or a new model's in the same process: Restarts)."""
        self.hist: dict = {}           # loss name -> [kept values, stride, values until the next is kept]
        self.first: dict = {}          # loss name -> the first window
        self.last: dict = {}           # loss name -> the last window (deque)
        self.n: dict = {}              # loss name -> finite values seen
        self.done: set = set()         # reported, or non-finite once (nonfinite's business)

    def check_block(self, block):
        _, lay = block.layout(self.own)
        if lay is not self.restarts.lay and self.restarts.new_run(lay):     # (the usual step: no call)
            self._forget()
        if lay.loss_rows.size != 1 or lay.loss_names[0] in self.done or self.surrogate is not None:
            return True
        if np.count_nonzero(lay.u >= 0) and not np.count_nonzero(block.take(lay, "update", "norm")[:, lay.u >= 0],
                                                                 axis=1).all():
            return None                 # (a step that changed no parameter: trains_nothing's, step by step)
        name, p = lay.loss_names[0], self.params
        v = block.loss_means(lay)
        if v is None or not np.isfinite(v).all():
            return None
        n0, k, w = self.n.get(name, 0), block.k, int(p["window"])
        start = max(int(p["min_steps"]), 2 * w)
        if n0 < w or n0 < start <= n0 + k:
            return None                 # (the first window fills, or the first judgement: step by step)
        # (a block has no observed step: nothing else is judged; the values are kept as check keeps them)
        vals = v[:, 0].tolist()
        self.n[name] = n0 + k
        self.last[name].extend(vals)
        self._keep_all(self.hist[name], vals)
        return True

    @classmethod
    def _keep(cls, h: list, v: float) -> None:
        """One more value into the kept history [values, stride, countdown]."""
        if h[2] == 0:
            h[0].append(v)
            if len(h[0]) >= cls.KEEP:
                h[0], h[1] = h[0][::2], 2 * h[1]
        h[2] = (h[2] + 1) % h[1]

    @classmethod
    def _keep_all(cls, h: list, vals: list) -> None:
        """``_keep`` of each of ``vals`` in turn: while the stride stays, the values kept
        are every stride-th from the one the countdown names, taken as a slice."""
        stride = h[1]
        kept = vals[-h[2] % stride::stride]
        if len(h[0]) + len(kept) >= cls.KEEP:
            for v in vals:               # (the kept history halves on the way: one by one)
                cls._keep(h, v)
            return
        h[0].extend(kept)
        h[2] = (h[2] + len(vals)) % stride

    def check(self, ctx):
        if self.surrogate is None:
            self.surrogate = loss_kind(ctx)
        if self.surrogate is not None:
            return
        _, lay = layout(ctx, self.own)
        if lay is not self.restarts.lay and self.restarts.new_run(lay):     # (the usual step: no call)
            self._forget()
        if lay.loss_rows.size != 1:    # several losses (a GAN, actor-critic): adversarial, not meant to all go down
            return
        if trains_nothing(ctx, lay):   # (FGSM's attack: its losses are the examples', no training's)
            return
        name = lay.loss_names[0]
        if name in self.done:
            return
        v = ctx.mean_of(int(lay.loss_rows[0]))
        if not math.isfinite(v):
            self.done.add(name)
            return
        p = self.params
        w = int(p["window"])
        n = self.n[name] = self.n.get(name, 0) + 1
        last = self.last.get(name)
        if last is None:
            last = self.last[name] = deque(maxlen=w)
            self.first[name], self.hist[name] = [], [[], 1, 0]
        last.append(v)
        h = self.hist[name]
        self._keep(h, v)
        first = self.first[name]
        if n <= w:
            first.append(v)
            return
        start = max(int(p["min_steps"]), 2 * w)
        if n < start or (n > start and not observed(ctx.step)):
            return                     # (values come every step; judged first at n == start, then when observed)
        m1, m2 = _median(first), _median(last)
        need = float(p["margin"]) * abs(m1)
        if m1 - m2 >= need:            # it went down: nothing to fit
            return
        y, x = block_medians(np.asarray(h[0]), self.BLOCKS)
        slope, steepest, least = theil_sen(y, x * h[1], float(p["z"]))
        if not math.isfinite(steepest):
            return
        most = -steepest * (n - 1)     # the largest drop over the run the trend allows
        if most >= need:
            return
        # a slope surely below 0 whose drop over the run is no longer small, or that falls
        # steadily at a pace that reaches the margin within the horizon: a slow learner
        if least < 0 and (-slope * (n - 1) >= need / 2 or
                          (least <= slope / 2 and -slope * (n - 1) * float(p["horizon"]) >= need)):
            return
        self.done.add(name)
        pct = 100 * (m1 - m2) / abs(m1) if m1 else 0.0
        # a loss lower than it was whose slope is surely below 0 has gone down, too little (makemore's
        # bigram at its defaults, a double softmax): said so, not "has not gone down"
        fell = least < 0 and m2 < m1
        went = (f"has gone down only {pct:.1f}% in {n} recorded steps" if fell
                else f"has not gone down in {n} recorded steps")
        yield self.finding(
            ctx, f"{name} {went}: median {fmt(m2)} over the last {w} vs {fmt(m1)} "
                 f"over the first {w}{'' if fell else f' ({pct:.1f}%)'}, and its trend ({fmt(slope)} per step) allows at most a drop "
                 f"of {fmt(most)} over the run at its {p['z']:g}-sigma bound, less than the {fmt(need)} "
                 f"({100 * float(p['margin']):g}%) expected",
            tensor=name, first_median=m1, last_median=m2, drop=m1 - m2, needed=need, slope=slope,
            slope_bound=steepest, max_drop=most, recorded_steps=n)


class LossExplodes(Rule):
    id = "loss_explodes"
    severity = "error"
    explanation = ("the loss multiplies by 100 or more within a few recorded steps, to above anything it was "
                   "before, and stays up: the run diverges (a learning rate far too high, no clipping); found "
                   "1-2 steps after the jump, before the values overflow (a spike that comes back down at "
                   "once is not a divergence); a new model trained in the same process (a k-fold loop's next "
                   "fold, a sweep's next trial) starts a run of its own, its first loss no jump, and so do new "
                   "optimizers over the same parameters (a sweep that re-initialises one model: every optimizer "
                   "holding the parameters the step updates steps for the first time, and those of the last "
                   "step, which stepped twice or more, are gone): that loss was computed before the new "
                   "optimizers changed anything, and a new stage's own divergence is still found against it; "
                   "not judged on a "
                   "policy-gradient surrogate (a loss that depends on actions sampled from the model's own output, "
                   "as the loss probe sees on its steps: its value follows the episodes' length and returns, not "
                   "the policy's quality, and a healthy actor-critic goes x2000 as its episodes grow long; a "
                   "diverging policy still shows in its gradients)")
    THRESHOLDS = {
        "factor": Threshold(100, "times the smallest positive loss of the last window: a spiky healthy loss "
                                 "moves by a few x; a word LM at SGD lr 5000 went x95 in one step and x274 "
                                 "in two"),
        "window": Threshold(10, "recorded steps looked back over; the loss must also pass the largest it "
                                "has been (a converged loss of 1e-6 that spikes to 1e-4 is below its start)"),
        "confirm": Threshold(2, "recorded steps after the jump that must all stay at or above both 'factor' "
                                "times that low and the largest loss of the window before the jump (one, if "
                                "it is higher still than the jump; at once, if the script raises there): a "
                                "diverging loss stays up, rises on or overflows (the word LM at lr 5000 stays "
                                "at x250-x1500 of its first loss), a healthy spike comes back (the dynamic_net "
                                "tutorial's random-depth polynomial jumps x205 on a deep step and falls back "
                                "to its earlier values at the next shallow one); 0: report the jump at once"),
    }
    EVERY_STEP = True               # (one value per step)

    def reset(self):
        self.own = Tensors()
        self.restarts = Restarts()
        self.surrogate = None          # the loss is a policy-gradient surrogate (loss_kind; kept over runs)
        self._forget()

    def _forget(self):
        """A new run starts (the first, or a new model's in the same process: Restarts)."""
        self.recent: dict = {}         # loss name -> deque of the last window's values
        self.top: dict = {}            # loss name -> the largest value so far
        self.done: set = set()
        self.jump: dict = {}           # loss name -> the jump waiting to be confirmed (a dict)

    def check_block(self, block):
        _, lay = block.layout(self.own)
        r = self.restarts
        if not r.quiet_block(lay, block.sources):
            return None                  # (a new layout, or new optimizers: judged step by step)
        if lay.loss_rows.size != 1 or lay.loss_names[0] in self.done or self.surrogate is not None:
            r.last = block.records[-1].step
            return True
        v = block.loss_means(lay)
        if v is None or not np.isfinite(v).all():
            return None
        name, vals = lay.loss_names[0], v[:, 0]
        recent = self.recent.get(name)
        if recent is None or not recent or name in self.jump:
            return None
        # the block's values against the window before each: the coarse test
        # (the window's smallest positive over the block and the values before)
        pos = [x for x in list(recent) + vals.tolist() if x > 0]
        if pos and vals.max() >= float(self.params["factor"]) * min(pos):
            return None
        recent.extend(vals.tolist())
        self.top[name] = max(self.top[name], float(vals.max()))
        r.last = block.records[-1].step
        return True

    def check(self, ctx):
        if self.surrogate is None:
            kind = loss_kind(ctx)
            self.surrogate = kind if kind is not None and kind["kind"] == "policy_gradient" else None
        if self.surrogate is not None:
            return
        _, lay = layout(ctx, self.own)
        r, src = self.restarts, ctx.opt_source
        # (Restarts.quiet, inline: the usual step makes no call)
        if (lay is not r.lay or src is not r.src or r.token is not None and src.state.changes != r.token) \
                and r.look(lay, ctx):
            self._forget()
        r.last = ctx.step
        if lay.loss_rows.size != 1:    # (several losses: a GAN's trade off against each other)
            return
        name = lay.loss_names[0]
        if name in self.done:
            return
        v = ctx.mean_of(int(lay.loss_rows[0]))
        jump = self.jump.get(name)
        if not math.isfinite(v):       # (nonfinite's business; after a jump, the divergence it ends in)
            if jump is not None:
                self.jump.pop(name)
                self.done.add(name)
                yield self._found(ctx, name, jump, v)
            return
        recent = self.recent.get(name)
        if recent is None:
            recent = self.recent[name] = deque(maxlen=int(self.params["window"]))
            self.top[name] = v
        pos = [(x, i) for i, x in enumerate(recent) if x > 0]
        top = self.top[name]
        ahead = len(recent)                  # (v's place: counted before a full window drops its first)
        high = max(recent) if recent else v  # the largest of the window before v
        recent.append(v)
        self.top[name] = max(top, v)
        if jump is not None:
            if v >= jump["bar"]:
                jump["after"].append(v)
                # confirmed: up for 'confirm' steps, or higher still (it keeps rising), or the run ends here
                if len(jump["after"]) >= int(self.params["confirm"]) or v > jump["value"] or ctx.ending:
                    del self.jump[name]
                    self.done.add(name)
                    yield self._found(ctx, name, jump, v)
                return
            del self.jump[name]              # it came back down: a spike, not a divergence
        if not pos:
            return
        lo, at = min(pos)
        back = ahead - at                    # recorded steps since the smallest
        factor = float(self.params["factor"])
        if v >= factor * lo and v > top:
            jump = dict(lo=lo, value=v, back=back, top=top, step=ctx.step, after=[], bar=max(factor * lo, high))
            if int(self.params["confirm"]) <= 0 or ctx.ending:
                self.done.add(name)
                yield self._found(ctx, name, jump, v)
                return
            self.jump[name] = jump

    def _found(self, ctx, name, jump, v):
        lo, value, after = jump["lo"], jump["value"], jump["after"]
        if not math.isfinite(v):
            then = f", then {v!r} {len(after) + 1} recorded step(s) later"
        elif after:
            said = ", ".join(fmt(x) for x in after)
            then = f", and {'rose further' if after[-1] > value else 'stayed up'} ({said} since)"
        else:
            then = ""
        if ctx.ending:
            then += " (and the script raised at this step)"
        # (a run that clips says so in its clip_grad_norm_ series: no "no gradient clipping?" then)
        clips = any(k == "grad" and n.startswith(CLIP_SERIES) for n, k in ctx.names)
        return self.finding(
            ctx, f"{name} went from {fmt(lo)} to {fmt(value)} (x{fmt(value / lo)}) in {jump['back']} recorded "
                 f"step(s) by step {jump['step']}, above anything it was before ({fmt(jump['top'])}){then}: the "
                 f"run diverges (a learning rate far too high?{'' if clips else ' no gradient clipping?'})",
            tensor=name, low=lo, value=value, factor=value / lo, steps_back=jump["back"], previous_max=jump["top"],
            jump_step=jump["step"], after=list(after), now=v if math.isfinite(v) else repr(v))


def _median(xs) -> float:
    s = sorted(xs)
    h = len(s) // 2
    return float(s[h]) if len(s) % 2 else (s[h - 1] + s[h]) / 2.0


RULES = [NonFinite, ExplodingGradient, VanishingGradient, UpdateRatio, ParamNotUpdated, LossNotDecreasing,
         LossExplodes, ZeroGradients, BatchNormStats]
