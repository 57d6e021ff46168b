"""Reading an optimizer's parameters cheaply, step after step (the recorder's
``param``, ``grad`` and ``update`` series).

``ParamPlan``: the parameters of one optimizer, split into small CPU ones,
copied into one float32 buffer (values and updates through cached zero-copy
numpy views, one concatenation each; gradients by one
``torch._foreach_copy_`` into views of the buffer; then one ``reduceat`` a
step), and the others (large ones, accelerator ones), measured on their own
devices all together: between full steps their norms (``stats.norm_rows_bulk``:
on an accelerator one ``torch._foreach_norm`` per (device, dtype) and one host
transfer per device, on the CPU rows of squares per tensor), their values before
the step copied by one ``torch._foreach_copy_`` into buffers kept from step to step.
``Snapshot``: the values before an update, from which the update is
computed.

Cost: these run once a step between PyTorch's kernels, with the caches
cold, where each library call costs a few microseconds more than the same
call in a loop; so a step makes as few calls as it can (one copy of six
gradients, not six ``.numpy()`` and a concatenation).
"""
from __future__ import annotations

import math
import operator
from typing import Optional

import numpy as np
import torch

from . import histogram as H
from . import stats as S
from .quiet import _ERRSTATE, _IGNORE, Quiet

# torch.no_grad() without the context manager's Python layers (a step's hooks
# run with the caches cold, where each layer costs microseconds)
_set_grad_enabled = torch._C._set_grad_enabled
_GRAD = operator.attrgetter("grad")
_DATA_PTR = torch.Tensor.data_ptr
_new = object.__new__


