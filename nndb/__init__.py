"""nndb: a gdb/pdb-style debugger for PyTorch training.

``nndb.open(PATH)`` reads a trace, ``nndb.record(PATH)`` records a loop in
this process and ``nndb.set_trace()`` stops at the prompt there (docs/api.md);
``%load_ext nndb`` adds the notebook magics.  They import nndb.api, and with
it h5py and torch, when first called: ``import nndb`` itself stays cheap.
"""
from .run import startup  # noqa: F401  (first: the modules loaded before nndb)
from .version import __version__


def open(path):  # noqa: A001
    """The trace at ``path`` as an ``nndb.api.Trace``: its metadata, steps,
    tensors, series, statistics, findings and stops.  A live trace (its run
    still writing) and a killed run's trace open too."""
    from . import api
    return api.open(path)


def record(path, **options):
    """``with nndb.record("run.h5") as rec:`` records the loop in the block as
    ``nndb run --batch`` would; ``rec.findings``, then ``rec.trace``.  See
    ``nndb.api.Recorder`` for the options."""
    from . import api
    return api.record(path, **options)


def set_trace(*, trace=None):
    """Stop at the nndb prompt at the caller's line (pdb's ``set_trace``;
    ``PYTHONBREAKPOINT=nndb.set_trace`` makes ``breakpoint()`` call it).
    Under ``nndb run`` it is a stop of that run; otherwise it starts
    recording here (``trace``: the file, default a new one under
    ./nndb-runs/) and stops.  See docs/api.md."""
    import sys
    from .api.settrace import set_trace as _set_trace
    _set_trace(trace=trace, frame=sys._getframe(1))


def load_ipython_extension(ipython):
    """``%load_ext nndb``: the ``%nndb`` / ``%%nndb`` and ``%debug_train`` magics (nndb.cli.magics)."""
    from .cli.magics import register
    register(ipython)


__all__ = ["__version__", "open", "record", "set_trace"]
