"""nndb plot and the REPL's plot: the arrays each picture shows equal the
trace's values; the drawn file exists with the expected pixel size; bad
input is one line."""
import importlib.util
import math
import os
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import example, nndb as nndb_cli
from nndb.cli import cli
from nndb.render import plotdata as D
from nndb.store.measured import measured
from nndb.store.reader import TraceReader

FINDINGS = [{"rule": "exploding_gradient", "step": 5}, {"rule": "update_ratio", "step": 5},
            {"rule": "nonfinite", "step": 6}]
STOPS = [{"step": 3, "reason": "breakpoint", "id": 1, "detail": {}}]


@pytest.fixture(scope="module")
def nan_trace(tmp_path_factory):
    """nan_lr.py recorded in this process, stopped at step 8 where the REPL's plot is typed."""
    import gc
    from nndb.run.config import RunConfig
    from nndb.driver import DebugOptions, debug
    from nndb.frontends.batch import ScriptedFrontend
    from nndb.run.launcher import Target
    import importlib.util
    gc.collect()
    path = str(tmp_path_factory.mktemp("trace") / "nan.h5")
    fe = ScriptedFrontend([])
    # (the plot commands need matplotlib: without it, they would end the batch run with 2)
    typed = ("until 8", "plot grad 0*", "plot loss", "plot act * zero_frac") \
        if importlib.util.find_spec("matplotlib") else ()
    result = debug(RunConfig(Target(path=example("nan_lr.py"), args=[]), path, quiet=True),
                   DebugOptions(batch=True, no_rc=True, eval_commands=typed), fe)
    assert result.exit_code == 0
    return path, fe.output


def column(reader, name, kind, stat):
    (s,) = reader.find(name, kind)
    steps, block = reader.history(s)
    j = reader.columns.index(stat)
    return steps, np.where(measured(block, reader.columns)[:, j], block[:, j], np.nan)


def same(a, b):
    np.testing.assert_array_equal(np.asarray(a, dtype=float), np.asarray(b, dtype=float))


def test_heatmap_data_is_the_trace_in_model_order(nan_trace):
    path, _ = nan_trace
    with TraceReader(path) as r:
        d = D.heatmap(r, "grad", "norm", None, FINDINGS)
        grads = [s.name for s in r.series() if s.kind == "grad"]
        assert d.layers == grads == ["0.weight", "0.bias", "2.weight", "2.bias"]
        same(d.steps, r.steps)
        for i, name in enumerate(d.layers):
            steps, v = column(r, name, "grad", "norm")
            same(steps, d.steps)
            same(d.values[i], v)
            assert (d.nonfinite[i] == ~np.isfinite(v)).all()
        assert {(m.step, m.label) for m in d.marks} == {(5, "exploding_gradient"), (5, "update_ratio"),
                                                        (6, "nonfinite")}
        act = D.heatmap(r, "act", "zero_frac", "*")
        # only the steps where some activation's zero_frac was measured (not every step measures it)
        measured_at = set()
        for name in act.layers:
            steps, v = column(r, name, "act", "zero_frac")
            measured_at |= {int(st) for st, x in zip(steps, v) if not np.isnan(x)}
        assert act.steps.tolist() == sorted(measured_at) and 0 < len(measured_at) < r.n_steps


def test_loss_history_and_ratio_data_are_the_trace(nan_trace):
    path, _ = nan_trace
    with TraceReader(path) as r:
        loss = D.loss(r, FINDINGS, STOPS)
        steps, v = column(r, "loss", "loss", "mean")
        same(loss.steps[0], steps)
        same(loss.values[0], v)
        assert list(np.flatnonzero(loss.nonfinite[0])) == list(np.flatnonzero(~np.isfinite(v)))
        assert loss.nonfinite[0][6] and math.isinf(loss.values[0][6])
        assert [(m.step, m.kind) for m in loss.marks][-1] == (3, "stop")

        h = D.history(r, "0.weight", "param")
        for stat in D.HISTORY_STATS:
            steps, v = column(r, "0.weight", "param", stat)
            same(h.steps, steps)
            same(h.stats[stat], v)

        ratio = D.ratio(r)
        assert ratio.layers == ["0.weight", "2.weight"]          # weights; biases only by a glob
        for i, name in enumerate(ratio.layers):
            _, u = column(r, name, "update", "norm")
            _, w = column(r, name, "param", "norm")
            with np.errstate(invalid="ignore", divide="ignore"):
                same(ratio.values[i], np.where(w > 0, u / w, np.nan))
        assert D.ratio(r, "*bias").layers == ["0.bias", "2.bias"]


@pytest.mark.parametrize("what,args", [("heatmap", {}), ("loss", {}), ("history", {"glob": "2.weight"}),
                                       ("ratio", {})])
def test_each_picture_is_drawn_at_its_size(nan_trace, tmp_path, what, args):
    mpimg = pytest.importorskip("matplotlib.image")
    from nndb.render.pictures import gather, picture
    from nndb.render.plot import pixel_size
    path, _ = nan_trace
    with TraceReader(path) as r:
        out = picture(r, what, findings=FINDINGS, stops=STOPS, output=str(tmp_path / f"{what}.png"), **args)
        h, w = mpimg.imread(out).shape[:2]
        assert (w, h) == pixel_size(gather(r, what, **args))
        svg = picture(r, what, output=str(tmp_path / f"{what}.svg"), **args)
        assert open(svg).read(200).startswith("<?xml")


