"""What each rank records for comparing ranks (and one run's epochs): the
trace's ``fingerprints`` rows (docs/trace-format.md).

* every step: a checksum of the step's input batch (the first forward of a
  root module with autograd enabled: its tensor arguments), and the step's
  time split into data loading (from the previous step's end to that
  forward) and compute (from that forward to the step's end), and the
  forward time (from the step's second module call, inside the root's
  forward after DDP's buffer broadcast, to the step's first gradient: under
  DDP no collective runs in between, so a rank that computes slowly shows here,
  while its step time and compute are the others' too: they wait for it in
  the gradients' all-reduce);
* at the observed steps (``nndb.cadence.observed``): a checksum of every
  parameter the optimizers hold, taken at the step's end (after every
  optimizer step of the step), and a summary of each BatchNorm module's
  running statistics.

A checksum is exact and cheap: the 64-bit wrap-around sum of the tensor's
bytes read as 64-bit words, one reduction on the tensor's own device (no
cast), mixed with its shape and dtype.  Equal tensors have
equal checksums; two tensors that differ anywhere almost surely do not (a
sum can cancel: one word up by as much as another goes down), but for a
reordering of whole 64-bit words: a batch whose rows are a whole number of
words (8 float32 features) has the checksum of its rows in any order.  What
reads the input checksums allows for it (``epoch_repeats``: the same samples
in each batch, not the same order within it).  On an accelerator the sums stay on the device until the next
observed step (one transfer then); on the CPU they are read at once.

The recorder is a plain object fed by two thin hooks: a global forward
pre-hook (``arm``), in only from a step's end to the next step's first
forward (one call a step), and the step pipeline's ``on_step``.  No hook is
put on the script's modules (a model pickled whole must not carry one).  Nothing here changes a
tensor or consumes a random number; an error switches it off (said once).
"""
from __future__ import annotations

import gc
import sys
import time
from typing import Callable, Optional

import numpy as np
import torch
from torch.nn.modules import module as _module

from .. import cadence
from .compiled import COMPILING, never_compiled
from .discover import call_kwargs
from .funcmode import hide, show
from .stats import local
from .quiet import PROFILING, profiled, unprofiled

_MASK = (1 << 64) - 1


def sharded(t) -> bool:
    """Is ``t`` a DTensor split across ranks (FSDP), not a replica?"""
    return type(t).__name__ == "DTensor" and \
        any("Shard" in type(pl).__name__ for pl in getattr(t, "placements", ()))


def bit_sum(t: torch.Tensor) -> torch.Tensor:
    """The 64-bit wrap-around sum of ``t``'s bytes read as 64-bit words (the
    last one zero-padded), as a 0-d int64 tensor on its device."""
    t = local(t).detach()
    if t.layout is not torch.strided:
        parts = _sparse_parts(t)
        return torch.stack([bit_sum(p) for p in parts]).sum()
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype is torch.bool:
        t = t.to(torch.uint8)
    b = t.contiguous().reshape(-1).view(torch.uint8)
    if b.numel() % 8:
        b = torch.cat([b, b.new_zeros(8 - b.numel() % 8)])
    return b.view(torch.int64).sum()


def _sparse_parts(t: torch.Tensor) -> list:
    """The dense tensors that hold a sparse tensor's contents (indices, then values)."""
    if t.layout is torch.sparse_coo:
        t = t if t.is_coalesced() else t.coalesce()         # (the same contents, the same checksum)
        return [t.indices(), t.values()]
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return [t.crow_indices(), t.col_indices(), t.values()]
    return [t.ccol_indices(), t.row_indices(), t.values()]


_HOST_DTYPES = (torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.int16,
                torch.int8, torch.uint8)


