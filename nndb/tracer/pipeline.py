"""What a step boundary hands on, and to whom.

The recorder closes steps into ``StepRecord``s; at each step boundary the
recording hands a ``StepEnd`` (the step that ended, the records closed since
the last boundary) to an ordered list of listeners: the trace's (``WriteRecords``:
the records, the modules, the optimizers) first, then whatever joined the run (the
fingerprints; the debugger's rules, checkpoints, lineage and stop check; an exporter).  A listener is any object with ``on_step(end)``.
"""
from __future__ import annotations

import weakref
from typing import NamedTuple, Optional

_DEREF = weakref.ref.__call__


class StepEnd(NamedTuple):
    step: Optional[int]      # the step that just ended; None: the run's end (the last records)
    records: tuple           # StepRecords closed at this boundary, oldest first (a hand-written
    #                          loop's record of step N is closed at the end of step N+1)

    @property
    def record(self):
        """The newest record handed on here, or None."""
        return self.records[-1] if self.records else None


class Pipeline:
    """The recorder's sink and the tracer's step-end callback: records wait
    here until the boundary that closed them is handed on."""

    def __init__(self, listeners=(), on_error=None):
        self.listeners: list = list(listeners)
        self.on_error = on_error           # (message): a listener's failure, said once per listener
        self._failed: set = set()
        self._closed: list = []
        self.closed = self._closed.append     # (record): the recorder's sink (no Python frame a step)

    def step_ended(self, step: Optional[int]) -> None:
        records = tuple(self._closed)
        self._closed.clear()
        end = StepEnd(step, records)
        for listener in self.listeners:
            try:
                listener.on_step(end)
            except Exception as e:      # one listener's bug never costs the others (or the script) a step
                if id(listener) not in self._failed and self.on_error is not None:
                    self._failed.add(id(listener))
                    self.on_error(f"nndb: internal error in {type(listener).__name__} at a step end: "
                                  f"{type(e).__name__}: {e}")

    def run_ended(self) -> None:
        """Records closed as the run ended (no boundary of their own) go out."""
        if self._closed:
            self.step_ended(None)


