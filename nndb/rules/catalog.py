"""The built-in rules and ``--rules default|FILE.yaml|none``."""
from __future__ import annotations

from typing import Optional

from . import grad_rules, stats_rules
from . import epochs, probe_rules
from .engine import RuleEngine

BUILTIN: list = list(stats_rules.RULES) + list(grad_rules.RULES)
BUILTIN += probe_rules.RULES
BUILTIN += epochs.RULES_HERE


def default_rules() -> list:
    return [cls() for cls in BUILTIN]


def load(spec: Optional[str]) -> Optional[RuleEngine]:
    """``default`` (or None): every built-in rule with its defaults; ``none``:
    no rules; otherwise a YAML rule file (errors raise UsageError with FILE:LINE)."""
    if spec is None or spec == "default":
        return RuleEngine(default_rules())
    if spec == "none":
        return None
    from .yamlfile import load_file
    return RuleEngine(load_file(spec, default_rules()))