def host_bit_sum(t: torch.Tensor) -> int:
    """``bit_sum`` of a CPU tensor as a Python int, through numpy where it
    can (this runs every step: one numpy sum over 64-bit words, no cast)."""
    if t.requires_grad:
        t = t.detach()
    if t.layout is torch.strided and t.dtype in _HOST_DTYPES:
        b = np.ascontiguousarray(t.numpy()).reshape(-1).view(np.uint8)
        if b.size % 8:
            b = np.concatenate([b, np.zeros(8 - b.size % 8, np.uint8)])
        return int(b.view(np.int64).sum())
    return int(bit_sum(t))


def ints(sums: list) -> list:
    """0-d int64 tensors as Python ints: one host transfer per device."""
    out: list = [None] * len(sums)
    by_device: dict = {}
    for i, s in enumerate(sums):
        by_device.setdefault(s.device, []).append(i)
    for idx in by_device.values():
        for i, v in zip(idx, torch.stack([sums[i] for i in idx]).tolist()):
            out[i] = v
    return out


def _desc(t: torch.Tensor) -> tuple:
    """What a checksum mixes in besides the bits: shape and dtype (kept, not the tensor)."""
    return (*t.shape, len(t.shape), t.element_size(), int(t.is_floating_point()))


def _mix(value: int, desc: tuple) -> int:
    """A bit sum with the tensor's shape and dtype (``_desc``), as one unsigned 64-bit number."""
    h = value & _MASK
    for n in desc:
        h = (h * 1099511628211 + n + 1) & _MASK
    return h


def checksum(t: torch.Tensor) -> int:
    """The exact checksum of one tensor (see the module's docstring)."""
    return _mix(int(bit_sum(t)), _desc(local(t)))


def batch_tensors(args, depth: int = 0) -> list:
    """The tensors of a forward's arguments, in order (tuples, lists and dicts, 3 deep)."""
    if isinstance(args, torch.Tensor):
        return [args]
    if depth > 3:
        return []
    if isinstance(args, (tuple, list)):
        return [t for a in args for t in batch_tensors(a, depth + 1)]
    if isinstance(args, dict):
        return [t for a in args.values() for t in batch_tensors(a, depth + 1)]
    return []


def combine(sums: list) -> int:
    """One checksum from the (checksum) of several tensors, order-sensitive."""
    h = 14695981039346656037
    for s in sums:
        h = ((h ^ (s & _MASK)) * 1099511628211) & _MASK
    return h


def _dataloaders() -> list:
    from torch.utils.data import DataLoader
    return [o for o in gc.get_referrers(DataLoader) if isinstance(o, DataLoader)]


def loaders(earlier=()) -> list:
    """The DataLoaders the process holds, but for those in ``earlier`` (alive
    before the run: an earlier run's, in a notebook or a test process):
    [{"sampler", "shuffle", "batches", "samples", "batch_size", "drop_last",
    "iterable", "workers"}] (``samples``: the sampler's length, an epoch's
    samples, None where unknown; ``iterable``: over an IterableDataset;
    ``workers``: num_workers).
    ``shuffle``: True for a RandomSampler or a shuffling DistributedSampler,
    False for a SequentialSampler or a DistributedSampler without shuffle,
    None for a sampler nndb does not know.  (One referrer scan: done once.)"""
    from torch.utils.data import IterableDataset
    out = []
    for o in _dataloaders():
        if o in earlier:
            continue
        sampler = getattr(o, "sampler", None)
        bs = getattr(o, "batch_sampler", None)
        if bs is not None and getattr(bs, "sampler", None) is not None:
            sampler = bs.sampler
        name = type(sampler).__name__
        shuffle = {"RandomSampler": True, "SequentialSampler": False}.get(name)
        if name == "DistributedSampler":
            shuffle = bool(getattr(sampler, "shuffle", False))
        try:
            n = len(o)
        except TypeError:
            n = None
        try:
            samples = len(sampler)
        except Exception:
            samples = None
        size = getattr(o, "batch_size", None)
        drop = getattr(o, "drop_last", None)
        if size is None and bs is not None:         # (a batch_sampler of the script's: its own, where it says)
            size, drop = getattr(bs, "batch_size", None), getattr(bs, "drop_last", None)
        workers = getattr(o, "num_workers", 0)
        out.append({"sampler": name, "shuffle": shuffle, "batches": n, "samples": samples,
                    "batch_size": size if isinstance(size, int) else None,
                    "drop_last": drop if isinstance(drop, bool) else None,
                    "iterable": isinstance(getattr(o, "dataset", None), IterableDataset),
                    "workers": workers if isinstance(workers, int) else 0})
    return out


