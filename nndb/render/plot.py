"""Drawing the pictures of nndb.render.plotdata with matplotlib (the ``plot``
extra), through a Figure of its own and the Agg canvas: no pyplot, so the
backend and figures of a script being debugged are never touched.

``draw(data, path)`` writes a PNG or SVG of ``figure_size(data)`` inches at
``DPI`` and returns the path.  Findings are triangles on the top edge (one
colour per rule, named in the legend), stops dotted lines; a measured NaN or
Inf is a red cross; not measured is left blank (grey on a heat map, where
a measured 0, which a log scale cannot place, is white: the legend names
both).  ``figure(data)`` gives the Figure without saving it (the tests read
its axes).
"""
from __future__ import annotations

import os

import numpy as np

from ..errors import UsageError
from ..run.paths import PICTURE_METADATA, claim_output
from ..text import printable_line
from .plotdata import Heatmap, History, LossCurve, Ratio

DPI = 100
MAX_LABEL = 60
FORMATS = (".png", ".svg")
MAX_LAYER_LABELS = 40


def plain(text, limit: int = MAX_LABEL) -> str:
    """Text from a trace (names, rules, the script) as matplotlib shows it
    literally: a ``$`` would start its math mode (and a bad formula raise);
    a control character is drawn as its escape (``\\x1b``), as the terminal
    shows it (matplotlib's warning of a glyph its font lacks would carry the
    raw character to the terminal)."""
    t = printable_line(text)
    t = t if len(t) <= limit else t[:limit - 3] + "..."
    return t.replace("$", r"\$")


def figure_size(data) -> tuple:
    """(width, height) in inches: a heat map grows with its layers."""
    if isinstance(data, Heatmap):
        return (11.0, float(min(max(4.0, 1.8 + 0.28 * len(data.layers)), 16.0)))
    if isinstance(data, History):
        return (11.0, 7.0)
    return (11.0, 5.5)


def pixel_size(data) -> tuple:
    w, h = figure_size(data)
    return int(round(w * DPI)), int(round(h * DPI))


def _claim(path: str) -> str:
    """The picture's format (its extension), once ``path`` may be written:
    a new file or one of nndb's own pictures (nndb.run.paths)."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise UsageError(f"cannot write a picture to {path}: the name must end in .png or .svg")
    claim_output(path, "the picture", "picture")
    return ext


def _save(fig, path: str, ext: str) -> str:
    """Write the figure, stamped as nndb's (so that nndb may write over it later)."""
    try:
        fig.savefig(path, dpi=DPI, format=ext[1:], metadata=PICTURE_METADATA[ext])
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror or e}") from None
    return path


def figure(data):
    """The matplotlib Figure of ``data`` (on an Agg canvas, not saved)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=figure_size(data), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    {Heatmap: _heatmap, LossCurve: _loss, History: _history, Ratio: _ratio}[type(data)](fig, data)
    return fig


def draw(data, path: str) -> str:
    ext = _claim(path)
    return _save(figure(data), path, ext)


# -- marks ----------------------------------------------------------------------------------

def _mark(ax, marks, steps_shown) -> None:
    """Findings as triangles on the top edge, one colour per rule; stops as dotted lines."""
    if not marks:
        return
    import matplotlib.colors as mcolors
    lo, hi = (min(steps_shown), max(steps_shown)) if len(steps_shown) else (None, None)
    colours = list(mcolors.TABLEAU_COLORS.values())[1:]
    rules = list(dict.fromkeys(m.label for m in marks if m.kind == "finding"))
    top = ax.get_xaxis_transform()
    stacked: dict = {}          # step -> findings drawn there so far (several rules: stacked upwards)
    for i, rule in enumerate(rules):
        xs = [m.step for m in marks if m.kind == "finding" and m.label == rule and (lo is None or lo <= m.step <= hi)]
        if xs:
            c = colours[i % len(colours)]
            ys = []
            for x in xs:
                ys.append(1.0 + 0.045 * stacked.get(x, 0))
                stacked[x] = stacked.get(x, 0) + 1
            ax.scatter(xs, ys, marker="v", s=70, color=c, edgecolor="black", linewidth=0.5,
                       transform=top, clip_on=False, zorder=5, label=f"finding: {plain(rule)}")
            for x in xs:
                ax.axvline(x, color=c, linestyle="--", linewidth=0.8, alpha=0.6)
    stops = [m for m in marks if m.kind == "stop" and (lo is None or lo <= m.step <= hi)]
    for j, m in enumerate(stops):
        ax.axvline(m.step, color="black", linestyle=":", linewidth=1.2, label="stop" if j == 0 else None)


def _integer_steps(ax, steps=None) -> None:
    """Whole step numbers on the x axis, spanning ``steps`` (marks drawn in
    axes coordinates do not widen the limits by themselves)."""
    from matplotlib.ticker import MaxNLocator
    # (min_n_ticks=1: over a single step, the default 2 made matplotlib fall back to -0.5, -0.4 ... 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=12, integer=True, min_n_ticks=1))
    if steps is not None and len(steps):
        edges = _edges(np.unique(np.asarray(steps)))
        ax.set_xlim(edges[0], edges[-1])


def _title(ax, text: str, marks) -> None:
    """Left-aligned, raised above the findings' triangles when there are any."""
    stack = max([sum(1 for m in marks if m.kind == "finding" and m.step == s)
                 for s in {m.step for m in marks}] or [0])
    ax.set_title(plain(text, 140), loc="left", fontsize=11, pad=6 + (12 + 9 * max(stack - 1, 0) if stack else 0))


