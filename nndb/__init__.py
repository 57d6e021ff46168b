"""nndb: a gdb/pdb-style debugger for PyTorch training.

``nndb.open(PATH)`` reads a trace and ``nndb.record(PATH)`` records a loop in
this process (docs/api.md).  Both import nndb.api, and with it h5py (and, for
``record``, torch), when first called: ``import nndb`` itself stays cheap.
"""
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


__all__ = ["__version__", "open", "record"]
