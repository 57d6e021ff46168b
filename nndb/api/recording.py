"""``nndb.record(PATH)``: record a training loop inside this process.

The pieces are those of ``nndb run --batch`` (nndb.run.runner.Recording: the
tracer, recorder and trace writer; the debugger session from
nndb.driver.build_session with its rules), put around a ``with``
block instead of a script, so a notebook cell or code that cannot be
launched as a script records the same trace and gets the same findings.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Optional

from ..run.config import RecordSchedule, RunConfig, default_trace_path
from ..driver import DebugOptions, build_session
from ..commands import TABLE
from ..frontends.batch import BatchFrontend
from ..commands.rcfiles import first_error, startup_lines
from ..errors import EXIT_OK, EXIT_SCRIPT_ERROR, EXIT_SIGINT, EXIT_SIGTERM, KillRun, RestartRun, Terminated, UsageError
from ..run.launcher import Target, system_exit_code
from ..run.paths import default_dir_writable, resolve_trace
from ..run.runner import Recording, stderr_line
from ..run import meta as runmeta
from .trace import FindingList, Trace


def _caller_file() -> str:
    """The file of the code that called ``nndb.record`` (the trace's "script"):
    a notebook cell's pseudo-file name as Python gives it."""
    f = sys._getframe(2)
    while f is not None and f.f_globals.get("__name__", "").partition(".")[0] == "nndb":
        f = f.f_back
    return f.f_code.co_filename if f is not None else "<unknown>"


def _ending(exc: Optional[BaseException]) -> tuple:
    """(status, exit code, reason) of the trace's ``end``, as ``nndb run`` gives them."""
    if exc is None:
        return "finished", EXIT_OK, ""
    if isinstance(exc, SystemExit):
        try:
            code = system_exit_code(exc)
        except Exception:
            code = 1
        return ("finished" if code == 0 else "failed"), code, f"sys.exit({exc.code!r})"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", EXIT_SIGINT, "KeyboardInterrupt"
    if isinstance(exc, KillRun):       # (quit at nndb.set_trace's prompt)
        return "killed", exc.code, exc.reason
    if isinstance(exc, RestartRun):
        return "killed", EXIT_OK, "restarted from the debugger"
    if isinstance(exc, Terminated):
        return "terminated", EXIT_SIGTERM, "SIGTERM"
    try:
        reason = f"{type(exc).__name__}: {exc}"
    except Exception:
        reason = type(exc).__name__
    return "failed", EXIT_SCRIPT_ERROR, reason


def _quietly(fn, *args) -> None:
    """nndb's own failure while ending the block is one line on stderr: it
    never replaces the block's outcome (its exception, or its success)."""
    try:
        fn(*args)
    except Exception as e:
        stderr_line(f"nndb: internal error while ending the recording: {type(e).__name__}: {e}")


class Recorder:
    """What ``nndb.record`` returns; use it as a context manager.

    Inside the block every training step is recorded into ``path`` and the
    rules run, exactly as under ``nndb run --batch``; findings are printed
    on stderr (``nndb: warning: ...``) and kept on ``findings``.  The trace is
    closed when the block ends, however it ends (an exception in the loop is
    recorded as the run's failure and goes on up to the caller, untouched).
    Afterwards ``trace`` (or ``open()``) reads it; during the block ``open()``
    gives a live view, the steps recorded so far included.

    Not in ``record()``: time travel (replicas are off: forking a notebook
    kernel or the caller's process is not safe; use ``nndb run`` for
    ``goto`` and ``reverse-step``), the prompt (``nndb.set_trace()`` has it:
    in the block it is a stop of this recording, whose queued commands run
    there as in batch mode), and nndb's SIGTERM handling (the process's
    signals stay its own).
    """

    def __init__(self, path: Optional[str], *, force: bool = False, rules: Optional[str] = "default",
                 every: Optional[int] = None, steps: Optional[str] = None, full_every: Optional[int] = None,
                 act_every: Optional[int] = None, flush_every: int = 500, flush_secs: float = 2.0,
                 lineage: Optional[str] = None, quiet: bool = True, frontend=None, interactive: bool = False,
                 commands: tuple = (), script: Optional[str] = None, replica: str = "off"):
        script = script or _caller_file()      # (the trace's "script": a notebook cell names its own)
        if path is None:            # a new file under ./nndb-runs/, named as nndb run names them
            stem = re.sub(r"[^\w.-]+", "", os.path.splitext(os.path.basename(script))[0]) or "run"
            self.path = default_trace_path(Target(path=stem + ".py"), directory=default_dir_writable("nndb-runs"))
        else:
            self.path = resolve_trace(os.fspath(path), force, what="nndb.record:", force_flag="force=True")
        schedule = RecordSchedule.parse(every, steps, full_every, act_every)
        if flush_every < 1 or not flush_secs >= 0:
            raise UsageError(f"nndb.record: flush_every must be >= 1 and flush_secs >= 0, "
                             f"not {flush_every} and {flush_secs}")
        self._config = RunConfig(Target(path=script), self.path, schedule, flush_every, flush_secs, quiet)
        # (a bad rule file fails here, before anything is recorded).  A
        # ``frontend`` prints the session's output (a notebook's); with
        # ``interactive`` (nndb.set_trace) it prompts at the stops, and
        # ``commands`` run as nndb run's -e commands do (a command that does
        # not parse fails here).
        self._session = build_session(frontend or BatchFrontend(), DebugOptions(
            batch=not interactive, stop_at_start=False, no_rc=True, rules=rules, replica=replica, lineage=lineage,
            replica_off_reason=None if replica != "off" else
            "nndb.record: forking or re-running the caller's process is not safe; 'nndb run SCRIPT' has time travel"))
        if commands:
            lines = startup_lines([], list(commands), True, stderr_line)
            bad = first_error(TABLE, lines)
            if bad is not None:
                raise UsageError(bad)
            self._session.queue_lines(lines)
        self._rec: Optional[Recording] = None
        self._trace: Optional[Trace] = None
        self.status: Optional[str] = None

    def __enter__(self) -> "Recorder":
        if self._rec is not None or self.status is not None:
            raise UsageError("nndb.record: a recorder records one block; call nndb.record again for another")
        cfg = self._config
        meta = dict(runmeta.collect(cfg.target, cfg.schedule.describe()), in_process=True)
        if cfg.target.path.startswith("<"):         # ("<stdin>", a notebook cell's "<ipython-input-...>")
            meta.update(script=cfg.target.path, argv=[cfg.target.path])
        # (a notebook makes its model and optimizer in one cell and trains in
        # another: the tracer takes an optimizer alive at the block's start for
        # the loop's when it holds the parameters the first backward reaches)
        self._rec = Recording(self.path, meta, cfg, stderr_line)
        if not cfg.quiet:
            stderr_line(f"nndb: recording to {self.path}")
        self._session.attach(self._rec, self.path)
        try:
            self._rec.__enter__()
        except BaseException:
            self._close(*_ending(None))
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.end(exc, post_mortem=True)
        # The block's own exception goes on, untouched; 'kill' at a stop ends the block only
        # (as it ends a script under nndb run; in a %%nndb cell it raised into the cell).
        return isinstance(exc, KillRun)

    @property
    def session(self):
        """The debugger session recording the block (nndb.debugger.session.Session)."""
        return self._session

    def end(self, exc: Optional[BaseException] = None, post_mortem: bool = False) -> None:
        """End the recording as the block's end does (``exc``: how it ended;
        ``post_mortem``: stop at its raising frame, as the block's exit does).
        nndb.set_trace, which has no block, ends its recording here."""
        if self._rec is None or self.status is not None:
            return
        status, code, reason = _ending(exc)
        # In nndb run's order (runner.record): the tracer closes the step the
        # block ended in, then the exception's stop, then the trace.
        _quietly(self._rec.__exit__, type(exc) if exc else None, exc, exc.__traceback__ if exc else None)
        if exc is not None and status == "failed" and post_mortem:
            _quietly(self._session.post_mortem, exc)    # (the stop the report and the trace keep)
        _quietly(self._close, status, code, reason)

    def _close(self, status: str, code: int, reason: str) -> None:
        self.status = status
        try:
            self._session.flush_rules()     # (the last steps' findings, before the trace closes)
            self._rec.close(status, code, reason)
        finally:
            self._session.run_ended(status, code, reason)
            self._session.machine.close()

    # -- what it recorded --------------------------------------------------------
    @property
    def findings(self) -> list:
        """The rules' findings so far, as the session report has them (the
        steps the rules keep in a block judged first: nndb.rules.block)."""
        if self.status is None:
            self._session.flush_rules()
        return FindingList(self._session.log.findings)

    @property
    def steps_recorded(self) -> int:
        return self._rec.writer.steps_written if self._rec is not None else 0

    def open(self) -> Trace:
        """A Trace of the recording: while the block runs, a live view through
        the writer (every step so far); afterwards, the file."""
        if self._rec is not None and self.status is None:
            return Trace.of_writer(self._rec.writer)
        if self.status is None:
            raise UsageError("nndb.record: nothing was recorded yet (use it as 'with nndb.record(PATH) as rec:')")
        return Trace(self.path)

    @property
    def trace(self) -> Trace:
        """The finished trace (opened once, after the block)."""
        if self.status is None:
            raise UsageError("nndb.record: rec.trace is the finished trace; inside the block use rec.open()")
        if self._trace is None:
            self._trace = Trace(self.path)
        return self._trace


def record(path, **options) -> Recorder:
    """``with nndb.record("run.h5") as rec:`` around a training loop records
    it as ``nndb run --batch`` would (see Recorder for what is left out).

    Options: ``force`` (overwrite an existing nndb trace, never another file),
    ``rules`` ("default", a YAML rule file, or None for none), the recording
    schedule as ``nndb run``'s flags (``every``, ``steps="A:B"``,
    ``full_every``, ``act_every``), ``flush_every`` / ``flush_secs``,
    ``lineage`` (the steps whose operations to record, as ``--lineage``:
    "N", "A:B", "N,M", "all") and ``quiet=False`` to print the trace's path."""
    return Recorder(path, **options)
