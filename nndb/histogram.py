"""The fixed histogram of a tensor (schema ``hist``), and what is read from it.

Every histogram has the same ``N_BINS`` = 200 bins, in value order
(``NaN`` first, then -Inf ... +Inf), so any two can be compared bin by bin:

====================  ==========================================================
index                 values
====================  ==========================================================
0                     NaN
1                     -Inf
2                     finite, <= -2^24 (overflow)
3 .. 98               negative, |x| in one of 96 half-binades of [2^-24, 2^24),
                      largest magnitude first
99                    negative, |x| < 2^-24 (underflow, subnormals included)
100                   zero (+0.0 and -0.0): an exact count
101                   positive, x < 2^-24
102 .. 197            positive, x in one of 96 half-binades of [2^-24, 2^24)
198                   finite, >= 2^24
199                   +Inf
====================  ==========================================================

A half-binade splits [2^e, 2^(e+1)) at 1.5 * 2^e (the top mantissa bit of a
float32: the bin of a float32 is read from its bits), so a value is known to a
factor of at most 1.5 from its bin.  NaN, Inf and zeros are exact counts.

Quantiles read from a histogram are approximate: the value is placed within
its bin by geometric interpolation, and the true quantile lies in the bin's
range (``quantile_bounds``).  The Kolmogorov-Smirnov statistic of two
histograms is the largest difference of their CDFs at the bin edges, which
is at most the true statistic of the two underlying samples (the maximum is
taken over fewer points).

Only numpy is imported.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

N_MAG = 96                       # half-binades of [2^-24, 2^24)
MAG_LO = 2 * (127 - 24)          # float32 (exponent << 1 | top mantissa bit) of 2^-24
MAG_HI = 2 * (127 + 24)          # ... of 2^24
N_BINS = 2 * N_MAG + 8
I_NAN, I_NEG_INF, I_NEG_OVER, I_NEG_UNDER, I_ZERO, I_POS_UNDER, I_POS_OVER, I_POS_INF = \
    0, 1, 2, 3 + N_MAG, 4 + N_MAG, 5 + N_MAG, 6 + 2 * N_MAG, 7 + 2 * N_MAG
_POS0 = I_POS_UNDER + 1          # first positive half-binade
FINE = 1024                      # float32 bits >> 22: sign, exponent, top mantissa bit
UNDER = 2.0 ** -24
OVER = 2.0 ** 24


def _mag_lower(m: int) -> float:
    """The smallest magnitude of half-binade ``m`` (float32 exponent << 1 | top mantissa bit)."""
    return 2.0 ** ((m >> 1) - 127) * (1.5 if m & 1 else 1.0)


def _fold_map() -> np.ndarray:
    """fine index (float32 bits >> 22) -> bin, before the exact corrections."""
    out = np.empty(FINE, dtype=np.intp)
    for i in range(FINE):
        neg, m = i >> 9, i & 511
        if m == 511:
            b = I_NAN
        elif m == 510:
            b = I_NEG_INF if neg else I_POS_INF
        elif m >= MAG_HI:
            b = I_NEG_OVER if neg else I_POS_OVER
        elif m >= MAG_LO:
            b = (I_NEG_UNDER - 1 - (m - MAG_LO)) if neg else _POS0 + (m - MAG_LO)
        else:
            b = I_NEG_UNDER if neg else I_POS_UNDER
        out[i] = b
    return out


FOLD = _fold_map()
# The lookup a float32's ``bits >> 22`` goes through: its bin, with exponent 0
# (zeros and subnormals) taken for zero and exponent 255 with a clear top bit
# for Inf; ``of_segments`` then checks both against exact counts.
LUT = FOLD.copy()
LUT[[0, 1, 512, 513]] = I_ZERO
LUT = LUT.astype(np.intp)
# Folding fine counts into bins (``fold``): the half-binades are one fine index each, in
# order (the negative ones reversed); the rest are sums over a few ranges of them, one
# ``reduceat`` at these edges: zero (exponent 0), underflow, the half-binades (unused),
# overflow, Inf and NaN, of each sign.
_EDGES = np.array([0, 2, MAG_LO, MAG_HI, 510, 511])
_EDGES = np.concatenate([_EDGES, _EDGES + FINE // 2])
_EDGE_SUMS = np.array([1, 3, 4, 7, 9, 10])                 # (underflow, overflow, Inf of each sign)
_EDGE_BINS = np.array([I_POS_UNDER, I_POS_OVER, I_POS_INF, I_NEG_UNDER, I_NEG_OVER, I_NEG_INF])


def bin_ranges() -> np.ndarray:
    """(N_BINS, 2): each bin's [low, high] values (NaN's: NaN)."""
    r = np.full((N_BINS, 2), np.nan)
    r[I_NEG_INF] = -np.inf
    r[I_POS_INF] = np.inf
    r[I_ZERO] = 0.0
    r[I_POS_UNDER] = (0.0, UNDER)
    r[I_NEG_UNDER] = (-UNDER, 0.0)
    r[I_POS_OVER] = (OVER, np.inf)
    r[I_NEG_OVER] = (-np.inf, -OVER)
    for k in range(N_MAG):
        lo, hi = _mag_lower(MAG_LO + k), _mag_lower(MAG_LO + k + 1)
        r[_POS0 + k] = (lo, hi)
        r[I_NEG_UNDER - 1 - k] = (-hi, -lo)
    return r


RANGES = bin_ranges()


def exact(values: np.ndarray) -> np.ndarray:
    """The histogram of ``values`` (any float dtype) computed value by value, in float64."""
    with np.errstate(invalid="ignore"):      # (a signalling NaN cast from float32: no warning in the user's stderr)
        a = np.asarray(values, dtype=np.float64).reshape(-1)
    out = np.zeros(N_BINS, dtype=np.int64)
    nan = np.isnan(a)
    out[I_NAN] = int(nan.sum())
    out[I_POS_INF] = int(np.count_nonzero(a == np.inf))
    out[I_NEG_INF] = int(np.count_nonzero(a == -np.inf))
    out[I_ZERO] = int(np.count_nonzero(a == 0))
    f = a[np.isfinite(a) & (a != 0)]
    if f.size:
        m, e = np.frexp(np.abs(f))                       # |f| = m * 2^e, m in [0.5, 1)
        mag = 2 * (e.astype(np.int64) - 1 + 127) + (m >= 0.75)
        neg = f < 0
        under, over = mag < MAG_LO, mag >= MAG_HI
        mid = ~(under | over)
        k = (mag - MAG_LO)[mid]
        np.add.at(out, np.where(neg[mid], I_NEG_UNDER - 1 - k, _POS0 + k), 1)
        out[I_NEG_UNDER] += int(np.count_nonzero(under & neg))
        out[I_POS_UNDER] += int(np.count_nonzero(under & ~neg))
        out[I_NEG_OVER] += int(np.count_nonzero(over & neg))
        out[I_POS_OVER] += int(np.count_nonzero(over & ~neg))
    return out


def bin_of(v: float) -> int:
    """The bin of one value (a scalar loss: no numpy call)."""
    if v != v:
        return I_NAN
    if v == 0:
        return I_ZERO
    if math.isinf(v):
        return I_POS_INF if v > 0 else I_NEG_INF
    m, e = math.frexp(abs(v))
    mag = 2 * (e - 1 + 127) + (m >= 0.75)
    if mag < MAG_LO:
        return I_NEG_UNDER if v < 0 else I_POS_UNDER
    if mag >= MAG_HI:
        return I_NEG_OVER if v < 0 else I_POS_OVER
    return I_NEG_UNDER - 1 - (mag - MAG_LO) if v < 0 else _POS0 + (mag - MAG_LO)


# of_segments counts each segment on its own from this many elements in all, this many
# a segment on average.
LARGE_ELEMENTS = 1 << 17
LARGE_SEGMENT = 4096
# ... and looks each element's bin up (LUT) where the segments hold fewer than this many
# elements for each of their FINE counts: the fold then costs more than the lookups.
FEW_ELEMENTS = 4


def of_segments(flat: np.ndarray, sizes, count=None) -> np.ndarray:
    """(len(sizes), N_BINS): the histogram of each consecutive segment of a flat
    float32 array (other dtypes: value by value), from the float32 bits: one
    bincount of the FINE keys (bits >> 22), folded into the bins.  Exponent 0 is counted as zero and checked
    against the exact count of zeros; a segment with a subnormal, an Inf or a
    signalling NaN is done value by value.  ``count(bits, sizes)``: the (k, FINE) counts of
    the segments' keys by a faster counter where the caller has one (torch's:
    nndb.tracer.histogram), or None where it would not be faster."""
    k = len(sizes)
    if flat.dtype != np.float32 or k == 0:
        starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        return np.stack([exact(flat[starts[i]:starts[i + 1]]) for i in range(k)]) if k else \
            np.zeros((0, N_BINS), dtype=np.int64)
    # Count the FINE keys of each segment, then fold each segment's 1024
    # counts into its bins: a gather through LUT over every element cost 4x
    # more (4.4 ms against ~1.1 ms for a 524,288-element activation).
    # (intp: bincount casts any other index type first)
    bits = np.ascontiguousarray(flat).view(np.uint32)
    fine = count(bits, sizes) if count is not None else None
    if fine is not None:
        return checked(fold(fine), flat, sizes)
    if is_large(bits.size, k):
        # (large segments, a GPT's parameters: one bincount each, of keys as large as the
        # segment; the one bincount of all, with its segment offsets, made three arrays as
        # large as the block, 4 to 6x slower: 16-26 ms for 2.5 M elements against 4.8)
        return checked(fold(fine_by_segment(bits, sizes)), flat, sizes)
    if bits.size < k * FINE * FEW_ELEMENTS:
        # (few elements for their segments' FINE counts, a small model's parameters, gradients
        # and updates: 18 segments of 20,766 elements had 18,432 counts to clear, gather and
        # fold, more work than the elements; each element's bin looked up instead, 1.39 M ->
        # 1.06 M instructions a block, and 0.95 M -> 0.83 M for an MLP's activations; for 7
        # segments of 49 K elements the fold is the cheaper, 1.83 M against 2.17 M)
        keys = LUT.take(bits >> 22)
        if k > 1:
            keys += np.repeat(np.arange(0, k * N_BINS, N_BINS, dtype=np.intp), sizes)
        return checked(np.bincount(keys, minlength=k * N_BINS).reshape(k, N_BINS), flat, sizes)
    keys = (bits >> 22).astype(np.intp)
    if k > 1:
        keys += np.repeat(np.arange(0, k * FINE, FINE, dtype=np.intp), sizes)
    return checked(fold(np.bincount(keys, minlength=k * FINE).reshape(k, FINE)), flat, sizes)


def is_large(n: int, k: int) -> bool:
    """Are ``k`` segments of ``n`` elements in all counted one at a time?"""
    return n >= LARGE_ELEMENTS and n >= k * LARGE_SEGMENT


def fine_by_segment(bits: np.ndarray, sizes) -> np.ndarray:
    """(k, FINE): each segment's counts of its float32 keys (``bits``: the float32 bits,
    their consecutive segments of lengths ``sizes``), one bincount a segment."""
    fine = np.empty((len(sizes), FINE), dtype=np.intp)
    at = 0
    for i, n in enumerate(sizes):
        fine[i] = np.bincount(bits[at:at + n] >> 22, minlength=FINE)
        at += n
    return fine


def fold(fine: np.ndarray) -> np.ndarray:
    """(k, FINE) counts of float32 keys (bits >> 22) -> (k, N_BINS), before
    ``checked``'s corrections: LUT's map, a few slices a row.  (The fine counts gathered
    into bin order and summed between the bins' edges, one ``reduceat`` call a bin and
    row, took 3.0 M instructions for a GPT's 159 segments, this 0.6 M.)"""
    half = FINE // 2
    out = np.empty((fine.shape[0], N_BINS), dtype=np.int64)
    out[:, _POS0:_POS0 + N_MAG] = fine[:, MAG_LO:MAG_HI]
    out[:, I_NEG_UNDER - N_MAG:I_NEG_UNDER] = fine[:, half + MAG_HI - 1:half + MAG_LO - 1:-1]
    edges = np.add.reduceat(fine, _EDGES, axis=1)
    out[:, _EDGE_BINS] = edges[:, _EDGE_SUMS]
    np.add(edges[:, 0], edges[:, 6], out=out[:, I_ZERO])
    np.add(edges[:, 5], edges[:, 11], out=out[:, I_NAN])
    return out


def checked(out: np.ndarray, flat: np.ndarray, sizes, zeros: Optional[int] = None) -> np.ndarray:
    """``out`` (the folded counts of the float32 segments of ``flat``) with the
    zero bin checked against an exact count of zeros (``zeros``, all the
    segments' together, when the caller has counted them already: one pass
    over the data less), and a segment with a subnormal, an Inf or a
    signalling NaN counted value by value."""
    zero_like = out[:, I_ZERO]
    special = out[:, I_POS_INF] + out[:, I_NEG_INF]
    if zero_like.any() or special.any():
        if zeros is None:
            zeros = np.count_nonzero(flat == 0)
        if zeros != int(zero_like.sum()) or special.any():
            starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
            for i in np.nonzero(zero_like | special)[0]:
                seg = flat[starts[i]:starts[i + 1]]
                if special[i] or np.count_nonzero(seg == 0) != zero_like[i]:
                    out[i] = exact(seg)
    return out


# -- reading a histogram -----------------------------------------------------------

def total(h: np.ndarray) -> int:
    return int(np.asarray(h).sum())


def zero_share(h: np.ndarray) -> Optional[float]:
    """Zeros over the non-NaN elements (None: none)."""
    n = total(h) - int(h[I_NAN])
    return int(h[I_ZERO]) / n if n else None


def cdf(h: np.ndarray) -> np.ndarray:
    """The CDF over the non-NaN values at the upper edge of each bin (1..N_BINS-1)."""
    c = np.cumsum(np.asarray(h[1:], dtype=np.float64))
    return c / c[-1] if c[-1] else c


def ks(a: np.ndarray, b: np.ndarray) -> Optional[float]:
    """The Kolmogorov-Smirnov statistic of two histograms' non-NaN values, at the
    bin edges (a lower bound of the samples' statistic); None if one is empty."""
    if total(a) - int(a[I_NAN]) == 0 or total(b) - int(b[I_NAN]) == 0:
        return None
    return float(np.max(np.abs(cdf(a) - cdf(b))))


def quantile_bounds(h: np.ndarray, q: float) -> Optional[tuple]:
    """(low, estimate, high): the q-quantile of the non-NaN values lies in
    [low, high] (its bin); the estimate interpolates geometrically within it."""
    counts = np.asarray(h[1:], dtype=np.float64)
    n = counts.sum()
    if n == 0:
        return None
    c = np.cumsum(counts)
    target = q * n
    i = int(np.searchsorted(c, max(target, 1e-12) if q > 0 else 0.5, side="left"))
    i = min(i, len(counts) - 1)
    lo, hi = RANGES[i + 1]
    if lo == hi or not (np.isfinite(lo) and np.isfinite(hi)):
        est = lo if np.isfinite(lo) else hi
        return float(lo), float(est), float(hi)
    before = c[i] - counts[i]
    frac = min(max((target - before) / counts[i], 0.0), 1.0) if counts[i] else 0.5
    if lo > 0:
        est = lo * (hi / lo) ** frac
    elif hi < 0:
        est = -((-hi) * ((-lo) / (-hi)) ** (1 - frac))
    else:
        est = lo + (hi - lo) * frac
    return float(lo), float(est), float(hi)
