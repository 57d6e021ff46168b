"""Going to a step: the way there from where the session is (a replica in
the past, or the live run), for ``goto``, ``reverse-step`` and
``reverse-continue``."""
from __future__ import annotations

from ..errors import CommandError


def go_to(s, machine, target: int, then: str = "stop", why: str = "") -> None:
    """To the end of step ``target``: forward on this timeline by running, back
    by a replica replayed from a checkpoint (a replica first hands the terminal
    back to the live run, which owns the checkpoints)."""
    if target < 0:
        raise CommandError("cannot go back before the end of step 0 (the first checkpoint)")
    if machine.replica:
        role = getattr(s, "replica", None)            # (the Goto role: where the present is)
        present = getattr(role, "present", None)
        if target > s.last_step and present is not None and target > present \
                and not getattr(machine, "changed", False):
            raise CommandError(f"step {target} has not run yet (the present is step {present}): "
                               f"'present', then 'until {target}'")
        if target > s.last_step:
            s.set_until(target)
            if role is not None:
                role.forward_goto = target      # (a point on the way stops it, as 'until': said so)
            # (a goto, not an 'until': the commands after it in a breakpoint's list run where it
            # stops, as after a goto back; they were dropped as after a 'continue')
            s.input.keep_point_commands = True
            return
        machine.hand_back(s, "goto", target=target, then=then, why=why)
    if s.last_step is None:
        raise CommandError(f"step {target} has not run yet (no step has finished): use 'until {target}'")
    if target > s.last_step:
        raise CommandError(f"step {target} has not run yet (the present is step {s.last_step}): "
                           f"use 'until {target}'")
    machine.travel(s, target, then, why)
