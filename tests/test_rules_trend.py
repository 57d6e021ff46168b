"""The trend rules of issue 19 on planted bugs and healthy look-alikes of
their own (tests/scripts/planted_*.py, healthy_*.py), each for several seeds
and variants: the gradient, update and loss rules run on every recorded step
(a runaway between observed steps is seen while the loss is finite), the
loss rule judges a trend, not a 30-step margin, a high update ratio reads
the loss with it, and an embedding is judged by the rows its gradient
reaches."""
import math
import os

import numpy as np
import pytest

from conftest import ROOT, run_in_process

from nndb.cadence import SETTLE

SCRIPTS = os.path.join(ROOT, "tests", "scripts")
SEEDS = (0, 1, 2)


def run(tmp_path, name, *args):
    res = run_in_process(tmp_path, os.path.join(SCRIPTS, name), [str(a) for a in args])
    assert res.exit_code == 0
    assert all(r.enabled for r in res.session.rules.rules)      # no rule failed and was switched off
    return res.session.log.findings


# The default variant of a script is the rule matrix's own run of it (its
# seeds are SEEDS, its options ``--seed N`` alone, its rules the default ones):
# those tests read the matrix's findings, on the worker that computes it.
AS_IN_MATRIX = pytest.mark.xdist_group("rule_matrix")


def found_by(request, tmp_path, name, seed, variant):
    if variant:
        return run(tmp_path, name, "--seed", seed, *variant)
    mine = [o for o in request.getfixturevalue("matrix_outcomes") if o.script.name == name and o.seed == seed]
    assert len(mine) == 1, name
    assert mine[0].exit_code == 0 and mine[0].rules_failed == []
    return mine[0].findings


def of(found, rule, severities=("error", "warning", "info")):
    return [f for f in found if f["rule"] == rule and f["severity"] in severities]


def loud(found):
    return [f for f in found if f["severity"] in ("error", "warning")]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("variant", [pytest.param((), id="sgd", marks=AS_IN_MATRIX),       # (sgd: the default)
                                     ("--optimizer", "momentum", "--width", 96, "--growth", 1.1)],
                         ids=["sgd", "momentum"])
def test_a_runaway_warmup_is_exploding_before_the_loss_is_inf(request, tmp_path, seed, variant):
    found = found_by(request, tmp_path, "planted_warmup_explodes.py", seed, variant)
    [nf] = of(found, "nonfinite")
    ex = of(found, "exploding_gradient")
    assert ex, found
    # reported while the loss is still finite, from the steps between observed ones (the loss
    # overflows at steps 45-75; the old rhythm looked at 32 and 64 only)
    assert SETTLE < ex[0]["step"] < nf["step"]
    assert ex[0]["severity"] == "warning"
    ev = ex[0]["evidence"]
    assert ev["steps"][1] - ev["steps"][0] == 2         # three consecutive recorded steps


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("variant", [pytest.param((), marks=AS_IN_MATRIX), ("--lr", "1e-3", "--features", 64),
                                     ("--classes", 5, "--batch-size", 32)],
                         ids=["lr3e-3", "lr1e-3", "5classes"])
def test_a_slow_fine_tune_is_not_a_flat_loss(request, tmp_path, seed, variant):
    found = found_by(request, tmp_path, "healthy_frozen_backbone.py", seed, variant)
    assert loud(found) == []


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("variant", [pytest.param((), marks=AS_IN_MATRIX), ("--optimizer", "sgd"),
                                     ("--classes", 4, "--width", 128)],
                         ids=["adam", "sgd", "4classes"])
def test_labels_without_signal_are_a_flat_loss(request, tmp_path, seed, variant):
    found = found_by(request, tmp_path, "planted_noise_labels.py", seed, variant)
    [ln] = of(found, "loss_not_decreasing")
    assert ln["severity"] == "warning" and 49 <= ln["step"] < 200
    ev = ln["evidence"]
    assert ev["max_drop"] < ev["needed"] and ev["drop"] < ev["needed"]
    assert [f["rule"] for f in loud(found)] == ["loss_not_decreasing"]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("variant", [pytest.param((), marks=AS_IN_MATRIX), ("--hidden", 128, "--vocab", 2000)],
                         ids=["lstm", "lstm-wide"])
