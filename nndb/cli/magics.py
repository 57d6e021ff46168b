"""The notebook magics (``%load_ext nndb``):

``%nndb run [OPTIONS] SCRIPT [ARGS]`` (and ``%debug_train SCRIPT [ARGS]``)
runs a script under the debugger inside the kernel, as ``nndb run`` does:
the prompt is the notebook's input box, tables show as HTML, ``continue``
gives control back, and the trace's summary is the cell's output.

``%%nndb [--trace PATH] [-e CMD ...]`` records the cell (as ``nndb.record``)
and runs the -e commands as ``nndb run --batch -e`` does: at the start of
the first step and at the stops (a ``watch`` set there stops the loop).

Nothing re-executes the kernel: time travel is off (KERNEL_NO_REPLICAS).
Bad options are one line (``nndb: error: ...``), never a traceback."""
from __future__ import annotations

import argparse
import linecache
import shlex

from ..errors import NndbError, UsageError
from ..frontends.notebook import KERNEL_NO_REPLICAS, NotebookFrontend

RUN_USAGE = "%nndb run [NNDB RUN OPTIONS] SCRIPT [ARGS] (the options of 'nndb run --help')"
CELL_USAGE = "%%nndb [--trace PATH] [--force] [--rules R] [-e CMD]..."


class _Parser(argparse.ArgumentParser):
    def error(self, message):           # one line, not argparse's usage and SystemExit
        raise UsageError(f"{message} (usage: {self.usage})")


def _parser(usage: str) -> _Parser:
    p = _Parser(prog="%nndb", usage=usage, add_help=False)
    p.add_argument("--trace")
    p.add_argument("--force", action="store_true")
    p.add_argument("--rules", default="default")
    p.add_argument("-e", "--eval-command", dest="commands", action="append", default=[])
    return p


def _say_error(e: Exception) -> None:
    import sys
    print(f"nndb: error: {e}", file=sys.stderr, flush=True)


def run_script(line: str):
    """``%nndb run ...``: the script under the debugger, in this kernel.
    Returns the run's Trace (shown as its summary), or None after an error line."""
    from ..api.trace import Trace
    from .run import parse_run_line
    from ..driver import debug
    from .setup import run_setup
    try:
        parsed = parse_run_line(shlex.split(line), "%nndb run")
        if parsed is None:                      # (--help: printed)
            return None
        o, target = parsed
        if o.nproc_per_node is not None:
            raise UsageError("--nproc-per-node: a job of several ranks runs from a terminal "
                             "('nndb run --nproc-per-node N SCRIPT'), not inside a kernel")
        if o.replica not in ("auto", "off"):
            raise UsageError(f"--replica {o.replica}: time travel is off in a notebook kernel "
                             f"({KERNEL_NO_REPLICAS})")
        config, options = run_setup(o, target, batch=o.batch, progress=False, replica="off",
                                    replica_off_reason=KERNEL_NO_REPLICAS)
        result = debug(config, options, NotebookFrontend())
    except (NndbError, ValueError) as e:
        _say_error(e)
        return None
    if result.run is None:
        return None
    if result.exit_code:
        _say_error(f"the run ended with exit code {result.exit_code} ({result.reason})")
    return Trace(result.run.trace_path)


def record_cell(line: str, cell: str, shell):
    """``%%nndb``: record (and debug, with -e) the cell; returns its Trace."""
    from ..api.recording import Recorder
    name = f"<nndb-cell-{abs(hash(cell)):x}>"
    try:
        a = _parser(CELL_USAGE).parse_args(shlex.split(line))
        rec = Recorder(a.trace, force=a.force, script=name, rules=None if a.rules == "none" else a.rules,
                       frontend=NotebookFrontend(), commands=tuple(a.commands), quiet=False)
    except (NndbError, ValueError) as e:
        _say_error(e)
        return None
    linecache.cache[name] = (len(cell), None, cell.splitlines(True), name)   # ('list' and stop lines show it)
    code = compile(cell, name, "exec")
    with rec:
        exec(code, shell.user_ns)
    return rec.trace


def register(ipython) -> None:
    def nndb_magic(line, cell=None):
        if cell is not None:
            return record_cell(line, cell, ipython)
        words = line.split(None, 1)
        if not words or words[0] != "run":
            _say_error(f"%nndb: say 'run SCRIPT [ARGS]' (usage: {RUN_USAGE}), or use %%nndb on a cell")
            return None
        return run_script(words[1] if len(words) > 1 else "")

    def debug_train(line):
        return run_script(line)

    ipython.register_magic_function(nndb_magic, magic_kind="line_cell", magic_name="nndb")
    ipython.register_magic_function(debug_train, magic_kind="line", magic_name="debug_train")

