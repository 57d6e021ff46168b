"""The recorder: plain objects that turn hook events into one StepRecord per step.

The hooks (``tracer.hooks``) stay thin and forward here.  What is recorded:

* ``act``: the first floating-point tensor of a module's forward output, on
  the steps the schedule's ``acts`` names (and while the debugger forces
  them), for forward passes run with autograd enabled (a validation pass under
  ``torch.no_grad()`` is not part of a training step).  A module used twice in
  one forward pass of its model (one ReLU after two layers) gets a series per
  use: ``act``, ``act#2``.  Calls of the model repeated within a step (gradient
  accumulation, a GAN's discriminator on real and fake data) merge into one
  row per step.
* ``loss``: the tensor ``backward()`` was called on.  A scalar loss is one number per step:
  the sum over the step's backward passes (the objective whose gradient the optimizer
  applies: gradient accumulation's scaled micro-batch losses add up to the batch's loss;
  ``backward_count`` says how many there were); a non-scalar loss's elements merge.  With
  several optimizers each loss is attributed to the one that steps after it and named
  ``loss/<optimizer>`` (a GAN's discriminator and generator losses, each summed apart).
* ``param``, ``grad``, ``update``: for each parameter an optimizer holds, at the return of
  its ``step()``: its value, its ``.grad`` and the step's change.  Parameters no optimizer
  holds get ``param`` and ``grad`` at the step's end.  Without any optimizer (hand-written
  updates), ``param`` and ``update`` of step N are taken at the end of step N+1 (or of the
  run): they include the hand-written update after step N's backward pass.

Why this size: one class, the StepRecorder, whose events (a module's output, a
loss, an optimizer's pre and post, a GradScaler's skipped step, a hand-written
loop's step end) fill and close one bucket a step and read one another's state
(the losses pending, the snapshots before an update, the marks of the gradients
an optimizer left); the bucket and the parameter plans are modules of their own.
"""
from __future__ import annotations

import math
import operator
import time
import weakref
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from . import histogram as H
from . import stats as S
from ..schema import CLIP_SERIES, KINDS  # noqa: F401  (the kinds of the series recorded here)
from .bucket import _PENDING, _PENDING_LOSS, CLIP, _Bucket
from .params import ParamPlan


# The kinds a hand-written loop's step N has only at the end of step N+1 (the update
# the script makes after step N's backward): its provisional record lacks them.
LATE_KINDS = ("param", "update")

_PARAMS = operator.itemgetter("params")


@dataclass
class StepRecord:
    step: int
    time: float                  # seconds since the run started, at the step's end
    backward_count: int
    optimizer_steps: int
    names: list                  # [(name, kind)]
    raw: np.ndarray              # (len(names), N_RAW) raw accumulator rows (stats.RAW_FIELDS)
    partial: bool = False        # cut short by the end of the run (the script raised or exited mid-step)
    hist: Optional[np.ndarray] = None   # (len(names), HIST_BINS) histograms at a full step, -1 rows: none
    clips: Optional[dict] = None        # clip series name -> (max_norm or None, measured scaled gradients)
    clip_params: Optional[dict] = None  # clip series name -> (the parameters it clipped) (live only)

    @property
    def nonfinite(self) -> bool:
        """Does some tensor of the step hold a NaN or Inf?"""
        # count_nonzero is one plain C loop, where a ufunc reduction's machinery
        # is costly with the caches cold, as they are once a step.
        return bool(np.count_nonzero(self.raw[:, S.NONFINITE_FIELDS]))

    @property
    def stats(self) -> np.ndarray:
        """(len(names), N_STATS), STAT_NAMES columns.  Computed on demand: the
        writer finalises many steps at once when it flushes."""
        return S.finalize_many(self.raw)

    def as_dict(self) -> dict:
        return {(n, k): dict(zip(S.STAT_NAMES, map(float, row)))
                for (n, k), row in zip(self.names, self.stats)}


def _clipped(params) -> Optional[tuple]:
    """The parameters a clip_grad_norm_ call was given (a tensor, or a list the clip
    wrapper made of a generator), as a tuple (None: not known)."""
    if isinstance(params, torch.Tensor):
        return (params,)
    return tuple(params) if isinstance(params, (list, tuple)) else None


def _max_norm(x) -> Optional[float]:
    """clip_grad_norm_'s ``max_norm`` as a number (None: not one)."""
    try:
        return float(x.item() if isinstance(x, torch.Tensor) else x)
    except Exception:
        return None


UNSCALED = "_nndb_unscaled"     # the attribute of GradScaler.scale's output: the loss it scaled (hooks._scaler_scale)


# The autograd nodes of the losses a GradScaler scaled since the last backward, each with the
# scale tensor it multiplied by (hooks._scaler_scale; emptied after each backward): a loss made
# of scaled ones (``sum(scaler.scale([l1, l2])).backward()``) is no output of scale() itself.
SCALED_NODES: dict = {}
_NODES_LOOKED_AT = 64            # nodes of a backward's graph searched for a scaled loss


def unscaled(tensor):
    """The loss a GradScaler scaled, given what ``scale()`` returned, or a sum of such
    (the sum divided by the scale: exact for the scaler's powers of 2); the tensor itself,
    given any other: what the script computed, not that times the loss scale."""
    u = getattr(tensor, UNSCALED, None)
    if u is not None:
        return u
    if SCALED_NODES and isinstance(tensor, torch.Tensor) and tensor.grad_fn is not None:
        scale = _scale_behind(tensor.grad_fn)
        if scale is not None:
            with torch.no_grad():
                return (tensor.detach() / scale).to(tensor.dtype)
    return tensor


def _scale_behind(node):
    """The scale of a scaled loss the graph from ``node`` reaches (None: none, within the
    nodes looked at)."""
    seen, todo = set(), [node]
    while todo and len(seen) < _NODES_LOOKED_AT:
        n = todo.pop()
        if n is None or n in seen:
            continue
        scale = SCALED_NODES.get(n)
        if scale is not None:
            return scale
        seen.add(n)
        todo.extend(m for m, _ in n.next_functions)
    return None


def _grad_mark(g: torch.Tensor) -> tuple:
    """A ``.grad`` as a step left it: the tensor (weakly) and its version counter."""
    return weakref.ref(g), g._version


def _same_grad(mark, g: torch.Tensor) -> bool:
    """Is ``g`` the ``.grad`` ``mark`` saw, unchanged since?  The tensor itself, not its
    id(): a .grad that zero_grad(set_to_none=True) freed and the next backward made anew
    often takes the id of the one it replaced (5 of 12 steps of a two-layer model), and a
    new gradient's version is 0 as the old one's was: such a step's gradient was taken for
    the last step's and not recorded (0.weight's grad norm missing at steps 2 and 9,
    param_not_updated found 2 steps late)."""
    return mark is not None and mark[0]() is g and mark[1] == g._version


def _reached(before) -> Optional[frozenset]:
    """The ids of the parameters whose gradient a backward made or added to, from the marks
    ``StepRecorder.before_backward`` took before it; None where it took none."""
    if before is None:
        return None
    params, marks = before
    return frozenset(id(p) for p in params if p.grad is not None and not _same_grad(marks.get(id(p)), p.grad))


_NONE_LOST = frozenset()


def _sum_rows(parts) -> tuple:
    """(the row of the sum, its dtype) of ``parts`` ((row, dtype, reach, lost) each), added as
    StepRecorder.loss adds them, in order, in their promoted dtype."""
    row, dtype = parts[0][0], parts[0][1]
    for r, dt, _, _ in parts[1:]:
        dtype = torch.promote_types(dtype, dt)
        row = S.add_scalar_rows(row, r, dtype)
    return row, dtype


def float_tensors(out, depth: int = 0):
    """The floating-point tensors of a module's output (nested in tuples, lists and dicts up to
    3 deep), in order; not a nested tensor (a TransformerEncoderLayer's on PyTorch's fused path,
    hooks._FAST_PATHS), which has no one shape to measure: its rows are left out."""
    if isinstance(out, torch.Tensor):
        if out.is_floating_point() and not out.is_nested:
            yield out
    elif depth <= 3 and isinstance(out, (tuple, list, dict)):
        for o in (out.values() if isinstance(out, dict) else out):
            yield from float_tensors(o, depth + 1)


