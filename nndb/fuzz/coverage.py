"""Coverage as TensorFuzz measures it: an input reaches new coverage when
the activation vector it produces (the chosen layers' outputs for its row,
concatenated) is farther than a threshold from its nearest neighbour among
the vectors already kept.

Nearest neighbours: exact (brute force ``torch.cdist``) over the kept
vectors after a fixed random Gaussian projection to at most ``DIM`` dimensions
(Johnson-Lindenstrauss: distances kept within a small factor), so the search
is approximate only through that projection.  At most ``MAX_KEPT`` vectors
are kept; past that a new vector replaces a random old one.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

DIM = 64
MAX_KEPT = 20000


class Coverage:
    def __init__(self, threshold: Optional[float], seed: int = 0):
        self.threshold = threshold          # None: set from the seed batch (calibrate)
        self.kept: Optional[torch.Tensor] = None
        self._proj: Optional[torch.Tensor] = None
        self._gen = torch.Generator().manual_seed(seed + 7919)

    def project(self, vecs: torch.Tensor) -> torch.Tensor:
        v = vecs.detach().double().reshape(vecs.shape[0], -1)
        v = torch.nan_to_num(v, nan=0.0, posinf=1e30, neginf=-1e30)
        if v.shape[1] <= DIM:
            return v
        if self._proj is None or self._proj.shape[0] != v.shape[1]:
            self._proj = torch.randn(v.shape[1], DIM, generator=self._gen, dtype=torch.float64) / math.sqrt(DIM)
        return v @ self._proj

    def calibrate(self, seed_vecs: torch.Tensor, moved: Optional[torch.Tensor] = None) -> float:
        """Keep the seed rows' vectors; without a threshold given, set it to
        the median distance one mutation moves a row's vector (``moved``: the
        vectors of a first mutant of each seed row), so that new coverage is
        a move further than a typical mutation from everything seen, whatever
        the layers' width and scale."""
        p = self.project(seed_vecs)
        if self.threshold is None:
            d = (self.project(moved) - p).norm(dim=1) if moved is not None else p.new_zeros(0)
            d = d[torch.isfinite(d) & (d > 0)]
            self.threshold = float(d.median()) if d.numel() else max(1e-12, 1e-3 * float(p.abs().max()))
        self._add(p)
        return self.threshold

    def novel(self, vecs: torch.Tensor) -> torch.Tensor:
        """Which rows are new coverage; those are kept (a row is compared with
        the rows before it in the same batch too)."""
        p = self.project(vecs)
        out = torch.zeros(p.shape[0], dtype=torch.bool)
        if self.kept is not None and self.kept.numel():
            far = torch.cdist(p, self.kept).min(1).values > self.threshold
        else:
            far = torch.ones(p.shape[0], dtype=torch.bool)
        for i in torch.nonzero(far).flatten().tolist():
            row = p[i:i + 1]
            if self.kept is not None and float(torch.cdist(row, self.kept).min()) <= self.threshold:
                continue
            out[i] = True
            self._add(row)
        return out

    def _add(self, p: torch.Tensor) -> None:
        if self.kept is None:
            self.kept = p.clone()
        elif self.kept.shape[0] + p.shape[0] <= MAX_KEPT:
            self.kept = torch.cat([self.kept, p])
        else:
            for row in p:
                self.kept[int(torch.randint(0, self.kept.shape[0], (1,), generator=self._gen))] = row

    @property
    def size(self) -> int:
        return 0 if self.kept is None else int(self.kept.shape[0])