def test_the_repl_plot_command_writes_beside_the_trace(nan_trace):
    pytest.importorskip("matplotlib")
    path, output = nan_trace
    base = os.path.splitext(path)[0]
    for name in ("heatmap-grad-0all-norm", "loss", "heatmap-act-all-zero_frac"):
        assert f"wrote {base}-{name}.png" in output
        assert os.path.getsize(f"{base}-{name}.png") > 1000


def test_the_plot_command_is_in_the_table_with_its_help():
    from nndb.commands import TABLE
    assert TABLE.lookup("plot").usage.startswith("plot [heatmap|loss|history|ratio]")
    assert TABLE.parse("plot grad conv*")[1] == ("heatmap", "grad", "conv*", "norm")
    assert TABLE.parse("plot history fc1.weight")[1] == ("history", None, "fc1.weight", "norm")
    from nndb.errors import CommandError
    with pytest.raises(CommandError, match="needs a tensor"):
        TABLE.parse("plot history")


def test_cli_plot_prints_the_path(nan_trace, tmp_path):
    pytest.importorskip("matplotlib")
    path, _ = nan_trace
    out = tmp_path / "g.png"
    res = CliRunner().invoke(cli, ["plot", path, "--kind", "grad", "--glob", "2.*", "-o", str(out)])
    assert (res.exit_code, res.output) == (0, f"{out}\n") and out.exists()


@pytest.mark.parametrize("args,message", [
    (["NOPE.h5"], "nndb: error: no such trace: NOPE.h5\n"),
    (["TRACE", "--glob", "conv*"], "nndb: error: no grad tensor matches 'conv*' in TRACE\n"),
    (["TRACE", "-o", "/nonexistent/dir/x.png"], "nndb: error: cannot write /nonexistent/dir/x.png: "
                                                "No such file or directory\n"),
    (["TRACE", "-o", "x.jpg"], "nndb: error: cannot write a picture to x.jpg: the name must end in .png or .svg\n"),
    (["TRACE", "--what", "history"], "nndb: error: a history needs the tensor's name (--glob NAME)\n"),
    (["TRACE", "--report", "TRACE"], "nndb: error: cannot read the report TRACE: "),
])
def test_bad_input_is_one_line_and_exit_2(nan_trace, args, message):
    pytest.importorskip("matplotlib")
    path, _ = nan_trace
    res = CliRunner().invoke(cli, ["plot", *[path if a == "TRACE" else a for a in args]])
    assert res.exit_code == 2
    assert res.output.startswith(message.replace("TRACE", path)) and res.output.count("\n") == 1


