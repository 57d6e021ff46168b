"""The REPL front end: a prompt_toolkit session with persistent history,
completion from the command table and a bottom toolbar.  All it does is read
lines and print what the session gives it; the session does the rest."""
from __future__ import annotations

import datetime
import os
import sys
from typing import Optional

from prompt_toolkit import PromptSession
from prompt_toolkit.history import FileHistory, InMemoryHistory

from .completer import NndbCompleter
from .toolbar import toolbar_text


def default_history_path() -> str:
    return os.environ.get("NNDB_HISTFILE") or os.path.join(os.path.expanduser("~"), ".nndb_history")


def private_history(path: str) -> None:
    """The history holds ``py`` statements (maybe secrets): owner-only, 0600,
    like the report and the checkpoints; an existing looser file is tightened."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


class History(FileHistory):
    """The history file, written past the replica sandbox: it is nndb's own
    file, not the script's, and a command typed in the past is kept as one
    typed in the present (through ``open``, prompt_toolkit's write went to a
    replica's scratch copy, and failed once that was gone: issue 39).  The
    sandbox replaces ``open`` (and may replace ``os.open``) in a replica;
    this writes with the ``os.open`` of the process that made the prompt."""

    def __init__(self, filename: str) -> None:
        super().__init__(filename)
        # (made in the live run, before any replica: os.open as it is before a sandbox replaces it)
        self._os_open = os.open

    def store_string(self, string: str) -> None:
        lines = "".join(f"+{line}\n" for line in string.split("\n"))
        data = f"\n# {datetime.datetime.now()}\n{lines}".encode("utf-8")
        try:
            fd = self._os_open(self.filename, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, data)       # (one write: the lines of one entry stay together)
            finally:
                os.close(fd)
        except OSError:                  # (the file went: the line stays in this session's history)
            pass


class ReplFrontend:
    interactive = True

    def __init__(self, input=None, output=None, out=None, err=None, history_path: Optional[str] = "default"):
        self.session = None            # set by the debugger Session
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        if history_path == "default":
            history_path = default_history_path()
        self.own_files = (history_path,) if history_path else ()     # (nndb's, not the script's)
        history = InMemoryHistory()
        if history_path:
            try:
                private_history(history_path)
                history = History(history_path)
            except OSError:
                pass
        self._prompt = PromptSession(
            history=history,
            completer=NndbCompleter(lambda: self.session),
            complete_while_typing=False,
            bottom_toolbar=lambda: toolbar_text(self.session),
            input=input, output=output)

    def message(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def error(self, text: str) -> None:
        print(text, file=self.err, flush=True)

    def read_line(self, prompt: str) -> Optional[str]:
        while True:
            try:
                return self._prompt.prompt(prompt)
            except KeyboardInterrupt:
                self.message("Quit")         # gdb: Ctrl-C at the prompt drops the line
            except EOFError:
                return None

    def confirm(self, question: str) -> bool:
        while True:
            try:
                answer = self._prompt.prompt(question, bottom_toolbar=None)
            except EOFError:
                return True                    # gdb: end of input answers yes
            except KeyboardInterrupt:
                return False
            a = answer.strip().lower()
            if a in ("y", "yes"):
                return True
            if a in ("n", "no"):
                return False
            self.message("Please answer y or n.")
