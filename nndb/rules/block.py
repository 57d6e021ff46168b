"""Several recorded steps judged together by the every-step rules.

The every-step rules (nndb.rules.base: ``EVERY_STEP``) read what every step
records: norms, NaN/Inf counts, the loss.  Judged one step at a time, each
rule pays its numpy calls once a step between PyTorch's kernels, with the
caches cold: on a 1 ms step that was a quarter of the step
(docs/performance.md).  On most steps no rule flags anything, and then the
steps can be judged as a block: one numpy call over a (steps x tensors)
matrix tells that nothing is flagged in any of them.

The contract (``Rule.check_block``): a rule either judges every step of the
block, leaving exactly the state that ``check`` called on each step in turn
would leave, and returns True (it found nothing: a block never reports); or
it returns None without having changed anything that ``check`` would not
change in the same way, and the engine runs ``check`` on each step.  So the
findings, their steps and their evidence are those of step-by-step
judgement; only the moment they are printed may come up to a block later.

The engine (nndb.rules.engine) gathers a block only on steps where nothing
may stop: no probe facts, not an observed step, every every-step rule's
action ``warn``; and the debugger flushes it before any stop, before a
checkpoint's fork and at the end of the run.
"""
from __future__ import annotations

import operator
from itertools import repeat
from typing import Optional

import numpy as np

from ..tracer.stats import N_RAW, NONFINITE_FIELDS, RAW_INF, RAW_N, RAW_NAN, RAW_SUM, finalize_column
from .series import layout

_NAMES = operator.attrgetter("names")
_RAW = operator.attrgetter("raw")


class Block:
    """Consecutive recorded steps with one list of series (``names``):
    ``records``, and ``last``, the StepContext of the last of them;
    ``sources``: each step's optimizers as its StepContext gets them
    (``opt_source``; the same object while they do not change)."""

    def __init__(self, records: list, last, sources: Optional[list] = None):
        self.records = records
        self.sources = sources if sources is not None else [last.opt_source] * len(records)
        self.k = len(records)
        self.last = last
        self.names = last.names
        self._raw = None
        self._takes: dict = {}
        self._lay: dict = {}

    @staticmethod
    def of(records: list, make_ctx, sources: Optional[list] = None) -> Optional["Block"]:
        """A Block (``make_ctx(record)``: its StepContext; ``sources``: each
        step's optimizers), or None when the steps do not share one list of series."""
        names = records[-1].names
        # (in C: no Python call per step, the same list object compares at once)
        if not all(map(operator.eq, repeat(names), map(_NAMES, records))):
            return None
        return Block(records, make_ctx(records[-1]), sources)

    @property
    def raw(self) -> np.ndarray:
        """(steps, series, N_RAW) raw rows."""
        if self._raw is None:
            self._raw = np.array(list(map(_RAW, self.records)))     # (np.stack: a Python call per step)
        return self._raw

    def layout(self, own) -> tuple:
        """(Tensors, Layout) as ``series.layout`` gives each step (the same for all)."""
        key = id(own)
        out = self._lay.get(key)
        if out is None:
            out = self._lay[key] = layout(self.last, own)
        return out

    def take(self, lay, kind: str, stat: str) -> np.ndarray:
        """(steps, parameters): ``Layout.take`` of every step, by the same
        function a step's ``ctx.col`` uses (on the rows taken, not the column)."""
        key = (id(lay), kind, stat)
        out = self._takes.get(key)
        if out is None:
            rows = lay.rows[kind]
            if rows.size == 0:
                out = np.zeros((self.k, 0))
            else:
                out = self.column(stat)[:, rows]
                if lay._missing[kind] is not None:
                    out[:, lay._missing[kind]] = np.nan
            self._takes[key] = out
        return out

    def derived(self, key, fn):
        """What the rules derive from the block, computed once (None included)."""
        if key in self._takes:
            return self._takes[key]
        out = self._takes[key] = fn()
        return out

    def column(self, stat: str) -> np.ndarray:
        """(steps, series): ``stat`` of every series of every step, finalised once for
        the rules' takes of every kind (row by row: each as ``ctx.col`` gives it)."""
        out = self._takes.get(stat)
        if out is None:
            raw = self.raw
            out = self._takes[stat] = finalize_column(raw.reshape(-1, N_RAW), stat).reshape(raw.shape[:2])
        return out

    def any_nonfinite(self) -> bool:
        """Does some series of some step hold a NaN or Inf?"""
        return bool(np.count_nonzero(self.raw[:, :, NONFINITE_FIELDS]))

    def loss_means(self, lay) -> Optional[np.ndarray]:
        """(steps, losses): each loss's mean, as ``ctx.mean_of`` gives it where
        the loss has finite elements; None if some step's has none (judged
        step by step: an infinite loss is finalised row by row)."""
        def means():
            rows = lay.loss_rows
            if rows.size == 0:
                return np.zeros((self.k, 0))
            r = self.raw[:, rows, :]
            finite = r[:, :, RAW_N] - r[:, :, RAW_NAN] - r[:, :, RAW_INF]
            return r[:, :, RAW_SUM] / finite if (finite > 0).all() else None
        return self.derived((id(lay), "loss"), means)      # (the loss rules and the gradients' each ask)
