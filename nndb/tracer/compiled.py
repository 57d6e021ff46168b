"""nndb's hooks inside a ``torch.compile``'d function.

A compiled training step (forward, backward and ``optimizer.step()`` in one
compiled function) or a compiled ``optimizer.step`` calls nndb's optimizer and
backward hooks from inside Dynamo's frame evaluation, which compiles every
Python frame it meets: nndb's own (its statistics, its rules' numpy taken for
tensors, ``sys._getframe`` graph breaks) and what they call.  ``never_compiled``
marks a hook so that it, and every frame under it, runs as plain Python, as it
does around an uncompiled step: Dynamo's per-code switch, on torch's C side (no
import of ``torch._dynamo``, a second's work that a script without
torch.compile never pays).
"""
from __future__ import annotations

import torch

# True while torch.compile traces (Dynamo folds it to a constant)
COMPILING = torch.compiler.is_compiling

try:
    from torch._C._dynamo import eval_frame as _eval_frame
    _NOT_COMPILED = _eval_frame._FrameExecStrategy(_eval_frame._FrameAction.SKIP, _eval_frame._FrameAction.SKIP)
except (ImportError, AttributeError):      # (a torch without the switch: as before)
    _eval_frame = _NOT_COMPILED = None


def never_compiled(fn, inlined: bool = True):
    """``fn``'s frames, and every frame they call, are never compiled.  ``inlined``: a
    compiled function that calls ``fn`` breaks its graph there (``torch.compiler.disable``'s
    mark), so that ``fn`` runs as Python and sees the step; without it (the module hooks,
    which do nothing while Dynamo traces) the compiled model's graph stays whole."""
    if _NOT_COMPILED is not None:
        _eval_frame.set_code_exec_strategy(fn.__code__, _NOT_COMPILED)
        if inlined:
            fn._torchdynamo_disable = True
    return fn
