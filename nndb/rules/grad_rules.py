"""Rules about the gradients an optimizer is given: parameters that never get
one (``grad_none``) and gradients that are never reset between optimizer
steps (``stale_grad``).

Both look at the optimizers' parameters at the return of each
``optimizer.step()`` (the probes' "post" callback): at that moment ``.grad`` is
still exactly what the step used (optimizers read gradients, they do not
clear them), also for closure optimizers such as LBFGS, which run their
forward and backward passes *inside* ``step()`` (at "pre" a first LBFGS step
has seen no gradient yet).  Their facts are ready before the step closes, so
a finding is reported at the step where it happened.
"""
from __future__ import annotations

import math
import weakref

import torch

from .. import cadence
from .base import Rule, Threshold
from ..tracer.quiet import PROFILING as _PROFILING, profiled, unprofiled
from .probes import Probe, register


# -- grad_none -------------------------------------------------------------------------------
@register
class GradPresence(Probe):
    """Which parameters of an optimizer (with requires_grad) have no ``.grad``
    at its step.  Cheap: looked at on the steps ``cadence.grad_presence`` names while every
    parameter had a gradient (the probe is not even called on the others);
    once one is missing, at every step until it has a gradient again (so
    consecutive checks are consecutive steps).

    A parameter missing at a check gets a post-accumulate-grad hook until it has a gradient
    again, which tells whether a backward made it one since: one that the script then set to
    None before the step (``p.grad = None``: DINO freezes its last layer so for the first
    epoch; a ``zero_grad()`` between ``backward()`` and ``step()``) is ``dropped``, not cut
    from the loss."""
    name = "grad_presence"
    OPTIMIZER = True

    def __init__(self, rec):
        super().__init__(rec)
        self._lacking: "weakref.WeakSet" = weakref.WeakSet()     # optimizers whose last check missed one
        self._had: dict = {}           # id(param) -> weakref to it: parameters seen with a gradient at a check
        self._hooked: dict = {}        # id(param) -> (weakref, hook handle): parameters missing at their last check
        self._reached: set = set()     # ids of those that a backward gave a gradient since that check

    def wants(self, step: int) -> bool:
        return step % cadence.PRESENCE_EVERY == 0 or bool(self._lacking)

    def next_change(self, step: int) -> int:
        """(cadence.next_change) While in, asked again at the next step (what it sees
        decides); out, at the next checked step."""
        if self.wants(step):
            return step + 1
        return (step // cadence.PRESENCE_EVERY + 1) * cadence.PRESENCE_EVERY

    def uninstall(self) -> None:
        super().uninstall()
        for _, h in self._hooked.values():
            h.remove()
        self._hooked.clear()
        self._reached.clear()

    def _accumulated(self, p) -> None:
        self._reached.add(id(p))

    def optimizer(self, opt, when: str) -> None:
        if when != "post":
            return
        had, hooked, reached = self._had, self._hooked, self._reached
        missing, dropped, with_grad = [], [], False
        for g in opt.param_groups:
            for p in g["params"]:
                key = id(p)
                h = hooked.get(key)
                if h is not None and h[0]() is not p:
                    h = None                    # (a freed tensor's id, reused)
                if p.grad is None:
                    if p.requires_grad:
                        (dropped if h is not None and key in reached else missing).append(p)
                        if h is None:
                            hooked[key] = (weakref.ref(p), p.register_post_accumulate_grad_hook(self._accumulated))
                else:
                    with_grad = True
                    if h is not None:
                        hooked.pop(key)[1].remove()
                    w = had.get(key)
                    if w is None or w() is not p:
                        had[key] = weakref.ref(p)
                reached.discard(key)
        if missing or dropped:
            self._lacking.add(opt)
        else:
            self._lacking.discard(opt)
        if not with_grad:
            # every gradient the step had was thrown away: the optimizer updates nothing
            missing += dropped
        self.facts.setdefault("checks", []).append({
            "optimizer": self.naming.optimizer_name(opt),
            "missing": [(id(p), self.naming.param_name(p)) for p in missing],
            # of those, the ones that had a gradient at an earlier check (used on some steps only)
            "had": [id(p) for p in missing if (w := had.get(id(p))) is not None and w() is p],
            # the ones a backward gave a gradient that the script set to None before the step
            "dropped": [id(p) for p in dropped],
        })


class GradNone(Rule):
    id = "grad_none"
    severity = "warning"
    explanation = ("a parameter given to an optimizer, with requires_grad, gets no gradient (.grad is None "
                   "at its steps): cut from the loss by detach()/.data/no_grad, or an unused branch; one "
                   "that had gradients at earlier steps is used on some steps only (dynamic control flow) "
                   "and is named only when it stops getting them for much longer than it ever went without; "
                   "one whose gradient backward() made and the script set to None before the step (a layer "
                   "frozen so for a while: DINO's last layer in its first epoch) is not named, unless every "
                   "parameter's was (a zero_grad() between backward() and step())")
    THRESHOLDS = {
        "steps": Threshold(5, "consecutive optimizer steps without a gradient, for a parameter that never had "
                              "one: one first used within 5 steps (round-robin over up to 5 task heads) is not "
                              "flagged; a cut graph shows from the first step, so this only delays the report "
                              "by 4 steps"),
        "stopped": Threshold(50, "consecutive steps without a gradient for a parameter that had one before "
                                 "(and 'gap_factor' times its longest gap so far): the dynamic_net tutorial "
                                 "skips its x^4 weight on a random third of the steps, 5 in a row by step 554 "
                                 "of 3000; 50 in a row at that rate is a 1e-24 chance"),
        "gap_factor": Threshold(4, "times the longest run of steps the parameter went without a gradient "
                                   "and got one again (a round-robin over 20 task heads leaves each 19 "
                                   "steps in 20)"),
    }
    PROBES = ("grad_presence",)

    def __init__(self):
        super().__init__()
        self.reset()

    def reset(self) -> None:
        self._runs: dict = {}          # optimizer name -> {param id: consecutive steps without grad}
        self._gaps: dict = {}          # optimizer name -> {param id: the longest gap it came back from}
        self._had: dict = {}           # optimizer name -> {param ids known to have had a gradient}

    def check(self, ctx):
        need = max(1, int(self.params["steps"]))
        stop, factor = max(need, int(self.params["stopped"])), float(self.params["gap_factor"])
        for c in ctx.facts.get("grad_presence", {}).get("checks", ()):
            opt = c["optimizer"]
            prev = self._runs.get(opt, {})
            gaps = self._gaps.setdefault(opt, {})
            had = self._had.setdefault(opt, set())
            had.update(c.get("had", ()))
            now = {pid: prev.get(pid, 0) + 1 for pid, _ in c["missing"]}
            for pid, n in prev.items():
                if pid not in now:                  # it got its gradient back
                    gaps[pid] = max(gaps.get(pid, 0), n)
                    had.add(pid)
            self._runs[opt] = now
            dropped = set(c.get("dropped", ()))
            never = [(pid, name) for pid, name in c["missing"] if pid not in had and now[pid] >= need]
            if never:
                names = [name for _, name in never]
                more = f" and {len(names) - 4} more" if len(names) > 4 else ""
                why = (f"backward() gave it one, and the script set .grad to None before {opt}.step() (every "
                       f"parameter's: {opt} updates nothing; a zero_grad() between backward() and step()?)"
                       if all(pid in dropped for pid, _ in never) else
                       "is it used in the forward pass, or cut from the loss by detach(), .data or torch.no_grad()?")
                yield self.finding(
                    ctx, f"{', '.join(names[:4])}{more} got no gradient at {need} consecutive steps of {opt} "
                         f"although requires_grad is set (.grad is None): {why}",
                    tensor=names[0], optimizer=opt, params=names, steps=need)
            gone = [(pid, name) for pid, name in c["missing"]
                    if pid in had and now[pid] >= max(stop, factor * gaps.get(pid, 0))]
            if gone:
                names = [name for _, name in gone]
                longest = max(gaps.get(pid, 0) for pid, _ in gone)
                before = (f"the longest it went without one before: {longest} step(s)" if longest else
                          "it had one at every step checked before")
                more = f" and {len(names) - 4} more" if len(names) > 4 else ""
                yield self.finding(
                    ctx, f"{', '.join(names[:4])}{more} had gradients at earlier steps of {opt} but none at the "
                         f"last {now[gone[0][0]]} consecutive steps ({before}): is the branch that uses it no "
                         "longer taken, or is it now cut from the loss by detach(), .data or torch.no_grad()?",
                    tensor=names[0], optimizer=opt, params=names, steps=now[gone[0][0]], longest_gap=longest)


# -- stale_grad --------------------------------------------------------------------------------
class _Watch:
    """One optimizer's sample parameter: the gradient it had at the optimizer's
    last step, and the sum of the gradients that arrived since then."""
    __slots__ = ("opt", "param", "handle", "last", "incoming", "pending", "armed", "call", "calls", "kept",
                 "seen", "born", "__weakref__")

    def __init__(self, opt, param, born: int = 0):
        self.opt = weakref.ref(opt)
        self.param = weakref.ref(param)
        self.seen = 1            # the optimizer's steps the probe saw (from the one that made the watch)
        self.born = born         # the step that made it
        self.handle = None       # (the tensor hook's and the post-accumulate-grad hook's handles)
        self.last = None
        self.incoming = None
        self.pending = None      # (graph task, the gradient) the tensor hook saw last, until it is accumulated
        self.armed = True        # the hook sums incoming gradients only before a checked step
        # A closure's calls in the step (Tracer.closure_calls), and for each call after the step's
        # first, whether .grad held a gradient as the call's first one came: None where it was
        # None, else a 0-dim bool tensor (a nonzero element), read at the step (no
        # synchronisation in the backward)
        self.call = None
        self.calls = 0
        self.kept: list = []


# A sparse gradient (nn.Embedding(sparse=True) under SparseAdam) is compared as the dense tensor
# it stands for, on a parameter of at most this many elements (its copies are held a step).
SPARSE_SAMPLE_MAX = 1 << 22
# Parameters whose gradient _sample looks at for one not all 0 (one synchronisation each, once per
# optimizer): the rest of a model whose first 16 candidates all have a zero gradient is no likelier.
SAMPLE_TRIES = 16


def _sample(opt, any_grad: bool = False):
    """A small parameter of the optimizer with a gradient now: the smallest one with at least
    16 elements, else the largest (with one element, a gradient and its sum with another are
    always parallel: only their sizes tell them apart, StaleGrad's second test); one with a
    dense gradient where there is one, else (an optimizer of sparse embeddings alone: SparseAdam)
    one with a sparse gradient.  Of these, the first in that order whose gradient is not all 0
    (of the first SAMPLE_TRIES): a zero last gradient tells nothing at the next step (LoRA's A,
    whose B starts at 0, or a branch behind a gate initialised to 0: the smallest tensor, and
    .grad 0 at step 0 alone; `nndb check`, which looks at step 1 alone, said 'none was' and
    missed a missing zero_grad()).  ``any_grad``: among all of them, with a gradient or not
    (before a closure optimizer's first step)."""
    ps = [p for g in opt.param_groups for p in g["params"]
          if p.requires_grad and (any_grad or p.grad is not None) and p.numel() >= 1]
    ps = [p for p in ps if p.grad is None or not p.grad.is_sparse] or \
        [p for p in ps if p.numel() <= SPARSE_SAMPLE_MAX]
    if not ps:
        return None
    order = sorted((p for p in ps if p.numel() >= 16), key=lambda p: p.numel()) + \
        sorted((p for p in ps if p.numel() < 16), key=lambda p: -p.numel())
    return next((p for p in order[:SAMPLE_TRIES] if p.grad is not None and _any_nonzero(p.grad)), order[0])


def _any_nonzero(g) -> bool:
    g = g.detach()
    # (no copy of a dense one: a large bfloat16 gradient's; a sparse one's values alone)
    return bool((g.coalesce().values() if g.is_sparse else g).any())


def _flat(t):
    t = t.detach()
    return (t.to_dense() if t.is_sparse else t).reshape(-1).to(torch.float32)


_GRAPH_TASK = torch._C._current_graph_task_id        # -1 outside a backward


def _take_pending(w: _Watch) -> None:
    """The gradient the tensor hook saw, accumulated into .grad now: into the sum; the first
    of a closure call: is .grad reset?"""
    pending, w.pending = w.pending, None
    if w.armed and pending is not None:
        g = pending[1]
        w.incoming = g if w.incoming is None else w.incoming.add_(g)
        if pending[2] is not None and pending[2] != w.call:
            w.call = pending[2]
            w.calls += 1
            if w.calls > 1:
                w.kept.append(pending[3])


def _held(grad):
    """Does .grad (as a gradient arrives) hold one: None where it is None, else whether it has
    a nonzero element, a 0-dim tensor (a sparse one counts as None: not looked into)."""
    if grad is None or grad.is_sparse:
        return None
    return grad.detach().any()


def _unhook(w: _Watch) -> None:
    if w.handle is not None:
        for h in w.handle:
            h.remove()
        w.handle = None
    w.pending = None


@register
class GradReset(Probe):
    """Was the gradient reset since the optimizer's last step?  For one sample
    parameter per optimizer a tensor hook (it sees each incoming gradient
    before it is added to ``.grad``) sums the gradients since the optimizer's
    last step.  At the next step ``.grad`` (g) is compared with the last step's
    gradient (l) plus that sum (i): g parallel to l + i but not to i alone
    means that l was never cleared.  (Parallel, not equal: gradient clipping
    and AMP's unscaling rescale .grad in place.)  Facts: relative residuals
    ``r_stale`` = |g - a(l+i)| / |g| and ``r_reset`` = |g - b i| / |g| with the
    least-squares a, b (``scale``: a); where l and i are parallel (full-batch
    training, a one-element parameter) only the sizes tell (StaleGrad.is_stale)."""
    name = "grad_reset"
    OPTIMIZER = True
    # The checked steps are the cadence's (cadence.grad_reset), named here for readers of the probe.
    FIRST, EVERY = cadence.RESET_FIRST, cadence.RESET_EVERY
    # A checked step, and the step before it (which keeps its gradient and puts
    # the tensor hook on); the probe is not called on the others, but for the
    # first FIRST steps of each optimizer (``_young``).

    def wants(self, step: int) -> bool:
        return cadence.grad_reset_armed(step) or (not self._grown and self._young(step))

    def next_change(self, step: int) -> int:
        """(cadence.next_change) While an optimizer is young, asked again at the next step."""
        if not self._grown and self._young(step):
            return step + 1
        return cadence.next_change(cadence.grad_reset_armed, step)

    def _young(self, step: int) -> bool:
        """Has an optimizer had fewer than FIRST of its steps checked, within EVERY steps of its
        first?  An optimizer that steps only on some steps (a WGAN's generator, once every
        n_critic critic steps) is checked at its own first steps, as one that steps at every
        step is at the run's first: the checked steps alone (0-5, then two in 50) met it once,
        then never twice in a row (steps 3, 6, 9, ...), and its missing zero_grad() was never
        found."""
        if any(w.seen < self.FIRST and step <= w.born + self.EVERY for w in self._watches.values()):
            return True
        self._grown = True            # (for good: until a watch is made, none is young again)
        return False

    def __init__(self, rec):
        super().__init__(rec)
        self._watches: dict = {}      # id(optimizer) -> _Watch
        self._grown = False           # no watch young (_young): the usual step asks nothing more

    def uninstall(self) -> None:
        super().uninstall()
        for key in list(self._watches):
            self._drop(key)

    def held_tensors(self) -> list:
        return [t for w in self._watches.values() for t in (w.last, w.incoming) if t is not None]

    def _drop(self, key) -> None:
        w = self._watches.pop(key)
        _unhook(w)

    def _watch_hooks(self, w, p) -> tuple:
        """The tensor hook sees each gradient computed for ``p``: a backward's, which is
        added to ``.grad``, and also ``torch.autograd.grad``'s (MAML's inner loop, a gradient
        penalty: ``create_graph`` gradients of the parameters), which is not.  So it keeps
        the gradient it saw, and the post-accumulate-grad hook, which only a backward that
        adds to ``.grad`` calls, adds it to the sum.  (Summed in the tensor hook, a MAML loop's
        inner gradients were in it: .grad matched neither last + new nor new alone, and a
        missing meta zero_grad() was never found.)"""
        def seen(grad):
            if self.error is not None:
                return None
            hidden = _PROFILING() and unprofiled()     # (the probe's copies: no rows in the script's profile)
            try:
                if not w.armed or grad is None:
                    w.pending = None
                else:
                    t = self.tracer     # (a stand-in without the counters: no closure)
                    call = t.closure_calls if getattr(t, "in_closure", 0) else None
                    q = w.param()       # (not the hook's own parameter: no cycle holds it)
                    held = _held(q.grad) if call is not None and call != w.call and q is not None else None
                    w.pending = (_GRAPH_TASK(), _flat(grad).clone(), call, held)
            except Exception as e:     # never raise into the backward pass
                self.fail(f"probe {self.name} failed and is off: {type(e).__name__}: {e}")
            finally:
                if hidden:
                    profiled()
            return None

        def accumulated(param):
            if self.error is not None:
                return
            hidden = _PROFILING() and unprofiled()
            try:
                _take_pending(w)
            except Exception as e:
                self.fail(f"probe {self.name} failed and is off: {type(e).__name__}: {e}")
            finally:
                if hidden:
                    profiled()
        return p.register_hook(seen), p.register_post_accumulate_grad_hook(accumulated)

    def optimizer(self, opt, when: str) -> None:
        key = id(opt)
        if when != "post":
            # (a closure optimizer watched from its first step on: its calls there are checked)
            if getattr(self.tracer, "closure_step", False) and key not in self._watches:
                p = _sample(opt, any_grad=True)
                if p is not None:
                    w = self._watches[key] = _Watch(opt, p, self.rec.recorder.step)
                    self._grown = False
                    w.handle = self._watch_hooks(w, p)
            return
        w = self._watches.get(key)
        if w is not None and (w.opt() is not opt or w.param() is None):
            self._drop(key)                               # a new optimizer at a reused address
            w = None
        if w is None:
            p = _sample(opt)
            if p is None:
                return                                    # look again at the next step
            w = self._watches[key] = _Watch(opt, p, self.rec.recorder.step)
            self._grown = False
            w.handle = self._watch_hooks(w, p)
            w.last = _flat(p.grad).clone()
            return
        p = w.param()
        if w.pending is not None and w.pending[0] != -1 and w.pending[0] == _GRAPH_TASK():
            # (an optimizer stepped by a post-accumulate-grad hook, "optimizer in backward":
            # this backward's gradient is in .grad already, its accumulated hook not yet run)
            _take_pending(w)
        check_now = w.armed
        w.seen += 1
        step = self.rec.recorder.step
        # the next step is checked: keep this step's gradient and sum what comes
        # (the tensor hook is on the parameter only then: a Python call in every
        # backward pass costs a small model's step a few percent)
        w.armed = cadence.grad_reset(step + 1) or (w.seen < self.FIRST and step + 1 <= w.born + self.EVERY)
        if w.armed and w.handle is None:
            w.handle = self._watch_hooks(w, p)
        elif not w.armed and w.handle is not None:
            _unhook(w)
        if not check_now and not w.armed:
            return
        g = None if p.grad is None else _flat(p.grad)
        last, inc = w.last, w.incoming
        w.last = g.clone() if (g is not None and w.armed) else None
        w.incoming = None
        calls, kept = w.calls, w.kept
        w.call, w.calls, w.kept = None, 0, []
        # a closure called again and again in the step (LBFGS's line search) whose every call after
        # the first found .grad holding the gradients of the calls before it (one synchronisation,
        # only then: a closure that resets them leaves Nones)
        within = (check_now and calls > 1 and all(k is not None for k in kept) and len(kept) == calls - 1
                  and bool(torch.stack(kept).all()))
        c = None
        if check_now and g is not None and last is not None and inc is not None \
                and g.shape == last.shape == inc.shape:
            c = _compare(g, last, inc)
        if within:
            c = dict(c or {}, calls=calls, within=True)
        if c is not None:
            # (named now: at the optimizer's first step, before step 0 ended, a model of several
            # roots had its names unqualified yet: 'weight' for 'emb.weight')
            self.facts.setdefault("checks", []).append(
                {"optimizer": self.naming.optimizer_name(opt), "param": self.naming.param_name(p), **c})


def _compare(g, last, inc):
    """The residuals of .grad (g) against a (last + new) and b new (GradReset), or None where
    they say nothing (a zero or non-finite gradient)."""
    # Every dot product of g, l and i from one float64 Gram matrix, in one
    # transfer to the host (one synchronisation on a GPU).
    m = torch.stack([g, last, inc]).double()
    (gg, gl, gi), (_, ll, li), (_, _, ii) = (m @ m.T).tolist()
    if not (gg > 0 and ll > 0 and ii > 0) or not math.isfinite(gg + ll + ii):
        return None
    gs, ss = gl + gi, ll + 2 * li + ii        # g.s and s.s for s = l + i
    if not ss > 0:
        return None
    a = gs / ss                               # least squares: g ~ a (l + i), g ~ b i
    # |g - a s|^2 = g.g - (g.s)^2 / s.s, and likewise for i (float64: the
    # cancellation costs nothing near the rule's 1e-3 tolerance)
    rs = math.sqrt(max(gg - gs * gs / ss, 0.0))
    rr = math.sqrt(max(gg - gi * gi / ii, 0.0))
    gn, ln, n_in = math.sqrt(gg), math.sqrt(ll), math.sqrt(ii)
    return {"r_stale": rs / gn, "r_reset": rr / gn, "scale": a,
            "grad_norm": gn, "last_norm": ln, "incoming_norm": n_in}


class StaleGrad(Rule):
    id = "stale_grad"
    severity = "error"
    explanation = ("gradients are not reset between optimizer steps (zero_grad missing): each step "
                   "uses the sum of all gradients so far; accumulation within a step is fine, but not "
                   "between the calls of an optimizer's closure (LBFGS's line search), each of which "
                   "needs its own gradient: found at once, at the step where every call after the "
                   "first found .grad holding the calls' before it")
    THRESHOLDS = {
        "steps": Threshold(2, "consecutive optimizer steps whose .grad still held the last step's "
                              "gradient: one could be a deliberate one-off, two in a row is a pattern"),
        "tol": Threshold(1e-3, "relative residual of .grad against (last step's grad + new grads): "
                               "float32 re-summation differs by ~1e-6, clipping/AMP rescaling by 0"),
        "min_share": Threshold(0.05, "relative residual of .grad against the new grads alone, below which "
                                     "the old gradient is too small to tell the two cases apart; where "
                                     "they are parallel (full-batch training, one-element parameters), "
                                     "how far .grad / new, with .grad exactly last + new, is from 1"),
    }
    PROBES = ("grad_reset",)

    def __init__(self):
        super().__init__()
        self._runs: dict = {}          # optimizer name -> consecutive stale steps

    @staticmethod
    def is_stale(c: dict, tol: float, share: float) -> bool:
        """Did .grad hold the last step's gradient at the step of the probe's check ``c``?"""
        if c.get("within"):
            return True             # a closure's calls added their gradients to each other's
        if "r_stale" not in c or not (c["r_stale"] <= tol and c["scale"] > 0):
            return False            # .grad is not (a multiple of) the last step's gradient plus the new ones
        if c["r_reset"] >= share:
            return True             # ... and not a multiple of the new ones alone
        # Not a multiple of either alone: the last gradient and the new one are parallel
        # (full-batch training, the same batch again, a one-element parameter).  Unscaled (no
        # clipping or unscaling, which only shrink it), .grad = last + new exactly, with the
        # last a share of it: then |.grad - new| = |last|.
        return abs(c["scale"] - 1) <= tol and c["last_norm"] >= share * c["grad_norm"]

    def reset(self) -> None:
        self._runs = {}

    def check(self, ctx):
        need = max(1, int(self.params["steps"]))
        for c in ctx.facts.get("grad_reset", {}).get("checks", ()):
            opt = c["optimizer"]
            stale = self.is_stale(c, self.params["tol"], self.params["min_share"])
            n = self._runs[opt] = self._runs.get(opt, 0) + 1 if stale else 0
            if c.get("within"):
                # (at once: the closure's calls in one step are a pattern already)
                yield self.finding(
                    ctx, f"gradients are not reset between the calls of {opt}'s closure ({c['calls']} calls "
                         f"in the step: {c['param']}.grad held the gradient of the calls before it when "
                         "each call's came, so each call's gradient is the sum of all so far): call "
                         "zero_grad() at the start of the closure",
                    tensor=c["param"], optimizer=opt, steps=n, calls=c["calls"],
                    **{k: c[k] for k in ("r_stale", "r_reset", "scale", "grad_norm", "last_norm",
                                         "incoming_norm") if k in c})
            elif n >= need:
                yield self.finding(
                    ctx, f"gradients are not reset between the steps of {opt} ({n} in a row: "
                         f"{c['param']}.grad held the last step's gradient plus the new one): call "
                         "zero_grad() once per step (after step() when accumulating over several "
                         "backward passes)",
                    tensor=c["param"], optimizer=opt, steps=n,
                    **{k: c[k] for k in ("r_stale", "r_reset", "scale", "grad_norm", "last_norm",
                                         "incoming_norm")})


RULES = [GradNone, StaleGrad]