def test_without_matplotlib_one_line(nan_trace, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    res = CliRunner().invoke(cli, ["plot", nan_trace[0]])
    assert (res.exit_code, res.output) == (2, "nndb: error: nndb plot needs the plot extra: "
                                              "pip install 'nndb[plot]'\n")


def test_names_from_the_trace_are_drawn_as_written(tmp_path):
    """A '$' in a tensor or rule name would start matplotlib's math mode; a bad formula would raise."""
    pytest.importorskip("matplotlib")
    from nndb.render.plot import draw
    d = D.Heatmap("grad", "norm", ["a$b", "$\\frac{$", "x" * 300], np.array([0, 1]),
                  np.array([[1.0, 2.0], [3.0, np.inf], [np.nan, 0.5]]),
                  np.array([[False, False], [False, True], [False, False]]),
                  [D.Mark(1, "rule$x$")], title="script$ {bad")
    assert os.path.getsize(draw(d, str(tmp_path / "h.png"))) > 1000


def test_without_matplotlib_the_repl_plot_is_one_error_line(tmp_path, monkeypatch):
    from conftest import run_in_process
    from nndb.frontends.batch import ScriptedFrontend
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    fe = ScriptedFrontend(["until 2", "plot grad", "continue"])
    from nndb.driver import DebugOptions, debug
    from nndb.run.config import RunConfig
    from nndb.run.launcher import Target
    debug(RunConfig(Target(path=example("mlp.py"), args=["--steps", "4"]), str(tmp_path / "t.h5"), quiet=True),
          DebugOptions(batch=False, no_rc=True, stop_at_start=True), fe)
    said = "\n".join(fe.output)
    assert "needs the plot extra: pip install 'nndb[plot]'" in said and "Traceback" not in said


def test_history_draws_a_terminal_chart_at_the_prompt_only(tmp_path):
    from nndb.run.config import RunConfig
    from nndb.driver import DebugOptions, debug
    from nndb.frontends.batch import ScriptedFrontend
    from nndb.run.launcher import Target
    outputs = {}
    for batch in (False, True):
        fe = ScriptedFrontend(["until 30", "history loss loss mean --last 3", "continue"])
        debug(RunConfig(Target(path=example("mlp.py"), args=["--steps", "40"]), str(tmp_path / f"{batch}.h5"),
                        quiet=True), DebugOptions(batch=batch, no_rc=True, stop_at_start=True), fe)
        outputs[batch] = "\n".join(fe.output)
    prompt = outputs[False].split("history loss loss mean --last 3")[1]
    chart_rows = [l for l in prompt.splitlines() if " │" in l]
    assert len(chart_rows) == 8 and any("█" in l for l in chart_rows)
    assert "└" in prompt and prompt.count("(step") == 1
    assert " │" not in outputs[True]          # batch mode: the numbers only


def test_the_chart_follows_the_values():
    from nndb.render.chart import EIGHTHS, chart
    lines = chart(list(range(8)), [0.0, 1.0, 2.0, 3.0, None, math.inf, 7.0, 1.0], height=4, width=8)
    bars = [l.split("│")[1] for l in lines[:4]]
    heights = [sum(EIGHTHS.index(row[i]) if row[i] in EIGHTHS else 0 for row in bars) for i in range(8)]
    assert heights[0] < heights[1] < heights[2] < heights[3] < heights[6]      # taller for larger values
    assert heights[4] == 0 and bars[0][5] == "!"      # not measured: blank; Inf: '!' on top
    assert lines[0].startswith("7 ") and lines[3].startswith("0 ")
    assert chart([0, 1], [None, None]) == []


@pytest.fixture(scope="module")
def relu_trace(tmp_path_factory):
    """mlp.py (Linear, ReLU, ...) recorded for 61 steps in this process: zero_frac is measured at the full
    steps only (0 and 32), 0 on the Linear layers' outputs and about a half on the ReLUs'."""
    import gc
    from nndb.run.config import RunConfig
    from nndb.driver import DebugOptions, debug
    from nndb.frontends.batch import ScriptedFrontend
    from nndb.run.launcher import Target
    gc.collect()
    path = str(tmp_path_factory.mktemp("relu") / "t.h5")
    result = debug(RunConfig(Target(path=example("mlp.py"), args=["--steps", "61"]), path, quiet=True),
                   DebugOptions(batch=True, no_rc=True, rules="none"), ScriptedFrontend([]))
    assert result.exit_code == 0
    return path


def test_the_heatmap_as_a_user_sees_it_steps_zeros_and_layers(relu_trace):
    """The picture, not only its file: the x axis spans the trace's steps, each
    measured value sits at its step, a measured 0 is drawn (white) apart from
    'not measured' (grey), and the rows are the layers named in order."""
    pytest.importorskip("matplotlib")
    from nndb.render.plot import ZERO, figure
    with TraceReader(relu_trace) as r:
        d = D.heatmap(r, "act", "zero_frac")
        first, last = int(r.steps[0]), int(r.steps[-1])
    assert (first, last) == (0, 60) and d.steps.tolist() == [0, 32]
    fig = figure(d)
    ax = fig.axes[0]
    assert ax.get_xlim() == (0.0, 61.0)                     # steps 0..60, none cut off, none negative
    assert [t.get_text() for t in ax.get_yticklabels()] == d.layers
    mesh, zeros = ax.collections[0], ax.collections[1]
    x_edges = mesh.get_coordinates()[0, :, 0]
    assert x_edges.tolist() == [0.0, 32.0, 61.0]             # a cell from each measured step
    shown = mesh.get_array()
    zero_rows = [i for i in range(len(d.layers)) if np.all(d.values[i] == 0)]
    relu_rows = [i for i in range(len(d.layers)) if np.all(d.values[i] > 0.2)]
    assert zero_rows and relu_rows
    for i in zero_rows:                                      # a measured 0: on the white layer, not missing
        assert np.all(shown.mask[i]) and not np.any(zeros.get_array().mask[i])
    for i in relu_rows:                                      # measured values: on the colour scale
        assert np.allclose(shown[i].compressed(), d.values[i])
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "0 (measured)" in legend and "not measured" not in legend
    assert zeros.get_cmap()(0)[:3] == tuple(int(ZERO[k:k + 2], 16) / 255 for k in (1, 3, 5))
    # grads: measured every step, the axis the steps'
    with TraceReader(relu_trace) as r:
        g = figure(D.heatmap(r, "grad", "norm")).axes[0]
    assert g.get_xlim() == (0.0, 61.0)


def test_layers_are_in_the_models_registration_order_not_the_optimizers(tmp_path):
    """Registration order fc1, ln, fc2, whatever the optimizer's groups or the
    order the series were first recorded in; a trace without the model order
    keeps the series' order and the axis says so."""
    import gc
    import h5py
    from nndb.run.config import RunConfig
    from nndb.driver import DebugOptions, debug
    from nndb.frontends.batch import ScriptedFrontend
    from nndb.run.launcher import Target
    gc.collect()
    path = str(tmp_path / "t.h5")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "plot_order_groups.py")
    debug(RunConfig(Target(path=script, args=[]), path, quiet=True), DebugOptions(batch=True, no_rc=True,
                                                                                  rules="none"), ScriptedFrontend([]))
    want = ["fc1.weight", "fc1.bias", "ln.weight", "ln.bias", "fc2.weight", "fc2.bias"]
    with TraceReader(path) as r:
        recorded = [s.name for s in r.series() if s.kind == "grad"]
        assert recorded != want                           # (what made the old order wrong)
        d = D.heatmap(r, "grad", "norm")
        assert d.layers == want and d.order == D.ORDER_KNOWN
        assert D.heatmap(r, "act", "norm").layers[:3] == ["fc1", "ln", "fc2"]
        assert D.ratio(r).layers == ["fc1.weight", "fc2.weight"]
    if importlib.util.find_spec("matplotlib"):
        from nndb.render.plot import figure
        ax = figure(d).axes[0]
        assert [t.get_text() for t in ax.get_yticklabels()] == want and ax.get_ylabel() == "layer (model order)"
    with h5py.File(path, "r+") as f:                      # as a trace written before the model order
        del f["modules"]
    with TraceReader(path) as r:
        old = D.heatmap(r, "grad", "norm")
    assert old.layers == recorded and old.order == "recording order: this trace predates the model order"


