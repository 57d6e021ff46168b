"""The notebook magics, executed end to end: nbclient runs a notebook on an
ipykernel of this same interpreter (a kernelspec written under tmp_path and
found through JUPYTER_PATH; nothing is installed for the user).  Needs the
notebook extra (ipykernel, nbclient, nbformat) and, for the inline plot,
matplotlib (the plot extra)."""
import json
import os
import sys

import pytest

from conftest import ROOT
from nndb.frontends.notebook import KERNEL_NO_REPLICAS as KERNEL
from test_real_loops import HAND_TRAINED_NAMES
from test_set_trace import LOOP


TRAIN = LOOP.format(call="pass", imports="")       # (prints each step's loss)

SETUP = f"""\
import sys
sys.path.insert(0, {ROOT!r})
%load_ext nndb
"""

RUN = ("%nndb run --batch --trace run.h5 -e 'watch loss mean < 1.05' -e 'commands 1' -e 'stats loss' "
       "-e 'plot loss' -e 'end' train.py")

MODEL = """\
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = torch.randn(32, 4), torch.randn(32, 1)
"""

CELL = """\
%%nndb --trace cell.h5 -e 'watch loss mean < 0.9' -e 'commands 1' -e 'p step' -e 'end'
for step in range(20):
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

SET_TRACE = """\
import nndb
for step in range(6):
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 2:
        nndb.set_trace(trace="st.h5")