def model_averaging(modules=None) -> bool:
    """Does the process hold one of torch's model averagers (Local SGD:
    ``PeriodicModelAverager``, ``HierarchicalModelAverager``, the one a
    ``PostLocalSGDOptimizer`` holds)?  Its replicas differ between averages by
    design.  Nothing to look for when their module was never imported (one
    referrer scan otherwise)."""
    mod = (modules if modules is not None else sys.modules).get(
        "torch.distributed.algorithms.model_averaging.averagers")
    base = getattr(mod, "ModelAverager", None)
    if base is None:
        return False
    classes, todo = [], [base]
    while todo:
        k = todo.pop()
        classes.append(k)
        todo.extend(k.__subclasses__())
    return any(isinstance(o, base) for o in gc.get_referrers(*classes))


def bn_summary(module) -> Optional[list]:
    """[channels, mean and norm of running_mean, mean and norm of running_var,
    checksum of both] of a BatchNorm module, or None without running statistics."""
    rm, rv = getattr(module, "running_mean", None), getattr(module, "running_var", None)
    if not isinstance(rm, torch.Tensor) or not isinstance(rv, torch.Tensor):
        return None
    rm, rv = local(rm).detach(), local(rv).detach()
    vals = torch.stack([rm.double().mean(), rm.double().norm(), rv.double().mean(), rv.double().norm()]).tolist()
    return [int(rm.numel())] + vals + [combine([checksum(rm), checksum(rv)])]


