"""The optional extras (``pip install 'nndb[tensorboard]'``, ``[mlflow]``,
``[plot]``): what each needs, and the one line a command says without it.

``pip install nndb`` stays lean; a command that needs an extra asks
``require`` first, before it does anything, and a missing package is one
``MissingExtra`` line (exit code 2, a usage error), never a traceback.
Only the standard library is imported here.
"""
from __future__ import annotations

import importlib

from .errors import UsageError

# extra -> the modules it must make importable (the first import that fails names it)
EXTRAS = {
    "tensorboard": ("tensorboard", "torch.utils.tensorboard"),
    "mlflow": ("mlflow",),
    "plot": ("matplotlib",),
}


class MissingExtra(UsageError):
    """A command needs an optional extra that is not installed."""


def require(extra: str, command: str) -> None:
    """Raise MissingExtra unless ``extra``'s packages import.  ``command`` is
    what the user typed that needs it (``nndb export --tensorboard``)."""
    for module in EXTRAS[extra]:
        try:
            importlib.import_module(module)
        except ImportError:
            raise MissingExtra(f"{command} needs the {extra} extra: pip install 'nndb[{extra}]'") from None
