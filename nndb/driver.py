"""``nndb run`` under the debugger: the session, the runs (``run`` starts the
script again), the exit code and the report.  UI-free: the front end is given.

``build_session`` is the one place a debugger session is put together (the
engine, its command table and renderer, the rules, the time machine, the
lineage policy): ``nndb run``, a respawned replica and any other front end
all get theirs from it."""
from __future__ import annotations

import dataclasses
import gc
import os
from dataclasses import dataclass
from typing import Callable, Optional

from .run.config import RunConfig
from .errors import EXIT_FAIL_ACTION, EXIT_USAGE, UsageError
from .export.live import RunExports
from .lineage.control import LineageControl
from .render import debug as renderer
from .rules.base import failing_findings
from .rules.catalog import load as load_rules
from .run import leftover
from .run.runner import RunResult, stderr_line, record
from .timetravel.lineage_replay import replay_checked
from .timetravel.machine import TimeMachine, parse_size
from .timetravel.schedule import parse_every
from .commands import rcfiles
from .debugger.queries import RENAMED_WHY
from .render import report
from .debugger.modes import Mode
from .debugger.progress import ProgressLine
from .commands import TABLE
from .debugger.session import Session


@dataclass
class DebugOptions:
    batch: bool = False                 # no prompt: run the queued commands, continue at every stop
    stop_at_start: bool = True          # stop at the start of step 0 (not with --run)
    command_files: tuple = ()           # -x FILE
    eval_commands: tuple = ()           # -e CMD
    no_rc: bool = False                 # --nx
    report: Optional[str] = None        # --report FILE.json
    rules: Optional[str] = "default"    # --rules default|FILE.yaml|none
    replica: str = "auto"               # --replica auto|fork|respawn|off
    total_steps: Optional[int] = None   # --total-steps N (the checkpoint schedule)
    lineage: Optional[str] = None       # --lineage STEPS (N, A:B, N,M, all)
    checkpoint_every: Optional[str] = None    # --checkpoint-every N|Ns
    checkpoint_memory: Optional[str] = None   # --checkpoint-memory SIZE
    exports: tuple = ()                 # --export: nndb.export.targets.ExportTarget, streamed live
    replica_off_reason: Optional[str] = None    # why time travel is off, where not --replica off (a kernel)
    progress: bool = False              # the progress line on stderr (nndb run when stderr is a terminal)
    fail_on: Optional[str] = None       # --fail-on warning|error: a finding this severe or worse fails the run
    agreement: object = None            # several ranks in one prompt: nndb.distributed.allstop.StepAgreement
    companions: tuple = ()              # more of each run's listeners: objects with start(rec) -> [listener]
    #                                     and finish(status, trace_path) (a distributed worker's front link)
    own_commands: bool = False          # the queued commands are the caller's, not the user's (nndb fuzz):
    #                                     those left when the run ends are dropped, not run at its end


@dataclass
class DebugResult:
    exit_code: int
    reason: str
    run: Optional[RunResult]
    session: Session
    stranded: tuple = ()                # the script's threads alive as a run was ended at the prompt
    #                                     (quit, kill, run) or by SIGTERM: it stopped where it stood
    #                                     (nndb.run.leftover)


def next_trace_path(path: str, run: int) -> str:
    """The trace of the N-th run (``run`` restarts): never overwrites an earlier one."""
    base, ext = os.path.splitext(path)
    candidate, i = f"{base}-run{run}{ext or '.h5'}", run
    while os.path.exists(candidate):
        i += 1
        candidate = f"{base}-run{i}{ext or '.h5'}"
    return candidate


def _back_to(directory: str, message: Callable[[str], None]) -> None:
    try:
        if os.getcwd() != directory:
            os.chdir(directory)
    except OSError as e:
        message(f"nndb: cannot go back to {directory}: {e.strerror or e}")


