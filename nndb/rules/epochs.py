"""``epoch_repeats`` in one process: the batches of an epoch repeat the
previous epoch's exactly while the data loader shuffles.

The ``batches`` probe hands the rule each step's input checksum, taken by
the recording (nndb.tracer.fingerprint: the step's first forward with
autograd enabled), at the observed steps, those of the steps since (a
repeat is reported with the step it was complete at, up to 31 steps later), and whether the run's DataLoader
shuffles (its sampler, seen at step 0's end).  An epoch's boundary is where
the first batch comes back (nndb.rules.crossrank.EpochTracker): no
DataLoader needs to be found for that, but a loader that does not shuffle
repeats its epochs by design, so the rule speaks only when one is known to
shuffle.  The same tracker runs per rank across ranks (``nndb inspect RUNDIR``).
"""
from __future__ import annotations

from .. import cadence
from .base import Finding, Rule
from .crossrank import RULES, EpochTracker, epoch_message, shuffles
from .probes import Probe, register


@register
class BatchChecksums(Probe):
    """No hook of its own: it reads what the recording's fingerprints took."""
    name = "batches"

    def __init__(self, rec):
        super().__init__(rec)
        self._fp = getattr(rec, "fingerprints", None)

    def take(self, step: int) -> dict:
        fp = self._fp
        if fp is None or fp.failed:
            return {}
        new = fp.take_fresh()
        return {"inputs": new, "shuffle": shuffles(fp.loaders)} if new else {}

    # Taken at the observed steps only (the steps since, several at once): a
    # probe armed at every step would have the engine judge every step.
    wants = staticmethod(cadence.observed)

    def install(self) -> None:
        if self._fp is not None:
            self._fp.keep_fresh = True
        super().install()

    def uninstall(self) -> None:
        if self._fp is not None:
            self._fp.keep_fresh = False
            self._fp.take_fresh()
        super().uninstall()


class EpochRepeats(Rule):
    id = "epoch_repeats"
    severity = RULES[id][0]
    explanation = RULES[id][1]
    PROBES = ("batches",)

    def __init__(self):
        super().__init__()
        self.reset()

    def reset(self) -> None:
        self._tracker = EpochTracker()

    def check(self, ctx):
        facts = ctx.facts.get("batches")
        if not facts:
            return
        for step, value in facts["inputs"]:
            hit = self._tracker.feed(step, value)
            if hit is not None and facts["shuffle"] is True:
                at, period = hit
                yield Finding(self.id, self.severity, at, epoch_message(at, period), None, None,
                              {"period": period, "first_step": at - period + 1})


RULES_HERE = [EpochRepeats]
