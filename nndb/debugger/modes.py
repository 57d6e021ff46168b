"""The engine's run-control vocabulary, as Enums (as torch.profiler's
``ProfilerAction``): what the run does until the next stop (``Mode``), where
the session stands (``State``), why it stopped (``StopKind``), how the run is
to end (``End``) and what a replica's role answers at a step end (``StepEnd``).

``Mode``, ``State`` and ``StopKind`` are written out as text (a stop's kind is
the ``reason`` of the trace's stop events and of the report, the state shows
in the toolbar), so they are str-valued: a member compares, hashes, formats
and serializes exactly as its word, and code that still speaks the word
(``stop.kind == "breakpoint"``) keeps working.
"""
from __future__ import annotations

import enum


class _Word(str, enum.Enum):
    """A member is its word everywhere text is made of it (str(), f-strings, JSON, dict keys)."""
    __str__ = str.__str__
    __format__ = str.__format__
    __hash__ = str.__hash__


class Mode(_Word):
    """Run control: what the run does until the next stop (bdb's set_* requests)."""
    CONTINUE = "continue"      # to the next point that hits
    NEXT = "next"              # to the end of the count-th step
    STEP = "step"              # to the next module call (or step end)
    FINISH = "finish"          # to the end of the step in progress
    UNTIL = "until"            # to the end of a given step
    DETACH = "detach"          # to the run's end, no more stops


class State(_Word):
    """Where the session stands."""
    NONE = "none"              # no run yet
    LIVE = "live"
    POST_MORTEM = "post-mortem"
    EXITED = "exited"


class StopKind(_Word):
    """Why the run stopped (the ``reason`` of a stop in the trace and the report)."""
    START = "start"
    STEP = "step"
    NEXT = "next"
    FINISH = "finish"
    UNTIL = "until"
    INTERRUPT = "interrupt"
    BREAKPOINT = "breakpoint"
    WATCHPOINT = "watchpoint"
    CATCHPOINT = "catchpoint"
    RULE = "rule"
    EXCEPTION = "exception"
    EXITED = "exited"
    SET_TRACE = "set_trace"
    PAST = "past"              # a replica arrived in the past (goto, reverse-step...)
    PROBE = "probe"            # (never shown: what a module point's condition sees)


# The stops that run control asked for: they are where the user said to go,
# not events of the run (the trace and the report keep the others).
REQUESTED = frozenset({StopKind.START, StopKind.STEP, StopKind.NEXT, StopKind.FINISH, StopKind.UNTIL,
                       StopKind.PAST})


class End(enum.Enum):
    """What a command asked to happen to the run when the prompt loop ends."""
    KILL = "kill"              # end the run, keep the session
    RESTART = "restart"        # end the run, start the script again
    QUIT = "quit"              # end the run and the session


class StepEnd(_Word):
    """What a replica's role answers at a step end, before the points are
    checked (``before_stops``), besides a Stop to stop at or None to check as usual."""
    SKIP = "skip"              # check nothing here (a replay on its way to its target)
