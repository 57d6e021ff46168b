"""The changes made at the live run's prompt (``set``, ``set var``, ``set
--hold``, ``unset``, ``py``): part of the run's history, so every replay of
the run makes them again where they were made.

One record for both kinds of replay: a replica resumed from a checkpoint (or
respawned) makes the session's changes at their step ends
(nndb.timetravel.roles), and across ranks the console makes its own at the
stops of the job it drives again (nndb.distributed.travel.to_step).  A replay runs
silently from step end to step end, so a change is made again at the end of
a step: one made there is made again exactly; one made inside a step (a
module's breakpoint, ``step``, ``nndb.set_trace()``) at the end of the step
before, which is the same for a setting the script does not touch in
between; one made at the start stop at the start stop of a replay that has
one (a job across ranks, driven again from its start); a fork checkpoint
holds it already, and a respawned replica, which has no start stop, cannot
make it.  A divergence after a change not made where it was made names the
change, never randomness.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Change:
    line: str                  # the command, as it is typed again in a replay
    step: Optional[int]        # the stop's step: the one that ended ("end"), else the one in progress
    place: str = "end"         # end: a step end | inside: inside the step | start: the start stop

    @property
    def replay_at(self) -> Optional[int]:
        """The end of the step where a replay makes it again (None: at the start stop)."""
        if self.place == "start" or self.step is None:
            return None
        if self.place == "end":
            return self.step
        return self.step - 1 if self.step > 0 else None

    @property
    def exact(self) -> bool:
        """Made again where it was made: at its step end, or at the start stop of a replay that has one."""
        return self.place in ("end", "start")

    def where(self) -> str:
        if self.place == "start":
            return "at the start"
        if self.place == "end":
            return f"at the end of step {self.step}"
        again = self.replay_at
        return f"inside step {self.step}" + (f"; a replay makes it at the end of step {again}"
                                             if again is not None else "")

    def describe(self) -> str:
        return f"'{self.line}' (made {self.where()})"

    def as_dict(self) -> dict:
        """What a replica is sent and the trace keeps (an event of kind "change")."""
        return {"line": self.line, "step": self.step, "place": self.place}

    @classmethod
    def from_dict(cls, d: dict) -> "Change":
        step = d.get("step")
        return cls(str(d["line"]), None if step is None else int(step), str(d.get("place", "end")))


def due(changes: list, at: Optional[int]) -> list:
    """The changes a replay makes again at the stop at the end of step ``at``
    (None: the start stop), in the order they were made."""
    return [c for c in changes if c.replay_at == at]


def kept_before(changes: list, target: int) -> list:
    """The changes a replay to the end of step ``target`` passes on its way
    (made again at the start or at an earlier step end)."""
    return [c for c in changes if c.replay_at is None or c.replay_at < target]


def not_as_made(changes: list, upto: int, has_start: bool) -> list:
    """Of ``changes`` (those a replay was given), the ones it made, or could
    not make, other than where the live run made them, up to the end of step
    ``upto``; ``has_start``: the replay stops at the script's start."""
    return [c for c in changes if (c.replay_at is None or c.replay_at <= upto)
            and (c.place == "inside" or (c.place == "start" and not has_start))]
