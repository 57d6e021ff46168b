"""Which tensors and modules a name glob selects, everywhere a user gives one.

A glob is fnmatch's (``fc*``, ``*.weight``, ``layer[12].*``), case-sensitive, matched
against the whole name nndb records (``0.weight``, ``encoder.layers.1.fc.bias``).

A model wrapped for data parallelism names its tensors from the wrapper:
``DistributedDataParallel(model)`` and ``DataParallel(model)`` keep the model as their
``module`` (``module.0.weight`` is the model's ``0.weight``), FSDP's wrapper as its
``_fsdp_wrapped_module``, Opacus's ``GradSampleModule`` (``PrivacyEngine.make_private``'s
model, whose hooks make the per-sample gradients) as its ``_module``.  A glob the user wrote for the model itself (the same
``-x`` file used on one process and under ``torchrun``) matches those names too:
``watch grad 0.weight`` under DDP had matched nothing and stayed pending for the whole
run.  A glob that names the wrapper (``module.0.*``) matches as before.  (torch.compile's
``_orig_mod.`` is not in a recorded name at all: nndb.tracer.naming leaves it out.)
"""
from __future__ import annotations

import fnmatch
import re
from typing import Callable

# The attributes DDP, DataParallel, FSDP and Opacus's GradSampleModule keep the wrapped
# model in, as a recorded name's first parts
_WRAPPER_PARTS = ("module.", "_fsdp_wrapped_module.", "_module.")


def unwrapped(name: str) -> str:
    """``name`` without the wrappers' leading parts (``module.0.weight`` -> ``0.weight``)."""
    while name.startswith(_WRAPPER_PARTS):
        name = name.split(".", 1)[1]
    return name


def matches(name: str, glob: str) -> bool:
    """Does ``glob`` select the tensor or module recorded as ``name``?"""
    if fnmatch.fnmatchcase(name, glob):
        return True
    bare = unwrapped(name)
    return bare is not name and fnmatch.fnmatchcase(bare, glob)


def matcher(glob: str) -> Callable[[str], bool]:
    """``matches(name, glob)`` with the glob compiled once (a rule judged every step)."""
    whole = re.compile(fnmatch.translate(glob)).match

    def match(name: str) -> bool:
        if whole(name):
            return True
        bare = unwrapped(name)
        return bare is not name and whole(bare) is not None
    return match
