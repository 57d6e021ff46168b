"""``nndb run``'s progress line on a terminal: step, steps/s, the last loss
and the findings so far, on one line of stderr redrawn in place.

A step-pipeline listener whose cost per step is one clock read and one
comparison: it draws at most once per ``interval`` seconds (4 times a
second), never at every step.  The session clears the line before anything
of nndb's is printed (a finding, a stop) and at the run's end; the line is
drawn with the cursor left at its start.  It writes to file descriptor 2
itself (``write``).

The script's own lines would overwrite it only as far as they reach (its
shorter lines kept the line's tail: ``mfu 0.00%ding(s)``, issue 39).  So
while the line is on the terminal, the process's own ``sys.__stdout__`` and
``sys.__stderr__`` (those that are terminals) have a ``write`` of the
instance (``StreamGuard``) that erases the line before the script's text
and draws it again after a line of it has ended; the streams are the same
objects, of the same type, writing the same bytes, and the guard is taken
off when the line is cleared (at a stop, nndb's messages, the run's end)."""
from __future__ import annotations

import os
import sys
import time
from typing import Callable, Optional

from ..text import fmt
from ..tracer import stats as S

INTERVAL = 0.25              # seconds between two redraws, at least
FIRST = 1.0                  # nothing for a run's first second (a short run never shows it)
CLEAR = "\r\033[K"


def stderr_fd(text: str) -> None:
    try:
        os.write(2, text.encode("utf-8", "replace"))
    except OSError:              # (the script closed fd 2: no progress line)
        pass


class _OneLine:
    """A line of stderr redrawn in place (``write``, ``shown``, ``draws``)."""

    def _show(self, text: str) -> None:
        self.write(CLEAR + text + "\r")          # (the cursor back at the start: nothing is appended)
        self.shown = True
        self.draws += 1

    def _erase(self) -> None:
        if self.shown:
            self.write(CLEAR)
            self.shown = False


class ProgressLine(_OneLine):
    def __init__(self, session, write: Callable[[str], None] = stderr_fd, interval: float = INTERVAL,
                 clock: Callable[[], float] = time.monotonic, streams: Optional[tuple] = None):
        self.session = session
        self.write = write
        self.interval = interval
        self.clock = clock
        self.shown = False
        self.draws = 0
        self._text = ""
        self.guard = StreamGuard(self, streams)
        self._restart()

    def _restart(self, delay: float = FIRST) -> None:
        now = self.clock()
        self._next = now + delay
        self._since: Optional[tuple] = None     # (step, time) the rate is measured from

    def on_step(self, end) -> None:
        if end.step is None:
            return
        now = self.clock()
        if now < self._next:
            return
        self._next = now + self.interval
        s = self.session
        if s.prompting or s.replica is not None:
            return
        since, self._since = self._since, (end.step, now)
        if since is None or now <= since[1]:
            return                               # (the rate needs two points)
        rate = (end.step - since[0]) / (now - since[1])
        record = end.record
        if record is not None and record.step != end.step:
            # (a hand-written loop closes step N-1's record at step N's end: the loss beside
            # "step N" is step N's as far as it is known, the session's, as the prompt shows it)
            known = getattr(s, "step_record", None)
            record = known if known is not None and known.step == end.step else None
        self.draw(end.step, rate, _loss(record), len(s.log.findings))

    def draw(self, step: int, rate: float, loss: Optional[float], findings: int) -> None:
        text = f"nndb: step {step}  {rate:.3g} steps/s  loss {'-' if loss is None else fmt(loss)}  " \
               f"{findings} finding(s)"
        self._text = text
        self._show(text)
        self.guard.arm()

    def erase(self) -> None:
        """Off the terminal for a moment (the script prints): drawn again after."""
        self._erase()

    def redraw(self) -> None:
        if not self.shown and self._text:
            self.write(CLEAR + self._text + "\r")
            self.shown = True

    def clear(self) -> None:
        """Remove the line (before nndb prints, at a stop, at the end); the rate starts again."""
        self.guard.disarm()
        self._text = ""
        self.erase()
        self._restart(self.interval)


class StreamGuard:
    """While the line is shown, the script's terminal streams erase it before
    they write and draw it again after a line ends (the module's docstring)."""

    def __init__(self, line: ProgressLine, streams: Optional[tuple] = None):
        self.line = line
        self._streams = streams
        self._armed: list = []           # [(stream, the guard's write)]
        self._pid = os.getpid()

    def arm(self) -> None:
        if self._armed:
            return
        self._pid = os.getpid()
        for stream in self._streams if self._streams is not None else (sys.__stdout__, sys.__stderr__):
            try:
                if stream is None or "write" in vars(stream) or not stream.isatty():
                    continue             # (one the script set its own write on is left alone)
                write = self._guarded(stream.write)
                stream.write = write
            except (AttributeError, TypeError, ValueError, OSError):
                continue                 # (no instance dict, closed: not guarded)
            self._armed.append((stream, write))

    def disarm(self) -> None:
        for stream, write in self._armed:
            try:
                if vars(stream).get("write") is write:
                    del stream.write
            except (AttributeError, TypeError):
                pass
        self._armed = []

    def _guarded(self, original):
        line = self.line

        def write(text):
            if os.getpid() != self._pid:         # (a fork of the run: a DataLoader worker, a replica)
                return original(text)
            line.erase()
            n = original(text)
            if isinstance(text, str) and text.endswith("\n"):
                line.redraw()                    # (a terminal's stream is line-buffered: the line is out)
            return n
        return write


class CountLine(_OneLine):
    """A long job's progress on one line of stderr (``nndb export``):
    ``LABEL: DONE/TOTAL UNIT (P%)``, drawn as ProgressLine draws (not in the
    first second, at most once per ``interval``), cleared by ``clear``."""

    def __init__(self, label: str, unit: str, write: Callable[[str], None] = stderr_fd,
                 interval: float = INTERVAL, clock: Callable[[], float] = time.monotonic):
        self.label, self.unit = label, unit
        self.write, self.interval, self.clock = write, interval, clock
        self.shown = False
        self.draws = 0
        self._next = clock() + FIRST

    def update(self, done: int, total: int) -> None:
        now = self.clock()
        if now < self._next:
            return
        self._next = now + self.interval
        pct = f" ({100 * done // total}%)" if total else ""
        self._show(f"{self.label}: {done}/{total} {self.unit}{pct}")

    def clear(self) -> None:
        self._erase()


def _loss(record) -> Optional[float]:
    """The record's loss (the first loss series' mean), or None."""
    if record is None:
        return None
    for i, (_, kind) in enumerate(record.names):
        if kind == "loss":
            return float(S.finalize_many(record.raw[i:i + 1])[0, S.STAT_NAMES.index("mean")])
    return None
