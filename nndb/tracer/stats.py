"""Tensor statistics in few fused passes.

A tensor is summarised by a *raw accumulator row* of nine float64 numbers
(``RAW_FIELDS``): element count, sum, sum of squares, min, max, sum of |x|,
number of exact zeros, number of NaN and number of Inf.  Raw rows merge
exactly (``merge_raw``), which is how a module called several times in one
step (gradient accumulation, a GAN discriminator, an LBFGS closure) gets one
row per step.  ``finalize`` turns a raw row into the ten recorded statistics
(``STAT_NAMES``).

Where the passes run:

* small CPU tensors go through numpy on a zero-copy view; many of them are
  concatenated and reduced per segment with ``ufunc.reduceat``, so all the
  parameters of a small model cost a dozen numpy calls, not a dozen per tensor;
* large tensors, and tensors on an accelerator, use five torch reductions on
  the tensor's own device (sum, dot, aminmax, abs-sum, count_nonzero); on an
  accelerator the row stays on the device until the step ends, so there is one
  host transfer per step, not one per statistic.

NaN and Inf are counted only when a cheap check (a non-finite sum or sum of
squares) says there may be some.  When a tensor has non-finite elements, the
other statistics describe its finite elements, so a gradient with three NaN
still shows the norm of the rest; ``count`` is always the element count.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np
import torch

RAW_FIELDS = ("n", "sum", "sumsq", "min", "max", "sumabs", "nzero", "nnan", "ninf")
N_RAW = len(RAW_FIELDS)
STAT_NAMES = ("count", "mean", "std", "min", "max", "norm", "mean_abs",
              "nan_count", "inf_count", "zero_frac")
N_STATS = len(STAT_NAMES)

# Tensors up to this many elements are reduced with numpy on the host (their
# cost is call overhead, which numpy has less of); larger ones with torch,
# whose reductions are vectorised and multi-threaded.
HOST_MAX_ELEMENTS = 1 << 16

_HOST_DTYPES = (torch.float32, torch.float64, torch.float16)
_I_N, _I_SUM, _I_SQ, _I_MIN, _I_MAX, _I_ABS, _I_ZERO, _I_NAN, _I_INF = range(N_RAW)


def empty_raw() -> np.ndarray:
    raw = np.zeros(N_RAW)
    raw[_I_MIN] = np.inf
    raw[_I_MAX] = -np.inf
    return raw


def is_recordable(t) -> bool:
    """Floating-point tensors are summarised; integer and complex ones are not."""
    return isinstance(t, torch.Tensor) and t.is_floating_point()


def merge_raw(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = a + b
    out[_I_MIN] = min(a[_I_MIN], b[_I_MIN])
    out[_I_MAX] = max(a[_I_MAX], b[_I_MAX])
    return out


def finalize(raw: np.ndarray) -> np.ndarray:
    """Raw accumulator row -> the ten statistics of STAT_NAMES."""
    n, s, sq, mn, mx, sa, nz, nnan, ninf = (float(x) for x in raw)
    finite = n - nnan - ninf
    out = np.full(N_STATS, np.nan)
    out[0] = n
    out[7] = nnan
    out[8] = ninf
    if n > 0:
        out[9] = nz / n
    if finite > 0:
        mean = s / finite
        out[1] = mean
        if finite > 1:
            var = (sq - s * mean) / (finite - 1)
            out[2] = math.sqrt(var) if var > 0 else 0.0
        elif finite == 1:
            out[2] = 0.0
        out[3] = mn
        out[4] = mx
        out[5] = math.sqrt(sq) if sq >= 0 else np.nan
        out[6] = sa / finite
    return out


# -- host (numpy) path -----------------------------------------------------

def _host_array(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.dtype not in _HOST_DTYPES:
        t = t.float()
    return t.numpy().reshape(-1)


def _segment_raw_exact(seg: np.ndarray) -> np.ndarray:
    """Slow path for a segment that holds NaN or Inf: statistics of its finite part."""
    raw = empty_raw()
    raw[_I_N] = seg.size
    nan = np.isnan(seg)
    inf = np.isinf(seg)
    raw[_I_NAN] = np.count_nonzero(nan)
    raw[_I_INF] = np.count_nonzero(inf)
    fin = seg[~(nan | inf)].astype(np.float64)
    raw[_I_ZERO] = np.count_nonzero(fin == 0)
    if fin.size:
        raw[_I_SUM] = fin.sum()
        raw[_I_SQ] = np.dot(fin, fin)
        raw[_I_MIN] = fin.min()
        raw[_I_MAX] = fin.max()
        raw[_I_ABS] = np.abs(fin).sum()
    return raw


def host_raw_batch(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Raw rows for many 1-D host arrays at once: one concatenation, then one
    ``reduceat`` per accumulator over all segments."""
    k = len(arrays)
    out = np.zeros((k, N_RAW))
    out[:, _I_MIN] = np.inf
    out[:, _I_MAX] = -np.inf
    if k == 0:
        return out
    sizes = np.fromiter((a.size for a in arrays), dtype=np.int64, count=k)
    out[:, _I_N] = sizes
    nonempty = np.flatnonzero(sizes)
    if nonempty.size == 0:
        return out
    flat = np.concatenate([arrays[i] for i in nonempty], dtype=np.float64)
    starts = np.zeros(nonempty.size, dtype=np.int64)
    np.cumsum(sizes[nonempty][:-1], out=starts[1:])
    sums = np.add.reduceat(flat, starts)
    sq = np.add.reduceat(flat * flat, starts)
    out[nonempty, _I_SUM] = sums
    out[nonempty, _I_SQ] = sq
    out[nonempty, _I_MIN] = np.minimum.reduceat(flat, starts)
    out[nonempty, _I_MAX] = np.maximum.reduceat(flat, starts)
    out[nonempty, _I_ABS] = np.add.reduceat(np.abs(flat), starts)
    out[nonempty, _I_ZERO] = np.add.reduceat((flat == 0).view(np.int8), starts, dtype=np.int64)
    bad = ~np.isfinite(sums + sq)
    if bad.any():
        ends = starts + sizes[nonempty]
        for j in np.flatnonzero(bad):
            out[nonempty[j]] = _segment_raw_exact(flat[starts[j]:ends[j]])
    return out