KFOLD = """
import torch, torch.nn as nn
torch.manual_seed(0)
X = torch.randn(60, 4); y = (X[:, 0] > 0).long()
for fold in range(3):
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(3):
        opt.zero_grad()
        nn.functional.cross_entropy(model(X), y).backward()
        opt.step()
"""


def test_a_k_fold_trace_draws_each_fold_s_layers_in_the_order_the_folds_ran(tmp_path):
    """Each fold's model is a modules row of its own: the layers were ordered by the last
    row alone, so the last fold's came first, above the first fold's, the second's last."""
    path = str(tmp_path / "t.h5")
    script = tmp_path / "kfold.py"
    script.write_text(KFOLD)
    r = nndb_cli("run", "--batch", "-q", "--rules", "none", "--trace", path, str(script))
    assert r.returncode == 0, r.stderr
    with TraceReader(path) as t:
        layers = D.heatmap(t, "grad", "norm").layers
        first = {name: int(t.history(s)[0][0]) for name, s in ((s.name, s) for s in t.series() if s.kind == "grad")}
    assert layers == sorted(layers, key=lambda name: first[name]) and len(layers) == 12, layers
    assert layers[:4] == ["0.weight", "0.bias", "2.weight", "2.bias"], layers


def test_steps_after_the_last_measured_one_are_drawn_not_measured(tmp_path):
    """Activations (norm) are measured at steps 0-19 and 32 of a 40-step run: steps 33-39 were drawn
    white, a measured 0's colour, for the last cell reached only one step."""
    pytest.importorskip("matplotlib")
    import gc
    from nndb.run.config import RunConfig
    from nndb.driver import DebugOptions, debug
    from nndb.frontends.batch import ScriptedFrontend
    from nndb.run.launcher import Target
    from nndb.render.plot import figure
    gc.collect()
    path = str(tmp_path / "t.h5")
    assert debug(RunConfig(Target(path=example("mlp.py"), args=["--steps", "40"]), path, quiet=True),
                 DebugOptions(batch=True, no_rc=True, rules="none"), ScriptedFrontend([])).exit_code == 0
    with TraceReader(path) as r:
        d = D.heatmap(r, "act", "norm")
    assert d.steps.tolist() == list(range(20)) + [32]
    fig = figure(d)
    mesh = fig.axes[0].collections[0]
    x_edges = mesh.get_coordinates()[0, :, 0]
    assert x_edges.tolist()[-3:] == [32.0, 33.0, 40.0]       # step 32's cell, then 33..39 to the axis' end
    assert np.all(mesh.get_array().mask[:, -1])              # the last column: no value (grey), not a 0
    assert not np.any(mesh.get_array().mask[:, -2])
    assert "not measured" in [t.get_text() for t in fig.legends[0].get_texts()]


def test_a_measured_zero_beside_negative_values_is_white_not_grey(tmp_path):
    """dead_relu.py's act mean: fc2's outputs are about -10, the dead ReLU's (act#2) exactly 0.  On the
    symmetric log scale the 0 was masked with the 'not measured' values and drawn in their grey (with no
    legend entry): a dead layer read as one nndb never measured."""
    pytest.importorskip("matplotlib")
    import gc
    from nndb.run.config import RunConfig
    from nndb.driver import DebugOptions, debug
    from nndb.frontends.batch import ScriptedFrontend
    from nndb.run.launcher import Target
    from nndb.render.plot import figure
    gc.collect()
    path = str(tmp_path / "t.h5")
    assert debug(RunConfig(Target(path=example("dead_relu.py"), args=["--steps", "3"]), path, quiet=True),
                 DebugOptions(batch=True, no_rc=True, rules="none"), ScriptedFrontend([])).exit_code == 0
    with TraceReader(path) as r:
        d = D.heatmap(r, "act", "mean")
    dead, neg = d.layers.index("act#2"), d.layers.index("fc2")
    assert np.all(d.values[dead] == 0) and np.all(d.values[neg] < -5)
    fig = figure(d)
    ax = fig.axes[0]
    assert "symmetric log scale" in fig.axes[1].get_ylabel()
    mesh, zeros = ax.collections[0], ax.collections[1]
    assert np.all(mesh.get_array().mask[dead]) and not np.any(zeros.get_array().mask[dead])
    assert not np.any(mesh.get_array().mask[neg])
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "0 (measured)" in legend and "not measured" not in legend


