"""nndb inspect: text, JSON and series output on a real trace."""
import json
import os
import re

import numpy as np
import pytest

from conftest import example, nndb
from nndb.store.reader import TraceReader
from nndb.text import fmt


@pytest.fixture(scope="module")
def mlp_trace(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("inspect") / "mlp.h5")
    r = nndb("run", "--full-every", "2", "--trace", path, example("mlp.py"), "--steps", "6", "--lr", "0.1")
    assert r.returncode == 0, r.stderr
    return path


def test_json_summary(mlp_trace):
    r = nndb("inspect", "--json", mlp_trace)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["steps"] == 6 and data["status"] == "finished" and data["partial_steps"] == []
    assert data["meta"]["argv"][1:] == ["--steps", "6", "--lr", "0.1"]
    for key in ("torch", "numpy", "python", "num_threads", "openmp", "rank", "world_size", "start_time"):
        assert key in data["meta"]
    kinds = {t["kind"] for t in data["tensors"]}
    assert kinds == {"param", "grad", "update", "act", "loss"}
    loss = [t for t in data["tensors"] if t["kind"] == "loss"][0]
    assert loss["name"] == "loss" and loss["rows"] == 6
    assert set(loss["last"]) == {"count", "mean", "std", "min", "max", "norm", "mean_abs",
                                 "nan_count", "inf_count", "zero_frac"}
    assert loss["min"]["mean"] <= loss["last"]["mean"] <= loss["max"]["mean"]
    assert loss["last"]["nan_count"] == 0


def test_text_summary_has_metadata_and_a_row_per_tensor(mlp_trace):
    r = nndb("inspect", mlp_trace)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "status     finished, exit 0" in out and "recorded   6 step(s)" in out
    data = json.loads(nndb("inspect", "--json", mlp_trace).stdout)
    table = out.split("\n\n", 1)[1].splitlines()[2:]
    assert len(table) == len(data["tensors"])
    assert any(line.split()[:2] == ["loss", "loss"] for line in table)


def test_series_shows_all_kinds_side_by_side(mlp_trace):
    data = json.loads(nndb("inspect", "--json", mlp_trace).stdout)
    name = [t["name"] for t in data["tensors"] if t["kind"] == "update"][0]
    r = nndb("inspect", mlp_trace, "--series", name, "--stat", "norm")
    assert r.returncode == 0, r.stderr
    title, header, _, *rows = r.stdout.splitlines()
    assert title == f"{name}: norm"              # the tensor and statistic once, a column per kind
    assert header.split()[0] == "step" and sorted(header.split()[1:]) == ["grad", "param", "update"]
    assert [int(row.split()[0]) for row in rows] == list(range(6))
    j = json.loads(nndb("inspect", mlp_trace, "--series", name, "--kind", "grad", "--json").stdout)
    assert [s["kind"] for s in j["series"]] == ["grad"] and j["series"][0]["steps"] == list(range(6))
    assert all(v > 0 for v in j["series"][0]["values"])


def test_full_statistics_follow_the_schedule(mlp_trace):
    def values(series, kind, stat):
        out = nndb("inspect", mlp_trace, "--series", series, "--kind", kind, "--stat", stat, "--json").stdout
        return json.loads(out)["series"][0]["values"]
    for stat in ("min", "mean", "zero_frac"):                                # --full-every 2
        assert [v is not None for v in values("0.weight", "grad", stat)] == [True, False] * 3
    assert all(v is not None for v in values("0.weight", "grad", "norm"))     # norms: every step
    assert all(v is not None for v in values("loss", "loss", "min"))          # a scalar loss: all ten


def test_unknown_series_and_misplaced_kind(mlp_trace):
    r = nndb("inspect", mlp_trace, "--series", "no.such.tensor")
    assert r.returncode == 2 and "no series 'no.such.tensor'" in r.stderr and "Traceback" not in r.stderr
    r = nndb("inspect", mlp_trace, "--kind", "grad")
    assert r.returncode == 2 and "--kind goes with --series" in r.stderr
    r = nndb("inspect", mlp_trace, "--series", "loss", "--stat", "bogus")
    assert r.returncode == 2


