"""The recorder: plain objects that turn hook events into one StepRecord per step.

The hooks (``tracer.hooks``) stay thin and forward here.  What is recorded:

* ``act``: the first floating-point tensor of a module's forward output, for
  forward passes run with autograd enabled (a validation pass under
  ``torch.no_grad()`` is not part of a training step).  A module used twice in
  one forward pass of its model (one ReLU after two layers) gets a series per
  use: ``act``, ``act#2``.  Calls of the model repeated within a step (gradient
  accumulation, a GAN's discriminator on real and fake data) merge into one
  row per step.
* ``loss``: the tensor ``backward()`` was called on, merged over the backward
  passes of the step (``count`` = number of backward passes).  With several
  optimizers the loss is attributed to the optimizer that steps after it and
  named ``loss/<optimizer>``.
* ``param``, ``grad``, ``update``: for each parameter an optimizer holds, at
  the return of that optimizer's ``step()``: its value, its ``.grad`` and the
  change the step made.  Parameters of the model that no optimizer holds get
  ``param`` and ``grad`` at the end of the step.  Without any optimizer
  (hand-written updates), ``param`` and ``update`` of step N are taken at the
  end of step N+1 (or of the run), so that they include the hand-written update
  that follows step N's backward pass.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch

from . import stats as S

KINDS = ("param", "grad", "update", "act", "loss")


@dataclass
class StepRecord:
    step: int
    time: float                  # seconds since the run started, at the step's end
    backward_count: int
    optimizer_steps: int
    names: list                  # [(name, kind)]
    stats: np.ndarray            # (len(names), N_STATS), STAT_NAMES columns
    partial: bool = False        # cut short by the end of the run (the script raised or exited mid-step)

    def as_dict(self) -> dict:
        return {(n, k): dict(zip(S.STAT_NAMES, map(float, row)))
                for (n, k), row in zip(self.names, self.stats)}


@dataclass
class _Bucket:
    acts: dict = field(default_factory=dict)        # (module, use index) -> raw
    losses: dict = field(default_factory=dict)      # optimizer|None -> raw
    pending_loss: Optional[np.ndarray] = None
    params: dict = field(default_factory=dict)      # id(p) -> (p, kind -> raw)
    param_opt: dict = field(default_factory=dict)   # id(p) -> optimizer
    backward_count: int = 0
    optimizer_steps: int = 0
    # Small CPU tensors are copied when seen and reduced together in one numpy
    # batch when the step closes: (slot, key, array), slot in act|loss|param.
    deferred: list = field(default_factory=list)
    # Parameters of a small model arrive as whole blocks: (keys, flat, sizes).
    blocks: list = field(default_factory=list)

    def merge(self, other: "_Bucket") -> None:
        self.deferred.extend(other.deferred)
        self.blocks.extend(other.blocks)
        for m, raw in other.acts.items():
            self.acts[m] = S.merge_raw(self.acts[m], raw) if m in self.acts else raw
        for o, raw in other.losses.items():
            self.losses[o] = S.merge_raw(self.losses[o], raw) if o in self.losses else raw
        if other.pending_loss is not None:
            self.pending_loss = other.pending_loss if self.pending_loss is None else \
                S.merge_raw(self.pending_loss, other.pending_loss)
        for pid, (p, rows) in other.params.items():
            self.params.setdefault(pid, (p, {}))[1].update(rows)
        self.param_opt.update(other.param_opt)
        self.backward_count += other.backward_count
        self.optimizer_steps += other.optimizer_steps

    def empty(self) -> bool:
        return not (self.acts or self.losses or self.params or self.pending_loss is not None
                    or self.backward_count or self.optimizer_steps or self.deferred or self.blocks)

    def resolve(self, full: bool = True) -> None:
        """Reduce the deferred arrays (one batch) into the raw rows."""
        if not (self.deferred or self.blocks):
            return
        slots = [(slot, key) for slot, key, _ in self.deferred]
        flats = [a for _, _, a in self.deferred]
        sizes = [a.size for a in flats]
        for keys, flat, block_sizes in self.blocks:
            slots.extend(keys)
            flats.append(flat)
            sizes.extend(block_sizes)
        rows = S.host_raw_segments(np.concatenate(flats, dtype=np.float64), np.asarray(sizes), full)
        for (slot, key), raw in zip(slots, rows):
            if slot == "act":
                d = self.acts
            elif slot == "loss":
                if key is _PENDING:
                    self.pending_loss = raw if self.pending_loss is None else \
                        S.merge_raw(self.pending_loss, raw)
                    continue
                d = self.losses
            else:
                p, kind = key
                self.params.setdefault(id(p), (p, {}))[1][kind] = raw
                continue
            d[key] = S.merge_raw(d[key], raw) if key in d else raw
        self.deferred = []
        self.blocks = []


_PENDING = object()   # a loss not yet attributed to an optimizer


def first_float_tensor(out, depth: int = 0):
    if isinstance(out, torch.Tensor):
        return out if out.is_floating_point() else None
    if depth > 3:
        return None
    if isinstance(out, (tuple, list)):
        for o in out:
            t = first_float_tensor(o, depth + 1)
            if t is not None:
                return t
    elif isinstance(out, dict):
        for o in out.values():
            t = first_float_tensor(o, depth + 1)
            if t is not None:
                return t
    return None


class _Snapshot:
    """Parameter values before an optimizer step, to compute its update.
    Small CPU parameters are kept as one flat copy."""

    def __init__(self, params):
        self.params = params
        self.host = [p for p in params if S.is_host_tensor(p)]
        self.host_sizes = [p.numel() for p in self.host]
        self.host_flat = np.concatenate([S._host_array(p) for p in self.host]) if self.host else None
        self.dev = {id(p): p.detach().clone() for p in params if not S.is_host_tensor(p)}

    def host_blocks(self) -> list:
        """(keys, flat, sizes) blocks of value, update and grad for the small
        parameters, as they are now."""
        if not self.host:
            return []
        after = np.concatenate([S._host_array(p) for p in self.host])
        blocks = [([("param", (p, "param")) for p in self.host], after, self.host_sizes),
                  ([("param", (p, "update")) for p in self.host], after - self.host_flat, self.host_sizes)]
        with_grad = [p for p in self.host if p.grad is not None and not p.grad.is_sparse]
        if with_grad:
            blocks.append(([("param", (p, "grad")) for p in with_grad],
                           np.concatenate([S._host_array(p.grad) for p in with_grad]),
                           [p.numel() for p in with_grad]))
        return blocks

    def device_items(self) -> list:
        """[(param, kind, tensor)] for the large or accelerator parameters."""
        out = []
        for p in self.params:
            before = self.dev.get(id(p))
            if before is None:
                continue
            out.append((p, "param", p.detach()))
            out.append((p, "update", p.detach() - before))
            if p.grad is not None and not p.grad.is_sparse:
                out.append((p, "grad", p.grad.detach()))
        return out

    def updates(self) -> dict:
        """id(p) -> update (host array or tensor), for hand-written updates."""
        out = {}
        if self.host:
            diff = np.concatenate([S._host_array(p) for p in self.host]) - self.host_flat
            off = 0
            for p, n in zip(self.host, self.host_sizes):
                out[id(p)] = diff[off:off + n]
                off += n
        for p in self.params:
            if id(p) in self.dev:
                out[id(p)] = p.detach() - self.dev[id(p)]
        return out


class StepRecorder:
    """Accumulates one step's statistics and emits a StepRecord when it closes.

    ``sink(record)`` receives every closed, recorded step.  ``schedule(step)``
    says whether a step is recorded at all.
    """

    def __init__(self, naming, sink: Callable[[StepRecord], None],
                 schedule: Callable[[int], bool] = lambda step: True,
                 clock_start: Optional[float] = None):
        self.naming = naming
        self.sink = sink
        self.schedule = schedule
        self.t0 = clock_start if clock_start is not None else time.time()
        self.step = 0
        self.recording = schedule(0)
        self._full_policy = getattr(schedule, "full", lambda step: True)
        self.full = self._full_policy(0)
        self._buckets = [_Bucket()]
        self._snapshots: dict = {}          # id(optimizer) -> _Snapshot
        # A Sequential's output is its last child's output: reuse that row.
        self._last_act: tuple = (None, None)   # ((id, version), raw)
        self.manual = False
        self._manual_pending: Optional[tuple] = None   # (step, bucket, time, snapshot)
        self.last: Optional[StepRecord] = None
        self._names: dict = {}              # series key -> name, resolved once
        self._others: tuple = (None, [])     # (cache key, params no optimizer holds)

    @property
    def _cur(self) -> _Bucket:
        return self._buckets[-1]

    # -- events ---------------------------------------------------------------
    def activation(self, key, output) -> None:
        """``key``: (module, index of this use of the module in the forward pass)."""
        if not self.recording or not torch.is_grad_enabled():
            return
        t = first_float_tensor(output)
        if t is None:
            return
        b = self._cur
        same = (id(t), t._version)
        if self._last_act[0] == same:
            arr, raw = self._last_act[1]
        elif S.is_host_tensor(t):
            arr, raw = S._host_array(t).copy(), None    # copied: the script may change t in place
        else:
            arr, raw = None, S.raw_now(t, self.full)
        self._last_act = (same, (arr, raw))
        if arr is not None:
            b.deferred.append(("act", key, arr))
        else:
            b.acts[key] = S.merge_raw(b.acts[key], raw) if key in b.acts else raw

    def loss(self, tensor: torch.Tensor) -> None:
        self._cur.backward_count += 1
        if not self.recording or not S.is_recordable(tensor):
            return
        b = self._cur
        if S.is_host_tensor(tensor):
            b.deferred.append(("loss", _PENDING, S._host_array(tensor).copy()))
            return
        raw = S.raw_now(tensor, self.full)
        b.pending_loss = raw if b.pending_loss is None else S.merge_raw(b.pending_loss, raw)

    def optimizer_pre(self, opt) -> None:
        if not self.recording:
            return
        params = [p for g in opt.param_groups for p in g["params"]]
        self._snapshots[id(opt)] = _Snapshot(params)

    def optimizer_post(self, opt) -> None:
        b = self._cur
        b.optimizer_steps += 1
        for i, (slot, key, arr) in enumerate(b.deferred):
            if slot == "loss" and key is _PENDING:
                b.deferred[i] = ("loss", opt, arr)
        if b.pending_loss is not None:
            b.losses[opt] = S.merge_raw(b.losses[opt], b.pending_loss) if opt in b.losses else b.pending_loss
            b.pending_loss = None
        snap = self._snapshots.pop(id(opt), None)
        if not self.recording or snap is None:
            return
        b.blocks.extend(snap.host_blocks())
        items = snap.device_items()
        for (p, kind, _), raw in zip(items, S.raw_many([x for _, _, x in items], self.full)):
            b.params.setdefault(id(p), (p, {}))[1][kind] = raw
        for p in snap.params:
            b.param_opt[id(p)] = opt

    def mark(self) -> None:
        """Start a new segment (used while the step clock learns a GAN's iteration)."""
        self._buckets.append(_Bucket())

    # -- closing -------------------------------------------------------------
    def close(self, step: int, retro: Optional[int] = None, final: bool = False) -> None:
        """Close ``step``.  With ``retro``, only the first ``retro`` segments
        belong to it; the rest start the next step."""
        if retro is not None:
            closed, rest = self._buckets[:retro], self._buckets[retro:]
        else:
            closed, rest = self._buckets, []
        bucket = _Bucket()
        for b in closed:
            bucket.merge(b)
        bucket.resolve(self.full)
        nxt = _Bucket()
        for b in rest:
            nxt.merge(b)
        self._buckets = [nxt]
        now = time.time() - self.t0
        recording = self.recording
        self.step = step + 1
        self.recording = self.schedule(self.step)
        self.full = self._full_policy(self.step)
        if step == 0:
            self.naming.freeze()
        if self.manual:
            self._close_manual(step, bucket, now, recording, final)
            return
        if recording:
            self._other_params(bucket)
            self._emit(step, bucket, now, partial=final)

    def has_open_work(self) -> bool:
        """Did anything happen since the last step closed?"""
        return not all(b.empty() for b in self._buckets)

    def finish(self) -> None:
        """The run ended: emit what is still pending."""
        if self._manual_pending is not None:
            self._close_manual(None, None, time.time() - self.t0, False, True)

    def _other_params(self, bucket: _Bucket) -> None:
        """param and grad of the model's parameters that no optimizer stepped."""
        key = (self.naming.roots_version, frozenset(bucket.params))
        if self._others[0] != key:
            self._others = (key, [p for p in self.naming.root_params() if id(p) not in bucket.params])
        others = self._others[1]
        if not others:
            return
        items, where = [], []
        for p in others:
            items.append(p.detach())
            where.append((p, "param"))
            g = p.grad
            if g is not None and not g.is_sparse:
                items.append(g.detach())
                where.append((p, "grad"))
        for (p, kind), raw in zip(where, S.raw_many(items, self.full)):
            bucket.params.setdefault(id(p), (p, {}))[1][kind] = raw

    def _close_manual(self, step, bucket, now, recording, final) -> None:
        pend = self._manual_pending
        self._manual_pending = None
        if pend is not None:
            pstep, pbucket, ptime, snap = pend
            updates = snap.updates()
            items, where = [], []
            for p in snap.params:
                items.append(p.detach())
                where.append((p, "param"))
                items.append(updates[id(p)])
                where.append((p, "update"))
            for (p, kind), raw in zip(where, S.raw_many(items, self.full)):
                pbucket.params.setdefault(id(p), (p, {}))[1][kind] = raw
            self._emit(pstep, pbucket, ptime)
        if bucket is None or not recording:
            return
        params = self.naming.root_params()
        items, where = [], []
        for p in params:
            g = p.grad
            if g is not None and not g.is_sparse:
                items.append(g.detach())
                where.append((p, "grad"))
        for (p, kind), raw in zip(where, S.raw_many(items, self.full)):
            bucket.params.setdefault(id(p), (p, {}))[1][kind] = raw
        if final:
            self._emit(step, bucket, now, partial=True)
        else:
            self._manual_pending = (step, bucket, now, _Snapshot(params))

    def _name(self, key) -> str:
        name = self._names.get(key)
        if name is None:
            if key[0] == "act":
                base = self.naming.module_name(key[1])
                name = f"{base}#{key[2] + 1}" if key[2] else base
            elif key[0] == "loss":
                name = "loss/" + self.naming.optimizer_name(key[1]) if key[2] and key[1] is not None else "loss"
            else:
                name = self.naming.param_name(key[1])
            self._names[key] = name
        return name

    def _emit(self, step: int, b: _Bucket, now: float, partial: bool = False) -> None:
        b.resolve()
        names, raws = [], []
        for (m, use), raw in b.acts.items():
            names.append((self._name(("act", m, use)), "act"))
            raws.append(raw)
        losses = dict(b.losses)
        if b.pending_loss is not None:
            losses[None] = S.merge_raw(losses[None], b.pending_loss) if None in losses else b.pending_loss
        if len(losses) > 1:
            self.naming.loss_qualified = True
        qualify = self.naming.loss_qualified
        for opt, raw in losses.items():
            names.append((self._name(("loss", opt, qualify)), "loss"))
            raws.append(raw)
        for pid, (p, rows) in b.params.items():
            pname = self._name(("param", p))
            for kind in ("param", "grad", "update"):
                if kind in rows:
                    names.append((pname, kind))
                    raws.append(rows[kind])
        rec = StepRecord(step, now, b.backward_count, b.optimizer_steps, names, S.finalize_many(raws), partial)
        self.last = rec
        self.sink(rec)
