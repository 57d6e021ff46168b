"""Record one run of a training script: the UI-free core behind ``nndb run``.

``record(config)`` checks the script, opens the trace, installs the tracer,
runs the script as Python would, and closes the trace however the script
ends.  It returns a RunResult; it never calls ``sys.exit`` and prints only
through ``message`` (nndb's own one-line messages, on stderr by default).
"""
from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Optional

from . import launcher, meta as runmeta
from . import rank as job
from .config import RunConfig, default_trace_path, shown
from .spawnwatch import SpawnWatch
from ..errors import EXIT_OK, EXIT_SCRIPT_ERROR, EXIT_SIGINT, EXIT_SIGTERM, KillRun, RestartRun, Terminated
from ..text import printable
from ..store.writer import TraceWriter
from ..tracer.hooks import Tracer
from ..tracer.fingerprint import Fingerprints
from ..tracer.naming import Naming
from ..tracer.pipeline import CallAtStepEnd, Pipeline, WriteRecords
from ..tracer.fulltensors import FullTensors
from ..tracer.recorder import StepRecorder


@dataclass
class RunResult:
    exit_code: int
    status: str          # finished | failed | interrupted | terminated
    reason: str
    trace_path: str
    steps_recorded: int
    last_step: Optional[int]


def stderr_line(msg: str) -> None:
    try:
        sys.stderr.write(printable(msg) + "\n")         # (one write: see debugger.frontend._say)
        sys.stderr.flush()
    except (ValueError, OSError, AttributeError):    # the script closed or dropped sys.stderr
        pass


def _show_exception(e: BaseException) -> bool:
    """Python's exception printer, whatever the script did to it (closed or
    dropped sys.stderr, an excepthook that raises): the run's end is
    recorded after it either way.  False if it could not be printed."""
    if sys.stderr is None:      # (Python's own printer says "lost sys.stderr" on fd 2 then)
        return False
    try:
        launcher.print_script_exception(e)
        sys.stderr.flush()
    except Exception:
        return False
    return True


def _python_exits_1_on_interrupt() -> bool:
    """Python ends a script that a KeyboardInterrupt ended by SIGINT (130 in a shell), but
    with status 1 once torch._dynamo is loaded (an optimizer's step() loads it: seen with
    torch 2.13 on Python 3.11).  nndb run's process ends as Python's would, and the trace
    and the report record the status it ends with (they said 130 where it exited 1)."""
    return "torch._dynamo.utils" in sys.modules


def _exit_code(e: SystemExit) -> int:
    try:
        return launcher.system_exit_code(e)      # (prints a message given to sys.exit)
    except Exception:           # (only the message's print can fail, and its code is 1)
        return 1


def _started_by_multiprocessing() -> bool:
    """This process is a child the script started with multiprocessing (its
    bootstrap names the parent), not the one nndb runs the script in, nor a
    replica forked from it."""
    mp = sys.modules.get("multiprocessing")
    return mp is not None and mp.parent_process() is not None


