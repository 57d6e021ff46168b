"""Where a training step ends.  Pure logic: it is fed events and answers.

The rule (also in docs/steps.md):

* **One optimizer** (a plain loop, gradient accumulation, LBFGS with a
  closure): step N ends when the N-th ``optimizer.step()`` returns.  Any
  number of ``backward()`` calls may happen inside one step.
* **Several optimizers** (a GAN): one step is one iteration of the training
  loop.  The iteration is learnt from the first optimizer to step a second
  time: the optimizers that stepped before that, in order, make one
  iteration, and the one that stepped last *closes* every step.  Step 0 ends
  as the later ones do, when its last optimizer returns, if by then every
  optimizer of the run has stepped once (a GAN's, PPO's actor and critic):
  no other can be part of the iteration.  Otherwise (an optimizer made for
  a later stage, or one that first steps in a later iteration) it is closed
  retroactively when the first optimizer steps again (at the return of its
  last optimizer).  From step 1 on a step ends as soon as the closing
  optimizer returns.  If the
  closing optimizer goes away (a new optimizer replaces it), the next
  optimizer to step becomes the closer.
* **A new optimizer while the old one lives on** (kept in a list, or a
  global the next stage no longer steps): with one closing optimizer, an
  optimizer that steps a second time before the closer has stepped since
  its first takes over, as a learnt iteration would: the optimizers that
  stepped since the last close, in order, make the step, which ends at the
  return of the last of them (closed after the fact), and the last closes
  the steps from then on.  The live run learns that only inside the next
  step; a replica replaying the step is told (``handovers``, the live
  clock's: the step, how many optimizer steps make it, the last one's place
  among the run's optimizers by their first step, the same in a replay) and
  closes it at that return, where the step ended.
* **An optimizer that steps twice in one iteration** (SAC's critic, stepped
  at every environment step, its actor and temperature every other one,
  twice: q | q actor alpha actor alpha | q | ...): no step holds two steps of
  one optimizer.  One that stepped since the last close (not the closer),
  stepping again, ends the step before it, after the fact as above (the
  optimizers that stepped since the last close make it; the closer stays);
  a replica is told (``handovers``, and ``repeats`` names the step) and closes
  it at the return of its last optimizer step.  (Two critic steps and the
  policy's made one step: a loss that was the sum of two of the critic's.)
* **A second optimizer that first steps after the closer's step** (a GAN whose
  generator steps from the third iteration on, ``if i >= 2:
  optimizerG.step()``; a WGAN's generator, after the critic's first steps):
  its first step is in the next step.  Where the script's code calls it after
  the closer (its ``step()`` on a later line of the frame both calls share: the
  loop's), which iteration it is part of shows at the next optimizer step after
  the closer's (where it is called before the closer, a GAN whose discriminator's
  first steps a GradScaler skipped, it starts the closer's next iteration and
  is in that step: nothing changes).  If the newcomer steps again
  there, it joins the closer's iteration: its first step, which came after
  the step of its iteration had closed (a closed step is not reopened), is a
  step of its own, closed after the fact (``joins``), and from then on a step
  is one iteration of the two, which the newcomer closes (it paired the
  discriminator's iteration k with the generator's k - 1 for good).  If the
  closer steps again, the newcomer's steps fall into the closer's steps that
  follow them (a WGAN's critic, stepped N times a generator step), as before:
  that step is closed after the fact too.  A replica is told either
  (``handovers``; ``joins`` says which) and closes the step at its own end.
* **No optimizer** in the process (hand-written updates such as
  ``p.data.add_(p.grad, alpha=-lr)``): step N ends when the N-th
  ``backward()`` that reaches a parameter returns.  If an optimizer appears
  later, its steps take over from then on.  Its first ``step()``, where it
  applies the gradients of the ``backward()`` that ended the last such step
  (not a closure's, nor one inside a backward), is that step's update, as a
  hand-written one would be: it closes no step of its own.
"""
from __future__ import annotations

import enum
import weakref
from dataclasses import dataclass
from typing import Optional


class Mode(enum.Enum):
    UNKNOWN = "unknown"
    MANUAL = "manual"
    SINGLE = "single"
    LEARNING = "learning"
    CYCLE = "cycle"


