"""Reading and running commands: the queue (rc files, ``-x``, ``-e``), the
front end's lines, one command line at a time through the command table.

A base of Session, as ``cmd.Cmd`` is of ``pdb.Pdb``: the loop is how a stop
of the session ends (a command's run-control request sets the session's
resume flag) and each line is dispatched with the session as its receiver;
the queue, the front end, the table and run control are the session's."""
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

    def where(self) -> str:
        """How an error in it says where it came from: ``FILE:LINE: `` or ``-e 'CMD': ``."""
        return f"{self.source}:{self.line}: " if self.source else f"-e {shlex.quote(self.text)}: "


class CommandLoop:
    def interact(self) -> None:
        """Read and run commands until one resumes the run."""
        self._resume = False
        if self.progress is not None:
            self.progress.clear()          # (a silent stop prints nothing that would: the prompt is drawn here)
        if self.fail_fast():
            self._end = End.KILL
            return
        while not self._resume:
            if self.queue:
                q = self.queue.popleft()
                self.execute(q.text, q)
                continue
            if not self.interactive:
                if self.fail_fast():         # the queued commands ran at a fail hit: stop now
                    self._end = End.KILL
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
                if self.last_command is None:
                    continue
                line = self.last_command
            else:
                self.last_command = line if line.split()[0] not in ("run", "r") else None
            self.execute(line)

    def fail_fast(self) -> bool:
        """Batch mode stops the run once a ``fail`` point hit and its commands ran."""
        return not self.interactive and bool(self.failed_points) and self.live and not self.queue

    def in_the_past(self) -> bool:
        """This process is a replica at a prompt in the past (goto, reverse-step...)."""
        return self.machine is not None and bool(self.machine.where(self))

    def prompt(self) -> str:
        where = self.machine.where(self) if self.machine is not None else ""
        return f"(nndb {where}) " if where else "(nndb) "

    # -- commands ------------------------------------------------------------------------
    def execute(self, text: str, source=None) -> None:
        """Run one command line; errors print one line (``FILE:LINE: message`` for files)."""
        self._source = source
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
            # where it came from and ends the run (exit 2)
            fatal = isinstance(source, QueuedLine) and (bool(source.source) or not self.interactive)
            where = source.where() if fatal else ""
            msg = f"{where}{e}"
            self.error(msg)
            if e.usage and not where:
                self.error(f"usage: {e.usage}")
            if fatal:
                self._file_error(source, msg)
        except (KillRun, RestartRun, KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:  # a bug in a command: one line, the session goes on
            self.error(f"nndb: internal error in '{text.strip()}': {type(e).__name__}: {e}")

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
        self.queue = collections.deque(q for q in self.queue if q.source != source.source)
        if not self.interactive:
            if self.in_the_past():
                # the live run ends with it, as it would have outside the past (the replica
                # had been killed alone: exit 0, the rest of the commands dropped unsaid)
                self.machine.hand_back(self, "failed", message=msg)
            self.batch_failed(msg)

    def batch_failed(self, msg: str) -> None:
        """A startup command failed in batch mode: the run ends (exit 2, ``msg`` the reason)."""
        self.command_file_error = msg
        self._end = End.KILL if self.live else None
        self._resume = True

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