def build_session(frontend, options: DebugOptions) -> Session:
    """A debugger session for ``frontend`` (anything with ``read_line``,
    ``confirm``, ``message``, ``error``).  A bad rule file fails here, before
    any script runs."""
    interactive = not options.batch
    try:
        if options.checkpoint_every:
            parse_every(options.checkpoint_every)
        memory = parse_size(options.checkpoint_memory) if options.checkpoint_memory else None
    except ValueError as e:
        raise UsageError(str(e)) from None
    lineage = LineageControl(options.lineage)
    lineage.replay = replay_checked          # (catch points armed at the step end locate the op by a replay)
    machine = TimeMachine(options.replica, options.total_steps, rules_spec=options.rules or "none",
                          lineage_spec=options.lineage, every=options.checkpoint_every, memory_kib=memory)
    if options.replica_off_reason:
        machine.off_reason = options.replica_off_reason
    return Session(frontend, TABLE, renderer, interactive=interactive,
                   stop_at_start=interactive and options.stop_at_start,
                   rules=load_rules(options.rules),
                   machine=machine,
                   lineage=lineage)


def debug(config: RunConfig, options: DebugOptions, frontend,
          message: Callable[[str], None] = stderr_line) -> DebugResult:
    interactive = not options.batch
    session = build_session(frontend, options)
    session.agreement = options.agreement
    if options.progress:
        session.progress = ProgressLine(session)
    lines = rcfiles.startup_lines(list(options.command_files), list(options.eval_commands),
                                  options.no_rc, message)
    bad = rcfiles.first_error(TABLE, lines) if options.batch else None
    if bad is not None:                 # a typo fails the run before the script starts
        message(bad)
        return _finish(config, options, session, None, EXIT_USAGE, bad)
    session.queue_lines(lines)
    exports = RunExports(options.exports, message, lambda: session.log.findings) if options.exports else None
    companions = ([exports] if exports else []) + list(options.companions)
    result: Optional[RunResult] = None
    first_path = config.trace_path
    start_cwd = os.getcwd()
    stranded: list = []
    while True:
        cfg = config
        if session.log.runs:
            _back_to(start_cwd, message)    # a new run starts where the first did, as python would
        if session.log.runs and first_path:
            cfg = dataclasses.replace(config, trace_path=next_trace_path(first_path, session.log.runs + 1))
        if session.log.runs:
            # The last run's objects (in reference cycles) go now: the tracer
            # counts the optimizers alive to choose how steps end.
            gc.collect()
        this_run = None
        try:
            this_run = record(cfg, message, session=session,
                              listeners=(lambda rec: [x for c in companions for x in c.start(rec)])
                              if companions else None,
                              at_exit_now=lambda result: _exit_now(config, options, session, result, message,
                                                                   companions))
        finally:
            if session.progress is not None:
                session.progress.clear()
            for c in companions:
                c.finish(this_run.status if this_run else "failed", this_run.trace_path if this_run else None)
        result = this_run
        if this_run.status in ("killed", "terminated"):
            stranded.extend(t for t in leftover.running() if t not in stranded)
        if first_path is None:
            first_path = result.trace_path
        if session.restart_requested:
            continue
        if session.quit_requested or session.input.file_error or result.status == "terminated":
            break                       # (SIGTERM ends the session, at a prompt too: exit 143)
        if interactive and session.control.mode is Mode.DETACH:
            # detached: nothing is left to debug, so nndb ends with the script
            session.message(f"nndb: the run ended ({result.status}, exit code {result.exit_code}) after "
                            f"{session.steps_done()} step(s), detached; trace: {result.trace_path}")
        elif interactive:
            session.exited()
            if session.restart_requested and not session.quit_requested:
                continue
        elif session.input.queue and not options.own_commands:
            # (said first, as gdb's '[Inferior 1 (process N) exited normally]': 'until 50' in a run of
            # 8 steps gave way to '-e "p $step"' printing 7, nothing saying the run had ended)
            session.message(f"nndb: the run ended ({result.status}, exit code {result.exit_code}) after "
                            f"{session.steps_done()} step(s); the commands left run at its end")
            session.interact()          # commands left when the script ended (or was killed)
            if session.restart_requested and not session.quit_requested:
                continue                # ('run' among them starts it again, as at the prompt)
        break

    return _conclude(config, options, session, result, message, tuple(stranded))


