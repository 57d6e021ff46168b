"""Queries over whole tensors and histograms in a trace (plain data; renderers print).

``full_tensor``: a kept tensor, or a UsageError that says which steps were
kept.  ``compare``: two histograms of one series side by side (approximate
quantiles with their bin bounds, share of zeros, NaN/Inf counts, the
Kolmogorov-Smirnov statistic at the bin edges, and coarse bins for a
terminal chart); ``describe``: one histogram alone.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..errors import UsageError
from .. import histogram as H
from .precision import MAX_REL_ERROR
from ..schema import FULL_KINDS, KIND_WORDS, KINDS

QUANTILES = (0.01, 0.25, 0.5, 0.75, 0.99)
APPROX_NOTE = ("quantiles are read from the histogram: approximate, the true value lies in the "
               "bin shown (a factor of at most 1.5 wide; zero, NaN and Inf counts are exact); "
               "KS is taken at the bin edges (a lower bound of the samples' statistic)")


def parse_kind(word: str, allowed=KINDS) -> str:
    kind = KIND_WORDS.get(word.strip().lower(), word.strip().lower())
    if kind not in allowed:
        raise UsageError(f"unknown kind {word!r} (one of {', '.join(allowed)})")
    return kind


def parse_tensor_spec(spec: str, allowed=KINDS) -> tuple:
    """``KIND:NAME`` -> (kind, name)."""
    kind, sep, name = spec.partition(":")
    if not sep or not name:
        raise UsageError(f"expected KIND:NAME (for example grad:conv1.weight), not {spec!r}")
    return parse_kind(kind, allowed), name


def _steps_text(steps: list) -> str:
    if not steps:
        return "none"
    if len(steps) > 12:
        return ", ".join(map(str, steps[:6])) + f", ... ({len(steps)} steps) ..., " + \
            ", ".join(map(str, steps[-3:]))
    return ", ".join(map(str, steps))


def full_tensor(reader, name: str, kind: str, step: int) -> tuple:
    """(array, index entry) of a kept tensor; UsageError saying what was kept otherwise."""
    if kind not in FULL_KINDS:
        raise UsageError(f"whole tensors are kept of {', '.join(FULL_KINDS)}, not {kind}")
    entry = reader.full_entry(name, kind, step)
    if entry is None:
        steps = reader.full_steps(name, kind)
        skipped = _skipped(reader, kind, name, step)
        if not steps:
            kept = sorted({f"{e['kind']} {e['name']}" for e in reader.full_index()})
            raise UsageError(f"the trace keeps no whole tensor of {kind} {name} "
                             f"(kept: {', '.join(kept[:8]) + (' ...' if len(kept) > 8 else '') if kept else 'none'};"
                             f"{skipped or f' nndb run --record-full {kind}:GLOB'})")
        raise UsageError(f"the trace keeps {kind} {name} at steps {_steps_text(steps)}, not at step {step}"
                         + (f" ({skipped.strip()})" if skipped else ""))
    return reader.tensor(name, kind, step), entry


def _skipped(reader, kind: str, name: str, step: int) -> str:
    """What the trace's events say of whole tensors skipped over the pending bound
    (``full_tensors_skipped``, one event a step, naming the step's first skipped
    tensor): this one, at ``step`` or at others; or those of ``step``; else ''."""
    events = [e for e in reader.events() if e.get("kind") == "full_tensors_skipped" and e.get("step") is not None]
    mine = sorted({int(e["step"]) for e in events if f": {kind} {name} needs " in str(e.get("message"))})
    at = [e for e in events if int(e["step"]) == step]
    if mine:
        said = next(str(e["message"]) for e in events if f": {kind} {name} needs " in str(e.get("message")))
        return (f" {kind} {name} was skipped at step(s) {_steps_text(mine)}: it "
                f"{said.split(f': {kind} {name} ', 1)[1]}")
    if at:
        return (f" whole tensors of step {step} were skipped over the bound on pending full tensors "
                "(the trace's events; nndb run --full-tensors-buffer)")
    return ""


def tensor_info(entry: dict) -> dict:
    return {"name": entry["name"], "kind": entry["kind"], "step": entry["step"], "shape": entry["shape"],
            "dtype": entry.get("dtype"), "asked": entry.get("asked"), "stored": entry["used"],
            "max_rel_error": MAX_REL_ERROR[entry["used"]], **({"calls": entry["calls"]} if entry.get("calls") else {})}


def histogram(reader, name: str, kind: str, step: int) -> np.ndarray:
    h = reader.histogram(name, kind, step)
    if h is None:
        steps = reader.histogram_steps(name, kind)
        if not steps:
            raise UsageError(f"the trace has no histogram of {kind} {name} (histograms are taken at "
                             f"full steps: nndb run --full-every N)")
        raise UsageError(f"{kind} {name} has histograms at steps {_steps_text(steps)}, not at step {step}")
    return h


def describe(h: np.ndarray, step: int) -> dict:
    """One histogram in words: counts, exact zeros/NaN/Inf, approximate quantiles."""
    n = H.total(h)
    qs = {}
    for q in QUANTILES:
        b = H.quantile_bounds(h, q)
        qs[f"{q:g}"] = None if b is None else {"estimate": b[1], "low": b[0], "high": b[2]}
    return {"step": step, "count": n, "zeros": int(h[H.I_ZERO]), "zero_share": H.zero_share(h),
            "nan": int(h[H.I_NAN]), "pos_inf": int(h[H.I_POS_INF]), "neg_inf": int(h[H.I_NEG_INF]),
            "quantiles": qs}


def _groups(hs: list, per_sign: int = 6) -> list:
    """Bin index ranges shared by the histograms ``hs``: the finite
    half-binades that either uses, cut into at most ``per_sign`` ranges per
    sign, and the exact bins on their own."""
    used = np.zeros(H.N_BINS, dtype=bool)
    for h in hs:
        used |= np.asarray(h) > 0
    out = []

    def split(lo, hi, neg):
        idx = [i for i in range(lo, hi) if used[i]]
        if not idx:
            return
        a, b = idx[0], idx[-1] + 1
        step = max(1, -(-(b - a) // per_sign))
        for s in range(a, b, step):
            e = min(b, s + step)
            lo_v, hi_v = H.RANGES[s][0], H.RANGES[e - 1][1]
            out.append((f"[{lo_v:.2g}, {hi_v:.2g})", s, e))

    if used[H.I_NEG_INF]:
        out.append(("-inf", H.I_NEG_INF, H.I_NEG_INF + 1))
    split(H.I_NEG_OVER, H.I_NEG_UNDER + 1, True)
    out.append(("0", H.I_ZERO, H.I_ZERO + 1))
    split(H.I_POS_UNDER, H.I_POS_OVER + 1, False)
    if used[H.I_POS_INF]:
        out.append(("+inf", H.I_POS_INF, H.I_POS_INF + 1))
    if used[H.I_NAN]:
        out.append(("nan", H.I_NAN, H.I_NAN + 1))
    return out


def compare(reader, kind: str, name: str, step_a: int, step_b: int) -> dict:
    """Two histograms of ``kind name`` side by side."""
    if (name, kind) not in {(s.name, s.kind) for s in reader.series()}:
        raise UsageError(f"the trace has no series {kind} {name}")
    ha, hb = histogram(reader, name, kind, step_a), histogram(reader, name, kind, step_b)
    return compare_histograms(kind, name, [(step_a, ha), (step_b, hb)])


def compare_histograms(kind: str, name: str, pairs: list) -> dict:
    """``pairs``: [(step, histogram)], oldest first; the first and last are compared."""
    (sa, ha), (sb, hb) = pairs[0], pairs[-1]
    groups = _groups([h for _, h in pairs])
    bins = [{"range": label, "a": int(np.asarray(ha)[s:e].sum()), "b": int(np.asarray(hb)[s:e].sum())}
            for label, s, e in groups]
    return {"kind": kind, "name": name, "a": describe(ha, sa), "b": describe(hb, sb),
            "ks": H.ks(ha, hb), "bins": bins, "note": APPROX_NOTE,
            "series": [{"step": s, "zero_share": H.zero_share(h), "count": H.total(h)} for s, h in pairs]}


def checkpoint_plan(reader, kind: str, name: str, checkpoint_steps: list, k: int) -> dict:
    """What the trace has of ``kind name`` at the last ``k`` checkpoints: the
    histograms taken at a checkpoint's step (a full step), and the
    checkpoints it has none at (``missing``: measured on replicas, or left out)."""
    if k < 2:
        raise UsageError("compare --checkpoints K needs K >= 2")
    steps = sorted(set(checkpoint_steps))[-k:]
    if len(steps) < 2:
        raise UsageError(f"compare --checkpoints {k} needs two checkpoints; this run has "
                         f"{'one, at step ' + str(steps[0]) if steps else 'none'}")
    known = (name, kind) in {(s.name, s.kind) for s in reader.series()}
    have = set(reader.histogram_steps(name, kind)) if known else set()
    # a replica resumed from checkpoint C measures step C+1: where that is the next
    # checkpoint's step, read from the trace, it would be the same step twice
    covered = [s for s in steps if s not in have and s + 1 in have and s + 1 in steps]
    return {"kind": kind, "name": name, "checkpoints": steps, "known": known, "have": sorted(have),
            "read": [(s, reader.histogram(name, kind, s)) for s in steps if s in have],
            "covered": [{"checkpoint": s, "step": s + 1} for s in covered],
            "missing": [s for s in steps if s not in have and s not in covered]}


def at_checkpoints(plan: dict, measured: Optional[dict] = None) -> dict:
    """The last K checkpoints' histograms of a ``checkpoint_plan``, the first
    and last compared: those in the trace, and for the others those
    ``measured`` on replicas ({checkpoint step: {"step", "hist"} or
    {"error"}}: the step after the checkpoint, nndb.timetravel.measure).  A
    checkpoint with neither is named in ``skipped`` with the reason.
    UsageError when fewer than two histograms remain."""
    kind, name, steps = plan["kind"], plan["name"], plan["checkpoints"]
    pairs, done, skipped = list(plan["read"]), [], []
    for c in plan["missing"]:
        got = (measured or {}).get(c)
        if got is not None and "hist" in got:
            pairs.append((int(got["step"]), np.asarray(got["hist"], dtype=np.int64)))
            done.append({"checkpoint": c, "step": int(got["step"])})
        else:
            skipped.append({"step": c, "why": got["error"] if got else "not a full step"})
    pairs.sort(key=lambda p: p[0])
    if len(pairs) < 2:
        why = "; ".join(f"step {x['step']}: {x['why']}" for x in skipped)
        raise UsageError(f"cannot compare {kind} {name} at the last {len(steps)} checkpoints (steps "
                         f"{_steps_text(steps)}): {len(pairs)} histogram(s) ({why}); the trace has its "
                         f"histograms at {_steps_text(plan['have'])}")
    out = compare_histograms(kind, name, pairs)
    out["checkpoints"] = steps
    out["measured"] = done
    out["covered"] = plan.get("covered", [])
    out["skipped"] = skipped
    return out