# -- the pictures ---------------------------------------------------------------------------

NOT_MEASURED = "#d9d9d9"        # a heat map's cell with no value
ZERO = "#ffffff"                # ... with a measured 0 (no place on a log scale)


def _heatmap(fig, d: Heatmap) -> None:
    from matplotlib import colormaps
    from matplotlib.colors import ListedColormap, LogNorm, SymLogNorm
    from matplotlib.patches import Patch
    ax = fig.add_subplot()
    L, T = d.values.shape
    finite = d.values[np.isfinite(d.values)]
    positive = finite[finite > 0]
    cmap = colormaps["viridis"].with_extremes(bad=NOT_MEASURED)
    negative = bool((finite < 0).any())
    if negative:                # (mean, min, max: both signs on one symmetric log scale, 0 on it)
        tiny = float(np.abs(finite[finite != 0]).min())
        big = float(np.abs(finite).max())
        norm = SymLogNorm(linthresh=tiny, vmin=-big, vmax=big)
    elif positive.size:
        vmin, vmax = float(positive.min()), float(positive.max())
        norm = LogNorm(vmin=vmin, vmax=vmax if vmax > vmin else vmin * 10)
    else:
        norm = LogNorm(vmin=1e-12, vmax=1.0)
    end = d.span[1] + d.every if len(d.steps) else 1     # (the last recorded step's cell as wide as the others)
    edges, values = _cells(d.steps, d.values, end)
    drawn = np.isfinite(values) & ((values != 0) if negative else (values > 0))
    mesh = ax.pcolormesh(edges, np.arange(L + 1), np.ma.masked_where(~drawn, values), cmap=cmap, norm=norm,
                         shading="flat")
    zeros = values == 0
    extra = [Patch(facecolor=NOT_MEASURED, edgecolor="black", linewidth=0.5, label="not measured")] \
        if (~np.isfinite(values)).any() else []
    if zeros.any():         # (on the symmetric scale too: white, not the 'not measured' grey under the mask)
        ax.pcolormesh(edges, np.arange(L + 1), np.ma.masked_where(~zeros, np.zeros_like(values)),
                      cmap=ListedColormap([ZERO]), shading="flat")
        extra.append(Patch(facecolor=ZERO, edgecolor="black", linewidth=0.5, label="0 (measured)"))
    bad_y, bad_x = np.nonzero(d.nonfinite)
    if len(bad_x):
        left = np.searchsorted(edges, d.steps[bad_x])        # (each measured step is its cell's left edge)
        ax.scatter((edges[left] + edges[left + 1]) / 2, bad_y + 0.5, marker="x",
                   color="red", s=30, linewidth=1.5, label="NaN or Inf", zorder=4)
    for j, step in enumerate(x for x in d.partial if x in d.steps):
        # (the work after the run's last step end, an evaluation's backward(): no step's values)
        left = np.searchsorted(edges, step)
        ax.axvspan(edges[left], edges[left + 1], facecolor="none", edgecolor="black", hatch="//", linewidth=0,
                   zorder=3, label="partial step (after the run's last step end)" if j == 0 else None)
    ax.set_ylim(L, 0)                                 # model order, top to bottom
    every = max(1, int(np.ceil(L / MAX_LAYER_LABELS)))
    ax.set_yticks(np.arange(0, L, every) + 0.5)
    ax.set_yticklabels([plain(d.layers[i]) for i in range(0, L, every)], fontsize=8 if L > 12 else 9)
    ax.set_xlabel("training step (a cell: the value measured at its left edge, until the next measured step)")
    ax.set_ylabel(f"layer ({d.order})")
    _integer_steps(ax)
    ax.set_xlim(d.span[0], end)                       # the trace's steps, first to last
    bar = fig.colorbar(mesh, ax=ax, pad=0.01)
    bar.set_label(plain(f"{d.kind} {d.stat}") + (" (symmetric log scale)" if negative else " (log scale)"))
    _mark(ax, d.marks, d.steps)
    _title(ax, d.title, d.marks)
    handles, labels = ax.get_legend_handles_labels()
    handles, labels = handles + extra, labels + [p.get_label() for p in extra]
    if handles:             # below the map: nothing of it hidden
        fig.legend(handles, labels, loc="outside lower center", ncol=min(len(handles), 4), fontsize=8)