class ParamPlan:
    """How to read one set of parameters cheaply, step after step: small CPU
    parameters into one buffer; the others one by one."""

    def __init__(self, params):
        self.params = params
        # (a DTensor, FSDP's, is read through its local shard: S.local)
        small = [p.device.type == "cpu" and S.local(p).numel() <= S.HOST_MAX_PARAM_ELEMENTS for p in params]
        self.host = [p for p, sm in zip(params, small) if sm]
        self.large = [p for p, sm in zip(params, small) if not sm]
        self.sizes = [S.local(p).numel() for p in self.host]
        self.ids = {id(p) for p in params}
        self._sharded = any(S.local(p) is not p for p in self.host)    # (FSDP's DTensors: read their shards)
        self.value_keys = [("param", p, "param") for p in self.host]
        self.update_keys = [("param", p, "update") for p in self.host]
        self.grad_keys = [("param", p, "grad") for p in self.host]
        self._names: dict = {}           # with grads -> [(name, kind)] of the block's rows
        self._names_version = 0          # the naming's roots_version they were resolved at
        self.block_sizes = self.sizes * 3
        # The usual case, copied into one float32 buffer (``block``): float32
        # parameters, none empty.
        self.n = sum(self.sizes)
        self._fast = bool(self.host) and all(p.dtype == torch.float32 and n for p, n in zip(self.host, self.sizes))
        self._norm_layouts: dict = {}    # with grads -> (starts, rows) (stats.norm_template)
        self._buf: Optional[np.ndarray] = None     # values | updates | gradients
        # The values before an update (``snapshot``), apart: between full steps ``block``
        # squares the buffer in place (no scratch as large as it: 16% fewer last-level cache
        # misses a recorded MLP step), and an update's values stay to be read again (its
        # norm's exact path: ``_segment``), as the live parameters and gradients do.
        self._before: Optional[np.ndarray] = None
        # torch views of the parts, shaped like the parameters (filled by one
        # ``torch._foreach_copy_`` each time)
        self._value_dst: list = []
        self._before_dst: list = []
        self._grad_dst: list = []
        self._views = [None] * len(self.host)
        self._ptrs = [None] * len(self.host)
        # The large parameters' values before a step: buffers made once and filled by one
        # ``torch._foreach_copy_`` a step (a clone of each allocated every step, before),
        # lent to one Snapshot at a time.
        self._large_spare: Optional[list] = None

    def names(self, name_of, with_grads: bool, version: int = 0) -> list:
        """[(name, kind)] of a block's rows: values, updates (and gradients), resolved again
        where the names may resolve to others (``version``: the naming's roots_version; a model
        first called after its optimizer's first step, its parameters named by the optimizer
        until then, is named by its module paths from the step it is seen on, as the
        recorder's other names and the rules' are)."""
        if version != self._names_version:
            self._names.clear()
            self._names_version = version
        out = self._names.get(with_grads)
        if out is None:
            base = [name_of(("param", p)) for p in self.host]
            kinds = ("param", "update", "grad") if with_grads else ("param", "update")
            out = self._names[with_grads] = [(n, k) for k in kinds for n in base]
        return out

    def host_values(self) -> Optional[np.ndarray]:
        """The small parameters' values, concatenated (a copy)."""
        if not self.host:
            return None
        return np.concatenate([S._host_array(p) for p in self.host])

    def _buffer(self) -> np.ndarray:
        """The block's float32 buffer (values | updates | gradients), and torch
        views of its parts shaped like the parameters, made once."""
        if self._buf is None:
            self._buf = np.empty(3 * self.n, dtype=np.float32)
            self._before = np.empty(self.n, dtype=np.float32)
            flat, before = torch.from_numpy(self._buf), torch.from_numpy(self._before)
            for dst, t, at in ((self._value_dst, flat, 0), (self._before_dst, before, 0),
                               (self._grad_dst, flat, 2 * self.n)):
                for p, k in zip(self.host, self.sizes):
                    dst.append(t[at:at + k].view(S.local(p).shape))
                    at += k
        return self._buf

    def _host_views(self) -> list:
        """Flat numpy views of the small parameters (cached while their memory
        stays): the values' concatenation costs less than a torch copy."""
        views, sharded = self._views, self._sharded
        for i, p in enumerate(self.host):
            if sharded:
                p = S.local(p)
            ptr = p.data_ptr()
            if ptr != self._ptrs[i]:
                v = S._host_array(p)
                # Only a true view of the parameter's memory may be cached.
                cacheable = p.dtype in (torch.float32, torch.float64) and p.is_contiguous()
                views[i], self._ptrs[i] = v, (ptr if cacheable else None)
        return views

    def large_values_before(self) -> list:
        """Copies of the large parameters' values (their local shards), made by one fused
        copy into buffers kept from the last step when they still fit."""
        values = [S.local(p).detach() for p in self.large]
        if not values:
            return []
        spare, self._large_spare = self._large_spare, None
        if spare is not None and all(b.shape == v.shape and b.dtype == v.dtype and b.device == v.device
                                     for b, v in zip(spare, values)):
            grad_mode = torch.is_grad_enabled()
            try:
                if grad_mode:
                    _set_grad_enabled(False)
                torch._foreach_copy_(spare, values)
                return spare
            except (RuntimeError, TypeError):
                pass
            finally:
                if grad_mode:
                    _set_grad_enabled(True)
        return [v.clone() for v in values]

    def values_before(self) -> Optional[np.ndarray]:
        """The small parameters' values before an update (``snapshot().host_before``)."""
        return self.snapshot().host_before

    def snapshot(self) -> "Snapshot":
        """The values before an update, to compute it from: the small parameters' (for a
        plan ``block`` reads, into an array kept for them: no new array each step), and
        copies of the large ones (``large_values_before``).  Made without a constructor of
        its own (one Python frame fewer, every optimizer step)."""
        snap = _new(Snapshot)
        snap.plan = self
        if self._fast:
            if self._buf is None:
                self._buffer()
            if self._sharded:
                snap.host_before = np.concatenate(self._host_views(), out=self._before)
            else:
                # (one fused copy, as the gradients' in ``block``: a numpy concatenation of
                # cached views, checked against the parameters' memory, cost more a step;
                # grad mode off: a parameter's copy is not the step's graph)
                grad_mode = torch.is_grad_enabled()
                try:
                    if grad_mode:
                        _set_grad_enabled(False)
                    torch._foreach_copy_(self._before_dst, self.host)
                    snap.host_before = self._before
                except (RuntimeError, TypeError):
                    snap.host_before = self.host_values()     # (a parameter reshaped since: the general path)
                finally:
                    if grad_mode:
                        _set_grad_enabled(True)
        else:
            snap.host_before = self.host_values()
        snap.large_before = self.large_values_before() if self.large else []
        return snap

    def block(self, before: np.ndarray, full: bool, grads: bool) -> Optional[tuple]:
        """(with grads, rows, histograms at a full step or None) of the block: values, updates since ``before``
        (``values_before``) and, with ``grads``, gradients, in one float32
        buffer; None when it does not apply (not all float32, or a gradient
        missing, sparse or not a plain CPU tensor): the caller takes the
        general path, and ``before`` is still intact."""
        buf = self._buf
        if buf is None or before is not self._before:
            return None
        n = self.n
        # torch's calls first, then numpy's (going back and forth between the two libraries
        # costs more than the calls themselves).  The values and the gradients into the buffer
        # in one call (six ``.numpy()`` and a concatenation cost twice as much with the caches
        # cold); not when they do not fit it (a gradient missing, sparse, of another shape:
        # the general path, ``before`` intact).
        sharded = self._sharded
        if sharded:
            dst, src = (self._grad_dst, [S.local(p.grad) for p in self.host]) if grads else ([], [])
        elif grads:
            dst, src = self._value_dst + self._grad_dst, self.host + list(map(_GRAD, self.host))
        else:
            dst, src = self._value_dst, self.host
        if dst:
            grad_mode = torch.is_grad_enabled()
            try:
                if grad_mode:      # (a gradient that needs grad, under create_graph: our copy is not the step's graph)
                    _set_grad_enabled(False)
                torch._foreach_copy_(dst, src)
            except (RuntimeError, TypeError):
                return None
            finally:
                if grad_mode:
                    _set_grad_enabled(True)
        flat = buf if grads else buf[:2 * n]
        # (inf - inf in an update: no warning in the user's stderr; Quiet's context variable set
        # here without the context manager's two calls, every step)
        quiet = _ERRSTATE.set(_IGNORE) if _ERRSTATE is not None else None
        try:
            if quiet is None:
                q = Quiet()
                q.__enter__()
            if sharded:
                np.concatenate(self._host_views(), out=buf[:n])
            np.subtract(buf[:n], before, out=buf[n:2 * n])
            if full:
                sizes = self.block_sizes[:(3 if grads else 2) * len(self.host)]
                return (grads, *H.full_segments(flat, sizes))
            lay = self._norm_layouts.get(grads)
            if lay is None:
                lay = self._norm_layouts[grads] = S.norm_template(self.sizes * (3 if grads else 2))
            # (squared in place: the buffer's values are not read again this step)
            return grads, S.host_norm_rows(flat, *lay, flat, self._segment), None
        finally:
            if quiet is not None:
                _ERRSTATE.reset(quiet)
            else:
                q.__exit__(None, None, None)

    def _segment(self, i: int) -> np.ndarray:
        """Segment ``i`` of ``block``'s rows (values, updates, gradients), read again for its
        norm's exact path (a sum of squares not finite, or nearly zero) after the buffer was
        squared in place: a parameter and its gradient where they lie, an update made again
        from the values before (the same float32 difference)."""
        k = len(self.host)
        kind, j = divmod(i, k)
        p = self.host[j]
        if kind == 2:
            return S._host_array(p.grad)
        at = sum(self.sizes[:j])
        value = S._host_array(p)
        if kind == 0:
            return value
        with Quiet():
            return value - self._before[at:at + self.sizes[j]]

    def _block_large(self, before: np.ndarray, grads: bool) -> Optional[tuple]:
        """``block`` between full steps for a large plan (a GPT's 830 K elements): each
        tensor read where it lies, once, by a BLAS dot per segment (its update made in
        place of its values before, then dotted while in cache), where copying the values
        and the gradients into the buffer and summing the whole buffer's squares moved
        five times the block's bytes through memory, 1.46 ms of a 28 ms step."""
        host = self.host
        if self._buf is None or before is not self._before or self._sharded:
            return None
        gs = None
        if grads:
            gs = []
            for p in host:
                g = p.grad
                if g is None or g.is_sparse or g.dtype != torch.float32 or g.device.type != "cpu" \
                        or g.shape != p.shape or not g.is_contiguous():
                    return None          # (the general path; ``before`` untouched so far)
                gs.append(g.detach().numpy().reshape(-1))
        views = self._views if list(map(_DATA_PTR, host)) == self._ptrs else self._host_views()
        lay = self._norm_layouts.get(grads)
        if lay is None:
            lay = self._norm_layouts[grads] = S.norm_template(self.sizes * (3 if grads else 2))
        k, dot, sub = len(host), np.dot, np.subtract
        updates = []
        sq = [0.0] * (3 * k if grads else 2 * k)
        at = 0
        # (inf - inf in an update, squares that overflow: no warning; Quiet's context variable
        # set without the context manager's two calls, as in ``block``)
        quiet = _ERRSTATE.set(_IGNORE) if _ERRSTATE is not None else None
        try:
            if quiet is None:
                q = Quiet()
                q.__enter__()
            for i, (v, m) in enumerate(zip(views, self.sizes)):
                u = before[at:at + m]
                sub(v, u, out=u)
                updates.append(u)
                sq[i], sq[k + i] = float(dot(v, v)), float(dot(u, u))
                if gs is not None:
                    sq[2 * k + i] = float(dot(gs[i], gs[i]))
                at += m
            if sum(sq) < math.inf and min(sq) >= S.F32_SQ_TINY:     # (as host_norm_rows tests it)
                rows = lay[1].copy()
                rows[:, S.RAW_SQ] = sq
            else:
                rows = S.rows_of_squares(sq, lay[1], (views + updates + (gs or [])).__getitem__)
            return grads, rows, None
        finally:
            if quiet is not None:
                _ERRSTATE.reset(quiet)
            else:
                q.__exit__(None, None, None)

    def host_grads(self):
        """(keys, flat, sizes) for the small parameters' gradients, or None (a sparse one as the
        dense tensor it stands for).  None too for a plan of no small parameter (a hand-written
        step that closes with no gradient made: the run ended in a forward after zero_grad())."""
        grads = [S.dense(p.grad) for p in self.host]
        if grads and all(g is not None for g in grads):
            return self.grad_keys, np.concatenate([S._host_array(g) for g in grads]), self.sizes
        sel = [i for i, g in enumerate(grads) if g is not None]
        if not sel:
            return None
        return ([self.grad_keys[i] for i in sel], np.concatenate([S._host_array(grads[i]) for i in sel]),
                [self.sizes[i] for i in sel])


