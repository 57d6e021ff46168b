"""``epoch_repeats`` and ``duplicate_batches`` in one process: the batches of
an epoch repeat the previous epoch's exactly while the data loader shuffles;
the same batch comes step after step while a DataLoader holds several (an
iterator made afresh at every step over a loader that does not shuffle).

The ``batches`` probe hands the rule each step's input checksum, taken by
the recording (nndb.tracer.fingerprint: the step's first forward with
autograd enabled), at the observed steps, those of the steps since (a
repeat is reported with the step it was complete at, up to 31 steps later), and whether the run's DataLoader
shuffles (its sampler, seen at step 0's end).  An epoch's boundary is where
the first batch comes back (nndb.rules.crossrank.EpochTracker): no
DataLoader needs to be found for that, but a loader that does not shuffle
repeats its epochs by design, so the rule speaks only when one is known to
shuffle: among the loaders of as many batches as the repeated epoch has
steps where there are such (the epoch is theirs: an ordered training loader
beside a shuffled validation loader repeats by design), else among all.  The same tracker runs per rank across ranks (``nndb inspect RUNDIR``).
"""
from __future__ import annotations

from .. import cadence
from .base import Finding, Rule, Threshold
from .crossrank import RULES, THRESHOLDS, EpochTracker, epoch_message, repeat_chance, shuffles
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
        if not new:
            return {}
        sizes = [d.get("batches") for d in fp.loaders or () if isinstance(d.get("batches"), int)]
        return {"inputs": new, "shuffle": shuffles(fp.loaders), "batches": max(sizes, default=None),
                "loaders": fp.loaders}

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
    THRESHOLDS = {"chance": THRESHOLDS["epoch_chance"]}
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
            if hit is None or hit[1] is None:
                continue
            # (the loaders of as many batches as the epoch had where known: the epoch is theirs)
            shuffle = shuffles(facts["loaders"], hit[1]) if facts.get("loaders") else facts["shuffle"]
            if shuffle is True:
                at, period = hit
                chance = repeat_chance(facts.get("loaders"), period)
                if chance > self.params["chance"]:
                    continue        # (a loader this small repeats its batches by chance)
                yield Finding(self.id, self.severity, at, epoch_message(at, period, chance=chance), None, None,
                              {"period": period, "first_step": at - period + 1, "chance": chance})


class DuplicateBatches(Rule):
    """The one-process side of ``duplicate_batches`` (across ranks:
    nndb.rules.crossrank): the input checksum does not change for ``steps``
    recorded steps in a row while a DataLoader of several batches is alive.
    A full-batch loop over one tensor, or a loader of one batch, is left
    alone (no loader of several batches).  Also: ``echoes`` batches in a row
    each come exactly k >= 2 times running while a DataLoader over an
    IterableDataset has num_workers == k: every worker yields the whole
    dataset (no ``get_worker_info()`` sharding), and the loader takes a batch
    from each in turn.  A script that steps on each batch twice on purpose
    (data echoing) is left alone over a map-style dataset, without workers,
    or echoing other than num_workers times; echoing exactly num_workers
    times over an IterableDataset looks the same and is reported."""
    id = "duplicate_batches"
    severity = "warning"
    explanation = ("the same input batch at every step while a DataLoader holds several (an iterator made "
                   "afresh each step over a loader that does not shuffle), or each batch num_workers times "
                   "running from a DataLoader over an IterableDataset (every worker yields the whole dataset: "
                   "no get_worker_info() sharding); across ranks: every rank received the same batch (no "
                   "DistributedSampler?)")
    THRESHOLDS = {
        "steps": Threshold(8, "consecutive recorded steps with one input checksum: a loader of several "
                              "batches gives another at its next step; eight in a row are no accident"),
        "echoes": Threshold(4, "batches in a row that each come exactly num_workers times running from an "
                               "IterableDataset's loader: a sharded one gives each once; four are no accident"),
    }
    PROBES = ("batches",)

    def reset(self) -> None:
        self._last = None          # (step, checksum) of the last step seen
        self._since = None
        self._run = 0
        self._done = False
        self._echo = (0, 0, None)  # (run length k >= 2, runs of exactly k in a row, their first step)

    def check(self, ctx):
        facts = ctx.facts.get("batches")
        if not facts or self._done:
            return
        need = int(self.params["steps"])
        for step, value in facts["inputs"]:
            last = self._last
            if last is not None and last[1] == value and step == last[0] + 1:
                self._run += 1
            else:
                if last is not None and step == last[0] + 1 and self._run >= 2:
                    k, runs, first = self._echo
                    self._echo = (k, runs + 1, first) if k == self._run else (self._run, 1, self._since)
                else:
                    self._echo = (0, 0, None)       # (a batch once, or a gap in the steps)
                self._run, self._since = 1, step
                found = self._echoed(facts.get("loaders"), last[0] if last else step)
                if found is not None:
                    self._done = True
                    yield found
                    return
            self._last = (step, value)
            batches = facts.get("batches")
            if self._run >= need and batches is not None and batches >= 2:
                self._done = True
                yield Finding(self.id, self.severity, step,
                              f"the same input batch at every step from step {self._since} to {step} "
                              f"({self._run} steps) while a DataLoader of {batches} batches is alive: the model "
                              f"trains on one batch (an iterator made afresh each step, next(iter(loader)), "
                              f"starts the epoch over; shuffle=False gives the same first batch each time)",
                              None, None, {"steps": [self._since, step], "loader_batches": batches})
                return

    def _echoed(self, loaders, step: int):
        """The finding, at ``step`` (the last of the runs), when ``echoes`` runs of exactly k
        equal batches came in a row while an IterableDataset's loader has k workers."""
        k, runs, first = self._echo
        if runs < int(self.params["echoes"]) or \
                not any(d.get("iterable") and d.get("workers") == k for d in loaders or ()):
            return None
        return Finding(self.id, self.severity, step,
                       f"each input batch came {k} times running from step {first} to {step} ({runs} batches, "
                       f"{runs * k} steps) while a DataLoader over an IterableDataset has num_workers={k}: "
                       f"every worker yields the whole dataset, and the model sees each batch {k} times (shard "
                       f"the data in __iter__ by torch.utils.data.get_worker_info())",
                       None, None, {"steps": [first, step], "repeats": k, "batches": runs, "workers": k})


RULES_HERE = [EpochRepeats, DuplicateBatches]
