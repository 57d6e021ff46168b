"""``nndb fuzz``: a batch debugger session that runs the script to the end
of step N-1, runs the ``fuzz`` command there (so the batch of step N is
fuzzed) and kills the run.  The report's exit-code contract:

* 0: nothing found within the budget;
* 1: the objective was reached (the input is saved);
* 2: fuzzing could not be done (the script ended before step N, the replica
  saw no model, a bad option), with one line saying why.
"""
from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile

from ..errors import EXIT_OK, EXIT_USAGE, UsageError

EXIT_FOUND = 1


def run_fuzz_batch(target, step: int, line: str, as_json: bool, tmp_root: str) -> tuple:
    """(the report dict, or {"error": ...}; the exit code)."""
    from ..run.config import RunConfig
    from ..commands import TABLE
    from ..driver import DebugOptions, debug
    from ..frontends.batch import BatchFrontend
    from ..errors import CommandError
    try:
        TABLE.parse(line)                     # a bad option is one line, before the script runs
    except CommandError as e:
        raise UsageError(str(e)) from None
    d = tempfile.mkdtemp(prefix="nndb-fuzz-run-", dir=tmp_root)
    errors: list = []

    class Frontend(BatchFrontend):
        def error(self, text: str) -> None:
            errors.append(text)
            if not text.startswith("-e "):       # (our own commands' errors: said once, below)
                super().error(text)

    cmds = ([f"until {step - 1}"] if step > 0 else []) + [line, "kill"]
    config = RunConfig(target, os.path.join(d, "fuzz.h5"), quiet=True)
    options = DebugOptions(batch=True, stop_at_start=True, eval_commands=tuple(cmds), no_rc=True, rules="none",
                           replica="fork")
    saved = None
    if as_json:                              # (the script's output and the session's lines: to stderr)
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(2, 1)
    try:
        result = debug(config, options, Frontend())
    finally:
        if saved is not None:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        shutil.rmtree(d, ignore_errors=True)
    reports = getattr(result.session, "fuzz_reports", [])
    if not reports:
        said = next((e for e in reversed(errors) if "fuzz: " in e), None)
        why = said[said.index("fuzz: "):] if said else f"the script ended before step {step}"
        return {"error": why}, EXIT_USAGE
    report = reports[-1]
    return report, EXIT_FOUND if report.get("found") else EXIT_OK


def command_line(p: dict) -> str:
    """``nndb fuzz``'s options (click's parameters) as the prompt's ``fuzz`` command line."""
    words = ["fuzz", "--until", p["until"], "--budget", str(p["budget"]), "--seed", str(p["seed"]),
             "--scale", repr(p["scale"])]
    for flag, key in (("--against", "against"), ("--tolerance", "tolerance"), ("--layers", "layers"),
                      ("--threshold", "threshold"), ("--save", "save")):
        if p[key] is not None:
            words += [flag, str(p[key])]
    if p["random_search"]:
        words.append("--random")
    return " ".join(shlex.quote(w) for w in words)