class Snapshot:
    """Parameter values before an update, to compute the update (made by
    ``ParamPlan.snapshot``): ``plan``, ``host_before``, ``large_before``."""
    __slots__ = ("plan", "host_before", "large_before")

    def record(self, bucket, full: bool, grads: bool = True) -> None:
        """Put value, update (and grad) of every parameter into ``bucket`` (the
        recorder's ``_Bucket``)."""
        plan = self.plan
        if not plan.host:
            done = None
        elif not full and plan.n >= S.DOT_MIN_ELEMENTS:
            done = plan._block_large(self.host_before, grads)
        else:
            done = plan.block(self.host_before, full, grads)
        if done is not None:
            bucket.params[plan] = done[:2]
            if done[2] is not None:
                bucket.param_hists[plan] = done[2]
        elif plan.host:
            after, before = plan.host_values(), self.host_before
            if after.dtype == np.float16:            # (the difference exact: float16 rounds it)
                after, before = after.astype(np.float32), before.astype(np.float32)
            with Quiet():                            # (inf - inf: no warning in the user's stderr)
                update = after - before
            g = plan.host_grads() if grads else None
            every = g is not None and len(g[2]) == len(plan.host)
            if every or not grads:      # the usual case: one block (values, updates and every gradient)
                flats = [after, update] + ([g[1]] if every else [])
                sizes = plan.block_sizes[:len(flats) * len(plan.host)]
                flat = np.concatenate(flats)
                if full:
                    rows, bucket.param_hists[plan] = H.full_segments(flat, sizes)
                else:
                    rows = S.host_norm_segments(flat, sizes)
                bucket.params[plan] = (every, rows)
            else:
                bucket.blocks.append((plan.value_keys, after, plan.sizes))
                bucket.blocks.append((plan.update_keys, update, plan.sizes))
                if g is not None:
                    bucket.blocks.append(g)
        if plan.large:
            values = [S.local(p).detach() for p in plan.large]
            # The updates, in place of the values before: -before + value is value - before
            # bit for bit (two fused calls for all of them; the buffers go back to the plan).
            # Between full steps, whose rows of an update are its norm, one: before - value,
            # the update negated bit for bit, of the same norm (a pass less over the large
            # parameters, 5.6 of 37 ms a step that nndb added to a 6.3 M-parameter MLP).
            updates = self.large_before
            grad_mode = torch.is_grad_enabled()
            try:
                if grad_mode:
                    _set_grad_enabled(False)
                if full:
                    torch._foreach_neg_(updates)
                    torch._foreach_add_(updates, values)
                else:
                    torch._foreach_sub_(updates, values)
            finally:
                if grad_mode:
                    _set_grad_enabled(True)
            keys, items = [], []
            for p, value, update in zip(plan.large, values, updates):
                keys += [("param", p, "param"), ("param", p, "update")]
                items += [value, update]
                if grads and p.grad is not None:
                    keys.append(("param", p, "grad"))
                    items.append(S.dense(S.local(p.grad)).detach())
            if full:
                H.add_many(bucket, keys, items, full, bulk=True)
            else:
                for key, item, raw in zip(keys, items, S.raw_many(items, False, True)):
                    if key[2] == "update" and raw[S.RAW_NAN] + raw[S.RAW_INF]:
                        # (a non-finite one's row has its sums and extremes too: the update's)
                        raw = S.raw_many([item.neg_()], False, True)[0]
                    bucket.add(key, raw)
            self.large_before = []
            plan._large_spare = updates
        bucket.covered |= plan.ids