"""


def _kernelspec(tmp_path) -> str:
    d = tmp_path / "jupyter" / "kernels" / "nndb-test"
    d.mkdir(parents=True)
    (d / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "nndb test", "language": "python"}))
    return str(tmp_path / "jupyter")


def _outputs(cell, kind=None) -> list:
    return [o for o in cell.outputs if kind is None or o.output_type == kind]


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in _outputs(cell, "stream"))


def _data(cell, mime) -> list:
    return [o["data"][mime] for o in cell.outputs if mime in o.get("data", {})]


def test_a_notebook_records_a_cell_stops_at_a_watch_and_shows_html_and_a_plot(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("matplotlib")
    (tmp_path / "train.py").write_text(TRAIN)
    monkeypatch.setenv("JUPYTER_PATH", _kernelspec(tmp_path))
    monkeypatch.setenv("PYTHONPATH", ROOT)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in
                (SETUP, RUN, MODEL, CELL, "import nndb\nnndb.open('cell.h5').findings",
                 "%debug_train --trace run2.h5 train.py", "%nndb walk", SET_TRACE,
                 "t = nndb.open('st.h5')\nprint(t.status, len(t.steps), t.stops[0]['reason'])")]
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="nndb-test",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    setup, run, _, cell, findings, prompt, bad, stopped, after = nb.cells

    assert not _outputs(setup, "error"), setup.outputs
    # %nndb run: the watch stops; its commands show the loss table as HTML and the plot inline
    out = _text(run)
    assert "Watchpoint 1: loss mean = 1.045 (< 1.05) at step 8" in out, run.outputs
    assert "step 11 loss 1.01219130" in out                      # the script ran to its end
    tables = [h for h in _data(run, "text/html") if "<table>" in h]
    assert any("<th>tensor</th>" in h and "<td>loss</td>" in h for h in tables), run.outputs
    pngs = _data(run, "image/png")
    assert pngs and len(pngs[0]) > 1000
    assert "nndb trace" in _data(run, "text/html")[-1]      # the run's Trace as the cell's result
    assert not _outputs(run, "error")
    assert (tmp_path / "run.h5").exists()

    # %%nndb: the cell is recorded; the watch set by -e stops it and its commands run
    text = _text(cell)
    assert "Watchpoint 1: loss mean" in text and not _outputs(cell, "error"), cell.outputs
    summary = _data(cell, "text/html")[-1]
    assert "nndb trace" in summary and "20 recorded step(s)" in summary
    assert _data(findings, "text/html"), findings.outputs

    # no --batch: the prompt is input(), which nbclient does not answer: one line, and the run goes on
    assert "does not answer input()" in "".join(o.get("text", "") for o in prompt.outputs), prompt.outputs
    assert "step 11 loss 1.01219130" in _text(prompt) and not _outputs(prompt, "error")
    # a bad magic line is one error line, not a traceback
    assert not _outputs(bad, "error")
    assert "nndb: error: %nndb: say 'run SCRIPT [ARGS]'" in _text(bad)

    # nndb.set_trace() in a cell: it records from there, stops (no input here: it goes on), and the
    # recording ends with the cell
    assert "Stopped at nndb.set_trace() during step 0" in _text(stopped), stopped.outputs
    assert not _outputs(stopped, "error")
    assert _text(after).strip() == "finished 3 set_trace", after.outputs


def test_a_command_table_as_html_is_escaped_and_formatted_as_the_terminal_shows_it():
    from nndb.frontends.notebook import table_html
    from nndb.render.table import Table
    h = table_html(Table(("tensor", "norm"), [["<img src=x onerror=alert(1)>", 0.123456789]], title="step <1>"))
    assert "<img" not in h and "&lt;img src=x onerror=alert(1)&gt;" in h
    assert "<b>step &lt;1&gt;</b>" in h and "<td>0.1235</td>" in h
    assert table_html(Table(("a",), [], empty="no <rows>")) == "<p>no &lt;rows&gt;</p>"


def test_the_prompt_is_the_notebooks_input_box(tmp_path, monkeypatch):
    """A client that answers input() (as Jupyter's input box does): the
    session's prompts arrive as input requests, the typed commands run."""
    pytest.importorskip("ipykernel")
    manager = pytest.importorskip("jupyter_client.manager")
    (tmp_path / "train.py").write_text(TRAIN)
    monkeypatch.setenv("JUPYTER_PATH", _kernelspec(tmp_path))
    monkeypatch.setenv("PYTHONPATH", ROOT)
    km = manager.KernelManager(kernel_name="nndb-test")
    km.start_kernel(cwd=str(tmp_path))
    kc = km.client()
    kc.start_channels()
    typed = iter(["break step 3", "continue", "p step", "stats loss", "continue", "quit"])
    prompts, outputs = [], []

    def answer(msg):
        prompts.append(msg["content"]["prompt"])
        kc.input(next(typed, "quit"))

    def keep(msg):
        if msg["msg_type"] in ("stream", "display_data", "execute_result", "error"):
            outputs.append(msg)

    try:
        kc.wait_for_ready(timeout=60)
        kc.execute_interactive(SETUP, timeout=60)
        reply = kc.execute_interactive("%nndb run --trace run.h5 train.py", allow_stdin=True, stdin_hook=answer,
                                       output_hook=keep, timeout=120)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert reply["content"]["status"] == "ok"
    text = "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")
    assert prompts[:5] == ["(nndb) "] * 5, prompts
    assert "Stopped at the start of the run" in text and "Breakpoint 1, step 3 finished" in text, text
    assert "\n3\n" in text                                   # p step at the breakpoint
    html = [m["content"]["data"]["text/html"] for m in outputs if "text/html" in m["content"].get("data", {})]
    assert any("<td>loss</td>" in h for h in html)            # stats as an HTML table
    assert "step 11 loss 1.01219130" in text and "nndb trace" in html[-1]


