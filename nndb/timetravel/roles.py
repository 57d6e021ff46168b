"""What a replica process is for: its *role*, set as ``session.replica``.

* ``Goto``: replay silently to a step boundary, then stop there and give the
  terminal to the user (reverse-step, goto, reverse-continue).  From then on
  the replica is a debugger session "in the past"; leaving it (``present``,
  another ``goto``, the script's end) hands the session state back.
* ``Scan``: replay a range of steps silently, noting at each step end what
  was asked (which breakpoints hit, an expression's value, the statistics),
  then report and end.  Never prompts.
* ``Predict``: run N steps ahead of the current state, noting loss, gradient
  norm, findings and breakpoint hits per step, then report and end.
* ``Measure``: run on from a checkpoint measuring everything, report one
  series' histogram from the first record after it, and end
  (nndb.timetravel.measure).

Every role ends its process with ``os._exit``: a replica never closes the
trace file it shares with the live run, never runs atexit handlers, and
never returns into the live run's code paths.

Why this size: one protocol, read whole: the four roles are the same
replica's answers to the session's events (``before_stops``, ``after_stops``,
``intercept``, ``run_ended``), written against ``Role``'s silence, progress
line and hand-back; a role in a file of its own would be read beside this
one every time.
"""
from __future__ import annotations

import copy
import math
import os
import sys
import time
from typing import Optional

from ..debugger import evaluate as E
from ..debugger.changes import Change, due, not_as_made
from ..debugger.hyperparams import undone
from ..debugger.stoppoints import Stop
from ..run.preload import forget_openmp
from ..text import is_not_measured
from . import forking, sandbox
from .compare import step_grad_norm


CLEAR = "\r\033[K"          # (the cursor to the line's start, the line erased)
STAY = "leaves you where you were"


def progress_line(done: int, total: int, elapsed: float, doing: str = "replaying", ctrl_c: str = STAY) -> str:
    """A replica's line while it works: steps done of the total, the time
    left at the rate so far, and what Ctrl-C does."""
    eta = f", about {elapsed / done * (total - done):.0f} s left" if done > 0 and total > done else ""
    return f"nndb: {doing}: {done} of {total} step(s){eta}; Ctrl-C stops it and {ctrl_c}"


def finish(chan, msg: dict) -> None:
    """Send the last message and end this replica."""
    if sandbox.ACTIVE is not None and sandbox.ACTIVE.writes:
        msg = dict(msg, scratch_writes=sandbox.ACTIVE.writes)
    if sandbox.ACTIVE is not None and sandbox.ACTIVE.stale:
        msg = dict(msg, stale_reads=list(sandbox.ACTIVE.stale))
    try:
        chan.send(msg)
    finally:
        sandbox.cleanup()
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:
                pass
        forget_openmp()
        os._exit(0)


