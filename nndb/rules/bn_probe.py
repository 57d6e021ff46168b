"""BatchNorm running statistics: the ``bn_stats`` probe and rule.

``running_mean`` and ``running_var`` are buffers, not recorded.  They matter
at evaluation time, when a BatchNorm layer normalises with them instead of the
batch's statistics: a running_var of 1e8, a NaN, or a collapsed variance make
``model.eval()`` outputs garbage while the training loss looks fine.

The probe notes which BatchNorm modules ran a forward pass in training mode
during the step (a dict insert per call) and, when the step's facts are taken,
summarises their buffers in one go: one ``torch.cat`` and one host copy of all
their channels, then segment reductions in numpy.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from .. import cadence
from ..text import fmt
from .base import Rule, Threshold
from .probes import Probe, register
from .series import num

# A channel whose running variance is below this share of the layer's eps is
# "collapsed": it divides by sqrt(eps) alone, its input was constant.
_ZERO_OF_EPS = 1e-3


@register
class BatchNormRunning(Probe):
    name = "bn_stats"
    MODULE_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)

    def __init__(self, rec):
        super().__init__(rec)
        self._mods: dict = {}            # id -> module that ran in training mode this step

    wants = staticmethod(cadence.bn_stats)

    def forward(self, module, use: int, args, output) -> None:
        if not self.wants(self.rec.recorder.step):
            return
        if module.training and module.track_running_stats and module.running_var is not None:
            self._mods[id(module)] = module

    def take(self, step: int) -> dict:
        """{"modules": [name], "channels", "mean_absmax", "var_min", "var_max",
        "nonfinite", "var_zero_frac" (share of channels below 1e-3 * eps):
        arrays, one entry per module}, or {} if none ran in training mode."""
        mods, self._mods = list(self._mods.values()), {}
        self.facts = {}
        if not mods or self.error is not None:
            return {}
        try:
            return self._summary(mods)
        except Exception as e:          # never into the run: the probe is off, said once
            self.fail(f"probe {self.name} failed and is off: {type(e).__name__}: {e}")
            return {}

    def _summary(self, mods: list) -> dict:
        mods = [m for m in mods if m.running_mean is not None and m.running_mean.numel() > 0]
        if not mods:
            return {}
        with torch.no_grad():
            ts = [m.running_mean.detach().reshape(-1) for m in mods] + \
                 [m.running_var.detach().reshape(-1) for m in mods]
            # one device -> host copy for all (float32 on the device: not every
            # accelerator has float64); the reductions run in numpy
            if len({t.device for t in ts}) == 1:
                flat = torch.cat([t.float() for t in ts]).cpu().numpy().astype(np.float64)
            else:
                flat = np.concatenate([t.float().cpu().numpy() for t in ts]).astype(np.float64)
        sizes = np.array([m.running_mean.numel() for m in mods], dtype=np.int64)
        n = int(sizes.sum())
        starts = np.zeros(len(mods), dtype=np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        mean, var = flat[:n], flat[n:2 * n]
        with np.errstate(all="ignore"):
            fin_m, fin_v = np.isfinite(mean), np.isfinite(var)
            eps = np.repeat(np.array([float(m.eps) for m in mods]), sizes)
            return {
                "modules": [self.naming.module_name(m) for m in mods],
                "channels": sizes,
                "mean_absmax": np.fmax.reduceat(np.where(fin_m, np.abs(mean), np.nan), starts),
                "var_min": np.fmin.reduceat(np.where(fin_v, var, np.nan), starts),
                "var_max": np.fmax.reduceat(np.where(fin_v, var, np.nan), starts),
                "nonfinite": np.add.reduceat((~fin_m | ~fin_v).astype(np.int64), starts),
                "var_zero_frac": np.add.reduceat((fin_v & (var < _ZERO_OF_EPS * eps)).astype(np.float64),
                                                 starts) / sizes,
            }


class BatchNormStats(Rule):
    id = "bn_stats"
    severity = "warning"
    explanation = ("a BatchNorm layer's running_mean / running_var (what eval mode normalises with) are "
                   "non-finite, huge, or collapsed to ~0")
    THRESHOLDS = {
        "var_max": Threshold(1e6, "running_var above this: the layer's inputs have std > 1000, far beyond "
                                  "normalised activations (~1) and even raw 0-255 pixels (var ~5e3): unscaled "
                                  "inputs or an exploding layer before it"),
        "mean_max": Threshold(1e3, "abs(running_mean) above this (the same scale as var_max)"),
        "zero_share": Threshold(0.5, "share of channels whose running_var is below 1e-3 x eps (their input "
                                     "was constant: eval outputs are (x - mean) / sqrt(eps), noise blown up "
                                     "~300x); a few dead channels happen, half the layer is a collapse"),
    }
    PROBES = ("bn_stats",)

    def reset(self):
        self.said: set = set()

    def check(self, ctx):
        f = ctx.facts.get("bn_stats")
        if not f:
            return
        p = self.params
        with np.errstate(invalid="ignore"):
            bad = ((f["nonfinite"] > 0) | (f["var_max"] > p["var_max"]) | (f["mean_absmax"] > p["mean_max"])
                   | (f["var_zero_frac"] >= p["zero_share"]))
        for k in np.flatnonzero(bad).tolist():
            name = f["modules"][k]
            if name in self.said:
                continue
            self.said.add(name)
            ch, vmin, vmax, mabs = int(f["channels"][k]), f["var_min"][k], f["var_max"][k], f["mean_absmax"][k]
            if f["nonfinite"][k] > 0:
                what = f"NaN/Inf in {int(f['nonfinite'][k])} of {ch} channels"
            elif vmax > p["var_max"]:
                what = f"running_var reaches {fmt(vmax)} (inputs of std ~{fmt(np.sqrt(vmax))}; unscaled inputs?)"
            elif mabs > p["mean_max"]:
                what = f"abs(running_mean) reaches {fmt(mabs)}"
            else:
                what = (f"running_var is ~0 in {100 * f['var_zero_frac'][k]:.0f}% of {ch} channels "
                        f"(their inputs are constant)")
            yield self.finding(
                ctx, f"running statistics of {name} out of range after step {ctx.step}: {what}; eval-mode "
                     f"outputs normalise with them",
                module=name, channels=ch, var_min=num(vmin), var_max=num(vmax), mean_absmax=num(mabs),
                nonfinite_channels=int(f["nonfinite"][k]), var_zero_share=num(f["var_zero_frac"][k]))