def test_ratio_and_history_show_a_zero_update_and_a_nonfinite_norm(nan_trace, tmp_path):
    """A picture left these out silently: the ratio plot of dead_relu.py (every weight's update exactly 0:
    no gradient flows past the dead ReLU) drew no line at all, only the legend's, and nan_lr.py's ratio and
    0.weight history ended at step 5 as if the run had, where the norms are Inf, then NaN, from step 6 on.
    Now a 0 is a hollow circle along the bottom edge (a log scale has no 0) and a NaN/Inf a red cross, as
    on the loss curve."""
    pytest.importorskip("matplotlib")
    import gc
    from nndb.run.config import RunConfig
    from nndb.driver import DebugOptions, debug
    from nndb.frontends.batch import ScriptedFrontend
    from nndb.run.launcher import Target
    from nndb.render.plot import figure

    def legend_of(ax):
        return [t.get_text() for t in ax.get_legend().get_texts()]

    def crosses(ax):
        return [c for c in ax.collections if c.get_label() == "NaN or Inf" or c.get_label().startswith("norm: ")]

    path, _ = nan_trace
    with TraceReader(path) as r:
        ratio, hist = D.ratio(r), D.history(r, "0.weight", "param")
        _, w = column(r, "0.weight", "param", "norm")
    bad = ~np.isfinite(w)
    assert bad[6:].all() and not bad[:6].any()
    assert ratio.nonfinite[0].tolist() == bad.tolist() and hist.nonfinite.tolist() == bad.tolist()
    ax = figure(ratio).axes[0]
    (c,) = crosses(ax)
    assert sorted({int(round(x)) for x, _ in c.get_offsets()}) == list(range(6, int(r.steps[-1]) + 1))
    assert "NaN or Inf" in legend_of(ax)
    top = figure(hist).axes[0]
    assert sorted(int(round(x)) for c in crosses(top) for x, _ in c.get_offsets()) == np.flatnonzero(bad).tolist()

    gc.collect()
    dead = str(tmp_path / "dead.h5")
    assert debug(RunConfig(Target(path=example("dead_relu.py"), args=["--steps", "4"]), dead, quiet=True),
                 DebugOptions(batch=True, no_rc=True, rules="none"), ScriptedFrontend([])).exit_code == 0
    with TraceReader(dead) as r:
        d = D.ratio(r)
        for i, name in enumerate(d.layers):
            _, u = column(r, name, "update", "norm")
            assert np.all(u == 0) and np.all(d.values[i] == 0)
    ax = figure(d).axes[0]
    assert all(len(line.get_xdata()) == 0 for line in ax.get_lines() if line.get_label() in d.layers)
    zeros = [c for c in ax.collections if c.get_offsets().shape[0] == 4 and not crosses(ax).count(c)]
    assert len(zeros) == len(d.layers)                        # one row of circles per layer, steps 0..3
    for c in zeros:
        assert sorted(int(round(x)) for x, _ in c.get_offsets()) == [0, 1, 2, 3]
    assert "0: no update (a log scale has no 0)" in legend_of(ax)


def test_a_history_draws_no_line_across_steps_that_were_not_measured(relu_trace):
    """An activation's norm is measured at steps 0-19, 32 (and the full steps); its history drew one line
    through them, labelled 'every recorded step', from 19 to 32 as if measured between, and its x axis ran
    to 76 for a 61-step trace (the last cell's edge)."""
    pytest.importorskip("matplotlib")
    from nndb.render.plot import figure
    with TraceReader(relu_trace) as r:
        d = D.history(r, "1", "act")
        w = D.history(r, "0.weight", "param")
    assert d.steps.tolist() == list(range(20)) + [32]
    top = figure(d).axes[0]
    (line,) = [l for l in top.get_lines() if l.get_label().startswith("norm")]
    assert line.get_label() == "norm (at each step it was measured)"
    x = np.asarray(line.get_xdata(), dtype=float)
    assert np.isnan(x[20]) and x[:20].tolist() == list(range(20)) and x[21] == 32     # no line from 19 to 32
    same(np.asarray(line.get_ydata(), dtype=float)[[*range(20), 21]], d.stats["norm"])
    assert top.get_xlim() == (-0.5, 60.5)
    wl = [l for l in figure(w).axes[0].get_lines() if l.get_label().startswith("norm")][0]
    assert not np.isnan(np.asarray(wl.get_xdata(), dtype=float)).any()     # a weight's: every step, unbroken


TINY = """
import sys, torch, torch.nn as nn
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
x = torch.randn(32, 4); y = x.sum(1, keepdim=True)
for it in range(int(sys.argv[1])):
    opt.zero_grad(); loss = ((m(x) - y) ** 2).mean(); loss.backward(); opt.step()
"""


@pytest.mark.parametrize("steps,act_every,observed", [
    # the default schedule over a long run: steps 0-19, then every 32nd; their usual spacing is 32
    (700, None, list(range(20)) + list(range(32, 700, 32))),
    # every 2nd step after the first 20: 20, 22, ... (21, 23, ... not measured)
    (40, 2, list(range(20)) + list(range(20, 40, 2))),
])
def test_a_history_breaks_its_line_at_every_recorded_step_it_skips(tmp_path, steps, act_every, observed):
    """A gap was one longer than 1.5 times the series' usual spacing: over 700 steps an activation's
    usual spacing is 32 (22 gaps of 32 against 19 of 1), so its norm was one line through steps 19, 32,
    64, ... as if measured between them; with --act-every 2, a line from 20 to 22 across step 21."""
    pytest.importorskip("matplotlib")
    import gc
    from nndb.driver import DebugOptions, debug
    from nndb.frontends.batch import ScriptedFrontend
    from nndb.render.plot import figure
    from nndb.run.config import RecordSchedule, RunConfig
    from nndb.run.launcher import Target
    from nndb.store.reader import TraceReader
    gc.collect()
    script = tmp_path / "tiny.py"
    script.write_text(TINY)
    path = str(tmp_path / "t.h5")
    schedule = RecordSchedule.parse(None, None, None, act_every)
    assert debug(RunConfig(Target(path=str(script), args=[str(steps)]), path, quiet=True, schedule=schedule),
                 DebugOptions(batch=True, no_rc=True, rules="none"), ScriptedFrontend([])).exit_code == 0
    with TraceReader(path) as r:
        assert r.steps.tolist() == list(range(steps))
        d = D.history(r, "1", "act")
        w = D.history(r, "0.weight", "param")
    assert d.steps.tolist() == observed
    (line,) = [l for l in figure(d).axes[0].get_lines() if l.get_label().startswith("norm")]
    x = np.asarray(line.get_xdata(), dtype=float)
    segments = [[int(v) for v in seg if not np.isnan(v)] for seg in np.split(x, np.flatnonzero(np.isnan(x)))]
    for seg in filter(None, segments):      # each joins steps with no recorded step between them
        assert seg == list(range(seg[0], seg[-1] + 1)), seg
    assert sum(map(len, segments)) == len(observed)
    same(np.asarray(line.get_ydata(), dtype=float)[~np.isnan(x)], d.stats["norm"])
    wl = [l for l in figure(w).axes[0].get_lines() if l.get_label().startswith("norm")][0]
    assert not np.isnan(np.asarray(wl.get_xdata(), dtype=float)).any()     # a weight's: every step, unbroken