class _SignalGuard:
    """SIGTERM becomes a Terminated exception and SIGINT a KeyboardInterrupt,
    raised in the main thread, so the trace is closed on the way out; each
    only where the default disposition is in force, restored afterwards.

    Two things make a plain "raise in the handler" lose data or hang: the
    signal can arrive while nndb is recording a step (``busy()``), and a
    handler's exception can land where Python ignores it (a finaliser, a
    callback run from C).  So the handler never raises while nndb is busy
    (the signal is re-delivered just after), and after a SIGTERM a daemon
    thread re-delivers it every half second until the run has stopped
    (``stopped()``)."""

    def __init__(self, busy: Callable[[], bool], on_sigint: Optional[Callable[[], bool]] = None,
                 at_stop: Optional[Callable[[], bool]] = None):
        self._busy = busy
        self._on_sigint = on_sigint     # the debugger: True if it takes the Ctrl-C (stops the run)
        self._at_stop = at_stop         # batch mode: True if a stop's commands run and it takes the Ctrl-C
        self._old: dict = {}
        self._term_requested = False
        self._int_deferred = False
        self._stopped = threading.Event()

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig, default in ((signal.SIGTERM, signal.SIG_DFL), (signal.SIGINT, signal.default_int_handler)):
                if signal.getsignal(sig) in (default, None):
                    self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self._stopped.is_set():
            return
        if _started_by_multiprocessing():
            # A process the script started with multiprocessing (a DataLoader worker, a Pool's)
            # inherits this handler from the fork, and with it a copy of the session.  Ctrl-C
            # reaches the whole foreground process group: the live run stops, and its workers
            # must live on; in the copy a second Ctrl-C raised KeyboardInterrupt and ended the
            # worker (torch's worker loop returns on it), so a run stopped twice by Ctrl-C in
            # one epoch of persistent workers failed at 'continue' with "DataLoader worker
            # (pid(s) ...) exited unexpectedly".  The live run decides: a second Ctrl-C there
            # ends it, and torch ends its workers.  Without a prompt (batch mode) Ctrl-C is a
            # KeyboardInterrupt there as in the run, and SIGTERM is Python's default.
            if signum == signal.SIGTERM:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)
            elif self._on_sigint is None:
                raise KeyboardInterrupt
            return
        if signum == signal.SIGTERM:
            if not self._term_requested:
                self._term_requested = True
                threading.Thread(target=self._redeliver_term, name="nndb-sigterm", daemon=True).start()
            if self._busy():
                return                   # the thread re-delivers once nndb has finished the step
            raise Terminated()
        if self._on_sigint is not None and self._on_sigint():
            return
        if self._at_stop is not None and self._at_stop():
            return
        if self._busy():
            # Ctrl-C is delivered once, as Python does, but not in the middle
            # of a step nndb is recording: a script may catch it and go on.
            if not self._int_deferred:
                self._int_deferred = True
                threading.Thread(target=self._redeliver_int, name="nndb-sigint", daemon=True).start()
            return
        raise KeyboardInterrupt

    def _redeliver_term(self):
        while not self._stopped.wait(0.5):
            _thread.interrupt_main(signal.SIGTERM)

    def _redeliver_int(self):
        while self._busy() and not self._stopped.wait(0.005):
            pass
        self._int_deferred = False
        if not self._stopped.is_set():
            _thread.interrupt_main(signal.SIGINT)

    def stopped(self) -> None:
        self._stopped.set()

    def __exit__(self, *exc):
        self._stopped.set()
        for sig, old in self._old.items():
            signal.signal(sig, old)


