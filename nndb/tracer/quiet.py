"""nndb's own work unseen: numpy's floating-point warnings off, cheaply, and
torch.profiler not seeing the ops of nndb's hooks (below).

Warnings:

numpy must not print "invalid value" or "overflow" warnings into the user's
stderr when a tensor holds NaN or Inf.  ``np.errstate(all="ignore")`` builds
its error state anew at every entry, which a step's hook cannot afford with
the caches cold; ``Quiet`` and ``quiet`` set one built once (numpy 2's context
variable; with another numpy they are np.errstate).
"""
from __future__ import annotations

import functools
import threading

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