NAN_ONCE = """
import torch, torch.nn as nn
torch.manual_seed(0)
m = nn.Linear(4, 1)
opt = torch.optim.SGD(m.parameters(), lr=0.01)
x = torch.randn(16, 4); y = x.sum(1, keepdim=True)
for it in range(10):
    opt.zero_grad()
    loss = ((m(x) * (float("nan") if it == 5 else 1.0) - y) ** 2).mean()
    loss.backward()
    if it == 5:
        opt.zero_grad()             # a bad batch: its step skipped
    opt.step()
    print(it, loss.item())
"""


def test_the_loss_curve_draws_no_line_across_a_nan_step(tmp_path):
    """A NaN loss at step 5 of 10 (the script skips that step's update): the curve went straight from
    step 4's loss to step 6's, a line through a step whose loss was NaN (its cross along the bottom)."""
    pytest.importorskip("matplotlib")
    from conftest import plain_and_recorded
    from nndb.render.plot import figure
    plain, path = plain_and_recorded(tmp_path, NAN_ONCE)
    printed = [float(line.split()[1]) for line in plain.stdout.splitlines()]
    with TraceReader(path) as r:
        d = D.loss(r)
    ax = figure(d).axes[0]
    (line,) = [l for l in ax.get_lines() if l.get_label() == "loss"]
    x = np.asarray(line.get_xdata(), dtype=float)
    y = np.asarray(line.get_ydata(), dtype=float)
    assert np.isnan(x).tolist() == [i == 5 for i in range(10)]      # steps 0-4, a break, 6-9
    assert x[~np.isnan(x)].tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    assert y[~np.isnan(y)].tolist() == [v for i, v in enumerate(printed) if i != 5] and math.isnan(printed[5])
    (c,) = [c for c in ax.collections if c.get_label() == "loss: NaN (no value, drawn at the bottom)"]
    assert [int(round(p[0])) for p in c.get_offsets()] == [5]


def test_the_loss_of_a_partial_last_row_is_a_point_of_its_own(tmp_path):
    """A script that ends with an evaluation's backward() after its last step keeps that
    loss as a partial row (step 4 after steps 0-3): `nndb plot --what loss` drew it on the
    training loss's line as if it were step 4's loss.  It is a hollow point, named in the
    legend, off the line; the line ends at step 3."""
    pytest.importorskip("matplotlib")
    from nndb.render.plot import figure
    script = tmp_path / "evalbw.py"
    script.write_text("import torch\ntorch.manual_seed(0)\nm = torch.nn.Linear(3, 1)\n"
                      "opt = torch.optim.SGD(m.parameters(), lr=0.1)\nx = torch.randn(8, 3)\n"
                      "for step in range(4):\n    opt.zero_grad()\n    loss = m(x).pow(2).mean()\n"
                      "    loss.backward()\n    opt.step()\n    print(repr(loss.item()))\n"
                      "ev = (m(x) - 1).pow(2).mean()\nev.backward()\nprint(repr(ev.item()))\n")
    path = str(tmp_path / "t.h5")
    r = nndb_cli("run", "--batch", "-q", "--trace", path, str(script))
    assert r.returncode == 0, r.stderr
    printed = [float(x) for x in r.stdout.split()]
    with TraceReader(path) as rd:
        d = D.loss(rd)
    assert d.partial.tolist() == [4] and d.steps[0].tolist() == [0, 1, 2, 3, 4]
    assert d.values[0].tolist() == pytest.approx(printed, rel=1e-6)
    ax = figure(d).axes[0]
    line = ax.lines[0]
    assert line.get_xdata().tolist() == [0, 1, 2, 3]
    assert line.get_ydata().tolist() == pytest.approx(printed[:4], rel=1e-6)
    point = [c for c in ax.collections if "partial step" in c.get_label()]
    assert len(point) == 1 and point[0].get_offsets().tolist() == [[4, pytest.approx(printed[4], rel=1e-6)]]


def _recorded(tmp_path, text: str) -> str:
    """The trace of a script of ``text`` run under nndb (no rules)."""
    (tmp_path / "script.py").write_text(text)
    path = str(tmp_path / "t.h5")
    r = nndb_cli("run", "--batch", "-q", "--rules", "none", "--trace", path, str(tmp_path / "script.py"))
    assert r.returncode == 0, r.stderr
    return path


