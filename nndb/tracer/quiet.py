"""nndb's own work unseen: numpy's floating-point warnings off, cheaply, the
warnings of torch code nndb runs for itself (``silenced``), and torch.profiler
not seeing the ops of nndb's hooks (below).

Warnings:

numpy must not print "invalid value" or "overflow" warnings into the user's
stderr when a tensor holds NaN or Inf.  ``np.errstate(all="ignore")`` builds
its error state anew at every entry, which a step's hook cannot afford with
the caches cold; ``Quiet`` and ``quiet`` set one built once (numpy 2's context
variable; with another numpy they are np.errstate).
"""
from __future__ import annotations

import contextlib
import functools
import threading
import warnings

import numpy as np
import torch

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


# An "ignore" filter for every warning, put at the head of the filters and taken off again
_IGNORE_ALL = ("ignore", None, Warning, None, 0)


@contextlib.contextmanager
def silenced():
    """No warning shown while torch code runs for nndb (a copy of the script's lr
    scheduler stepped to tell what 'set lr' will become), and Python's once-per-line
    registries left as they were: ``warnings.catch_warnings`` and ``simplefilter``
    mark the filters changed, which empties every registry, and the script's own
    once-per-line warnings showed again after each 'set lr' (3 times in 8 steps for
    plain python's once).  The filter goes into the list as it is (warn reads it at
    every call); an ignored warning writes no registry entry."""
    filters = warnings.filters
    filters.insert(0, _IGNORE_ALL)
    try:
        yield
    finally:
        for i, f in enumerate(filters):
            if f is _IGNORE_ALL:
                del filters[i]
                break


def quiet(func):
    """Decorator: ``func`` runs under ``Quiet``."""
    @functools.wraps(func)
    def inner(*args, **kwargs):
        with Quiet():
            return func(*args, **kwargs)
    return inner


# -- torch.profiler --------------------------------------------------------------
# The ops nndb's hooks run (norms, copies, a loss's item(), the probes' reductions) are
# not the script's: a profile the script takes of its own steps lists its ops alone, as
# without nndb (it listed aten::aminmax, cat, stack, linalg_vector_norm and 20 more, and
# 148 as_strided for 55).  Each hook asks ``PROFILING()`` (one C call: nothing more while
# no profiler records) and, where one does, runs its work with torch's RecordFunction off
# in its thread, nested hooks counted.  The time nndb takes stays in the script's rows
# that enclose it (``Optimizer.step``): it is spent there.

PROFILING = torch._C._autograd._profiler_enabled
_RECORD_FUNCTION = torch._C._autograd._enable_record_function
_HIDING = threading.local()


def unprofiled() -> bool:
    """From here until ``profiled()``, this thread's ops go unseen by torch.profiler; True."""
    depth = getattr(_HIDING, "depth", 0)
    _HIDING.depth = depth + 1
    if depth == 0:
        _RECORD_FUNCTION(False)
    return True


def profiled() -> None:
    """The end of an ``unprofiled()`` stretch: the profiler sees ops again after the outermost."""
    depth = getattr(_HIDING, "depth", 1) - 1
    _HIDING.depth = depth
    if depth == 0:
        _RECORD_FUNCTION(True)
