"""Helpers of the statistics rules (nndb.rules.stats_rules, gradient_norms):
the parameters' rows of a step as index arrays shared by the rules, and small
lookups done only when a rule reports.

Cost: a rule runs on many steps, so what does not change from step
to step (which row holds which tensor, which tensors are weight matrices,
which optimizer holds them) is computed once per *layout* (the step's list of
series, normally the same step after step), and what the rules of one step
share (a column of the parameters' gradient norms) once per step."""
from __future__ import annotations

import math
import weakref
from typing import Optional

import numpy as np

from ..schema import CLIP_SERIES
from ..tracer.pipeline import lr_number
from .base import Threshold

_KINDS = ("grad", "param", "update")

MIN_ELEMENTS = Threshold(64, "weight tensors with fewer elements (and every 1-D tensor: biases, norm scales) are "
                              "left out: their gradient norms are small and noisy (a bias before a BatchNorm "
                              "has a gradient of exactly ~0 by construction)")


class Layout:
    """The ``grad``, ``param`` and ``update`` rows of each parameter at a step.

    ``names``: the parameters in row order (optimizer order, then the others:
    about forward order); ``slots``: a number per name fixed for the run, for
    per-tensor history in plain arrays; ``g``, ``p``, ``u``: the row of each
    kind (-1: none); ``loss_rows``/``loss_names``: the losses of the step."""

    def __init__(self, names: list, rows: dict, slot_of: dict, losses: list):
        self.names = names
        self.slots = np.array([slot_of[n] for n in names], dtype=np.int64)
        self.rows = {k: np.array([rows[k].get(n, -1) for n in names], dtype=np.int64) for k in _KINDS}
        self.g, self.p, self.u = self.rows["grad"], self.rows["param"], self.rows["update"]
        self._missing = {k: (r < 0) if (r < 0).any() else None for k, r in self.rows.items()}
        self.trained = frozenset(rows["update"])      # the parameters the step updated
        self.loss_rows = np.array([i for i, _ in losses], dtype=np.int64)
        self.loss_names = [n for _, n in losses]
        self.memo: dict = {}
        self.owner = None               # the Tensors it belongs to (per-run, per-slot state)

    def derived(self, key, fn):
        """What a rule derives from the layout alone, computed once."""
        v = self.memo.get(key)
        if v is None:
            v = self.memo[key] = fn()
        return v

    def per_step(self, ctx, key, fn):
        """What the rules of one step share, computed once per step (kept by the
        step's context: ``StepContext.shared``, under the layout and ``key``)."""
        k = (self, key)
        v = ctx.shared.get(k)
        if v is None:
            v = ctx.shared[k] = fn()
        return v

    def take(self, ctx, kind: str, stat: str) -> np.ndarray:
        """``stat`` of the ``kind`` row of every parameter (NaN where there is none);
        once a step (``per_step``'s, inline: every rule takes a few a step)."""
        k = (self, kind, stat)
        out = ctx.shared.get(k)
        if out is None:
            rows = self.rows[kind]
            if rows.size == 0:
                out = np.zeros(0)
            else:
                out = ctx.col(stat)[rows]
                if self._missing[kind] is not None:
                    out[self._missing[kind]] = np.nan
            ctx.shared[k] = out
        return out

    def any_nonzero(self, ctx, stat: str) -> bool:
        return self.per_step(ctx, ("any", stat), lambda: bool(np.count_nonzero(ctx.col(stat))))

    def weightlike(self, ctx, min_elements: int) -> np.ndarray:
        """Weight matrices and kernels: at least ``min_elements`` and not 1-D
        (biases, norm scales).  The dimension comes from the parameter itself
        where the session knows it, else from the name (``*bias*`` is 1-D)."""
        def compute():
            count = np.fmax(self.take(ctx, "param", "count"), self.take(ctx, "grad", "count"))
            ndim = param_ndims(ctx)
            one_d = np.array([ndim.get(n, 1 if "bias" in n.rsplit(".", 1)[-1] else 2) <= 1 for n in self.names],
                             dtype=bool)
            return (count >= min_elements) & ~one_d
        return self.derived(("weightlike", min_elements), compute)

    def groups(self, ctx) -> np.ndarray:
        """The optimizer (index in ``ctx.optimizers``) holding each parameter; -1: none."""
        def compute():
            owner: dict = {}
            for k, (_, opt) in enumerate(ctx.optimizers):
                for group in opt.param_groups:
                    for p in group["params"]:
                        owner.setdefault(ctx.param_name(p), k)
            return np.array([owner.get(n, -1) for n in self.names], dtype=np.int64)
        return self.derived("groups", compute)


