"""The fuzzing loop: TensorFuzz's coverage-guided search, or random search
with the same budget and the same mutations (``random=True``).

The unit mutated is the batch the step fed the model, position by position:
each batch position (row along dim 0 of the inputs) keeps a corpus of its
own, seeded with the step's row.  A mutant batch takes, for every position,
a parent from that position's corpus (coverage-guided: the newest element
half the time, else a uniform pick; random search: always the step's own
row), mutates it (nndb.fuzz.mutate) and is evaluated in one forward pass (and
the loss, and its gradients).  Rows whose activation vectors are new
coverage (nndb.fuzz.coverage) join their position's corpus.  Positions
keep the rows aligned with what the loss pairs them with (targets).

``evaluate(inputs) -> Outcome`` is passed in: the search does not know what
a model is.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from .coverage import Coverage
from .mutate import mutate

NEWEST_SHARE = 0.5        # how often a parent is its position's newest corpus element


@dataclass
class FuzzConfig:
    budget: int = 1000            # mutant batches evaluated at most
    seed: int = 0
    scale: float = 0.1            # mutation size: a share of each input's range (float) or of elements (int)
    random: bool = False          # random search: every mutant is a mutation of the step's own batch
    threshold: Optional[float] = None     # coverage distance (None: from the seed batch)


@dataclass
class Outcome:
    vectors: Optional[torch.Tensor]       # (rows, features): the chosen layers' outputs per row
    found: Optional[dict] = None          # the objective, reached: {"what": ..., ...}
    loss: Optional[float] = None


@dataclass
class FuzzResult:
    found: Optional[dict]
    tried: int                    # mutant batches evaluated
    rows: int                     # batch positions (rows mutated per mutant)
    coverage: int                 # activation vectors kept (the seed's included)
    seed_coverage: int
    corpus: int                   # inputs kept in the corpora (the seed's rows included)
    threshold: float
    inputs: Optional[list] = None         # the batch that reached the objective
    seed_loss: Optional[float] = None
    seconds: float = 0.0
    mode: str = "coverage"
    notes: list = field(default_factory=list)


def batch_rows(inputs: list, specs: list) -> int:
    """The batch size when every mutated input has it as dim 0, else 1
    (the inputs are then mutated whole)."""
    sizes = {t.shape[0] for t, s in zip(inputs, specs) if s.kind != "fixed" and t.dim() > 0}
    return sizes.pop() if len(sizes) == 1 else 1


def run(evaluate: Callable[[list], Outcome], seed_inputs: list, specs: list, cfg: FuzzConfig,
        should_stop: Callable[[], bool] = lambda: False) -> FuzzResult:
    t0 = time.perf_counter()
    gen = torch.Generator().manual_seed(cfg.seed)
    cov = Coverage(cfg.threshold, cfg.seed)
    rows = batch_rows(seed_inputs, specs)
    per_row = rows > 1
    first = evaluate(seed_inputs)
    mode = "random" if cfg.random else "coverage"
    result = FuzzResult(None, 0, rows, 0, 0, rows, 0.0, seed_loss=first.loss, mode=mode)
    if first.found is not None:
        result.found, result.inputs = dict(first.found, mutant=0), seed_inputs
        result.notes.append("the step's own batch already reaches the objective")
        result.seconds = time.perf_counter() - t0
        return result
    # store[leaf]: the corpus rows of each input, stacked; members[i]: the rows of batch position i
    store = [_rows_of(t, per_row) if s.kind != "fixed" else None for t, s in zip(seed_inputs, specs)]
    members: list = [[i] for i in range(rows)]
    kept = rows
    for k in range(1, cfg.budget + 1):
        if should_stop():
            result.notes.append(f"interrupted after {k - 1} mutant(s)")
            break
        pick = _parents(members, cfg.random, gen)
        mutant = []
        for t, spec, rows_kept in zip(seed_inputs, specs, store):
            if spec.kind == "fixed":
                mutant.append(t)
                continue
            m = mutate(rows_kept[pick], spec, cfg.scale, gen)
            mutant.append(m if per_row else m[0])
        out = evaluate(mutant)
        result.tried = k
        if k == 1 and first.vectors is not None:        # (the first mutant: every row's parent is its seed row)
            moved = _row_vectors(out.vectors, rows) if out.vectors is not None else None
            result.threshold = cov.calibrate(_row_vectors(first.vectors, rows), moved)
            result.seed_coverage = cov.size
        if out.found is not None:
            result.found, result.inputs = dict(out.found, mutant=k), mutant
            break
        if out.vectors is None:
            continue
        new = torch.nonzero(cov.novel(_row_vectors(out.vectors, rows))).flatten().tolist()
        if cfg.random or not new:
            continue            # (random search keeps no corpus; its coverage is measured all the same)
        for i in new:
            members[i].append(kept)
            kept += 1
        for leaf, (t, spec) in enumerate(zip(mutant, specs)):
            if spec.kind != "fixed":
                store[leaf] = torch.cat([store[leaf], _rows_of(t, per_row)[new]])
    result.coverage, result.corpus = cov.size, kept
    result.threshold = cov.threshold or 0.0
    result.seconds = time.perf_counter() - t0
    return result


def _rows_of(t: torch.Tensor, per_row: bool) -> torch.Tensor:
    return t.detach() if per_row else t.detach().unsqueeze(0)


def _row_vectors(vecs: torch.Tensor, rows: int) -> torch.Tensor:
    """One vector per batch position (a layer whose dim 0 is not the batch
    gives one vector, shared by all positions)."""
    if vecs.shape[0] == rows:
        return vecs
    return vecs.reshape(1, -1).expand(rows, -1)


def _parents(members: list, random: bool, gen: torch.Generator) -> torch.Tensor:
    """For each batch position, the corpus row its mutant starts from."""
    out = []
    for kept in members:
        if random or len(kept) == 1:
            out.append(kept[0])
        elif float(torch.rand((), generator=gen)) < NEWEST_SHARE:
            out.append(kept[-1])
        else:
            out.append(kept[int(torch.randint(0, len(kept), (1,), generator=gen))])
    return torch.tensor(out, dtype=torch.long)