class Role:
    kind = "replica"
    prompts = False          # stops reach the user
    replaying = True         # silent, no stops, no rule output
    notes_module_hits = False    # while replaying, module breakpoints are checked (and noted)

    def __init__(self, chan, goal: dict):
        self.chan = chan
        self.goal = goal
        self.saved_fds = None
        # {step: [[loss series, recorded mean], ...]}: what the live run recorded
        # for the steps this replica replays (JSON keys are strings)
        self.expect = {int(k): v for k, v in (goal.get("expect") or {}).items()}
        self._checked = None
        self.in_last_bits = False        # (the last divergence: a difference in the last bits, replays inexact)
        self._started = self._progress_at = time.monotonic()
        self._progress_fd: Optional[int] = None      # the terminal, while silenced (begin)
        self._shown = False
        # the changes made at the live run's prompt after the checkpoint: made again at their steps
        self.changes = [Change.from_dict(d) for d in goal.get("changes") or []]
        self._remade_at: set = set()

    def remake(self, s, step: int) -> None:
        """At the end of ``step``: make again the changes the live run made
        there (or inside the next step), once; a replica whose timeline was
        changed has left the run's history and makes none."""
        if step in self._remade_at or (s.machine is not None and s.machine.changed):
            return
        self._remade_at.add(step)
        for change in due(self.changes, step):
            why = s.remake(change)
            if why is not None:
                message = f"nndb: the replay could not make the change {change.describe()} again: {why}"
                if self.replaying:
                    self.give_up(s, message + "; nothing was changed")
                s.error(message)

    # (a difference this small, where replays are known not to be exact, is that: the last bits)
    LAST_BITS = 1e-5

    def _cause(self, step: int, want: float = math.nan, have: float = math.nan) -> str:
        """Why a replay diverged at ``step``: the user's own change, where the
        replay did not make one where it was made; a difference in the last bits
        where replays are not exact (the live run's reason, ``inexact``); else what
        a replay cannot hold."""
        src = self.goal.get("replayed_from")
        moved = not_as_made(self.changes, step, has_start=False)
        if moved:
            return ("the change" + ("s" if len(moved) > 1 else "") + " made at the prompt "
                    + ", ".join(c.describe() for c in moved)
                    + ": a replay runs from step end to step end, and makes a change made inside a step at "
                      "the end of the step before (one made at the start, when respawned, not at all)")
        inexact = self.goal.get("inexact")
        self.in_last_bits = bool(inexact) and abs(have - want) <= self.LAST_BITS * max(abs(want), abs(have))
        if self.in_last_bits:
            # (it said 'randomness the checkpoint does not hold, a file that changed since, or
            # threads' and named the files the run wrote: the Trainer's checkpoint-6, which it never read)
            return f"replays are not exact here, and the two differ in the last bits: {inexact}"
        threads = forking.script_threads(own_code=True)
        if threads:
            # (the replica's own: the script started them again; seeding cannot order them)
            return (f"the script's threads ({threads}) run beside the training loop: where they draw random "
                    "numbers (torch's global generator) or change what the loop reads, the two interleave "
                    "differently from run to run, under plain Python too; else "
                    + ("unseeded randomness" if src is None else "randomness the checkpoint does not hold")
                    + " or a file that changed since")
        if src is None:
            return ("unseeded randomness (a respawned replay runs the script again: seed torch, "
                    "random and numpy, or use fork replicas), a file that changed since, or threads")
        return "randomness the checkpoint does not hold, a file that changed since, or threads"

    def diverged(self, s) -> Optional[str]:
        """The newest record, compared with the recorded run: a message at the
        first difference, else None."""
        rec = s.record
        if rec is None or rec is self._checked or rec.step not in self.expect:
            return None
        self._checked = rec
        got = {n: float(row[1]) for (n, k), row in zip(rec.names, s.view.stats_of(rec)) if k == "loss"}
        for name, want in self.expect[rec.step]:
            have = got.get(name)
            want = math.nan if want is None else float(want)
            if have is None or not (have == want or (math.isnan(have) and math.isnan(want))):
                cause = self._cause(rec.step, want, math.nan if have is None else have)
                return (f"nndb: the replay diverged from the recorded run at step {rec.step}: {name} recorded "
                        f"{want!r}, replayed {'nothing' if have is None else repr(have)} (likely cause: "
                        f"{cause}); nothing was changed")
        return None

    def replay_until(self, s, step: int, target: int) -> bool:
        """While replaying, at the end of ``step``: checked against the record (a
        difference gives up); True while before ``target`` (skip it), False once
        there (the replay is over)."""
        wrong = self.diverged(s)
        if wrong:
            self.give_up(s, wrong, drift=True)
        if step < target:
            self.progress(*self.replayed(step))
            return True
        self.replaying = False
        return False

    PROGRESS_EVERY_S = 0.5
    PROGRESS_AFTER_S = 1.0           # (a short replay shows none)
    doing = "replaying"

    def replayed(self, step: int) -> tuple:
        """(steps replayed, steps to replay) at the end of ``step``, counted as
        the stop line counts them: from the checkpoint's step (from the start: -1)."""
        src = self.goal.get("replayed_from")
        first = -1 if src is None else int(src)
        return step - first, int(self.goal.get("target", self.goal.get("end", step))) - first

    def progress(self, done: int, total: int) -> None:
        """Where the work is, on one line of the terminal (interactive only),
        drawn by this process (the live run waits): cleared before this
        process prints anything (``_unsilence``), so nothing is glued to it."""
        now = time.monotonic()
        if self._progress_fd is None or now - self._progress_at < self.PROGRESS_EVERY_S \
                or now - self._started < self.PROGRESS_AFTER_S:
            return
        self._progress_at = now
        text = progress_line(done, total, now - self._started, self.doing, self.goal.get("ctrl_c") or STAY)
        # (shown before the write: the write wakes the terminal's reader, the replica may lose the
        # core there, and a Ctrl-C then gave up the replay with the line left on the terminal and
        # 'nndb: interrupted ...' glued to it)
        self._shown = True
        _write(self._progress_fd, CLEAR + text)

    def _unsilence(self) -> None:
        """The line off the terminal, then fds 1 and 2 back (before anything is printed)."""
        if self._shown:
            _write(self._progress_fd, CLEAR)
            self._shown = False
        self._progress_fd = None
        forking.unsilence(self.saved_fds)
        self.saved_fds = None

    def interruptible(self) -> bool:
        """Ctrl-C ends this replica's work (a replay, a scan, a prediction)
        rather than stopping in it."""
        return self.replaying or self.kind in ("scan", "predict")

    def interrupted(self, s) -> None:
        self.give_up(s, "nndb: interrupted (Ctrl-C); nothing was changed")

    def give_up(self, s, message: str, drift: bool = False) -> None:
        """A replay that diverged ends here; the live run says why (``drift``: a replayed
        step's loss differed from the recorded one's)."""
        self._unsilence()
        # (the files the run wrote are no likely cause of a difference in the last bits)
        drift = drift and not self.in_last_bits
        finish(self.chan, {"op": "handback", "next": "diverged", "message": message, "drift": drift,
                           "state": s.snapshot()})

    def begin(self, s) -> None:
        self.saved_fds = forking.silence()
        if s.interactive and os.isatty(self.saved_fds[1]):
            self._progress_fd = self.saved_fds[1]

    def before_stops(self, s, step: int):
        """At a step end, before the breakpoints are checked: return a Stop to
        stop here, "skip" to check nothing, None to check as usual."""
        return None

    def intercept(self, s, stop: Stop) -> bool:
        """A stop is about to prompt: True if the role takes it instead."""
        return not self.prompts

    def ordinal(self, s) -> Optional[int]:
        """The ordinal of the stop inside a step the user is at, where known (Goto)."""
        return None

    def count_in_step(self, s, step: int) -> None:
        """A place inside ``step`` where points held that no stop took (an ignore count swallowed
        it; Session.count_in_step): counted where the role counts a step's stops (Goto)."""

    def after_stops(self, s, step: int) -> None:
        pass

    def resuming(self, s) -> None:
        """A command at the prompt resumes the run (continue, next, step, ...)."""

    def arrived(self, s, stop: Stop):
        """Resumed from a checkpoint taken at a stop (the prompt of step
        ``stop.step``): the stop to show now, or None to run on."""
        self.remake(s, stop.step)
        r = self.before_stops(s, stop.step)
        if isinstance(r, Stop):
            return r
        if r is None and stop.hits:
            self.intercept(s, stop)            # (a scan notes the hits of the stop it resumed at)
        s.reset_run_control()
        return None

    def run_ended(self, s, status: str, reason: str) -> None:
        # quit and run act on the live run; kill (or the script's end) ends this replica
        nxt = "quit" if s.quit_requested else "run" if s.restart_requested else "present"
        # ("short": the script ended before the replay reached the step it went to, where the run went on)
        finish(self.chan, {"op": "handback", "next": nxt, "state": s.snapshot(),
                           "ended": status, "reason": reason, "short": self.replaying})