class Restarts:
    """Where the training starts anew in the same process: a step that updates
    parameters, none of which the last step that updated any did (a k-fold
    loop's next fold, a sweep's next trial, a student after its teacher: a new
    model and its optimizer).  Its loss is a new run's, no continuation of the
    last one's: a history judged across the two found a fold's first loss, a
    little above the first fold's, a divergence (loss_explodes, x1600 of the
    last fold's 0.0007), and the run's loss flat.  A stage that trains some of
    the same parameters (a head fine-tuned with a new optimizer) goes on.

    ``look`` also sees new optimizers over the same parameters (a sweep that
    re-initialises one model and makes a new optimizer per trial): a step where
    every optimizer that holds a parameter the step updated is one that never
    stepped before, and those of the last updating step, which stepped on two
    recorded steps or more, hold none of them (gone: the script let them go).
    That step's loss was computed before any of the new optimizers changed a
    parameter: a jump to it is none of theirs (a model re-initialised, or a new
    stage's data), while a new stage's own divergence is still found against
    it (a model carried over keeps the last stage's level there).  An optimizer
    made anew at every step (one step each) is no new run.

    Cost: the callers look only when the step's layout, or the optimizers' source
    (``StepContext.opt_source``) or its count of changes, is not the last one's."""

    def __init__(self):
        self.lay = None                  # the layout of the last step seen
        self._trained = frozenset()
        self.src = None                  # the optimizers' source last looked at (None: look again)
        self.token = None                # its count of changes then (a session's, a trace's); None: none kept
        self.last = None                 # the last recorded step judged (the callers keep it)
        self._names: Optional[tuple] = None      # the optimizers' names last looked at
        self._stepping = frozenset()     # the optimizers holding the parameters of the last updating step
        self._since = None               # the step they first did
        self._ever: set = set()          # every optimizer that held the updated parameters of a step

    def new_run(self, lay: Layout) -> bool:
        """Does a step of ``lay``, after the steps seen so far, start a new run
        (none of the parameters updated is one the last updating step updated)?"""
        if lay is self.lay:
            return False
        self.lay = lay
        now = lay.trained
        if not now:
            return False
        fresh = bool(self._trained) and self._trained.isdisjoint(now)
        self._trained = now
        return fresh

    def quiet(self, lay: Layout, src) -> bool:
        """Nothing ``look`` reads can have changed since it last looked (the usual step)."""
        return lay is self.lay and src is self.src and (self.token is None or src.state.changes == self.token)

    def quiet_block(self, lay: Layout, sources: list) -> bool:
        """``quiet`` at every step of a block (``sources``: each step's optimizers):
        only their learning rates moved.  True leaves what ``look`` at each step
        would; False changes nothing (the steps are judged one by one)."""
        if self._names is None or lay is not self.lay and (not lay.trained or lay.trained != self._trained):
            return False                 # (a layout of other parameters: the steps are looked at one by one)
        src = self.src
        for s in sources:
            if s is not src:
                if getattr(s, "state", None) is not None or tuple([n for n, _ in s]) != self._names:
                    return False
                src = s
        if src is not self.src:
            self.src, self.token = src, None
        self.lay = lay                   # (the step of observed activations and the next: another list, the same parameters)
        return True

    def look(self, lay: Layout, ctx) -> bool:
        """Does the step of ``ctx`` start a new run: new parameters (``new_run``),
        or new optimizers over the same ones?"""
        src = ctx.opt_source
        state = getattr(src, "state", None)
        self.token = state.changes if state is not None else None
        self.src = src if state is None or self.token is not None else None
        fresh = self.new_run(lay)
        now = lay.trained
        if not now:
            return fresh
        try:
            opts = ctx.optimizers
        except Exception:                # (a trace without the optimizers' records)
            self.src = None
            return fresh
        names = tuple([n for n, _ in opts])
        if names == self._names and not fresh:
            return False                 # the same optimizers (a learning rate moved)
        holding = frozenset(n for n, o in opts if any(ctx.param_name(p) in now
                                                      for g in o.param_groups for p in g["params"]))
        if not holding:
            if names:                    # (the one that stepped is gone at the step's end: look again)
                self.src = None
            else:                        # (no optimizer: hand-written updates)
                self._names = names
            return fresh
        self._names = names
        new = not fresh and bool(self._stepping) and holding.isdisjoint(self._ever) \
            and self.last is not None and self._since is not None and self.last > self._since
        if holding != self._stepping:
            self._stepping, self._since = holding, ctx.step
        self._ever |= holding
        return fresh or new


