"""Reading and running commands: the queue (rc files, ``-x``, ``-e``), the
front end's lines, one command line at a time through the command table.

A base of Session, as ``cmd.Cmd`` is of ``pdb.Pdb``: the loop is how a stop
of the session ends (a command's run-control request sets the session's
resume flag) and each line is dispatched with the session as its receiver;
the front end, the table and run control are the session's, the lines
waiting and the last one typed its ``input`` (CommandInput)."""
from __future__ import annotations

import collections
import shlex
from dataclasses import dataclass
from typing import Optional

from ..errors import CommandError, KillRun, RestartRun
from .modes import End


@dataclass
class QueuedLine:
    text: str
    source: Optional[str] = None   # file name (None: -e or typed)
    line: int = 0
    point: Optional[int] = None    # the breakpoint whose ``commands`` it is, at its stop

    def where(self) -> str:
        """How an error in it says where it came from: ``FILE:LINE: `` or ``-e 'CMD': ``."""
        return f"{self.source}:{self.line}: " if self.source else f"-e {shlex.quote(self.text)}: "


class CommandInput:
    """The session's command input besides the front end: the lines waiting
    (``queue``: rc files, ``-x``, ``-e``, [QueuedLine]), the last line typed
    (``last_command``: an empty line repeats it), where the line being run
    came from (``source``: its QueuedLine, or None when typed) and the error
    that ended a batch run's startup commands (``file_error``: exit 2).
    ``snapshot``/``restore``: the waiting lines and the last command, handed
    between the live run and a replica with the terminal (so the rest of a
    breakpoint's commands after an ``rs`` or ``goto`` among them runs in the past)."""

    def __init__(self):
        self.queue: collections.deque = collections.deque()
        self.last_command: Optional[str] = None
        self.source = None
        self.file_error: Optional[str] = None
        self.interrupted = False     # batch: Ctrl-C came while a stop's commands ran (Session.interrupt_at_stop)
        # (a 'goto' forward in the past resumed the replica: the rest of its breakpoint's commands
        # run where it stops, as they do after a 'goto' back)
        self.keep_point_commands = False

    def snapshot(self) -> dict:
        return {"queue": [[q.text, q.source, q.line, q.point] for q in self.queue], "last_command": self.last_command}

    def restore(self, state: dict) -> None:
        self.queue.clear()
        self.queue.extend(QueuedLine(*q) for q in state.get("queue", []))
        self.last_command = state.get("last_command")

    def end_point_commands(self) -> None:
        """A command that resumes the run ends its breakpoint's command list (gdb):
        the rest of it is dropped."""
        self.queue = collections.deque(q for q in self.queue if q.point is None)


