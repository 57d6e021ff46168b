"""How a full tensor is stored: float16 with a per-tensor scale, bfloat16 as its
bits, or float32/float64 as they are, and never a value that lies.

``encode(values, precision)`` returns the ``Encoded`` form of a flat array
and ``decode(encoded_data, used, scale, dtype)`` gives it back.  The promise
(``MAX_REL_ERROR``): every finite non-zero value comes back with a relative
error of at most the bound of the precision actually used; zeros (with their
sign), NaN and +/-Inf come back as they were.  A tensor that the requested
precision cannot hold within that bound (a value that would overflow to
Inf, or fall below the format's normal range and lose its digits or become
0) is stored in the next wider precision instead (fp16 -> bf16 -> fp32 ->
fp64), and the precision used is recorded with it.

* fp16: the values are divided by a power of two (exact) chosen so that the
  largest finite magnitude lands in [2^14, 2^15), then rounded to float16
  (round to nearest even: relative error <= 2^-11).  Kept only if every
  finite non-zero value then lies in float16's normal range [2^-14, 65504]:
  a tensor whose magnitudes span more than about 2^28 falls back.
* bf16: float32's upper 16 bits, rounded to nearest even (8 significant
  bits: relative error <= 2^-8 = 3.9e-3); NaN kept as NaN.  Falls back if a
  value is a float32 subnormal (it would keep fewer digits) or would round up
  to Inf.
* fp32: exact for float32 and narrower tensors; a float64 tensor is rounded
  (relative error <= 2^-24) and falls back to fp64 if a value lies outside
  float32's normal range.
* fp64: exact.

A float16 tensor is stored as its own bits (fp16, exact) whatever was asked.

Only numpy and the schema are imported.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..schema import FULL_PRECISIONS

PRECISIONS = ("fp16", "bf16", "fp32", "fp64")
# The precisions a user may ask for (fp64 is only ever a fallback).
REQUESTABLE = FULL_PRECISIONS
# The largest relative error |decoded - x| / |x| of a finite non-zero value,
# by the precision actually used (checked by tests/test_full_history.py).
MAX_REL_ERROR = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8, "fp32": 2.0 ** -24, "fp64": 0.0}
# The stored element of each precision: which data dataset holds it.
STORE_OF = {"fp16": "u16", "bf16": "u16", "fp32": "f32", "fp64": "f64"}
_FALLBACK = {"fp16": "bf16", "bf16": "fp32", "fp32": "fp64"}

_F16_MIN_NORMAL = 2.0 ** -14
_F16_MAX = 65504.0
_F32_MIN_NORMAL = float(np.finfo(np.float32).tiny)
_F32_MAX = float(np.finfo(np.float32).max)


class Encoded(NamedTuple):
    used: str             # the precision the data is in (PRECISIONS)
    data: np.ndarray      # flat: uint16 (fp16, bf16 bits), float32 or float64
    scale: float          # fp16: the power of two the values were divided by; 1.0 otherwise


def _finite_nonzero_abs(a: np.ndarray) -> np.ndarray:
    m = np.abs(a[np.isfinite(a)])
    return m[m != 0]


def _fp16(a: np.ndarray):
    mags = _finite_nonzero_abs(a)
    scale = 1.0
    if mags.size:
        scale = float(2.0 ** (int(np.floor(np.log2(float(mags.max())))) - 14))
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        h = (a.astype(np.float64) / scale).astype(np.float16)
    if mags.size:
        hm = np.abs(h[np.isfinite(a) & (a != 0)].astype(np.float64))
        if not (np.isfinite(hm).all() and hm.min() >= _F16_MIN_NORMAL and hm.max() <= _F16_MAX):
            return None
    return Encoded("fp16", h.view(np.uint16), scale)


def _bf16(a: np.ndarray):
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        f = a.astype(np.float32)
    if a.dtype == np.float64:
        mags = _finite_nonzero_abs(a)
        if mags.size and (mags.min() < _F32_MIN_NORMAL or mags.max() > _F32_MAX):
            return None
    u = np.ascontiguousarray(f).view(np.uint32)
    exp = (u >> 23) & 0xFF
    if np.any((exp == 0) & ((u & 0x7FFFFF) != 0)):          # a float32 subnormal
        return None
    nan = np.isnan(f)
    rounded = (u + (0x7FFF + ((u >> 16) & 1))) >> 16        # round to nearest even
    b = rounded.astype(np.uint16)
    was_finite = exp != 0xFF
    if np.any(was_finite & ((b & 0x7F80) == 0x7F80)):        # rounded up to Inf
        return None
    b[nan] = (0x7FC0 | ((u[nan] >> 16) & 0x8000)).astype(np.uint16)
    inf = ~was_finite & ~nan
    b[inf] = (u[inf] >> 16).astype(np.uint16)
    return Encoded("bf16", b, 1.0)


def _fp32(a: np.ndarray):
    if a.dtype != np.float64:
        return Encoded("fp32", a.astype(np.float32), 1.0)
    mags = _finite_nonzero_abs(a)
    if mags.size and (mags.min() < _F32_MIN_NORMAL or mags.max() > _F32_MAX):
        return None
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        return Encoded("fp32", a.astype(np.float32), 1.0)


_ENCODERS = {"fp16": _fp16, "bf16": _bf16, "fp32": _fp32,
             "fp64": lambda a: Encoded("fp64", a.astype(np.float64), 1.0)}


def encode(values: np.ndarray, precision: str) -> Encoded:
    """The flat array ``values`` (any float dtype) in ``precision`` or, where
    that would lie, the next wider precision that does not."""
    if precision not in _ENCODERS:
        raise ValueError(f"unknown precision {precision!r}")
    a = np.asarray(values).reshape(-1)
    if a.dtype not in (np.float16, np.float32, np.float64):
        a = a.astype(np.float64 if a.dtype.itemsize > 4 else np.float32)
    if a.dtype == np.float16:
        # already half precision: its own bits, exact (and 2 bytes whatever was asked)
        return Encoded("fp16", a.view(np.uint16).copy(), 1.0)
    p = precision
    while True:
        out = _ENCODERS[p](a)
        if out is not None:
            return out
        p = _FALLBACK[p]


def decode(data: np.ndarray, used: str, scale: float, dtype: str) -> np.ndarray:
    """The values ``encode`` stored, as ``dtype`` (the tensor's own float dtype name)."""
    if used == "fp16":
        v = np.asarray(data, dtype=np.uint16).view(np.float16).astype(np.float64) * scale
    elif used == "bf16":
        v = (np.asarray(data, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif used in ("fp32", "fp64"):
        v = np.asarray(data)
    else:
        raise ValueError(f"unknown stored precision {used!r}")
    out = np.dtype(dtype) if dtype in ("float16", "float32", "float64") else np.dtype(np.float32)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        return v.astype(out)
