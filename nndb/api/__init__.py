"""nndb's Python API: ``open`` a trace (``Trace``), ``record`` a loop in this
process (``Recorder``).  docs/api.md has the guide."""
from .recording import Recorder, record
from .trace import FindingList, TensorInfo, Trace


def open(path):  # noqa: A001  (nndb.open, as h5py.File or io.open: the word users expect)
    """The trace at ``path`` (finished, live or killed) as a ``Trace``; a
    distributed job's run directory (one rank<R>.h5 per rank) as a ``Job``."""
    import os
    path = os.fspath(path)
    if os.path.isdir(path):
        from .job import Job
        return Job(path)
    return Trace(path)


__all__ = ["open", "record", "Trace", "TensorInfo", "Recorder", "FindingList"]
