"""The UI-free debugger: stop points, run control, breakpoints (bdb's role).

The run's step pipeline (nndb.tracer.pipeline) hands each step end to the
session's listeners (nndb.debugger.listeners: rules, checkpoints, lineage,
the stop check); while something may stop inside a step, the tracer calls
``on_module`` at every module forward (and backward, through a hook on the
module's output).  The session decides whether to stop;
a stop runs the hit points' ``commands`` and then reads commands from the
queue (rc and ``-x``/``-e`` files) and the front end, until one of them
resumes the run.  Everything is printed through the front end's ``message``
and ``error``; commands return data that ``render`` turns into text.

A front end supplies ``read_line(prompt) -> str | None`` (None: end of
input), ``confirm(question) -> bool``, ``message(text)``, ``error(text)``
and ``interactive``.  The REPL (nndb.frontends.repl) and batch mode
(nndb.frontends.batch) are two such front ends; tests script a third.
"""
from __future__ import annotations

import contextlib
import time
from typing import Optional

from ..errors import EXIT_FAIL_ACTION, EXIT_USAGE, CommandError, KillRun, RestartRun
from ..text import printable
from . import current
from . import evaluate as E
from . import points as P
from .changes import Change, edit_of, make
from .hyperparams import Holds
from .listeners import session_listeners
from .command_loop import CommandInput, CommandLoop, QueuedLine
from .control import RunControl
from .position import StopPosition
from .queries import RunView
from .modes import REQUESTED, End, Mode, State, StopKind
from .runlog import RunLog
from .stoppoints import Stop, StopPoints


