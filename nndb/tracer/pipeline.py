"""What a step boundary hands on, and to whom.

The recorder closes steps into ``StepRecord``s; at each step boundary the
recording hands a ``StepEnd`` (the step that ended, the records closed since
the last boundary) to an ordered list of listeners: the trace writer first,
then whatever joined the run (the debugger's rules, checkpoints, lineage and
stop check; an exporter).  A listener is any object with ``on_step(end)``.
"""
from __future__ import annotations

from typing import NamedTuple, Optional


class StepEnd(NamedTuple):
    step: Optional[int]      # the step that just ended; None: the run's end (the last records)
    records: tuple           # StepRecords closed at this boundary, oldest first (a hand-written
    #                          loop's record of step N is closed at the end of step N+1)

    @property
    def record(self):
        """The newest record handed on here, or None."""
        return self.records[-1] if self.records else None


class Pipeline:
    """The recorder's sink and the tracer's step-end callback: records wait
    here until the boundary that closed them is handed on."""

    def __init__(self, listeners=(), on_error=None):
        self.listeners: list = list(listeners)
        self.on_error = on_error           # (message): a listener's failure, said once per listener
        self._failed: set = set()
        self._closed: list = []

    def closed(self, record) -> None:
        self._closed.append(record)

    def step_ended(self, step: Optional[int]) -> None:
        records = tuple(self._closed)
        self._closed.clear()
        end = StepEnd(step, records)
        for listener in self.listeners:
            try:
                listener.on_step(end)
            except Exception as e:      # one listener's bug never costs the others (or the script) a step
                if id(listener) not in self._failed and self.on_error is not None:
                    self._failed.add(id(listener))
                    self.on_error(f"nndb: internal error in {type(listener).__name__} at a step end: "
                                  f"{type(e).__name__}: {e}")

    def run_ended(self) -> None:
        """Records closed as the run ended (no boundary of their own) go out."""
        if self._closed:
            self.step_ended(None)


class WriteRecords:
    """The trace writer's place in the pipeline: every record is appended."""

    def __init__(self, writer):
        self.writer = writer

    def on_step(self, end: StepEnd) -> None:
        for record in end.records:
            self.writer.append(record)


class CallAtStepEnd:
    """A plain ``callback(step)`` at each step boundary (scripts, tests)."""

    def __init__(self, callback):
        self.callback = callback

    def on_step(self, end: StepEnd) -> None:
        if end.step is not None:
            self.callback(end.step)
