"""The every-step rules judge the steps between observed ones in blocks
(nndb.rules.block): the same findings as judging them one by one, step,
message and evidence alike; a finding is in before any stop, and a rule
whose action stops the run is judged at its step."""
import importlib.util
import os
import sys

import pytest

from conftest import ROOT, example, nndb, run_in_process
from nndb.rules import engine as E

spec = importlib.util.spec_from_file_location("rule_matrix", os.path.join(ROOT, "scripts", "rule_matrix.py"))
matrix = sys.modules.get("rule_matrix") or importlib.util.module_from_spec(spec)
if "rule_matrix" not in sys.modules:
    sys.modules["rule_matrix"] = matrix
    spec.loader.exec_module(matrix)

# Planted scripts whose every-step rules flag (streaks, references, losses,
# NaN: the blocks fall back to step by step) and healthy ones they judge whole.
SCRIPTS = ["planted_warmup_explodes", "planted_exploding_gradient_deep_init", "planted_vanishing_gradient",
           "planted_update_ratio_tiny_lr", "planted_param_not_updated", "planted_noise_labels",
           "planted_nonfinite", "healthy_rnn_lm_clip", "healthy_embedding_zipf", "healthy_frozen_backbone_finetune"]


def _runs(seed):
    return {o.script.name: o for o in (matrix.run_one(s, seed) for s in matrix.scripts(SCRIPTS)
                                       if not s.name.startswith("examples/"))}


@pytest.mark.parametrize("seed", [0, 1])
def test_blocks_find_what_step_by_step_judgement_finds(monkeypatch, seed):
    judged = []
    real = E.RuleEngine.flush

    def flush(self):
        judged.append(len(self._queue))
        return real(self)
    monkeypatch.setattr(E.RuleEngine, "flush", flush)
    blocks = _runs(seed)
    assert len(blocks) == len(SCRIPTS)
    assert max(judged) == E.BLOCK_STEPS          # (steps were judged in blocks)
    judged.clear()
    monkeypatch.setattr(E, "BLOCK_STEPS", 1)    # every step judged as it comes
    single = _runs(seed)
    assert max(judged, default=0) <= 1
    for name, o in blocks.items():
        assert o.exit_code == single[name].exit_code == 0 and o.rules_failed == []
        assert o.findings == single[name].findings, name
    assert sum(len(o.findings) for o in blocks.values()) >= 8     # (the planted bugs were found)