class Tensors:
    """Layouts of the steps of a run, looked up by the step's list of series
    (in a training loop the same one step after step; a few alternate when
    optimizers take turns), and the slot of every parameter seen."""
    KEEP = 8

    def __init__(self):
        self.slot_of: dict = {}
        self.n_slots = 0
        # slot -> share of its gradient's entries that are not exactly zero, as
        # the last step that measured it said (zero_frac: the full steps)
        self.live = np.ones(0)
        self._layouts: dict = {}
        self._by_list: dict = {}        # id of a step's names list -> (that list, its Layout)
        self._last = (None, None)

    def update(self, ctx) -> Layout:
        names = ctx.names
        last_names, last = self._last
        if names is last_names:
            return last
        known = self._by_list.get(id(names))
        if known is not None and known[0] is names:     # (the recorder reuses a layout's list)
            self._last = known
            return known[1]
        if names == last_names:        # a new list, the same series: cheaper to compare than to key anew
            self._last = (names, last)
            return last
        key = tuple(names)
        lay = self._layouts.get(key)
        if lay is None:
            rows: dict = {k: {} for k in _KINDS}
            losses = []
            for i, (n, k) in enumerate(names):
                d = rows.get(k)
                if d is not None and n.startswith(CLIP_SERIES):
                    continue             # (clip_grad_norm_'s total: no parameter's row)
                if d is not None and n not in d:
                    d[n] = i
                elif k == "loss":
                    losses.append((i, n))
            order = list(rows["param"]) + [n for n in rows["grad"] if n not in rows["param"]]
            for n in order:
                self.slot_of.setdefault(n, len(self.slot_of))
            self.n_slots = len(self.slot_of)
            if len(self._layouts) >= self.KEEP:
                self._layouts.pop(next(iter(self._layouts)))
            lay = self._layouts[key] = Layout(order, rows, self.slot_of, losses)
            lay.owner = self
        self._last = (names, lay)
        if len(self._by_list) < 64:
            self._by_list[id(names)] = self._last
        return lay


_SHARED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()     # a run's Naming -> Tensors


def layout(ctx, own: Tensors) -> tuple:
    """(Tensors, Layout) of the step: one Tensors per run shared by the rules
    (keyed by the run's naming), so the layout is found once per step; a
    rule's own when there is no session (a trace, tests).  The run's is looked
    up once a step, for all the rules (kept by the step's context)."""
    if ctx.naming is None:
        return own, own.update(ctx)
    got = ctx.shared.get("layout")
    if got is None:
        try:
            t = _SHARED.get(ctx.naming)
            if t is None:
                t = _SHARED[ctx.naming] = Tensors()
        except TypeError:
            return own, own.update(ctx)
        got = ctx.shared["layout"] = (t, t.update(ctx))
    return got


# A gradient with more exact zeros than this is judged by its nonzero entries.
MOSTLY_ZERO = 0.5


def live_share(ctx, lay) -> np.ndarray:
    """Per layout position: the share of the gradient's entries that count
    for its RMS: 1, or for a gradient that is mostly exact zeros (an
    embedding: only the rows of the batch's tokens) the share of nonzero
    entries.  Measured at full steps (``zero_frac``) and carried over to the
    steps between them: which rows a batch touches changes, how many barely."""
    def compute():
        t = lay.owner
        if t.live.shape[0] < t.n_slots:
            t.live = fit(t.live, t.n_slots, 1.0)
        zf = lay.take(ctx, "grad", "zero_frac")
        seen = np.isfinite(zf)
        if np.count_nonzero(seen):
            t.live[lay.slots[seen]] = np.where(zf[seen] > MOSTLY_ZERO, 1.0 - zf[seen], 1.0)
        return t.live[lay.slots]
    return lay.per_step(ctx, "live_share", compute)


