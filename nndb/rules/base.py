"""Rules: small objects that look at each recorded step and report findings.

A rule has a stable ``id`` (the contract with users and CI), a one-line
``explanation``, a ``severity`` (error, warning, info), an ``action`` when it
fires (``warn``: report and go on; ``stop``: stop into the REPL like a
breakpoint; ``fail``: like stop, and the run fails with exit code 4) and
documented ``THRESHOLDS`` (name -> Threshold(default, why)).  The YAML rule
file may change the action, severity and thresholds of any rule.

``check(ctx)`` is called with a StepContext and yields Findings: on every
recorded step for a rule that sets ``EVERY_STEP`` (those that read what every
step records: norms, NaN/Inf counts, the loss; nonfinite, the gradient,
update and loss rules; vectorised, a few numpy calls a step), else on the
*observed* steps (``nndb.cadence.observed``: every recorded step for the first
SETTLE steps, then one in OBSERVE_EVERY; such a rule's "consecutive steps" are
consecutive observed steps), and on any step for which one of its probes has
facts (probes keep their own cadence).  A rule keeps whatever history it needs on itself (``reset()``
starts a new run).  The invoker reports one finding per rule and tensor (or
module), at its first occurrence.

Rules that need more than the recorded statistics (a ReLU layer's units that
never fire, the inputs of the loss function...) name *probes* in ``PROBES``;
the invoker installs those probes only while such a rule is enabled, and their
facts for the step are in ``ctx.facts[probe_name]``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Optional

import numpy as np

# The observed steps are the cadence's, named here too because the rules count in them.
from ..cadence import OBSERVE_EVERY as EVERY, SETTLE, observed  # noqa: F401
from ..schema import STAT_NAMES
from ..tracer.stats import finalize_column

SEVERITIES = ("error", "warning", "info")
ACTIONS = ("warn", "stop", "fail")


def failing_findings(findings: list, fail_on: Optional[str]) -> list:
    """The findings (dicts) as severe as ``fail_on`` (``--fail-on``: warning,
    a warning or an error; error, an error) or worse; none without it."""
    if fail_on is None:
        return []
    worst = SEVERITIES.index(fail_on)          # (SEVERITIES: the worst first)
    return [f for f in findings if f.get("severity") in SEVERITIES[:worst + 1]]

STAT_INDEX = {n: i for i, n in enumerate(STAT_NAMES)}


@dataclass(frozen=True)
class Threshold:
    default: float
    why: str                    # where the default comes from


@dataclass
class Finding:
    rule: str
    severity: str
    step: int
    message: str
    tensor: Optional[str] = None
    module: Optional[str] = None
    evidence: dict = field(default_factory=dict)

    @property
    def subject(self) -> str:
        return self.tensor or self.module or ""

    def as_dict(self) -> dict:
        d = {"rule": self.rule, "severity": self.severity, "step": self.step}
        if self.tensor is not None:
            d["tensor"] = self.tensor
        if self.module is not None:
            d["module"] = self.module
        d["message"] = self.message
        d["evidence"] = self.evidence
        return d


class StepContext:
    """One recorded step, as rules see it.

    ``rows(kind)`` -> [(name, stats row)] in recording order (forward order for
    activations); ``value(kind, name, stat)``; ``facts``: what the probes saw
    during the step; ``module_types``: activation series name -> module class
    name; ``optimizers``: [(name, optimizer)]; ``param_name(p)``; ``ending``:
    True on the last step judged as the script raised (a rule that waits for
    the next steps to confirm what it saw says it now: none will come)."""

    ending = False

    def __init__(self, record, stats: Optional[np.ndarray] = None, facts: Optional[dict] = None,
                 module_types: Optional[dict] = None, optimizers=(), naming=None):
        self.record = record
        self.step = record.step
        self._stats = stats                    # finalised lazily: most steps need a column or two
        self._cols: dict = {}
        self.facts = facts or {}
        # module_types and optimizers may be given as callables: computed on
        # first use (most steps no rule asks)
        self._module_types = module_types if module_types is not None else {}
        # (opt_source: what gave them, unchanged while they are: series.Restarts looks again when it is another)
        self._optimizers = self._named = self.opt_source = optimizers
        self.naming = naming
        self.names = record.names              # [(name, kind)], row order of ``stats``
        self._by_kind = None
        self._index = None
        self._masks: dict = {}
        # what the rules of the step share, computed once (nndb.rules.series.Layout.per_step)
        self.shared: dict = {}

    # Rules run on every step: prefer the vector forms (col, mask) to Python loops.
    @property
    def module_types(self) -> dict:
        if callable(self._module_types):
            self._module_types = self._module_types()
        return self._module_types

    @property
    def optimizers(self) -> list:
        if callable(self._optimizers):
            self._optimizers = self._optimizers()
        return list(self._optimizers)

    def judged(self) -> None:
        """The rules have judged the step: a rule may keep its context (NonFinite keeps
        the last clean step's), never the script's optimizers that it asked for (an
        optimizer the script lets go is gone; a later ask asks again)."""
        self._optimizers = self._named

    @property
    def stats(self) -> np.ndarray:
        """(series, 10) statistics of the step."""
        if self._stats is None:
            self._stats = self.record.stats
        return self._stats

    @property
    def nonfinite(self) -> bool:
        """Does some series of the step hold a NaN or Inf?  (From the raw rows
        in one numpy call, without finalising the statistics.)"""
        if self._stats is None:
            flag = getattr(self.record, "nonfinite", None)
            if flag is not None:
                return flag
        return bool(np.count_nonzero(self.col("nan_count")) or np.count_nonzero(self.col("inf_count")))

    def mean_of(self, i: int) -> float:
        """The mean of row ``i`` (a loss, read every step) without finalising a column."""
        if self._stats is not None:
            return float(self._stats[i, STAT_INDEX["mean"]])
        n, s, _, _, _, _, _, nan, inf = self.record.raw[i].tolist()
        finite = n - nan - inf
        if finite > 0:
            return s / finite
        return float(finalize_column(self.record.raw[i:i + 1], "mean")[0])    # (inf for an infinite loss)

    def col(self, stat: str) -> np.ndarray:
        """One statistic for every series of the step."""
        if self._stats is not None:
            return self._stats[:, STAT_INDEX[stat]]
        c = self._cols.get(stat)
        if c is None:
            c = self._cols[stat] = finalize_column(self.record.raw, stat)
        return c

    def mask(self, kind: str) -> np.ndarray:
        m = self._masks.get(kind)
        if m is None:
            m = np.fromiter((k == kind for _, k in self.names), dtype=bool, count=len(self.names))
            self._masks[kind] = m
        return m

    def rows(self, kind: str) -> list:
        """[(name, stats row)] of one kind, in recording order."""
        if self._by_kind is None:
            self._by_kind = {}
            for i, (name, k) in enumerate(self.names):
                self._by_kind.setdefault(k, []).append((name, self.stats[i]))
        return self._by_kind.get(kind, [])

    def value(self, kind: str, name: str, stat: str) -> float:
        if self._index is None:
            self._index = {(n, k): i for i, (n, k) in enumerate(self.names)}
        i = self._index.get((name, kind))
        return math.nan if i is None else float(self.stats[i, STAT_INDEX[stat]])

    def has(self, kind: str, name: str) -> bool:
        return not math.isnan(self.value(kind, name, "count"))

    def param_name(self, p) -> str:
        return self.naming.param_name(p) if self.naming is not None else f"tensor{id(p):x}"


class Rule:
    id = ""
    severity = "warning"
    explanation = ""
    THRESHOLDS: dict = {}
    PROBES: tuple = ()
    EVERY_STEP = False          # run on every recorded step, not only on observed ones

    def __init__(self):
        self.action = "warn"
        self.enabled = True
        self.params = {k: t.default for k, t in self.THRESHOLDS.items()}

    def reset(self) -> None:
        """A new run starts: forget the history."""

    def resumed(self) -> None:
        """Switched on again (``rule enable``) after steps it did not see: those
        steps were recorded all the same (NonFinite must not call them missing)."""

    def threshold_problem(self, name: str, value: float) -> Optional[str]:
        """Why ``value`` cannot be threshold ``name``, or None.  A threshold is a
        finite number >= 0 (an infinite one would silently turn the rule off),
        a whole one where the default is (a count of steps or samples)."""
        what = f"threshold {name} of {self.id}"
        if not math.isfinite(value) or value < 0:
            return f"{what} must be a finite number >= 0, not {value!r}"
        if isinstance(self.THRESHOLDS[name].default, int) and not float(value).is_integer():
            return f"{what} is a count: a whole number, not {value!r}"
        return None

    def set_threshold(self, name: str, value: float):
        """Set one of THRESHOLDS; a whole number stays an int where the default is one.  The value set.
        ValueError if it is out of range (``threshold_problem``)."""
        problem = self.threshold_problem(name, value)
        if problem:
            raise ValueError(problem)
        if isinstance(self.THRESHOLDS[name].default, int) and float(value).is_integer():
            value = int(value)
        self.params[name] = value
        return value

    def check(self, ctx: StepContext) -> Iterable[Finding]:
        raise NotImplementedError

    def check_block(self, block) -> Optional[bool]:
        """Judge several steps at once (nndb.rules.block.Block): True when
        every step was judged, nothing found, and the rule's state is what
        ``check`` on each step would have left; None (nothing changed) to
        have ``check`` called on each step.  An every-step rule may define it."""
        return None

    def finding(self, ctx: StepContext, message: str, tensor: Optional[str] = None,
                module: Optional[str] = None, **evidence) -> Finding:
        return Finding(self.id, self.severity, ctx.step, message, tensor, module, evidence)

    def describe(self) -> dict:
        return {"id": self.id, "severity": self.severity, "action": self.action, "enabled": self.enabled,
                "explanation": self.explanation,
                "thresholds": {k: {"value": self.params[k], "default": t.default, "why": t.why}
                               for k, t in self.THRESHOLDS.items()}}
