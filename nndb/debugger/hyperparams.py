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