class Fingerprints:
    """The per-rank rows of one run (see the module's docstring).

    ``sink(row)`` gets each row: at each observed step ``{"step", "inputs":
    [[step, checksum], ...] (the steps since the last row), "params": {name:
    checksum} (replicated parameters; a sharded one's, FSDP's, in "shards"),
    "bn": {module: summary}, "data_time", "compute_time", "forward_time"
    (mean seconds per step since the last row, over ``"timed"`` steps)}``, at the
    first such row also ``"loaders"``; at the run's end a last row of the
    steps since (``"inputs"`` only).  ``listener(step, row)`` (optional)
    sees every step's input checksum (the rules of one process)."""

    def __init__(self, naming, optimizers: Callable[[], list], sink: Callable[[dict], None],
                 on_error: Optional[Callable[[str], None]] = None, ranks: int = 1, tracer=None):
        self.naming = naming
        self.ranks = ranks
        # The tracer, whose ``backward_began`` (the step's first backward) ends the forward's
        # time; without one, nothing ends it (no forward time is kept).
        self.tracer = tracer
        # Every step's input checksum and time split serve the rules across
        # ranks, ``epoch_repeats`` and ``duplicate_batches``: in one process
        # without a DataLoader that shuffles, holds several batches or reads an
        # IterableDataset with several workers (known at
        # the first observed step) no rule reads them, and
        # they are not taken (the hook's call and the checksum were ~130K
        # instructions of a 3.6M-instruction MLP step).
        self.inputs_wanted = True
        self.optimizers = optimizers
        self.sink = sink
        self.on_error = on_error or (lambda msg: None)
        self.failed = False
        self.loaders: Optional[list] = None
        self._step_input = None            # (tensor sums, tensors) of the step in progress
        self._inputs: list = []            # [step, checksum or (sums, tensors)] since the last row
        self._last_end: Optional[float] = None
        self._first_forward: Optional[float] = None
        self._forward_start: Optional[float] = None    # the step's second module call (_pre_hook)
        self._data = self._compute = self._forward = 0.0
        self._timed = self._forward_timed = 0
        self._handle = None                # the global forward pre-hook's handle (registered once)
        self._armed = False
        self._earlier_loaders = ()
        self.keep_fresh = False            # keep the input checksums for take_fresh (the rules of one process)
        self._fresh: list = []

    # -- hooks ------------------------------------------------------------------
    def root_input(self, module, args) -> None:
        """Before a root module's forward: the step's first one with autograd
        enabled is its input batch."""
        if self._step_input is not None or self.failed or not torch.is_grad_enabled() \
                or torch._C._functorch.peek_interpreter_stack() is not None:
            return      # (inside a torch.func transform: no step's batch, tensors without storage)
        try:
            self._first_forward = time.perf_counter()
            if len(args) == 1 and type(args[0]) is torch.Tensor:       # (the usual case, in few calls)
                tensors = args
            else:
                tensors = [local(t) for t in batch_tensors(args)]
            if all(t.is_cpu for t in tensors):
                self._step_input = combine([_mix(host_bit_sum(t), _desc(t)) for t in tensors])
            else:
                self._step_input = ([bit_sum(t) for t in tensors], [_desc(t) for t in tensors])
        except Exception as e:
            self._fail(e)

    def _pre_hook(self, module, args):
        # The first module call after a step's end is a root's (the outermost
        # module's pre-hook runs before its children's).  Nothing while torch.compile
        # traces a module: its graph is the script's, with no break at nndb's reading.
        if COMPILING():
            return None
        if self._step_input is None:
            kw = call_kwargs()      # (a batch given by keyword, model(input_ids=...): after the positional)
            hidden = PROFILING() and unprofiled()      # (no rows of nndb's in the script's profile)
            t = self.tracer             # (nor its tensor calls in a function watch: funcmode.hide)
            off = hide(t) if t is not None and t.watching else None
            try:
                self.root_input(module, args + tuple(kw.values()) if kw else args)
            finally:
                if off:
                    show(off)
                if hidden:
                    profiled()
            if self.failed or (self._step_input is not None and self.ranks <= 1):
                self.disarm()
            return None
        # Across ranks, the second: inside the root's forward, after what a
        # wrapper does first (DDP broadcasts its buffers there, a collective
        # that waits for the slowest rank): the forward time counts from here.
        self._forward_start = time.perf_counter()
        self.disarm()
        return None

    def note_earlier_loaders(self) -> None:
        """The DataLoaders alive before the run (not its own): one referrer scan at its start."""
        import weakref
        try:
            self._earlier_loaders = weakref.WeakSet(_dataloaders())
        except Exception:
            self._earlier_loaders = ()

    def arm(self) -> None:
        """Look at the next step's input: a global forward pre-hook, in from a
        step's end until the step's first forward with autograd enabled (put
        in at a safe point: no module forward is running; removing it from
        inside itself is safe, PyTorch iterates a copy of the hooks).  One
        handle, registered once: later steps put the hook back under its id."""
        if self._armed or self.failed:
            return
        if self._handle is None:
            self._handle = _module.register_module_forward_pre_hook(self._pre_hook)
        else:
            _module._global_forward_pre_hooks[self._handle.id] = self._pre_hook
        self._armed = True

    def disarm(self) -> None:
        if self._armed:
            self._handle.remove()
            self._armed = False

    def close(self) -> None:
        self.disarm()

    # -- step ends ----------------------------------------------------------------
    def on_step(self, end) -> None:
        """A step ended: its times, its input's checksum; a row at observed steps (one call a step)."""
        if self.failed:
            return
        step = end.step
        try:
            if step is None:
                self.finish()
                return
            now = time.perf_counter()
            if self._first_forward is not None and self._last_end is not None:
                self._data += self._first_forward - self._last_end
                self._compute += now - self._first_forward
                self._timed += 1
                grad = self.tracer.backward_began if self.tracer is not None else None
                if grad is not None and grad >= self._first_forward:
                    start = self._forward_start if self._forward_start is not None and \
                        self._forward_start <= grad else self._first_forward
                    self._forward += grad - start
                    self._forward_timed += 1
            self._last_end, self._first_forward, self._forward_start = now, None, None
            if self._step_input is not None:
                value, self._step_input = self._step_input, None
                self._inputs.append([step, value])      # (on an accelerator: (sums, descs), read at the next row)
                if self.keep_fresh and isinstance(value, int):
                    self._fresh.append((step, value))
            if step < cadence.SETTLE or step % cadence.OBSERVE_EVERY == 0:     # (cadence.observed, inline: every step)
                self._emit(step, full=True)
            if self.inputs_wanted:
                self.arm()
        except Exception as e:
            self._fail(e)

    def finish(self) -> None:
        """The run ended: the steps since the last row."""
        if self._inputs and not self.failed:
            try:
                self._emit(self._inputs[-1][0], full=False)
            except Exception as e:
                self._fail(e)

    def _emit(self, step: int, full: bool) -> None:
        row = {"step": step, "inputs": self._resolved_inputs()}
        if full:
            if self.loaders is None:
                self.loaders = loaders(self._earlier_loaders)
                self._earlier_loaders = ()
                row["loaders"] = self.loaders
                if self.ranks > 1 and model_averaging():
                    row["averaging"] = True     # (rank_divergence: the replicas differ between averages)
                self.inputs_wanted = self.ranks > 1 or any(
                    x.get("shuffle") or (x.get("batches") or 0) >= 2 or (x.get("iterable") and x.get("workers", 0) >= 2)
                    for x in self.loaders)
            if self.ranks > 1:              # (compared across ranks only: no rule of one process reads them)
                row["params"], shards = self._params()
                if shards:
                    row["shards"] = shards
                row["bn"] = self._bn()
            if self._timed:
                row["data_time"] = self._data / self._timed
                row["compute_time"] = self._compute / self._timed
                row["timed"] = self._timed
            if self._forward_timed:
                row["forward_time"] = self._forward / self._forward_timed
            self._data = self._compute = self._forward = 0.0
            self._timed = self._forward_timed = 0
        self.sink(row)

    def _resolved_inputs(self) -> list:
        pending = [(i, v) for i, (_, v) in enumerate(self._inputs) if not isinstance(v, int)]
        if pending:
            flat = ints([s for _, (sums, _) in pending for s in sums])
            at = 0
            for i, (sums, descs) in pending:
                k = len(sums)
                self._inputs[i][1] = combine([_mix(v, d) for v, d in zip(flat[at:at + k], descs)])
                at += k
            if self.keep_fresh:
                self._fresh.extend(tuple(self._inputs[i]) for i, _ in pending)
        out, self._inputs = self._inputs, []
        return out

    def take_fresh(self) -> list:
        """[(step, input checksum)] read since the last call (on the CPU: the
        step just ended; on an accelerator: at the observed steps)."""
        out, self._fresh = self._fresh, []
        return out

    def _params(self) -> dict:
        params, seen = [], set()
        for opt in self.optimizers():
            for g in opt.param_groups:
                for p in g["params"]:
                    if id(p) not in seen:
                        seen.add(id(p))
                        params.append(p)
        whole, shards = {}, {}
        if not params:
            return whole, shards
        sums = ints([bit_sum(p) for p in params])
        for p, s in zip(params, sums):
            (shards if sharded(p) else whole)[self.naming.param_name(p)] = _mix(s, _desc(local(p)))
        return whole, shards

    def _bn(self) -> dict:
        from torch.nn.modules.batchnorm import _BatchNorm
        out = {}
        for root in self.naming.roots():
            for m in root.modules():
                if isinstance(m, _BatchNorm) and m.track_running_stats:
                    s = bn_summary(m)
                    if s is not None:
                        out[self.naming.module_name(m)] = s
        return out

    def _fail(self, e: Exception) -> None:
        if not self.failed:
            self.failed = True
            self.on_error(f"nndb: the cross-rank checksums are off for this run "
                          f"(internal error: {type(e).__name__}: {e}); training goes on")
            try:
                self.close()
            except Exception:
                pass


never_compiled(Fingerprints._pre_hook, inlined=False)
