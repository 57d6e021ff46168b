"""Changing an optimizer's hyper-parameters in place (``set``, and
``predict --set`` on its replica): numeric ones only, of the same shape, in
every param group or one; holding one at a value (``set --hold``: set again
before each step of the optimizer, until ``unset``); and noticing a change
that the script or a scheduler set back before the optimizer stepped.

Why this size: one question, whether a change holds, asked of every way a
script moves a learning rate: schedulers' closed forms and chained steps, the
scales they keep of their own (OneCycleLR's, SWALR's, a scheduler's arrays),
ReduceLROnPlateau, a schedule driven by hand (ignite's handler); the copies of
the schedulers that answer it (``Shadow``) and the checks that read them share
one convention of what "followed" means."""
from __future__ import annotations

import math
import weakref
from typing import Callable, Optional

from ..errors import CommandError
from ..tracer.quiet import silenced


def set_hyperparameter(name: str, opt, key: str, value, group: Optional[int] = None) -> list:
    """Set ``key`` to ``value`` in ``opt``'s param groups (all, or ``group``):
    [(optimizer name, group, key, was, now)], one a group changed."""
    _check_range(key, value)
    rows = []
    groups = list(enumerate(opt.param_groups))
    if group is not None:
        if not 0 <= group < len(groups):
            raise CommandError(f"{name} has {len(groups)} param group(s); there is no group {group}")
        groups = [groups[group]]
    for gi, g in groups:
        if key not in g or key == "params":
            known = ", ".join(k for k in g if k != "params")
            raise CommandError(f"{name} has no hyper-parameter '{key}' (it has: {known})")
        old = g[key]
        if not is_numeric(old):
            raise CommandError(f"{name}'s '{key}' is {old!r}, not a number: nndb only sets "
                               f"numeric hyper-parameters")
        if isinstance(value, tuple) != isinstance(old, tuple) or \
                (isinstance(value, tuple) and len(value) != len(old)):
            raise CommandError(f"{name}'s '{key}' is {old!r}; give a value of the same shape")
        if _whole(old) and not isinstance(value, tuple) and not float(value).is_integer() and key not in _RANGES:
            raise CommandError(f"{name}'s '{key}' is {old!r}, a whole number: give a whole number, not {value!r}")
        old_repr = plain(old)
        _assign(g, key, value)
        rows.append((name, gi, key, old_repr, plain(g[key])))
    return rows


# The ranges torch.optim's constructors accept (their "Invalid learning rate: -1" and so on):
# a value an optimizer would not have been built with is refused ('set lr -1' was taken, and
# the next step ascended the loss).  key -> (lowest, highest, highest included)
_RANGES = {"lr": (0.0, math.inf, False), "eps": (0.0, math.inf, False), "momentum": (0.0, math.inf, False),
           "weight_decay": (0.0, math.inf, False), "alpha": (0.0, math.inf, False), "rho": (0.0, 1.0, True),
           "betas": (0.0, 1.0, False), "lr_decay": (0.0, math.inf, False)}


def _check_range(key: str, value) -> None:
    rng = _RANGES.get(key)
    if rng is None:
        return
    lo, hi, closed = rng
    for v in (value if isinstance(value, tuple) else (value,)):
        try:
            x = float(v)
        except (TypeError, ValueError):
            return
        if not (lo <= x and (x <= hi if closed or hi == math.inf else x < hi)):      # (NaN: neither)
            what = f"in [{lo:g}, {hi:g}{']' if closed else ')'}" if hi != math.inf else f">= {lo:g}"
            raise CommandError(f"{key} must be {what}, not {v!r} (torch.optim builds no optimizer with it)")


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _assign(g: dict, key: str, value) -> None:
    """``value`` into a param group, as the group holds ``key``: a tensor in
    place (capturable optimizers' lr), a number of the same type, but for a
    fraction where the group holds a whole number (LBFGS's ``lr=1``: 'set lr
    0.5' made it int(0.5), 0, and the optimization stood still; the rates
    torch.optim checks take fractions, set_hyperparameter refuses one for
    another whole number, LBFGS's ``max_iter``)."""
    old = g[key]
    if hasattr(old, "fill_") and not isinstance(value, tuple):
        old.fill_(value)
    elif isinstance(value, tuple) or not isinstance(old, (int, float)) or isinstance(old, bool):
        g[key] = value
    else:
        g[key] = int(value) if _whole(old) and float(value).is_integer() else float(value)


