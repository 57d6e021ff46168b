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

Two levels.  Every recorded step: count, norm and NaN/Inf detection for
every tensor (``host_norm_rows``: squares and one ``reduceat`` for a block
of small tensors, summed in float32 for float32 tensors, which agrees with
the float64 sums of a full step to about 1e-7; for a large CPU one its squares
summed in rows, the rows in float64: ``cpu_sumsq``), and all
ten statistics of a scalar loss (``scalar_raw``, no numpy reduction).  At
*full* steps (``nndb.cadence.Cadence.full``: every 32nd recorded step by
default) everything: also mean, std, min, max, mean |x| and the zero
fraction.  Unmeasured fields are NaN.  NaN and Inf are counted only when a
cheap check (a non-finite sum or sum of squares) says there may be some.
When a tensor has non-finite elements, mean, std, norm and mean |x| describe
its finite elements, so a gradient with three NaN still shows the norm of the
rest; min and max are those of the elements that are not NaN, so an Inf is
the extreme it is.  A tensor with no finite element is described as it is:
an infinite loss has mean, min, max, norm and mean |x| of ``inf`` (``-inf``
for the mean and extremes of negative infinities) and a NaN std; with a NaN,
mean, std, norm and mean |x| are NaN.  ``count`` is always the element count.
A parameter block of at least ``DOT_MIN_ELEMENTS`` (a GPT's) is read between
full steps where its tensors lie (``ParamPlan._block_large``), and at full
steps its extremes read in float32 (docs/performance.md).

Why this size: one raw row, made by every path a tensor can take (host
blocks, large CPU tensors, accelerators, several at once), and read back
(``finalize``); the paths must agree field by field, so they stay side by side.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import torch

from ..schema import N_STATS, STAT_NAMES
from .quiet import quiet as _quiet      # (numpy's warnings off: NaN and Inf are data here)

RAW_FIELDS = ("n", "sum", "sumsq", "min", "max", "sumabs", "nzero", "nnan", "ninf")
N_RAW = len(RAW_FIELDS)

# Tensors up to this many elements are reduced with numpy on the host (their
# cost is call overhead, which numpy has less of); larger ones with torch,
# whose reductions are vectorised and multi-threaded.
HOST_MAX_ELEMENTS = 1 << 12
# Parameters, gradients and updates are read in one concatenated block per
# optimizer step, where numpy stays cheaper for larger tensors.
HOST_MAX_PARAM_ELEMENTS = 1 << 16

_HOST_DTYPES = (torch.float32, torch.float64, torch.float16)
RAW_N, RAW_SUM, RAW_SQ, RAW_MIN, RAW_MAX, RAW_ABS, RAW_ZERO, RAW_NAN, RAW_INF = range(N_RAW)
NONFINITE_FIELDS = slice(RAW_NAN, RAW_INF + 1)


def empty_raw() -> np.ndarray:
    raw = np.zeros(N_RAW)
    raw[RAW_MIN] = np.inf
    raw[RAW_MAX] = -np.inf
    return raw


def is_recordable(t) -> bool:
    """Floating-point tensors are summarised; integer and complex ones are not."""
    return isinstance(t, torch.Tensor) and t.is_floating_point()


@_quiet
def merge_raw(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact merge; a field one side did not measure (NaN) stays unmeasured."""
    out = a + b
    out[RAW_MIN] = np.minimum(a[RAW_MIN], b[RAW_MIN])
    out[RAW_MAX] = np.maximum(a[RAW_MAX], b[RAW_MAX])
    return out


def finalize(raw: np.ndarray) -> np.ndarray:
    """Raw accumulator row -> the ten statistics of STAT_NAMES."""
    return finalize_many([raw])[0]


# -- host (numpy) path -----------------------------------------------------

def local(t):
    """A tensor's local part: a DTensor's shard on this rank (FSDP records
    each rank's own shard: nndb.store.merge combines them), else the tensor."""
    return t.to_local() if type(t).__name__ == "DTensor" else t


def dense(t):
    """A sparse tensor (the gradient of ``nn.Embedding(sparse=True)``, which SparseAdam applies)
    as the dense tensor it stands for (its repeated indices summed), else the tensor."""
    return t.to_dense() if t is not None and t.layout is not torch.strided else t


def _host_array(t: torch.Tensor) -> np.ndarray:
    t = local(t).detach()
    if t.dtype not in _HOST_DTYPES:
        t = t.float()
    return t.numpy().reshape(-1)


@_quiet
def _segment_raw_exact(seg: np.ndarray) -> np.ndarray:
    """Slow path for a segment that holds NaN or Inf: sums over its finite
    part, extremes over its elements that are not NaN."""
    raw = empty_raw()
    raw[RAW_N] = seg.size
    nan = np.isnan(seg)
    inf = np.isinf(seg)
    raw[RAW_NAN] = np.count_nonzero(nan)
    raw[RAW_INF] = np.count_nonzero(inf)
    fin = seg[~(nan | inf)].astype(np.float64)
    raw[RAW_ZERO] = np.count_nonzero(fin == 0)
    if fin.size:
        raw[RAW_SUM] = fin.sum()
        raw[RAW_SQ] = np.einsum("i,i->", fin, fin)
        raw[RAW_ABS] = np.abs(fin).sum()
    if raw[RAW_NAN] < seg.size:
        values = seg[~nan]
        raw[RAW_MIN] = values.min()
        raw[RAW_MAX] = values.max()
    return raw


@_quiet
def host_raw_one(a: np.ndarray, full: bool = True) -> np.ndarray:
    """Raw row of one small host array: numpy reductions, sums in float64."""
    raw = empty_raw()
    n = a.size
    raw[RAW_N] = n
    if n == 0:
        return raw
    x = a.astype(np.float64)
    s = x.sum()
    sq = np.einsum("i,i->", x, x)
    if not np.isfinite(s + sq):
        return _segment_raw_exact(a)
    raw[RAW_SUM] = s
    raw[RAW_SQ] = sq
    if not full:
        raw[RAW_MIN] = raw[RAW_MAX] = raw[RAW_ABS] = raw[RAW_ZERO] = np.nan
        return raw
    raw[RAW_MIN] = x.min()
    raw[RAW_MAX] = x.max()
    raw[RAW_ABS] = np.abs(x).sum()
    raw[RAW_ZERO] = n - np.count_nonzero(x)
    return raw


def host_raw_batch(arrays: Sequence[np.ndarray], full: bool = True) -> np.ndarray:
    """Raw rows for many 1-D host arrays at once."""
    if len(arrays) == 1:
        return host_raw_one(arrays[0], full)[None, :]
    if len(arrays) == 0:
        return np.zeros((0, N_RAW))
    sizes = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
    return host_raw_segments(np.concatenate(arrays, dtype=np.float64), sizes, full)


@_quiet
def host_raw_segments(flat: np.ndarray, sizes: np.ndarray, full: bool = True, zeros=None) -> np.ndarray:
    """Raw rows of the consecutive segments of ``flat`` (lengths ``sizes``):
    one ``reduceat`` per accumulator over all segments.  Without ``full``,
    only the sums (count, mean, std, norm, and NaN/Inf detection).  ``zeros``:
    the segments' counts of exact zeros where the caller has them (a full step's
    histograms, whose zero bins are exact: nndb.tracer.histogram.full_segments),
    else counted here."""
    k = len(sizes)
    sizes = np.asarray(sizes, dtype=np.int64)
    # (a small block's extremes are read from its float64 copy, a large float32 one's from
    # itself, as they always were: the same numbers, the sign of a zero extreme included)
    wide = flat.dtype != np.float32 or flat.size < DOT_MIN_ELEMENTS
    all_starts = np.zeros(k, dtype=np.int64)
    np.cumsum(sizes[:-1], out=all_starts[1:])
    out = np.zeros((k, N_RAW))
    out[:, RAW_N] = sizes
    if sizes.all():                  # the common case: plain slices, no fancy indexing
        nonempty, starts, cols = slice(None), all_starts, out
    else:
        nonempty = np.flatnonzero(sizes)
        out[:, RAW_MIN] = np.inf
        out[:, RAW_MAX] = -np.inf
        if nonempty.size == 0:
            return out
        starts = all_starts[nonempty]
        cols = None
    if full:
        if zeros is None:
            zeros = _zeros(flat, starts, sizes if cols is not None else sizes[nonempty])
        elif cols is None:
            zeros = np.asarray(zeros)[nonempty]
    if wide:
        # One float64 copy, then each accumulator's values made in its place: x, then |x| for
        # the sum of magnitudes, then |x|*|x| (x*x bit for bit) for the sum of squares; the copy
        # and the two in-place passes by torch, whose loops are vectorised where numpy's cast
        # and absolute are not; the sums numpy's (pairwise, per segment, as before).  (An MLP's
        # 20,766 elements: a new array for the squares and one for the magnitudes before.)
        xt = _float64_copy(flat)
        x = xt.numpy()
        sums = np.add.reduceat(x, starts)
        fields = [(RAW_SUM, sums)]
        if full:
            fields += [(RAW_MIN, np.minimum.reduceat(x, starts)), (RAW_MAX, np.maximum.reduceat(x, starts)),
                       (RAW_ZERO, zeros)]
            xt.abs_()
            fields.append((RAW_ABS, np.add.reduceat(x, starts)))
        xt.mul_(xt)
        sq = np.add.reduceat(x, starts)
    else:
        # (a large float32 block is read as it is, its sums cast as they go, in numpy's buffers:
        # a float64 copy of a GPT's 2.5 M elements reduced in place took fewer instructions
        # (27 M against 55 M) but more time, 20 MB through memory where the buffers stay in cache)
        sums = np.add.reduceat(flat, starts, dtype=np.float64)
        sq = np.add.reduceat(np.square(flat, dtype=np.float64), starts)
        fields = [(RAW_SUM, sums)]
        if full:
            fields += [(RAW_MIN, np.minimum.reduceat(flat, starts)), (RAW_MAX, np.maximum.reduceat(flat, starts)),
                       (RAW_ABS, np.add.reduceat(np.abs(flat), starts, dtype=np.float64)), (RAW_ZERO, zeros)]
    if not full:
        nan = np.full(sums.shape, np.nan)
        fields += [(RAW_MIN, nan), (RAW_MAX, nan), (RAW_ABS, nan), (RAW_ZERO, nan)]
    fields.append((RAW_SQ, sq))
    for col, values in fields:
        if cols is not None:
            out[:, col] = values
        else:
            out[nonempty, col] = values
    bad = ~np.isfinite(sums + sq)
    if bad.any():
        idx = np.arange(k) if cols is not None else nonempty
        for j in np.flatnonzero(bad):
            i = idx[j]
            seg = flat[all_starts[i]:all_starts[i] + sizes[i]]
            out[i] = _segment_raw_exact(seg.astype(np.float64) if wide else seg)
    return out


def _float64_copy(flat: np.ndarray) -> torch.Tensor:
    """A float64 copy of a flat host array, as a torch tensor (its ``numpy()`` a view):
    torch's cast, 1.3 instructions an element against numpy's 2.8."""
    if flat.flags.c_contiguous and flat.flags.writeable:
        return torch.from_numpy(flat).to(torch.float64, copy=True)
    return torch.from_numpy(flat.astype(np.float64))          # (torch reads no read-only array without a warning)


def _zeros(flat: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The zeros in each segment: where they lie, then how many fall in each segment.  A
    ``reduceat`` of the booleans cast to int64 made a GPT's 812 K parameters' full rows
    2.93 ms, this 2.47 ms (an MLP's 67 K: 139 -> 125 us); with half the elements zero, a
    ReLU's output, the two are even."""
    at = np.flatnonzero(flat == 0)
    return np.searchsorted(at, starts + sizes) - np.searchsorted(at, starts)


def scalar_row(v: float) -> list:
    """Raw row of one number (a scalar loss) as a list: no numpy call at all
    (the recorder's rows become one array when the step closes)."""
    if math.isnan(v):
        return [1.0, 0.0, 0.0, math.inf, -math.inf, 0.0, 0.0, 1.0, 0.0]
    if math.isinf(v):
        return [1.0, 0.0, 0.0, v, v, 0.0, 0.0, 0.0, 1.0]
    return [1.0, v, v * v, v, v, abs(v), float(v == 0), 0.0, 0.0]


def scalar_of(raw):
    """The number a one-element row describes (``scalar_row``'s), or None:
    a row of more elements, or one whose sum was not measured."""
    if raw is None or raw[RAW_N] != 1:
        return None
    if raw[RAW_NAN]:
        return math.nan
    if raw[RAW_INF]:
        return float(raw[RAW_MIN])
    v = float(raw[RAW_SUM])
    return None if math.isnan(v) else v


def add_scalar_rows(a, b, dtype=None):
    """The row of the sum of two one-element rows (a step's losses: the
    objective its backward passes differentiate is their sum), or None when
    one of them is not such a row.  ``dtype`` (a torch dtype): added as torch
    adds two 0-d tensors of it (dcgan's ``errD_real + errD_fake``, float32),
    else in Python's float64."""
    va, vb = scalar_of(a), scalar_of(b)
    if va is None or vb is None:
        return None
    if dtype is not None and dtype != torch.float64:
        return scalar_row(float(torch.tensor(va, dtype=dtype) + torch.tensor(vb, dtype=dtype)))
    return scalar_row(va + vb)


def scalar_raw(v: float) -> np.ndarray:
    """Raw row of one number (a scalar loss), without numpy reductions."""
    return np.array(scalar_row(v))


# Norm-only rows (the steps between full ones): count and sum of squares,
# which give the norm and tell whether NaN/Inf may be present; the rest NaN.
_NORM_ROW = np.full(N_RAW, np.nan)
_NORM_ROW[[RAW_NAN, RAW_INF]] = 0.0


def norm_template(sizes) -> tuple[np.ndarray, np.ndarray]:
    """(starts, rows) for ``host_norm_rows`` over segments of these (nonzero)
    lengths: computed once for a layout that recurs step after step."""
    sizes = np.asarray(sizes, dtype=np.int64)
    starts = np.zeros(len(sizes), dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    rows = np.repeat(_NORM_ROW[None, :], len(sizes), axis=0)
    rows[:, RAW_N] = sizes
    return starts, rows


# A parameter block of at least this many elements is read where its tensors lie, one BLAS
# dot each (ParamPlan._block_large), and at full steps its extremes read in float32: the
# squares of a GPT's 2.5 M elements and their sums took 1.18 ms a step, the dots 0.37 ms
# (hot: 0.72 ms and 0.37 ms); below it the dots' calls cost more.
DOT_MIN_ELEMENTS = 1 << 17

# A float32 sum of squares below this may have lost elements to underflow
# (squares of |x| < 1e-19 are 0 in float32): such a segment is summed again in
# float64, so that a tiny gradient never reads as an exact zero.
F32_SQ_TINY = 1e-30


def host_norm_rows(flat: np.ndarray, starts: np.ndarray, template: np.ndarray,
                   scratch: Optional[np.ndarray] = None, segment=None) -> np.ndarray:
    """Norm-only rows of the consecutive segments of ``flat`` (``norm_template``
    of their lengths): squares summed per segment by one ``reduceat``, in float32 for a
    float32 ``flat`` (numpy sums in blocks: about 1e-7 relative error, against float64 at
    full steps; a parameter block past DOT_MIN_ELEMENTS is not read here but where its tensors
    lie: nndb.tracer.params.ParamPlan._block_large); a segment whose sum is not finite
    or nearly zero takes the exact path (float64).  Call it under
    ``np.errstate(all="ignore")`` (squares of huge values overflow).  Float16 is
    squared in float32 (in float16 squares under 6e-8 were 0: a norm 0.002 read 0).
    ``scratch``: a float32 array at least as long as ``flat`` to square into (no new
    array a step, whose fresh memory the step's own tensors then miss in the caches);
    ``flat`` itself squares it in place, and then ``segment(i)`` must give segment i's
    values for the exact path."""
    if scratch is not None and flat.dtype == np.float32:
        sq = np.add.reduceat(np.square(flat, out=scratch[:len(flat)]), starts)
    else:
        sq = np.add.reduceat(np.square(flat.astype(np.float32) if flat.dtype == np.float16 else flat), starts)
    vals = sq.tolist()
    # (a few dozen sums: Python's min and sum of a list cost less than numpy's reductions;
    # NaN or Inf fails the sum's test, min then not needed)
    if sum(vals) < math.inf and min(vals) >= F32_SQ_TINY:
        out = template.copy()
        out[:, RAW_SQ] = sq
        return out
    return rows_of_squares(vals, template, segment or (
        lambda i: flat[int(starts[i]):int(starts[i]) + int(template[i, RAW_N])]))


def rows_of_squares(sq: list, template: np.ndarray, segment) -> np.ndarray:
    """Norm-only rows (``template``'s) of segments whose float32 sums of squares are ``sq``
    (floats), where some sum is not finite or nearly zero (the callers test the usual case
    themselves, inline): such a segment (``segment(i)``: its values) takes the exact path
    (float64)."""
    out = template.copy()
    out[:, RAW_SQ] = sq
    for i, v in enumerate(sq):
        if math.isfinite(v) and v >= F32_SQ_TINY:
            continue
        seg = segment(i)
        if math.isfinite(v):
            x = seg.astype(np.float64)
            out[i, RAW_SQ] = np.dot(x, x)
        else:
            out[i] = _segment_raw_exact(seg)
    return out


_TEMPLATES: dict = {}        # tuple of segment lengths -> norm_template (a step's activations recur)


@_quiet
def host_norm_segments(flat: np.ndarray, sizes) -> np.ndarray:
    """Norm-only rows of the consecutive segments of ``flat`` (lengths ``sizes``)."""
    key = tuple(sizes)
    lay = _TEMPLATES.get(key)
    if lay is None:
        if not key or not all(key):                      # (empty segments: the general path)
            return host_raw_segments(flat, np.asarray(sizes, dtype=np.int64), full=False)
        lay = norm_template(key)
        if len(_TEMPLATES) < 64:
            _TEMPLATES[key] = lay
    return host_norm_rows(flat, *lay)


# -- large CPU tensors (torch) ------------------------------------------------

def _device_flat(t: torch.Tensor) -> torch.Tensor:
    f = local(t).detach().reshape(-1)
    if f.dtype not in (torch.float32, torch.float64):
        f = f.float()
    return f


# A large CPU tensor's squares are summed in rows of SQ_ROW elements (torch's vector_norm,
# in the tensor's dtype), the rows' sums in float64: one float32 dot over millions of
# elements drifts as its partial sums grow (6.4 M values of 0.1: 7e-4 relative, normal
# values 2e-5), and a norm accumulated in float64 (``dtype=torch.float64``) converts element
# by element, 10-50x a dot's time on a CPU (6.4 M elements: 52 ms against 1.0 ms, one
# thread); the rows take one to two dots' time, 8e-7 relative for equal values, 1e-9 for
# normal ones (rows of 4096: 4e-6 and 4e-9).
SQ_ROW = 1024


def cpu_sumsq(f: torch.Tensor) -> float:
    """The sum of squares of a flat, contiguous float32 or float64 CPU tensor (SQ_ROW). A
    float32 sum under F32_SQ_TINY (squares that underflowed) is taken again in float64;
    a sum that is not finite is returned as it is (the callers count NaN and Inf exactly)."""
    n = f.numel()
    m = n - n % SQ_ROW
    if m:
        r = torch.linalg.vector_norm(f[:m].view(-1, SQ_ROW), dim=1).double()
        sq = float(torch.dot(r, r))
        if m < n:
            t = f[m:]
            sq += float(torch.dot(t, t))
    else:
        sq = float(torch.dot(f, f))
    if sq < F32_SQ_TINY and f.dtype == torch.float32 and (sq > 0 or bool(f.any())):
        x = f.double()
        sq = float(torch.dot(x, x))
    return sq


# A large tensor's mean squared over its mean square above which its squares are summed
# again about the mean (cpu_raw_large): there the mean is > 10x the standard deviation,
# and float32's sums leave std two digits fewer than float32 has, or none.
CENTER_SHARE = 0.99


def cpu_raw_large(t: torch.Tensor, full: bool = True) -> np.ndarray:
    """Raw row of a large CPU tensor with torch's vectorised, multi-threaded
    reductions, made right after the tensor was written (still in cache).

    Every step: one pass (the squares' rows, ``cpu_sumsq``) gives the norm and detects NaN/Inf
    (then counted exactly, in a slow pass).  With ``full``: sum, aminmax and,
    for a tensor with both signs, two more passes for sum|x| and the zero
    count (sign().sum() is several times faster than count_nonzero).
    Unmeasured fields are NaN.  (torch's reductions and Python floats: no
    numpy error state to set; the exact path sets its own.)"""
    f = _device_flat(t)
    n = f.numel()
    if n == 0:
        return empty_raw()
    if not full:
        sq = cpu_sumsq(f)
        if not math.isfinite(sq):
            return _segment_raw_exact(f.numpy())
        return np.array([n, math.nan, sq, math.nan, math.nan, math.nan, math.nan, 0.0, 0.0])
    raw = empty_raw()
    raw[RAW_N] = n
    mn, mx = torch.aminmax(f)
    s, lo, hi = torch.stack([f.sum(), mn, mx]).tolist()
    sq = cpu_sumsq(f) if math.isfinite(s + lo + hi) else math.nan
    if not math.isfinite(s + sq + lo + hi):
        return _segment_raw_exact(f.numpy())
    if s * s > CENTER_SHARE * n * sq:
        # The mean is most of the root mean square (values of 1000 +- 0.0055): std read from
        # the float32 sums, sqrt(sq/n - mean^2), is the difference of two numbers that agree
        # in every digit float32 keeps (it read 0.0).  The squares about the mean, taken
        # again, give it; sq is made of them in float64, so the norm is as exact.
        c = f - s / n
        sq = cpu_sumsq(c) + s * s / n
    raw[RAW_SUM], raw[RAW_SQ], raw[RAW_MIN], raw[RAW_MAX] = s, sq, lo, hi
    if lo > 0 or hi < 0:                 # one sign, no zeros
        raw[RAW_ABS], raw[RAW_ZERO] = abs(s), 0.0
    elif lo == 0 and hi == 0:
        raw[RAW_ABS], raw[RAW_ZERO] = 0.0, float(n)
    else:
        if lo >= 0 or hi <= 0:          # one sign (with zeros): sum|x| is |sum|
            raw[RAW_ABS] = abs(s)
            raw[RAW_ZERO] = n - abs(float(torch.sign(f).sum()))
        else:                           # one temporary, reused in place
            a = f.abs()
            raw[RAW_ABS] = float(a.sum())
            raw[RAW_ZERO] = n - float(a.sign_().sum())
    return raw


# -- many tensors' norms at once (torch, fused) ----------------------------------

_NORM_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def norm_rows_bulk(tensors: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """Norm-only rows (count, sum of squares, NaN/Inf: ``cpu_raw_large(t,
    full=False)``'s fields) of many torch tensors.  On an accelerator with a
    constant number of fused calls: one ``torch._foreach_norm`` (accumulated in
    float64) per (device, dtype) group and one host transfer per device, whatever
    the number of tensors.  On the CPU, where that float64 norm costs 10-50x a
    dot product (SQ_ROW), each by ``cpu_raw_large``'s rows (a few torch calls,
    no copy of a float32 or float64 tensor).  A tensor whose norm is not finite
    takes the exact path (its NaN and Inf counted).  Other dtypes, and empty
    tensors, one by one."""
    out: list = [None] * len(tensors)
    groups: dict = {}
    for i, t in enumerate(tensors):
        if t.dtype in _NORM_DTYPES and t.numel() and t.device.type != "cpu":
            groups.setdefault((t.device, t.dtype), []).append(i)
        else:
            out[i] = cpu_raw_large(t, False) if t.device.type == "cpu" else raw_now(t, False)
    if not groups:
        return out
    by_device: dict = {}
    for (device, _), idx in groups.items():
        norms = torch._foreach_norm([tensors[i] for i in idx], 2, dtype=torch.float64)
        by_device.setdefault(device, ([], []))
        by_device[device][0].extend(norms)
        by_device[device][1].extend(idx)
    for norms, idx in by_device.values():
        values = torch.stack(norms).cpu().numpy()      # (the one host transfer of the device)
        for i, v in zip(idx, values.tolist()):
            if math.isfinite(v):
                out[i] = np.array([tensors[i].numel(), math.nan, v * v, math.nan, math.nan, math.nan,
                                   math.nan, 0.0, 0.0])
            else:
                out[i] = _segment_raw_exact(_device_flat(tensors[i]).cpu().numpy())
    return out


# -- accelerator tensors (torch, asynchronous) ---------------------------------

def device_raw(t: torch.Tensor) -> tuple[int, torch.Tensor]:
    """The element count and the other eight raw fields as a tensor on ``t``'s
    device: no host synchronisation until ``resolve_device_rows``."""
    f = _device_flat(t)
    n = f.numel()
    if n == 0:
        return 0, torch.as_tensor(empty_raw()[1:], device=f.device)
    mn, mx = torch.aminmax(f)
    a = f.abs()
    parts = [f.sum(), torch.dot(f, f), mn, mx, a.sum(), n - torch.sign(a).sum(),
             torch.isnan(f).sum().to(f.dtype), torch.isinf(f).sum().to(f.dtype)]
    return n, torch.stack(parts).to(torch.float64)


@_quiet
def _complete(n: int, rest: np.ndarray, t: torch.Tensor) -> np.ndarray:
    raw = np.empty(N_RAW)
    raw[RAW_N] = n
    raw[1:] = rest
    if n and not np.isfinite(raw[RAW_SUM] + raw[RAW_SQ] + raw[RAW_MIN] + raw[RAW_MAX]):
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


def raw_now(t: torch.Tensor, full: bool = True) -> np.ndarray:
    """Raw row of one tensor, computed now (activations: the script may
    modify them in place later)."""
    t = local(t)
    if t.device.type == "cpu":
        if t.numel() <= HOST_MAX_ELEMENTS:
            return host_raw_one(_host_array(t), full)
        return cpu_raw_large(t, full)
    n, row = device_raw(t)
    return _complete(n, row.cpu().numpy(), t)


def raw_many(tensors: Sequence, full: bool = True, bulk: bool = False) -> list[np.ndarray]:
    """Raw rows of many tensors (or host arrays): small CPU ones in one numpy
    batch, large CPU ones one by one, accelerator ones with one host transfer
    at the end.  With ``bulk`` and not ``full`` (parameters, gradients and
    updates: norms are what every step records of them, on any device), the
    large and accelerator ones all together, norms only (``norm_rows_bulk``)."""
    out: list = [None] * len(tensors)
    host_idx, host_arrays, dev, bulk_idx = [], [], [], []
    tensors = [t if isinstance(t, np.ndarray) else local(t) for t in tensors]
    for i, t in enumerate(tensors):
        if isinstance(t, np.ndarray):
            host_idx.append(i)
            host_arrays.append(t)
        elif t.device.type == "cpu" and t.numel() <= HOST_MAX_ELEMENTS:
            host_idx.append(i)
            host_arrays.append(_host_array(t))
        elif bulk and not full:
            bulk_idx.append(i)
        elif t.device.type != "cpu":
            dev.append(i)
        else:
            out[i] = cpu_raw_large(t, full)
    if bulk_idx:          # (norms only: every large or accelerator tensor in a few fused calls)
        for i, row in zip(bulk_idx, norm_rows_bulk([tensors[i] for i in bulk_idx])):
            out[i] = row
    if host_arrays:
        rows = host_raw_batch(host_arrays, full)
        for j, i in enumerate(host_idx):
            out[i] = rows[j]
    if dev:
        pending = [(*device_raw(tensors[i]), tensors[i]) for i in dev]
        for i, row in zip(dev, resolve_device_rows(pending)):
            out[i] = row
    return out


def finalize_column(raws: np.ndarray, stat: str) -> np.ndarray:
    """One statistic of many raw rows: what a per-step check needs, at the cost
    of one or two numpy operations instead of ``finalize_many``'s twenty."""
    r = np.asarray(raws, dtype=np.float64).reshape(-1, N_RAW)
    if stat == "count":
        return r[:, RAW_N].copy()
    if stat == "nan_count":
        return r[:, RAW_NAN].copy()
    if stat == "inf_count":
        return r[:, RAW_INF].copy()
    if stat in _COLUMN_FROM_RAW:
        out = _column(r, stat)
        none_finite = (r[:, RAW_N] > r[:, RAW_NAN] + r[:, RAW_INF]) == 0
        if stat != "zero_frac" and none_finite.any():       # (rare: finalize_many's own rules)
            out[none_finite] = finalize_many(r[none_finite])[:, STAT_NAMES.index(stat)]
        return out
    return finalize_many(r)[:, STAT_NAMES.index(stat)]


_COLUMN_FROM_RAW = ("norm", "mean", "mean_abs", "min", "max", "zero_frac")


def _column(r: np.ndarray, stat: str) -> np.ndarray:
    """(No numpy error state needed: divisions only where they are defined,
    and comparisons and square roots of NaN raise nothing.)"""
    finite = r[:, RAW_N] - r[:, RAW_NAN] - r[:, RAW_INF]
    if stat == "norm":
        sq = r[:, RAW_SQ]
        return np.where((finite > 0) & (sq >= 0), np.sqrt(np.fmax(sq, 0.0)), np.nan)
    if stat in ("min", "max"):
        return np.where(finite > 0, r[:, RAW_MIN if stat == "min" else RAW_MAX], np.nan)
    if stat == "zero_frac":
        num, den = r[:, RAW_ZERO], r[:, RAW_N]
    else:
        num, den = r[:, RAW_SUM if stat == "mean" else RAW_ABS], finite
    return np.divide(num, den, out=np.full(len(r), np.nan), where=den > 0)


def stats_of(t: torch.Tensor) -> dict:
    """The ten statistics of one tensor as a dict (for display and tests)."""
    return dict(zip(STAT_NAMES, (float(x) for x in finalize(raw_now(t)))))


@_quiet
def finalize_many(raws: Sequence[np.ndarray]) -> np.ndarray:
    """``finalize`` for many rows at once (one numpy expression per statistic)."""
    if len(raws) == 0:
        return np.zeros((0, N_STATS))
    r = np.asarray(raws, dtype=np.float64).reshape(-1, N_RAW)
    n, s, sq, mn, mx, sa, nz, nnan, ninf = r.T
    finite = n - nnan - ninf
    out = np.full((r.shape[0], N_STATS), np.nan)
    out[:, 0] = n
    out[:, 7] = nnan
    out[:, 8] = ninf
    out[:, 9] = np.where(n > 0, nz / n, np.nan)
    has = finite > 0
    mean = np.where(has, s / finite, np.nan)
    var = np.where(finite > 1, (sq - s * mean) / (finite - 1), 0.0)
    out[:, 1] = mean
    out[:, 2] = np.where(has, np.sqrt(np.maximum(var, 0.0)), np.nan)
    some = n - nnan > 0                 # elements that are not NaN: their extremes
    out[:, 3] = np.where(some, mn, np.nan)
    out[:, 4] = np.where(some, mx, np.nan)
    out[:, 5] = np.where(has, np.sqrt(np.where(sq >= 0, sq, np.nan)), np.nan)
    out[:, 6] = np.where(has, sa / finite, np.nan)
    only_inf = ~has & some & (nnan == 0)        # every element infinite: the tensor as it is
    if only_inf.any():
        out[only_inf, 1] = np.where(mn == np.inf, np.inf, np.where(mx == -np.inf, -np.inf, np.nan))[only_inf]
        out[only_inf, 5] = np.inf
        out[only_inf, 6] = np.inf
    return out