def learn_live_share(block, lay) -> None:
    """``live_share``'s learning over a block of steps judged together (nndb.rules.block): the
    last ``zero_frac`` each gradient had in it, carried on from there."""
    zf = block.take(lay, "grad", "zero_frac")
    seen = np.isfinite(zf)
    if not np.count_nonzero(seen):
        return
    t = lay.owner
    if t.live.shape[0] < t.n_slots:
        t.live = fit(t.live, t.n_slots, 1.0)
    cols = np.flatnonzero(seen.any(axis=0))
    last = zf.shape[0] - 1 - np.argmax(seen[::-1][:, cols], axis=0)
    v = zf[last, cols]
    t.live[lay.slots[cols]] = np.where(v > MOSTLY_ZERO, 1.0 - v, 1.0)


def param_ndims(ctx) -> dict:
    """Parameter name -> number of dimensions, for what the session can see."""
    params = []
    for _, opt in ctx.optimizers:
        for group in opt.param_groups:
            params.extend(group["params"])
    if ctx.naming is not None:
        params.extend(ctx.naming.root_params())
    out: dict = {}
    for p in params:
        out.setdefault(ctx.param_name(p), p.dim())
    return out


def trains_nothing(ctx, lay: Layout) -> bool:
    """Is the step no training step: no optimizer, and it changed no parameter (every
    ``update`` row exactly 0)?  With no optimizer each ``backward()`` that reaches a parameter
    is taken for a hand-written step, and so is a backward for an input's gradient through a
    model nothing trains (FGSM's attack, a saliency map): the rules that judge training leave
    such steps alone.  A step with no ``update`` row (none measured yet) is judged."""
    def compute():
        u = lay.take(ctx, "update", "norm")[lay.u >= 0]
        return bool(u.size) and not np.count_nonzero(u) and not ctx.optimizers
    return lay.per_step(ctx, "trains_nothing", compute)


def optimizer_lr(ctx, name=None):
    """Without ``name``: {optimizer name: its largest learning rate}.  With it:
    the learning rate of the parameter group holding that parameter (None if
    no optimizer holds it)."""
    if name is None:
        out = {}
        for oname, opt in ctx.optimizers:
            lrs = [lr_number(g.get("lr")) for g in opt.param_groups]
            lrs = [x for x in lrs if x is not None]
            if lrs:
                out[oname] = max(lrs)
        return out
    for _, opt in ctx.optimizers:
        for group in opt.param_groups:
            if any(ctx.param_name(p) == name for p in group["params"]):
                return lr_number(group.get("lr"))
    return None


# Optimizers that divide each element's step by its own gradient scale: the
# size of a gradient does not make the size of the update (down to eps).
ADAPTIVE = frozenset({"Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta",
                      "SparseAdam", "Adafactor"})
# Optimizers whose one step() runs many iterations of their own (LBFGS: up to
# max_iter quasi-Newton moves, each scaled by curvature, not lr x a gradient): the
# size of one step's update says nothing of the learning rate.
MULTI_ITERATION = frozenset({"LBFGS"})


def family(opt) -> str:
    """An optimizer's class name as the rules read it (a trace's stand-in: the class the
    trace recorded, or its own where the trace predates that)."""
    return getattr(opt, "family", None) or type(opt).__name__


def adaptive_eps(opt) -> Optional[float]:
    """The ``eps`` of an optimizer of Adam's family (ADAPTIVE), under which a
    gradient far smaller than another's still moves its weights as much, as
    long as it stays well above eps; None for any other optimizer (SGD, LBFGS,
    or one a trace written before the class was recorded stands in for)."""
    if family(opt) not in ADAPTIVE or not opt.param_groups:
        return None
    eps = opt.param_groups[0].get("eps")
    if isinstance(eps, (tuple, list)):      # (Adafactor's pair: the first is the gradient's)
        eps = eps[0] if eps else None
    return float(eps) if isinstance(eps, (int, float)) else 1e-8