def numpy_number(v):
    """A numpy scalar's Python number, None for anything else (DINO writes its schedules'
    np.float64, or an np.float32, into the param groups)."""
    if type(v).__module__ != "numpy" or getattr(v, "ndim", None) != 0 or v.dtype.kind not in "iuf":
        return None
    return v.item()


def plain(v):
    """A setting as a plain number (or tuple of them): a one-element tensor read, a numpy
    scalar's Python number (the 'did not hold' warning read 'stepped with lr
    np.float64(0.0007515535026209658)')."""
    if hasattr(v, "fill_"):
        return float(v)
    x = numpy_number(v)
    return v if x is None else x


def distance(a, b) -> float:
    """How far apart two settings are (numbers, or tuples/lists of them; log-scale for positive ones)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return sum(distance(x, y) for x, y in zip(a, b))
    a, b = float(a), float(b)
    if a > 0 and b > 0:
        return abs(math.log(a / b))
    return abs(a - b)


def _same(a, b) -> bool:
    """Two lrs equal but for rounding: float32's (a schedule of tensor lrs, OneCycleLR's given a
    tensor max_lr, computes in float32: 0.00376511 against 0.00376511 differed by 2e-8 relative,
    and 'does not follow the change' was said of a schedule that followed)."""
    a, b = float(a), float(b)
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b))


def undone(now, wanted, before) -> bool:
    """A change to ``wanted`` (from ``before``) that reads ``now``: set back
    (nearer the value before than the value set), not merely followed by a
    schedule."""
    return distance(wanted, before) > 0 and distance(now, wanted) >= distance(now, before)


class Holds:
    """Hyper-parameters held at a value (``set HYPER VALUE --hold``): set
    again just before each step of their optimizer (torch's step pre-hook),
    whatever the script or a scheduler set meanwhile, until ``unset``.  A
    hold never breaks the training: one that cannot be applied is let go
    and said at the next step end."""

    def __init__(self):
        # id(optimizer) -> [weakref to it, its name, hook handle, {(group, key): (value, line)}]
        self._held: dict = {}
        self.problems: list = []

    def hold(self, name: str, opt, key: str, value, groups: list, line: str) -> None:
        entry = self._held.get(id(opt))
        if entry is None or entry[0]() is not opt:
            ref = weakref.ref(opt)
            entry = [ref, name, opt.register_step_pre_hook(self._hook(ref)), {}]
            self._held[id(opt)] = entry
        for gi in groups:
            entry[3][(gi, key)] = (value, line)

    def release(self, key: str, name: Optional[str] = None, group: Optional[int] = None) -> list:
        """Let go of ``key`` (in optimizer ``name``'s groups, or every
        optimizer's; all groups, or ``group``): [(name, group, value)] let go."""
        gone = []
        for oid, entry in list(self._held.items()):
            if name is not None and entry[1] != name:
                continue
            for (gi, k), (v, _) in sorted(entry[3].items()):
                if k == key and group in (None, gi):
                    del entry[3][(gi, k)]
                    gone.append((entry[1], gi, v))
            if not entry[3]:
                entry[2].remove()
                del self._held[oid]
        return gone

    def held(self) -> list:
        """[(optimizer name, group, key, value, the command that set it)]."""
        return [(e[1], gi, k, v, line) for e in self._held.values() if e[0]() is not None
                for (gi, k), (v, line) in sorted(e[3].items())]

    def _hook(self, ref) -> Callable:
        def apply(opt, args=None, kwargs=None):
            entry = self._held.get(id(opt))
            if entry is None or entry[0]() is not opt:
                return None
            for (gi, key), (value, line) in list(entry[3].items()):
                try:
                    _assign(opt.param_groups[gi], key, value)
                except Exception as e:       # (never the training's problem: let go, say why)
                    del entry[3][(gi, key)]
                    self.problems.append(f"nndb: '{line}' let go of {entry[1]}'s {key} in group {gi}: "
                                         f"{type(e).__name__}: {e}")
            # (a closure step, Lightning's: the script's code, setting the lr too, runs inside
            # step(): held again after each closure call, before the update)
            return after_closure(args, kwargs, lambda: apply(opt))
        return apply


# How a step end says that a set did not hold (HoldCheck.verdict): predict across
# ranks reads it in a replica rank's output (nndb.distributed.travel).
HELD_WARNING = "nndb: warning: "
NOT_HELD = " did not hold: "


class HoldCheck:
    """After a ``set`` of an optimizer's hyper-parameter: what the optimizer
    steps with (read by a step pre-hook, which changes nothing), so that a
    step end can say when the change did not hold: the next step's (a warmup
    or a schedule in the loop sets it every step), or a later one's (a loop
    that sets it at each epoch's start: the change held until the epoch
    ended, and nndb said nothing when the script set it back).  It looks at
    every step of the optimizer until the change is undone (said once) or a
    later ``set`` of the same hyper-parameter of the optimizer replaces it;
    under an LR scheduler, at the next step only (what the schedule gives,
    unchanged and followed from the change, is known for that step)."""

    def __init__(self, name: str, opt, key: str, rows: list, line: str, scheduled: bool,
                 shadows: Optional[tuple] = None, every_step: bool = False):
        self.name, self.key, self.line, self.scheduled = name, key, line, scheduled
        # (under a scheduler that does not follow the change, schedule_ignores: each step is looked
        # at, as where there is none, until its step sets the lr back)
        self.every_step = every_step
        self.wanted = [(gi, plain(was), plain(now)) for _, gi, _, was, now in rows]
        self.seen: Optional[list] = None
        # (Shadow before the change, Shadow after it: what the schedule gives next, unchanged
        # and followed; the step counts of its schedulers when the optimizer stepped)
        self.shadows, self.counts = shadows, None
        self.opt = weakref.ref(opt)
        self.fresh = False          # the optimizer stepped since the last verdict
        self.done = False           # said, or replaced: the hook is out
        self.said: Optional[str] = None
        self._handle = opt.register_step_pre_hook(self._look)

    def about(self, opt, key: str) -> bool:
        return self.key == key and self.opt() is opt

    def stop(self) -> None:
        self.done = True
        self._handle.remove()

    def _look(self, opt, args, kwargs):
        self._read(opt)
        self.fresh = True
        # (a closure step: what the script set inside it, before the update, is what counts)
        return after_closure(args, kwargs, lambda: self._read(opt))

    def _read(self, opt) -> None:
        try:
            self.seen = [plain(opt.param_groups[gi][self.key]) for gi, _, _ in self.wanted]
            if self.shadows is not None:
                self.counts = self.shadows[0].step_counts()
        except Exception:            # (a group gone: nothing to say)
            self.seen = []

    def undone_groups(self, seen: list, counts: Optional[list]) -> list:
        """[(group, value)] where ``seen`` (the groups' values) is the change set back: not what
        the schedule gives followed from the change (a schedule rising from the value set is no
        change undone), or, where nndb cannot tell what the schedule gives, nearer the value
        before than the value set."""
        back = followed = None
        if self.shadows is not None and counts is not None:
            back, followed = self.shadows[0].lrs(counts), self.shadows[1].lrs(counts)
        bad = []
        for (gi, before, wanted), now in zip(self.wanted, seen):
            plateau = self.shadows[1].plateau_steps(gi, wanted, counts) \
                if self.shadows is not None and counts is not None and back is None else None
            if back is not None and followed is not None and gi < len(back) and gi < len(followed):
                # (the copies compute what the live schedulers do, bit for bit: an lr other than the
                # followed schedule's was set by something else, the script; a schedule that gives
                # the same with the change as without undid it)
                if distance(wanted, before) > 0 and (not _same(now, followed[gi]) or _same(back[gi], followed[gi])):
                    bad.append((gi, now))
            elif plateau is not None:
                # (the value set, reduced by the plateau's steps since or not: followed; anything
                # else was set by the script)
                if distance(wanted, before) > 0 and not any(_same(now, v) for v in plateau):
                    bad.append((gi, now))
            elif undone(now, wanted, before):
                bad.append((gi, now))
        return bad

    def verdict(self, step: int) -> Optional[str]:
        """The warning, where the optimizer stepped since the last verdict with the
        change set back (then the check is ``done``: said once); else None."""
        if self.done:
            return self.said                # (asked again: a prediction's, after the step end's)
        if not self.fresh:
            return None
        self.fresh = False
        bad = self.undone_groups(self.seen or [], self.counts)
        if not bad:
            if self.scheduled and not self.every_step:
                # (an LR scheduler's: its copies say what it gives next, not steps later; and a
                # loop that sets the lr by hand as well as stepping a scheduler is rare)
                self.stop()
            return None
        self.stop()
        who = "the script or its LR scheduler set it back after the stop" if self.scheduled else \
            f"the script sets it itself after the stop (a warmup or schedule in its loop: " \
            f"param_group['{self.key}'] = ..., at each step or each epoch's start)"
        by_value: dict = {}
        for gi, now in bad:
            by_value.setdefault(repr(now), []).append(str(gi))
        groups = ", ".join(f"{v} in group{'s' if len(g) > 1 else ''} {', '.join(g)}" for v, g in by_value.items())
        self.said = (f"{HELD_WARNING}'{self.line}'{NOT_HELD}{self.name} stepped with {self.key} {groups} at "
                     f"step {step}: {who}; '{self.line} --hold' sets it again before each step of {self.name}, "
                     f"until 'unset {self.key}'")
        return self.said


def after_closure(args, kwargs, then: Callable):
    """For an optimizer step pre-hook: (args, kwargs) of ``step`` with its closure (LBFGS's,
    Lightning's ``optimizer.step(closure)``, which runs the script's training step inside
    step()) made to call ``then()`` after each call; None where there is no closure."""
    if args is None:
        return None
    if kwargs.get("closure") is not None:
        closure, where = kwargs["closure"], "kw"
    elif len(args) > 1 and callable(args[1]):
        closure, where = args[1], "pos"
    else:
        return None

    def closure_then(*a, **k):
        out = closure(*a, **k)
        try:
            then()
        except Exception:           # (never into the training)
            pass
        return out
    if where == "kw":
        return args, dict(kwargs, closure=closure_then)
    return (args[0], closure_then, *args[2:]), kwargs


def is_numeric(v) -> bool:
    """A hyper-parameter nndb may set: a number (numpy's scalars too), a tuple of numbers, or a
    one-element tensor."""
    if isinstance(v, bool):
        return False
    if isinstance(v, (int, float)):
        return True
    if numpy_number(v) is not None:              # (np.float32: DINO's shape)
        return True
    if isinstance(v, tuple):
        return all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
    return hasattr(v, "fill_") and getattr(v, "numel", lambda: 0)() == 1      # a tensor lr


# Where LR schedulers keep a group's learning-rate scale: the group keys they
# add (OneCycleLR's initial, max and min; SWALR's swa_lr, the lr it anneals to
# and then sets at every step), and their own per-group lists (CyclicLR: base and max).
_GROUP_LR_KEYS = ("initial_lr", "max_lr", "min_lr", "swa_lr")
_SCHEDULER_LR_LISTS = ("base_lrs", "max_lrs", "min_lrs")
# ... and the floors they keep for every group at once (CosineAnnealingLR's and
# CosineAnnealingWarmRestarts' eta_min; ReduceLROnPlateau's min_lr given as one number):
# multiplied by new/old too where every group's lr was, by one factor.
_SCHEDULER_LR_SCALARS = ("eta_min", "default_min_lr")


def schedulers_of(opt) -> list:
    """The LR schedulers that drive ``opt`` (a scan of the live objects: for a
    command, never a step)."""
    import gc

    from torch.optim.lr_scheduler import LRScheduler
    # (type(), not isinstance: some live objects are proxies that warn when asked their class;
    # one that drives a wrapper of ``opt`` or the optimizer ``opt`` wraps, accelerate's, drives
    # the same param_groups)
    groups = opt.param_groups
    return [o for o in gc.get_objects() if issubclass(type(o), LRScheduler)
            and getattr(getattr(o, "optimizer", None), "param_groups", None) is groups]


def check_scheduled(name: str, key: str, schedulers: list) -> None:
    """Refuse a change a scheduler undoes at its next step (cycled momentum)."""
    if key in ("momentum", "betas"):
        for sch in schedulers:
            if getattr(sch, "cycle_momentum", False):
                raise CommandError(f"{type(sch).__name__} sets {name}'s {key} at every step (cycle_momentum): "
                                   f"a change would not hold")


def follow_schedule(opt, rows: list, schedulers: list) -> list:
    """After ``lr`` was set in some groups (``rows`` of set_hyperparameter):
    the schedulers' scale for those groups (their base, peak and floor lrs) is
    multiplied by new/old, so the schedule goes on from the new value, the whole
    of it multiplied by new/old, instead of setting the old one back.  A floor
    kept for all groups at once (eta_min) is multiplied where every group's lr
    was, by one factor; else it is kept, and said.  Returns one line per
    scheduler changed."""
    from torch.optim.lr_scheduler import ReduceLROnPlateau
    notes = []
    # (a group's keys once, whatever the number of schedulers: under ChainedScheduler or
    # SequentialLR the wrapper and each scheduler it holds drive the same groups)
    own = []              # (the group keys a scheduler reads its scale from, but initial_lr: base_lrs say it)
    for _, gi, _, was, now in rows:
        factor = now / was if was else None
        g = opt.param_groups[gi]
        for k in _GROUP_LR_KEYS:
            # (a tensor too: OneCycleLR given a tensor max_lr, the compiled-optimizer recipe's, keeps
            # its initial, max and min lr as tensors, and set the schedule's lr back at its next step)
            if is_numeric(g.get(k)) and not isinstance(g[k], tuple):
                before = plain(g[k])
                _assign(g, k, before * factor if factor is not None else now)
                if k != "initial_lr":
                    own.append(f"group {gi} {k} {before:.6g} -> {plain(g[k]):.6g}")
    if own:
        # (OneCycleLR's peak and floor, SWALR's swa_lr: what those schedules go on from)
        notes.append(f"the param groups' own scale follows: {'; '.join(own)}")
    factors = {now / was if was else None for _, _, _, was, now in rows}
    one = factors.pop() if len(factors) == 1 and len(rows) == len(opt.param_groups) else None
    for sch in schedulers:
        changed, kept = [], []
        for _, gi, _, was, now in rows:
            factor = now / was if was else None
            for attr in _SCHEDULER_LR_LISTS:
                lst = getattr(sch, attr, None)
                # (a floor of 0, or one under a group whose lr was 0, stays as it is)
                if isinstance(lst, list) and gi < len(lst) and \
                        not (attr == "min_lrs" and (factor is None or not lst[gi])):
                    before = lst[gi]
                    lst[gi] = before * factor if factor is not None else now
                    changed.append(f"group {gi} {attr} {before:.6g} -> {lst[gi]:.6g}")
        for attr in _SCHEDULER_LR_SCALARS:
            before = getattr(sch, attr, None)
            if not isinstance(before, (int, float)) or isinstance(before, bool) or before == 0:
                continue
            if one is not None:
                setattr(sch, attr, before * one)
                changed.append(f"{attr} {before:.6g} -> {getattr(sch, attr):.6g}")
            else:
                kept.append(f"{attr} {before:.6g} kept (one for all groups, not multiplied: the groups set "
                            f"go on toward it)")
        if changed:
            notes.append(f"{type(sch).__name__} follows: {'; '.join(changed)} (the schedule goes on from the "
                         "new lr)" + (f"; {'; '.join(kept)}" if kept else ""))
        elif kept:
            notes.append(f"{type(sch).__name__}: {'; '.join(kept)}")
        elif getattr(sch, "_schedulers", None):
            held = ", ".join(type(s).__name__ for s in sch._schedulers)
            notes.append(f"{type(sch).__name__} steps the schedulers it holds ({held}): they make the lr from "
                         "now on")
        elif isinstance(sch, ReduceLROnPlateau):
            notes.append(f"{type(sch).__name__} multiplies the lr a group holds by {sch.factor:g} when its metric "
                         f"stops improving: it goes on from the new lr")
        else:
            notes.append(f"{type(sch).__name__} drives this optimizer: nndb found no lr of its own to "
                         "follow the change, and its next step() may set the lr again")
    return notes


class _StandIn:
    """An optimizer as an LR scheduler sees it: the param groups' settings, no parameters."""

    def __init__(self, groups: list):
        self.param_groups = groups
        self._opt_called = True

    def step(self, *a, **k):
        return None

    step._wrapped_by_lr_sched = True      # (torch's check that step() came first)


def _leaf(v, depth: int = 0) -> bool:
    """A value a scheduler's copy may hold: numbers, names, plain containers of them,
    functions (a lambda, an anneal function), a one-element tensor, a numpy array of
    numbers (skorch's WarmRestartLR keeps each group's min_lr and max_lr in one)."""
    import types

    import numpy as np
    if v is None or isinstance(v, (bool, int, float, str, types.FunctionType, types.BuiltinFunctionType,
                                   staticmethod)):
        return True
    if isinstance(v, np.ndarray):
        return v.dtype.kind in "biuf" and v.size <= 4096
    if depth < 4 and isinstance(v, (list, tuple)):
        return all(_leaf(x, depth + 1) for x in v)
    if depth < 4 and isinstance(v, dict):
        return all(_leaf(x, depth + 1) for x in v.values())
    return hasattr(v, "fill_") and getattr(v, "numel", lambda: 0)() == 1


def _closed_form_lrs(sch) -> list:
    """A scheduler's lrs at its state, in closed form where it has one (else its get_lr())."""
    sch._get_lr_called_within_step = True
    try:
        return sch._get_closed_form_lr() if hasattr(sch, "_get_closed_form_lr") else sch.get_lr()
    finally:
        sch._get_lr_called_within_step = False


def _closed_form_is(sch, groups: list) -> bool:
    """Does the closed form of ``sch`` (a copy, on the stand-in of ``groups``) give the lrs the
    groups have?"""
    try:
        values = _closed_form_lrs(sch)
        return len(values) == len(groups) and all(_same(v, g["lr"]) for v, g in zip(values, groups))
    except Exception:                 # (none: SequentialLR's get_lr; a copy that fails)
        return False


class Shadow:
    """What the LR schedulers of an optimizer give its groups next, had nothing
    changed since: a copy of them (made at a ``set``, before or after the change)
    onto a stand-in optimizer, stepped as many times as the live ones stepped
    since (a dry run: the live ones are never stepped).  None where it cannot
    tell: a scheduler whose step needs its argument (ReduceLROnPlateau's metric),
    or one that holds more than plain settings."""

    def __init__(self, opt, schedulers: list):
        import copy
        subs = {id(x) for sch in schedulers for x in getattr(sch, "_schedulers", None) or ()}
        self.live = [sch for sch in schedulers if id(sch) not in subs]
        self.counts = self.step_counts()
        self.copies: Optional[list] = None
        self.groups: list = []
        self.answer: Optional[tuple] = None       # (step counts, the lrs then)
        try:
            ids = {id(sch) for sch in schedulers}
            for sch in schedulers:
                for k, v in vars(sch).items():
                    if k in ("optimizer", "lr_lambdas"):
                        continue
                    if k == "_schedulers" and isinstance(v, list) and all(id(x) in ids for x in v):
                        continue
                    if k == "_scale_fn_ref" or (k == "scale_fn" and getattr(v, "__self__", None) is sch):
                        continue
                    if not _leaf(v):
                        return
            self.groups = [{k: (v.clone() if hasattr(v, "clone") else v) for k, v in g.items() if k != "params"}
                           for g in opt.param_groups]
            stand = _StandIn(self.groups)
            memo = {id(opt): stand}
            for sch in schedulers:
                memo[id(sch.optimizer)] = stand
                for fn in getattr(sch, "lr_lambdas", None) or ():
                    memo[id(fn)] = fn
            with silenced():
                self.copies = copy.deepcopy(self.live, memo)
                # (whether each one's closed form gives the lrs the groups have now: lrs() reads
                # it for a scheduler whose state moved without its step(), ignite's LRScheduler
                # handler, which moves last_epoch by hand and sets the lrs from get_lr(); there a
                # chained CosineAnnealingLR's lrs are not its closed form's, and a 'set lr' that the
                # schedule followed was said not to hold: 0.0088 stepped, the closed form's 0.0073)
                self.closed_form = [_closed_form_is(c, self.groups) for c in self.copies]
        except Exception:             # (a scheduler nndb cannot copy: no shadow)
            self.copies = None

    def step_counts(self) -> list:
        # (and where a step with an epoch left the count, CosineAnnealingWarmRestarts': its state)
        return [(getattr(sch, "_step_count", None), getattr(sch, "last_epoch", None), getattr(sch, "T_cur", None))
                for sch in self.live]

    def plateau_steps(self, gi: int, value, counts: list) -> Optional[list]:
        """Where ReduceLROnPlateau alone drives the optimizer: the lrs it leaves group ``gi``
        holding ``value`` after each of its steps up to ``counts`` (reducing or not: it
        multiplies the lr the group holds, bounded by its floor, so a change made at the stop
        is followed, never set back; which of its steps reduced, its metric decided); None
        otherwise."""
        from torch.optim.lr_scheduler import ReduceLROnPlateau
        if not self.live or not all(isinstance(sch, ReduceLROnPlateau) for sch in self.live):
            return None
        out = [float(value)]
        try:
            for sch, (_, then, _), (_, now, _) in zip(self.live, self.counts, counts):
                floors = sch.min_lrs if gi < len(sch.min_lrs) else [sch.default_min_lr or 0.0] * (gi + 1)
                for _ in range(int(now) - int(then)):
                    v = out[-1]
                    new = max(v * sch.factor, floors[gi])
                    out.append(new if v - new > sch.eps else v)
        except (TypeError, ValueError, AttributeError):
            return None
        return out

    def lrs(self, counts: list) -> Optional[list]:
        """The groups' lrs once each live scheduler's copy stepped as it did, up to ``counts``
        (its step counts then); None where it cannot tell."""

        from torch.optim.lr_scheduler import ReduceLROnPlateau
        if self.answer is not None and self.answer[0] == counts:
            return self.answer[1]
        if self.copies is None:
            return None
        self.answer = (list(counts), None)
        try:
            with silenced():
                for live, c, closed, (then, *was), (now, *state) in zip(self.live, self.copies, self.closed_form,
                                                                        self.counts, counts):
                    if then is None or now is None or now < then:
                        raise LookupError("no step count")
                    if now == then and was == state:
                        continue
                    if isinstance(c, ReduceLROnPlateau):
                        raise LookupError("a step of its own argument")
                    for _ in range(now - then):
                        c.step()
                    if now == then or getattr(c, "last_epoch", None) != getattr(live, "last_epoch", None) or \
                            getattr(c, "T_cur", None) != getattr(live, "T_cur", None):
                        # (stepped with an epoch, CosineAnnealingWarmRestarts' step(it / n): its state
                        # read from the live one, the lrs from it in closed form, where that gave
                        # the lrs the copy was made with)
                        if not closed:
                            raise LookupError("no closed form of its lrs")
                        for k in ("last_epoch", "T_cur", "T_i"):
                            if hasattr(live, k):
                                setattr(c, k, getattr(live, k))
                        values = _closed_form_lrs(c)
                        for g, v in zip(self.groups, values):
                            g["lr"] = v
            self.answer = (list(counts), [plain(g["lr"]) for g in self.groups])
        except Exception:             # (a scheduler's step that fails on a copy: nndb cannot tell)
            pass
        self.copies = None            # (stepped: one answer, kept)
        return self.answer[1]

    def next_lrs(self) -> Optional[list]:
        """The groups' lrs once each scheduler's copy took one more step() (a dry run; the
        copies are used up), or None where nndb cannot tell."""
        from torch.optim.lr_scheduler import ReduceLROnPlateau
        copies, self.copies = self.copies, None
        if copies is None or any(isinstance(c, ReduceLROnPlateau) for c in copies):
            return None
        try:
            with silenced():
                for c in copies:
                    c.step()
            return [plain(g["lr"]) for g in self.groups]
        except Exception:             # (a scheduler's step that fails on a copy: nndb cannot tell)
            return None


def schedule_ignores(before: Shadow, after: Shadow, rows: list, schedulers: list) -> Optional[str]:
    """After ``lr`` was set in some groups (``rows`` of set_hyperparameter) and follow_schedule
    scaled what it knows of the schedulers (``before``/``after``: copies made either side of
    both): a line where their next step() does not give the schedule followed from the change,
    the lr it gives times new/old (a scheduler that keeps its lrs in values of its own, skorch's
    WarmRestartLR's min_lr and max_lr: 'follows' was said, and its next step set its own lr
    back); else None."""
    factors = {now / was if was else None for _, _, _, was, now in rows}
    if (len(factors) != 1 or len(rows) != len(before.groups)) and any(
            isinstance(getattr(sch, a, None), (int, float)) and getattr(sch, a) for sch in schedulers
            for a in _SCHEDULER_LR_SCALARS):
        return None       # (a floor kept for every group: the groups set go on toward it, as follow_schedule says)
    want, got = before.next_lrs(), after.next_lrs()
    if want is None or got is None:
        return None
    off = [(gi, got[gi], want[gi] * now / was) for _, gi, _, was, now in rows
           if was and gi < len(got) and gi < len(want) and not _same(got[gi], want[gi] * now / was)]
    if not off:
        return None
    gi, lr, followed = off[0]
    names = ", ".join(dict.fromkeys(type(sch).__name__ for sch in schedulers))
    return (f"{names} does not follow the change: its next step() sets lr {lr:.6g} in group {gi}, where the "
            f"schedule followed from the new lr gives {followed:.6g} (it keeps its lrs in values of its own, "
            "which nndb did not scale): the change lasts until that step; '--hold' sets it again before each step")