class Session(CommandLoop, StopPoints):
    """``commands`` (a CommandTable: ``dispatch``, ``lookup``, ``split``) and
    ``renderer`` (``render(data)``, ``stop_line(session, stop)``) come from the
    floors above, passed in by ``nndb.driver.build_session``: the
    engine never imports the command table or a renderer.

    The session owns its points (``points``: breakpoints, watches, displays,
    nndb.debugger.points.Points), the queries commands make (``view``,
    nndb.debugger.queries.RunView), its run control (``control``: the mode
    and its targets, the requests, where the session stands and how the run
    ended, nndb.debugger.control.RunControl), where the run is stopped
    (``here``: the stop, its frames, nndb.debugger.position.StopPosition),
    what the report and the traces' events keep (``log``: runs, trace,
    stops, findings, changes, failed points, nndb.debugger.runlog.RunLog)
    and its command input besides the front end (``input``: the queued
    lines, the last command, nndb.debugger.command_loop.CommandInput).  Its
    two bases are parts of the same object, as ``cmd.Cmd`` is a base of
    ``pdb.Pdb`` and ``stop_here`` a method of ``bdb.Bdb``: CommandLoop is the
    prompt of a stop (it ends when a request sets this session's run control)
    and StopPoints decides the stops from this session's run control and
    points; owned apart, each would reach back into the session for nearly
    every member it reads.

    Its own attributes, besides those owned objects: what the floors above
    hand in (front end, table, renderer, rules, time machine, lineage,
    replica role, progress line, agreement, ``interactive``), the
    hyper-parameters held (``holds``), and what the run's step pipeline
    (nndb.debugger.listeners) reads and writes at every step end as plain
    attributes, where a property would be one more Python call a step
    (``rec``, ``live``, ``last_step``, ``latest_record``, ``step_record``,
    ``rule_hits``, ``prompting``, ``hold_checks``).
    """

    def __init__(self, frontend, commands, renderer, interactive: bool = True, stop_at_start: bool = True,
                 rules=None, machine=None, lineage=None):
        self.frontend = frontend
        self.table = commands
        self.renderer = renderer
        self.rules = rules                   # nndb.rules.engine.RuleEngine, or None (--rules none)
        self.machine = machine               # nndb.timetravel.machine.TimeMachine (checkpoints, replicas)
        self.replica = None                  # in a replica process: its role (nndb.timetravel.roles)
        self.lineage = lineage               # nndb.lineage.control.LineageControl (op recorder policy)
        self.progress = None                 # nndb.debugger.progress.ProgressLine (nndb run on a terminal)
        self.agreement = None                # several ranks: nndb.distributed.allstop.StepAgreement (all-stop)
        if hasattr(frontend, "session"):
            frontend.session = self        # completion and the toolbar look at the session
        self.interactive = interactive
        self.points = P.Points(on_change=self.sync_hooks)   # breakpoints, watches, displays
        self.view = RunView(self)            # what commands look at (the run's statistics, models, trace)
        self.control = RunControl(stop_at_start)   # run control; where the session stands
        self.here = StopPosition()           # where the run is stopped
        self.log = RunLog()                  # runs, trace, stops, findings, changes, failed points
        self.input = CommandInput()          # the queued lines, the last command
        self.holds = Holds()                 # hyper-parameters held at a value (set --hold)
        # the run, as its step pipeline sees it at each step end
        self.rec = None                      # runner.Recording while a run is live
        self.live = False
        self.last_step: Optional[int] = None  # the last step that finished
        self.latest_record = None            # the newest StepRecord handed on (what 'stats' shows)
        self.step_record = None              # the record of the step that just ended, as far as it is known
        self.rule_hits: list = []            # rule hits of the step end being checked
        self.prompting = False               # at a stop: module calls and step ends made by
        #                                      the commands themselves (p model(x)) do not stop
        self.hold_checks: list = []          # [hyperparams.HoldCheck]: did a set hold at the next step?

    # -- output -----------------------------------------------------------------
    # (everything the debugger prints passes here: names, messages and values
    # from the script or a trace reach the terminal with their control
    # characters shown, not obeyed)
    def message(self, text: str) -> None:
        if self.progress is not None:
            self.progress.clear()
        self.frontend.message(printable(text))

    def error(self, text: str) -> None:
        if self.progress is not None:
            self.progress.clear()
        self.frontend.error(printable(text))

    # -- the run's lifetime (called by the driver) --------------------------------
    def attach(self, rec, trace_path: str) -> None:
        self.rec = rec
        self.live = True
        self.log.runs += 1
        self.log.trace_path = trace_path
        self.last_step = None
        self.latest_record = self.step_record = None
        self.rule_hits = []
        if self.replica is None:
            self.log.changes, self.hold_checks = [], []
        else:               # (a respawned replica's run: the live run's handovers, StepClock.know)
            rec.tracer.clock.know(self.replica.goal.get("handovers"))
        control = self.control
        control.new_run((control.stop_at_start or bool(self.input.queue)) and self.replica is None)
        self.prompting = False
        self.points.new_run(replica=self.replica is not None)
        control.listeners = session_listeners(self)
        rec.listeners.extend(control.listeners)
        current.attached(self)               # (nndb.set_trace() stops here)
        if self.rules is not None:
            self.rules.attach(rec)
        self.view.note_earlier_optimizers()
        if self.machine is not None:
            self.machine.attach(self)
        if self.lineage is not None:
            self.lineage.attach(self)
        self.sync_hooks()

    def sync_hooks(self) -> None:
        """Install only the callbacks something may stop in (none, when detached
        with nothing left to check: the run then costs what plain recording costs)."""
        if self.rec is None or not self.live:
            return
        t = self.rec.tracer
        modules = [p for p in self.points.values() if isinstance(p, P.ModuleBreak) and p.enabled]
        c = self.control
        want_module = c.pending_start or c.mode is Mode.STEP or c.interrupt_requested or bool(modules)
        if c.mode is Mode.DETACH:
            want_module = False
        elif self.replica is not None and self.replica.replaying:
            # (a replay stops nowhere; a scan for reverse-continue notes where module breakpoints held)
            want_module = bool(modules) and self.replica.notes_module_hits
        # (the backward watched whenever the modules are: a forward that ran without it has no
        # backward stop, so 'step' from a forward stop, or a 'break module 0 backward' set there,
        # went past the backward of every module called before it in the step, to the next step's)
        t.stop_in_modules(self.on_module if want_module else None, backward=True)
        # Someone at the prompt will look at every statistic; a watch may need
        # the ones measured only at full steps (not a loss's: all ten are measured
        # at every step; `watch loss mean > 1000` measured every tensor's ten and
        # every activation at every step of a batch run).
        measures = getattr(self.replica, "measures", False)      # (a replica measuring a histogram)
        needs_full = self.interactive or measures or any(
            isinstance(p, P.Watch) and p.enabled and p.stat not in P.BASIC_STATS and p.kind != "loss"
            for p in self.points.values())
        needs_acts = measures or any(isinstance(p, P.Watch) and p.enabled and p.kind == "act"
                                     for p in self.points.values())
        self.rec.recorder.require(full=needs_full, acts=needs_acts)
        if self.lineage is not None and not (self.replica is not None and self.replica.replaying):
            self.lineage.refresh(self.step_in_progress())     # (a catch point needs the op recorder)

    def request_interrupt(self) -> bool:
        """Ctrl-C while the script runs: stop at the next stop point.  A second
        Ctrl-C before that returns False: the caller interrupts the script."""
        if not self.live or self.control.interrupt_requested:
            return False
        if self.replica is not None and self.replica.interruptible():
            self.replica.interrupted(self)     # (a replay or a prediction gives up: the user stays put)
            return True
        self.control.interrupt_requested = True
        if self.control.mode is Mode.DETACH:
            self.control.mode = Mode.CONTINUE
        self.sync_hooks()
        self.error("nndb: stopping at the next step boundary or module call (Ctrl-C again interrupts the script)")
        return True

    def interrupt_at_stop(self) -> bool:
        """Batch mode: Ctrl-C while a stop's commands run.  They are nndb's code, not
        the script's, so the KeyboardInterrupt is not raised where the signal lands (in
        the middle of a command: a ``goto`` reading the trace, whose h5py frames the
        script's traceback then showed, and the commands after it still ran): the
        command running ends, the rest are dropped, and the stop raises it into the
        script (``_stop_here``), which ends the run as Ctrl-C does (exit 130, the
        trace closed).  False when no stop's commands run: the script is interrupted."""
        if self.interactive or not self.live or not self.prompting or self.replica is not None:
            return False
        self.input.interrupted = True
        self.input.queue.clear()        # (now: a goto under way hands the rest to its replica)
        return True

    def run_ended(self, status: str, exit_code: int, reason: str) -> None:
        self.flush_rules()
        self.live = False
        current.ended(self)
        self.control.ended = status
        self.control.exit_code = exit_code
        self.control.state = State.EXITED
        self.here.clear()                # keep none of the script's objects alive
        if self.rec is not None:
            self.rec.tracer.stop_in_modules(None)
            self.rec.listeners[:] = [x for x in self.rec.listeners if x not in self.control.listeners]
        if self.rules is not None:
            self.rules.detach()
        if self.lineage is not None:
            self.lineage.run_ended()
        if self.replica is not None:
            self.replica.run_ended(self, status, reason)      # (ends this replica process)

    def closed_late(self, step: Optional[int]) -> Optional[str]:
        """Was ``step`` closed after the fact, inside the next step's first optimizer
        step (where the live run stops now, with that step's variables and gradients)?
        "handover": a later stage's optimizer took the steps over (StepClock.handovers;
        a replica goes to the step's own end); "repeat": an optimizer that stepped in it
        stepped again (StepClock.repeats; a replica goes to its own end too); "join": an
        optimizer that first stepped after its iteration's step had closed stepped again, its
        first step a step alone, "newcomer": the closer stepped again after that first step
        (StepClock.joins; a replica goes to its own end too); "learnt":
        step 0 of several optimizers, closed as the first stepped again (docs/steps.md);
        None: no."""
        clock = self.rec.tracer.clock if self.rec is not None else None
        if clock is None or step is None or clock.late != step:
            return None
        if step in clock.joins:
            return "join" if clock.joins[step] else "newcomer"
        return "repeat" if step in clock.repeats else "handover" if step in clock.handovers else "learnt"

    def post_mortem(self, exc: BaseException) -> None:
        """The script raised: stop at the raising frame (pdb's post-mortem)."""
        self.flush_rules()
        self.live = False
        self.control.state = State.POST_MORTEM
        # The step that raised: the one after the last that finished (the
        # recorder has already closed it as a partial step and counted past it).
        stop = Stop(StopKind.EXCEPTION, self.steps_done(), at_step_end=False, exception=exc)
        self.here.at_traceback(stop, exc.__traceback__)
        self._record_stop(stop)
        if self.replica is not None and not self.replica.prompts:
            return
        if self.interactive:
            self._prompt_after(f"nndb: post-mortem: the script raised {type(exc).__name__} during step "
                               f"{stop.step}; 'where', 'up', 'p', 'stats' work here")
        elif self.input.queue:        # batch: the commands left run here, at the raising frame
            try:
                self.interact()
            except (KillRun, RestartRun):
                pass

    def exited(self) -> None:
        """The run is over (interactive): stay at the prompt, as gdb does."""
        self.control.state = State.EXITED
        self.here.stop = Stop(StopKind.EXITED, self.last_step)
        self._prompt_after(f"nndb: the run ended ({self.control.ended}, exit code {self.control.exit_code}) after "
                           f"{self.steps_done()} step(s); trace: {self.log.trace_path}")

    def _prompt_after(self, text: str) -> None:
        self.message(text + ".  'run' starts it again, 'quit' ends.")
        self.prompting = True
        try:
            self.interact()
        except (KillRun, RestartRun):
            pass
        finally:
            self.prompting = False

    def steps_done(self) -> int:
        return 0 if self.last_step is None else self.last_step + 1

    # -- stopping ---------------------------------------------------------------------
    def _stop(self, stop: Stop, frame) -> None:
        self.flush_rules()            # (every step's findings are in before anything stops)
        if self.replica is not None and self.replica.intercept(self, stop):
            return                    # a scan or a prediction notes it and goes on
        if self.replica is None and stop.hits and not stop.at_step_end:
            self.count_in_step(stop.step)          # (a replica's role counted it: intercept)
        t0 = time.monotonic()
        try:
            self._stop_here(stop, frame)
        finally:
            if self.machine is not None:
                self.machine.paused(time.monotonic() - t0)     # (a stop is not the run's time)

    def count_in_step(self, step: int) -> None:
        """A place inside ``step`` where points held, stopped at or not (an ignore count swallowed
        the hit): its ordinal among the step's, as a reverse-continue's scan counts them, every
        hit as it held (``ordinal``; it was one short after an ignored hit earlier in the step, and
        rc from the stop went past that hit)."""
        if self.replica is not None:
            self.replica.count_in_step(self, step)
            return
        last, n = self.here.nth
        self.here.nth = (step, n + 1 if last == step else 0)

    def _stop_here(self, stop: Stop, frame) -> None:
        if self.machine is not None and stop.at_step_end and stop.kind is not StopKind.EXITED:
            stop = self.machine.at_stop(self, stop)
            if stop is None:          # a replica resumed from this stop's checkpoint runs on
                return
        self.prompting = True         # (the displays may call modules too)
        self.here.at(stop, frame)        # ('list' starts again around the new line)
        self.control.mode = Mode.CONTINUE
        self._record_stop(stop)
        # the start stop is shown at a prompt (as pdb shows its first line), never in batch mode
        quiet_hit = bool(stop.hits) and all(p.silent for p, _ in stop.hits)
        silent = (stop.kind is StopKind.START and not self.interactive) or quiet_hit
        if not silent:
            self.message(self.renderer.stop_line(self, stop))
        for p, _ in stop.hits:
            if p.temporary:
                self.points.pop(p.number, None)
            if p.fail:
                self.log.failed_points.append(p.number if p.number is not None else p.rule.id)
        if not quiet_hit:             # (gdb: a 'silent' breakpoint's stop shows no displays either)
            self.show_displays()
        tracer = self.rec.tracer if self.rec is not None else None
        try:
            with tracer.idle() if tracer is not None else contextlib.nullcontext():   # signals may interrupt the prompt
                self.control.resume = False   # (still set by the command that resumed the run)
                self._run_point_commands(stop)
                if not self.control.resume:   # a 'continue' among the commands resumes at once
                    self.interact()
                elif self.fail_fast():
                    self.control.end = End.KILL
            if self.input.interrupted:        # (batch: Ctrl-C while the commands ran)
                self.input.interrupted = False
                self.input.queue.clear()
                raise KeyboardInterrupt
        finally:
            self.prompting = False
            if self.live:
                self.here.stop = None
                self.here.let_go()
        self.sync_hooks()
        if self.control.kill_requested:
            if self.input.file_error:       # (batch mode: a startup command failed; the trace says so)
                raise KillRun(self.input.file_error, EXIT_USAGE)
            if self.fail_fast():
                nums = ", ".join(str(n) for n in dict.fromkeys(self.log.failed_points))
                raise KillRun(f"a point with the fail action hit ({nums})", EXIT_FAIL_ACTION)
            raise KillRun()
        if self.control.restart_requested:
            raise RestartRun()

    def keep_in_trace(self, kind: str, message: str, entry: dict) -> None:
        """A finding or a stop as the report has it, also in the trace's events
        (schema.RECORD_KINDS), so that nndb.open(TRACE).findings and .stops
        read them, of a killed run too (up to its last flush)."""
        w = self.rec.writer if self.rec is not None else None
        if w is not None:
            w.event(kind, message, entry.get("step"), entry)

    def note_change(self, line: str) -> None:
        """A command of the 'changing' group succeeded at a stop: on the live
        run it is part of the run's history (kept in the trace as an event of
        kind "change", made again by every replay of the steps after it)."""
        stop = self.here.stop
        if self.replica is not None or not self.live or stop is None or stop.kind is StopKind.EXITED:
            return
        place = "start" if stop.kind is StopKind.START else "end" if stop.at_step_end else "inside"
        change = Change(line, stop.step, place, edit_of(self.table, line))
        self.log.changes.append(change)
        self.keep_in_trace("change", line, change.as_dict())

    def remake(self, change: Change) -> Optional[str]:
        """In a replay: make a change of the live run again at this step end
        (the frame is the step end's, as at the stop it was made at).  None,
        or why it failed."""
        self.here.select_stack(self.here.stop_frame())
        was, self.prompting = self.prompting, True
        try:
            make(self, change.edit or edit_of(self.table, change.line))
        except (KillRun, RestartRun):
            raise
        except Exception as e:
            return f"{type(e).__name__}: {e}" if not isinstance(e, CommandError) else str(e)
        finally:
            self.prompting = was
        return None

    def ordinal(self) -> Optional[int]:
        """The ordinal of the stop inside a step the user is at, among that step's stops where
        points held (reverse-continue from it looks at the earlier ones first), or None."""
        stop = self.here.stop
        if self.replica is not None:
            return self.replica.ordinal(self)
        if stop is None or stop.at_step_end or not stop.hits or stop.step != self.here.nth[0]:
            return None
        return self.here.nth[1]

    def _record_stop(self, stop: Stop) -> None:
        if stop.kind in REQUESTED:
            return
        for entry in self.log.add_stop(stop):
            self.keep_in_trace("stop", entry["reason"], entry)

    def _run_point_commands(self, stop: Stop) -> None:
        """The hit points' commands, queued ahead of the lines waiting: one that
        takes the terminal to the past (rs, goto, rc) hands those after it to the
        replica, which runs them there (run here after it came back, they printed
        the present's values under the past's stop line)."""
        lines = [QueuedLine(text, point=p.number) for p, _ in stop.hits for text in p.commands]
        self.input.queue.extendleft(reversed(lines))
        while self.input.queue and self.input.queue[0].point is not None and not self.control.resume:
            self.run_queued()

    def show_displays(self) -> None:
        for number, src, code in list(self.points.displays):
            try:
                value = E.evaluate(code, self.frame, self.view.variables(self.frame))
                self.message(f"{number}: {src} = {E.safe_repr(value)}")
            except CommandError as e:
                self.message(f"{number}: {src} = <error: {e}>")

    # -- run control (bdb's set_* requests; the prompt loop ends after each) --------------
    # Each command of the "running" group makes one of these requests (pdb's
    # do_next -> set_next); they raise CommandError where no run is live.
    def set_continue(self) -> None:
        """Run to the next stop."""
        self._set_mode(Mode.CONTINUE)

    def set_next(self, count: int = 1) -> None:
        """Run ``count`` training steps, stopping at the end of the last one."""
        self._set_mode(Mode.NEXT, count=count)

    def set_step(self) -> None:
        """Run to the next module call (or the step's end)."""
        self._set_mode(Mode.STEP)

    def set_finish(self) -> None:
        """Run to the end of the step in progress."""
        self._set_mode(Mode.FINISH)

    def set_until(self, step: int) -> None:
        """Run until training step ``step`` has finished."""
        self._set_mode(Mode.UNTIL, until=step)

    def set_detach(self) -> None:
        """Let the run go on to its end with no more stops."""
        self._set_mode(Mode.DETACH)

    def _set_mode(self, mode: Mode, count: int = 0, until: Optional[int] = None) -> None:
        if self.control.state is State.POST_MORTEM:
            # gdb: going on from a fatal signal delivers it and the program ends; here the
            # exception goes on out of the script ('the run ended (failed, exit code 1) ...').
            # (Until 2026-12 'continue' did so and next, step, until, finish said the program
            # was not being run.)
            self.control.resume = True
            return
        if not self.live:
            raise CommandError(self.not_running())
        if self.replica is not None:
            self.replica.resuming(self)        # (in the past, at the present: back to the live run)
        self.control.request(mode, count, until)

    def not_running(self) -> str:
        """gdb's line where no run is live, with how the last one ended."""
        c = self.control
        if c.state is not State.EXITED or c.ended is None:
            return "The program is not being run."
        return (f"The program is not being run: it ended ({c.ended}, exit code {c.exit_code}) after "
                f"{self.steps_done()} step(s); 'run' starts it again.")

    def request_kill(self) -> None:
        """End the run (its trace is closed and kept); the session stays."""
        self.control.finish(End.KILL)

    def request_restart(self) -> None:
        """End the run and start the script again."""
        self.control.finish(End.RESTART)

    def request_quit(self) -> None:
        """End the run, if one is live, and the session."""
        self.control.finish(End.QUIT)

    def become_replica(self, role) -> None:
        """This process is now a replica (``role``: nndb.timetravel.roles); it
        starts from a plain continue."""
        self.replica = role
        self.reset_run_control()

    def reset_run_control(self) -> None:
        """Plain continue, nothing requested: a replica starting from a checkpoint."""
        self.control.reset()

    @property
    def kill_requested(self) -> bool:
        return self.control.kill_requested

    @property
    def restart_requested(self) -> bool:
        return self.control.restart_requested

    @property
    def quit_requested(self) -> bool:
        return self.control.quit_requested

    @property
    def resume_requested(self) -> bool:
        return self.control.resume

    # -- what a replica hands back -----------------------------------------------------
    # gdb does not roll breakpoints back: one set in the past is still set in
    # the present.  Plain JSON-able data, never pickled objects.
    def snapshot(self) -> dict:
        """The state that passes between the live run and a replica when the
        terminal changes hands: points, displays, queued commands, the rule
        settings, the timelines and the front end's unread input."""
        snap = getattr(self.frontend, "snapshot", None)
        return {
            **self.points.snapshot(),
            **self.input.snapshot(),
            "frontend": snap() if snap is not None else None,
            "rules": self.rules.settings() if self.rules is not None else None,
            "timelines": self.machine.timelines if self.machine is not None else [],
        }

    def restore(self, state: dict) -> None:
        self.points.restore(state)
        self.input.restore(state)
        restore = getattr(self.frontend, "restore", None)
        if state.get("frontend") is not None and restore is not None:
            restore(state["frontend"])
        if state.get("rules") is not None and self.rules is not None:
            self.rules.restore_settings(state["rules"])
        if self.machine is not None and state.get("timelines"):
            self.machine.timelines = state["timelines"]
        self.sync_hooks()

    # -- where the stop is (pdb's curframe) --------------------------------------------------
    @property
    def frame(self):
        """The frame 'up' and 'down' selected at the current stop, or None."""
        return self.here.frame

    @property
    def record(self):
        """The last recorded step (StepRecord), or None."""
        return self.latest_record

    def stop_frame(self):
        """The script's frame at the current stop point (for expressions)."""
        return self.here.stop_frame()
