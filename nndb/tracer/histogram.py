"""Histograms of tensors at full steps (the layout: nndb.histogram).

``of_tensor(t)``: one tensor, from its float32 bits: one ``torch.bincount``
of the 1024 keys where the tensor is, folded into the bins on the host (a
float64 tensor, or one with a subnormal, an Inf or a signalling NaN, value by
value on the host); ``of_segments(flat, sizes)``: the host arrays the
recorder reduces in one batch, and ``full_segments`` their raw rows with them;
``of_scalar``: a scalar loss.
"""
from __future__ import annotations

import numpy as np
import torch

from .. import histogram as H
from ..schema import HIST_BINS
from . import stats as S

of_segments = H.of_segments


def full_segments(flat: np.ndarray, sizes) -> tuple:
    """(raw rows, histograms) of the consecutive segments of ``flat`` at a full step.  The
    histograms first: their zero bins are exact counts (a float32's exponent 0, checked
    against the count of zeros), which the rows take as theirs, where the rows counted the
    zeros again, segment by segment (nndb.tracer.stats._zeros)."""
    hists = H.of_segments(flat, sizes, fine_counts)
    return S.host_raw_segments(flat, sizes, True, hists[:, H.I_ZERO]), hists


# A segment of at least this many elements, in a large block (``H.is_large``), has its keys
# counted by a torch.bincount of its own: 7.7 instructions an element against numpy's 16
# (numpy's bincount casts the keys to intp, then reads them twice), for ~30 K instructions
# more a call.
TORCH_COUNT_MIN = 4096
_OFFSETS: dict = {}      # tuple of segment lengths -> each element's segment's first count (i * FINE)
_OFFSETS_MAX = 1 << 17   # (elements: a layout of more is not kept)


def fine_counts(bits: np.ndarray, sizes):
    """``H.of_segments``'s counter: the (k, FINE) counts of each segment's float32 keys by
    torch.bincount, the keys of all the segments made in one pass; None where numpy's
    lookup is cheaper (more counts to clear and fold than elements to count).  A large block
    (a GPT's 2.5 M parameter elements: 52 -> 30 M instructions) a segment at a time; the
    others (an MLP's 20,766: 0.90 -> 0.67 M) at once, each key offset by its segment's
    place (``_OFFSETS``: a layout recurs step after step)."""
    k, n = len(sizes), bits.size
    if not bits.flags.writeable or k * H.FINE > 2 * n:     # (torch reads no read-only array without a warning)
        return None
    keys = (torch.from_numpy(bits.view(np.int32)) >> 22).bitwise_and_(H.FINE - 1)
    if not H.is_large(n, k):
        return torch.bincount(keys.add_(_offsets(sizes)), minlength=k * H.FINE).numpy().reshape(k, H.FINE)
    host = keys.numpy()
    fine = np.empty((k, H.FINE), dtype=np.int64)
    at = 0
    for i, m in enumerate(sizes):
        if m >= TORCH_COUNT_MIN:
            fine[i] = torch.bincount(keys[at:at + m], minlength=H.FINE).numpy()
        else:
            fine[i] = np.bincount(host[at:at + m], minlength=H.FINE)
        at += m
    return fine


def _offsets(sizes) -> torch.Tensor:
    key = tuple(sizes)
    offsets = _OFFSETS.get(key)
    if offsets is None:
        offsets = torch.from_numpy(np.repeat(np.arange(0, len(key) * H.FINE, H.FINE, dtype=np.int32), key))
        if len(_OFFSETS) < 64 and len(offsets) <= _OFFSETS_MAX:
            _OFFSETS[key] = offsets
    return offsets


def of_tensor(t: torch.Tensor, raw=None) -> np.ndarray:
    """``raw``: the tensor's raw row from a full step (nndb.tracer.stats), whose
    exact zero count spares the histogram's own count."""
    t = t.detach()
    if t.is_sparse:
        t = t.to_dense()
    if t.dtype == torch.float64 or not t.is_floating_point():
        return H.exact(t.to("cpu", torch.float64).numpy())
    with torch.no_grad():
        f = t.float().reshape(-1)
        # the float32 keys in torch (no int64 copy: 25% of numpy's time for a
        # 524,288-element activation), counted there, folded on the host
        # (the mask in place: one temporary, not two)
        fine = torch.bincount((f.view(torch.int32) >> 22).bitwise_and_(H.FINE - 1), minlength=H.FINE)
        if f.device.type == "cpu":
            out = H.fold(fine.numpy()[None])       # (bincount's counts: int64)
            return H.checked(out, f.numpy(), [f.numel()], exact_zeros(raw, f.numel()))[0]
        return device_counts(f, fine, exact_zeros(raw, f.numel()))


def device_counts(f: torch.Tensor, fine: torch.Tensor, zeros) -> np.ndarray:
    """The histogram of ``f`` (flat float32, on an accelerator) from its fine
    counts, in one host transfer: the zero count (which tells a subnormal from
    a zero) rides with the counts unless the step's raw row had it."""
    if zeros is None:
        both = torch.cat([fine, (f == 0).sum().view(1)]).cpu().numpy()
        counts, zeros = both[:-1], int(both[-1])
    else:
        counts = fine.cpu().numpy()
    out = H.fold(counts[None])[0]
    if zeros != out[H.I_ZERO] or out[H.I_POS_INF] or out[H.I_NEG_INF]:
        return H.exact(f.cpu().numpy())
    return out


# torch counts a large tensor's zeros as a float32 sum (stats.cpu_raw_large),
# exact only up to 2^24 elements
_EXACT_COUNT_MAX = 1 << 24


def exact_zeros(raw, n: int):
    """The exact count of zeros in a raw row (nndb.tracer.stats) of ``n``
    elements, or None (no row; not measured: a step that is not full; another
    element count; more elements than a float32 sum counts exactly)."""
    if raw is None or n > _EXACT_COUNT_MAX or raw[S.RAW_N] != n or raw[S.RAW_ZERO] != raw[S.RAW_ZERO]:
        return None
    return int(raw[S.RAW_ZERO])


def of_scalar(v: float) -> np.ndarray:
    out = np.zeros(H.N_BINS, dtype=np.int64)
    out[H.bin_of(v)] = 1
    return out


def add_many(bucket, keys: list, items: list, full: bool, bulk: bool = False) -> None:
    """Rows (and at a full step histograms) of tensors reduced one by one
    (``bulk``: parameters, gradients and updates, whose norms are measured
    together: stats.raw_many), into the recorder's bucket."""
    raws = S.raw_many(items, full, bulk)
    for key, raw in zip(keys, raws):
        bucket.add(key, raw)
    if full:
        for key, t, raw in zip(keys, items, raws):
            bucket.add_hist(key, of_tensor(t, raw))


def rows_of(b, n: int) -> np.ndarray:
    """(n, HIST_BINS) histograms of a bucket in its record's row order
    (entries, then the parameter blocks), -1 rows where a series has none."""
    out = np.full((n, HIST_BINS), -1, dtype=np.int64)
    for i, key in enumerate(b.entries):
        h = b.hists.get(key)
        if h is not None:
            out[i] = h
    at = len(b.entries)
    for plan, (_, rows) in b.params.items():
        h = b.param_hists.get(plan)
        if h is not None and len(h) == len(rows):
            out[at:at + len(rows)] = h
        at += len(rows)
    return out