class WriteRecords:
    """What the trace keeps at a step end, one listener (a step's calls are few): every
    record, appended; with ``naming``, the model's modules in registration order
    (``nn.Module`` attribute order; a module after the modules it holds), as the series
    name them, written at a step end when a root was added: what ``nndb plot`` orders
    layers by (the series' own order is the order they were first recorded); and, once
    ``watch_optimizers`` has named them, the optimizers as the rules see them (the
    parameters each group holds, each group's learning rate), written when they change,
    so that the rules that read them give the same findings on the trace
    (nndb.rules.offline).  It is the pipeline's first listener, before the debugger's
    rules, so that nothing the script does comes between the two.

    Per step: one tuple of the groups' parameter lists and learning rates, compared with
    the last; names only when they change.  ``changes`` counts the changes (the rules take
    a new snapshot of the optimizers only when it moves; None: unknown, after a failure)."""

    def __init__(self, writer, naming=None):
        self.writer = writer
        self.naming = naming
        self._version = None
        self.optimizers = None            # () -> the run's optimizers, in the order the rules get them
        # the same as weak references (the tracer's optimizer_refs), read without a call of
        # ours at every step end; ``optimizers()`` where one of them has gone
        self.refs: Optional[list] = None
        self.changes: Optional[int] = 0
        self._key = None                  # what the parameter lists were when last written
        self._where: list = []            # (optimizer name, group index) of each group, as written
        self._hypers = None               # the groups' (lr, weight_decay, momentum, betas), as written
        self._rows = None                 # what the last step had: (roots version, optimizers, rows)
        self._failed = False
        self._clips = None                # the clip_grad_norm_ calls' max_norm, as last written (StepRecord.clips)

    def watch_optimizers(self, optimizers, refs: Optional[list] = None) -> None:
        """Write the optimizers' groups and learning rates too (``optimizers()``: the run's)."""
        self.optimizers, self.refs = optimizers, refs

    def on_step(self, end: StepEnd) -> None:
        records = end.records
        for record in records:
            self.writer.append(record)
            clips = getattr(record, "clips", None)
            if clips != self._clips:          # (None, as last time: most steps)
                self._clips = clips
                self.writer.clips(record.step, clips)
        if not records:
            return
        naming = self.naming
        if naming is not None and naming.roots_version != self._version:
            self._modules(records[0].step)
        if self.optimizers is None or self._failed:
            return
        step = records[0].step
        try:
            opts = list(map(_DEREF, self.refs)) if self.refs is not None else None
            if opts is None or None in opts:
                opts = self.optimizers()
            # (one row per group; most steps it equals the last one and nothing more is done;
            # loops, not a comprehension: no call of their own, once a step)
            rows = []
            for o in opts:
                for g in o.param_groups:
                    ps, lr, wd, mo, be = g["params"], g.get("lr"), g.get("weight_decay"), g.get("momentum"), \
                        g.get("betas")
                    rows.append((id(o), id(ps), len(ps), lr if type(lr) is float else lr_number(lr),
                                 wd if type(wd) in _PLAIN else lr_number(wd),
                                 mo if type(mo) in _PLAIN else lr_number(mo),
                                 be if be is None or (type(be) is tuple and len(be) == 2 and type(be[0]) is float
                                                      and type(be[1]) is float) else _pair(be)))
            now = (naming.roots_version, len(opts), rows)
            if now == self._rows:
                return
            self._rows = now
            self.changes += 1
            key = (naming.roots_version, *map(id, opts), *[r[1:3] for r in rows])
            if key != self._key:
                self._rewrite(step, opts)
                self._key = key
            hypers = tuple([r[3:] for r in rows])
            if hypers != self._hypers:
                old = self._hypers
                for k, ((name, i), h) in enumerate(zip(self._where, hypers)):
                    if old is None or old[k] != h:
                        self.writer.hyper(step, name, i, *h)
                self._hypers = hypers
        except Exception:
            # Unknown from here on, said so in the trace: the rules on it fail rather than read stale values.
            self._failed = True
            self.changes = None
            self.writer.optimizers(step, None)
            raise

    def _modules(self, step: int) -> None:
        naming = self.naming
        self._version = naming.roots_version
        names: dict = {}
        for root in naming.roots():
            for m in _after_children(root, set()):
                names.setdefault(naming.module_name(m), type(m).__name__)
        self.writer.modules(step, list(names), list(names.values()))

    def _rewrite(self, step: int, opts: list) -> None:
        named = [(self.naming.optimizer_name(o), o) for o in opts]
        self.writer.optimizers(step, [{"name": n, "family": getattr(o, "family", None) or type(o).__name__,
                                       "groups": [[self.naming.param_name(p) for p in g["params"]]
                                                  for g in o.param_groups]} for n, o in named])
        self._where = [(n, i) for n, o in named for i in range(len(o.param_groups))]
        self._hypers = None       # (the groups may be others: every hyper-parameter again)


class CallAtStepEnd:
    """A plain ``callback(step)`` at each step boundary (scripts, tests)."""

    def __init__(self, callback):
        self.callback = callback

    def on_step(self, end: StepEnd) -> None:
        if end.step is not None:
            self.callback(end.step)


def _after_children(module, seen: set):
    """``module``'s modules in registration order, each after the modules it
    holds (a model's output after its layers'), each once."""
    if id(module) in seen:
        return
    seen.add(id(module))
    for child in module.children():
        yield from _after_children(child, seen)
    yield module


_PLAIN = (float, int, type(None))      # (a group's hyper-parameter kept as it is: no call a step)


def _pair(x) -> Optional[tuple]:
    """A group's ``betas`` as the trace keeps them: two numbers (lr_number's), else None."""
    try:
        a, b = x
    except (TypeError, ValueError):
        return None
    return lr_number(a), lr_number(b)


def lr_number(x) -> Optional[float]:
    """A param group's learning rate as the trace keeps it and the rules read it
    (nndb.rules.series.optimizer_lr): a Python number; a numpy scalar (DINO writes its
    schedules' np.float64 into the groups); a tensor of one real number on the CPU (torch's
    compiled-optimizer recipe, ``Adam(lr=torch.tensor(0.01))``, whose LR schedulers ``fill_``
    it: the rules read no lr there, and update_ratio took a cosine schedule's end at 0 for a
    learning rate far too low).  None for anything else, and for a tensor on an accelerator
    (reading it is a host transfer a step)."""
    if isinstance(x, (int, float)):
        return float(x)
    if type(x).__module__ == "numpy":
        return float(x) if getattr(x, "ndim", None) == 0 and x.dtype.kind in "iuf" else None
    if hasattr(x, "fill_"):
        import torch
        if isinstance(x, torch.Tensor) and x.numel() == 1 and x.device.type == "cpu" and not x.is_complex():
            return float(x.item())
    return None