def test_readme_first_command_finds_the_planted_bug(tmp_path):
    trace = str(tmp_path / "nan_lr.h5")
    r = nndb("run", "--trace", trace, example("nan_lr.py"), cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    r = nndb("inspect", trace, "--series", "loss", "--stat", "nan_count")
    assert r.returncode == 0
    counts = [float(line.split()[1]) for line in r.stdout.splitlines()[3:]]   # (title, header, rule)
    assert counts[0] == 0 and counts[-1] == 1               # the loss turned NaN and stayed NaN


def test_rank_suffix_under_torchrun(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("print('hi')\n")
    r = nndb("run", str(script), cwd=str(tmp_path), env={"RANK": "1", "WORLD_SIZE": "2"})
    assert r.returncode == 0
    path = r.stderr.split("recording to ", 1)[1].split()[0]
    # one run directory per job, one file per rank in it (nndb.run.rank)
    assert re.fullmatch(r"nndb-runs/s-[^/]+/rank1\.h5", path), path
    data = json.loads(nndb("inspect", "--json", os.path.join(str(tmp_path), path)).stdout)
    assert data["meta"]["rank"] == 1 and data["meta"]["world_size"] == 2
    assert data["meta"]["job_id"] == os.path.basename(os.path.dirname(path))


def test_a_partial_last_row_is_named_in_the_summary_and_the_series(tmp_path):
    """A run that ends between backward() and step() (a Ctrl-C in the step, a
    script that raises there) keeps that work as one more row.  `nndb inspect`
    said 'recorded 5 step(s) (steps 0..4)' and listed step 4 in --series as a
    step like the others (its grad beside no update), though the script ran 4
    whole steps: the Python API's ``partial`` had it, inspect did not."""
    script = tmp_path / "raises.py"
    script.write_text(
        "import torch\ntorch.manual_seed(0)\nm = torch.nn.Linear(3, 1)\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\nx = torch.randn(8, 3)\n"
        "for step in range(5):\n    opt.zero_grad()\n    loss = m(x).pow(2).mean()\n    loss.backward()\n"
        "    if step == 4:\n        raise KeyboardInterrupt\n    opt.step()\n    print(step, loss.item())\n")
    path = str(tmp_path / "t.h5")
    r = nndb("run", "--batch", "-q", "--trace", path, str(script))
    assert r.returncode == 1 and [line.split()[0] for line in r.stdout.splitlines()] == ["0", "1", "2", "3"]
    out = nndb("inspect", path).stdout
    assert "recorded   5 step(s) (steps 0..4), step 4 partial (work after the run's last step end" in out
    data = json.loads(nndb("inspect", "--json", path).stdout)
    assert data["steps"] == 5 and data["partial_steps"] == [4]
    rows = nndb("inspect", path, "--series", "weight").stdout.splitlines()[3:]
    assert [row.split("  ")[0].strip() for row in rows] == ["0", "1", "2", "3", "4 (partial)"]
    assert rows[-1].split()[-2] == "-"                 # (no update at the partial row: param, update, grad)
    j = json.loads(nndb("inspect", path, "--series", "weight", "--json").stdout)
    assert j["partial_steps"] == [4]
    from nndb import open as open_trace
    with open_trace(path) as t:                        # (a notebook's summary of the trace)
        assert t.summary()["partial_steps"] == [4] and "(steps 0..4), step 4 partial," in t._repr_html_()


SCHEDULED = """
import torch
torch.manual_seed(0)
m = torch.nn.Linear(3, 1)
opt = torch.optim.SGD([{'params': [m.weight]}, {'params': [m.bias], 'lr': 0.5}], lr=0.1)
sched = torch.optim.lr_scheduler.StepLR(opt, 3, gamma=0.1)
x = torch.randn(8, 3)
for step in range(5):
    opt.zero_grad()
    m(x).pow(2).mean().backward()
    opt.step()
    print(step, [g['lr'] for g in opt.param_groups])
    sched.step()
"""


def test_the_learning_rate_a_step_used_is_a_series(tmp_path):
    """The trace keeps each param group's learning rate (the exports' hyper/.../lr), but
    `nndb inspect TRACE --series lr` said "no series 'lr'": the lr a step used is read
    from the trace like any other history, a column per group."""
    script = tmp_path / "sched.py"
    script.write_text(SCHEDULED)
    path = str(tmp_path / "t.h5")
    r = nndb("run", "--batch", "-q", "--trace", path, str(script))
    assert r.returncode == 0, r.stderr
    used = {int(line.split()[0]): json.loads(line.split(" ", 1)[1]) for line in r.stdout.splitlines()}
    j = json.loads(nndb("inspect", path, "--series", "lr", "--json").stdout)
    assert j["stat"] == "lr" and [s["kind"] for s in j["series"]] == ["opt.group0", "opt.group1"]
    for g, s in enumerate(j["series"]):
        assert s["steps"] == [0, 1, 2, 3, 4]
        assert s["values"] == pytest.approx([used[step][g] for step in range(5)], rel=1e-12)
    out = nndb("inspect", path, "--series", "lr").stdout.splitlines()
    assert out[0] == "lr: lr" and out[1].split() == ["step", "opt.group0", "opt.group1"]
    assert out[3].split() == ["0", "0.1", "0.5"] and out[6].split() == ["3", "0.01", "0.05"]


WIDE_MIDDLE = """
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 300), nn.ReLU(), nn.Linear(300, 300), nn.ReLU(), nn.Linear(300, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
for step in range(3):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
"""


def test_the_table_of_tensors_gives_the_whole_steps_not_an_evaluations_backward(tmp_path):
    """A loop that ends with an evaluation's backward() after steps 0-3 keeps it as a partial row
    (step 4).  `nndb inspect`'s table gave that row as each tensor's last value and in its
    min..max: the loss 'last' the evaluation's 9.953 and 'max' too, where the steps' losses
    were 0.3199 .. 0.07135.  The table is the whole steps'; the row's statistics are under
    'partial' in --json, and its NaN (an evaluation on a NaN batch) still says 'yes'."""
    script = tmp_path / "evalbw.py"
    script.write_text(
        "import sys, torch\ntorch.manual_seed(0)\nm = torch.nn.Linear(3, 1)\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\nx = torch.randn(8, 3)\n"
        "for step in range(4):\n    opt.zero_grad()\n    loss = m(x).pow(2).mean()\n"
        "    loss.backward()\n    opt.step()\n    print(repr(loss.item()))\n"
        "xe = x.clone()\nif sys.argv[1:] == ['nan']:\n    xe[0, 0] = float('nan')\n"
        "ev = (m(xe) - 3).pow(2).mean()\nev.backward()\nprint(repr(ev.item()))\n")
    for arg in ("", "nan"):
        path = str(tmp_path / f"t{arg}.h5")
        r = nndb("run", "--batch", "-q", "--trace", path, str(script), *([arg] if arg else []))
        assert r.returncode == 0, r.stderr
        *losses, ev = [float(v) for v in r.stdout.split()]
        data = json.loads(nndb("inspect", "--json", path).stdout)
        assert data["partial_steps"] == [4]
        loss = next(t for t in data["tensors"] if t["kind"] == "loss")
        assert loss["rows"] == 4 and loss["last_step"] == 3 and loss["last"]["mean"] == losses[-1]
        assert (loss["min"]["mean"], loss["max"]["mean"]) == (min(losses), max(losses))
        grad = next(t for t in data["tensors"] if t["kind"] == "grad" and t["name"] == "weight")
        assert grad["last_step"] == 3 and (grad["partial"]["nan_count"] > 0) == bool(arg)
        row = next(line for line in nndb("inspect", path).stdout.splitlines() if line.startswith("loss "))
        assert row.split()[3] == fmt(losses[-1]) and (row.split()[-1] == "yes") == bool(arg)
        if not arg:
            assert loss["partial"]["mean"] == ev and ev > max(losses)


def test_history_at_the_prompt_marks_the_partial_row_as_inspect_does(tmp_path):
    """At the post-mortem stop of a script that raised between backward() and step() in its
    step 4, `stats` said 'step 4 (partial)' and `nndb inspect --series` '4 (partial)', but
    `history weight` and `history loss` listed it as '4', a step like the others."""
    script = tmp_path / "raises.py"
    script.write_text(
        "import torch\ntorch.manual_seed(0)\nm = torch.nn.Linear(3, 1)\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\nx = torch.randn(8, 3)\n"
        "for step in range(5):\n    opt.zero_grad()\n    loss = m(x).pow(2).mean()\n    loss.backward()\n"
        "    if step == 4:\n        raise RuntimeError('planted')\n    opt.step()\n")
    path = str(tmp_path / "t.h5")
    r = nndb("run", "--batch", "-q", "--trace", path, "-e", "continue", "-e", "history weight", "-e", "history loss",
             "-e", "history lr", str(script))
    assert r.returncode == 1 and "RuntimeError: planted" in r.stderr
    steps = [line.split("  ")[0].strip() for line in r.stdout.splitlines() if line[:1].isdigit()]
    assert steps == ["0", "1", "2", "3", "4 (partial)"] * 3, r.stdout
    rows = nndb("inspect", path, "--series", "weight").stdout.splitlines()[3:]
    assert [row.split("  ")[0].strip() for row in rows] == steps[:5]


def test_history_at_the_prompt_keeps_a_partial_row_out_of_its_min_and_max(tmp_path):
    """A loop of steps 0-3 that ends with an evaluation's backward() on a batch 10x larger:
    'history loss' at the run's end said 'min 0.5506 max 2.000' and drew the sparkline up to
    the evaluation's 2.000 (no step's), 'history 0.weight' its grad 'max 7.113', where nndb
    inspect gives the steps' 0.5506..1.117 (the row stays in the table, '4 (partial)')."""
    script = tmp_path / "evalbig.py"
    script.write_text(
        "import torch\ntorch.manual_seed(0)\nm = torch.nn.Linear(3, 1)\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for step in range(4):\n    x = torch.randn(8, 3)\n    opt.zero_grad()\n    loss = m(x).pow(2).mean()\n"
        "    loss.backward()\n    opt.step()\n    print('it', loss.item())\n"
        "m(torch.randn(8, 3) * 10).pow(2).mean().backward()\n")
    path = str(tmp_path / "t.h5")
    r = nndb("run", "--batch", "-q", "--trace", path, "-e", "continue", "-e", "history loss", "-e", "history weight",
             str(script))
    assert r.returncode == 0, r.stderr
    losses = [float(line.split()[1]) for line in r.stdout.splitlines() if line.startswith("it ")]
    head = next(line for line in r.stdout.splitlines() if line.startswith("loss mean"))
    assert head == (f"loss mean, 5 recorded step(s) 0..4, step 4 partial, min {fmt(min(losses))} "
                    f"max {fmt(max(losses))}"), r.stdout
    spark = r.stdout.splitlines()[r.stdout.splitlines().index(head) + 1]
    assert len(spark) == 4, r.stdout                       # (the steps' values alone)
    with TraceReader(path) as t:
        grads = [float(v) for v in t.history(t.find("weight", "grad")[0], "norm")[1]]
    assert grads[4] > 10 * max(grads[:4])                  # (the evaluation's gradient)
    assert re.search(rf"^grad +\S+  min {re.escape(fmt(min(grads[:4])))} max {re.escape(fmt(max(grads[:4])))}$",
                     r.stdout, re.M), r.stdout
    assert "4 (partial)" in r.stdout
    assert f"{fmt(min(losses))}..{fmt(max(losses))}" in nndb("inspect", path).stdout

def test_stats_and_inspect_list_each_kind_in_the_models_order(tmp_path):
    """A parameter too large for the host block (2.weight: 90,000 elements) has its rows
    first in the record; `stats` and `nndb inspect` listed it above the activations and
    the other parameters (pytorch/examples' mnist: fc1.weight on top).  Both list the
    loss, the activations in the order they were made, then the values, updates and
    gradients, each in the model's order."""
    script = tmp_path / "wide.py"
    script.write_text(WIDE_MIDDLE)
    trace = str(tmp_path / "wide.h5")
    r = nndb("run", "--batch", "--trace", trace, "-e", "until 2", "-e", "stats", str(script), cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    params = ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]
    want = [("loss", "loss")] + [(a, "act") for a in ("0", "1", "2", "3", "4", "model")] + \
        [(p, k) for k in ("param", "update", "grad") for p in params]
    rows = [tuple(line.split()[:2]) for line in r.stdout.split("step 2\n", 1)[1].splitlines()[1:]
            if line.split()[1:2] and line.split()[1] in ("loss", "act", "param", "update", "grad")]
    assert rows == want, r.stdout
    data = json.loads(nndb("inspect", "--json", trace).stdout)
    assert [(t["name"], t["kind"]) for t in data["tensors"]] == want


def test_the_api_and_the_notebook_summary_list_the_tensors_as_inspect_does(tmp_path):
    """The same wide middle layer: `nndb inspect` lists it in the model's order, but
    nndb.open(...).tensors, the notebook's summary of a Trace (its table of tensors) and
    to_pandas()'s columns had 2.weight's param, update and grad second, above the
    activations (mnist's fc1.weight on top of %nndb run's result)."""
    pytest.importorskip("pandas")
    script = tmp_path / "wide.py"
    script.write_text(WIDE_MIDDLE)
    trace = str(tmp_path / "wide.h5")
    assert nndb("run", "--batch", "-q", "--trace", trace, str(script), cwd=str(tmp_path)).returncode == 0
    want = [(t["name"], t["kind"]) for t in json.loads(nndb("inspect", "--json", trace).stdout)["tensors"]]
    assert want[:2] == [("loss", "loss"), ("0", "act")] and len(want) == 25
    import nndb as api
    with api.open(trace) as t:
        assert [(x.name, x.kind) for x in t.tensors] == want
        assert [(x.name, x.kind) for x in t.summary()["tensors"]] == want
        html = t._repr_html_()
        assert [html.index(f"<td>{n}</td><td>{k}</td>") for n, k in want] == \
            sorted(html.index(f"<td>{n}</td><td>{k}</td>") for n, k in want)
        df = t.to_pandas()
        assert list(dict.fromkeys((k, n) for k, n, _ in df.columns)) == [(k, n) for n, k in want]
        assert np.array_equal(df[("param", "2.weight", "norm")].to_numpy(), t.series("2.weight", "param", "norm"),
                              equal_nan=True)


RESTAGED = """
import torch, torch.nn as nn
torch.manual_seed(0)
backbone, head = nn.Sequential(nn.Linear(6, 16), nn.ReLU()), nn.Linear(16, 3)
model = nn.Sequential(backbone, head)
backbone.requires_grad_(False)
opt = torch.optim.AdamW(head.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
x, y = torch.randn(64, 6), torch.randint(0, 3, (64,))
for step in range(8):
    if step == 5:          # stage 2: the backbone unfrozen, a new optimizer over the whole model
        backbone.requires_grad_(True)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=3)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    print(step, opt.param_groups[0]["lr"])
    opt.step()
    sched.step()
"""


def test_the_lr_of_an_optimizer_replaced_ends_where_it_does(tmp_path):
    """Fine-tuning's second stage made a new optimizer over the unfrozen model: 'nndb inspect
    --series lr' carried the first optimizer's last lr (0.0025, its StepLR's at step 4) on to
    every later step, where the trace's optimizer rows hold it no more (steps 5-7 are the new
    one's, and the first is gone).  A group's lr is shown at the steps its optimizer held it."""
    script = tmp_path / "restaged.py"
    script.write_text(RESTAGED)
    path = str(tmp_path / "t.h5")
    r = nndb("run", "--batch", "-q", "--trace", path, str(script))
    assert r.returncode == 0, r.stderr
    used = [float(line.split()[1]) for line in r.stdout.splitlines()]
    j = json.loads(nndb("inspect", path, "--series", "lr", "--json").stdout)
    first, second = j["series"]
    assert first["kind"] == "opt.group0" and first["steps"] == [0, 1, 2, 3, 4], first
    assert first["values"] == used[:5] == [0.01, 0.01, 0.005, 0.005, 0.0025], first
    assert second["steps"] == [5, 6, 7] and second["values"] == used[5:], (second, used)
    out = nndb("inspect", path, "--series", "lr").stdout.splitlines()
    assert out[1].split() == ["step", "opt.group0", second["kind"]] and out[-1].split()[:2] == ["7", "-"], out


TWO_GROUPS_STEPLR = """
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
opt = torch.optim.SGD([{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.5}], lr=0.1)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
for step in range(6):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    print("lr", step, opt.param_groups[0]["lr"], opt.param_groups[1]["lr"])
    opt.step()
    sched.step()
"""


def test_history_lr_at_the_prompt_is_each_groups_lr(tmp_path):
    """`history lr` said "no tensor named 'lr' has been recorded", where `nndb inspect
    --series lr` shows each param group's lr: at the prompt too, a column a group, the lr
    each step used, live (through the writer) and with --last."""
    script = tmp_path / "lr.py"
    script.write_text(TWO_GROUPS_STEPLR)
    r = nndb("run", "--batch", "--trace", str(tmp_path / "t.h5"), "-e", "until 4", "-e", "history lr",
             "-e", "history lr --last 2", str(script), cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    used = {int(w[1]): (float(w[2]), float(w[3])) for w in (l.split() for l in r.stdout.splitlines())
            if w[:1] == ["lr"]}
    out = r.stdout.split("lr, 5 recorded step(s) 0..4, a column a param group\n")
    assert len(out) == 3, r.stdout
    first, second = out[1].splitlines(), out[2].splitlines()
    assert first[0].split() == ["step", "opt.group0", "opt.group1"]
    assert {int(w[0]): (float(w[1]), float(w[2])) for w in (l.split() for l in first[1:6])} == \
        {st: used[st] for st in range(5)}
    assert [int(l.split()[0]) for l in second[1:3]] == [3, 4]


def test_inspect_and_the_api_list_the_changes_made_at_the_prompt(tmp_path):
    """A 'set weight_decay 0.5' and a '!' that zeroed a layer at the end of step 1 are kept in
    the trace (events of kind change, made again by every replay), but nndb inspect, its
    --json, nndb.open(...) and its notebook summary showed none of them: the steps after
    them read as the script's own (0.weight's norm 0 from step 1 on, no word why)."""
    script = tmp_path / "s.py"
    script.write_text(
        "import torch\ntorch.manual_seed(0)\nm = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for step in range(3):\n    opt.zero_grad()\n    m(torch.randn(8, 3)).pow(2).mean().backward()\n    opt.step()\n")
    path = str(tmp_path / "t.h5")
    r = nndb("run", "--batch", "-q", "--trace", path, "-e", "break step 1", "-e", "continue",
             "-e", "set weight_decay 0.5", "-e", "!m[0].weight.data *= 0", "-e", "continue", str(script))
    assert r.returncode == 0, r.stderr
    want = [{"line": "set weight_decay 0.5", "step": 1, "place": "end"},
            {"line": "!m[0].weight.data *= 0", "step": 1, "place": "end"}]
    text = nndb("inspect", path).stdout
    assert "change     'set weight_decay 0.5' at the end of step 1\n" \
           "change     '!m[0].weight.data *= 0' at the end of step 1\n" in text, text
    assert json.loads(nndb("inspect", path, "--json").stdout)["changes"] == want
    import nndb as api
    with api.open(path) as t:
        assert t.changes == want and t.summary()["changes"] == 2
        assert "2 change(s) made at the prompt" in t._repr_html_()
