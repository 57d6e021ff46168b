"""``nndb run --export``: each step's record streamed to TensorBoard or MLflow
while the run goes, without slowing it.

A ``LiveExport`` is a listener of the run's step pipeline
(nndb.tracer.pipeline).  At a step end it only appends the step's records
(and the findings new since the last step) to a bounded queue: no
statistics are computed and no exporter is called on the training thread.
A background thread opens the sink, turns the records into scalars
(nndb.export.scalars) and writes them.  When the queue is full the oldest
entry is dropped, and that is said once; the trace keeps every step.  A
store that cannot be reached, or fails later, is one warning line: the
export stops there and the run and its trace go on untouched.

A forked time-travel replica inherits the listener but not its thread: it
exports nothing (the live run did).  Threads the exporter's libraries start
(TensorBoard's event writer) are named ``nndb-export-...``, as nndb's own
are: a forked replica never touches them, so they do not make fork() unsafe.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import sys
import threading
import time
from typing import Callable, Optional

from ..text import printable_line
from .scalars import findings_by_step, hyper_scalars, record_scalars, run_params, start_time

CAPACITY = 1024             # entries (a step's record, or a batch of findings) waiting at most
FLUSH_SECS = 2.0            # the sink is flushed at least this often while steps come
CLOSE_SECS = 10.0           # what the run's end waits for the export to finish


def _stderr(text: str) -> None:
    # One write with its newline: the exporter's thread says this while the
    # main thread may be printing (print() writes the text and the newline
    # apart, and another line could land between them).
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


class LiveExport:
    """One export target's listener and thread.  ``start``: the run's start
    (seconds since the epoch; wall times are start + a record's time);
    ``params``: the run's parameters known at its start; ``findings()``: the
    session's findings so far (new ones are queued at each step)."""

    def __init__(self, target, start: float, params: dict, findings: Callable[[], list] = list,
                 message: Callable[[str], None] = _stderr, capacity: int = CAPACITY):
        self.target = target
        self.message = message
        self.dropped = 0
        self.written = 0                    # records written to the sink
        self.failed: Optional[str] = None
        self._start = start
        self._params = params
        self._findings = findings
        self._seen = len(findings())
        self._capacity = capacity
        self._queue: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self._closing = False
        self._end: tuple = ("finished", None)
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._work, name=f"nndb-export-{target.kind}", daemon=True)
        self._thread.start()

    # -- the training thread: O(1) per step ------------------------------------------------
    def on_step(self, end) -> None:
        if os.getpid() != self._pid or self.failed:
            return                          # (a forked replica's replay; or the export stopped)
        self._put(list(end.records) + self._new_findings())

    def _new_findings(self) -> list:
        found = self._findings()
        if len(found) <= self._seen:
            return []
        new, self._seen = list(found[self._seen:]), len(found)
        return [("findings", new)]

    def _put(self, items: list) -> None:
        if not items:
            return
        first_drop = False
        with self._cv:
            for item in items:
                if len(self._queue) >= self._capacity:
                    self._queue.popleft()
                    self.dropped += 1
                    first_drop = self.dropped == 1
                self._queue.append(item)
            self._cv.notify()
        if first_drop:
            self.message(printable_line(f"nndb: warning: the export to {self.target.label} falls behind: "
                                        f"dropping the oldest steps (the trace keeps them all)"))

    def close(self, status: str = "finished", trace_path: Optional[str] = None, timeout: float = CLOSE_SECS) -> None:
        """The run ended: write what is queued, the trace as an artifact
        (MLflow), close the sink; wait at most ``timeout`` seconds."""
        if os.getpid() != self._pid:
            return
        if not self.failed:
            self._put(self._new_findings())
        with self._cv:
            self._closing = True
            self._end = (status, trace_path)
            self._cv.notify()
        self._thread.join(timeout)
        if self._thread.is_alive() and not self.failed:
            self.message(printable_line(f"nndb: warning: the export to {self.target.label} did not finish within "
                                        f"{timeout:g} s; what it had not written is lost (the trace has it all)"))

    # -- the export's thread ------------------------------------------------------------------
    def _work(self) -> None:
        try:
            before = set(threading.enumerate())
            sink = self.target.open()
            # (threads started while the sink opened: the exporter's, save a
            # script thread started in these few milliseconds)
            for t in set(threading.enumerate()) - before:
                if not t.name.startswith("nndb-"):
                    t.name = f"nndb-export-{t.name}"
            sink.params(self._params)
        except Exception as e:
            return self._fail(e)
        last_flush = time.monotonic()
        while True:
            with self._cv:
                if not self._queue and not self._closing:
                    self._cv.wait(FLUSH_SECS)
                batch = list(self._queue)
                self._queue.clear()
                closing = self._closing
            try:
                for item in batch:
                    self._write(sink, item)
                if closing:
                    status, trace_path = self._end
                    if trace_path and os.path.exists(trace_path):
                        self._finish_from_trace(sink, trace_path)
                        sink.artifact(trace_path)
                    sink.close(status)
                    return
                if time.monotonic() - last_flush >= FLUSH_SECS:
                    sink.flush()
                    last_flush = time.monotonic()
            except Exception as e:
                return self._fail(e)

    def _finish_from_trace(self, sink, trace_path: str) -> None:
        """What the steps' records do not carry, from the closed trace, as
        ``nndb export`` writes it: each param group's learning rate at every
        step, and (TensorBoard) the histograms."""
        from ..store.reader import TraceReader
        with TraceReader(trace_path) as reader:
            for series in hyper_scalars(reader):
                sink.scalars(series)
            if hasattr(sink, "histogram"):
                from .histograms import trace_histograms
                for p in trace_histograms(reader):
                    sink.histogram(p)

    def _write(self, sink, item) -> None:
        if isinstance(item, tuple):
            for step, lines in sorted(findings_by_step(item[1]).items()):
                sink.findings(step, lines)
            return
        for series in record_scalars(item, self._start):
            sink.scalars(series)
        self.written += 1

    def _fail(self, e: Exception) -> None:
        self.failed = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"
        with self._cv:
            self._queue.clear()
        self.message(printable_line(f"nndb: warning: cannot export to {self.target.label} ({self.failed}); "
                                    f"the run and its trace go on without it"))


class RunExports:
    """The live exports of a debugging session, one set per run (``run``
    starts the script again: its steps go to a directory or MLflow run of
    their own)."""

    def __init__(self, targets, message: Callable[[str], None], findings: Callable[[], list] = list):
        self.targets = tuple(targets)
        self.message = message
        self.findings = findings
        self.runs = 0
        self.live: list = []

    def start(self, rec) -> list:
        """The listeners for the run ``rec`` (nndb.run.runner.Recording) records."""
        self.runs += 1
        script = os.path.basename(str(rec.meta.get("script") or rec.meta.get("module") or "run"))
        params = run_params(rec.meta)
        self.live = []
        for t in self.targets:
            if t.kind == "mlflow" and t.run_name is None:
                t = dataclasses.replace(t, run_name=os.path.splitext(script)[0])
            if self.runs > 1:
                t = t.with_suffix(f"-run{self.runs}")
            self.live.append(LiveExport(t, start_time(rec.meta), params, self.findings, self.message))
        return list(self.live)

    def finish(self, status: str, trace_path: Optional[str]) -> None:
        for x in self.live:
            x.close(status, trace_path)
        self.live = []