def test_nndb_run_magic_takes_nndb_runs_own_options(tmp_path, monkeypatch, capsys):
    """%nndb run parses its line with nndb run's own command: its options mean
    what they mean there (--every, --steps, --rules none, -q here), a bad one
    or one a kernel cannot honour is one line, and --help prints nndb run's help."""
    pytest.importorskip("IPython")
    from nndb.api.trace import Trace
    from nndb.cli.magics import run_script
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(TRAIN)
    trace = run_script("--batch -q --every 2 --steps 0:8 --rules none --trace r.h5 train.py")
    assert isinstance(trace, Trace)
    assert list(trace.steps) == [0, 2, 4, 6]
    assert trace.findings == []
    out = capsys.readouterr()
    assert "step 11 loss" in out.out and "recording to" not in out.err

    assert run_script("--every two train.py") is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("nndb: error: ") and "'two' is not a valid integer" in err[0]
    assert run_script("--replica fork train.py") is None
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"nndb: error: --replica fork: time travel is off in a notebook kernel ({KERNEL})"]
    assert run_script("--batch") is None
    assert capsys.readouterr().err.strip() == "nndb: error: missing SCRIPT (or -m MODULE)"
    assert run_script("--bogus train.py") is None          # (an unknown option: was a RuntimeError)
    assert capsys.readouterr().err.strip() == "nndb: error: No such option '--bogus'."
    assert run_script("--help") is None
    assert "--checkpoint-every" in capsys.readouterr().out


def test_a_cell_that_trains_tensors_by_hand_names_them_for_its_watch(tmp_path, monkeypatch):
    """A %%nndb cell training tensors of the notebook's own layer classes, listed in
    ``parameters`` and zeroed by ``for p in parameters`` (makemore's lectures): the watch its
    -e sets names one by its path (``model.layers.2.bias``) and stops where the cell's own
    print shows the gradient below the bound.  The kernel's namespace is also that of
    IPython's ``run_cell_magic`` line, which binds no loop: the last tensor was named ``p``,
    the watch matched nothing and the cell's loop was killed at step 0."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("JUPYTER_PATH", _kernelspec(tmp_path))
    monkeypatch.setenv("PYTHONPATH", ROOT)
    setup, loop = HAND_TRAINED_NAMES.rsplit("for i in range(4):", 1)
    cell = ("%%nndb --trace hand.h5 -e 'watch grad model.layers.2.bias norm < 0.08' -e 'commands 1' "
            "-e 'p $loss' -e 'end'\nfor i in range(4):" + loop)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (SETUP, setup, cell)]
    nbclient.NotebookClient(nb, timeout=120, kernel_name="nndb-test",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = _text(nb.cells[2])
    rows = [line.split() for line in text.splitlines() if line.startswith("model ")]
    assert [r[1] for r in rows] == ["0", "1", "2", "3"] and not _outputs(nb.cells[2], "error"), nb.cells[2].outputs
    assert "Watchpoint 1: grad model.layers.2.bias norm = 0.07242 (< 0.08) at step 2" in text, text
    assert f"\n{rows[2][2]}\n" in text.split("at step 2")[1]          # $loss: the step's printed loss


def test_re_running_a_cell_with_force_replaces_the_trace_its_last_result_still_holds(tmp_path, monkeypatch, capsys):
    """Re-running a ``%%nndb --trace a.h5 --force`` cell: the cell's last result (the Trace
    Jupyter keeps in ``Out``) still has a.h5 open, and HDF5 would not truncate it ('unable to
    truncate a file which is already open': a traceback, and the cell's loop did not run).
    The new run replaces the file; the old Trace goes on reading the old one."""
    from types import SimpleNamespace
    import nndb
    from nndb.cli.magics import record_cell
    monkeypatch.chdir(tmp_path)
    shell = SimpleNamespace(user_ns={})
    exec(MODEL, shell.user_ns)
    cell = CELL.split("\n", 1)[1].replace("range(20)", "range(3)") + "    print('loss', step, loss.item())\n"
    first = record_cell("--trace a.h5", cell, shell)
    second = record_cell("--trace a.h5 --force", cell, shell)
    printed = [float(line.split()[2]) for line in capsys.readouterr().out.splitlines() if line.startswith("loss ")]
    assert len(printed) == 6
    assert list(second.series("loss", kind="loss")) == printed[3:]         # the re-run's own steps
    assert list(first.series("loss", kind="loss")) == printed[:3]          # (the old file, still readable)
    with nndb.open(str(tmp_path / "a.h5")) as t:
        assert list(t.series("loss", kind="loss")) == printed[3:]
