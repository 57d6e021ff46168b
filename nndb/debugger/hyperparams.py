"""Changing an optimizer's hyper-parameters in place (``set``, and
``predict --set`` on its replica): numeric ones only, of the same shape, in
every param group or one."""
from __future__ import annotations

from typing import Optional

from ..errors import CommandError


def set_hyperparameter(name: str, opt, key: str, value, group: Optional[int] = None) -> list:
    """Set ``key`` to ``value`` in ``opt``'s param groups (all, or ``group``):
    [(optimizer name, group, key, was, now)], one a group changed."""
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
        if hasattr(old, "fill_") and not isinstance(value, tuple):
            old_repr = float(old)
            old.fill_(value)          # a tensor lr (capturable optimizers): change it in place
        else:
            old_repr = old
            g[key] = type(old)(value) if isinstance(old, (int, float)) and not isinstance(old, bool) \
                and not isinstance(value, tuple) else value
        rows.append((name, gi, key, old_repr, g[key] if not hasattr(g[key], "fill_") else float(g[key])))
    return rows


def is_numeric(v) -> bool:
    """A hyper-parameter nndb may set: a number, a tuple of numbers, or a one-element tensor."""
    if isinstance(v, bool):
        return False
    if isinstance(v, (int, float)):
        return True
    if isinstance(v, tuple):
        return all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
    return hasattr(v, "fill_") and getattr(v, "numel", lambda: 0)() == 1      # a tensor lr


# Where LR schedulers keep a group's learning-rate scale: the group keys they
# add, and their own per-group lists (CyclicLR: base and max).
_GROUP_LR_KEYS = ("initial_lr", "max_lr", "min_lr")
_SCHEDULER_LR_LISTS = ("base_lrs", "max_lrs")


def schedulers_of(opt) -> list:
    """The LR schedulers that drive ``opt`` (a scan of the live objects: for a
    command, never a step)."""
    import gc

    from torch.optim.lr_scheduler import LRScheduler
    # (type(), not isinstance: some live objects are proxies that warn when asked their class)
    return [o for o in gc.get_objects() if issubclass(type(o), LRScheduler) and getattr(o, "optimizer", None) is opt]


def check_scheduled(name: str, key: str, schedulers: list) -> None:
    """Refuse a change a scheduler undoes at its next step (cycled momentum)."""
    if key in ("momentum", "betas"):
        for sch in schedulers:
            if getattr(sch, "cycle_momentum", False):
                raise CommandError(f"{type(sch).__name__} sets {name}'s {key} at every step (cycle_momentum): "
                                   f"a change would not hold")


def follow_schedule(opt, rows: list, schedulers: list) -> list:
    """After ``lr`` was set in some groups (``rows`` of set_hyperparameter):
    the schedulers' scale for those groups is multiplied by new/old, so the
    schedule goes on from the new value instead of setting the old one back.
    Returns one line per scheduler changed."""
    notes = []
    for sch in schedulers:
        changed = []
        for _, gi, _, was, now in rows:
            factor = now / was if was else None
            g = opt.param_groups[gi]
            for k in _GROUP_LR_KEYS:
                if isinstance(g.get(k), (int, float)):
                    g[k] = g[k] * factor if factor is not None else now
            for attr in _SCHEDULER_LR_LISTS:
                lst = getattr(sch, attr, None)
                if isinstance(lst, list) and gi < len(lst):
                    before = lst[gi]
                    lst[gi] = before * factor if factor is not None else now
                    changed.append(f"group {gi} {attr} {before:.6g} -> {lst[gi]:.6g}")
        if changed:
            notes.append(f"{type(sch).__name__} follows: {'; '.join(changed)} (the schedule goes on from the "
                         "new lr)")
        else:
            notes.append(f"{type(sch).__name__} drives this optimizer: it adjusts the new lr at its next step")
    return notes
