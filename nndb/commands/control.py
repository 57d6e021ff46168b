"""Run control: continue, next, step, finish, until, detach, kill, run, quit."""
from __future__ import annotations

from ..errors import CommandError
from ..debugger.modes import State
from ..debugger.points import parse_int
from .table import Command, no_args


def _count(text: str):
    t = text.strip()
    if not t:
        return 1
    n = parse_int(t, "the count")
    if n < 1:
        raise CommandError(f"the count must be at least 1, not {n}")
    return n


def _continue(s, n):
    cur = s.here.stop
    if n > 1 and cur is not None and cur.hits:
        p = cur.hits[0][0]
        if p.number in s.points:
            p.ignore_count = n - 1
            s.message(f"Will ignore next {n - 1} crossings of breakpoint {p.number}.  Continuing.")
    elif n > 1:
        s.message("Not stopped at any breakpoint; argument ignored.")     # (gdb's words)
    s.set_continue()


def _next(s, n):
    s.set_next(n)


def _step(s, _):
    s.set_step()


def _finish(s, _):
    s.set_finish()


def _until(s, step):
    if step is None:            # (gdb's and pdb's 'until' with no argument: on to the next step's end, as next)
        s.set_next(1)
        return
    if s.last_step is not None and step <= s.last_step:
        raise CommandError(f"step {step} has already finished (the last was {s.last_step})")
    s.set_until(step)


def step_arg(command: str):
    """The parser of a command's STEP argument (until, goto)."""
    def parse(text: str) -> int:
        if not text.strip():
            raise CommandError(f"{command} needs a step number")
        n = parse_int(text.strip(), "the step")
        if n < 0:
            raise CommandError(f"step numbers start at 0, not {n}")
        return n
    return parse


def _until_arg(text: str):
    return step_arg("until")(text) if text.strip() else None


def _detach(s, _):
    s.set_detach()
    s.message("Detached: the run goes on to its end with no more stops (still recording).")


def _kill(s, _):
    if s.control.state is State.POST_MORTEM:
        s.control.resume = True       # (the exception ends the run: it is over already, as gdb's kill)
        return
    if not s.live:
        raise CommandError(s.not_running())
    if s.interactive and not s.frontend.confirm("Kill the run being debugged? (y or n) "):
        s.message("Not confirmed.")
        return
    s.request_kill()


def _run(s, _):
    if s.live and s.interactive and not s.frontend.confirm(
            "The run being debugged has been started already.  Start it from the beginning? (y or n) "):
        s.message("Program not restarted.")
        return
    s.request_restart()


def _quit(s, _):
    if s.live and s.interactive and not s.frontend.confirm("A run is active.  Kill it and quit? (y or n) "):
        s.message("Not confirmed.")
        return
    s.request_quit()


COMMANDS = [
    Command("continue", "continue [N]", """Resume the run until the next stop.
With N, ignore the breakpoint that stopped the run N-1 more times (gdb).""",
            _continue, _count, aliases=("c", "cont"), group="running"),
    Command("next", "next [N]", "Run N training steps (default 1), stopping at the end of the last one.",
            _next, _count, aliases=("n",), group="running"),
    Command("step", "step", """Run to the next module call: into the forward pass, then the backward.
At the end of the step, stop there.""",
            _step, no_args, aliases=("s",), group="running"),
    Command("finish", "finish", "Run to the end of the current training step.",
            _finish, no_args, aliases=("fin",), group="running"),
    Command("until", "until [STEP]", """Run until training step STEP has finished.
With no STEP, as next: to the end of the step in progress (gdb's and pdb's until).""",
            _until, _until_arg, aliases=("u",), group="running"),
    Command("detach", "detach", "Let the run go on to its end with no more stops (still recorded); nndb ends with it.",
            _detach, no_args, group="running"),
    Command("kill", "kill", "Stop the run (its trace is closed and kept); 'run' starts it again.",
            _kill, no_args, aliases=("k",), group="running"),
    Command("run", "run", """Start the script again from the beginning; breakpoints are kept.
The new run records to a trace of its own beside the first, TRACE-run2.h5
(-run3 ..., never over an existing file), and says so.""",
            _run, no_args, aliases=("r",), group="running"),
    Command("quit", "quit", "Leave nndb (asks first if a run is active).",
            _quit, no_args, aliases=("q", "exit"), group="running"),
]
