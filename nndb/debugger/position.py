"""Where the run is stopped (pdb's ``curframe`` and ``stack``): the stop,
the script's frames at it and the one 'up' and 'down' selected, the frame
the tracer's callback came from, a module stop's module and payload, and
where 'list' goes on.

Owned by the session (``session.here``); the stop checks
(nndb.debugger.stoppoints) fill it in, the inspecting commands read it and
move its selected frame."""
from __future__ import annotations

from ..tracer.naming import is_library_frame
from . import evaluate as E


class StopPosition:
    """The current stop (``stop``: a stoppoints.Stop, or None while the run
    goes on), the script's frames there (``frames``: [(frame, lineno)],
    outermost first) and the selected one (``frame_index``), the frame of
    the tracer's callback (``hook_frame``: expressions are evaluated in the
    script's frame above it), at a module stop the module and its inputs or
    output gradients (``module``, ``payload``), where 'list' goes on
    (``list_position``: ((file, frame index), line)), and in the live run the
    step of the last stop inside a step where points held and its ordinal
    among that step's (``nth``: (step, n), as a reverse-continue's scan counts
    a step's hits: Session.ordinal)."""

    def __init__(self):
        self.stop = None
        self.frames: list = []
        self.frame_index = 0
        self.hook_frame = None
        self.payload = self.module = None
        self.list_position = None
        self.nth: tuple = (None, -1)

    @property
    def frame(self):
        """The frame 'up' and 'down' selected at the current stop, or None."""
        if not self.frames:
            return None
        return self.frames[self.frame_index][0]

    def stop_frame(self):
        """The script's frame at the current stop point (for expressions)."""
        return E.stop_frame(self.hook_frame)

    def select_stack(self, frame) -> None:
        """The script's frames from ``frame`` outwards; selected, the innermost of code the
        user wrote, where one is (pdb's ``skip`` of installed packages, done for them): a step
        that ends inside a library the script calls (accelerate's ``AcceleratedOptimizer.step``,
        the Hugging Face Trainer's loop) stops at the user's line that called it, the
        library's frames below it ('down', 'where').  (It stopped in accelerate/optimizer.py,
        where 'p loss' raised NameError until 'up'.)"""
        self.frames = [(f, f.f_lineno) for f in E.stack_from(frame)] if frame is not None else []
        own = [i for i, (f, _) in enumerate(self.frames) if not is_library_frame(f)]
        self.frame_index = own[-1] if own else len(self.frames) - 1

    def at(self, stop, frame) -> None:
        """The run stopped at ``stop``, in ``frame``: 'list' starts again around its line."""
        self.stop = stop
        self.select_stack(frame)
        self.list_position = None

    def at_traceback(self, stop, tb) -> None:
        """The script raised (post-mortem): the frames of its traceback, the raising one selected."""
        self.stop = stop
        self.frames = E.stack_from_traceback(tb)
        self.frame_index = len(self.frames) - 1
        self.list_position = None

    def clear(self) -> None:
        """The run ended: keep none of the script's objects alive."""
        self.stop = None
        self.let_go()

    def let_go(self) -> None:
        """The run goes on: hold none of the script's frames until the next stop
        (a frame holds its locals, and its callers': an optimizer that a function
        made and the script let go would outlive it)."""
        self.frames = []
        self.hook_frame = self.payload = self.module = None
