"""``nndb run``'s progress line on a terminal: step, steps/s, the last loss
and the findings so far, on one line of stderr redrawn in place.

A step-pipeline listener whose cost per step is one clock read and one
comparison: it draws at most once per ``interval`` seconds (4 times a
second), never at every step.  The session clears the line before anything
of nndb's is printed (a finding, a stop) and at the run's end; the line is
drawn with the cursor left at its start, so nothing is appended to it.
It writes to file descriptor 2 itself (``write``): the script's
``sys.stderr`` and ``sys.stdout`` are never touched."""
from __future__ import annotations

import os
import time
from typing import Callable, Optional

from ..numbers import fmt
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
                 clock: Callable[[], float] = time.monotonic):
        self.session = session
        self.write = write
        self.interval = interval
        self.clock = clock
        self.shown = False
        self.draws = 0
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
        self.draw(end.step, rate, _loss(end.record), len(s.findings))

    def draw(self, step: int, rate: float, loss: Optional[float], findings: int) -> None:
        text = f"nndb: step {step}  {rate:.3g} steps/s  loss {'-' if loss is None else fmt(loss)}  " \
               f"{findings} finding(s)"
        self._show(text)

    def clear(self) -> None:
        """Remove the line (before nndb prints, at a stop, at the end); the rate starts again."""
        self._erase()
        self._restart(self.interval)


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