@dataclass
class Close:
    """Close the current step.  ``retro`` is the number of optimizer
    segments (see ``StepRecorder.mark``) that belong to the closed step when
    it is closed after the fact; None closes everything recorded so far."""
    step: int
    retro: Optional[int] = None


def call_site(frame) -> tuple:
    """Where a frame is, with the frames that called it: ((code, line), ...) from the outermost."""
    out = []
    while frame is not None:
        out.append((frame.f_code, frame.f_lineno))
        frame = frame.f_back
    return tuple(reversed(out))


def called_after(first, then) -> bool:
    """Is the call at ``first`` later in the script's code than the one at ``then``: on a later
    line of the innermost frame both sites share (the training loop's)?  False where unknown."""
    if not first or not then:
        return False
    for i, (a, b) in enumerate(zip(first, then)):
        if a == b:
            continue
        if a[0] is b[0]:                 # (one function, two lines)
            return a[1] > b[1]
        if i and first[i - 1][0] is then[i - 1][0]:      # (two functions called from one)
            return first[i - 1][1] > then[i - 1][1]
        return False
    return False


class StepClock:
    def __init__(self):
        self.step = 0
        self.mode = Mode.UNKNOWN
        self._closer = None              # weakref to the closing optimizer
        self._learn_order: list = []     # ids of optimizers seen while learning
        self._learn_posts = 0            # optimizer steps (segments) while learning
        self._learn_n = 0                # optimizers in the process as learning began
        self.mark = False                # did the last optimizer_post end a segment (marks)
        self._others: list = []          # one closer: the others that stepped since the last close (weakrefs)
        # {step: (optimizer steps in it, the last one's ordinal)}: the steps a later stage's optimizer
        # took over, learnt here after the fact (optimizer_pre) or told to a replica (know)
        self.handovers: dict = {}
        self.repeats: set = set()        # those of ``handovers`` ended as an optimizer stepped again (not handed over)
        self._ordinals = weakref.WeakKeyDictionary()    # optimizer -> its place by first step (seen)
        self._n_seen = 0
        self.late: Optional[int] = None  # the step last closed after the fact, inside the next one
        self.absorbing = None            # weakref: an optimizer whose step is the last hand-written step's update
        # One closer: an optimizer whose first step came after the closer's step (weakrefs), and
        # whether the closer stepped again since (the newcomer's iteration is told at the next
        # optimizer step: _decide)
        self._fresh = None               # (weakref, call site) of the optimizer last seen for the first time
        self._newcomer = None
        self._undecided = False
        # {step: joined} of ``handovers``: a newcomer's first step alone (True: it joined the
        # closer's iteration) or with the closer's step after it (False)
        self.joins: dict = {}

    @property
    def closer(self):
        return self._closer() if self._closer is not None else None

    def _set_closer(self, opt) -> None:
        self._closer = weakref.ref(opt)

    def _close(self, retro=None) -> Close:
        c = Close(self.step, retro)
        self.late = self.step if retro is not None else None
        self.step += 1
        return c

    def seen(self, opt, site=None) -> None:
        """``opt`` steps for the first time in this run (the tracer's first sight of it):
        its ordinal, which a replay gives it too (ids differ in a new process).  ``site``:
        where the script calls its ``step()`` (``call_site``)."""
        if opt not in self._ordinals:
            self._ordinals[opt] = self._n_seen
            self._n_seen += 1
            self._fresh = (weakref.ref(opt), site)

    def know(self, handovers) -> None:
        """A replica is told the live run's handovers (``handovers``'s items, JSON's string
        keys or not): it closes each such step at the return of its last optimizer step,
        where the live run closed it after the fact (its stop was in the next step's first
        optimizer step, with that step's variables and gradients)."""
        for step, (n, ordinal, *joined) in dict(handovers or {}).items():
            self.handovers[int(step)] = (int(n), int(ordinal), *map(bool, joined[:1]))
            if joined:
                self.joins[int(step)] = bool(joined[0])

    # -- events -------------------------------------------------------------
    def optimizer_pre(self, opt, n_optimizers: int, own_backward: bool = False, site=None) -> Optional[Close]:
        """``n_optimizers``: how many optimizers the process holds now; ``own_backward``:
        the gradients this step applies come from a backward inside it (a closure's, or the
        backward it steps in), not from the last one; ``site``: where the script calls this
        ``step()`` (``call_site``), given while ``wants_site``."""
        if self.mode in (Mode.UNKNOWN, Mode.MANUAL):
            if n_optimizers <= 1:
                if self.mode is Mode.MANUAL and not own_backward:
                    # (the gradients of the backward that ended the last step: its update)
                    self.absorbing = weakref.ref(opt)
                self.mode = Mode.SINGLE
                self._set_closer(opt)
            else:
                self.mode = Mode.LEARNING
                self._learn_order = []
                self._learn_posts = 0
                self._learn_n = n_optimizers
            return None
        if self.mode is Mode.LEARNING:
            if id(opt) in self._learn_order:
                # The iteration is complete: the optimizer that stepped last closes steps.  One
                # optimizer in it (the others made for later stages): one closer, which a later
                # stage's optimizer may take over, as when it was alone.
                self.mode = Mode.SINGLE if len(set(self._learn_order)) == 1 else Mode.CYCLE
                return self._close(retro=self._learn_posts)
            return None
        closer = self._closer() if self._closer is not None else None
        if closer is None:
            self.mode = Mode.SINGLE if n_optimizers <= 1 else Mode.CYCLE
            self._set_closer(opt)
            self._others = []
            return None
        if self._undecided:
            return self._decide(opt, closer)
        if self._others and any(r() is opt for r in self._others):
            self._newcomer = None
            order, self._others = self._others, []
            self.handovers[self.step] = (len(order), self._ordinals.get(order[-1](), -1))
            if self.mode is Mode.CYCLE:
                # It stepped in this step already: the step ends before it; the closer stays.
                self.repeats.add(self.step)
                return self._close(retro=len(order))
            # The closer has not stepped since this one did: this one (and any that
            # stepped with it) is the loop now; the closer is an earlier stage's.
            return self._hand_over(order, retro=len(order))
        if opt is closer and self._newcomer is not None:
            (ref, first), self._newcomer = self._newcomer, None
            if ref() is not None and called_after(first, site):
                self._newcomer = ref
                self._undecided = True       # (the closer's step is no boundary until _decide)
        return None

    @property
    def wants_site(self) -> bool:
        """Does the next optimizer step need its call site (``optimizer_pre``'s ``site``)?"""
        return self._newcomer is not None

    def _decide(self, opt, closer) -> Close:
        """The optimizer step after the closer's that followed a newcomer's first step: the
        newcomer stepping again joins the closer's iteration (its first step a step of its
        own, and one iteration of the two a step, closed at its return from then on); another
        (the closer: a critic stepped N times a generator step) leaves the newcomer's step in
        the closer's step after it, as it was.  Either step is closed after the fact."""
        newcomer = self._newcomer()
        order, self._others = self._others, []
        self._newcomer, self._undecided = None, False
        if opt is newcomer:
            n = next(i for i, r in enumerate(order) if r() is opt) + 1
            self.handovers[self.step] = (n, self._ordinals.get(opt, -1), True)
            self.joins[self.step] = True
            self.mode = Mode.CYCLE
            self._set_closer(opt)
            self._others = order[n:]      # (the closer's step since: the next step's)
            return self._close(retro=n)
        self.handovers[self.step] = (len(order), self._ordinals.get(closer, -1), False)
        self.joins[self.step] = False
        return self._close(retro=len(order))

    def _hand_over(self, order: list, retro=None) -> Close:
        self.mode = Mode.SINGLE if len({id(r()) for r in order}) == 1 else Mode.CYCLE
        self._closer = order[-1]
        return self._close(retro=retro)

    def marks(self, opt) -> bool:
        """Does ``opt``'s step, about to return, end a segment of the step
        (``StepRecorder.mark``): while learning, and for an optimizer other
        than the closer (one closer: it may take over; several: it may step again
        in the step; see ``optimizer_pre``)."""
        if self.mode is Mode.LEARNING:
            return True
        closer = self._closer() if self._closer is not None else None
        return self.mode in (Mode.SINGLE, Mode.CYCLE) and opt is not closer and closer is not None

    def completes_iteration(self, opt) -> bool:
        """While learning: would ``opt``'s return leave every optimizer counted as
        learning began stepped once (worth a fresh count for ``optimizer_post``)?"""
        if self.mode is not Mode.LEARNING:
            return False
        seen = set(self._learn_order) | {id(opt)}
        return len(seen) > 1 and len(seen) >= self._learn_n

    def optimizer_post(self, opt, n_optimizers: Optional[int] = None) -> Optional[Close]:
        """``opt``'s step returns: the step it closes, if any; ``self.mark`` says whether
        it ends a segment of the step (``marks(opt)``, as asked before this call).
        ``n_optimizers``: how many optimizers the process holds now, where the caller
        counted them (``completes_iteration``): once each of them has stepped while
        learning, the iteration is complete and step 0 ends here, at its last
        optimizer's return, as the steps after it will (closed after the fact, at the
        next step's first optimizer, its stop showed the next iteration's frame and
        that optimizer's new gradients)."""
        if self.mode is Mode.LEARNING:
            seen = set(self._learn_order) | {id(opt)}
            if n_optimizers is not None and len(seen) > 1 and len(seen) >= n_optimizers:
                self.mode = Mode.CYCLE
                self._set_closer(opt)
                self.mark = False
                return self._close()
            self.mark = True
            self._learn_order.append(id(opt))
            self._learn_posts += 1
            self._set_closer(opt)
            return None
        closer = self._closer() if self._closer is not None else None
        self.mark = self.mode in (Mode.SINGLE, Mode.CYCLE) and opt is not closer and closer is not None   # (marks)
        if self.absorbing is not None:
            absorbed, self.absorbing = self.absorbing() is opt, None
            if absorbed:
                self.mark = False
                return None
        if opt is closer:
            if self._undecided:
                return self._closer_undecided(opt)
            self._others = []
            c = Close(self.step)          # (self._close(), inline: every step)
            self.late = None
            self.step += 1
            return c
        if self.mark:
            self._others.append(weakref.ref(opt))
            fresh, self._fresh = self._fresh, None
            told = self.handovers.get(self.step) if self.handovers else None
            if told is not None and told[:2] == (len(self._others), self._ordinals.get(opt, -1)):
                # (a replica told of the live run's handover: the step ends here, at its return)
                order, self._others = self._others, []
                self.mark = False
                if self.joins.get(self.step):      # (a newcomer that joined the closer's iteration: _decide)
                    self.mode = Mode.CYCLE
                    self._set_closer(opt)
                    return self._close()
                return self._close() if self.mode is Mode.CYCLE else self._hand_over(order)
            if fresh is not None and fresh[0]() is opt and self.mode is Mode.SINGLE:
                self._newcomer = fresh       # (its first step, after the closer's: _decide)
        return None

    def _closer_undecided(self, opt) -> Optional[Close]:
        """The closer returns after a newcomer's first step (``_decide``): a segment, no
        boundary yet, but in a replica told that the live run left the newcomer's step in
        this one (a critic stepped N times a generator step): the step ends here."""
        self._others.append(weakref.ref(opt))
        told = self.handovers.get(self.step)
        if told is not None and self.joins.get(self.step) is False and \
                told[:2] == (len(self._others), self._ordinals.get(opt, -1)):
            self._others, self._newcomer, self._undecided = [], None, False
            self.mark = False
            return self._close()
        self.mark = True
        return None

    def backward_end(self, n_optimizers: int) -> Optional[Close]:
        if self.mode is Mode.UNKNOWN:
            self.mode = Mode.MANUAL if n_optimizers == 0 else Mode.UNKNOWN
        if self.mode is Mode.MANUAL:
            return self._close()
        return None

    def finish(self) -> Optional[Close]:
        """The script ended: a step still open (work after the last closing
        event, or an iteration never completed) is closed if anything
        happened in it; the caller decides that."""
        return self._close()
