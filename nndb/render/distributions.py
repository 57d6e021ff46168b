"""Text of whole tensors, histograms and ``compare`` (data from nndb.distributions)."""
from __future__ import annotations

from tabulate import tabulate

from ..text import fmt
from ..text import printable

BAR = 30


def _share(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _quantile(q) -> str:
    if q is None:
        return "-"
    return f"~{fmt(q['estimate'])} [{fmt(q['low'])}, {fmt(q['high'])}]"


def histogram_lines(h: dict) -> list:
    lines = [f"step {h['step']}: {h['count']} elements, zeros {h['zeros']} ({_share(h['zero_share'])}), "
             f"NaN {h['nan']}, +Inf {h['pos_inf']}, -Inf {h['neg_inf']}"]
    lines += [f"  q{k}: {_quantile(v)}" for k, v in h["quantiles"].items()]
    return lines


def tensor_at(data: dict) -> str:
    lines = []
    t = data.get("tensor")
    if t is not None:
        fell = "" if t["stored"] == t["asked"] else f" (asked {t['asked']}: it could not hold this tensor within its error)"
        calls = f" ({t['calls']} calls in the step, joined)" if t.get("calls") else ""
        lines.append(f"{t['kind']} {t['name']} at step {t['step']}: shape {t['shape']}{calls}, {t['dtype']}, stored "
                     f"{t['stored']}{fell}, relative error <= {t['max_rel_error']:.3g}")
        if t.get("npy"):
            lines.append(f"written to {t['npy']}")
    else:
        lines.append(f"{data['kind']} {data['name']}: no whole tensor kept at step {data['step']}")
    if data.get("histogram") is not None:
        lines.append("histogram (approximate quantiles, [bin]):")
        lines += ["  " + x for x in histogram_lines(data["histogram"])]
    return printable("\n".join(lines))


def compare(data: dict) -> str:
    a, b = data["a"], data["b"]
    head = f"{data['kind']} {data['name']}: step {a['step']} against step {b['step']}"
    rows = [["elements", a["count"], b["count"]],
            ["zeros", f"{a['zeros']} ({_share(a['zero_share'])})", f"{b['zeros']} ({_share(b['zero_share'])})"],
            ["NaN / +Inf / -Inf", f"{a['nan']} / {a['pos_inf']} / {a['neg_inf']}",
             f"{b['nan']} / {b['pos_inf']} / {b['neg_inf']}"]]
    rows += [[f"q{k} (approx.)", _quantile(a["quantiles"][k]), _quantile(b["quantiles"][k])] for k in a["quantiles"]]
    ks = data["ks"]
    rows.append(["KS statistic", "-" if ks is None else f"{ks:.3f}", ""])
    table = tabulate(rows, headers=["", f"step {a['step']}", f"step {b['step']}"], disable_numparse=True)
    lines = [head, table, ""]
    series = data.get("series") or []
    if data.get("checkpoints"):
        lines.append(f"checkpoints at steps {', '.join(map(str, data['checkpoints']))}")
        if data.get("measured"):
            lines.append("  measured on replicas (not in the trace): " + ", ".join(
                f"checkpoint {m['checkpoint']} -> step {m['step']}" for m in data["measured"]))
        for m in data.get("covered") or ():
            lines.append(f"  checkpoint {m['checkpoint']}: the step after it is checkpoint {m['step']}'s, "
                         "in the trace (not measured twice)")
        for x in data.get("skipped") or ():
            lines.append(f"  no histogram for checkpoint {x['step']}: {x['why']}; left out")
    if len(series) > 2 or data.get("checkpoints"):
        lines.append("share of zeros at each step: " +
                     ", ".join(f"{s['step']}: {_share(s['zero_share'])}" for s in series))
        lines.append("")
    lines += chart(data["bins"], a["step"], b["step"])
    lines.append("")
    lines.append("(" + data["note"] + ")")
    return printable("\n".join(lines))


def chart(bins: list, step_a, step_b) -> list:
    """Two bars per value range, each side's share of its elements."""
    ta = sum(x["a"] for x in bins) or 1
    tb = sum(x["b"] for x in bins) or 1
    pad = max((len(x["range"]) for x in bins), default=0)
    out = [f"{'':>{pad}}  A = step {step_a}, B = step {step_b} (share of elements)"]
    for x in bins:
        fa, fb = x["a"] / ta, x["b"] / tb
        out.append(f"{x['range']:>{pad}} A {'█' * round(fa * BAR):<{BAR}} {100 * fa:5.1f}%")
        out.append(f"{'':>{pad}} B {'█' * round(fb * BAR):<{BAR}} {100 * fb:5.1f}%")
    return out