class Goto(Role):
    kind = "goto"

    def __init__(self, chan, goal: dict):
        super().__init__(chan, goal)
        self.target = int(goal["target"])
        # "points": arm the breakpoints at the target and go on (reverse-continue
        # to a hit inside the next step) instead of stopping there
        self.then = goal.get("then", "stop")
        # "again": as "points", to the stop inside the next step where the user was (reverse-continue
        # found nothing before it): its hits there are no new crossings
        self.again = self.then == "again"
        if self.again:
            self.then = "points"
        # "points": the stop is the (skip+1)-th inside that step (reverse-continue to a module
        # breakpoint called several times in a step: the newest call, not the first); nth: the
        # ordinal of the last stop inside a step, in step nth_step (as a scan counts them)
        self.skip = int(goal.get("skip", 0))
        self.nth, self.nth_step = -1, None
        # the live run's last finished step: the recorded past ends there (after the run's end,
        # at the script's end: no stop at that step then)
        self.present = goal.get("present")
        self.stop_at = None if goal.get("ended") else self.present
        self.forward_goto: Optional[int] = None     # 'goto N' forward, running as 'until N'
        self._said_stale: set = set(goal.get("stale_told") or ())

    def recorded(self, s) -> bool:
        """This timeline is the recorded run's (nothing was changed in the past)."""
        return s.machine is None or not s.machine.changed

    def say_stale(self, s) -> None:
        """The files read so far as they are now, where the live run rewrote them after the
        replay's start (sandbox.Sandbox.stale): said once each, as the past shows a stop."""
        box = sandbox.ACTIVE
        new = [p for p in (box.stale if box is not None else ()) if p not in self._said_stale]
        if new:
            self._said_stale.update(new)
            s.error(sandbox.stale_note(new, self.goal.get("replayed_from")))

    def _loud(self, s) -> None:
        """The output back (once): as the past shows its first stop."""
        if self.saved_fds is not None:
            self._unsilence()
        self.say_stale(s)

    def before_stops(self, s, step: int):
        if not self.replaying:
            self._loud(s)
            # Run on from the target at the prompt: while the timeline is the recorded run's, each
            # step it recorded is checked as a replayed one is (a step that differs is no past).
            if self.recorded(s):
                wrong = self.diverged(s)
                if wrong:
                    self.give_up(s, wrong, drift=True)
                if self.stop_at is not None and step > self.stop_at:
                    self.end_of_history(s)       # (from inside the present's step: its end is no past)
            return None
        if self.replay_until(s, step, self.target):
            return "skip"
        self.prompts = True
        s.sync_hooks()
        if self.then == "points":
            # (silent still, to the stop inside the next step: what the script prints on the way the live
            # run printed; it showed the end of that step's iteration again, 'it 1 ...' on the way to
            # step 2's module breakpoint)
            return "skip"
        self._loud(s)
        src = self.goal.get("replayed_from")
        how = f"{step - src} step(s) replayed from the checkpoint at step {src}" if src is not None \
            else f"{step + 1} step(s) replayed from the start"
        why = self.goal.get("why")
        return Stop("past", step, note=f"{why}; {how}" if why else how)

    def after_stops(self, s, step: int) -> None:
        """At the present's step end, on the recorded run's timeline, the run is about to go on
        past the present (a stop there, if any, has been and gone): the past ends here."""
        if self.replaying or self.stop_at is None or step < self.stop_at or not self.recorded(s):
            return
        if self.then == "points" and step == self.target:
            return                    # (reverse-continue to a hit inside the step the live run is in)
        self.end_of_history(s)

    def resuming(self, s) -> None:
        """At or past the present's step end (a goto or reverse-continue that arrived there):
        nothing recorded is ahead."""
        self.forward_goto = None
        if not self.replaying and self.stop_at is not None and s.last_step is not None \
                and s.last_step >= self.stop_at and self.recorded(s):
            self.end_of_history(s)

    def end_of_history(self, s) -> None:
        """gdb's record-full at the end of its log: forward in the past stops at
        the present; the live run, stopped there, takes the terminal back.
        (Until 2026-12 the replica ran on to the script's end, its steps
        past the present unchecked and shown as the past, and the live run
        then printed them again.)"""
        where = f"the end of step {self.present} (the present is inside step {self.present + 1})" \
            if self.goal.get("present_inside") else f"step {self.present}, the present"
        self._loud(s)
        s.message(f"No more reverse-execution history: the past ends at {where}.")
        s.machine.hand_back(s, "present")

    def intercept(self, s, stop: Stop) -> bool:
        taken = self._intercept(s, stop)
        if not taken:
            self._loud(s)                    # (the stop is shown)
        return taken

    def _intercept(self, s, stop: Stop) -> bool:
        if self.replaying or not stop.hits:
            return self.replaying
        if not stop.at_step_end:
            self.count_in_step(s, stop.step)
        if self.skip > 0 or self.again:
            # (on the way to the stop reverse-continue found, or where the user was: no new crossing)
            for p, _ in stop.hits:
                p.hits = max(0, p.hits - 1)
            if self.skip > 0 and not stop.at_step_end:
                self.skip -= 1
                return True
            self.again = False
        return False

    def count_in_step(self, s, step: int) -> None:
        if not self.replaying:
            self.nth = self.nth + 1 if step == self.nth_step else 0
            self.nth_step = step

    def ordinal(self, s) -> Optional[int]:
        """The ordinal of the stop inside a step the user is at (for reverse-continue from it),
        or None where it is not known."""
        stop = s.here.stop
        if stop is None or stop.at_step_end or not stop.hits or stop.step != self.nth_step:
            return None
        return self.nth

    def run_ended(self, s, status: str, reason: str) -> None:
        if self.replaying:
            self._unsilence()
            s.error(f"nndb: the replay ended ({status}: {reason}) before reaching step {self.target}")
        else:
            self._loud(s)
            if s.quit_requested or s.restart_requested:
                pass                           # (the live run carries them out)
            elif s.kill_requested:
                s.message("nndb: the replica is killed; back to the present.")
            elif status != "killed":
                s.message(f"nndb: the script ended on this timeline ({status}); back to the present.")
        super().run_ended(s, status, reason)