def test_a_clipped_high_lr_that_trains_is_not_a_warning(request, tmp_path, seed, variant):
    found = found_by(request, tmp_path, "healthy_rnn_lm_clip.py", seed, variant)
    assert loud(found) == []
    for f in of(found, "update_ratio"):          # said, as what it is
        assert f["severity"] == "info" and f["evidence"]["loss_trend"] == "falling"
        assert "goes down steadily" in f["message"]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("variant", [pytest.param((), marks=AS_IN_MATRIX),
                                     ("--cell", "gru", "--emb", 32, "--batch-size", 8)], ids=["lstm", "gru"])
def test_an_embedding_is_judged_by_the_rows_it_touched(request, tmp_path, seed, variant):
    found = found_by(request, tmp_path, "healthy_embedding_zipf.py", seed, variant)
    assert loud(found) == []


# -- the rules fed synthetic steps ------------------------------------------------------------------

def test_a_high_update_ratio_reads_the_loss_with_it():
    from nndb.rules.stats_rules import UpdateRatio
    from test_rules_stats import feed, model_step
    rng = np.random.default_rng(0)
    losses = {"falling": [4.0 * 0.98 ** i + 0.01 * rng.standard_normal() for i in range(40)],
              "rising": [2.0 * 1.02 ** i for i in range(40)],
              "unsteady": [2.0 + 0.5 * (-1) ** i for i in range(40)]}
    said = {}
    for trend, loss in losses.items():
        # a steady ratio of 0.3 from step 20 on (an lr that grows, or a clipped high one)
        steps = [model_step(w=1.0, u=0.3 if i >= 20 else 1e-3, loss=loss[i]) for i in range(40)]
        [(step, f)] = feed(UpdateRatio(), steps)
        assert step == 22 and f.evidence["side"] == "high" and f.evidence["loss_trend"] == trend
        said[trend] = f
    assert said["falling"].severity == "info" and "goes down steadily" in said["falling"].message
    assert said["rising"].severity == "warning" and "the loss rises" in said["rising"].message
    assert said["unsteady"].severity == "warning" and "flat or oscillating" in said["unsteady"].message
    assert all("far too high" in said[t].message for t in ("rising", "unsteady"))


def test_an_embedding_is_judged_by_its_touched_rows():
    """The layer spread of an embedding (5% of its rows touched, as measured at
    the full step 0 and carried over) against a dense decoder: RMS over the
    whole table 1500x below, over the touched rows ~330x: not vanishing.  The
    same spread of a dense gradient is."""
    from nndb.rules.stats_rules import VanishingGradient
    from test_rules_stats import feed

    def step(i, emb_zero_frac):
        s = {("loss", "loss"): {"mean": 2.3, "count": 1},
             ("encoder.weight", "param"): {"norm": 10.0}, ("encoder.weight", "update"): {"norm": 0.01},
             ("decoder.weight", "param"): {"norm": 10.0}, ("decoder.weight", "update"): {"norm": 0.01},
             # same element count: the spread is the ratio of the norms
             ("encoder.weight", "grad"): {"norm": 1e-3 / 1.5},
             ("decoder.weight", "grad"): {"norm": 1.0}}
        if i % 32 == 0:          # full steps measure zero_frac
            s[("encoder.weight", "grad")]["zero_frac"] = emb_zero_frac
            s[("decoder.weight", "grad")]["zero_frac"] = 0.0
        return s
    assert feed(VanishingGradient(), [step(i, 0.95) for i in range(40)]) == []
    found = feed(VanishingGradient(), [step(i, 0.0) for i in range(40)])
    assert [(i, f.tensor) for i, f in found] == [(2, "encoder.weight")]
    assert found[0][1].evidence["criteria"] == ["cross_layer"]