def _exit_now(config, options, session, result, message, companions) -> int:
    """The script called os._exit while it ran: the session ends there (no commands are
    left to run, no run again); the exit code nndb's process ends with."""
    for c in companions:
        c.finish(result.status, result.trace_path)
    return _conclude(config, options, session, result, message).exit_code


def _conclude(config, options, session, result, message, stranded=()) -> DebugResult:
    """The session is over (or the script called os._exit): the points left pending, the
    exit code and its reason, the report."""
    session.machine.close()
    pending = session.view.pending_points()
    renamed = {p.number: (p, missed) for p, missed in session.view.renamed_points()}
    for p in pending:
        what = "module" if p.type_name == "breakpoint" else f"{p.kind} tensor"
        _, missed = renamed.pop(p.number, (p, ()))
        message(f"nndb: {p.type_name} {p.number} ({p.what()}{' [fail]' if p.fail else ''}) was still pending "
                f"at the end of the run: no {what} matched '{p.glob}'" + _renamed_note(missed))
    for p, missed in renamed.values():
        message(f"nndb: watchpoint {p.number} ({p.what()}) never stopped, and did not look at "
                + _renamed_note(missed)[2:-1])
    if session.rules is not None:
        from .rules.yamlfile import unmatched_notes
        for note in unmatched_notes(session.rules.rules):
            message(f"nndb: {note}")
    for p, names, around in session.view.compiled_points():
        instead = "watch the compiled module's output" if p.type_name == "watchpoint" else "break on the compiled module"
        message(f"nndb: {p.type_name} {p.number} ({p.what()}) never stopped: {', '.join(names[:3])} "
                f"{'runs' if len(names) == 1 else 'run'} inside {around}, compiled by torch.compile, where "
                f"nndb's module hooks do not look ({instead}, or run the model uncompiled)")
    pending_fail = [p.number for p in pending if p.fail]
    if session.input.file_error:
        code, reason = EXIT_USAGE, session.input.file_error
    elif session.log.failed_points:
        nums = ", ".join(str(n) for n in dict.fromkeys(session.log.failed_points))
        code, reason = EXIT_FAIL_ACTION, f"a point with the fail action hit ({nums})"
    elif failing_findings(session.log.findings, options.fail_on):
        first = failing_findings(session.log.findings, options.fail_on)[0]
        code, reason = EXIT_FAIL_ACTION, (f"--fail-on {options.fail_on}: {first['severity']} {first['rule']} "
                                          f"at step {first['step']}")
        message(f"nndb: {reason} (exit code {code})")
    elif pending_fail:
        code, reason = EXIT_USAGE, f"a point with the fail action stayed pending ({', '.join(map(str, pending_fail))})"
    else:
        code, reason = result.exit_code, result.reason or result.status
    return _finish(config, options, session, result, code, reason, pending, stranded)


def _renamed_note(missed) -> str:
    """The tensors a watchpoint's glob left out that it names as the script does (``0.weight``),
    recorded under the parameter a parametrization or pruning keeps them in."""
    if not missed:
        return ""
    return (f" ({', '.join(missed[:4])}{' ...' if len(missed) > 4 else ''}: " + RENAMED_WHY + "; watch it by that name)")


def _finish(config, options, session, result, code: int, reason: str, pending=(), stranded=()) -> DebugResult:
    if options.report:
        t = config.target
        report.write(options.report, report.build(session, t.path or f"-m {t.module}", t.args, code, reason,
                                                  pending))
    return DebugResult(code, reason, result, session, stranded)