class Scan(Role):
    kind = "scan"

    def __init__(self, chan, goal: dict):
        super().__init__(chan, goal)
        self.start = int(goal.get("from", 0))
        self.end = int(goal["end"])
        self.exprs = [(src, E.compile_expr(src)) for src in goal.get("exprs", [])]
        self.want_points = bool(goal.get("points"))
        self.notes_module_hits = self.want_points
        self.want_stats = bool(goal.get("stats"))
        self.lineage_steps = {int(x) for x in goal.get("lineage", [])}
        self.resolve = list(goal.get("resolve", []))
        self.result = {"hits": [], "values": [], "stats": [], "last": None, "lineage": {}, "resolved": {}}
        self._last_record = None

    def begin(self, s) -> None:
        super().begin(s)
        if self.want_points:
            # Every hit as it held (the condition's verdict): reverse-continue spends the ignore
            # counts itself, newest hit first, as gdb counts crossings in reverse
            # (search.reverse_continue_target); here they were spent oldest first.
            for number in s.points:
                s.points.by_number(number).ignore_count = 0
            # A watch this process's own checkpoint did not have judged no step here: it starts as
            # the live run's would have been at the checkpoint (search.primed_watches)
            for number, state in (self.goal.get("primed") or {}).items():
                p = s.points.get(int(number))
                if p is not None and not p.checked and not p.checked_late and hasattr(p, "band"):
                    p.band.clear()
                    p.band.update(copy.deepcopy(state["band"]))
                    p.streak.clear()
                    p.streak.update(state["streak"])
        if self.lineage_steps and s.lineage is not None:
            s.lineage.forced = set(self.lineage_steps)
            if s.last_step is not None:
                s.lineage.refresh(s.last_step + 1)

    def before_stops(self, s, step: int):
        wrong = self.diverged(s)
        if wrong:
            self.give_up(s, wrong, drift=True)
        self.progress(*self.replayed(step))
        if step < self.start:
            return "skip"
        self.result["last"] = step
        if self.exprs:
            frame = s.stop_frame()
            for src, code in self.exprs:
                try:
                    v = E.evaluate(code, frame, s.view.variables(frame, step_end=True))
                    self.result["values"].append([step, src, bool(v), None])
                except Exception as e:
                    self.result["values"].append([step, src, None, str(e)])
        if step in self.lineage_steps and s.lineage is not None:
            self._lineage(s, step)
        if self.want_stats:
            # Each record once, under its own step: a hand-written loop's record
            # of step N is closed at the end of step N+1.
            rec = s.record
            if rec is not None and rec is not self._last_record and rec.step >= self.start:
                self._last_record = rec
                rows = [[n, k, [None if math.isnan(x) else x for x in map(float, row)],
                         [x != x for x in map(float, row)]] for (n, k), row in zip(rec.names, rec.stats)]
                self.result["stats"].append([rec.step, rows])
        return None if self.want_points else "skip"

    def arrived(self, s, stop: Stop):
        """Resumed from a checkpoint taken at a stop: that step end is checked
        again with the points as they are now (the stop's own hits were
        decided with the points of then: a breakpoint set later was not among
        them)."""
        self.remake(s, stop.step)
        r = self.before_stops(s, stop.step)
        if r is None:
            fresh = s.check_points_at_step_end(stop.step, s.record, s.step_record)
            hits = fresh + [h for h in stop.hits if h[0].number is None]      # (and its rule hits)
            if hits:
                self.intercept(s, Stop("breakpoint", stop.step, hits=hits))
        s.reset_run_control()
        return None

    def _lineage(self, s, step: int) -> None:
        data = s.lineage.live(step)
        if data is not None:
            self.result["lineage"][str(step)] = data
        frame = s.stop_frame()
        for src in self.resolve:
            try:
                v = E.evaluate(E.compile_expr(src), frame, s.view.variables(frame, step_end=True))
                tid = s.lineage.find(v, step)
                self.result["resolved"][src] = tid if tid is not None else \
                    f"{src} is not a tensor that step {step} made or used"
            except Exception as e:
                self.result["resolved"][src] = str(e)

    def intercept(self, s, stop: Stop) -> bool:
        if stop.hits:
            # nth: the ordinal of a stop inside a step among that step's (a module called twice)
            nth = sum(1 for h in self.result["hits"] if h["step"] == stop.step and not h["at_step_end"])
            self.result["hits"].append({"step": stop.step, "at_step_end": stop.at_step_end,
                                        "points": [p.number for p, _ in stop.hits if p.number is not None],
                                        "nth": nth})
        return True

    def after_stops(self, s, step: int) -> None:
        if step >= self.end:
            self._report(s, None)

    def _report(self, s, ended: Optional[str]) -> None:
        self._unsilence()
        finish(self.chan, {"op": "handback", "next": "scan", "result": self.result, "ended": ended})

    def run_ended(self, s, status: str, reason: str) -> None:
        self._report(s, f"{status}: {reason}")


