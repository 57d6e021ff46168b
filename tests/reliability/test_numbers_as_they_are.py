"""Numbers shown as they are (issue 19): Inf and NaN print as ``inf``, ``-inf``,
``nan`` everywhere and JSON carries them as strings; ``-`` (JSON ``null``)
means "not measured" only.  End to end on scripts/examples/nan_lr.py, whose
loss is inf at step 6 and nan from step 7 on."""
import gc
import json
import math
import re

import numpy as np
import pytest
import torch

from conftest import Transcript, example, nndb
from nndb.run.config import RunConfig
from nndb.driver import DebugOptions, debug
from nndb.debugger.evaluate import StatRow, loss_value
from nndb.frontends.batch import ScriptedFrontend
from nndb.run.launcher import Target
from nndb.text import NOT_MEASURED, fmt, json_value, to_json
from nndb.frontends.toolbar import toolbar_text
from nndb.store.measured import is_measured, measured, measured_values
from nndb.schema import STAT_NAMES
from nndb.tracer import stats as S

INF, NAN = math.inf, math.nan


# -- one text form, one JSON form -------------------------------------------------------------
@pytest.mark.parametrize("value,text,as_json", [
    (INF, "inf", "inf"), (-INF, "-inf", "-inf"), (NAN, "nan", "nan"),
    (None, "-", None), (NOT_MEASURED, "-", None),
    (2.0, "2", 2.0), (0.123456, "0.1235", 0.123456), (np.float32(INF), "inf", "inf"), (np.float64(NAN), "nan", "nan"),
])
def test_a_number_has_one_text_and_one_json_form(value, text, as_json):
    assert fmt(value) == text
    assert json_value(value) == as_json


def test_json_is_valid_and_keeps_nan_apart_from_not_measured():
    out = to_json({"mean": NAN, "norm": INF, "min": -INF, "std": None, "rows": [NOT_MEASURED, 1.5]})
    assert json.loads(out) == {"mean": "nan", "norm": "inf", "min": "-inf", "std": None, "rows": [None, 1.5]}


def test_not_measured_compares_like_nan_and_says_what_it_is():
    assert not (NOT_MEASURED > 1) and not (NOT_MEASURED < 1) and math.isnan(NOT_MEASURED + 1)
    assert repr(NOT_MEASURED) == "not measured"


# -- the cause: the statistics of a tensor with no finite element -------------------------------
@pytest.mark.parametrize("v", [INF, -INF])
def test_an_infinite_scalar_loss_is_recorded_as_that_infinity(v):
    st = dict(zip(STAT_NAMES, S.finalize(S.scalar_raw(v))))
    assert st["mean"] == v and st["min"] == v and st["max"] == v
    assert st["norm"] == INF and st["inf_count"] == 1 and st["nan_count"] == 0
    row = StatRow("loss", "loss", *measured_values(S.finalize(S.scalar_raw(v))))
    assert loss_value(row) == v


def test_an_all_inf_tensor_on_the_torch_path_is_inf_and_a_nan_one_is_nan():
    assert S.stats_of(torch.full((5000,), INF))["mean"] == INF
    assert S.stats_of(torch.full((5000,), -INF))["max"] == -INF
    nan_and_inf = S.stats_of(torch.tensor([NAN, INF]))
    assert math.isnan(nan_and_inf["mean"]) and nan_and_inf["max"] == INF


def test_the_loss_of_two_backward_passes_one_infinite_is_inf():
    raw = S.merge_raw(S.scalar_raw(2.0), S.scalar_raw(INF))
    row = StatRow("loss", "loss", *measured_values(S.finalize(raw)))
    assert row.mean == 2.0            # the statistics: over the finite values
    assert loss_value(row) == INF     # $loss: as Python computes the mean of the two
    both = S.merge_raw(S.scalar_raw(INF), S.scalar_raw(-INF))
    assert math.isnan(loss_value(StatRow("loss", "loss", *measured_values(S.finalize(both)))))


# -- not measured vs a measured NaN (the one helper the trace layout meets) --------------------
def test_a_norm_only_row_has_its_norm_measured_and_its_mean_not():
    norm_only = S.finalize(S.host_raw_one(np.ones(10, dtype=np.float32), full=False))
    assert is_measured(norm_only, "norm") and is_measured(norm_only, "nan_count")
    assert not is_measured(norm_only, "mean") and not is_measured(norm_only, "zero_frac")
    assert measured_values(norm_only)[STAT_NAMES.index("mean")] is None


def test_a_nan_in_a_measured_column_is_a_real_nan():
    all_nan = S.finalize(S.raw_now(torch.full((7,), NAN), full=False))   # (found at a norm-only step)
    assert is_measured(all_nan, "mean") and math.isnan(measured_values(all_nan)[STAT_NAMES.index("mean")])
    no_row = np.full(len(STAT_NAMES), NAN)
    assert not measured(no_row[None, :]).any()


