"""Mutations of a batch's input tensors, bounded to each input's own range.

A float input moves by uniform noise of at most ``scale`` times its observed
range (max - min of the seed batch) per element and is clipped to that
range; an integer input (token ids, class indices) has each element replaced,
with probability ``scale``, by a uniform draw from its vocabulary ``[lo, hi]``
(the embedding's ``num_embeddings`` where the input feeds an ``nn.Embedding``,
else the observed min..max).  Other inputs (bool, complex) are left alone.

Rows: an input whose dim 0 is the batch is mutated row by row (each row has
a parent of its own, see ``search``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class InputSpec:
    kind: str                # "float", "int" or "fixed"
    lo: float
    hi: float
    source: str = ""         # where the bounds come from, for the report

    def describe(self) -> str:
        if self.kind == "fixed":
            return "not mutated"
        lo, hi = (int(self.lo), int(self.hi)) if self.kind == "int" else (self.lo, self.hi)
        return f"{self.kind} in [{lo:g}, {hi:g}] ({self.source})"


def spec_for(t: torch.Tensor, vocab: Optional[int] = None) -> InputSpec:
    """How to mutate ``t``: its kind and bounds."""
    if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.dtype == torch.bool or t.is_complex():
        return InputSpec("fixed", 0.0, 0.0)
    if t.is_floating_point():
        x = t.detach()
        finite = x[torch.isfinite(x)]
        if finite.numel() == 0:
            return InputSpec("fixed", 0.0, 0.0)
        lo, hi = float(finite.min()), float(finite.max())
        return InputSpec("float", lo, hi, "the batch's observed range") if hi > lo \
            else InputSpec("fixed", lo, hi)
    lo, hi = int(t.min()), int(t.max())
    if vocab is not None and 0 <= lo and hi < vocab:
        return InputSpec("int", 0, vocab - 1, f"the embedding's num_embeddings={vocab}")
    return InputSpec("int", lo, hi, "the batch's observed min..max") if hi > lo else InputSpec("fixed", lo, hi)


def mutate(t: torch.Tensor, spec: InputSpec, scale: float, gen: torch.Generator) -> torch.Tensor:
    """A mutant of ``t`` (a new tensor; ``t`` is not changed)."""
    if spec.kind == "float":
        width = spec.hi - spec.lo
        noise = (torch.rand(t.shape, generator=gen, dtype=torch.float64) * 2 - 1) * (scale * width)
        return (t.detach().double() + noise).clamp_(spec.lo, spec.hi).to(t.dtype)
    if spec.kind == "int":
        pick = torch.rand(t.shape, generator=gen) < scale
        draw = torch.randint(int(spec.lo), int(spec.hi) + 1, t.shape, generator=gen, dtype=torch.int64)
        return torch.where(pick, draw, t.detach().long()).to(t.dtype)
    return t.detach().clone()
