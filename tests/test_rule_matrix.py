"""The rule matrix (scripts/rule_matrix.py) over tests/scripts/: every built-in
rule (from the registry: a new rule without a planted script fails here) is
fired by at least one planted script on each of seeds 0, 1, 2, and every
healthy script raises no error/warning finding on any of them.  The
examples (scripts/examples) are left to the printed matrix and to
test_rules_healthy.py: they are 10-70x slower."""
import pytest

from conftest import rule_matrix

matrix = rule_matrix()
SCRIPTS = [s for s in matrix.scripts() if not s.name.startswith("examples/")]
RULES = matrix.builtin_rules()
# (one worker computes the matrix: under --dist loadgroup the group's tests stay together)
pytestmark = pytest.mark.xdist_group("rule_matrix")


@pytest.fixture
def outcomes(matrix_outcomes):       # (conftest's session fixture, shared with test_rules_trend.py)
    assert [(o.script.name, o.seed) for o in matrix_outcomes] == [(s.name, k) for s in SCRIPTS for k in matrix.SEEDS]
    return matrix_outcomes


def test_the_matrix_has_scripts_of_both_kinds():
    kinds = {s.kind for s in SCRIPTS}
    assert kinds == {"planted", "healthy"} and len(RULES) >= 16


@pytest.mark.parametrize("rule", RULES)
def test_each_rule_is_fired_by_a_planted_script_on_every_seed(outcomes, rule):
    firing = {}
    for o in outcomes:
        if o.script.kind == "planted" and rule in o.first:
            firing.setdefault(o.script.name, set()).add(o.seed)
    assert any(seeds == set(matrix.SEEDS) for seeds in firing.values()), \
        f"no planted script fires {rule} on all of seeds {matrix.SEEDS} (partly: {firing})"


@pytest.mark.parametrize("script", [s.name for s in SCRIPTS if s.kind == "healthy"])
def test_healthy_scripts_are_silent_on_every_seed(outcomes, script):
    mine = [o for o in outcomes if o.script.name == script]
    assert len(mine) == len(matrix.SEEDS)
    for o in mine:
        assert o.exit_code == 0 and o.rules_failed == []
        assert o.loud == [], f"{script} --seed {o.seed}: {o.first}"


def test_planted_scripts_run_to_the_end(outcomes):
    assert [(o.script.name, o.seed) for o in outcomes if o.exit_code != 0 or o.rules_failed] == []


def test_the_table_lists_every_rule(outcomes):
    text = matrix.table(outcomes)
    assert all(f"| `{r}` |" in text for r in RULES) and "**none**" not in text


# The matrix above judges the steps between observed ones in blocks (nndb.rules.block);
# these scripts, judged step by step, must give the same findings (step, message and
# evidence alike).  Planted ones whose every-step rules flag (streaks, references,
# losses, NaN: blocks fall back to step by step) and healthy ones judged in whole blocks.
BLOCK_CHECKED = ["planted_warmup_explodes", "planted_exploding_gradient_deep_init", "planted_vanishing_gradient",
                 "planted_update_ratio_tiny_lr", "planted_param_not_updated", "planted_noise_labels",
                 "planted_nonfinite", "healthy_rnn_lm_clip", "healthy_embedding_zipf",
                 "healthy_frozen_backbone_finetune"]


def test_blocks_find_what_step_by_step_judgement_finds(outcomes, monkeypatch):
    from nndb.rules import engine
    monkeypatch.setattr(engine, "BLOCK_STEPS", 1)       # every step judged as it comes
    scripts = [s for s in SCRIPTS if any(name in s.name for name in BLOCK_CHECKED)]
    assert len(scripts) == len(BLOCK_CHECKED)
    blocks = {o.script.name: o for o in outcomes if o.seed == 0}
    for s in scripts:
        single = matrix.run_one(s, 0)
        assert single.longest_block <= 1, s.name
        assert single.exit_code == blocks[s.name].exit_code == 0 and single.rules_failed == []
        assert single.findings == blocks[s.name].findings, s.name
    assert sum(len(blocks[s.name].findings) for s in scripts) >= 8      # (the planted bugs were found)
    # (what the comparison is worth: most of these runs' steps were judged in
    # blocks.  Counted in steps, not by the longest block: a checkpoint ends a
    # block too, and the adaptive schedule places checkpoints by wall time)
    assert sum(blocks[s.name].steps_in_blocks for s in scripts) >= sum(blocks[s.name].steps for s in scripts) / 2
    assert sum(blocks[s.name].longest_block >= 16 for s in scripts) >= 2