def _edges(steps: np.ndarray) -> np.ndarray:
    """Cell edges around each step (steps may have gaps: a cell reaches half way)."""
    s = np.asarray(steps, dtype=float)
    if len(s) == 0:
        return np.array([0.0, 1.0])
    if len(s) == 1:
        return np.array([s[0] - 0.5, s[0] + 0.5])
    mid = (s[:-1] + s[1:]) / 2
    return np.concatenate([[s[0] - (mid[0] - s[0])], mid, [s[-1] + (s[-1] - mid[-1])]])


def _cells(steps: np.ndarray, values: np.ndarray, end: float):
    """(x edges, columns) of a heat map: the cell of a measured step starts at
    it and reaches the next measured step, or ``end``, but no further than
    the usual spacing of the measured steps; across a longer gap an empty
    column (the activations of steps 0-19 and then 32: step 19 is not drawn
    as 13 wide), and one from the last cell to ``end`` (activations measured at step 32 of a
    40-step run: steps 33-39 are not measured, not white)."""
    s = np.asarray(steps, dtype=float)
    if len(s) == 0:
        return np.array([0.0, float(end)]), np.full((values.shape[0], 1), np.nan)
    width = max(1.0, float(np.median(np.diff(s)))) if len(s) > 1 else max(1.0, end - s[0])
    edges, cols = [s[0]], []
    for i, x in enumerate(s):
        if x > edges[-1] + 1e-9:               # a gap: blank until this cell
            edges.append(x)
            cols.append(np.full(values.shape[0], np.nan))
        nxt = s[i + 1] if i + 1 < len(s) else max(float(end), x + 1)
        edges.append(min(x + width, nxt))
        cols.append(values[:, i])
    if edges[-1] < float(end) - 1e-9:          # (steps after the last measured one: not measured, to the end)
        edges.append(float(end))
        cols.append(np.full(values.shape[0], np.nan))
    return np.array(edges), np.stack(cols, axis=1)


def _loss(fig, d: LossCurve) -> None:
    ax = fig.add_subplot()
    every = np.concatenate(d.values) if d.values else np.zeros(0)
    finite = every[np.isfinite(every)]
    log = finite.size > 0 and finite.min() > 0 and finite.max() / finite.min() > 100
    for name, steps, values, bad in zip(d.names, d.steps, d.values, d.nonfinite):
        part = np.isin(steps, d.partial)
        ok = np.isfinite(values) & ~part
        xs, ys = _broken(steps[ok], values[ok], steps[bad])     # (no line across a NaN or Inf step)
        line, = ax.plot(xs, ys, marker="." if ok.sum() < 60 or bad.any() else None, linewidth=1.5,
                        label=plain(name))
        shown = part & np.isfinite(values)
        if shown.any():     # (the work after the last step end: a point of its own, not on the steps' line)
            ax.scatter(steps[shown], values[shown], marker="o", facecolors="none", edgecolors=line.get_color(),
                       s=40, zorder=4, label=f"{plain(name)}: partial step (after the run's last step end)")
        _nonfinite(ax, steps, values, bad, plain(name))
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("loss" + (" (log scale)" if log else ""))
    steps = np.concatenate(d.steps) if d.steps else np.zeros(0)
    _integer_steps(ax, steps)
    ax.grid(True, alpha=0.3)
    _mark(ax, d.marks, steps)
    _title(ax, d.title, d.marks)
    _legend(ax)


