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

import click

from ..errors import EXIT_OK, EXIT_SIGINT, EXIT_SIGTERM, EXIT_USAGE, NndbError, UsageError
from ..text import printable, to_json
from .common import SCRIPT_CONTEXT, Number, ScriptCommand, fail, target_of

EXIT_FOUND = 1


@click.command("fuzz", cls=ScriptCommand, context_settings=SCRIPT_CONTEXT,
               short_help="Fuzz the model with mutants of step N's batch, on a replica.")
@click.option("-m", "module", metavar="MODULE", help="Fuzz a library module run as a script, like python -m.")
@click.option("--step", type=click.IntRange(min=0), required=True, metavar="N",
              help="Fuzz the batch of training step N (the run goes to the end of step N-1 first).")
@click.option("--until", default="nan", show_default=True, metavar="nan|EXPR",
              help="The objective: a non-finite activation, loss or gradient, or a condition such as 'loss > 1e3'.")
@click.option("--against", type=click.Choice(["fp16", "bf16"]),
              help="The objective: the model and its copy in this precision disagree beyond --tolerance.")
@click.option("--tolerance", type=Number(min=0, min_open=True), metavar="T",
              help="--against's relative tolerance (default 0.01 for fp16, 0.05 for bf16).")
@click.option("--budget", type=click.IntRange(min=1), default=1000, show_default=True, metavar="N",
              help="Mutant batches evaluated at most.")
@click.option("--layers", metavar="GLOB", help="Coverage from these modules' outputs (default: the model's output).")
@click.option("--seed", type=int, default=0, show_default=True, help="The mutations' random seed.")
@click.option("--random", "random_search", is_flag=True, help="Random search: the same mutations, no coverage guidance.")
@click.option("--scale", type=Number(min=0, max=1, min_open=True), default=0.1, show_default=True,
              metavar="F", help="Mutation size: a share of each float input's range (of the elements, for integers).")
@click.option("--threshold", type=Number(min=0, min_open=True), metavar="D",
              help="Coverage distance (default: the median nearest-neighbour distance in the step's batch).")
@click.option("--save", metavar="FILE.pt", type=click.Path(dir_okay=False),
              help="Where the input found is saved (default ./nndb-fuzz-stepN.pt).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the report as one JSON object (the script's own output goes to stderr).")
@click.argument("script", required=False, metavar="SCRIPT")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def fuzz(module, step, until, against, tolerance, budget, layers, seed, random_search, scale, threshold, save,
         as_json, script, args):
    """Run SCRIPT [ARGS]... (or -m MODULE) to training step N and fuzz the
    model with mutants of that step's batch on a replica (coverage-guided,
    TensorFuzz), then end the run.  Exit code 0 if nothing was found within
    the budget, 1 if the objective was reached (the report says how, and the
    input is saved), 2 on a usage error or when fuzzing could not be done
    (the script ended before step N, no model or loss seen), 130 at Ctrl-C,
    143 at SIGTERM."""
    from ..run.preload import maybe_restart
    maybe_restart("fork")
    from ..run.launcher import prepare

    if step == 0:
        # (fuzz starts at a step end and fuzzes the next step's batch; the run's first stop
        # is inside step 0, in the model's first forward, where its batch is already taken)
        fail(UsageError("--step 0: fuzzing starts at a step end, with the next step's batch, and no step ends "
                        "before step 0: the first batch it can fuzz is step 1's (--step 1)"))
    target = target_of(module, script, args)
    line = command_line(click.get_current_context().params)
    try:
        prepare(target)
        report, code = run_fuzz_batch(target, step, line, as_json, tempfile.gettempdir())
    except NndbError as e:
        fail(e)
    except KeyboardInterrupt:
        click.echo("nndb: fuzz interrupted", err=True)
        sys.exit(EXIT_SIGINT)
    if as_json:
        click.echo(to_json(report))
    elif report.get("error"):
        click.echo(printable(f"nndb: error: {report['error']}"), err=True)
    sys.exit(code)


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
                           replica="fork", own_commands=True)
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
    reports = result.session.log.fuzz_reports
    run = result.run
    if not reports and run is not None and run.exit_code in (EXIT_SIGINT, EXIT_SIGTERM):
        # (Ctrl-C reaches the replica too: the script it ran on ended "before the model's next forward pass")
        why = "interrupted (Ctrl-C)" if run.exit_code == EXIT_SIGINT else "terminated (SIGTERM)"
        return {"error": f"fuzz {why}; the live run is unchanged"}, run.exit_code
    if not reports:
        own = f"-e {shlex.quote(line)}: "        # (the fuzz command's own refusal, as the prompt says it)
        said = next((e[len(own):] for e in reversed(errors) if e.startswith(own)), None) or \
            next((e[e.index("fuzz: "):] for e in reversed(errors) if "fuzz: " in e), None)
        why = (said if said else
               f"the script ended ({run.status}, exit code {run.exit_code}) after {result.session.steps_done()} "
               f"step(s), before step {step}" if run is not None else f"the script ended before step {step}")
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
