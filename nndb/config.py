"""Plain configuration the core receives (the CLI builds it from flags)."""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from typing import Optional

from .errors import UsageError
from .launcher import Target
from .rules.base import EVERY as _OBSERVED_EVERY


# Activations (module outputs): every recorded step for the first ACT_SETTLE,
# then one in DEFAULT_ACT_EVERY (and at full steps): a pass over every module
# output is most of what recording costs a CNN (about 6% of its step); the
# same steps as the rules' observed ones.
DEFAULT_ACT_EVERY = _OBSERVED_EVERY
# All ten statistics every this many recorded steps (scripts/bench.py: measuring
# them on every step costs the small CNN ~1.4x instead of ~1.1x): on the
# observed steps.  A full step records activations, so one that is not also
# an observed step pays for them a second time (on the tiny MLP a full step
# off the observed ones cost ~1.8 ms more than a quiet one, on them ~0.2 ms
# more than the observed step it is).
DEFAULT_FULL_EVERY = DEFAULT_ACT_EVERY
ACT_SETTLE = 20


@dataclass(frozen=True)
class RecordSchedule:
    """Which steps are recorded: every ``every``-th step within [start, stop).
    A policy object: ``schedule(step) -> bool``.  ``full(step)``: whether all
    ten statistics are measured at that step (every ``full_every``-th recorded
    step); the steps between measure count, norm and NaN/Inf (see
    nndb.tracer.stats).  ``acts(step)``: whether module outputs are recorded
    at that step (the first ACT_SETTLE recorded steps, then every
    ``act_every``-th, and every full step)."""
    every: int = 1
    start: int = 0
    stop: Optional[int] = None
    full_every: int = DEFAULT_FULL_EVERY
    act_every: int = DEFAULT_ACT_EVERY

    def __call__(self, step: int) -> bool:
        if step < self.start or (self.stop is not None and step >= self.stop):
            return False
        return (step - self.start) % self.every == 0

    def full(self, step: int) -> bool:
        return (step - self.start) % (self.every * self.full_every) == 0

    def acts(self, step: int) -> bool:
        k, r = divmod(step - self.start, self.every)
        return r == 0 and (k < ACT_SETTLE or k % self.act_every == 0 or k % self.full_every == 0)

    @classmethod
    def parse(cls, every: Optional[int] = None, steps: Optional[str] = None,
              full_every: Optional[int] = None, act_every: Optional[int] = None) -> "RecordSchedule":
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
            f"the first {ACT_SETTLE} recorded steps, then every {self.act_every}"
        return (f"every {self.every} step(s) in {rng}, full statistics every {self.full_every} recorded step(s), "
                f"activations {acts}")


@dataclass
class RunConfig:
    target: Target
    trace_path: Optional[str] = None
    schedule: RecordSchedule = field(default_factory=RecordSchedule)
    flush_steps: int = 500
    flush_secs: float = 2.0
    quiet: bool = False


def default_trace_path(target: Target, rank: int = 0, world_size: int = 1,
                       directory: str = "nndb-runs") -> str:
    """A new file under ./nndb-runs/: <script>-<time>[-rankR].h5, never an existing one."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    suffix = f"-rank{rank}" if world_size > 1 else ""
    base = os.path.join(directory, f"{target.stem}-{stamp}{suffix}")
    path, i = base + ".h5", 1
    while os.path.exists(path):
        i += 1
        path = f"{base}-{i}.h5"
    return path
