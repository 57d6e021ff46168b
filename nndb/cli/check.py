"""``nndb check``: the first steps of SCRIPT and the checklist practitioners
run by hand (nndb.check), one PASS/FAIL/SKIP line per check."""
from __future__ import annotations

import sys

import click

from ..errors import EXIT_SIGINT, NndbError
from ..text import to_json
from .common import SCRIPT_CONTEXT, ScriptCommand, fail, target_of


@click.command("check", cls=ScriptCommand, context_settings=SCRIPT_CONTEXT)
@click.option("-m", "module", metavar="MODULE", help="Check a library module run as a script, like python -m.")
@click.option("--steps", type=click.IntRange(min=1), default=2, show_default=True, metavar="N",
              help="Run the script's first N steps.")
@click.option("--overfit-iters", type=click.IntRange(min=1), default=300, show_default=True, metavar="N",
              help="Iterations at most for the overfit-one-batch check.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object (the script's own output goes to stderr).")
@click.argument("script", required=False, metavar="SCRIPT")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def check(module, steps, overfit_iters, as_json, script, args):
    """Run the first steps of SCRIPT [ARGS]... and the checklist practitioners
    run by hand: data, shapes, initial loss, finite loss, gradients, zero_grad,
    updates, overfitting one batch.  One PASS/FAIL/SKIP line per check; exit code 0 if
    none failed, 1 if one did (a script that raises, KeyboardInterrupt
    included, or ends its process: run FAIL), 2 on a usage error, 130 at Ctrl-C."""
    from ..check.child import Interrupted, run_check
    from ..run.launcher import prepare

    target = target_of(module, script, args)
    try:
        prepare(target)                 # a bad SCRIPT fails here, before torch is imported
        report = run_check(target, steps, overfit_iters, script_stdout=sys.stderr if as_json else None)
        from ..render.check import text
    except NndbError as e:
        fail(e)
    except (Interrupted, KeyboardInterrupt):
        click.echo("nndb: check interrupted", err=True)
        sys.exit(EXIT_SIGINT)
    click.echo(to_json(report.to_dict()) if as_json else text(report))
    sys.exit(report.exit_code)
