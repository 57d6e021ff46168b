"""nndb in a Jupyter kernel: ``%load_ext nndb`` (``load``), the front end
whose prompt is the notebook's input box (``NotebookFrontend``), HTML tables
and inline pictures.  IPython is imported only inside functions: nothing
here needs it until a kernel loads the extension."""
from __future__ import annotations

from .frontend import KERNEL_NO_REPLICAS, NotebookFrontend, in_kernel


def load(ipython) -> None:
    """Register the magics on ``ipython`` (``%load_ext nndb``)."""
    from .magics import register
    register(ipython)


__all__ = ["KERNEL_NO_REPLICAS", "NotebookFrontend", "in_kernel", "load"]
