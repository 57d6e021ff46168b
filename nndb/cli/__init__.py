"""The ``nndb`` command line.  click stays in this package: one module per
command (run, check, check-trace, export, plot, inspect, fuzz, trust), the
flags of ``nndb run`` become one RunOptions (nndb.run.config) handed to
everything below, results become exit codes (see nndb.errors for the table).
``main`` is the ``nndb`` program; ``replica_main`` a respawned replica's."""
from __future__ import annotations

import sys

import click

from ..version import __version__
from ..errors import EXIT_INTERNAL
from ..schema import KINDS as KIND_CHOICES, STAT_NAMES as STAT_CHOICES  # (a leaf: no torch, no h5py)
from . import check, check_trace, export, fuzz, inspect, plot, run, trust
from .replica import replica_main

__all__ = ["cli", "main", "replica_main", "KIND_CHOICES", "STAT_CHOICES"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="nndb")
def cli():
    """nndb: a debugger for PyTorch training, in the style of gdb and pdb."""


for _command in (run.run, check.check, fuzz.fuzz, trust.trust, inspect.inspect, check_trace.check_trace,
                 export.export, plot.plot):
    cli.add_command(_command)


def main(argv=None) -> None:
    try:
        try:
            code = cli.main(args=argv, prog_name="nndb", standalone_mode=False)
        except click.ClickException as e:
            if type(e).__name__ == "NoArgsIsHelpError":        # (`nndb` alone: the help, as click shows it)
                e.show()
                sys.exit(e.exit_code)
            # A bad option or argument: one line and its exit code (2), as every other usage
            # error (click's own form is three: the usage, a hint, the error)
            click.echo(f"nndb: error: {e.format_message()}", err=True)
            sys.exit(e.exit_code)
        except click.Abort as e:
            if isinstance(e.__context__, KeyboardInterrupt):
                # Ctrl-C before the script runs (nndb and torch importing): one line, and the
                # process ends by SIGINT as Python's own Ctrl-C does (130 in a shell)
                click.echo("nndb: interrupted (Ctrl-C)", err=True)
                sys.excepthook = lambda *exc: None
                raise KeyboardInterrupt from None
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)     # (--help, --version: click's Exit code)
    except SystemExit:
        if run.INTERRUPTED:
            # The script's KeyboardInterrupt (its traceback shown already)
            # ends the process as Python would have ended the script: Python
            # ends itself by SIGINT after its exit handlers (raised on out of
            # nndb, with a silent excepthook, Python does just that).  Where
            # Python exits 1 instead, the run's result (and its trace) said 1,
            # and this is not reached (nndb.run.runner._python_exits_1_on_interrupt).
            sys.excepthook = lambda *exc: None
            raise KeyboardInterrupt from None
        raise
    except Exception as e:  # a bug in nndb: one line, exit 3
        click.echo(f"nndb: internal error: {type(e).__name__}: {e} "
                   f"(please report it; set NNDB_DEBUG=1 for the traceback)", err=True)
        import os
        if os.environ.get("NNDB_DEBUG"):
            import traceback
            traceback.print_exc()
        sys.exit(EXIT_INTERNAL)


if __name__ == "__main__":
    main()
