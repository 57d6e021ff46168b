"""nndb's Python API: ``open`` a trace (``Trace``), ``record`` a loop in this
process (``Recorder``).  docs/api.md has the guide."""
from .recording import Recorder, record
from .trace import FindingList, TensorInfo, Trace


def open(path) -> Trace:  # noqa: A001  (nndb.open, as h5py.File or io.open: the word users expect)
    """The trace at ``path`` (finished, live or killed) as a ``Trace``."""
    import os
    return Trace(os.fspath(path))


__all__ = ["open", "record", "Trace", "TensorInfo", "Recorder", "FindingList"]