def first_float_tensor(out):
    """The first floating-point tensor of a module's output (``float_tensors``), or None."""
    return next(float_tensors(out), None)


# The torch.autograd.grad calls running now that differentiate with respect to inputs only
# (leaf tensors no model or optimizer of the run holds: a saliency map's ``x.requires_grad_()``),
# counted by the tracer's wrapper (hooks._grad): the passes they run through are not used for them
GRAD_OF_INPUTS = [0]


class _Pass:
    """A root module's forward pass whose activations wait apart (StepRecorder.pass_began):
    ``home``, the segment it began in; ``bucket``, its activations; ``used``, [True] once a
    backward ran through one of its modules' outputs (``hook``, a pre-hook on their autograd
    nodes, holds that list and nothing else: a pass left behind is not kept alive by a graph);
    ``node``, the last node hooked while it runs.  A ``torch.autograd.grad`` of inputs only
    (GRAD_OF_INPUTS) uses none: a saliency map of a validation batch merged into the next
    step's activations (2,176 elements where the training batch's are 1,024); one whose inputs
    include a parameter, or a tensor made from them (a meta-learning loop's fast weights), or
    whose result a later backward goes through (a gradient penalty's, ``create_graph=True``:
    that backward reaches the pass), does.  Once the pass has ended its hook is held by those
    nodes alone (``hook`` becomes a weakref): when the script lets their graph go (an evaluation
    with autograd on, its output overwritten by the next one's), no backward can reach the pass
    any more (``reachable``)."""
    __slots__ = ("home", "bucket", "used", "hook", "node")

    def __init__(self, home: Optional[_Bucket]):
        self.home = home
        self.bucket = _Bucket()
        self.used = used = [False]
        self.node = None

        def hook(grad_outputs, used=used, inputs_only=GRAD_OF_INPUTS):
            if not inputs_only[0]:
                used[0] = True
        self.hook = hook

    def end(self) -> None:
        """The pass has ended: no node is hooked any more, none held (``node``), and the hook is
        left to the nodes it was registered on."""
        self.node = None
        self.hook = weakref.ref(self.hook)

    def reachable(self) -> bool:
        """Can a backward still go through this ended pass (or did one already)?"""
        return self.used[0] or self.hook() is not None


def shared_params(optimizers) -> Optional[set]:
    """The ids of the parameters that several of ``optimizers`` hold, or None."""
    seen, shared = set(), set()
    for opt in optimizers:
        ids = {id(p) for group in opt.param_groups for p in group["params"]}
        shared |= seen & ids
        seen |= ids
    return shared or None