def test_with_every_5_the_last_recorded_steps_cell_is_5_wide_and_its_crosses_centred(tmp_path):
    """nan_lr.py recorded every 5 steps (0..25): the heat map drew step 25's cell from 25 to 26
    where the others are 5 wide, and each NaN's cross half a step right of its cell's left edge."""
    pytest.importorskip("matplotlib")
    import gc
    from nndb.run.config import RecordSchedule, RunConfig
    from nndb.driver import DebugOptions, debug
    from nndb.frontends.batch import ScriptedFrontend
    from nndb.run.launcher import Target
    from nndb.render.plot import figure
    gc.collect()
    path = str(tmp_path / "t.h5")
    assert debug(RunConfig(Target(path=example("nan_lr.py"), args=[]), path, RecordSchedule.parse(5, None),
                           quiet=True), DebugOptions(batch=True, no_rc=True, rules="none"),
                 ScriptedFrontend([])).exit_code == 0
    with TraceReader(path) as r:
        d = D.heatmap(r, "grad", "norm")
    assert d.steps.tolist() == [0, 5, 10, 15, 20, 25]
    ax = figure(d).axes[0]
    assert ax.collections[0].get_coordinates()[0, :, 0].tolist() == [0, 5, 10, 15, 20, 25, 30]
    assert ax.get_xlim() == (0.0, 30.0)
    (crosses,) = [c for c in ax.collections if c.get_label() == "NaN or Inf"]
    assert sorted({x for x, _ in crosses.get_offsets().tolist()}) == [12.5, 17.5, 22.5, 27.5]


def test_an_inf_loss_is_drawn_at_the_top_and_a_nan_at_the_bottom_each_named(tmp_path):
    """The loss is 2.997 at step 5, Inf at 6, NaN at 7: the Inf was a red cross at the bottom edge, where a
    loss near its least reads, labelled 'NaN or Inf'.  It is a triangle at the top edge, named off the scale."""
    pytest.importorskip("matplotlib")
    from nndb.render.plot import figure
    path = _recorded(tmp_path, "import torch\ntorch.manual_seed(0)\nm = torch.nn.Linear(3, 1)\n"
                               "opt = torch.optim.SGD(m.parameters(), lr=0.0)\nx = torch.randn(8, 3)\n"
                               "extra = [0.0] * 5 + [2.997, float('inf'), float('nan'), 1.0]\n"
                               "for step in range(9):\n    opt.zero_grad()\n"
                               "    loss = m(x).mean() * 0 + 1 + extra[step]\n    loss.backward()\n    opt.step()\n")
    with TraceReader(path) as rd:
        ax = figure(D.loss(rd)).axes[0]
    marks = {c.get_label(): c for c in ax.collections if c.get_label().startswith("loss: ")}
    assert sorted(marks) == ["loss: Inf (off the scale, drawn at the top)", "loss: NaN (no value, drawn at the bottom)"]
    assert marks["loss: Inf (off the scale, drawn at the top)"].get_offsets().tolist() == [[6, 0.97]]
    assert marks["loss: NaN (no value, drawn at the bottom)"].get_offsets().tolist() == [[7, 0.03]]


# Four steps, then an evaluation's backward(): a partial row at step 4.
EVAL_AFTER_STEPS = ("import torch\ntorch.manual_seed(0)\nm = torch.nn.Linear(3, 1)\n"
                    "opt = torch.optim.SGD(m.parameters(), lr=0.1)\nx = torch.randn(8, 3)\n"
                    "for step in range(4):\n    opt.zero_grad()\n    loss = m(x).pow(2).mean()\n"
                    "    loss.backward()\n    opt.step()\nev = (m(x) - 1).pow(2).mean()\nev.backward()\n")


def test_the_heatmap_hatches_a_partial_last_row(tmp_path):
    """An evaluation's backward() after steps 0-3 leaves a partial row at step 4: the heat map drew its
    gradients (bias norm 2.7 against 0.40 at step 3) as step 4's, with nothing to tell them apart.  Its
    cell is hatched and named in the legend, as the loss curve draws that loss as a point of its own."""
    pytest.importorskip("matplotlib")
    from nndb.render.plot import figure
    path = _recorded(tmp_path, EVAL_AFTER_STEPS)
    with TraceReader(path) as rd:
        d = D.heatmap(rd, "grad", "norm")
    assert d.steps.tolist() == [0, 1, 2, 3, 4] and d.partial.tolist() == [4]
    fig = figure(d)
    (span,) = [p for p in fig.axes[0].patches if p.get_label() == "partial step (after the run's last step end)"]
    assert (span.get_x(), span.get_x() + span.get_width()) == (4, 5) and span.get_hatch() == "//"
    assert "partial step (after the run's last step end)" in [t.get_text() for t in fig.legends[0].get_texts()]