class Streaks:
    """Per-slot counts of consecutive flagged steps (those the rule saw), the step each
    streak began, and a ring of the last ``ring`` values (for the evidence:
    written only while some streak runs, so a reported streak of ``ring``
    steps finds all its values there)."""

    def __init__(self, ring: int):
        self.n = 0
        self.count = np.zeros(0, dtype=np.int64)
        self.since = np.zeros(0, dtype=np.int64)
        self.hist = np.zeros((0, max(ring, 1)))
        self.i = 0                      # recorded steps seen
        self.active = False             # some streak is running

    def grow(self, n: int) -> None:
        if n > self.n:
            self.count, self.since = fit(self.count, n, 0), fit(self.since, n, 0)
            self.hist = fit(self.hist, n, np.nan)
            self.n = n

    def update(self, slots: np.ndarray, flags: np.ndarray, step: int, values=None):
        """Count this step's flags (and keep ``values`` for the evidence);
        returns the streak lengths of ``slots``, or None when nothing is
        flagged and nothing was (the common case: no more work)."""
        self.i += 1
        if not self.active and not np.count_nonzero(flags):
            return None
        if values is not None:
            self.hist[slots, self.i % self.hist.shape[1]] = values
        st = (self.count[slots] + 1) * flags
        self.since[slots[st == 1]] = step
        self.count[slots] = st
        self.active = bool(np.count_nonzero(self.count))
        return st

    def recent(self, slot: int) -> list:
        h = self.hist.shape[1]
        return [num(self.hist[slot, (self.i - j) % h]) for j in range(h - 1, -1, -1)]


def theil_sen(y: np.ndarray, x: np.ndarray, z: float = 1.96) -> tuple:
    """(slope, low, high): the Theil-Sen slope of ``y`` over ``x`` (the median
    of the slopes of all pairs: a spike or two moves it by little) and Sen's
    (1968) distribution-free confidence bounds for it, at ``z`` normal
    quantiles (from the variance of Kendall's S: no assumption on the noise).
    O(n^2) pairs: callers pass a few dozen points (block medians)."""
    n = len(y)
    if n < 3:
        return math.nan, math.nan, math.nan
    i, j = np.triu_indices(n, 1)
    with np.errstate(all="ignore"):
        s = (y[j] - y[i]) / (x[j] - x[i])
    s = np.sort(s[np.isfinite(s)])
    m = s.size
    if m == 0:
        return math.nan, math.nan, math.nan
    c = z * math.sqrt(n * (n - 1) * (2 * n + 5) / 18.0)
    lo = min(max(int(math.floor((m - c) / 2.0)), 0), m - 1)
    hi = max(min(int(math.ceil((m + c) / 2.0)), m - 1), 0)
    return float(np.median(s)), float(s[lo]), float(s[hi])


def block_medians(v: np.ndarray, blocks: int) -> tuple:
    """(y, x): medians of ``v`` in ``blocks`` consecutive blocks of (about)
    equal length, and the blocks' centres (positions in ``v``)."""
    b = max(1, min(blocks, len(v)))
    edges = np.round(np.arange(b + 1) * (len(v) / b)).astype(np.int64)
    y = np.array([np.median(v[edges[k]:edges[k + 1]]) for k in range(b)])
    return y, (edges[:-1] + edges[1:] - 1) / 2.0


def fit(a: np.ndarray, n: int, fill) -> np.ndarray:
    """``a`` grown (along its first axis) to ``n`` entries, new ones ``fill``."""
    if a.shape[0] >= n:
        return a
    extra = np.full((n - a.shape[0],) + a.shape[1:], fill, dtype=a.dtype)
    return np.concatenate([a, extra])


def num(x):
    """A float for the report (JSON): None for NaN and infinities."""
    x = float(x)
    return x if math.isfinite(x) else None


def by_group(idx, groups: np.ndarray, side: np.ndarray) -> dict:
    """Layout positions ``idx`` split by (optimizer, side), in order."""
    out: dict = {}
    for k in list(idx):
        out.setdefault((int(groups[k]), bool(side[k])), []).append(int(k))
    return out


def also(others: list) -> str:
    if not others:
        return ""
    more = f" and {len(others) - 3} more" if len(others) > 3 else ""
    return f"; also {', '.join(others[:3])}{more}"