# -- device (torch) path ----------------------------------------------------

def _device_flat(t: torch.Tensor) -> torch.Tensor:
    f = t.detach().reshape(-1)
    if f.dtype not in (torch.float32, torch.float64):
        f = f.float()
    return f


def device_raw(t: torch.Tensor) -> tuple[int, torch.Tensor]:
    """The element count and the other eight raw fields as a tensor on ``t``'s
    device (no host synchronisation)."""
    f = _device_flat(t)
    n = f.numel()
    if n == 0:
        return 0, torch.as_tensor(empty_raw()[1:], device=f.device)
    mn, mx = torch.aminmax(f)
    parts = [f.sum(), torch.dot(f, f), mn, mx, f.abs().sum(),
             (n - torch.count_nonzero(f)).to(f.dtype)]
    if f.device.type != "cpu":
        # On an accelerator the counts are cheap and asynchronous; a host-side
        # check would cost a synchronisation per tensor.
        parts += [torch.isnan(f).sum().to(f.dtype), torch.isinf(f).sum().to(f.dtype)]
    else:
        zero = f.new_zeros(())
        parts += [zero, zero]
    return n, torch.stack(parts).to(torch.float64)


def _complete(n: int, rest: np.ndarray, t: torch.Tensor) -> np.ndarray:
    raw = np.empty(N_RAW)
    raw[_I_N] = n
    raw[1:] = rest
    if n and not np.isfinite(raw[_I_SUM] + raw[_I_SQ] + raw[_I_MIN] + raw[_I_MAX]):
        raw = _segment_raw_exact(_device_flat(t).cpu().numpy())
    return raw


def resolve_device_rows(pending: Sequence[tuple[int, torch.Tensor, torch.Tensor]]) -> list[np.ndarray]:
    """Bring pending device rows ``(n, row, tensor)`` to the host: one transfer
    per device, not one per statistic or tensor."""
    by_device: dict = {}
    for i, (_, row, _) in enumerate(pending):
        by_device.setdefault(row.device, []).append(i)
    out: list = [None] * len(pending)
    for idx in by_device.values():
        block = torch.stack([pending[i][1] for i in idx]).cpu().numpy()
        for j, i in enumerate(idx):
            n, _, t = pending[i]
            out[i] = _complete(n, block[j], t)
    return out


# -- front door -------------------------------------------------------------

def is_host_tensor(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and t.numel() <= HOST_MAX_ELEMENTS


def raw_now(t: torch.Tensor) -> np.ndarray:
    """Raw row of one CPU tensor, computed now (used for activations, which the
    script may modify in place later)."""
    if is_host_tensor(t):
        return host_raw_batch([_host_array(t)])[0]
    n, row = device_raw(t)
    return _complete(n, row.cpu().numpy(), t)


def raw_many(tensors: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """Raw rows of many tensors: small CPU ones in one numpy batch, the rest
    with torch reductions, one host transfer at the end."""
    out: list = [None] * len(tensors)
    host_idx, host_arrays, dev = [], [], []
    for i, t in enumerate(tensors):
        if is_host_tensor(t):
            host_idx.append(i)
            host_arrays.append(_host_array(t))
        else:
            dev.append(i)
    if host_arrays:
        rows = host_raw_batch(host_arrays)
        for j, i in enumerate(host_idx):
            out[i] = rows[j]
    if dev:
        pending = [(*device_raw(tensors[i]), tensors[i]) for i in dev]
        for i, row in zip(dev, resolve_device_rows(pending)):
            out[i] = row
    return out


def stats_of(t: torch.Tensor) -> dict:
    """The ten statistics of one tensor as a dict (for display and tests)."""
    return dict(zip(STAT_NAMES, (float(x) for x in finalize(raw_now(t)))))


def finalize_many(raws: Iterable[np.ndarray]) -> np.ndarray:
    rows = [finalize(r) for r in raws]
    return np.array(rows) if rows else np.zeros((0, N_STATS))