class Recording:
    """The tracer, recorder and trace writer for one run, as a context manager:
    hooks are installed on entry and removed on exit.  ``close(status, code)``
    ends the trace.  ``nndb run`` and scripts/bench.py both record through it.

    ``listeners`` is the run's step pipeline (nndb.tracer.pipeline): the
    trace's listener first (``write_records``: records, modules, optimizers),
    the fingerprints, then what joins the run (``listeners.append``)."""

    def __init__(self, path: str, meta: dict, config: RunConfig,
                 message: Callable[[str], None] = stderr_line,
                 on_step_end: Optional[Callable[[int], None]] = None):
        self.path = path
        self.meta = meta
        self.target = config.target
        self.message = message
        self.writer = TraceWriter(path, meta, config.flush_steps, config.flush_secs, on_error=message,
                                  full_max_bytes=config.full_max_bytes)
        self.naming = Naming()
        # the trace's listener; its ``changes`` counts changes of the optimizers (the rules read it)
        self.write_records = WriteRecords(self.writer, self.naming)
        self.pipeline = Pipeline([self.write_records], on_error=message)
        self.listeners = self.pipeline.listeners
        if on_step_end is not None:
            self.listeners.append(CallAtStepEnd(on_step_end))
        self.recorder = StepRecorder(self.naming, self.pipeline.closed, config.schedule)
        self.recorder.on_note = message
        # Whole tensors (--record-full; the prompt's ``record full`` changes the rules)
        self.recorder.fulltensors = FullTensors(config.full_rules, self.writer.full_tensor, config.schedule,
                                                 self.writer.full.release)
        self.tracer = Tracer(self.recorder, self.naming, on_step_end=self.pipeline.step_ended,
                             on_error=self._tracer_failed, on_note=self._tracer_note)
        # What the rules read besides the statistics, kept in the trace for nndb check-trace.
        self.writer.shape_of = self.recorder.series_shape
        self.writer.local_shape_of = lambda name, kind: self.recorder.series_shape(name, kind, local=True)
        self.write_records.watch_optimizers(self.tracer.optimizers, self.tracer.optimizer_refs)
        # The checksums and timings ranks (and epochs) are compared by, before the rules read them.
        self.fingerprints = Fingerprints(self.naming, self.tracer.optimizers, self.writer.fingerprint,
                                         on_error=self._fingerprints_failed, ranks=meta.get("world_size") or 1,
                                         tracer=self.tracer)
        self.listeners.append(self.fingerprints)
        # torch.multiprocessing.spawn's processes, said when started (they are not traced)
        self.spawns = SpawnWatch(message)
        # The script's exception, once it has raised out of the run (an
        # Exception, or a sys.exit() of a failure status: DINO's sys.exit(1) on a
        # NaN loss; not a clean exit, Ctrl-C or the debugger's kill): the step's
        # forward passes are its own, and the step listeners judge the records
        # closed as it ended (nndb.debugger.listeners).
        self.raised: Optional[BaseException] = None

    def note(self, kind: str, message: str) -> None:
        """Record a warning in the trace's events (kind: schema.EVENT_KINDS),
        at the step in progress."""
        self.writer.event(kind, message, self.recorder.step)

    def _fingerprints_failed(self, msg: str) -> None:
        self.note("recording_stopped", msg)
        self.message(msg)

    def _tracer_note(self, kind: str, msg: str) -> None:
        self.note(kind, msg)
        self.message("nndb: note: " + msg)

    def _tracer_failed(self, msg: str) -> None:
        self.note("recording_stopped", msg)
        self.message(msg)

    def __enter__(self) -> "Recording":
        self.tracer.install()
        self.spawns.install()
        self.fingerprints.note_earlier_loaders()
        self.fingerprints.arm()
        return self

    def __exit__(self, *exc) -> None:
        if isinstance(exc[1], Exception) or isinstance(exc[1], SystemExit) and exc[1].code not in (None, 0):
            self.raised = exc[1]
        try:
            self.tracer.finish(raised=self.raised is not None)
        finally:
            self.tracer.uninstall()
            self.spawns.uninstall()
            self.fingerprints.close()
            self.pipeline.run_ended()
            self.fingerprints.finish()
        if self.tracer.unseen_backwards and self.tracer.clock.step == 0:
            self.message(f"nndb: no training step was recorded: {self.tracer.unseen_backwards} backward() "
                         f"call(s) reached no parameter of an nn.Module, nor any tensor that needs grad, and "
                         f"no optimizer stepped (docs/steps.md)")
        elif exc[1] is None and self.recorder.last is None and not self.tracer.optimizer_refs \
                and not self.spawns.spawned:      # (said when the script started its processes)
            # (mnist_hogwild: the model trained in processes of torch.multiprocessing's; a loop of
            # torch.func.grad's gradients applied to a dict of tensors by hand)
            self.message("nndb: no training step was recorded: the script called no backward() and stepped no "
                         "optimizer in this process (training in other processes, torch.multiprocessing's, "
                         "is not traced, nor are gradients taken only by torch.func.grad or "
                         "torch.autograd.grad and applied by hand; docs/steps.md)" + _launcher_hint(self.target))

    def close(self, status: str = "finished", exit_code: int = 0, reason: str = "") -> None:
        self.writer.close(status, exit_code, reason)


