"""numpy's floating-point warnings off, cheaply.

numpy must not print "invalid value" or "overflow" warnings into the user's
stderr when a tensor holds NaN or Inf.  ``np.errstate(all="ignore")`` builds
its error state anew at every entry, which a step's hook cannot afford with
the caches cold; ``Quiet`` and ``quiet`` set one built once (numpy 2's context
variable; with another numpy they are np.errstate).
"""
from __future__ import annotations

import functools

import numpy as np

try:
    from numpy._core._ufunc_config import _extobj_contextvar as _ERRSTATE, _make_extobj
    _IGNORE = _make_extobj(all="ignore")
except (ImportError, AttributeError, TypeError):      # numpy 1.x: no numpy._core
    _ERRSTATE = _IGNORE = None


class Quiet:
    """``with Quiet():`` is ``with np.errstate(all="ignore"):``, cheaper."""
    __slots__ = ("_token",)

    def __enter__(self):
        if _ERRSTATE is None:
            self._token = np.errstate(all="ignore")
            self._token.__enter__()
        else:
            self._token = _ERRSTATE.set(_IGNORE)

    def __exit__(self, *exc):
        if _ERRSTATE is None:
            self._token.__exit__(*exc)
        else:
            _ERRSTATE.reset(self._token)


def quiet(func):
    """Decorator: ``func`` runs under ``Quiet``."""
    @functools.wraps(func)
    def inner(*args, **kwargs):
        with Quiet():
            return func(*args, **kwargs)
    return inner
