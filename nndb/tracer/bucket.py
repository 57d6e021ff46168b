"""A step's recording as it builds up (the recorder's ``_Bucket``): the
rows of its series, in the order first seen, until the step closes into a
StepRecord (nndb.tracer.recorder)."""
from __future__ import annotations

import numpy as np

from . import histogram as H
from . import stats as S

_PENDING = object()   # a loss not yet attributed to an optimizer
_PENDING_LOSS = ("loss", _PENDING)
CLIP = object()       # ("clip", CLIP, i): the step's i-th clip_grad_norm_ total (schema.CLIP_SERIES)


class _Bucket:
    """What one step (or one segment of it) recorded.

    ``entries`` maps a series key to its raw row, in the order first seen:
    ``("act", module, use)``, ``("loss", optimizer)``,
    ``("param", tensor, kind)`` and ``("clip", CLIP, i)``.  Activations merge over calls (their
    elements together); scalar losses add up (the step's objective, whose
    gradient the optimizer applies, is the sum of what each ``backward()``
    received), a non-scalar loss's elements merge; a parameter row is
    replaced by a later one.  Small CPU tensors wait in
    ``deferred`` (key, array copy) and ``blocks`` (keys, flat, sizes) and are
    reduced in one numpy batch by ``resolve``.  ``params`` holds the rows of
    an optimizer's small parameters as one block (value, update and grad of
    each, in the plan's order), named once per plan.
    """
    __slots__ = ("entries", "deferred", "blocks", "params", "covered", "backward_count", "optimizer_steps",
                 "hists", "param_hists", "act_order", "clip_limits")

    def __init__(self):
        self.entries: dict = {}
        self.deferred: list = []
        self.blocks: list = []
        self.params: dict = {}           # ParamPlan -> (with grads, rows): an optimizer's small parameters
        self.covered: set = set()        # ids of parameters an optimizer recorded
        self.backward_count = 0
        self.optimizer_steps = 0
        self.hists: dict = {}            # series key -> histogram (full steps), as entries
        self.param_hists: dict = {}      # ParamPlan -> (rows, HIST_BINS), as params
        self.act_order: dict = {}        # activation keys in the order the modules ran (``saw_act``)
        self.clip_limits: dict = {}      # clip key -> (max_norm, scaled, the parameters): what clip_norm was told

    def add_hist(self, key, counts) -> None:
        """(after ``add`` of the same key's row)"""
        old = self.hists.get(key)
        if key[0] == "loss":
            v = S.scalar_of(self.entries.get(key))
            if v is not None:             # (a sum of scalar losses: the histogram of the one number)
                self.hists[key] = H.of_scalar(v)
                return
        self.hists[key] = counts if old is None or key[0] == "param" else old + counts

    def add(self, key, raw) -> None:
        """``raw``: an array, or a list (a scalar loss's row, stats.scalar_row)."""
        old = self.entries.get(key)
        if old is None or key[0] == "param" or key[0] == "clip":
            self.entries[key] = raw
            return
        if key[0] == "loss":
            total = S.add_scalar_rows(old, raw)
            if total is not None:
                self.entries[key] = total
                return
        self.entries[key] = S.merge_raw(np.asarray(old, dtype=float), np.asarray(raw, dtype=float))

    def saw_act(self, key) -> None:
        """An activation's key as its module returns, before its row is added or deferred:
        a large tensor's row goes into ``entries`` at once and a small one's waits for
        ``resolve``, which puts the activations back in this order."""
        if key not in self.act_order:
            self.act_order[key] = None

    def merge(self, other: "_Bucket") -> None:
        for key in other.act_order:
            self.saw_act(key)
        for key, raw in other.entries.items():
            self.add(key, raw)
        self.deferred.extend(other.deferred)
        self.blocks.extend(other.blocks)
        self.params.update(other.params)
        for key, h in other.hists.items():
            self.add_hist(key, h)
        self.param_hists.update(other.param_hists)
        self.clip_limits.update(other.clip_limits)
        self.covered |= other.covered
        self.backward_count += other.backward_count
        self.optimizer_steps += other.optimizer_steps

    def drop_acts(self) -> None:
        """No activation rows: segments recorded before the previous step was closed after
        the fact ran under its recording policy, which observed activations where the step
        they belong to does not (a later stage's first step at step 32, its second's forward
        recorded at step 33, an unobserved step; a replay, told of the handover, had none)."""
        self.entries = {k: v for k, v in self.entries.items() if k[0] != "act"}
        self.deferred = [(k, a) for k, a in self.deferred if k[0] != "act"]
        self.hists = {k: v for k, v in self.hists.items() if k[0] != "act"}
        self.act_order = {}

    def renumber_clips(self) -> None:
        """The ``clip_grad_norm_`` totals numbered from the step's first (``("clip", CLIP, 0)``):
        a step that begins with segments recorded before the previous step was closed after
        the fact (several optimizers, ``close(retro=...)``) counted the closed step's calls
        too, so its one call was ``clip_grad_norm_#2``."""
        old = sorted(k[2] for k in self.entries if k[0] == "clip")
        if not old or old == list(range(len(old))):
            return
        new = {i: j for j, i in enumerate(old)}
        self.entries = {(("clip", CLIP, new[k[2]]) if k[0] == "clip" else k): v for k, v in self.entries.items()}
        self.clip_limits = {("clip", CLIP, new[k[2]]): v for k, v in self.clip_limits.items() if k[2] in new}
        if any(k[0] == "clip" for k in self.hists):
            self.hists = {(("clip", CLIP, new[k[2]]) if k[0] == "clip" else k): v for k, v in self.hists.items()}

    def lead_loss(self, opt) -> None:
        """``opt``'s loss first among the step's losses (``$loss``, the stop line, predict's
        Loss column read the first): the loss of the optimizer that closes the steps, where
        another one steps in some of them only (a WGAN's generator, stepped once per
        n_critic critic steps, first in the critic step that follows it)."""
        key = ("loss", opt)
        if key not in self.entries:
            return
        first = next(k for k in self.entries if k[0] == "loss")
        if first[1] is opt:
            return
        row = self.entries.pop(key)
        entries, self.entries = self.entries, {}
        for k, v in entries.items():
            if k is first:
                self.entries[key] = row
            self.entries[k] = v

    def empty(self) -> bool:
        return not (self.entries or self.deferred or self.blocks or self.params
                    or self.backward_count or self.optimizer_steps)

    def attribute_losses(self, opt) -> None:
        """Losses seen since the last optimizer step belong to ``opt``."""
        pending = _PENDING_LOSS
        if pending in self.entries:
            key = ("loss", opt)
            if key in self.entries:
                self.add(key, self.entries.pop(pending))
            else:                         # (the usual step: its first loss of this optimizer)
                self.entries[key] = self.entries.pop(pending)
        if pending in self.hists:
            self.add_hist(("loss", opt), self.hists.pop(pending))
        if self.deferred:
            self.deferred = [(("loss", opt) if k == pending else k, a) for k, a in self.deferred]

    def resolve(self, full: bool = True) -> None:
        """Reduce the deferred arrays and blocks (one numpy batch) into entries."""
        if not (self.deferred or self.blocks):
            return
        keys = [k for k, _ in self.deferred]
        flats = [a for _, a in self.deferred]
        sizes = [a.size for a in flats]
        for block_keys, flat, block_sizes in self.blocks:
            keys.extend(block_keys)
            flats.append(flat)
            sizes.extend(block_sizes)
        flat = np.concatenate(flats)
        if full:
            rows, hists = H.full_segments(flat, sizes)
        else:
            rows = S.host_norm_segments(flat, sizes)
        for key, raw in zip(keys, rows):
            self.add(key, raw)
        if full:
            for key, h in zip(keys, hists):
                self.add_hist(key, h)
        self.deferred = []
        self.blocks = []
        self._order_acts()

    def _order_acts(self) -> None:
        """The activations' rows in the order their modules ran, where the small ones,
        reduced here, came after the large ones added as they ran (a GPT's lm_head, its one
        output above stats.HOST_MAX_ELEMENTS, was the step's first activation, and
        ``nonfinite`` said a NaN first appeared there when the first LayerNorm made it)."""
        acts = [k for k in self.act_order if k in self.entries]
        if len(acts) < 2 or [k for k in self.entries if k[0] == "act"] == acts:
            return
        entries, self.entries = self.entries, {}
        for k, v in entries.items():
            if k[0] != "act":
                self.entries[k] = v
            elif acts:
                for a in acts:
                    self.entries[a] = entries[a]
                acts = []
        for k, v in entries.items():           # (an activation no module call announced, if any)
            if k not in self.entries:
                self.entries[k] = v