class _ExitNow:
    """The script's ``os._exit(N)`` while it runs: Python ends the process there, without
    unwinding, so nothing of nndb's closed the trace (a script of 100 steps that ended with
    ``os._exit(3)`` left a trace of 1 step, "incomplete", and no report).  Here the run ends
    as it would at the script's end (the open step closed, the rules' last judgements, the
    trace closed with status finished or failed, reason ``os._exit(N)``, ``at_exit_now``'s
    report), and then the process ends as the script asked, without unwinding it or
    flushing its output.  Another process (a DataLoader worker, a checkpoint nndb forked)
    and a call after the run are os._exit itself."""

    def __init__(self, rec: "Recording", path: str, session, at_exit_now):
        self.rec, self.path, self.session, self.at_exit_now = rec, path, session, at_exit_now
        self.pid = os.getpid()
        self.real = None

    def __enter__(self):
        self.real = os._exit
        os._exit = self._exit
        return self

    def __exit__(self, *exc) -> None:
        if os._exit == self._exit:
            os._exit = self.real

    def _exit(self, n):
        real = self.real
        if os.getpid() != self.pid or os._exit != self._exit:
            return real(n)
        os._exit = real                      # (once: a second call, from a hook of ours, is the real one)
        code = n
        try:
            code = int(n)
            status, reason = ("finished" if code == 0 else "failed"), f"os._exit({code})"
            rec, session = self.rec, self.session
            if code != 0:
                rec.raised = SystemExit(code)
            rec.__exit__(None, None, None)
            if session is not None:
                session.flush_rules()
            rec.close(status, code, reason)
            if session is not None:
                session.run_ended(status, code, reason)
            if self.at_exit_now is not None:
                code = self.at_exit_now(RunResult(code, status, reason, self.path, rec.writer.steps_written,
                                                  rec.writer.last_step))
        except BaseException:           # (the process ends as the script asked, whatever nndb could do)
            pass
        try:
            sys.stderr.flush()
        except Exception:
            pass
        real(code)


# Launchers that start the training script in processes of their own (`nndb run -m accelerate.commands.launch
# train.py` recorded nothing, and said only that other processes are not traced).
_LAUNCHERS = {"accelerate.commands.launch": "accelerate launch", "accelerate.commands.accelerate_cli": "accelerate",
              "torch.distributed.run": "torchrun", "torch.distributed.launch": "torch.distributed.launch",
              "deepspeed.launcher.runner": "deepspeed", "deepspeed": "deepspeed"}


def _launcher_hint(target) -> str:
    """What to run instead, where the target is a launcher whose processes run the script."""
    name = _LAUNCHERS.get(getattr(target, "module", None) or "")
    if name is None:
        return ""
    return (f"; {name} runs the script in processes of its own: run the script itself under nndb "
            f"('nndb run SCRIPT ARGS', one process), or its ranks with 'nndb run --nproc-per-node N SCRIPT ARGS' "
            f"(docs/distributed.md)")


