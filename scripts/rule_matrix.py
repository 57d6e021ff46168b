"""The rule matrix: which planted scripts fire each built-in rule, which healthy
scripts stay silent.

Runs every planted and healthy script (``scripts/examples/*.py`` as the
examples README classes them, and ``tests/scripts/planted_*.py`` /
``healthy_*.py``) for each seed, in this process, under nndb's batch mode
with the default rules, and prints a markdown table: per rule, the planted
scripts that fired it (the step of its first finding, per seed) and the
healthy scripts that stayed silent on it.  A script "fires" a rule when a
finding of that rule, of any severity, is reported; a healthy script must
raise no finding of severity error or warning.

    python scripts/rule_matrix.py [--seeds 0,1,2] [--only NAME ...] [--json FILE]

Exit status 0 always (it is a report; tests/test_rule_matrix.py asserts).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import glob
import io
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

EXAMPLES = os.path.join(ROOT, "scripts", "examples")
TEST_SCRIPTS = os.path.join(ROOT, "tests", "scripts")
SEEDS = (0, 1, 2)

# The examples' kinds, as scripts/examples/README.md gives them (raises.py plants
# an exception, not a rule's bug: it is not in the matrix).
EXAMPLE_KINDS = {
    "mlp.py": "healthy", "cnn.py": "healthy", "lstm.py": "healthy", "transformer.py": "healthy",
    "grad_accum.py": "healthy", "gan.py": "healthy", "lbfgs.py": "healthy", "manual_sgd.py": "healthy",
    "frozen_backbone.py": "healthy", "dataloader.py": "healthy",
    "nan_lr.py": "planted", "dead_relu.py": "planted", "no_zero_grad.py": "planted",
    "double_softmax.py": "planted", "raw_pixels.py": "planted",
}


@dataclass
class Script:
    name: str                   # shown in the table: examples/mlp.py, planted_dead_relu_conv.py
    path: str
    kind: str                   # planted | healthy


@dataclass
class Outcome:
    script: Script
    seed: int
    exit_code: int
    first: dict = field(default_factory=dict)       # rule -> (step, severity) of its first finding
    rules_failed: list = field(default_factory=list)    # rules switched off by an error of their own
    seconds: float = 0.0
    findings: list = field(default_factory=list)    # every finding, as the report has them
    longest_block: int = 0                          # most steps the rules judged together (nndb.rules.block)
    steps_in_blocks: int = 0                        # steps the rules judged in blocks of two or more
    steps: int = 0                                  # steps the run recorded

    @property
    def loud(self) -> list:
        """Rules with a finding of severity error or warning."""
        return sorted(r for r, (_, sev) in self.first.items() if sev in ("error", "warning"))


def scripts(only=()) -> list:
    out = [Script(f"examples/{n}", os.path.join(EXAMPLES, n), k) for n, k in sorted(EXAMPLE_KINDS.items())]
    for kind in ("planted", "healthy"):
        for p in sorted(glob.glob(os.path.join(TEST_SCRIPTS, f"{kind}_*.py"))):
            out.append(Script(os.path.basename(p), p, kind))
    if only:
        out = [s for s in out if any(o in s.name for o in only)]
    return out


def builtin_rules() -> list:
    from nndb.rules.catalog import BUILTIN
    return [cls.id for cls in BUILTIN]


def run_one(script: Script, seed: int) -> Outcome:
    """The script under nndb's batch mode, in this process, default rules; its output swallowed."""
    from nndb.run.config import RunConfig
    from nndb.driver import DebugOptions, debug
    from nndb.frontends.batch import ScriptedFrontend
    from nndb.run.launcher import Target
    gc.collect()        # an earlier run's optimizers must not look alive to the step clock
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="nndb-matrix-") as tmp:
        cfg = RunConfig(Target(path=script.path, args=["--seed", str(seed)]), os.path.join(tmp, "run.h5"),
                        quiet=True)
        sink = io.StringIO()
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            res = debug(cfg, DebugOptions(batch=True, no_rc=True, rules="default"), ScriptedFrontend([]))
    out = Outcome(script, seed, res.exit_code, seconds=time.perf_counter() - t0)
    out.findings = res.session.log.findings
    out.longest_block = res.session.rules.longest_block
    out.steps_in_blocks = res.session.rules.steps_in_blocks
    out.steps = res.session.steps_done()
    for f in res.session.log.findings:
        out.first.setdefault(f["rule"], (f["step"], f["severity"]))
    out.rules_failed = [r.id for r in res.session.rules.rules if not r.enabled]
    return out


def run_matrix(seeds=SEEDS, only=()) -> list:
    return [run_one(s, seed) for s in scripts(only) for seed in seeds]


def table(outcomes: list, seeds=SEEDS) -> str:
    """The markdown table: rule | planted scripts firing it (first step per seed) | healthy scripts silent."""
    by_script: dict = {}
    for o in outcomes:
        by_script.setdefault(o.script.name, (o.script, {}))[1][o.seed] = o
    healthy = [name for name, (s, _) in by_script.items() if s.kind == "healthy"]
    lines = [f"| rule | planted scripts that fire it (step of the first finding, seeds {','.join(map(str, seeds))}) "
             f"| healthy scripts silent on it (of {len(healthy)}) |", "|---|---|---|"]
    for rule in builtin_rules():
        fired = []
        for name, (s, runs) in by_script.items():
            if s.kind != "planted":
                continue
            steps = [runs[k].first.get(rule, (None,))[0] if k in runs else None for k in seeds]
            if any(st is not None for st in steps):
                fired.append(f"{name} ({'/'.join('-' if st is None else str(st) for st in steps)})")
        silent = [n for n in healthy if all(rule not in o.loud for o in by_script[n][1].values())]
        loud = [n for n in healthy if n not in silent]
        cell = f"{len(silent)}/{len(healthy)}" + (f"; fires on: {', '.join(loud)}" if loud else "")
        lines.append(f"| `{rule}` | {'<br>'.join(fired) or '**none**'} | {cell} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument("--only", nargs="*", default=(), help="scripts whose name contains one of these")
    ap.add_argument("--json", help="also write each run's outcome here")
    a = ap.parse_args(argv)
    seeds = tuple(int(s) for s in a.seeds.split(","))
    outcomes = []
    for s in scripts(a.only):
        for seed in seeds:
            o = run_one(s, seed)
            outcomes.append(o)
            print(f"{s.name} seed {seed}: exit {o.exit_code}, {o.seconds:.2f} s, "
                  f"{', '.join(f'{r}@{st}' for r, (st, _) in o.first.items()) or 'no finding'}"
                  + (f"; rules failed: {o.rules_failed}" if o.rules_failed else ""), file=sys.stderr)
    print(table(outcomes, seeds))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump([{"script": o.script.name, "kind": o.script.kind, "seed": o.seed, "exit_code": o.exit_code,
                        "first": o.first, "rules_failed": o.rules_failed, "seconds": round(o.seconds, 3)}
                       for o in outcomes], fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