# -- end to end on nan_lr.py ------------------------------------------------------------------------
class _Toolbar(ScriptedFrontend):
    """A scripted session that reads the REPL's toolbar before each typed line."""
    session = None

    def __init__(self, lines):
        super().__init__(lines)
        self.toolbars = []

    def read_line(self, prompt):
        self.toolbars.append(toolbar_text(self.session))
        return super().read_line(prompt)


@pytest.fixture(scope="module")
def nan_lr(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nan_lr")
    gc.collect()
    fe = _Toolbar(["break step 6", "continue", "p $loss", "stats loss", "history loss loss mean",
                   "info step", "continue", "p $loss", "quit"])
    cfg = RunConfig(Target(path=example("nan_lr.py"), args=["--steps", "8"]), str(tmp / "t.h5"), quiet=True)
    res = debug(cfg, DebugOptions(no_rc=True, rules="none"), fe)
    return Transcript(fe.text, res), fe.toolbars, str(tmp / "t.h5")


def _loss_row(table: str) -> dict:
    head, row = [line.split() for line in table.splitlines()[1:3]]
    return dict(zip(head, row))


def test_the_inf_loss_of_step_6_shows_as_inf_in_the_debugger(nan_lr):
    t, toolbars, _ = nan_lr
    assert "step 6 finished, loss inf" in t.text
    assert t.after("p $loss").strip() == "inf"
    assert "loss inf" in toolbars[2]                     # (the prompt after 'continue' stopped at step 6)
    row = _loss_row(t.after("stats loss"))
    assert row["mean"] == "inf" and row["inf_count"] == "1" and row["nan_count"] == "0"
    hist = t.after("history loss loss mean")
    assert hist.startswith("loss mean,") and "max inf" in hist
    # (the numbers, then, at a terminal, the series drawn: the table's last row is step 6)
    rows = [line.split() for line in hist.splitlines() if line.split()[:1] and line.split()[0].isdigit()
            and len(line.split()) == 2]
    assert rows[-1] == ["6", "inf"] and rows[0][0] == "0"
    assert re.search(r"^loss\s+inf$", t.after("info step"), re.M)
    assert t.after("p $loss", 2).strip() == "nan"       # step 7: the loss is NaN


def test_the_inf_loss_shows_as_inf_in_nndb_inspect(nan_lr):
    _, _, trace = nan_lr
    r = nndb("inspect", trace, "--series", "loss", "--stat", "mean")
    assert r.returncode == 0, r.stderr
    title, header, _, *rows = r.stdout.splitlines()
    assert title == "loss: mean" and header.split() == ["step", "loss"]     # not "loss loss mean"
    assert dict(row.split() for row in rows)["6"] == "inf" and dict(row.split() for row in rows)["7"] == "nan"
    j = json.loads(nndb("inspect", trace, "--series", "loss", "--stat", "mean", "--json").stdout)
    values = dict(zip(j["series"][0]["steps"], j["series"][0]["values"]))
    assert values[6] == "inf" and values[7] == "nan" and isinstance(values[5], float)
    summary = json.loads(nndb("inspect", trace, "--json").stdout)
    loss = next(t for t in summary["tensors"] if t["kind"] == "loss")
    assert loss["max"]["mean"] == "inf" and loss["last"]["mean"] == "nan"
    assert loss["last"]["inf_count"] == 0 and loss["last"]["nan_count"] == 1


def test_dash_means_not_measured_in_nndb_inspect(tmp_path):
    """--full-every 2: the mean of a gradient is measured on even steps only."""
    trace = str(tmp_path / "mlp.h5")
    r = nndb("run", "--trace", trace, "--full-every", "2", example("nan_lr.py"), "--steps", "4", "--lr", "0.01")
    assert r.returncode == 0, r.stderr
    r = nndb("inspect", trace, "--series", "0.weight", "--kind", "grad", "--stat", "mean")
    rows = dict(row.split() for row in r.stdout.splitlines()[3:])
    assert rows["1"] == "-" and rows["3"] == "-" and rows["0"] not in ("-", "nan")
    j = json.loads(nndb("inspect", trace, "--series", "0.weight", "--kind", "grad", "--stat", "mean", "--json").stdout)
    assert [v is None for v in j["series"][0]["values"]] == [False, True, False, True]


def test_a_watch_on_the_loss_sees_inf_and_the_report_says_so(tmp_path):
    """The loss's mean is inf at step 6 (it was NaN, which no comparison is true of)."""
    report = tmp_path / "r.json"
    r = nndb("run", "--batch", "--rules", "none", "--trace", str(tmp_path / "t.h5"), "--report", str(report),
             "-e", "watch loss mean > 1e35", "-e", "continue", "-e", "p $loss", "-e", "kill",
             example("nan_lr.py"), "--steps", "8")
    assert r.returncode == 0, r.stderr
    assert re.search(r"Watchpoint 1: loss mean = inf \(> 1e\+35\) at step 6", r.stdout), r.stdout
    stop = json.loads(report.read_text())["stops"][0]
    assert stop["step"] == 6 and stop["detail"]["value"] == "inf"