def record(config: RunConfig, message: Callable[[str], None] = stderr_line,
           on_step_end: Optional[Callable[[int], None]] = None, session=None,
           listeners: Optional[Callable[["Recording"], list]] = None,
           at_exit_now: Optional[Callable[[RunResult], int]] = None) -> RunResult:
    """Run the script once.  With a debugger ``session`` (nndb.debugger), the
    session gets the tracer's stop points, Ctrl-C (if interactive) and the
    post-mortem of an uncaught exception; ``kill`` and ``run`` unwind the
    script with KillRun/RestartRun, which end the run with status "killed".
    ``listeners(rec)`` gives more step listeners (live exports): they join
    the pipeline after the trace's own and before the session's, so a stop
    at the prompt does not hold them up.  ``at_exit_now(result)``: the script
    called ``os._exit(N)``, the trace is closed, and the process ends with the
    code it returns (``_ExitNow``)."""
    prepared = launcher.prepare(config.target)           # bad script: fails here, before a trace exists
    meta = runmeta.collect(config.target, config.schedule.describe())
    meta["nndb_argv"] = list(config.nndb_argv)
    path = config.trace_path or default_trace_path(config.target, config.trace_dir or "nndb-runs")
    meta["job_id"] = job.job_id(os.path.dirname(path) if not config.trace_path else None) \
        if meta["world_size"] > 1 else None
    rec = Recording(path, meta, config, message, on_step_end)
    if listeners is not None:
        rec.listeners.extend(listeners(rec))
    if not config.quiet:
        message(f"nndb: recording to {shown(path)}")
    if session is not None:
        session.attach(rec, path)
    on_sigint = session.request_interrupt if session is not None and session.interactive else None
    at_stop = session.interrupt_at_stop if session is not None and not session.interactive else None

    status, code, reason = "finished", EXIT_OK, ""
    with _SignalGuard(busy=lambda: rec.tracer.busy > 0, on_sigint=on_sigint, at_stop=at_stop) as guard:
        try:
            # (not in a replica: its role ends it with os._exit, and a replica's run is not the run's)
            exit_now = _ExitNow(rec, path, session, at_exit_now) if getattr(session, "replica", None) is None \
                else contextlib.nullcontext()
            with rec, exit_now:
                launcher.run(prepared)
        except SystemExit as e:
            reason = f"sys.exit({e.code!r})"
            code = _exit_code(e)
            status = "finished" if code == 0 else "failed"
        except KeyboardInterrupt as e:
            guard.stopped()
            status, code, reason = "interrupted", EXIT_SIGINT, "KeyboardInterrupt"
            if not _show_exception(e) or (config.ends_as_python and _python_exits_1_on_interrupt()):
                code = EXIT_SCRIPT_ERROR    # (the status the process will end with, as Python's would)
        except Terminated:
            guard.stopped()
            status, code, reason = "terminated", EXIT_SIGTERM, "SIGTERM"
        except (KillRun, RestartRun) as e:
            status, code = "killed", (e.code if isinstance(e, KillRun) else EXIT_OK)
            reason = "restarted from the debugger" if isinstance(e, RestartRun) else e.reason
        except BaseException as e:  # the script raised: show it as Python would
            status, code = "failed", EXIT_SCRIPT_ERROR
            try:
                reason = f"{type(e).__name__}: {e}"
            except Exception:       # (a __str__ that raises)
                reason = type(e).__name__
            _show_exception(e)
            if session is not None:
                try:
                    session.post_mortem(e)    # the trace is still open: stats and history work
                except (Terminated, KeyboardInterrupt) as signalled:
                    # SIGTERM (torchrun ending a job's other ranks) or the front's abort at the
                    # post-mortem prompt ends the run as at any prompt (exit code 143, 130); it
                    # was nndb's own traceback, raised from the prompt under the script's
                    guard.stopped()
                    sigterm = isinstance(signalled, Terminated)
                    status, code = ("terminated", EXIT_SIGTERM) if sigterm else ("interrupted", EXIT_SIGINT)
                    reason += f" (then {'SIGTERM' if sigterm else 'KeyboardInterrupt'} at its post-mortem)"
        finally:
            guard.stopped()
            if session is not None:
                session.flush_rules()     # (the last steps' findings, before the trace closes)
            rec.close(status, code, reason)
            if session is not None:
                session.run_ended(status, code, reason)
    steps = rec.writer.steps_written
    if status == "terminated" and not config.quiet:
        # (a row after the last step end is no step: the report's steps leave it out too)
        w = rec.writer
        cut = steps and w.last_step is not None and w.last_step != w.last_whole_step
        said = f"{steps - 1} step(s) and the partial step {w.last_step}" if cut else f"{steps} step(s)"
        message(f"nndb: terminated (SIGTERM); trace closed with {said}: {path}")
    return RunResult(code, status, reason, path, steps, rec.writer.last_step)
