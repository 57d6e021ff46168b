"""The offline invoker: the rules of a RuleEngine run over a finished trace.

smdebug's split: one rule engine, two invokers.  Live, the debugger hands the
engine each StepRecord as the recorder closes it; here the same engine, with
the same rule objects, is handed the same sequence rebuilt from a trace
(``check_trace``), and its findings are those of the live run for every rule
that can run on a trace.

What a rule gets from a trace row (``TraceStep``): the step's series and their
ten statistics, finalised by the writer from the record's raw rows with the
same float64 arithmetic the live context uses (``StepContext.col`` and
``mean_of`` on raw rows give the same bits), stored as float64.

The optimizers, as far as the rules read them (``READS_OPTIMIZERS`` on the
rule: which optimizer and group holds each parameter, the group's learning
rate, a parameter's number of dimensions), come from the trace's
``optimizers`` and ``hyper`` rows and its series' shapes, as they were when
the live rules ran at each step (``TraceOptimizers``): stand-ins with the
optimizers' names and ``param_groups`` of stand-in parameters (``.dim()``),
and a naming that gives their names back.  A trace written before these were
recorded has none, and those rules do not run on it.

Other things a StepRecord has are not in a trace, and the rules that read them
do not run here (each is named, with the reason, in ``OfflineResult.skipped``):

* probes (``Rule.PROBES``): facts gathered by hooks in the live model and
  optimizers (dead ReLU units, the loss function's inputs, stale gradients),
  but for the ``batches`` probe, whose input checksums the trace keeps
  (``trace_facts``: ``epoch_repeats`` runs on a trace);
* anything else of the live run a rule says it needs (``LIVE_ONLY``);
* the order of a step's rows: a trace keeps each series' id, given in order of
  first appearance, so a step's rows are rebuilt in that order.  A training
  loop repeats its call order, which makes that the recording order within
  each kind; where a series first appears after others of its kind (a module
  called only from step N on) its place among them is not known, and rules
  that name the first tensor in recording order (``ROW_ORDER``) do not run.

The steps are those the live rules saw: every recorded step except the ones
the recorder closes at the end of the run (a step the run ended inside, and
with hand-written updates the last step, which waits for the next one), which
the live debugger never hands to its rules either.

A rule that asks a trace for the modules, or for the optimizers where the
trace does not hold them, gets an ``OfflineUnavailable`` error, which the
engine reports as a failed rule: never a made-up value.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Optional

import numpy as np

from ..store.rows import present as present_rows
from ..store.rows import stat_blocks
from .engine import RuleEngine

ORDER_REASON = "it names the first tensor in a step's recording order, which a trace does not keep"


class OfflineUnavailable(Exception):
    """A rule asked for part of the live run that a trace does not hold."""


def _unavailable(what: str):
    def ask():
        raise OfflineUnavailable(f"a trace does not keep {what}")
    return ask


@dataclass
class TraceStep:
    """A trace row as the rules see a StepRecord: the step's series in
    recording order (``names``) and their finalised statistics (``stats``,
    given to the engine directly: a trace has no raw accumulator rows)."""
    step: int
    time: float
    backward_count: int
    optimizer_steps: int
    names: list
    stats: np.ndarray
    partial: bool = False
    clips: Optional[dict] = None      # the step's clip_grad_norm_ calls (the trace's ``clips`` rows)


@dataclass
class Skipped:
    rule: str
    need: str           # what the trace lacks: a key of NEEDS
    reason: str


@dataclass
class OfflineResult:
    """What the rules found on a trace, and what they could not look at."""
    trace: str
    status: str                       # the trace's end status (finished, failed, incomplete...)
    steps_checked: int
    rules_run: list                   # rule ids
    findings: list                    # base.Finding, in the order the live run reports them
    actions: dict                     # rule id -> its action (warn, stop, fail)
    skipped: list = field(default_factory=list)      # Skipped: enabled rules that cannot run on a trace
    unchecked: list = field(default_factory=list)    # (step, why): trace rows the live rules never saw
    errors: list = field(default_factory=list)       # rules that failed (and were disabled), as live
    stored: list = field(default_factory=list)       # the findings the live run kept in the trace (dicts)
    notes: list = field(default_factory=list)        # a rule file's name filters that matched no tensor

    @property
    def failed(self) -> bool:
        """Did a rule with the ``fail`` action fire (the live run's exit code 4)?"""
        return any(self.actions.get(f.rule) == "fail" for f in self.findings)

    def all_findings(self) -> list:
        """The findings the run stored and those of this re-check, as dicts
        marked ``found_by`` (``merge_findings``)."""
        return merge_findings(self.stored, [f.as_dict() for f in self.findings])

    def to_dict(self) -> dict:
        return {"trace": self.trace, "status": self.status, "steps_checked": self.steps_checked,
                "rules_run": list(self.rules_run), "findings": self.all_findings(),
                "skipped": [{"rule": s.rule, "need": s.need, "reason": s.reason} for s in self.skipped],
                "unchecked_steps": [{"step": st, "reason": why} for st, why in self.unchecked],
                "errors": list(self.errors), "notes": list(self.notes)}


# -- the run's findings and the re-check's -----------------------------------------------------

RUN, RECHECK = "run", "check-trace"


def _finding_key(f: dict) -> tuple:
    return f.get("rule"), f.get("step"), f.get("tensor"), f.get("module")


def merge_findings(stored: list, rechecked: list) -> list:
    """One list of findings (dicts) from the live run's (``stored``: the
    trace's ``records("finding")``) and an offline re-check's, in step order
    (the run's first within a step), each marked ``found_by``: ``["run"]``
    (the live run alone: its probes, or rules the re-check did not run),
    ``["check-trace"]`` (the re-check alone: a rule the run did not have, or
    a trace written before findings were kept) or both.  A finding is the
    same one when its rule, step and tensor or module are."""
    out, index = [], {}
    for f in stored:
        d = dict(f, found_by=[RUN])
        index.setdefault(_finding_key(d), d)
        out.append(d)
    for f in rechecked:
        same = index.get(_finding_key(f))
        if same is not None:
            if RECHECK not in same["found_by"]:
                same["found_by"].append(RECHECK)
            continue
        out.append(dict(f, found_by=[RECHECK]))
    steps = [f.get("step") if isinstance(f.get("step"), int) else -1 for f in out]
    return [f for _, _, f in sorted(zip(steps, range(len(out)), out))]


def stored_findings(reader) -> list:
    """The findings the live run kept in the trace, marked ``found_by: ["run"]``."""
    return merge_findings(reader.records("finding"), [])


# -- what a trace can serve -----------------------------------------------------------------

# What a trace lacks, by the kind of need: the phrase a summary line gives for each.
NEEDS = {
    "probes": "they watch the live model and optimizers through probes",
    "optimizers": "they read the optimizers and the parameters' shapes, which this trace does not hold",
    "live": "they read parts of the live run that a trace does not keep",
    "order": "they name the first tensor in a step's recording order, which this trace cannot give back",
}


def offline_reason(rule, order_doubt: Optional[str] = None, no_optimizers: Optional[str] = None,
                   served: frozenset = frozenset()) -> Optional[tuple]:
    """(need, why) if ``rule`` cannot run on this trace (need: a key of NEEDS), else None.
    ``no_optimizers``: why the trace cannot give the optimizers back (None: it can);
    ``served``: the probes whose facts the trace holds (``trace_facts``)."""
    if rule.PROBES and not set(rule.PROBES) <= served:
        return "probes", f"it needs the probe{'s' if len(rule.PROBES) > 1 else ''} {', '.join(rule.PROBES)}, " \
                         "which watch the live model and optimizers"
    reads = getattr(rule, "READS_OPTIMIZERS", "")
    if reads and no_optimizers is not None:
        return "optimizers", f"it reads {reads}, and {no_optimizers}"
    live = getattr(rule, "LIVE_ONLY", "")
    if live:
        return "live", live
    if order_doubt is not None and getattr(rule, "ROW_ORDER", False):
        return "order", f"{ORDER_REASON}, and {order_doubt}"
    return None


def order_doubt(reader, present: np.ndarray) -> Optional[str]:
    """Why the rows of some step cannot be put back in recording order within
    their kind (a series first seen after others of its kind), or None."""
    if present.shape[0] < 2 or present.shape[1] == 0:
        return None
    series = reader.series()
    kinds = np.array([s.kind for s in series])
    ever = present.any(axis=0)
    first = np.where(ever, present.argmax(axis=0), -1)
    for i in np.unique(first[first > 0]).tolist():
        new = first == i
        old = present[i] & (first < i) & (first >= 0)
        for j in np.flatnonzero(new).tolist():
            if np.count_nonzero(old & (kinds == kinds[j])):
                s = series[j]
                return (f"{s.kind} {s.name} first appears at step {int(reader.steps[i])}, after other "
                        f"{s.kind} series: where it came among them is not known")
    return None


def checked_live(reader) -> tuple:
    """(bool mask over the trace's rows: the steps the live rules saw,
    [(step, why)] for the others).  The recorder closes a step after the last
    step end the debugger hears of where the run ended inside it (``partial``);
    a hand-written loop's last step, whose record waits for the next step's end,
    is judged at the run's end (nndb.debugger.listeners), as here."""
    partial = np.asarray(reader.partial, dtype=bool)
    mask = ~partial
    return mask, [(int(reader.steps[i]), "the run ended inside it") for i in np.flatnonzero(partial).tolist()]


def trace_steps(reader, mask: Optional[np.ndarray] = None) -> Iterator[TraceStep]:
    """The trace's rows as TraceSteps (those in ``mask``), in order.  Steps with
    the same series share one ``names`` list, as the recorder's records do
    (the rules recognise a step's layout by it)."""
    series = reader.series()
    layouts: dict = {}
    clip_rows, c, clips = reader.clips() or [], 0, None
    for start, block in stat_blocks(reader):
        for j in range(block.shape[0]):
            i = start + j
            if mask is not None and not mask[i]:
                continue
            ids = np.flatnonzero(~np.isnan(block[j, :, 0]))
            key = ids.tobytes()
            names = layouts.get(key)
            if names is None:
                names = [(series[k].name, series[k].kind) for k in ids.tolist()]
                if len(layouts) < 256:
                    layouts[key] = names
            step = int(reader.steps[i])
            while c < len(clip_rows) and clip_rows[c]["step"] <= step:
                rows = clip_rows[c]["clips"]
                clips = None if rows is None else {k: tuple(v) for k, v in rows.items()}
                c += 1
            yield TraceStep(step, float(reader.times[i]), int(reader.backward_count[i]),
                            int(reader.optimizer_steps[i]), names, block[j, ids, :], bool(reader.partial[i]),
                            clips)


# -- the optimizers, as the live rules saw them ---------------------------------------------

PREDATES = "the trace predates the optimizers' records (written by an nndb that did not keep them)"
NOT_GIVEN = "the trace holds no record of the optimizers (its writer was not given them)"


class TraceParam:
    """A parameter as a trace knows it: its name and number of dimensions
    (None where no series of it has a shape: no rule looks it up then)."""
    __slots__ = ("name", "ndim")

    def __init__(self, name: str, ndim: Optional[int]):
        self.name, self.ndim = name, ndim

    def dim(self) -> Optional[int]:
        return self.ndim


class TraceOptimizer:
    """An optimizer as a trace knows it: its name, ``param_groups``
    ([{"params": [TraceParam], "lr": float or None}]) and ``family``, its class
    name (None in a trace written before it was recorded)."""

    def __init__(self, name: str, param_groups: list, family: Optional[str] = None):
        self.name, self.param_groups, self.family = name, param_groups, family


class TraceNaming:
    """What a StepContext's ``naming`` answers on a trace: the stand-ins'
    names, and every parameter with a shape as the models' parameters (the
    rules ask them only for the dimensions of the parameters recorded)."""

    def __init__(self, params: dict):
        self._params = params            # name -> TraceParam

    def param_name(self, p) -> str:
        return p.name

    def optimizer_name(self, opt) -> str:
        return opt.name

    def root_params(self) -> list:
        return list(self._params.values())


class TraceOptimizers:
    """The trace's ``optimizers`` and ``hyper`` rows replayed step by step:
    ``advance(step)``, then ``current()`` is [(name, TraceOptimizer)] as the
    live rules got them at that step.  ``why``: why they cannot be given back
    (None: they can)."""

    def __init__(self, reader):
        self._holders = reader.optimizers()
        self._hyper = reader.hyper()
        if self._holders is None or self._hyper is None:
            self.why: Optional[str] = PREDATES
        elif not self._holders:
            self.why = NOT_GIVEN
        else:
            self.why = None
        ndims = {s.name: len(s.shape) for s in reader.series() if s.shape is not None}
        self.params = {n: TraceParam(n, d) for n, d in ndims.items()}
        self.naming = TraceNaming(self.params)
        self._h = self._l = 0                 # rows of each applied so far
        self._state: Optional[list] = None    # [(name, TraceOptimizer)]; None: not known at this step
        self._groups: dict = {}               # (optimizer, group) -> its group dict in _state
        self._lrs: dict = {}                  # (optimizer, group) -> the last learning rate written
        self._step: Optional[int] = None
        # what a StepContext's optimizers come from, as the live session's (series.Restarts):
        # ``state.changes`` counts the optimizers' rows applied
        self.state = self
        self.changes = 0

    def __call__(self) -> list:
        return self.current()

    def _param(self, name: str) -> TraceParam:
        p = self.params.get(name)
        return p if p is not None else TraceParam(name, None)

    def advance(self, step: int) -> None:
        self._step = step
        holders, hyper = self._holders or (), self._hyper or ()
        while self._h < len(holders) and holders[self._h]["step"] <= step:
            opts = holders[self._h]["optimizers"]
            self._h += 1
            self.changes += 1
            if opts is None:              # the recording could not say from here on
                self._state, self._groups = None, {}
                continue
            self._state, self._groups = [], {}
            for o in opts:
                groups = [{"params": [self._param(n) for n in names]} for names in o["groups"]]
                for i, g in enumerate(groups):
                    self._groups[(o["name"], i)] = g
                self._state.append((o["name"], TraceOptimizer(o["name"], groups, o.get("family"))))
            for key, g in self._groups.items():
                if key in self._lrs:
                    g["lr"] = self._lrs[key]
        while self._l < len(hyper) and hyper[self._l]["step"] <= step:
            row = hyper[self._l]
            self._l += 1
            key = (row["optimizer"], int(row["group"]))
            self._lrs[key] = row["lr"]
            g = self._groups.get(key)
            if g is not None:
                g["lr"] = row["lr"]

    def current(self) -> list:
        if self._state is None or any("lr" not in g for g in self._groups.values()):
            raise OfflineUnavailable(f"the trace does not hold the optimizers at step {self._step}")
        return list(self._state)


def trace_facts(reader) -> tuple:
    """(the probes a trace serves, step -> their facts): the ``batches``
    probe's input checksums, from the trace's fingerprints (nndb.tracer.fingerprint),
    one step each as the live probe hands them on the CPU; and of the ``loss_inputs``
    probe only what the loss is (its "loss_kind" records: ``surrogate``, which
    loss_not_decreasing reads), which does not make the probe served."""
    by_step: dict = {}
    for r in reader.records("loss_kind"):
        if isinstance(r.get("step"), int):
            by_step.setdefault(r["step"], {})["loss_inputs"] = {"surrogate": {"kind": r.get("kind"),
                                                                              "where": r.get("where")}}
    rows = reader.fingerprints()
    if rows is None:
        return frozenset(), by_step
    from .crossrank import shuffles
    loaders = next((r["loaders"] for r in rows if "loaders" in r), None)
    shuffle = shuffles(loaders)
    sizes = [d.get("batches") for d in loaders or () if isinstance(d.get("batches"), int)]
    most = max(sizes, default=None)
    served = False
    for r in rows:
        for step, value in r.get("inputs", ()):
            served = True
            by_step.setdefault(int(step), {})["batches"] = {"inputs": [(int(step), value)], "shuffle": shuffle,
                                                            "batches": most, "loaders": loaders}
    return (frozenset({"batches"}) if served else frozenset()), by_step


# -- the invoker ----------------------------------------------------------------------------

def check_trace(reader, engine: RuleEngine) -> OfflineResult:
    """Run ``engine``'s enabled rules that a trace can serve over the steps of
    ``reader`` the live rules saw.  The engine starts afresh (``attach``) and
    is left with its rules enabled as they were."""
    mask, unchecked = checked_live(reader)
    doubt = order_doubt(reader, present_rows(reader))
    opts = TraceOptimizers(reader)
    served, facts = trace_facts(reader)
    skipped, run = [], []
    for r in engine.rules:
        if not r.enabled:
            continue
        why = offline_reason(r, doubt, opts.why, served)
        if why is None:
            run.append(r.id)
        else:
            skipped.append(Skipped(r.id, *why))
    result = OfflineResult(reader.path, reader.status, 0, run, [], {r.id: r.action for r in engine.rules},
                           skipped, unchecked, stored=reader.records("finding"))
    engine.attach(None)
    for s in skipped:
        engine.set_enabled(s.rule, False)
    # (the engine's own module_types answers {} without a run: the trace's classes of the
    # modules where it keeps them, else a rule asking must fail instead)
    types = reader.module_types()
    engine.module_types = (lambda: types) if types is not None else _unavailable("the model's modules")
    optimizers = _unavailable("the optimizers") if opts.why is not None else opts
    naming = opts.naming if opts.why is None else None
    try:
        for step in trace_steps(reader, mask):
            result.steps_checked += 1
            opts.advance(step.step)
            result.findings.extend(engine.on_record(step, step.stats, optimizers, naming,
                                                    facts=facts.get(step.step)))
            result.errors.extend(engine.take_errors())
        from .yamlfile import unmatched_notes
        result.notes = unmatched_notes(r for r in engine.rules if r.enabled)
    finally:
        del engine.module_types
        for s in skipped:
            engine.set_enabled(s.rule, True)
        engine.detach()
    return result
