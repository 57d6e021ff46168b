"""The rules across ranks: pure functions over the ranks' fingerprint rows.

Each rank records, at every observed step, a row (nndb.tracer.fingerprint,
the trace's ``fingerprints``): checksums of its parameters and of each
step's input batch, its BatchNorm running statistics, and its step time
split into data loading and compute.  ``CrossRankJudge.feed(rows)`` judges
one observed step from the rows the ranks have for it (``{rank: row}``), in
step order, and returns the new findings; ``judge_job`` feeds it a finished
job's rows, read from the rank traces.  The front process of a live job
feeds the same judge the same rows as the ranks send them: the findings are
the same either way.  Each (rule, subject) is reported once, at its first
occurrence, as the single-process engine does.

``EpochTracker`` (``epoch_repeats``) reads one rank's sequence of input
checksums: the core of the rule each rank's own engine runs (nndb.rules.epochs),
live and on its trace.  It is not judged here again: a rank's epoch that
repeats is that rank's finding (judged here too, each cause was said twice,
once a rank and once across ranks).
"""
from __future__ import annotations

import math
import statistics
from typing import Iterable, Optional

from ..text import fmt
from .base import Finding, Threshold

RULES = {
    "rank_divergence": ("error", "a replicated (DDP) parameter differs across ranks after an optimizer step"),
    "duplicate_batches": ("error", "every rank received the same input batch (no DistributedSampler?)"),
    "epoch_repeats": ("warning", "an epoch's batches repeat the previous epoch's (the same samples in each "
                                 "batch) while the loader shuffles, where a reshuffle repeats them by chance "
                                 "less than once in a million (sampler.set_epoch missing?)"),
    "unsynced_batchnorm": ("info", "BatchNorm running statistics differ across ranks (no SyncBatchNorm)"),
    "straggler": ("warning", "one rank's step takes over 1.5x the median rank's, for several observed steps"),
}
THRESHOLDS = {
    "duplicate_steps": Threshold(2, "steps in a row whose batches are equal on every rank: one equal "
                                    "pair could be chance of a tiny dataset, two in a row is a pattern"),
    "straggler_ratio": Threshold(1.5, "the issue's 1.5x of the median rank's time"),
    "straggler_steps": Threshold(3, "observed steps in a row: one slow step is noise (a checkpoint, a log)"),
    "epoch_chance": Threshold(1e-6, "the chance a reshuffled epoch gives the same samples in each batch as "
                                    "the one before, at most: 1/6 for 4 samples in batches of 2, 1.6e-8 for 16 "
                                    "in batches of 4; a tiny loader repeats by chance"),
    "straggler_floor": Threshold(0.01, "seconds a rank must lose at least, so that a 0.1 ms jitter on a "
                                       "0.2 ms data load is not a straggler"),
}


def _finding(rule: str, step: int, message: str, tensor=None, module=None, **evidence) -> Finding:
    return Finding(rule, RULES[rule][0], step, message, tensor, module, evidence)


class EpochTracker:
    """``epoch_repeats`` on one sequence of (step, input checksum): the first
    batch comes back E >= 2 steps later (after other batches) and the E steps from there repeat
    the E before, checksum for checksum: the epoch repeated (found at its
    last step).  Fed in step order; a gap in the steps (``--every``) is
    skipped over (only steps present in both epochs are compared)."""

    # The longest epoch looked for, in steps: the checksums of a whole epoch
    # are kept until its first batch comes back (about 100 bytes a step).
    MAX_PERIOD = 200_000

    def __init__(self):
        self.seen: dict = {}            # step -> checksum
        self.first: Optional[tuple] = None
        self.period: Optional[int] = None
        self.start: Optional[int] = None     # the step the repeated epoch starts at
        self.found: Optional[tuple] = None   # (step, period)

    def feed(self, step: int, value: int) -> Optional[tuple]:
        """(step, period) once, when an epoch has repeated the previous one."""
        if self.found is not None or step in self.seen:
            return None
        self.seen[step] = value
        if self.first is None:
            self.first = (step, value)
            return None
        if self.period is not None:
            before = self.seen.get(step - self.period)
            if before is not None and before != value:
                self.period = self.start = None
            elif step >= self.start + self.period - 1:
                self.found = (step, self.period)
                return self.found
        if self.period is None and step - self.first[0] > self.MAX_PERIOD:
            self.found = (None, None)       # (the first batch never came back within MAX_PERIOD steps: stop)
            self.seen = {}
            return None
        if self.period is None and value == self.first[1] and step - self.first[0] >= 2:
            epoch = {self.seen[s] for s in range(self.first[0], step) if s in self.seen}
            if len(epoch) > 1:          # (one batch over and over is not an epoch)
                self.period, self.start = step - self.first[0], step
        return None


