"""Coverage as TensorFuzz measures it: an input reaches new coverage when
the activation vector it produces (the chosen layers' outputs for its row,
concatenated) is farther than a threshold from its nearest neighbour among
the vectors already kept.

Nearest neighbours are exact (brute force ``torch.cdist``) in the coverage
space; at most ``MAX_KEPT`` vectors are kept, past that a new vector
replaces a random old one.

The coverage space and the threshold are set from the seed batch, so that
"new" keeps its meaning whatever the layers' width:

* A narrow vector (at most ``NARROW`` features: an output, logits) is used
  as it is.  A wider one (a hidden layer) is projected on the seed batch's
  first principal component (the direction its rows' activations differ
  most in).  In many dimensions the nearest kept vector of a mutant is
  almost always its own parent, at about one mutation's distance: every
  mutant that moved a little more than typical was new, the corpus filled
  up with rows near the start, and nothing was found (a 32-unit Tanh layer
  of scripts/examples/fuzz_log_corner.py: 20,000 vectors kept, no NaN in
  2000 mutant batches).  On one axis, as on a narrow output, only a mutant
  beyond what was reached so far is new, and the corpus walks outward.
* The default threshold is the median distance between a seed row's
  vector and its nearest other seed row's (the spacing of the batch's own
  activations), falling back to the median distance one mutation moves a
  row's vector where there is only one row.
"""
from __future__ import annotations

from typing import Optional

import torch

NARROW = 16
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
        if v.shape[1] <= NARROW:
            return v
        if self._proj is None or self._proj[1].shape[0] != v.shape[1]:
            self._proj = self._axis(v)
        mean, axis = self._proj
        return (v - mean) @ axis

    def _axis(self, v: torch.Tensor) -> tuple:
        """(mean, (features, 1) unit axis): the first principal component of
        ``v`` (the seed batch's vectors), or a fixed random axis where the
        rows do not differ."""
        mean = v.mean(0, keepdim=True)
        centred = v - mean
        if v.shape[0] > 1 and float(centred.abs().max()) > 0:
            axis = torch.linalg.svd(centred, full_matrices=False).Vh[:1].T
        else:
            axis = torch.randn(v.shape[1], 1, generator=self._gen, dtype=torch.float64)
        return mean, axis / axis.norm()

    def calibrate(self, seed_vecs: torch.Tensor, moved: Optional[torch.Tensor] = None) -> float:
        """Keep the seed rows' vectors; without a threshold given, set it to
        the median nearest-neighbour distance among them, or with one row the
        median distance one mutation moves its vector (``moved``: the vectors
        of a first mutant of each seed row)."""
        p = self.project(seed_vecs)
        if self.threshold is None:
            d = p.new_zeros(0)
            if p.shape[0] > 1:
                dd = torch.cdist(p, p)
                dd.fill_diagonal_(float("inf"))
                d = dd.min(1).values
            d = d[torch.isfinite(d) & (d > 0)]
            if not d.numel() and moved is not None:
                d = (self.project(moved) - p).norm(dim=1)
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
