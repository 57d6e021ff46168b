"""``nndb check-trace``: the diagnostic rules over a finished trace, as the
live run ran them, with the findings the live run stored."""
from __future__ import annotations

import sys

import click

from ..errors import EXIT_FAIL_ACTION, EXIT_OK, NndbError
from ..text import to_json
from .common import fail


@click.command("check-trace")
@click.argument("trace", metavar="TRACE")
@click.option("--rules", "rules", default="default", show_default=True, metavar="default|FILE.yaml",
              help="The rules to run: the built-in set or a YAML rule file, as for nndb run.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--fail-on", "fail_on", type=click.Choice(["warning", "error"]),
              help="Exit with code 4 if a finding (the run's or the re-check's) is this severe or worse.")
def check_trace(trace, rules, as_json, fail_on):
    """Run the diagnostic rules over a finished trace, as the live run did,
    and give the findings the live run stored with them, each marked with
    who found it ([run], [check-trace]).  Findings are printed as a live run
    prints them; rules that need the live run (its probes, optimizers) are
    named with the reason.  Exit code 0, or 4 if a rule with the fail action
    fired (or, with --fail-on, a finding that severe), 2 for an unreadable
    trace or rule file."""
    from ..render.offline import text
    from ..rules.catalog import load
    from ..rules.engine import RuleEngine
    from ..rules.offline import check_trace as run_rules
    from ..store.reader import TraceReader

    try:
        engine = load(rules) or RuleEngine([])
        with TraceReader(trace) as reader:
            result = run_rules(reader, engine)
    except NndbError as e:
        fail(e)
    from ..rules.base import failing_findings
    click.echo(to_json(result.to_dict()) if as_json else text(result))
    failed = result.failed or failing_findings(result.all_findings(), fail_on)
    sys.exit(EXIT_FAIL_ACTION if failed else EXIT_OK)
