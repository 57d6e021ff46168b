"""The UI-free debugger: stop points, run control, breakpoints (bdb's role).

The tracer calls ``on_step_end`` at every step boundary and, while something
may stop inside a step, ``on_module`` at every module forward (and backward,
through a hook on the module's output).  The session decides whether to stop;
a stop runs the hit points' ``commands`` and then reads commands from the
queue (rc and ``-x``/``-e`` files) and the front end, until one of them
resumes the run.  Everything is printed through the front end's ``message``
and ``error``; commands return data that ``render`` turns into text.

A front end supplies ``read_line(prompt) -> str | None`` (None: end of
input), ``confirm(question) -> bool``, ``message(text)``, ``error(text)``
and ``interactive``.  The REPL (nndb.repl) and batch mode
(nndb.debugger.frontend) are two such front ends; tests script a third.
"""
from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Optional

from ..errors import CommandError, KillRun, RestartRun
from . import evaluate as E
from . import points as P
from .queries import RunQueries
from .stoppoints import Stop, StopPoints


@dataclass
class QueuedLine:
    text: str
    source: Optional[str] = None   # file name (None: -e or typed)
    line: int = 0


class Session(StopPoints, RunQueries):
    def __init__(self, frontend, interactive: bool = True, stop_at_start: bool = True, rules=None):
        self.frontend = frontend
        self.rules = rules                   # nndb.rules.engine.RuleEngine, or None (--rules none)
        self.machine = None                  # nndb.timetravel.machine.TimeMachine (checkpoints, replicas)
        self.replica = None                  # in a replica process: its role (nndb.timetravel.roles)
        self.lineage = None                  # nndb.lineage.control.LineageControl (op recorder policy)
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
        self.failed_points: list = []        # points with the fail action that hit
        self.command_file_error: Optional[str] = None
        self.last_command: Optional[str] = None
        # the run
        self.rec = None                      # runner.Recording while a run is live
        self.live = False
        self.ended: Optional[str] = None     # how the last run ended (status), or None
        self.state = "none"                  # none | live | post-mortem | exited
        self.exit_reason = ""
        self.exit_code: Optional[int] = None
        self.runs = 0
        self.trace_path: Optional[str] = None
        # run control
        self.mode = "continue"               # continue | next | step | finish | until | detach
        self.count = 0
        self.until_step: Optional[int] = None
        self._pending_start = stop_at_start
        self._started = False
        self.interrupt_requested = False
        self.prompting = False               # at a stop: module calls and step ends made by
        #                                      the commands themselves (p model(x)) do not stop
        self.resume_requested = False
        self.kill_requested = False
        self.restart_requested = False
        self.quit_requested = False
        # where we are
        self.current: Optional[Stop] = None
        self.frames: list = []               # [(frame, lineno)], outermost first
        self.frame_index = 0
        self.last_step: Optional[int] = None  # the last step that finished
        self._record_seen = None
        self._view_cache = (None, None)
        self._module_names: dict = {}        # id(module) -> (roots_version, name)
        self._main_thread = threading.main_thread().ident
        self._hook_frame = None
        self._source = None
        self._payload = self._module = None
        self._list_next = None               # where 'list' goes on: ((file, frame index), line)
        from .commands import TABLE
        self.table = TABLE

    # -- output -----------------------------------------------------------------
    def message(self, text: str) -> None:
        self.frontend.message(text)

    def error(self, text: str) -> None:
        self.frontend.error(text)

    # -- the run's lifetime (called by the driver) --------------------------------
    def attach(self, rec, trace_path: str) -> None:
        self.rec = rec
        self.live = True
        self.state = "live"
        self.ended = None
        self.runs += 1
        self.trace_path = trace_path
        self.last_step = None
        self._record_seen = None
        self._pending_start = (self.stop_at_start or bool(self.queue)) and self.replica is None
        self._started = False
        self.mode, self.count, self.until_step = "continue", 0, None
        self.interrupt_requested = self.prompting = False
        self.kill_requested = self.restart_requested = False
        for p in self.points.values():
            p.hits = 0                        # gdb counts the hits of each run
            if isinstance(p, P.Watch):
                p.baseline.clear()
                p.streak.clear()
        rec.tracer.on_step_end = self.on_step_end
        self._rules_seen = None
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
        t.on_module = self.on_module if want_module else None
        t.want_backward = want_module and (self.mode == "step" or any(p.phase == "backward" for p in modules))
        # Someone at the prompt will look at every statistic; a watch may need
        # the ones measured only at full steps.
        needs_full = self.interactive or any(isinstance(p, P.Watch) and p.enabled and p.stat not in P.BASIC_STATS
                                             for p in self.points.values())
        needs_acts = any(isinstance(p, P.Watch) and p.enabled and p.kind == "act" for p in self.points.values())
        rec = self.rec.recorder
        rec.force_full, rec.force_acts = needs_full, needs_acts
        if needs_full:
            rec.full = True
        if needs_full or needs_acts:
            rec.acts = True
        if self.lineage is not None and not (self.replica is not None and self.replica.replaying):
            self.lineage.refresh(self._step_in_progress())     # (a catch point needs the op recorder)

    def request_interrupt(self) -> bool:
        """Ctrl-C while the script runs: stop at the next stop point.  A second
        Ctrl-C before that returns False: the caller interrupts the script."""
        if not self.live or self.interrupt_requested:
            return False
        self.interrupt_requested = True
        if self.mode == "detach":
            self.mode = "continue"
        self.sync_hooks()
        self.error("nndb: stopping at the next step boundary or module call (Ctrl-C again interrupts the script)")
        return True

    def run_ended(self, status: str, exit_code: int, reason: str) -> None:
        self.live = False
        self.ended = status
        self.exit_code = exit_code
        self.exit_reason = reason
        self.state = "exited"
        self.current = None
        self.frames = []
        self._hook_frame = self._payload = self._module = None   # keep none of the script's objects alive
        if self.rec is not None:
            self.rec.tracer.on_module = None
            self.rec.tracer.on_step_end = None
        if self.rules is not None:
            self.rules.detach()
        if self.lineage is not None:
            self.lineage.run_ended()
        if self.replica is not None:
            self.replica.run_ended(self, status, reason)      # (ends this replica process)

    def post_mortem(self, exc: BaseException) -> None:
        """The script raised: stop at the raising frame (pdb's post-mortem)."""
        self.live = False
        self.state = "post-mortem"
        # The step that raised: the one after the last that finished (the
        # recorder has already closed it as a partial step and counted past it).
        stop = Stop("exception", self.steps_done(), at_step_end=False, exception=exc)
        self.current = stop
        self.frames = E.stack_from_traceback(exc.__traceback__)
        self.frame_index = len(self.frames) - 1
        self._list_next = None
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
        if self.replica is not None and self.replica.intercept(self, stop):
            return                    # a scan or a prediction notes it and goes on
        if self.machine is not None and stop.at_step_end and stop.kind != "exited":
            stop = self.machine.at_stop(self, stop)
            if stop is None:          # a replica resumed from this stop's checkpoint runs on
                return
        self.prompting = True         # (the displays may call modules too)
        self.current = stop
        self.frames = [(f, f.f_lineno) for f in E.stack_from(frame)] if frame is not None else []
        self.frame_index = len(self.frames) - 1
        self._list_next = None        # 'list' starts again around the new line
        self.mode = "continue"
        self._record_stop(stop)
        from ..render import debug as render
        # the start stop is shown at a prompt (as pdb shows its first line), never in batch mode
        silent = (stop.kind == "start" and not self.interactive) or \
            (stop.hits and all(p.silent for p, _ in stop.hits))
        if not silent:
            self.message(render.stop_line(self, stop))
        for p, _ in stop.hits:
            if p.temporary:
                self.points.pop(p.number, None)
            if p.fail:
                self.failed_points.append(p.number if p.number is not None else p.rule.id)
        self._show_displays()
        tracer = self.rec.tracer if self.rec is not None else None
        busy = tracer.busy if tracer is not None else 0
        if tracer is not None:
            tracer.busy = 0           # signals may interrupt the prompt
        try:
            self.resume_requested = False     # (still set by the command that resumed the run)
            self._run_point_commands(stop)
            if not self.resume_requested:     # a 'continue' among the commands resumes at once
                self.interact()
            elif self.fail_fast():
                self.kill_requested = True
        finally:
            self.prompting = False
            if tracer is not None:
                tracer.busy = busy
            self.current = None if self.live else self.current
        self.sync_hooks()
        if self.kill_requested:
            raise KillRun()
        if self.restart_requested:
            raise RestartRun()

    def _record_stop(self, stop: Stop) -> None:
        if stop.kind in ("start", "step", "next", "finish", "until", "past"):
            return
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
                if self.resume_requested:
                    return
                self.execute(text, source=f"commands {p.number}")

    def _show_displays(self) -> None:
        for number, src, code in list(self.displays):
            try:
                value = E.evaluate(code, self.frame, self.variables(self.frame))
                self.message(f"{number}: {src} = {E.safe_repr(value)}")
            except CommandError as e:
                self.message(f"{number}: {src} = <error: {e}>")

    def interact(self) -> None:
        """Read and run commands until one resumes the run."""
        self.resume_requested = False
        if self.fail_fast():
            self.kill_requested = True
            return
        while not self.resume_requested:
            if self.queue:
                q = self.queue.popleft()
                self.execute(q.text, q)
                continue
            if not self.interactive:
                if self.fail_fast():         # the queued commands ran at a fail hit: stop now
                    self.kill_requested = True
                elif self.live:
                    self.resume("continue")  # batch: nothing queued, go on
                return                       # (the run is over: nothing to resume)
            line = self.frontend.read_line(self.prompt())
            if line is None:                   # Ctrl-D
                self.execute("quit")
                continue
            if not line.strip():
                if self.last_command is None:
                    continue
                line = self.last_command
            else:
                self.last_command = line if line.split()[0] not in ("run", "r") else None
            self.execute(line)

    def fail_fast(self) -> bool:
        """Batch mode stops the run once a ``fail`` point hit and its commands ran."""
        return not self.interactive and bool(self.failed_points) and self.live and not self.queue

    def prompt(self) -> str:
        where = self.machine.where(self) if self.machine is not None else ""
        return f"(nndb {where}) " if where else "(nndb) "

    def resume(self, mode: str, count: int = 0, until: Optional[int] = None) -> None:
        if self.state == "post-mortem" and mode == "continue":
            self.resume_requested = True       # leaves the post-mortem, as in pdb
            return
        if not self.live:
            raise CommandError("The program is not being run.")
        self.mode, self.count, self.until_step = mode, count, until
        self.resume_requested = True

    # -- commands ------------------------------------------------------------------------
    def execute(self, text: str, source=None) -> None:
        """Run one command line; errors print one line (``FILE:LINE: message`` for files)."""
        self._source = source
        try:
            if self.replica is not None and self.machine is not None:
                self._note_change(text)
            result = self.table.dispatch(self, text)
            if result is not None:
                from ..render import debug as render
                out = render.render(result)
                if out:
                    self.message(out)
        except CommandError as e:
            where = ""
            if isinstance(source, QueuedLine) and source.source:
                where = f"{source.source}:{source.line}: "
            msg = f"{where}{e}"
            self.error(msg)
            if e.usage and not where:
                self.error(f"usage: {e.usage}")
            if isinstance(source, QueuedLine) and source.source:
                self._file_error(source, msg)
        except (KillRun, RestartRun, KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:  # a bug in a command: one line, the session goes on
            self.error(f"nndb: internal error in '{text.strip()}': {type(e).__name__}: {e}")

    def _note_change(self, text: str) -> None:
        word = self.table.split(text.strip())[0].partition("/")[0] if text.strip() else ""
        try:
            cmd = self.table.lookup(word) if word else None
        except CommandError:
            return
        if cmd is not None and cmd.group == "changing":
            self.machine.note_change(self, text.strip())

    def _file_error(self, source: QueuedLine, msg: str) -> None:
        # the rest of that file is dropped (gdb stops reading a file at its first error)
        self.queue = collections.deque(q for q in self.queue if q.source != source.source)
        if not self.interactive:
            self.command_file_error = msg
            self.kill_requested = self.live
            self.resume_requested = True

    def queue_lines(self, lines: list) -> None:
        self.queue.extend(lines)

    def reading_from_terminal(self) -> bool:
        return not isinstance(self._source, QueuedLine)

    def read_block(self) -> list:
        """The lines after ``commands`` up to ``end``: from the same command
        file (or -e list) when the command came from one, else from the front end."""
        lines = []
        from_queue = isinstance(self._source, QueuedLine) or not self.interactive
        # a file's block ends with that file (the next file's lines are not part of it)
        same = self._source.source if isinstance(self._source, QueuedLine) else False
        while True:
            if from_queue:
                if not self.queue or (same is not False and self.queue[0].source != same):
                    raise CommandError("'commands' without a closing 'end'")
                text = self.queue.popleft().text
            else:
                text = self.frontend.read_line(">")
                if text is None:
                    raise CommandError("'commands' without a closing 'end'")
            if text.strip() == "end":
                return lines
            if text.strip():
                lines.append(text.strip())

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

    def point(self, number: int) -> P.Point:
        p = self.points.get(number)
        if p is None:
            raise CommandError(f"no breakpoint number {number}")
        return p
