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

import collections
import contextlib
import threading
import time
from typing import Optional

from ..errors import CommandError, KillRun, RestartRun
from ..text import printable
from . import current
from . import evaluate as E
from . import points as P
from .changes import Change, edit_of, make
from .hyperparams import Holds
from .listeners import session_listeners
from .command_loop import CommandLoop, QueuedLine  # noqa: F401  (QueuedLine: part of the API)
from .queries import RunQueries
from .stoppoints import Stop, StopPoints


class Session(CommandLoop, StopPoints, RunQueries):
    """``commands`` (a CommandTable: ``dispatch``, ``lookup``, ``split``) and
    ``renderer`` (``render(data)``, ``stop_line(session, stop)``) come from the
    floors above, passed in by ``nndb.driver.build_session``: the
    engine never imports the command table or a renderer."""

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
        self.stop_at_start = stop_at_start
        self.points: dict = {}               # number -> Point
        self._next_number = 1
        self.displays: list = []             # [(number, expr source, code)]
        self._next_display = 1
        self.queue: collections.deque = collections.deque()
        self.stops: list = []                # for the report
        self.findings: list = []             # rule findings (the rules issue fills these)
        self.changes: list = []              # [changes.Change]: what the live run's prompt changed (replays remake them)
        self.holds = Holds()                 # hyper-parameters held at a value (set --hold)
        self.hold_checks: list = []          # [hyperparams.HoldCheck]: did a set hold at the next step?
        self.failed_points: list = []        # points with the fail action that hit
        self.command_file_error: Optional[str] = None
        self.last_command: Optional[str] = None
        # the run
        self.rec = None                      # runner.Recording while a run is live
        self.live = False
        self.ended: Optional[str] = None     # how the last run ended (status), or None
        self.state = "none"                  # none | live | post-mortem | exited
        self.exit_code: Optional[int] = None
        self.runs = 0
        self.trace_path: Optional[str] = None
        # run control
        self.mode = "continue"               # continue | next | step | finish | until | detach
        self.count = 0
        self.until_step: Optional[int] = None
        self._pending_start = stop_at_start
        self.interrupt_requested = False
        self.prompting = False               # at a stop: module calls and step ends made by
        #                                      the commands themselves (p model(x)) do not stop
        self._resume = False                 # the prompt loop ends: a command resumed the run
        self._end: Optional[str] = None      # what happens to the run: None | kill | restart | quit
        # where we are
        self.current: Optional[Stop] = None
        self.frames: list = []               # [(frame, lineno)], outermost first
        self.frame_index = 0
        self.last_step: Optional[int] = None  # the last step that finished
        self.latest_record = None            # the newest StepRecord handed on (what 'stats' shows)
        self.step_record = None              # the record of the step that just ended, as far as it is known
        self.rule_hits: list = []            # rule hits of the step end being checked
        self._listeners: list = []           # this session's part of the run's step pipeline
        self._view_cache = (None, None)
        self._rule_optimizers = None         # (stoppoints._NamedOptimizers of the run, made once)
        self._at_exception = False           # (the rules judge the records closed as the script raised)
        self._module_names: dict = {}        # id(module) -> (roots_version, name)
        self._main_thread = threading.main_thread().ident
        self._hook_frame = None
        self._source = None
        self.stop_payload = self.stop_module = None
        self.list_position = None               # where 'list' goes on: ((file, frame index), line)

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
        self.state = "live"
        self.ended = None
        self.runs += 1
        self.trace_path = trace_path
        self.last_step = None
        self.latest_record = self.step_record = None
        self.rule_hits = []
        if self.replica is None:
            self.changes, self.hold_checks = [], []
        self._pending_start = (self.stop_at_start or bool(self.queue)) and self.replica is None
        self.mode, self.count, self.until_step = "continue", 0, None
        self.interrupt_requested = self.prompting = False
        if self._end != "quit":
            self._end = None
        for p in self.points.values():
            p.hits = 0                        # gdb counts the hits of each run
            if isinstance(p, P.Watch):
                p.reset()
        self._listeners = session_listeners(self)
        rec.listeners.extend(self._listeners)
        current.attached(self)               # (nndb.set_trace() stops here)
        if self.rules is not None:
            self.rules.attach(rec)
        self.note_earlier_optimizers()
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
        want_module = self._pending_start or self.mode == "step" or self.interrupt_requested or bool(modules)
        if self.mode == "detach" or (self.replica is not None and self.replica.replaying):
            want_module = False
        t.stop_in_modules(self.on_module if want_module else None,
                          backward=self.mode == "step" or any(p.phase == "backward" for p in modules))
        # Someone at the prompt will look at every statistic; a watch may need
        # the ones measured only at full steps.
        measures = getattr(self.replica, "measures", False)      # (a replica measuring a histogram)
        needs_full = self.interactive or measures or any(isinstance(p, P.Watch) and p.enabled and p.stat not in P.BASIC_STATS
                                             for p in self.points.values())
        needs_acts = measures or any(isinstance(p, P.Watch) and p.enabled and p.kind == "act"
                                     for p in self.points.values())
        self.rec.recorder.require(full=needs_full, acts=needs_acts)
        if self.lineage is not None and not (self.replica is not None and self.replica.replaying):
            self.lineage.refresh(self.step_in_progress())     # (a catch point needs the op recorder)

    def request_interrupt(self) -> bool:
        """Ctrl-C while the script runs: stop at the next stop point.  A second
        Ctrl-C before that returns False: the caller interrupts the script."""
        if not self.live or self.interrupt_requested:
            return False
        if self.replica is not None and self.replica.interruptible():
            self.replica.interrupted(self)     # (a replay or a prediction gives up: the user stays put)
            return True
        self.interrupt_requested = True
        if self.mode == "detach":
            self.mode = "continue"
        self.sync_hooks()
        self.error("nndb: stopping at the next step boundary or module call (Ctrl-C again interrupts the script)")
        return True

    def run_ended(self, status: str, exit_code: int, reason: str) -> None:
        self.flush_rules()
        self.live = False
        current.ended(self)
        self.ended = status
        self.exit_code = exit_code
        self.state = "exited"
        self.current = None
        self.frames = []
        self._hook_frame = self.stop_payload = self.stop_module = None   # keep none of the script's objects alive
        if self.rec is not None:
            self.rec.tracer.stop_in_modules(None)
            self.rec.listeners[:] = [x for x in self.rec.listeners if x not in self._listeners]
        if self.rules is not None:
            self.rules.detach()
        if self.lineage is not None:
            self.lineage.run_ended()
        if self.replica is not None:
            self.replica.run_ended(self, status, reason)      # (ends this replica process)

    def post_mortem(self, exc: BaseException) -> None:
        """The script raised: stop at the raising frame (pdb's post-mortem)."""
        self.flush_rules()
        self.live = False
        self.state = "post-mortem"
        # The step that raised: the one after the last that finished (the
        # recorder has already closed it as a partial step and counted past it).
        stop = Stop("exception", self.steps_done(), at_step_end=False, exception=exc)
        self.current = stop
        self.frames = E.stack_from_traceback(exc.__traceback__)
        self.frame_index = len(self.frames) - 1
        self.list_position = None
        self._record_stop(stop)
        if self.replica is not None and not self.replica.prompts:
            return
        if self.interactive:
            self._prompt_after(f"nndb: post-mortem: the script raised {type(exc).__name__} during step "
                               f"{stop.step}; 'where', 'up', 'p', 'stats' work here")
        elif self.queue:              # batch: the commands left run here, at the raising frame
            try:
                self.interact()
            except (KillRun, RestartRun):
                pass

    def exited(self) -> None:
        """The run is over (interactive): stay at the prompt, as gdb does."""
        self.state = "exited"
        self.current = Stop("exited", self.last_step)
        self._prompt_after(f"nndb: the run ended ({self.ended}, exit code {self.exit_code}) after "
                           f"{self.steps_done()} step(s); trace: {self.trace_path}")

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
        t0 = time.monotonic()
        try:
            self._stop_here(stop, frame)
        finally:
            if self.machine is not None:
                self.machine.paused(time.monotonic() - t0)     # (a stop is not the run's time)

    def _stop_here(self, stop: Stop, frame) -> None:
        if self.machine is not None and stop.at_step_end and stop.kind != "exited":
            stop = self.machine.at_stop(self, stop)
            if stop is None:          # a replica resumed from this stop's checkpoint runs on
                return
        self.prompting = True         # (the displays may call modules too)
        self.current = stop
        self.frames = [(f, f.f_lineno) for f in E.stack_from(frame)] if frame is not None else []
        self.frame_index = len(self.frames) - 1
        self.list_position = None        # 'list' starts again around the new line
        self.mode = "continue"
        self._record_stop(stop)
        # the start stop is shown at a prompt (as pdb shows its first line), never in batch mode
        silent = (stop.kind == "start" and not self.interactive) or \
            (stop.hits and all(p.silent for p, _ in stop.hits))
        if not silent:
            self.message(self.renderer.stop_line(self, stop))
        for p, _ in stop.hits:
            if p.temporary:
                self.points.pop(p.number, None)
            if p.fail:
                self.failed_points.append(p.number if p.number is not None else p.rule.id)
        self.show_displays()
        tracer = self.rec.tracer if self.rec is not None else None
        try:
            with tracer.idle() if tracer is not None else contextlib.nullcontext():   # signals may interrupt the prompt
                self._resume = False          # (still set by the command that resumed the run)
                self._run_point_commands(stop)
                if not self._resume:          # a 'continue' among the commands resumes at once
                    self.interact()
                elif self.fail_fast():
                    self._end = "kill"
        finally:
            self.prompting = False
            self.current = None if self.live else self.current
        self.sync_hooks()
        if self._end in ("kill", "quit"):
            raise KillRun()
        if self._end == "restart":
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
        stop = self.current
        if self.replica is not None or not self.live or stop is None or stop.kind == "exited":
            return
        place = "start" if stop.kind == "start" else "end" if stop.at_step_end else "inside"
        change = Change(line, stop.step, place, edit_of(self.table, line))
        self.changes.append(change)
        self.keep_in_trace("change", line, change.as_dict())

    def remake(self, change: Change) -> Optional[str]:
        """In a replay: make a change of the live run again at this step end
        (the frame is the step end's, as at the stop it was made at).  None,
        or why it failed."""
        frame = E.stop_frame(self._hook_frame)
        self.frames = [(f, f.f_lineno) for f in E.stack_from(frame)] if frame is not None else []
        self.frame_index = len(self.frames) - 1
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

    def _record_stop(self, stop: Stop) -> None:
        if stop.kind in ("start", "step", "next", "finish", "until", "past"):
            return
        first = len(self.stops)
        self._add_stops(stop)
        for entry in self.stops[first:]:
            self.keep_in_trace("stop", entry["reason"], entry)

    def _add_stops(self, stop: Stop) -> None:
        if stop.hits:
            for p, detail in stop.hits:
                pid = p.number if p.number is not None else p.rule.id     # a rule: its id
                self.stops.append({"step": stop.step, "reason": p.type_name, "id": pid,
                                   "detail": dict(detail, what=p.what(), fail=p.fail)})
        else:
            detail = {}
            if stop.exception is not None:
                detail = {"exception": type(stop.exception).__name__, "message": str(stop.exception)}
            if stop.module:
                detail["module"] = stop.module
            self.stops.append({"step": stop.step, "reason": stop.kind, "id": None, "detail": detail})

    def _run_point_commands(self, stop: Stop) -> None:
        for p, _ in stop.hits:
            for text in p.commands:
                if self._resume:
                    return
                self.execute(text, source=f"commands {p.number}")

    def show_displays(self) -> None:
        for number, src, code in list(self.displays):
            try:
                value = E.evaluate(code, self.frame, self.variables(self.frame))
                self.message(f"{number}: {src} = {E.safe_repr(value)}")
            except CommandError as e:
                self.message(f"{number}: {src} = <error: {e}>")

    # -- run control (bdb's set_* requests; the prompt loop ends after each) --------------
    def resume(self, mode: str, count: int = 0, until: Optional[int] = None) -> None:
        """Resume the run: ``mode`` is continue | next (``count`` steps) | step |
        finish | until (``until``: a step) | detach."""
        if self.state == "post-mortem" and mode == "continue":
            self._resume = True                # leaves the post-mortem, as in pdb
            return
        if not self.live:
            raise CommandError("The program is not being run.")
        self.mode, self.count, self.until_step = mode, count, until
        self._resume = True

    def set_continue(self) -> None:
        self.resume("continue")

    def set_next(self, count: int = 1) -> None:
        self.resume("next", count)

    def set_step(self) -> None:
        self.resume("step")

    def set_finish(self) -> None:
        self.resume("finish")

    def set_until(self, step: int) -> None:
        self.resume("until", until=step)

    def set_detach(self) -> None:
        self.resume("detach")

    def request_kill(self) -> None:
        """End the run (its trace is closed and kept); the session stays."""
        self._end, self._resume = "kill", True

    def request_restart(self) -> None:
        """End the run and start the script again."""
        self._end, self._resume = "restart", True

    def request_quit(self) -> None:
        """End the run, if one is live, and the session."""
        self._end, self._resume = "quit", True

    def become_replica(self, role) -> None:
        """This process is now a replica (``role``: nndb.timetravel.roles); it
        starts from a plain continue."""
        self.replica = role
        self.reset_run_control()

    def reset_run_control(self) -> None:
        """Plain continue, nothing requested: a replica starting from a checkpoint."""
        self.mode, self.count, self.until_step = "continue", 0, None
        self._pending_start = self.interrupt_requested = self._resume = False
        self._end = None

    @property
    def kill_requested(self) -> bool:
        return self._end in ("kill", "quit")

    @property
    def restart_requested(self) -> bool:
        return self._end == "restart"

    @property
    def quit_requested(self) -> bool:
        return self._end == "quit"

    @property
    def resume_requested(self) -> bool:
        return self._resume

    # -- points ---------------------------------------------------------------------------
    def add_point(self, cls, fields: dict, condition: Optional[str] = None, temporary: bool = False,
                  fail: bool = False) -> P.Point:
        if condition is not None:
            E.compile_expr(condition)
        p = cls(number=self._next_number, temporary=temporary, condition=condition, fail=fail, **fields)
        self._next_number += 1
        self.points[p.number] = p
        self.sync_hooks()
        return p

    def new_display(self, src: str, code) -> int:
        number = self._next_display
        self._next_display += 1
        self.displays.append((number, src, code))
        return number

    def catch_points(self) -> list:
        """The enabled catch points (the lineage recorder runs for them)."""
        return [p for p in self.points.values() if isinstance(p, P.CatchPoint) and p.enabled]

    def point(self, number: int) -> P.Point:
        p = self.points.get(number)
        if p is None:
            raise CommandError(f"no breakpoint number {number}")
        return p

    # -- what a replica hands back -----------------------------------------------------
    # gdb does not roll breakpoints back: one set in the past is still set in
    # the present.  Plain JSON-able data, never pickled objects.
    def snapshot(self) -> dict:
        """The state that passes between the live run and a replica when the
        terminal changes hands: points, displays, queued commands, the rule
        settings, the timelines and the front end's unread input."""
        snap = getattr(self.frontend, "snapshot", None)
        return {
            "points": [P.point_to_dict(p) for p in self.points.values() if P.is_portable(p)],
            "next_number": self._next_number,
            "displays": [[n, src] for n, src, _ in self.displays],
            "next_display": self._next_display,
            "queue": [[q.text, q.source, q.line] for q in self.queue],
            "last_command": self.last_command,
            "frontend": snap() if snap is not None else None,
            "rules": self.rules.settings() if self.rules is not None else None,
            "timelines": self.machine.timelines if self.machine is not None else [],
        }

    def restore(self, state: dict) -> None:
        mine = self.points
        self.points = {p.number: p for p in map(P.point_from_dict, state.get("points", [])) if p is not None}
        for n, p in self.points.items():
            if isinstance(p, P.Watch):
                # a watch's streaks and baselines belong to this process's own
                # steps (a replica replays the past): keep ours, or start afresh
                old = mine.get(n)
                if isinstance(old, P.Watch) and old.what() == p.what():
                    p.band, p.streak = old.band, old.streak
                else:
                    p.streak.clear()
        self._next_number = max(self._next_number, int(state.get("next_number", 1)))
        self.displays = []
        for n, src in state.get("displays", []):
            try:
                self.displays.append((n, src, E.compile_expr(src)))
            except CommandError:
                pass
        self._next_display = max(self._next_display, int(state.get("next_display", 1)))
        self.queue.clear()
        self.queue.extend(QueuedLine(t, src, line) for t, src, line in state.get("queue", []))
        self.last_command = state.get("last_command")
        restore = getattr(self.frontend, "restore", None)
        if state.get("frontend") is not None and restore is not None:
            restore(state["frontend"])
        if state.get("rules") is not None and self.rules is not None:
            self.rules.restore_settings(state["rules"])
        if self.machine is not None and state.get("timelines"):
            self.machine.timelines = state["timelines"]
        self.sync_hooks()

    def stop_frame(self):
        """The script's frame at the current stop point (for expressions)."""
        return E.stop_frame(self._hook_frame)