class Predict(Role):
    kind = "predict"
    doing = "predicting"

    def __init__(self, chan, goal: dict):
        super().__init__(chan, goal)
        self.n = int(goal["steps"])
        self.rows: list = []
        self.findings_seen = 0
        self.watch: list = []           # [(label, read(), value before, value set)]: the --set changes
        self.undone: list = []
        self.said: set = set()          # the labels of the --set changes said in ``undone``
        self.live_checks: list = []     # [hyperparams.HoldCheck]: the sets made at the stop predicted from
        self.live_undone: list = []
        # A replica not forked at the stop (respawned: fork() unsafe there) replays to the end of
        # step ``at`` first, then makes the --set changes ``sets`` ([[key, value]]) and predicts.
        self.at = goal.get("at")

    def begin(self, s) -> None:
        super().begin(s)
        self.findings_seen = len(s.log.findings)
        self.replaying = self.at is not None      # (else breakpoints, watchpoints and rules are active)

    def before_stops(self, s, step: int):
        if not self.replaying:
            return None
        if self.replay_until(s, step, self.at):
            return "skip"
        self.findings_seen = len(s.log.findings)
        s.sync_hooks()
        from .settings import Setting, changes_for, make_changes
        try:
            changes = changes_for(s, [Setting(k, v) for k, v in self.goal.get("sets") or ()])
        except Exception as e:
            self.fail(str(e))
        make_changes(s, self, changes)
        return "skip"

    def after_stops(self, s, step: int) -> None:
        if self.replaying or (self.at is not None and step <= self.at):
            return
        rows = s.view.stat_rows()
        loss = next(iter(rows["loss"].values()), None)
        # (a NaN one makes the norm NaN: it was left out as one not measured is, and the
        # others' norm shown)
        grad_norm, clipped, why = step_grad_norm([(n, r.norm) for n, r in rows["grad"].items()
                                                  if not is_not_measured(r.norm)], _clipped_names(s))
        new = s.log.findings[self.findings_seen:]
        self.findings_seen = len(s.log.findings)
        self.rows.append({"step": step, "loss": None if loss is None else loss.mean,
                          "grad_norm": grad_norm, "clipped": clipped, "grad_norm_missing": why,
                          "findings": sorted({f["rule"] for f in new})})
        self.progress(len(self.rows), self.n)
        self._check_changes(step)
        if len(self.rows) >= self.n:
            self._report(None)

    def intercept(self, s, stop: Stop) -> bool:
        if self.replaying:
            return True
        if stop.hits:
            what = ", ".join(f"{p.type_name} {p.number if p.number is not None else p.rule.id}"
                             for p, _ in stop.hits)
            where = f"step {stop.step}" + ("" if stop.at_step_end else f" ({stop.module} {stop.phase})")
            self.stopped = f"{what} at {where}"
            if stop.at_step_end:
                self.after_stops(s, stop.step)     # (its row, then the report)
            self._report(self.stopped)
        return True

    def _check_changes(self, step: int) -> None:
        """After each step: each change still nearer the value set than the
        value before (a scheduler or the script may have set it back: at the
        next step, or at a later one, a loop that sets it at each epoch's
        start, PPO's annealing at each rollout's), each said once.  Under an
        LR scheduler, after the first step only (HoldCheck's: what the schedule
        gives, unchanged and followed from the change, is known for that step), but for one
        that does not follow the change (HoldCheck.every_step: its next step sets its own lrs)."""
        for check in self.live_checks:
            verdict = check.verdict(step)
            note = verdict.replace("nndb: warning: ", "", 1) if verdict else None
            if note and note not in self.live_undone:       # (a check said asks again with what it said)
                self.live_undone.append(note)
        for label, read, before, wanted, checks in self.watch:
            if label in self.said or (len(self.rows) > 1 and any(c.scheduled and not c.every_step for c in checks)):
                continue
            try:
                now = read()
            except Exception as e:
                self.said.add(label)
                self.undone.append(f"{label}: cannot read it after step {step} ({e})")
                continue
            if any(c.seen is not None for c in checks):
                back = any(c.seen is not None and c.undone_groups(c.seen, c.counts) for c in checks)
            else:
                back = undone(now, wanted, before)
            if back:
                self.said.add(label)
                self.undone.append(f"{label} did not hold: it was {now!r} after step {step} (before the "
                                   f"change {before!r})")

    def interrupted(self, s) -> None:
        self.fail("nndb: interrupted (Ctrl-C): no prediction; nothing was changed")

    def fail(self, message: str) -> None:
        """A change could not be made: no prediction."""
        self._unsilence()
        finish(self.chan, {"op": "predicted", "rows": [], "error": message})

    def _report(self, note: Optional[str], ended: Optional[str] = None) -> None:
        self._unsilence()
        finish(self.chan, {"op": "predicted", "rows": self.rows, "stopped": note, "ended": ended,
                           "undone": self.undone, "live_undone": self.live_undone})

    def run_ended(self, s, status: str, reason: str) -> None:
        self._report(None, f"the script ended ({status}: {reason})" if reason else
                     f"the script ended ({status}) after step {s.last_step}")