def _nonfinite(ax, steps: np.ndarray, values: np.ndarray, bad: np.ndarray, name: str) -> None:
    """A curve's measured NaN and Inf, which have no height on its axis: Inf as a triangle
    at the top edge (off the scale upwards), -Inf at the bottom edge, NaN as a cross along
    the bottom; each named so in the legend.  (An Inf loss was a cross at the bottom edge,
    labelled 'NaN or Inf': where a value near the least reads.)"""
    bad = np.asarray(bad, dtype=bool)
    v = np.asarray(values, dtype=float)
    where = ax.get_xaxis_transform()
    for which, y, marker, label in ((bad & np.isposinf(v), 0.97, "^", "Inf (off the scale, drawn at the top)"),
                                    (bad & np.isneginf(v), 0.03, "v", "-Inf (off the scale, drawn at the bottom)"),
                                    (bad & ~np.isinf(v), 0.03, "x", "NaN (no value, drawn at the bottom)")):
        if which.any():
            ax.scatter(steps[which], [y] * int(which.sum()), marker=marker, color="red", s=40, transform=where,
                       label=f"{name}: {label}", zorder=4, clip_on=False)


def _history(fig, d: History) -> None:
    top, bottom = fig.subplots(2, 1, sharex=True)
    norm = d.stats["norm"]
    part = np.isin(d.steps, d.partial)
    ok = np.isfinite(norm) & ~part
    xs, ys = _broken(d.steps[ok], norm[ok], d.recorded)
    sparse = ok.sum() < 60 or bool(np.isnan(xs).any())        # (few points, or gaps: each one shown)
    line, = top.plot(xs, ys, linewidth=1.5, marker="." if sparse else None, markersize=4,
                     label="norm (at each step it was measured)")
    shown = part & np.isfinite(norm)
    if shown.any():     # (the work after the last step end, an evaluation's backward(): a point of its own)
        top.scatter(d.steps[shown], norm[shown], marker="o", facecolors="none", edgecolors=line.get_color(), s=40,
                    zorder=4, label="norm: partial step (after the run's last step end)")
    if d.nonfinite is not None:
        _nonfinite(top, d.steps, norm, d.nonfinite, "norm")
    if d.held is not None and d.held.any():     # (a finite norm that says nothing of the NaN/Inf beside it)
        top.scatter(d.steps[d.held], norm[d.held], marker="o", facecolors="none", edgecolors="red", s=70,
                    linewidth=1.5, zorder=5, label="norm of the finite elements: the tensor held NaN or Inf")
    top.set_ylabel("norm")
    top.grid(True, alpha=0.3)
    _mark(top, d.marks, d.steps)
    _title(top, d.title, d.marks)
    _legend(top)
    mean, std = d.stats["mean"], d.stats["std"]
    full = np.isfinite(mean) & ~part          # (a partial row's are no step's: left off the band)
    if full.any():
        st, m = d.steps[full], mean[full]
        sd = np.where(np.isfinite(std[full]), std[full], 0.0)
        bottom.fill_between(st, m - sd, m + sd, alpha=0.25, label="mean ± std")
        bottom.plot(st, m, marker="o", markersize=3, linewidth=1.2, label="mean")
        for stat, style in (("min", "v"), ("max", "^")):
            v = d.stats[stat]
            k = np.isfinite(v) & ~part
            bottom.plot(d.steps[k], v[k], linestyle="none", marker=style, markersize=4, label=stat)
            _nonfinite(bottom, d.steps, v, np.isinf(v) & ~part, stat)      # (an Inf element: off the scale)
        _legend(bottom)
    else:
        bottom.text(0.5, 0.5, "mean, std, min and max were not measured on these steps",
                    transform=bottom.transAxes, ha="center", va="center", color="grey")
    bottom.set_ylabel("value (full steps)")
    bottom.set_xlabel("training step")
    bottom.grid(True, alpha=0.3)
    _integer_steps(bottom)
    bottom.set_xlim(d.span[0] - 0.5, d.span[1] + 0.5)     # the trace's steps, first to last


