"""Front ends that need no terminal: batch mode, and a scripted one for tests
and notebooks.  (The prompt_toolkit REPL is nndb.frontends.repl.)"""
from __future__ import annotations

import sys
from typing import Iterable, Optional


def _say(text: str, stream) -> None:
    try:
        # (one write with its newline: a line of another thread, a live
        # exporter's, never lands between the text and its end)
        stream.write(text + "\n")
        stream.flush()
    except (ValueError, OSError, AttributeError):   # the script closed or dropped it: nndb's line is lost
        pass


def prefixed(prefix: str, text: str) -> str:
    """Every line of ``text`` with ``prefix`` before it (a rank's ``[r1] ``)."""
    if not prefix:
        return text
    return "\n".join(prefix + line if line else prefix.rstrip() for line in text.split("\n"))


class BatchFrontend:
    """``--batch`` (or stdin not a terminal): no prompt, no terminal escapes.
    Output to stdout, errors to stderr; confirmations are answered yes.
    ``prefix``: before every line (a rank of a job in batch mode, ``[r1] ``:
    the ranks share one terminal, and their lines interleave)."""
    interactive = False
    own_files = ()          # the files the front end writes (ReplFrontend's history)

    def __init__(self, out=None, err=None, prefix: str = ""):
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.prefix = prefix

    def message(self, text: str) -> None:
        _say(prefixed(self.prefix, text), self.out)

    def error(self, text: str) -> None:
        _say(prefixed(self.prefix, text), self.err)

    def read_line(self, prompt: str) -> Optional[str]:
        return None

    def confirm(self, question: str) -> bool:
        return True


class ScriptedFrontend(BatchFrontend):
    """Reads typed lines from a list (a transcript test); records everything."""
    interactive = True

    def __init__(self, lines: Iterable[str], answers: Iterable[bool] = ()):
        super().__init__()
        self.lines = list(lines)
        self.answers = list(answers)
        self.output: list = []

    def message(self, text: str) -> None:
        self.output.append(text)

    def error(self, text: str) -> None:
        self.output.append(text)

    def read_line(self, prompt: str) -> Optional[str]:
        if not self.lines:
            return None
        line = self.lines.pop(0)
        self.output.append(prompt + line)
        return line

    def confirm(self, question: str) -> bool:
        ans = self.answers.pop(0) if self.answers else True
        self.output.append(question + ("y" if ans else "n"))
        return ans

    def snapshot(self) -> dict:
        """The unread input, handed to a replica that takes the terminal."""
        return {"lines": list(self.lines), "answers": list(self.answers)}

    def restore(self, state: dict) -> None:
        self.lines[:] = state.get("lines", [])
        self.answers[:] = state.get("answers", [])

    @property
    def text(self) -> str:
        return "\n".join(self.output)


_INPUT = input


def _pipe_fd() -> Optional[int]:
    """Standard input's descriptor when it is a pipe or a file (not a terminal)."""
    try:
        fd = sys.stdin.fileno()
        return None if sys.stdin.isatty() else fd
    except (AttributeError, ValueError, OSError):
        return None


def _read_unbuffered(fd: int, prompt: str) -> Optional[str]:
    """One line of piped input, read a byte at a time.  input() reads a pipe
    through a buffer: a replica forked at the prompt would inherit the lines
    the parent had read ahead, and the parent would run them again after the
    replica had (time travel in a ``set_trace`` process with commands piped
    in).  Read so, no process holds another's lines.  None at end of input."""
    import os
    try:
        sys.stdout.write(prompt)
        sys.stdout.flush()
    except (ValueError, OSError, AttributeError):
        pass
    line = bytearray()
    while True:
        try:
            b = os.read(fd, 1)
        except InterruptedError:
            continue
        if not b:
            return line.decode(errors="replace") if line else None
        if b == b"\n":
            return line.decode(errors="replace").rstrip("\r")
        line += b


class InputFrontend(BatchFrontend):
    """A prompt read with Python's ``input()``: ``nndb.set_trace()`` when
    stdin is not a terminal (lines piped in, as pdb reads them) and a
    notebook's input box (ipykernel answers ``input()`` through it).  End
    of input is None (the session quits, as at Ctrl-D)."""
    interactive = True

    def read_line(self, prompt: str) -> Optional[str]:
        import builtins
        if builtins.input is _INPUT:            # (a kernel's input() is its own: its input box)
            fd = _pipe_fd()
            if fd is not None:
                return _read_unbuffered(fd, prompt)
        try:
            return input(prompt)
        except EOFError:
            return None

    def confirm(self, question: str) -> bool:
        for _ in range(3):
            answer = self.read_line(question)
            if answer is None:
                return True                 # (end of input answers yes, as gdb's)
            if answer.strip().lower() in ("y", "yes"):
                return True
            if answer.strip().lower() in ("n", "no"):
                return False
            self.message("Please answer y or n.")
        return False