def _epoch_loaders(loaders: Optional[list], period: int) -> list:
    """The loaders an epoch of ``period`` steps can be the epoch of, each with
    its batches a step: those of a whole multiple of ``period`` batches, k a
    step (gradient accumulation over k micro-batches: a step's input checksum
    is its first micro-batch's, so an epoch of 8 batches, 2 a step, repeats in
    4 steps), of the fewest k (1: one batch a step, where there are such)."""
    sized = [d for d in loaders or () if isinstance(d.get("batches"), int) and d["batches"] >= period > 0]
    whole = [(d, d["batches"] // period) for d in sized if d["batches"] % period == 0]
    fewest = min((k for _, k in whole), default=None)       # (one a step first, then the fewest)
    return [(d, k) for d, k in whole if k == fewest]


def shuffles(loaders: Optional[list], period: Optional[int] = None) -> Optional[bool]:
    """Does the run's data loader shuffle: True if one does, False if every
    one is known not to, None when unknown (no DataLoader, an unknown sampler).
    With ``period`` (the steps of an epoch that repeated), the loaders whose
    epoch that can be alone where there are any (``_epoch_loaders``).  (A
    training loader in order by design beside a shuffled validation loader:
    its repeated epochs were reported "while the loader shuffles".)"""
    if not loaders:
        return None
    if period is not None:
        loaders = [d for d, _ in _epoch_loaders(loaders, period)] or loaders
    flags = [d.get("shuffle") for d in loaders]
    if any(f is True for f in flags):
        return True
    return False if all(f is False for f in flags) else None


def repeat_chance(loaders: Optional[list], period: int) -> float:
    """The chance that a loader which reshuffles every epoch gives the ``period``
    batches compared (each step's first) the same samples as the epoch before
    (the input checksum does not see the order of a batch's rows:
    ``fingerprint``).  A uniform shuffle of n samples into batches of sizes
    b1..bk (and r left over: ``drop_last``, or the batches no step starts
    with, k a step) makes n! / (b1!...bk! r!) batchings of them, equally likely.
    From the shuffling loader of the epoch (``_epoch_loaders``), where its
    sample count and batch size are known; else at most 1/period! (one sample
    a batch makes the fewest batchings).  (With 2 batches a step the fallback
    was the chance: 1/24 for 4 steps, and an epoch of 8 batches of 4 that
    repeated went unreported.)"""
    fallback = math.exp(-math.lgamma(period + 1))
    for d, per_step in _epoch_loaders(loaders, period):
        n, size, k = d.get("samples"), d.get("batch_size"), d.get("batches")
        if d.get("shuffle") is not True or not isinstance(n, int) or not isinstance(size, int) \
                or size < 1 or n < 1:
            continue
        sizes = [size] * k
        if not d.get("drop_last"):
            sizes[-1] = n - (k - 1) * size
        sizes = sizes[::per_step]               # (the batches the steps start with: the ones compared)
        left = n - sum(sizes)
        if left < 0 or min(sizes) < 1:
            continue
        log = math.lgamma(n + 1) - sum(math.lgamma(b + 1) for b in sizes) - math.lgamma(left + 1)
        return math.exp(-log)
    return fallback


def epoch_message(step: int, period: int, rank: Optional[int] = None, chance: Optional[float] = None) -> str:
    who = f"rank {rank}'s" if rank is not None else "the"
    odds = "" if chance is None else \
        f" (a reshuffle repeats them once in {fmt(1 / chance)})" if chance >= 1e-30 else \
        " (a reshuffle repeats them less than once in 1e+30)"
    return (f"{who} batches of steps {step - period + 1}-{step} repeat those of steps "
            f"{step - 2 * period + 1}-{step - period} (the same samples in each batch) while the loader "
            f"shuffles{odds}: an epoch of {period} steps repeated (a DistributedSampler without "
            f"sampler.set_epoch(epoch) shuffles every epoch the same way)")


def _rel(values: list) -> float:
    """How far a set of numbers spreads: (max - min) / the largest magnitude."""
    lo, hi = min(values), max(values)
    scale = max(abs(lo), abs(hi))
    return 0.0 if hi == lo else (hi - lo) / scale if scale > 0 else float("inf")


class CrossRankJudge:
    """The rules across ranks over the ranks' rows (``RULES`` but ``epoch_repeats``, each
    rank's own), fed one observed step at a time."""

    def __init__(self, params: Optional[dict] = None):
        self.params = {k: t.default for k, t in THRESHOLDS.items()}
        self.params.update(params or {})
        self.findings: list = []
        self._seen: set = set()
        self._inputs: dict = {}          # step -> {rank: checksum}, until every rank that sent rows judged it
        self._dup_run = 0                # steps in a row whose batches were equal on every rank
        self._slow: dict = {}            # rank -> (observed steps in a row, where the time went)
        self._params_agreed = False      # the replicas' parameters were equal at an observed step
        # A model averager in the job (Local SGD: torch's PostLocalSGDOptimizer, PeriodicModelAverager):
        # each rank steps its own replica and they are averaged every few steps, after the step's
        # end, so they differ at step ends by design: rank_divergence is not judged.
        self._averaging = False

    def _report(self, f: Finding, new: list) -> None:
        key = (f.rule, f.evidence.get("rank"), f.subject)
        if key in self._seen:
            return
        self._seen.add(key)
        self.findings.append(f)
        new.append(f)

    def feed(self, step: int, rows: dict) -> list:
        """Judge observed step ``step`` from ``{rank: row}`` (the ranks that have
        a row for it); the new findings."""
        new: list = []
        for rank, row in rows.items():
            if row.get("averaging"):
                self._averaging = True
        self._batches(rows, new)
        if len(rows) >= 2:
            with_params = {r: row["params"] for r, row in rows.items() if row.get("params") is not None}
            if len(with_params) >= 2 and not self._averaging:
                self._divergence(step, with_params, new)
            with_bn = {r: row["bn"] for r, row in rows.items() if row.get("bn")}
            if len(with_bn) >= 2:
                self._batchnorm(step, with_bn, new)
            timed = {r: row for r, row in rows.items() if row.get("data_time") is not None}
            if len(timed) >= 2:
                self._stragglers(step, timed, new)
        return new

    # -- the rules -------------------------------------------------------------------
    def _divergence(self, step: int, params: dict, new: list) -> None:
        ranks = sorted(params)
        names = [n for n in params[ranks[0]] if all(n in params[r] for r in ranks[1:])]
        differ = [n for n in names if len({params[r][n] for r in ranks}) > 1]
        if not differ:
            self._params_agreed = self._params_agreed or bool(names)
            return
        name = differ[0]
        groups: dict = {}
        for r in ranks:
            groups.setdefault(params[r][name], []).append(r)
        if len(groups) == len(ranks):
            who = "no two ranks agree" if len(ranks) > 2 else f"ranks {ranks[0]} and {ranks[1]} disagree"
        else:
            apart = sorted(groups.values(), key=len)[0]
            who = f"rank{'s' if len(apart) > 1 else ''} {', '.join(map(str, apart))} against the others"
        self._report(_finding(
            "rank_divergence", step,
            f"parameter {name} differs across ranks after step {step}'s optimizer step ({who}; "
            f"{len(differ)} of {len(names)} parameters differ): " + (
                "the replicas have diverged (a gradient not all-reduced, a rank that skipped a step, an update "
                "outside DDP)" if self._params_agreed else
                "they differ from the first step compared, so they may never have been the same (initialised "
                "from a per-rank seed, torch.manual_seed(rank), with no broadcast: DDP broadcasts rank 0's "
                "when it wraps the model), or diverged at once (a gradient not all-reduced, an update outside "
                "DDP)"),
            tensor=name, differing=differ, ranks=ranks), new)

    def _batches(self, rows: dict, new: list) -> None:
        for rank, row in rows.items():
            for step, value in row.get("inputs", ()):
                self._inputs.setdefault(step, {})[rank] = value
        if len(rows) < 2:
            return
        ranks = set(rows)
        for step in sorted(s for s, by in self._inputs.items() if ranks <= set(by)):
            by = self._inputs.pop(step)
            if len(set(by.values())) == 1 and len(by) >= 2:
                self._dup_run += 1
                if self._dup_run >= self.params["duplicate_steps"]:
                    self._report(_finding(
                        "duplicate_batches", step,
                        f"every rank ({len(by)}) received the same input batch at step {step} "
                        f"({self._dup_run} steps running): the ranks train on the same data (no "
                        f"DistributedSampler, or one without num_replicas and rank)",
                        ranks=sorted(by)), new)
            else:
                self._dup_run = 0

    def _batchnorm(self, step: int, bns: dict, new: list) -> None:
        ranks = sorted(bns)
        worst = None
        modules = [m for m in bns[ranks[0]] if all(m in bns[r] for r in ranks[1:])]
        apart = [m for m in modules if len({bns[r][m][5] for r in ranks}) > 1]
        for m in apart:
            for i, what in ((1, "running_mean's mean"), (3, "running_var's mean"),
                            (2, "running_mean's norm"), (4, "running_var's norm")):
                vals = [bns[r][m][i] for r in ranks]
                d = _rel(vals)
                if worst is None or d > worst[0]:
                    worst = (d, m, what, vals)
        if worst is None:
            return
        d, m, what, vals = worst
        per = ", ".join(f"rank {r} {fmt(v)}" for r, v in zip(ranks, vals))
        self._report(_finding(
            "unsynced_batchnorm", step,
            f"BatchNorm running statistics differ across ranks at step {step} in {len(apart)} of "
            f"{len(modules)} module(s); the farthest: {m}, {what} {per} ({fmt(100 * d)}% apart): each rank "
            f"keeps its own (use torch.nn.SyncBatchNorm.convert_sync_batchnorm, or evaluate on one rank)",
            module=m, drift=d, modules=apart), new)

    def _stragglers(self, step: int, timed: dict, new: list) -> None:
        p = self.params
        d = {r: row["data_time"] for r, row in timed.items()}
        c = {r: row["compute_time"] for r, row in timed.items()}
        total = {r: d[r] + c[r] for r in timed}
        med_d, med_c, med_t = (statistics.median(x.values()) for x in (d, c, total))
        # The forward time (to the step's first gradient) has no collective in
        # it under DDP: the compute straggler's own, which its step time hides
        # (the other ranks wait for it inside their backward's all-reduce).
        f = {r: row["forward_time"] for r, row in timed.items() if row.get("forward_time") is not None}
        med_f = statistics.median(f.values()) if len(f) == len(timed) else None
        ratio, floor = p["straggler_ratio"], p["straggler_floor"]
        for r in sorted(timed):
            # Ranks that all-reduce wait for the slowest inside their own
            # compute: their step times come out equal, and the straggler is
            # the one whose data loading (or forward) ran over the others'.
            slow_total = total[r] > ratio * med_t and total[r] - med_t > floor
            slow_data = d[r] > ratio * med_d and d[r] - med_d > max(floor, 0.25 * med_t)
            slow_fwd = med_f is not None and f[r] > ratio * med_f and f[r] - med_f > floor
            if not (slow_total or slow_data or slow_fwd):
                self._slow.pop(r, None)
                continue
            where = "data loading" if slow_data or (not slow_fwd and d[r] - med_d >= c[r] - med_c) else "compute"
            n = self._slow.get(r, (0, where))[0] + 1
            self._slow[r] = (n, where)
            if n >= p["straggler_steps"]:
                if where == "data loading":
                    what = f"its data loading {d[r] * 1e3:.1f} ms against the median rank's {med_d * 1e3:.1f} ms"
                elif slow_fwd:
                    what = (f"its compute: its forward (to the first gradient, before any all-reduce) "
                            f"{f[r] * 1e3:.1f} ms against the median rank's {med_f * 1e3:.1f} ms")
                else:
                    what = f"its compute {c[r] * 1e3:.1f} ms against the median rank's {med_c * 1e3:.1f} ms"
                self._report(_finding(
                    "straggler", step,
                    f"rank {r} is a straggler: {n} observed steps running it took {total[r] * 1e3:.1f} ms "
                    f"a step, {what}; the other ranks wait for it", rank=r, where=where, data_time=d[r],
                    compute_time=c[r], forward_time=f.get(r)), new)


def judge_job(rows_by_rank: dict, params: Optional[dict] = None) -> list:
    """The findings of a finished job: ``{rank: [row, ...]}`` (each rank's
    fingerprint rows, in step order), fed to a CrossRankJudge step by step."""
    judge = CrossRankJudge(params)
    by_step: dict = {}
    for rank, rows in rows_by_rank.items():
        for row in rows:
            by_step.setdefault(row["step"], {})[rank] = row
    for step in sorted(by_step):
        judge.feed(step, by_step[step])
    return judge.findings


def judge_rundir(job) -> tuple:
    """A run directory's cross-rank findings (``job``: nndb.store.job.Job):
    (findings as dicts, why they could not be judged or None)."""
    rows = {}
    for k in job.ranks:
        fp = job.readers[k].fingerprints()
        if fp is None:
            return [], f"rank {k}'s trace was written before nndb recorded what ranks are compared by"
        rows[k] = fp
    found = judge_job(rows)             # (one rank: none applies)
    return [f.as_dict() for f in found], None


def describe() -> Iterable[dict]:
    return [{"id": k, "severity": s, "explanation": e} for k, (s, e) in RULES.items()]