# How many steps past the checkpoint a replica runs at most to find a record
# of the series (a step not recorded, --every; a hand-written loop's record is
# closed at the next step's end).
REACH = 64


class Measure(Role):
    """Run on from a checkpoint, measuring everything; report one series'
    histogram from the first record after the checkpoint, then end."""
    kind = "measure"
    measures = True          # (the session measures all statistics and activations: sync_hooks)

    def __init__(self, chan, goal: dict):
        super().__init__(chan, goal)
        self.after = int(goal["after"])
        self.name, self.series_kind = goal["name"], goal["series_kind"]

    def begin(self, s) -> None:
        super().begin(s)
        s.rec.recorder.require(full=True, acts=True)
        s.rec.tracer.sync_forward()              # (the module hooks, for the next forward)

    def before_stops(self, s, step: int):
        wrong = self.diverged(s)
        if wrong:
            self.give_up(s, wrong, drift=True)
        rec = s.record
        if rec is not None and rec.step > self.after and rec.hist is not None:
            for (name, kind), row in zip(rec.names, rec.hist):
                if name == self.name and kind == self.series_kind and row[0] >= 0:
                    self._report({"step": int(rec.step), "hist": [int(x) for x in row]})
            names = sorted({n for n, k in rec.names if k == self.series_kind})
            shown = ", ".join(names[:8]) + (" ..." if len(names) > 8 else "")
            self._report({"error": f"step {rec.step} has no {self.series_kind} {self.name} "
                                   f"({self.series_kind} series there: {shown or 'none'})"})
        if step > self.after + REACH:
            self._report({"error": f"no step recorded within {REACH} steps after the checkpoint"})
        return "skip"

    def _report(self, result: dict) -> None:
        self._unsilence()
        finish(self.chan, {"op": "handback", "next": "measured", "result": result})

    def run_ended(self, s, status: str, reason: str) -> None:
        self._report({"error": f"the script ended ({status}) before a step after the checkpoint was recorded"})


def _clipped_names(s) -> Optional[dict]:
    """{clip series: the names of the parameters it clipped (None: not known)} of the
    session's last record (StepRecord.clip_params), or None."""
    clips = getattr(s.record, "clip_params", None)
    naming = getattr(s.rec, "naming", None)
    if not clips or naming is None:
        return None
    return {k: None if ps is None else tuple(naming.param_name(p) for p in ps) for k, ps in clips.items()}


def _write(fd: int, text: str) -> bool:
    try:
        os.write(fd, text.encode("utf-8", "replace"))
        return True
    except OSError:
        return False


def make_role(goal: dict, chan) -> Role:
    kinds = {"goto": Goto, "scan": Scan, "predict": Predict, "measure": Measure}
    return kinds[goal["kind"]](chan, goal)