class CommandLoop:
    def interact(self) -> None:
        """Read and run commands until one resumes the run."""
        self.control.resume = False
        if self.progress is not None:
            self.progress.clear()          # (a silent stop prints nothing that would: the prompt is drawn here)
        if self.fail_fast():
            self.control.end = End.KILL
            return
        while not self.control.resume:
            if self.input.interrupted:
                return                       # (batch: Ctrl-C; the stop ends the run: Session._stop_here)
            if self.input.queue:
                self.run_queued()
                continue
            if not self.interactive:
                if self.fail_fast():         # the queued commands ran at a fail hit: stop now
                    self.control.end = End.KILL
                elif self.in_the_past():
                    # batch: nothing queued in the past, back to the present (running the past on
                    # printed the script's output again, and took as long again: issue 39)
                    self.machine.hand_back(self, "present")
                elif self.live:
                    self.set_continue()      # batch: nothing queued, go on
                return                       # (the run is over: nothing to resume)
            line = self.frontend.read_line(self.prompt())
            if line is None:                   # Ctrl-D
                self.execute("quit")
                continue
            if not line.strip():
                if self.input.last_command is None:
                    continue
                line = self.input.last_command
            else:
                self.input.last_command = line if line.split()[0] not in ("run", "r") else None
            self.execute(line)

    def run_queued(self) -> None:
        """Run the first line waiting."""
        q = self.input.queue.popleft()
        self.input.keep_point_commands = False
        self.execute(q.text, q)
        if self.control.resume and not self.input.keep_point_commands:
            self.input.end_point_commands()
        self.input.keep_point_commands = False

    def fail_fast(self) -> bool:
        """Batch mode stops the run once a ``fail`` point hit and its commands ran."""
        return not self.interactive and bool(self.log.failed_points) and self.live and not self.input.queue

    def in_the_past(self) -> bool:
        """This process is a replica at a prompt in the past (goto, reverse-step...)."""
        return self.machine is not None and bool(self.machine.where(self))

    def prompt(self) -> str:
        where = self.machine.where(self) if self.machine is not None else ""
        return f"(nndb {where}) " if where else "(nndb) "

    # -- commands ------------------------------------------------------------------------
    def execute(self, text: str, source=None) -> None:
        """Run one command line; errors print one line (``FILE:LINE: message`` for files)."""
        self.input.source = source
        try:
            changing = self._changing(text)
            if changing and self.replica is not None and self.machine is not None:
                self.machine.note_change(self, text.strip())
            result = self.table.dispatch(self, text)
            if changing:
                self.note_change(text.strip())
            # a front end may show the data itself (a notebook: HTML tables, inline pictures)
            show = getattr(self.frontend, "show", None)
            if result is not None and not (show is not None and show(result)):
                out = self.renderer.render(result)
                if out:
                    self.message(out)
        except CommandError as e:
            # a command file's line, or in batch mode any startup line, says
            # where it came from and ends the run (exit 2); a breakpoint's command does not
            fatal = isinstance(source, QueuedLine) and source.point is None and \
                (bool(source.source) or not self.interactive)
            where = source.where() if fatal else ""
            msg = f"{where}{e}"
            if isinstance(source, QueuedLine) and source.point is not None and self._end_point_list(source.point):
                # gdb: "If an error occurs in a command, the rest of the list is not executed"
                # (the commands after a failed 'set' or 'goto' ran on a state they did not expect)
                msg += f" (the rest of breakpoint {source.point}'s commands is not run)"
            self.error(msg)
            if e.usage and not where:
                self.error(f"usage: {e.usage}")
            if fatal:
                self._file_error(source, msg)
        except (KillRun, RestartRun, KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:  # a bug in a command: one line, the session goes on
            self.error(f"nndb: internal error in '{text.strip()}': {type(e).__name__}: {e}")

    def _end_point_list(self, point: int) -> bool:
        """Drop the lines of point ``point``'s command list still waiting; True if there were any."""
        kept = collections.deque(q for q in self.input.queue if q.point != point)
        dropped = len(kept) != len(self.input.queue)
        self.input.queue = kept
        return dropped

    def _changing(self, text: str) -> bool:
        """A command that changes the run (the table's group "changing": set, unset, py)."""
        word = self.table.split(text.strip())[0].partition("/")[0] if text.strip() else ""
        try:
            cmd = self.table.lookup(word) if word else None
        except CommandError:
            return False
        return cmd is not None and cmd.group == "changing"

    def _file_error(self, source: QueuedLine, msg: str) -> None:
        # the rest of that file is dropped (gdb stops reading a file at its first error)
        self.input.queue = collections.deque(q for q in self.input.queue if q.source != source.source)
        if not self.interactive:
            if self.in_the_past():
                # the live run ends with it, as it would have outside the past (the replica
                # had been killed alone: exit 0, the rest of the commands dropped unsaid)
                self.machine.hand_back(self, "failed", message=msg)
            self.batch_failed(msg)

    def batch_failed(self, msg: str) -> None:
        """A startup command failed in batch mode: the run ends (exit 2, ``msg`` the reason)."""
        self.input.file_error = msg
        self.control.end = End.KILL if self.live else None
        self.control.resume = True

    def queue_lines(self, lines: list) -> None:
        self.input.queue.extend(lines)

    def reading_from_terminal(self) -> bool:
        return not isinstance(self.input.source, QueuedLine)

    def read_block(self) -> list:
        """The lines after ``commands`` up to ``end``: from the same command
        file (or -e list) when the command came from one, else from the front end."""
        lines = []
        from_queue = isinstance(self.input.source, QueuedLine) or not self.interactive
        # a file's block ends with that file (the next file's lines are not part of it)
        same = self.input.source.source if isinstance(self.input.source, QueuedLine) else False
        while True:
            if from_queue:
                if not self.input.queue or (same is not False and self.input.queue[0].source != same):
                    raise CommandError("'commands' without a closing 'end'")
                text = self.input.queue.popleft().text
            else:
                text = self.frontend.read_line(">")
                if text is None:
                    raise CommandError("'commands' without a closing 'end'")
            if text.strip() == "end":
                return lines
            if text.strip():
                lines.append(text.strip())