def test_the_heatmap_crosses_a_cell_whose_tensor_held_nan_beside_finite_values(tmp_path):
    """A gradient with one NaN among finite elements has a finite norm (its finite elements',
    trace-format.md): the heat map drew that cell as an ordinary colour, no cross, so the
    picture said the gradient was finite at that step (a diverging run's step 7: 0.weight's
    grad held 147 NaN and 40 Inf, its cell the brightest of the map, uncrossed).  The cell
    keeps its colour and gets the red cross; the bias, all finite, none."""
    pytest.importorskip("matplotlib")
    from nndb.render.plot import figure
    path = _recorded(tmp_path, "import torch\ntorch.manual_seed(0)\nm = torch.nn.Linear(3, 2)\n"
                               "opt = torch.optim.SGD(m.parameters(), lr=0.1)\nx = torch.randn(8, 3)\n"
                               "for step in range(4):\n    opt.zero_grad()\n    m(x).pow(2).mean().backward()\n"
                               "    if step == 2:\n        m.weight.grad[0, 0] = float('nan')\n"
                               "    opt.step()\n    with torch.no_grad():\n        m.weight.nan_to_num_(0.5)\n")
    with TraceReader(path) as rd:
        d, counts = D.heatmap(rd, "grad", "norm"), D.heatmap(rd, "grad", "nan_count")
        (w,) = rd.find("weight", "grad")
        assert rd.history(w, "nan_count")[1].tolist() == [0, 0, 1, 0]
    assert d.layers == ["weight", "bias"] and d.steps.tolist() == [0, 1, 2, 3]
    assert np.isfinite(d.values).all()                # the norms: of the finite elements
    assert d.nonfinite.tolist() == [[False, False, True, False], [False] * 4]
    fig = figure(d)
    (cross,) = [c for c in fig.axes[0].collections if c.get_label() == "NaN or Inf"]
    assert cross.get_offsets().tolist() == [[2.5, 0.5]]
    assert not counts.nonfinite.any()               # (a count says it itself)


def test_the_history_rings_a_finite_norm_of_a_tensor_that_held_inf_and_shows_its_inf_max(tmp_path):
    """The same for `--what history`: a gradient with one Inf element at step 2 has a finite
    norm, drawn as a plain point on the line, and its max (inf), measured there with all ten
    statistics, was left out of the lower panel without a word (a diverging run's 0.weight at
    step 7: 147 NaN and 61 Inf, min -inf and max inf, drawn as a finite norm and a mean)."""
    pytest.importorskip("matplotlib")
    from nndb.render.plot import figure
    path = _recorded(tmp_path, "import torch\ntorch.manual_seed(0)\nm = torch.nn.Linear(3, 2)\n"
                               "opt = torch.optim.SGD(m.parameters(), lr=0.1)\nx = torch.randn(8, 3)\n"
                               "for step in range(4):\n    opt.zero_grad()\n    m(x).pow(2).mean().backward()\n"
                               "    if step == 2:\n        m.weight.grad[0, 0] = float('inf')\n"
                               "    opt.step()\n    with torch.no_grad():\n        m.weight.nan_to_num_(0.5, 0.5, 0.5)\n")
    with TraceReader(path) as rd:
        d = D.history(rd, "weight", "grad")
    assert d.held.tolist() == [False, False, True, False] and not d.nonfinite.any()
    assert np.isfinite(d.stats["norm"]).all() and d.stats["max"][2] == math.inf
    top, bottom = figure(d).axes
    (ring,) = [c for c in top.collections if c.get_label() == "norm of the finite elements: the tensor held NaN or Inf"]
    assert ring.get_offsets().tolist() == [[2, d.stats["norm"][2]]]
    (edge,) = [c for c in bottom.collections if c.get_label() == "max: Inf (off the scale, drawn at the top)"]
    assert edge.get_offsets().tolist() == [[2, 0.97]]


def test_the_history_draws_a_partial_last_row_as_a_point_of_its_own(tmp_path):
    """An evaluation's backward() after steps 0-3 leaves a partial row at step 4: `--what history`
    drew its gradient on the steps' line as step 4's (the bias's norm 2.698 after 0.3962 at step
    3), where the loss curve draws that row as a point of its own and the heat map hatches it."""
    pytest.importorskip("matplotlib")
    from nndb.render.plot import figure
    path = _recorded(tmp_path, EVAL_AFTER_STEPS)
    with TraceReader(path) as rd:
        d = D.history(rd, "bias", "grad")
    assert d.steps.tolist() == [0, 1, 2, 3, 4] and d.partial.tolist() == [4]
    top = figure(d).axes[0]
    (line,) = [ln for ln in top.get_lines() if ln.get_label() == "norm (at each step it was measured)"]
    assert line.get_xdata().tolist() == [0, 1, 2, 3]
    (point,) = [c for c in top.collections if c.get_label() == "norm: partial step (after the run's last step end)"]
    assert point.get_offsets().tolist() == [[4, d.stats["norm"][4]]] and d.stats["norm"][4] > 2


def test_a_single_step_is_drawn_and_its_axis_is_whole_steps(tmp_path):
    """A trace of one step: the ratio plot drew nothing for its layer (a line of one point, no marker;
    the ratio 0.16, far above the healthy band, not shown) and the x axes read -0.5, -0.4 ... 0.5."""
    pytest.importorskip("matplotlib")
    from nndb.render.plot import figure
    path = _recorded(tmp_path, "import torch\ntorch.manual_seed(0)\nm = torch.nn.Linear(3, 1)\n"
                               "opt = torch.optim.SGD(m.parameters(), lr=0.1)\nx = torch.randn(8, 3)\n"
                               "opt.zero_grad()\nm(x).pow(2).mean().backward()\nopt.step()\n")
    with TraceReader(path) as rd:
        ratio, hist = D.ratio(rd), D.history(rd, "weight", "param")
    ax = figure(ratio).axes[0]
    (line,) = [l for l in ax.get_lines() if l.get_label() == "weight"]
    assert line.get_xdata().tolist() == [0] and line.get_marker() not in (None, "None", "")
    assert [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]] == [0]
    bottom = figure(hist).axes[1]
    assert [t for t in bottom.get_xticks() if bottom.get_xlim()[0] <= t <= bottom.get_xlim()[1]] == [0]
