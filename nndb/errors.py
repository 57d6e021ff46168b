"""One exception hierarchy for nndb; the CLI maps each to an exit code.

Exit codes (also in docs/commands.md):

====  =============================================================
0     the script finished (or ``sys.exit(0)``)
1     the script raised
2     usage error: bad command line, missing script, unreadable trace
3     an internal nndb error
4     a breakpoint, watchpoint or rule with the ``fail`` action fired, or
      with ``--fail-on warning|error`` a finding that severe
5     a distributed job hung (``--hang-timeout``): every rank's stack was shown
130   interrupted (SIGINT / Ctrl-C; ``nndb run`` ends by SIGINT itself, as Python does,
      or exits 1 where Python does: nndb.run.runner._python_exits_1_on_interrupt)
143   terminated (SIGTERM)
====  =============================================================
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_SCRIPT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
EXIT_FAIL_ACTION = 4
EXIT_HANG = 5
EXIT_SIGINT = 130
EXIT_SIGTERM = 143


class NndbError(Exception):
    """An error nndb reports in one line, with an exit code."""
    exit_code = EXIT_INTERNAL


class UsageError(NndbError):
    exit_code = EXIT_USAGE


class ScriptNotFound(UsageError):
    pass


class TraceError(UsageError):
    """A trace that cannot be read: missing, truncated, corrupted, not nndb's."""


class TraceWriteError(UsageError):
    """The trace cannot be created or written."""


class Terminated(BaseException):
    """Raised in the main thread by nndb's SIGTERM handler, so the trace is
    closed on the way out (a BaseException, like KeyboardInterrupt, so that
    the script's ``except Exception`` does not swallow it)."""


class CommandError(NndbError):
    """A debugger command that cannot be carried out: bad syntax, an unknown
    name, an expression that raised.  The session prints one line (and the
    usage line, if given) and goes on."""
    exit_code = EXIT_USAGE

    def __init__(self, message: str, usage: str = ""):
        super().__init__(message)
        self.usage = usage


class KillRun(BaseException):
    """Raised out of a stop point by ``kill``/``quit``: unwinds the script
    (a BaseException, so its ``except Exception`` does not swallow it).
    ``reason``/``code``: why and with which exit code, where not the user's
    ``kill`` (batch mode ending the run at a ``fail`` point: exit 4)."""

    def __init__(self, reason: str = "killed from the debugger", code: int = 0):
        super().__init__(reason)
        self.reason, self.code = reason, code


class RestartRun(BaseException):
    """Raised out of a stop point by ``run``: unwinds the script, which is
    then started again from the beginning."""