class StepRecorder:
    """Accumulates one step's statistics and emits a StepRecord when it closes.

    ``sink(record)`` receives every closed, recorded step.  ``schedule`` is the
    run's cadence (nndb.cadence.Cadence, or any callable): ``schedule(step)``
    says whether a step is recorded at all; ``schedule.full(step)`` and
    ``schedule.acts(step)``, if they exist, whether its expensive statistics
    and its activations are measured.

    Why this size: one step's accumulation: the layouts and buckets of its
    series, the names and shapes seen, the per-step policies (full, acts,
    forced) and the snapshots taken for update statistics are read together
    when the step closes into one StepRecord.
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
        self._acts_policy = getattr(schedule, "acts", lambda step: True)
        # (recorded, full, acts, until) in one call, where the schedule has it (Cadence): asked
        # again at step ``until`` (the same answers hold until then)
        self._policies = getattr(schedule, "policies", None)
        self._policy: tuple = (None, None, None)
        self._policy_until = 0
        self.full = self._full_policy(0)
        self.acts = self.full or self._acts_policy(0)
        # Set by the debugger while a watchpoint needs statistics that are
        # otherwise measured only at full steps, or activations at every step.
        self.force_full = False
        self.force_acts = False
        self._buckets = [_Bucket()]
        self._plans: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # optimizer -> (signature, plan)
        # ids of the parameters several optimizers hold (None: none), and their values before the
        # first optimizer that stepped them in the step (_shared_step) stepped (_share_before)
        self._shared_ids: Optional[set] = None
        self._known = ()                 # the run's optimizers, as the last optimizer_pre was told
        self._shared_before: dict = {}
        self._shared_step: Optional[int] = None
        self._snapshots: dict = {}          # id(optimizer) -> Snapshot
        # the last activation: (tensor ref, version), its host copy or (raw, full, hist), reused by a container
        self._last_act: tuple = (None, None, None)
        self._pass: Optional[_Pass] = None      # the root module's forward pass in progress (pass_began)
        self._passes: list = []                 # passes no backward has gone through yet (settle_passes)
        self.manual = False
        self._in_step: Optional[bool] = None     # inside optimizer.step(): has a loss been taken there?
        self._loss_dtype = torch.float32         # the dtype of the step's losses so far (their sum's)
        self._manual_pending: Optional[tuple] = None   # (step, bucket, time, snapshot, full)
        self.last: Optional[StepRecord] = None
        self.scaler_seen = False                 # a GradScaler scaled a loss (hooks._scaler_scale)
        # Losses later_backward took out of the step (bucket, their summed row, had a histogram),
        # and the gradients the backward after them left ([(parameter, weakref of its .grad)]): put
        # back at the optimizer's step if the script wrote the gradients it applies itself
        self._set_aside: Optional[tuple] = None
        self._clips_before = 0                   # clip_grad_norm_ calls (_clip_calls) before the last backward
        self._clip_calls = 0                     # clip_grad_norm_ calls recorded in the run
        # The one-number losses of ``torch.autograd.grad`` calls of the run's parameters since the
        # last optimizer step (bucket, their summed row, dtype): the step's loss where no backward
        # gave one (grad_loss)
        self._grad_losses: Optional[tuple] = None
        self._grads_after: Optional[list] = None
        self._clips_since_step: list = []        # clip_grad_norm_ keys since the last optimizer step
        self._clip_marks: dict = {}              # such a key -> (its parameters' ids, backward passes before it)
        # Which optimizer a backward's loss is credited to (_credit): with no optimizer stepped yet
        # or several (``reaching``), each backward's parameters' gradients before it (``_before``:
        # (parameters, their marks)), and the losses the bucket's pending row sums, one a backward:
        # (bucket, [(row, dtype, ids of the parameters whose gradient it changed, or None, the ids of
        # those whose gradient a reset removed since)]); None where the pending row is no such sum
        # (a loss of several elements, losses set aside put back)
        self.reaching = True
        self._before: Optional[tuple] = None
        self._parts: Optional[tuple] = None
        self._held_back: Optional[tuple] = None  # (parts, optimizer ref): credited later (_credit)
        self._waiting: Optional[tuple] = None    # (bucket, optimizer ref): held, pending again (_unhold)
        # These caches key an object by its id, never by the object: they must not keep
        # an optimizer, a module or a parameter alive (an optimizer the script replaced,
        # kept alive here, never handed the step clock over to its successor: every
        # later iteration went into one step).  An id is forgotten when its object goes.
        self._names: dict = {}              # series key, its object as an id -> name, resolved once
        self._held: dict = {}               # id -> weakref of an object the caches name
        self._gone: list = []               # ids whose objects went since (forgotten at the next record)
        self._names_version = 0             # naming.roots_version the names were resolved at
        self._shapes: dict = {}             # parameter name -> its shape, noted as it is named
        self._local_shapes: dict = {}       # parameter name -> its shard's shape (a DTensor's: FSDP)
        self._layouts: dict = {}            # tuple of (name, kind) -> the list given to every record
        self._by_sig: dict = {}             # (entry keys, plans, losses qualified), as ids -> that list
        # (cache key, weakrefs of the params no optimizer holds: held, a k-fold loop's last fold's
        # model lived through the next fold, its param rows recorded at each of its steps)
        self._others: tuple = (None, [])
        # The optimizer whose loss the series ``loss`` holds (a weakref): a series keeps its
        # name for the whole run, so when a later step has a second optimizer's loss (a WGAN's
        # generator, first stepped at step 3), only the newcomer's is ``loss/<optimizer>``
        self._loss_owner = None
        # Each parameter's gradient as its optimizer's last step left it, (weakref, version):
        # _grad_mark, so that a step that stepped another optimizer (a GAN, training stages, an
        # optimizer replaced) records only the gradients its backward made (a finished stage's .grad stays)
        self._grad_marks: dict = {}
        # Whole tensors kept (--record-full): nndb.tracer.fulltensors.FullTensors, or None
        self.fulltensors = None
        # on_note(line): a one-line warning for the user (the run's message sink), or None; and
        # the parameters said to be stepped by several optimizers in one step (_say_shared)
        self.on_note: Optional[Callable[[str], None]] = None
        self._said_shared: set = set()

    def require(self, full: bool, acts: bool) -> None:
        """Measure all statistics (``full``) and activations (``acts``) at every
        recorded step from the step in progress on, whatever the schedule says
        (a watchpoint needs them; someone at the prompt looks at them)."""
        self.force_full, self.force_acts = full, acts
        if full:
            self.full = True
        if full or acts:
            self.acts = True

    @property
    def _cur(self) -> _Bucket:
        return self._buckets[-1]

    # -- events ---------------------------------------------------------------
    def wants_forward(self) -> bool:
        """Does the step in progress need the module hooks (activations, or whole ones kept)?"""
        ft = self.fulltensors
        return (self.recording and self.acts) or bool(ft is not None and ft.rules and ft.wants("act", self.step))

    def activation(self, key, output) -> None:
        """``key``: (module, index of this use of the module in the forward pass)."""
        ft = self.fulltensors
        if ft is not None and ft.rules and torch.is_grad_enabled() and ft.wants("act", self.step):
            ft.activation(self.naming, key, output, self.step)
        if not (self.recording and self.acts) or not torch.is_grad_enabled():
            return
        t = output if type(output) is torch.Tensor and not output.is_nested else first_float_tensor(output)
        if t is None or not t.is_floating_point():
            return
        p = self._pass
        b = self._buckets[-1] if p is None else p.bucket
        if p is not None:
            # (every output a backward may go through: an RNN's hidden state and not its
            # outputs, char_rnn_classification's, whose model is called through .forward(),
            # each layer a pass of its own: the RNN's activations left its steps)
            for u in ((t,) if t is output else float_tensors(output)):
                node = u.grad_fn
                if node is not None and node is not p.node:     # (a container's output is its last child's)
                    node.register_prehook(p.hook)
                    p.node = node
        b.saw_act(("act",) + key)
        # The same tensor object, unchanged (an id alone is not enough: CPython
        # reuses a freed tensor's id for the next one, which once made a layer's
        # row repeat the previous step's model output).
        # A container's output is often its last child's (a Sequential's, a
        # TransformerEncoder's and its layers'): measured once, a row for each.
        last, arr, reduced = self._last_act
        same = (weakref.ref(t), t._version)
        if last is None or last[0]() is not t or last[1] != t._version or \
                (reduced is not None and reduced[1] != self.full):
            if t.device.type == "cpu" and t.numel() <= S.HOST_MAX_ELEMENTS:
                arr, reduced = S._host_array(t).copy(), None      # copied: the script may change t in place
            else:
                raw = S.raw_now(t, self.full)
                arr, reduced = None, (raw, self.full, H.of_tensor(t, raw) if self.full else None)
        if reduced is not None:          # (a large tensor: its row and histogram, measured here or for the last module)
            b.add(("act",) + key, reduced[0].copy())
            if reduced[2] is not None:
                b.add_hist(("act",) + key, reduced[2])
        self._last_act = (same, arr, reduced)
        if arr is not None:
            b.deferred.append((("act",) + key, arr))

    # -- forward passes ---------------------------------------------------------
    # A step's activations are those of the forward passes its backward went through.  A pass
    # with autograd on whose output no backward of the step reaches (a validation pass under
    # model.eval() without no_grad(), a DQN's target network, rollouts collected with autograd
    # on) is no part of it: merged into the step, its elements were 33,024 where the training
    # batch's were 1,024, its norm the validation data's.  So a pass's activations wait apart
    # (``_Pass``) until a backward has run through one of its modules' outputs (a pre-hook on
    # their autograd nodes), and leave with the step if none did.  Only on the steps that
    # record activations (the observed ones): the usual step has no module hooks.

    def pass_began(self) -> None:
        """A root module's forward begins, with autograd on, on a step that records activations."""
        if self._pass is not None:           # (one that never returned: its forward raised)
            self.pass_ended()
        self._pass = _Pass(self._buckets[-1])

    def pass_ended(self) -> None:
        """The root module's forward returned: its activations into its step now if no
        backward can reach them (no output that requires a gradient: a frozen teacher's),
        else they wait for one (``settle_passes``)."""
        p, self._pass = self._pass, None
        if p is None or p.bucket.empty():
            return
        if p.node is None:
            (p.home if any(p.home is b for b in self._buckets) else self._buckets[-1]).merge(p.bucket)
            return
        p.end()
        # Passes whose graph is gone leave now: an evaluation loop with autograd on after the
        # last step (char_rnn_classification's 10,000 evaluate() calls) kept every pass's
        # activations to the end of the run, 14 kB a pass (16,000 passes: 498 MB for 238).
        self._passes = [q for q in self._passes if q.reachable()]
        self._passes.append(p)

    def keep_passes(self) -> None:
        """The script raised inside the step (its own check of the loss, before
        ``backward()``): no backward will come for its forward passes, and they
        are the step's (a partial record that held none said nothing of its NaN)."""
        if self._pass is not None:
            self.pass_ended()
        for p in self._passes:
            (p.home if any(p.home is b for b in self._buckets) else self._buckets[-1]).merge(p.bucket)
        self._passes = []

    def passes_waiting(self) -> bool:
        """Is a forward pass running or waiting for a backward (``settle_passes``)?"""
        return self._pass is not None or bool(self._passes)

    def settle_passes(self, closing: Optional[list] = None) -> None:
        """The passes a backward went through since, into the segment they began in; with
        ``closing`` (the segments of a step that closes), those of its segments no backward
        went through leave.  A pass whose segment is gone (an iteration a GradScaler
        skipped: ``scaler_skipped``) leaves with it."""
        keep = []
        for p in self._passes:
            live = any(p.home is b for b in self._buckets)
            if p.used[0]:
                if live:
                    p.home.merge(p.bucket)
            elif live and (closing is None or not any(p.home is b for b in closing)):
                keep.append(p)
        self._passes = keep

    def clip_norm(self, total, max_norm=None, scaled: bool = False, params=None) -> None:
        """What ``clip_grad_norm_`` returned: the gradients' total norm before it clipped
        them, a row of the step's ``grad`` series ``clip_grad_norm_`` (``#2`` for its
        second call in the step).  Read now (on an accelerator, one host transfer, as the
        script's own ``.item()`` of it would be).  Its ``max_norm`` (whether it clipped:
        total > max_norm) and ``scaled`` (it measured gradients a GradScaler had not unscaled
        yet) go into the record's ``clips``; ``params``, the parameters it clipped, into its
        ``clip_params`` (live only: a clip over some of them, the decoder's, is the norm of
        those alone; named where asked, predict's column, not at every step)."""
        if not isinstance(total, torch.Tensor) or total.numel() != 1:
            return
        if self.manual and not any(b.backward_count for b in self._buckets):
            # A hand-written loop's step ends as its backward() returns, before the script
            # clips and updates: a clip_grad_norm_ before the next backward measured that
            # step's gradients and is its row, in the record that waits for its update (it
            # went into the next step's: the series ran a step behind the script's values).
            pend = self._manual_pending
            if pend is not None:       # (None: that step was not recorded)
                b = pend[1]
                key = ("clip", CLIP, sum(1 for k in b.entries if k[0] == "clip"))
                b.add(key, S.scalar_row(float(S.local(total).item())))
                b.clip_limits[key] = (_max_norm(max_norm), scaled, _clipped(params))
            return
        if not self.recording:
            return
        clipped = _clipped(params)
        first = next((p.grad for p in clipped or () if isinstance(p, torch.Tensor) and p.grad is not None), None)
        mark = (tuple(map(id, clipped)) if clipped is not None else None,
                sum(b.backward_count for b in self._buckets), weakref.ref(first) if first is not None else None)
        # A call over the parameters an earlier one of the step clipped, after another backward()
        # that added to the gradients it measured (clipping at each micro-batch of gradient
        # accumulation): those were a part of the gradients the optimizer applies, and this
        # one's total is the step's row (it was the first micro-batch's: 0.0749 where the
        # script's total was 0.2026, in every reading of the series).  Gradients made anew
        # between (zero_grad(): SAM's two passes, DP-SGD's micro-batches) keep a row each.
        key = next((k for k in reversed(self._clips_since_step)
                    if self._clip_marks.get(k, (None,))[0] == mark[0]), None) if mark[0] is not None else None
        holder = next((b for b in self._buckets if key in b.entries), None) if key is not None else None
        before = self._clip_marks[key] if holder is not None else None
        if before is None or before[1] == mark[1] or before[2] is None or before[2]() is not first:
            key, holder = ("clip", CLIP, sum(1 for b in self._buckets for k in b.entries if k[0] == "clip")), None
            self._clips_since_step.append(key)
        holder = holder or self._buckets[-1]
        holder.add(key, S.scalar_row(float(S.local(total).item())))
        holder.clip_limits[key] = (_max_norm(max_norm), scaled, clipped)
        self._clip_marks[key] = mark
        self._clip_calls += 1          # (one that replaced a row came after the last backward too)

    def scaler_skipped(self, opt, others=()) -> None:
        """A GradScaler's ``step()`` skipped the optimizer's (its gradients held Inf or NaN:
        the loss scale was too large, as at the start of every float16 run): the iteration
        made no step, and what it recorded for one is not the next step's.  Its
        ``clip_grad_norm_`` totals (Inf: the scaler's overflow) and its finite losses leave
        the step; a NaN or Inf loss stays (the scaler cannot mend that: catch nan and
        ``nonfinite`` see it).  Where no optimizer has stepped in the step yet (one optimizer:
        always), the iteration is all the step holds: its activations leave too (the first
        step's were the merged rows of every iteration the scaler skipped before it), unless its
        loss is NaN or Inf (where that came from is the finding's).  Its backward passes still
        count in ``backward_count``.  ``opt``'s parameters get no ``param`` and ``grad`` rows
        in the step as parameters no optimizer stepped would (a GAN's discriminator, whose
        skipped step left its gradients scaled, Inf, and the generator's backward then added
        to them: NaN, and 1.6e4 where its true gradients are 0.6).  The losses whose gradients
        only another optimizer of the run (``others``) applies are not the skip's: they wait
        for that one's step (``_credit``; a GAN whose micro-batches of D and G alternate: G's
        micro-batch before D's skipped step left with it, and loss/optG was G's last alone)."""
        if self._parts is not None and self.reaching and opt is not None:
            self._credit(opt, others)
        self._skip_losses(opt)
        if self._held_back is not None:
            self._unhold()

    def _skip_losses(self, opt) -> None:
        """(scaler_skipped's: what the skipped iteration recorded for ``opt`` leaves)"""
        b = self._buckets[-1]
        row = b.entries.get(_PENDING_LOSS)
        bad = (row is not None and bool(row[S.RAW_NAN] or row[S.RAW_INF])) or \
            any(k == _PENDING_LOSS and not np.isfinite(a).all() for k, a in b.deferred)
        skipped = {id(p) for p in self._plan(opt).params} if opt is not None else set()
        if not bad and len(self._buckets) == 1 and not b.optimizer_steps and not b.params:
            fresh = self._buckets[0] = _Bucket()
            fresh.backward_count = b.backward_count
            fresh.covered |= skipped
            self._clips_since_step = []
            return
        b.covered |= skipped
        for key in self._clips_since_step:
            b.entries.pop(key, None)
            b.hists.pop(key, None)
            b.clip_limits.pop(key, None)
        self._clips_since_step = []
        if not bad:
            self._parts = None
            b.entries.pop(_PENDING_LOSS, None)
            b.hists.pop(_PENDING_LOSS, None)
            if b.deferred:
                b.deferred = [(k, a) for k, a in b.deferred if k != _PENDING_LOSS]

    def loss(self, tensor: torch.Tensor) -> None:
        b = self._buckets[-1]
        b.backward_count += 1
        if self.scaler_seen:       # (GradScaler.scale's loss: the one it scaled, hooks._scaler_scale)
            tensor = unscaled(tensor)
        if not self.recording or not (isinstance(tensor, torch.Tensor) and tensor.is_floating_point()):
            return      # (S.is_recordable, inline: every step)
        if self._in_step is not None:
            # A closure optimizer (LBFGS) calls the closure again and again in one
            # step(); the step's loss is the first call's, which step() returns.
            if self._in_step:
                return
            self._in_step = True
        if tensor.numel() == 1:
            # One number (on an accelerator too: its row would be read back now anyway), added
            # to the step's other losses: the step's objective is their sum.
            v = (tensor.to_local() if type(tensor).__name__ == "DTensor" else tensor).item()    # (S.local)
            # (S.scalar_row(v), its finite case inline: every step)
            row = [1.0, v, v * v, v, v, abs(v), float(v == 0), 0.0, 0.0] if -math.inf < v < math.inf \
                else S.scalar_row(v)
            # (the parameters it reached, where several optimizers may take it: _credit)
            before, self._before = self._before, None
            reach = None if before is None else _reached(before)
            parts = self._parts
            if _PENDING_LOSS not in b.entries:
                self._parts = (b, [(row, tensor.dtype, reach, _NONE_LOST)])
            elif parts is not None and parts[0] is b:
                parts[1].append((row, tensor.dtype, reach, _NONE_LOST))
            if _PENDING_LOSS in b.entries:
                # Summed as the script sums them (dcgan's errD = errD_real + errD_fake): in the
                # losses' dtype, float32's rounding and not Python's float64 (printed 1.1882719993591309,
                # $loss 1.188271939754486 before).
                self._loss_dtype = dtype = torch.promote_types(self._loss_dtype, tensor.dtype)
                total = S.add_scalar_rows(b.entries[_PENDING_LOSS], row, dtype)
                if total is None:
                    b.add(_PENDING_LOSS, row)
                else:
                    b.entries[_PENDING_LOSS] = total
            else:
                b.entries[_PENDING_LOSS] = row
                self._loss_dtype = tensor.dtype
            if self.full:
                b.add_hist(("loss", _PENDING), H.of_scalar(v))
        elif S.is_host_tensor(tensor):
            self._parts = self._before = None
            b.deferred.append((("loss", _PENDING), S._host_array(tensor).copy()))
        else:
            self._parts = self._before = None
            H.add_many(b, [("loss", _PENDING)], [tensor], self.full)
        if self._set_aside is not None:
            self._grads_after = [(p, weakref.ref(p.grad), p.grad._version, p.grad.data_ptr())
                                 for p in self._step_params() if p.requires_grad and p.grad is not None]
            self._clips_before = self._clip_calls

    def grad_loss(self, tensor: torch.Tensor) -> None:
        """The loss of a ``torch.autograd.grad`` of the run's parameters (no ``create_graph``): a
        loop that writes the gradients it got to ``p.grad`` and steps its optimizer, with no
        ``backward()`` (gradients clipped or projected before they are written; an optimizer
        stepped per task).  Kept apart, and the step's loss only where no backward of the step
        gave one (``optimizer_post``): the first-order inner loop of a meta-learner, a sharpness
        or gradient-norm probe before the step's own backward, are no part of its objective.
        Several such calls' losses add up, as backward()'s do."""
        if not self.recording or self._in_step is not None:
            return
        if self.scaler_seen:       # (GradScaler.scale's loss: the one it scaled, as loss() takes it)
            tensor = unscaled(tensor)
        b = self._buckets[-1]
        v = (tensor.to_local() if type(tensor).__name__ == "DTensor" else tensor).item()
        row = S.scalar_row(v)
        prev = self._grad_losses
        if prev is not None and prev[0] is b:
            dtype = torch.promote_types(prev[2], tensor.dtype)
            total = S.add_scalar_rows(prev[1], row, dtype)
            row = total if total is not None else S.merge_raw(np.asarray(prev[1], dtype=float),
                                                              np.asarray(row, dtype=float))
        else:
            dtype = tensor.dtype
        self._grad_losses = (b, row, dtype)

    def before_backward(self) -> None:
        """A backward() begins while ``reaching`` (no optimizer has stepped yet, or several
        have): the models' and optimizers' parameters' gradients as they are, so that its loss
        goes to the optimizer whose parameters its gradient reaches (``_credit``)."""
        if not self.recording or self.manual:
            return          # (a hand-written loop: no optimizer to credit)
        params = {id(p): p for _, plan in self._plans.values() for p in plan.params}
        for p in self.naming.root_params():
            params.setdefault(id(p), p)
        params = list(params.values())
        self._before = (params, {id(p): _grad_mark(p.grad) for p in params if p.grad is not None})
        parts = self._parts
        if parts is not None and any(part[2] for part in parts[1]):
            # (the pending losses' gradients that a reset removed since their backward: no
            # optimizer applies them; a dcgan loop's netD.zero_grad() after errG.backward())
            gone = {id(p) for p in params if p.grad is None}
            parts[1][:] = [(row, dt, reach, lost | (reach & gone)) if reach and not reach.isdisjoint(gone)
                           else (row, dt, reach, lost) for row, dt, reach, lost in parts[1]]

    def _credit(self, opt, others) -> None:
        """At ``opt``'s step: the pending losses whose gradient reached none of its parameters
        but those of another optimizer of the run (``others``) wait for that one's step (held
        until ``optimizer_post``).  A GAN whose micro-batches of the discriminator and the
        generator alternate, each optimizer stepping after its k-th (Lightning's
        toggle_optimizer with accumulate_grad_batches): the discriminator's loss was D1 + G1 + D2
        (-0.9724 where its micro-batches' sum is -0.6984) and the generator's G2 alone.  A loss
        whose gradient reached no optimizer's parameters, or this one's and another's (a
        generator's loss through the discriminator), stays with the first to step.  One whose
        gradient in this optimizer's parameters a reset removed (a dcgan loop whose
        netD.zero_grad() threw away the errG of the iteration before, its generator not
        stepped: its loss read errD + errG, 1.798 for 1.2175) is not this one's: it waits for
        another's whose parameters still hold its gradient, else it leaves the step."""
        b, parts = self._parts
        if b is not self._buckets[-1] or _PENDING_LOSS not in b.entries:
            return
        mine = self._plan(opt).ids
        away = [part for part in parts if part[2] and (part[2] - part[3]).isdisjoint(mine)]
        if not away:
            return
        theirs = {id(p) for o in others if o is not opt for g in o.param_groups for p in g["params"]}
        held = [part for part in away if not (part[2] - part[3]).isdisjoint(theirs)
                or (part[2].isdisjoint(mine) and not part[2].isdisjoint(theirs))]
        thrown = [part for part in away if not part[2].isdisjoint(mine) and not any(part is h for h in held)]
        if not held and not thrown:
            return
        if held:
            self._held_back = (held, weakref.ref(opt))
        self._keep_parts(b, [part for part in parts if not any(part is h for h in held + thrown)])

    def _keep_parts(self, b, kept: list) -> None:
        """The pending losses of ``b`` are ``kept`` alone (the others held or left out)."""
        self._parts = (b, kept)
        had_hist = b.hists.pop(_PENDING_LOSS, None) is not None
        if not kept:
            del b.entries[_PENDING_LOSS]
            return
        b.entries[_PENDING_LOSS], self._loss_dtype = _sum_rows(kept)
        if had_hist:
            b.add_hist(_PENDING_LOSS, None)

    def _unhold(self) -> None:
        """After the step that held them (``_credit``): the losses held back are pending again."""
        held, ref = self._held_back
        self._held_back = None
        b = self._buckets[-1]        # (the one held from, or the fresh one of a skipped iteration: scaler_skipped)
        if _PENDING_LOSS in b.entries:
            return                   # (not expected: the step took the rest)
        self._waiting = (b, ref)
        b.entries[_PENDING_LOSS], self._loss_dtype = _sum_rows(held)      # (the step took the rest)
        self._parts = (b, held)
        if self.full:
            b.add_hist(_PENDING_LOSS, None)

    def _credit_waiting(self, closed: list) -> None:
        """A step closes with losses still held for an optimizer that did not step again in it:
        the optimizer that held them takes them, the last to step before the close, as any
        loss pending at an optimizer's step went to it before ``_credit``."""
        (b, ref), self._waiting = self._waiting, None
        opt = ref()
        if opt is not None and _PENDING_LOSS in b.entries and any(b is c for c in closed):
            parts = self._parts
            if parts is not None and parts[0] is b:
                # (not those whose gradient in its parameters a reset removed: _credit)
                mine = self._plan(opt).ids
                kept = [part for part in parts[1] if not part[2] or part[2].isdisjoint(mine)
                        or not (part[2] - part[3]).isdisjoint(mine)]
                if len(kept) != len(parts[1]):
                    self._keep_parts(b, kept)
                    if not kept:
                        return
            b.attribute_losses(opt)

    def later_backward(self) -> None:
        """Before a later backward() of the step: where every parameter's gradient was set to
        None since the last one (zero_grad() between them: FGSM's backward for the input's
        gradient, SAM's first pass), the losses so far are no part of the objective whose
        gradient the optimizer applies: they leave the step's loss (FGSM read adv_loss + loss,
        1.96x the printed loss).  A reset that fills the gradients with zeros is not seen, and a
        NaN or Inf loss stays (a script that skips the step of a bad batch: the run's only sign of it).
        Inside an optimizer's step() only at its closure's first backward: the closure (LBFGS's)
        resets them before each of its backwards, and the step's loss is its first call's; a
        loss taken before step() whose gradients the step threw away before its closure ran
        (SAM's step(closure): zero_grad, then the closure at the perturbed weights; a script
        that calls its closure once to print the loss, then LBFGS's step(closure)) is no part
        of it (it was added in: $loss read 0.879 + 0.954, 2 x the printed 0.3242)."""
        b = self._buckets[-1]
        row = b.entries.get(_PENDING_LOSS)
        if self._in_step or (row is not None and (row[S.RAW_NAN] or row[S.RAW_INF])):
            return       # (a NaN or Inf loss whose step the script skipped stays the step's: catch nan sees it)
        # (gradient accumulation comes here at every micro-batch: the optimizers' parameters
        # first, where the first one with a gradient ends the look)
        seen = False
        marks = self._grad_marks
        for params in ([p for _, plan in self._plans.values() for p in plan.params], self.naming.root_params()):
            for p in params:
                g = p.grad
                if p.requires_grad:
                    if g is not None:
                        return
                    seen = True
                elif g is not None and not _same_grad(marks.get(id(p)), g):
                    # (frozen for this backward only, its gradient made since its last step:
                    # Lightning's toggle_optimizer freezes the parameters of every optimizer but
                    # one, and with gradient accumulation the step applies what the micro-batches
                    # before made: their losses were dropped, $loss read 0.4868 for 1.5617)
                    return
        if seen:
            self._parts = None
            row = b.entries.pop(_PENDING_LOSS, None)
            hist = b.hists.pop(_PENDING_LOSS, None)
            if b.deferred:
                b.deferred = [(k, a) for k, a in b.deferred if k != _PENDING_LOSS]
            self._aside(b, row, hist is not None)

    def _aside(self, b, row, hist: bool) -> None:
        """Keep the losses later_backward took out (one number each), in case the script
        applies gradients it wrote itself: PCGrad's, projected from each task's backward
        with zero_grad() between them; DP-SGD's, clipped per micro-batch and summed by hand.
        Their sum is the objective then ($loss was the last task's 0.8089 where the tasks'
        sum is 5.1778; written into the last backward's tensors, ``p.grad.copy_(g)`` or
        ``p.grad.data = g``, the last task's 10.64 where the sum is 14.70).  A loss of several elements is not kept (the step's loss stays the
        last backward's, as before)."""
        prev = self._set_aside
        if prev is not None and prev[0] is b:
            row = None if prev[1] is None or row is None else S.add_scalar_rows(prev[1], row, self._loss_dtype)
            hist = hist or prev[2]
        self._set_aside = (b, row, hist)
        self._grads_after = None

    def _step_params(self) -> list:
        return [p for _, plan in self._plans.values() for p in plan.params] or list(self.naming.root_params())

    def _put_back(self, opt) -> None:
        """At ``opt``'s step: the losses set aside go back into the step's loss if the
        gradients it applies are not those the last backward() left (the script wrote them)."""
        b, row, hist = self._set_aside
        grads = self._grads_after
        self._set_aside = self._grads_after = None
        if b is not self._buckets[-1] or row is None or not grads:
            return
        mine = {id(p) for p in self._plan(opt).params}
        # The script wrote them: a new tensor (p.grad = ...), new storage (p.grad.data = ...), or
        # the same one written in place (p.grad.copy_(...): its version moved), unless a clip or a
        # GradScaler's unscale_, which scale the last backward's gradients in place, came between
        # (a clip of each micro-batch's gradients before it does not count).
        scaled = self._clip_calls > self._clips_before or self.scaler_seen
        if all(ref() is p.grad and p.grad.data_ptr() == ptr and (scaled or p.grad._version == version)
               for p, ref, version, ptr in grads if id(p) in mine):
            return                     # (SAM's, FGSM's: the last backward's gradients are applied)
        now = b.entries.get(_PENDING_LOSS)
        total = row if now is None else S.add_scalar_rows(row, now, self._loss_dtype)
        if total is None:
            return
        b.entries[_PENDING_LOSS] = total
        self._parts = None
        if hist:
            b.add_hist(("loss", _PENDING), None)      # (a scalar loss's: the histogram of the sum)

    def backward_without_loss(self) -> None:
        self._cur.backward_count += 1

    def _plan(self, opt) -> ParamPlan:
        lists = list(map(_PARAMS, opt.param_groups))
        signature = (tuple(map(id, lists)), tuple(map(len, lists)))      # (C calls only: once a step)
        cached = self._plans.get(opt)
        if cached is None or cached[0] != signature:
            cached = (signature, ParamPlan([p for ps in lists for p in ps]))
            self._plans[opt] = cached
            # (or several in the run: a GAN's generator that first steps later, its loss through
            # the discriminator meanwhile: _credit)
            self.reaching = len(self._plans) != 1 or len(self._known) > 1
            self._shared_ids = shared_params({*self._known, *self._plans.keys()})
        return cached[1]

    def held_tensors(self) -> list:     # (info memory: the large parameters' values until a step ends)
        return [t for snap in [*self._snapshots.values(), *(self._manual_pending or ())[3:4]] for t in snap.large_before]

    def optimizer_pre(self, opt, others=()) -> None:
        """``opt`` steps; ``others``: the run's other optimizers (``_credit``, ``shared_params``)."""
        self._in_step = False
        self._known = others
        if self._set_aside is not None:
            self._put_back(opt)
        if self._parts is not None and self.reaching:
            self._credit(opt, others)
        ft = self.fulltensors
        if ft is not None and ft.rules and ft.wants("grad", self.step):
            ft.params(self.naming, self._plan(opt).params, "grad", self.step)
        if self.recording and not (self._snapshots and self._stepped_within(opt)):
            # (self._plan(opt), its usual case inline: every step)
            lists = list(map(_PARAMS, opt.param_groups))
            cached = self._plans.get(opt)
            if cached is None or cached[0] != (tuple(map(id, lists)), tuple(map(len, lists))):
                cached = (None, self._plan(opt))
            snap = self._snapshots[id(opt)] = cached[1].snapshot()
            if self._shared_ids is not None:
                self._share_before(snap)

    def _stepped_within(self, opt) -> bool:
        """Does ``opt`` step inside the ``step()`` of another optimizer whose snapshot holds every
        parameter of ``opt`` (a ZeroRedundancyOptimizer's shard optimizer, its ``.optim``; a
        Lookahead that subclasses torch.optim.Optimizer around its base optimizer)?  That step's
        rows, taken before and after the inner one's, are the step's whole change: a snapshot of
        the inner one recorded each of its parameters twice (``stats`` listed module.0.weight's
        value, update and gradient rows twice, and nndb said it was stepped by several
        optimizers).  Asked only while another optimizer's step is under way."""
        mine = {id(q) for g in opt.param_groups for q in g["params"]}
        return any(k != id(opt) and mine <= {id(q) for q in s.plan.params} for k, s in self._snapshots.items())

    def _share_before(self, snap) -> None:
        """Parameters that several optimizers hold (``_shared_ids``: the chatbot tutorial's
        embedding, shared by its encoder and its decoder, each with an optimizer over its own
        parameters()): the first optimizer to step one in a step keeps its value before that
        step, and a later one's snapshot takes it as its own value before, so that the later
        optimizer's update of it, the one the trace keeps, is the whole step's change (it was
        that optimizer's part alone: 0.8366 where the step changed the embedding by 1.0039).
        Nothing is done for the others (one check an optimizer step)."""
        if self._shared_step != self.step:
            self._shared_step, self._shared_before = self.step, {}
        kept, shared, plan = self._shared_before, self._shared_ids, snap.plan
        # (kept[id(p)] = (the plan that kept it, its value): a plan that meets its own value again
        # steps a second time in what the recorder still counts as the step, a step closed after
        # the fact: it keeps its value anew)
        if snap.host_before is not None and not plan._sharded:
            at = 0
            for p, n in zip(plan.host, plan.sizes):
                if id(p) in shared:
                    seg = snap.host_before[at:at + n]
                    old = kept.get(id(p))
                    if old is None or old[0] is plan:
                        kept[id(p)] = (plan, seg.copy())
                    elif old[1].shape == seg.shape and old[1].dtype == seg.dtype:
                        seg[...] = old[1]
                at += n
        for p, t in zip(plan.large, snap.large_before):
            if id(p) in shared:
                old = kept.get(id(p))
                if old is None or old[0] is plan:
                    kept[id(p)] = (plan, t.clone())
                elif isinstance(old[1], torch.Tensor) and old[1].shape == t.shape and old[1].dtype == t.dtype:
                    t.copy_(old[1])

    def step_raised(self) -> None:
        """An optimizer's step() raised (hooks: Tracer._step_raised): no step of it is taken."""
        self._in_step = None
        self._snapshots.clear()

    def optimizer_post(self, opt) -> None:
        self._in_step = None
        if self._clips_since_step:
            self._clips_since_step = []
        b = self._buckets[-1]
        b.optimizer_steps += 1
        entries = b.entries
        if self._grad_losses is not None:
            self._grads_loss(b, opt)
        if b.deferred or _PENDING_LOSS in b.hists or (_PENDING_LOSS in entries and ("loss", opt) in entries):
            b.attribute_losses(opt)
        elif _PENDING_LOSS in entries:       # (the step's loss is this optimizer's: attribute_losses, inline)
            entries[("loss", opt)] = entries.pop(_PENDING_LOSS)
        if self._held_back is not None:
            self._unhold()
        snap = self._snapshots.pop(id(opt), None)
        if self.recording and snap is not None:
            snap.record(b, self.full)
        # (with one optimizer too: one replaced by another (fine-tuning after pretraining, a
        # distilled student after its teacher) leaves its parameters' .grad as its last step
        # made it, and the next step recorded that as its own: the teacher's 0.weight grad
        # at the student's first step)
        # (_grad_mark inline, the plan the snapshot has: no Python call a parameter, every step)
        marks, ref = self._grad_marks, weakref.ref
        for p in (snap.plan if snap is not None else self._plan(opt)).params:
            g = p.grad
            marks[id(p)] = None if g is None else (ref(g), g._version)
        ft = self.fulltensors
        if ft is not None and ft.rules and ft.wants("param", self.step):
            ft.params(self.naming, self._plan(opt).params, "param", self.step)

    def _grads_loss(self, b, opt) -> None:
        """At ``opt``'s step: the losses of the ``torch.autograd.grad`` calls since the last one
        (grad_loss) are its loss where the step has none and no backward of it ran (the trace
        had no loss at all: '$loss' not measured, the loss rules and 'watch loss' blind)."""
        gb, row, dtype = self._grad_losses
        self._grad_losses = None
        if gb is not b or b.backward_count or any(k[0] == "loss" for k in b.entries):
            return
        b.entries[("loss", opt)] = row
        self._loss_dtype = dtype
        if self.full:
            b.add_hist(("loss", opt), None)

    def mark(self) -> None:
        """Start a new segment (used while the step clock learns a GAN's iteration).  The losses
        held for a later optimizer's step (``_credit``) go on into it, as that step will."""
        old, new = self._buckets[-1], _Bucket()
        self._buckets.append(new)
        if self.fulltensors is not None:
            self.fulltensors.mark()
        waiting = self._waiting
        if waiting is not None and waiting[0] is old and _PENDING_LOSS in old.entries:
            new.entries[_PENDING_LOSS] = old.entries.pop(_PENDING_LOSS)
            if _PENDING_LOSS in old.hists:
                new.hists[_PENDING_LOSS] = old.hists.pop(_PENDING_LOSS)
            self._parts = None if self._parts is None else (new, self._parts[1])
            self._waiting = (new, waiting[1])

    # -- closing -------------------------------------------------------------
    def close(self, step: int, retro: Optional[int] = None, final: bool = False, lead=None) -> None:
        """Close ``step``.  With ``retro``, only the first ``retro`` segments
        belong to it; the rest start the next step.  ``lead``: the optimizer whose
        loss is the step's first, where several stepped (_Bucket.lead_loss)."""
        if retro is not None:
            closed, rest = self._buckets[:retro], self._buckets[retro:]
        else:
            closed, rest = self._buckets, []
        p = self._pass
        if p is not None and any(p.home is b for b in closed):
            # (a step closes inside a root's forward: an optimizer step in it, test-time adaptation's
            # wrapper.  Its pass so far is the closing step's if a backward went through it (the step
            # had no activations: settled only as the pass ended, its step gone), the rest the next's)
            p.end()
            self._passes.append(p)
            self._pass = _Pass(None)
        if self._passes:
            self.settle_passes(closed)
        if self._set_aside is not None and self._set_aside[0] in closed:
            self._set_aside = self._grads_after = None
        grad_losses, self._grad_losses = self._grad_losses, None
        if self._waiting is not None:
            self._credit_waiting(closed)
        parts, self._parts, self._before = self._parts, None, None   # (a bucket of the step: its keys
        #                                                              hold optimizers and modules)
        bucket = closed[0] if len(closed) == 1 else _Bucket()
        if len(closed) != 1:
            for b in closed:
                bucket.merge(b)
        if bucket.deferred or bucket.blocks:
            bucket.resolve(self.full)
        if lead is not None and bucket.optimizer_steps > 1:
            bucket.lead_loss(lead)
        nxt = _Bucket()
        if rest:                        # (a step closed after the fact: the next one's segments so far)
            for b in rest:
                nxt.merge(b)
            nxt.renumber_clips()
            if parts is not None and [b for b in rest if _PENDING_LOSS in b.entries] == [parts[0]]:
                self._parts = (nxt, parts[1])   # (its pending losses, for _credit at its first step)
        self._buckets = [nxt]
        if grad_losses is not None and any(grad_losses[0] is b for b in rest):
            # (a torch.autograd.grad's loss of the next step, whose optimizer's step() closes this
            # one after the fact: a WGAN critic's second step, its gradients written to p.grad,
            # had no loss, '$losses' {} where the script's lossD was 7.137)
            self._grad_losses = (nxt, *grad_losses[1:])
        if self._pass is not None and self._pass.home is None:
            self._pass.home = nxt
        self._clips_since_step = []
        now = time.time() - self.t0
        recording, was_full = self.recording, self.full     # (the closed step's: the policy moves on below)
        self.step = step + 1
        if self.step >= self._policy_until:
            if self._policies is not None:
                *policy, self._policy_until = self._policies(self.step)
                self._policy = tuple(policy)
            else:
                self._policy, self._policy_until = (self.schedule(self.step), None, None), self.step + 1
        self.recording, full, acts = self._policy
        self.full = self.force_full or (full if full is not None else self._full_policy(self.step))
        self.acts = self.full or self.force_acts or (acts if acts is not None else self._acts_policy(self.step))
        if rest and not self.acts:
            nxt.drop_acts()
        if step == 0:
            self.naming.freeze()
            if self.fulltensors is not None:
                self.fulltensors.settle()
        if self.fulltensors is not None and self.fulltensors.held:
            # (after settle: what it held takes its settled name; nothing held, no call: every step)
            self.fulltensors.close(step, retro)
        if self.manual:
            self._close_manual(step, bucket, now, recording, final, was_full)
            return
        if recording:
            others = self._others
            if others[1] or others[0] != (self.naming.roots_version, len(bucket.covered)):
                self._other_params(bucket, was_full)
            rec = self.last = self._record(step, bucket, now, final)     # (self._emit, inline: every step)
            self.sink(rec)

    def has_open_work(self) -> bool:
        """Did anything happen since the last step closed?"""
        return not all(b.empty() for b in self._buckets)

    def finish(self) -> None:
        """The run ended: emit what is still pending."""
        self.end_manual()

    def end_manual(self) -> None:
        """Steps stop ending at ``backward()`` (an optimizer steps; one made
        before the run counts only then): the last such step's record, which
        waits for the next step's end, goes out now, before the next."""
        if self._manual_pending is not None:
            self._close_manual(None, None, time.time() - self.t0, False, True, self.full)

    def _other_params(self, bucket: _Bucket, full: bool) -> None:
        """param and grad of the model's parameters that no optimizer stepped."""
        key = (self.naming.roots_version, len(bucket.covered))
        if self._others[0] != key:
            self._others = (key, [weakref.ref(p) for p in self.naming.root_params() if id(p) not in bucket.covered])
        refs = self._others[1]
        if not refs:
            return
        others = [p for r in refs if (p := r()) is not None]
        if not others:
            return
        keys, items = [], []
        marks = self._grad_marks
        for p in others:
            keys.append(("param", p, "param"))
            items.append(p.detach())
            g = p.grad
            if g is not None:
                if not _same_grad(marks.get(id(p)), g):     # (not as the last step left it: this step's backward made it)
                    keys.append(("param", p, "grad"))
                    items.append(S.dense(g).detach())
                marks[id(p)] = _grad_mark(g)
        H.add_many(bucket, keys, items, full, bulk=True)

    def _close_manual(self, step, bucket, now, recording, final, full) -> None:
        """Hand-written updates: step N's value and update are known at the
        end of step N+1 (or of the run), measured as step N's policy says
        (``full``: full statistics at steps 0, 32...; they came a step early,
        at 31 and 30, until 2026-12)."""
        pend = self._manual_pending
        self._manual_pending = None
        if pend is not None:
            pstep, pbucket, ptime, snap, pfull = pend
            snap.record(pbucket, pfull, grads=False)
            pbucket.resolve(pfull)
            self._emit(pstep, pbucket, ptime)
            # (let go before the next plan is made: its tensors are the next plan's only where the
            # script still holds them; a tensor it made again, ``W = torch.randn(...)``, replaced
            # its first, which this snapshot kept alive, recorded at every later step)
            del pend, snap, pbucket
        # The step's parameters are those whose .grad its backward made (or added to): a tensor
        # it did not reach (the first model's, trained by hand before a second one made anew; a
        # layer the forward skipped) has its value recorded, as a parameter no optimizer stepped
        # has (_other_params), not a gradient its step did not make, nor an update of 0 that is
        # no update of the step's (param_not_updated named the first model's C, W1... at each
        # step of the second's training)
        marks, made, rest = self._grad_marks, [], []
        for p in self.naming.root_params():
            g = p.grad
            (rest if g is None or _same_grad(marks.get(id(p)), g) else made).append(p)
            marks[id(p)] = None if g is None else _grad_mark(g)
        if bucket is None or not recording:
            return
        plan = ParamPlan(made)
        g = plan.host_grads()
        if g is not None:
            bucket.blocks.append(g)
        keys, items = [], []
        for p in rest:
            keys.append(("param", p, "param"))
            items.append(p.detach())
        for p in plan.large:
            if p.grad is not None:
                keys.append(("param", p, "grad"))
                items.append(S.dense(p.grad).detach())
        H.add_many(bucket, keys, items, full, bulk=True)
        bucket.resolve(full)
        if final:
            self._emit(step, bucket, now, partial=True)
        else:
            self._manual_pending = (step, bucket, now, plan.snapshot(), full)

    def _hold(self, obj) -> int:
        """id(obj) for a cache key, watched: when obj goes, the id is forgotten."""
        i = id(obj)
        if obj is not None and i not in self._held:
            try:
                self._held[i] = weakref.ref(obj, lambda _, i=i, gone=self._gone: gone.append(i))
            except TypeError:            # (not weakly referable: held, as before)
                self._held[i] = obj
        return i

    def _forget_gone(self) -> None:
        if self._names_version != self.naming.roots_version:       # (names may resolve to others now)
            self._names_version = self.naming.roots_version
            self._names.clear()
        gone, self._gone[:] = set(self._gone), []
        for i in gone:
            self._held.pop(i, None)
        self._by_sig.clear()
        for key in [k for k in self._names if k[1] in gone]:
            del self._names[key]

    def _name(self, key) -> str:
        ikey = (key[0], self._hold(key[1]), *key[2:])
        name = self._names.get(ikey)
        if name is None:
            if key[0] == "act":
                base = self.naming.module_name(key[1])
                name = f"{base}#{key[2] + 1}" if key[2] else base
            elif key[0] == "loss":
                name = self._loss_name(key[1], key[2])
            elif key[0] == "clip":
                name = f"{CLIP_SERIES}#{key[2] + 1}" if key[2] else CLIP_SERIES
            else:
                name = self.naming.param_name(key[1])
                self._shapes[name] = list(key[1].shape)
                if type(key[1]).__name__ == "DTensor":    # (FSDP: the shard's shape too)
                    self._local_shapes[name] = list(S.local(key[1]).shape)
            self._names[ikey] = name
        return name

    def _loss_name(self, opt, qualified: bool) -> str:
        """``loss`` while no step has had two optimizers' losses; after one has, each
        optimizer's ``loss/<optimizer>``, except the loss already written as ``loss``
        (its optimizer's; a step's losses from step 0 on: none is)."""
        owner = self._loss_owner() if self._loss_owner is not None else None
        if not qualified:
            if opt is not None:
                self._loss_owner = weakref.ref(opt)
            return "loss"
        if opt is None:
            return "loss/(no optimizer)" if owner is not None else "loss"
        return "loss" if opt is owner else "loss/" + self.naming.optimizer_name(opt)

    def series_shape(self, name: str, kind: str, local: bool = False) -> Optional[list]:
        """The shape of a param, grad or update series' tensor (the rules tell weight matrices
        from biases by it); ``local``: of this rank's shard of a sharded (FSDP) one, else None."""
        return (self._local_shapes if local else self._shapes).get(name) if kind in ("param", "grad", "update") \
            else None

    def _names_of(self, b: _Bucket) -> list:
        """[(name, kind)] of the bucket's rows: entries, then the parameter blocks."""
        losses = [k for k in b.entries if k[0] == "loss"]
        if len(losses) > 1:
            self.naming.loss_qualified = True
        qualify = self.naming.loss_qualified
        names = []
        for key in b.entries:
            tag = key[0]
            if tag == "param":
                names.append((self._name(key[:2]), key[2]))
            elif tag == "loss":
                names.append((self._name(("loss", key[1], qualify)), "loss"))
            elif tag == "clip":
                names.append((self._name(key), "grad"))
            else:
                names.append((self._name(key), "act"))
        for plan, (with_grads, _) in b.params.items():
            names.extend(plan.names(self._name, with_grads, self._names_version))
        # The same list object for the same series, step after step: the writer
        # and the rules then know a layout by identity.
        if len(self._layouts) < 64:
            return self._layouts.setdefault(tuple(names), names)
        return self._layouts.get(tuple(names), names)

    def _say_shared(self, names: list, step: int) -> None:
        """A parameter that two optimizers hold and both stepped in the step (the chatbot
        tutorial's embedding, shared by its encoder and decoder, each with an optimizer over its own
        parameters()) has each one's value, update and gradient rows, under one name: the trace,
        ``history`` and ``$update`` keep the last one's, whose update is the step's whole change
        (``_share_before``); ``stats`` lists the earlier ones' too, their update their own part.
        Said once (``on_note``), as it first happens (once a layout: not a step's cost)."""
        seen, shared = set(), []
        for name, kind in names:
            if kind == "update":
                if name in seen and name not in self._said_shared:
                    shared.append(name)
                seen.add(name)
        if not shared or self.on_note is None:
            return
        self._said_shared.update(shared)
        more = f" and {len(shared) - 3} more" if len(shared) > 3 else ""
        self.on_note(f"nndb: note: {', '.join(shared[:3])}{more} "
                     f"{'is' if len(shared) == 1 else 'are'} stepped by several optimizers in step {step}: "
                     f"the trace, 'history' and $update keep the step's whole change; 'stats' also lists "
                     f"each earlier optimizer's value, update and gradient rows, its update its own part "
                     f"(docs/steps.md)")

    def provisional(self) -> Optional[StepRecord]:
        """A hand-written loop's step that has just ended, as far as it is
        known: its loss and gradients (its parameters and update come at the
        next step's end, with its real record).  None in other loops."""
        pend = self._manual_pending
        if pend is None:
            return None
        step, bucket, now, _, _ = pend
        copy = _Bucket()
        copy.merge(bucket)                 # (the pending bucket is the real record's: left as it is)
        return self._record(step, copy, now, False)

    def _emit(self, step: int, b: _Bucket, now: float, partial: bool = False) -> None:
        rec = self._record(step, b, now, partial)
        self.last = rec
        self.sink(rec)

    def _record(self, step: int, b: _Bucket, now: float, partial: bool) -> StepRecord:
        if b.deferred or b.blocks:
            b.resolve()
        if b.deferred or _PENDING_LOSS in b.entries or _PENDING_LOSS in b.hists:
            b.attribute_losses(None)
        # The step's series, by what was recorded (the same keys step after step: one lookup)
        if self._gone or self._names_version != self.naming.roots_version:
            self._forget_gone()
        params = b.params
        if len(params) == 1:                  # (one optimizer: no generator to run)
            (plan, (g, _)), = params.items()
            psig = ((id(plan), g),)
        else:
            psig = tuple((id(plan), g) for plan, (g, _) in params.items())
        keys = []
        for k in b.entries:            # (a loop, not a comprehension: no call of its own, every step)
            keys.append((k[0], id(k[1]), *k[2:]))
        sig = (tuple(keys), psig, self.naming.loss_qualified)
        names = self._by_sig.get(sig)
        if names is None:
            names = self._names_of(b)        # (holds every object of the signature: _name and below)
            if len(params) > 1:
                self._say_shared(names, step)
            for plan in params:
                self._hold(plan)
            if len(self._by_sig) < 64:
                self._by_sig[(sig[0], sig[1], self.naming.loss_qualified)] = names
        raws = [np.array(list(b.entries.values()))] if b.entries else []
        for _, rows in b.params.values():
            raws.append(rows)
        raw = np.concatenate(raws) if len(raws) > 1 else raws[0] if raws else np.zeros((0, S.N_RAW))
        rec = StepRecord(step, now, b.backward_count, b.optimizer_steps, names, raw, partial,
                         H.rows_of(b, len(names)) if (b.hists or b.param_hists) else None)
        if b.clip_limits:
            limits = {(f"{CLIP_SERIES}#{k[2] + 1}" if k[2] else CLIP_SERIES): v
                      for k, v in b.clip_limits.items() if k in b.entries}
            rec.clips = {k: v[:2] for k, v in limits.items()}
            rec.clip_params = {k: v[2] for k, v in limits.items()}
        return rec

