"""Histograms of tensors at full steps (the layout: nndb.store.histogram).

``of_tensor(t)``: one tensor on its own device, from its float32 bits in one
``torch.bincount`` (a float64 tensor, or one with a subnormal, an Inf or a
signalling NaN, value by value on the host); ``of_segments(flat, sizes)``:
the host arrays the recorder reduces in one batch.
"""
from __future__ import annotations

import numpy as np
import torch

from ..store import histogram as H

of_segments = H.of_segments


def of_tensor(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.dtype == torch.float64 or t.is_sparse or not t.is_floating_point():
        return H.exact(t.to("cpu", torch.float64).numpy() if not t.is_sparse else
                       t.to_dense().to("cpu", torch.float64).numpy())
    f = t.float().reshape(-1)
    if f.device.type == "cpu":
        return H.of_segments(f.numpy(), [f.numel()])[0]
    idx = (f.view(torch.int32) >> 22) & (H.FINE - 1)
    fine = torch.bincount(idx.long(), minlength=H.FINE).cpu().numpy()[None, :]
    zeros = int((f == 0).sum())
    if H.needs_exact(fine[0], zeros):
        return H.exact(f.cpu().numpy())
    out = H.from_fine(fine)[0]
    out[H.I_NEG_UNDER] -= int(fine[0, 512] + fine[0, 513])
    out[H.I_POS_UNDER] -= int(fine[0, 0] + fine[0, 1])
    out[H.I_ZERO] += zeros
    return out


def of_scalar(v: float) -> np.ndarray:
    return H.exact(np.asarray([v], dtype=np.float64))
