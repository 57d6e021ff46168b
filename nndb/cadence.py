"""What nndb measures at which step: the recording cadence, one policy object.

In the spirit of ``torch.profiler.schedule``: ``Cadence`` answers, for a step
number, what is measured there.  ``cadence(step)``: is the step recorded
(``--every``, ``--steps``); ``full(step)``: are all ten statistics measured
(``--full-every``), else count, norm and NaN/Inf; ``acts(step)``: are module
outputs recorded (``--act-every``); ``at(step)``: all of it as one ``Measured``,
the rules' and probes' rhythms included, for docs and tests.

The rules' rhythms count absolute steps and do not follow the flags.  The
rules that read what every recorded step has (norms, NaN/Inf counts, the
loss: ``nonfinite``, the gradient, update and loss trends) run on every
recorded step; those that need activations or all ten statistics (the
probes' rules, ``bn_stats``) on the *observed* steps: each of the first
SETTLE steps, then one step in OBSERVE_EVERY (``observed``); the probes look
at steps of their own (``big_observed``, ``sampled``, ``bn_stats``, ``grad_reset``,
``grad_presence``).  They are plain module functions, read on the hot path as
cheaply as a constant; ``Cadence`` names them as static methods.

Only nndb.errors and the standard library are imported here: config, the
tracer and the rules all ask this module.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple, Optional

from .errors import UsageError

# The first steps, where the bugs of a run's start show (a wrong initial loss,
# units dead from the start): measured on every step.
SETTLE = 20
# What needs activations or all ten statistics (a layer dying, units
# saturating) is looked at on one step in OBSERVE_EVERY: an observed step costs
# the most of any (activations, all ten statistics, the probes); see
# docs/performance.md for how 32 was chosen.  (The gradient, update and loss
# trends read the norms every step records, and run on every step.)
OBSERVE_EVERY = 32
# Activations and all ten statistics default to the observed steps, so that a
# full step does not pay for activations a second time off them.
DEFAULT_ACT_EVERY = OBSERVE_EVERY
DEFAULT_FULL_EVERY = OBSERVE_EVERY
# A big activation is looked at by the unit probes on one observed step in
# BIG_EVERY, because a pass over it costs about as much as recording it.
BIG_EVERY = 2
# What does not change during a run (the data's scale, what the last layer
# outputs) is sampled on a module's first SAMPLE_CALLS calls, then on one step
# in SAMPLE_EVERY, a multiple of OBSERVE_EVERY so that the module hooks a
# sample needs are in anyway.
SAMPLE_CALLS = 10
SAMPLE_EVERY = 2 * OBSERVE_EVERY
# A missing zero_grad() is a pattern of the code, seen at any step: checked on
# the first RESET_FIRST steps (while a streak may be building), then on one
# step pair in RESET_EVERY.
RESET_FIRST, RESET_EVERY = 6, 50
# A parameter without a gradient is looked for on one step in PRESENCE_EVERY
# (and on every step once one lacks it: the probe's own state).
PRESENCE_EVERY = 10


def observed(step: int) -> bool:
    """Is ``step`` one the observed-step rules look at (and the unit and bn probes)?"""
    return step < SETTLE or step % OBSERVE_EVERY == 0


def big_observed(step: int) -> bool:
    """The observed steps a big activation is looked at (every 2nd step for
    the first 20, then every 64th)."""
    return (step // (1 if step < SETTLE else OBSERVE_EVERY)) % BIG_EVERY == 0


def sampled(step: int) -> bool:
    """The steps the input probes may sample (a module's first calls come in the first steps)."""
    return step < 2 * SAMPLE_CALLS or step % SAMPLE_EVERY == 0


def sample_call(calls: int, step: int) -> bool:
    """Is a module's call, after ``calls`` earlier ones, sampled at ``step``?"""
    return calls < SAMPLE_CALLS or step % SAMPLE_EVERY == 0


# BatchNorm's running statistics drift slowly, and the observed steps have the module hooks in.
bn_stats = observed


def grad_reset(step: int) -> bool:
    """Is the gradient's reset checked at the optimizer step of ``step``?"""
    return step < RESET_FIRST or step % RESET_EVERY in (0, 1)


def grad_reset_armed(step: int) -> bool:
    """A checked step, and the step before it (which keeps its gradient for the check)."""
    # (grad_reset of step and step + 1 written out: the engine asks at every step)
    return step < RESET_FIRST or step % RESET_EVERY in (0, 1) or (step + 1) % RESET_EVERY == 0


def grad_presence(step: int) -> bool:
    """Are the optimizers' parameters looked at for a missing gradient at ``step``?"""
    return step % PRESENCE_EVERY == 0


# The rhythms above of the form "step < first or step % every in phases": ``next_change``
# reads them, so that the rules put their probes in and out only at the steps where an
# answer changes (nndb.rules.engine.RuleEngine.arm), not by asking at every step.
_FORMS = {observed: (SETTLE, OBSERVE_EVERY, (0,)),
          sampled: (2 * SAMPLE_CALLS, SAMPLE_EVERY, (0,)),
          grad_reset_armed: (RESET_FIRST, RESET_EVERY, (0, 1, RESET_EVERY - 1)),
          grad_presence: (0, PRESENCE_EVERY, (0,))}


def next_change(fn, step: int) -> int:
    """The first step after ``step`` whose ``fn(step)`` may differ from ``step``'s: for
    this module's rhythms, the first that does; for a method of an object with its own
    ``next_change(step)`` (a probe whose rhythm depends on what it saw), that; else the
    next step."""
    form = _FORMS.get(fn)
    if form is None:
        own = getattr(getattr(fn, "__self__", None), "next_change", None)
        return own(step) if own is not None else step + 1
    first, every, phases = form
    if step < first:            # (True until ``first``; from there on the phases decide)
        return first if first % every not in phases else next_change(fn, first)
    # The answer can change only where a phase starts or ends (s % every == p or p + 1):
    # those steps of this period and the next two, in order (a scan step by step cost
    # ~400 bytecodes a call, at about one step in three).
    now = step % every in phases
    base = step - step % every
    for q in (base, base + every, base + 2 * every):
        for p in phases:
            for s in (q + p, q + p + 1):
                if s > step and (s % every in phases) != now:
                    return s
    return step + every + 1


class Measured(NamedTuple):
    """What ``Cadence.at(step)`` says is measured at one step."""
    recorded: bool          # count, norm and NaN/Inf of parameters, gradients, updates; the loss
    full: bool              # all ten statistics of every recorded tensor
    acts: bool              # module outputs (activations)
    observed: bool          # the observed-step rules run (the every-step rules run on every recorded step)
    big_acts: bool          # the unit probes look at activations above BIG_ELEMENTS
    input_probes: bool      # the input and loss-input probes may sample
    bn_stats: bool          # BatchNorm running statistics
    grad_reset: bool        # the stale-gradient check
    grad_presence: bool     # the missing-gradient check


@dataclass(frozen=True)
class Cadence:
    """Which steps are recorded: every ``every``-th step within [start, stop).
    ``full(step)``: all ten statistics, on every ``full_every``-th recorded
    step.  ``acts(step)``: module outputs, on the first SETTLE recorded steps,
    then every ``act_every``-th, and every full step."""
    every: int = 1
    start: int = 0
    stop: Optional[int] = None
    full_every: int = DEFAULT_FULL_EVERY
    act_every: int = DEFAULT_ACT_EVERY

    ACT_SETTLE: ClassVar[int] = SETTLE
    observed = staticmethod(observed)
    big_observed = staticmethod(big_observed)
    sampled = staticmethod(sampled)
    bn_stats = staticmethod(bn_stats)
    grad_reset = staticmethod(grad_reset)
    grad_presence = staticmethod(grad_presence)

    def __call__(self, step: int) -> bool:
        return self.policies(step)[0]        # (one step's answers: for docs and tests)

    def full(self, step: int) -> bool:
        return self.policies(step)[1]

    def acts(self, step: int) -> bool:
        return self.policies(step)[2]

    def policies(self, step: int) -> tuple:
        """(recorded, full, acts, until) of ``step``: the recorder's three questions, and the
        first later step whose answers may differ (the same answers hold for every step in
        [step, until)): the recorder asks again only there, about twice in OBSERVE_EVERY steps.
        Found by stepping forward in plain arithmetic (no call a step), at most SCAN steps."""
        start, every, stop, fe, ae = self.start, self.every, self.stop, self.full_every, self.act_every

        def answers(s):
            k, r = divmod(s - start, every)
            return (r == 0 and s >= start and (stop is None or s < stop), k % fe == 0 and r == 0,
                    r == 0 and (k < SETTLE or k % ae == 0 or k % fe == 0))
        # The answers can change only where one of their terms does: at ``start``, ``stop``,
        # the end of the first SETTLE recorded steps, and where a multiple of ``every``,
        # ``full_every`` or ``act_every`` recorded steps begins or ends; those steps in order
        # (a scan step by step cost ~1,100 bytecodes, twice in 32 steps).
        marks = {start, start + 1, start + SETTLE * every, start + SETTLE * every + 1}
        if stop is not None:
            marks.add(stop)
        for period in (every, fe * every, ae * every):
            base = start + (step - start) // period * period
            marks.update((base + 1, base + period, base + period + 1))
        now, limit = answers(step), step + self.SCAN
        for s in sorted(marks):
            if step < s < limit and answers(s) != now:
                return now + (s,)
        return now + (limit,)

    SCAN: ClassVar[int] = 512

    def at(self, step: int) -> Measured:
        """Everything measured at ``step`` (a new object: for docs and tests, not the hot path)."""
        rec = self(step)
        obs = rec and observed(step)
        return Measured(rec, rec and self.full(step), rec and self.acts(step), obs,
                        obs and big_observed(step), rec and sampled(step), rec and bn_stats(step),
                        rec and grad_reset(step), rec and grad_presence(step))

    @classmethod
    def parse(cls, every: Optional[int] = None, steps: Optional[str] = None,
              full_every: Optional[int] = None, act_every: Optional[int] = None) -> "Cadence":
        """From the flags ``--every``, ``--steps``, ``--full-every``, ``--act-every``."""
        if every is not None and every < 1:
            raise UsageError(f"--every must be a positive number of steps, not {every}")
        if full_every is not None and full_every < 1:
            raise UsageError(f"--full-every must be a positive number of steps, not {full_every}")
        if act_every is not None and act_every < 1:
            raise UsageError(f"--act-every must be a positive number of steps, not {act_every}")
        start, stop = 0, None
        if steps:
            text = steps.strip()
            if ":" not in text:
                raise UsageError(f"--steps takes A:B (for example 100:200 or 500:), not {steps!r}")
            a, b = text.split(":", 1)
            try:
                start = int(a) if a.strip() else 0
                stop = int(b) if b.strip() else None
            except ValueError:
                raise UsageError(f"--steps takes whole step numbers A:B, not {steps!r}") from None
            if start < 0 or (stop is not None and stop <= start):
                raise UsageError(f"--steps {steps}: need 0 <= A < B")
        return cls(every or 1, start, stop, full_every or DEFAULT_FULL_EVERY, act_every or DEFAULT_ACT_EVERY)

    def describe(self) -> str:
        rng = f"{self.start}:{'' if self.stop is None else self.stop}"
        acts = "every recorded step" if self.act_every == 1 else \
            f"the first {SETTLE} recorded steps, then every {self.act_every}"
        return (f"every {self.every} step(s) in {rng}, full statistics every {self.full_every} recorded step(s), "
                f"activations {acts}")

    def table(self, horizon: int = 200) -> list:
        """[(what is measured, the steps of [0, horizon) it is measured at, the flag
        that changes it)]: docs/commands.md's "what is recorded" table (scripts/gen_command_docs.py)."""
        rows = [
            ("count, norm, NaN/Inf of every parameter, gradient and update; all ten statistics "
             "of the loss", "recorded", "`--every`, `--steps`"),
            ("module outputs (activations): count, norm, NaN/Inf", "acts", "`--act-every`"),
            ("all ten statistics of every tensor, activations included", "full", "`--full-every`"),
            ("`nonfinite`, `exploding_gradient`, `vanishing_gradient`, `update_ratio`, `param_not_updated`, "
             "`loss_not_decreasing` (its trend judged on the observed steps), `loss_explodes`, `zero_gradients`, "
             "the rules of a rule file "
             "(between observed steps, while all of them only warn, judged together as a block of the steps between two observed ones (or 0.25 s), "
             "each step's findings as judged alone, all in before any stop)",
             "recorded", ""),
            ("the other rules (observed steps: they read activations or all ten statistics; a probe's "
             "rule also where its probe has facts)", "observed", ""),
            ("`dead_relu`, `saturated_activation`, `eval_mode_training` probes", "observed", ""),
            ("the same, on an activation above 2^18 elements", "big_acts", ""),
            (f"`input_range`, `initial_loss`, `loss_broadcast`, `double_softmax` probes (a module's "
             f"first {SAMPLE_CALLS} calls, then these steps)", "input_probes", ""),
            ("`bn_stats` probe", "bn_stats", ""),
            ("`clip_before_unscale` probe (at a GradScaler's `step()` after a `clip_grad_norm_`)", "recorded", ""),
            (f"`stale_grad` check (and each optimizer's own first {RESET_FIRST} steps, within {RESET_EVERY} "
             "of its first: one that steps once in a few steps, a WGAN's generator)", "grad_reset", ""),
            ("`grad_none` check (every step while a parameter lacks its gradient)", "grad_presence", ""),
        ]
        plans = [self.at(step) for step in range(horizon)]
        return [(what, _ranges([s for s, m in enumerate(plans) if getattr(m, key)], horizon), flag)
                for what, key, flag in rows]


def _ranges(steps: list, horizon: int) -> str:
    """The steps of [0, horizon) in words: ``[0, 1, 2, 32, 64, 96]`` -> ``"0-2, 32, 64, ...
    (one in 32)"``: the first runs, then the periodic tail shown twice."""
    runs = []
    for s in steps:
        if runs and runs[-1][1] == s - 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    if not runs:
        return "none"
    if len(runs) == 1 and runs[0][1] == horizon - 1:
        return "every step" if runs[0][0] == 0 else f"every step from {runs[0][0]}"

    def text(run):
        return str(run[0]) if run[0] == run[1] else f"{run[0]}-{run[1]}"

    def periodic(rs):             # equal runs at a constant stride
        return len(rs) >= 3 and len({b - a for a, b in rs}) == 1 and \
            len({rs[i + 1][0] - rs[i][0] for i in range(len(rs) - 1)}) == 1

    i = next((i for i in range(len(runs)) if periodic(runs[i:])), None)
    if i is None:
        return ", ".join(map(text, runs))
    head, tail = runs[:i], runs[i:]
    if periodic(head) and len(head) > 3:
        head = [head[0], head[1], None, head[-1]]
    stride = tail[1][0] - tail[0][0]
    what = "one step" if tail[0][0] == tail[0][1] else f"{tail[0][1] - tail[0][0] + 1} steps"
    words = [("..." if r is None else text(r)) for r in head] + [text(tail[0]), text(tail[1]), "..."]
    return f"{', '.join(words)} ({what} in {stride})"