def _broken(steps: np.ndarray, values: np.ndarray, recorded=None) -> tuple:
    """(x, y) of a line that is not drawn across a recorded step where the
    series has no value (an activation's norm at steps 0-19, then 32, 64: no
    line from 19 to 32 or from 32 to 64, which would show values never
    measured).  Without ``recorded`` (the trace's steps), a gap is one longer
    than the usual spacing of the series' steps.  (That rule alone drew the
    line across every gap of a run of 700 steps or more, whose activations'
    usual spacing is 32, and across step 21 with --act-every 2.)"""
    s = np.asarray(steps, dtype=float)
    v = np.asarray(values, dtype=float)
    if len(s) < 2:
        return s, v
    if recorded is not None:
        rec = np.asarray(recorded, dtype=float)
        # a recorded step strictly between two neighbours: the series skipped it
        gap = np.searchsorted(rec, s[1:], side="left") - np.searchsorted(rec, s[:-1], side="right") > 0
    elif len(s) < 3:
        return s, v
    else:
        gap = np.diff(s) > max(1.0, float(np.median(np.diff(s)))) * 1.5
    if not gap.any():
        return s, v
    cut = np.flatnonzero(gap) + 1
    return np.insert(s, cut, np.nan), np.insert(v, cut, np.nan)


def _ratio(fig, d: Ratio) -> None:
    ax = fig.add_subplot()
    ax.axhspan(*d.band, color="tab:green", alpha=0.12, label=f"healthy band {d.band[0]:g}-{d.band[1]:g}")
    ax.axhline(d.target, color="tab:green", linewidth=1.2, linestyle="--", label=f"{d.target:g} (rule of thumb)")
    bad = d.nonfinite if d.nonfinite is not None else np.zeros(d.values.shape, bool)
    zero_label = "0: no update (a log scale has no 0)"
    for i, (name, row) in enumerate(zip(d.layers, d.values)):
        ok = np.isfinite(row) & (row > 0)
        # (a point on each step where there are few: a line of one point draws nothing)
        line, = ax.plot(d.steps[ok], row[ok], linewidth=1.2, label=plain(name), marker="." if ok.sum() < 60 else None,
                        **_line_style(i, len(d.layers)))
        zero = (row == 0) & ~bad[i]
        if zero.any():      # (a weight left as it was: along the bottom edge, in the layer's colour)
            ax.scatter(d.steps[zero], [0.03] * int(zero.sum()), marker="o", facecolor="none",
                       edgecolor=line.get_color(), s=30, transform=ax.get_xaxis_transform(), zorder=4,
                       label=zero_label)
            zero_label = None
    bad_y, bad_x = np.nonzero(bad)
    if len(bad_x):
        ax.scatter(d.steps[bad_x], [0.97] * len(bad_x), marker="x", color="red", s=40,
                   transform=ax.get_xaxis_transform(), label="NaN or Inf", zorder=4)
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("||update|| / ||weight|| (log scale)")
    _integer_steps(ax, d.steps)
    ax.grid(True, alpha=0.3, which="both")
    _mark(ax, d.marks, d.steps)
    _title(ax, d.title, d.marks)
    _legend(ax)


def _line_style(i: int, n: int) -> dict:
    """Distinct lines for up to 80 layers: matplotlib's 10 colours repeat, so
    past 10 lines tab20's colours, and past 20 a dash pattern too."""
    if n <= 10:
        return {}
    from matplotlib import colormaps
    return {"color": colormaps["tab20"](i % 20), "linestyle": ("-", "--", ":", "-.")[(i // 20) % 4]}


def _legend(ax) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        n = len(handles)
        if n > 8:       # many layers: beside the plot, not over it
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=1 if n <= 24 else 2,
                      borderaxespad=0)
        else:
            ax.legend(fontsize=8, loc="best", framealpha=0.85)


def draw_compare(data: dict, path: str) -> str:
    """Two histograms of one series (nndb.store.distributions.compare) side by side,
    as the share of elements in each value range, into a PNG or SVG."""
    ext = _claim(path)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(11.0, 5.5), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    bins = data["bins"]
    x = np.arange(len(bins))
    ta = sum(b["a"] for b in bins) or 1
    tb = sum(b["b"] for b in bins) or 1
    a, b = data["a"], data["b"]
    ax.bar(x - 0.2, [v["a"] / ta for v in bins], 0.4, label=f"step {a['step']}")
    ax.bar(x + 0.2, [v["b"] / tb for v in bins], 0.4, label=f"step {b['step']}")
    ax.set_xticks(x, [plain(v["range"]) for v in bins], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("share of elements")
    ks = data["ks"]
    ax.set_title(plain(f"{data['kind']} {data['name']}", 80) + f": zeros {100 * (a['zero_share'] or 0):.1f}% -> "
                 f"{100 * (b['zero_share'] or 0):.1f}%" + ("" if ks is None else f", KS {ks:.3f}"))
    ax.legend()
    return _save(fig, path, ext)
