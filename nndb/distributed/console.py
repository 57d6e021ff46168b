"""The one prompt of an interactive distributed job (gdb's all-stop mode).

The job runs in a thread of the front (torch's launcher); this console,
in the main thread, reads the user's lines.  Every rank's session runs in
its worker with a remote front end (nndb.distributed.worker.RemoteFrontend): it
says when it is at its prompt and sends its output here.  While the ranks
run, Ctrl-C asks every rank to stop at the next step end (the all-stop
agreement, nndb.distributed.allstop); a job that does not stop within a few
seconds is shown as every rank's stack, and a second Ctrl-C ends it.

Commands of the console itself: ``rank [N]``; ``--ranks all|LIST`` of
the commands the table marks ``ranks="option"`` (``print``, ``stats``,
``where``, ``list``: one row or block per rank); run control
(``continue``, ``next``, ``until``, ``kill``, ``quit``) goes to every rank;
the commands it marks ``ranks="suffix"`` (breakpoints, watches, display,
the settings) go to every rank (``... rank N`` at the end: to rank N only);
everything else to the current rank.  The syntax is the table's
(nndb.commands.rankspec), so ``help`` and completion describe it.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Optional, Sequence

from ..commands import TABLE
from ..debugger.changes import Change, kept_before
from ..commands.rankspec import chosen, split_ranks, split_suffix
from ..errors import EXIT_USAGE, CommandError
from . import stacks
from .front import Front

_RESUME = {"c", "cont", "continue", "n", "next", "u", "until", "advance"}
_END = {"q", "quit", "kill", "k", "exit"}
_BACK = {"reverse-step", "rs", "reverse-next", "rn", "goto"}
_REPLICA = {"predict", "reverse-continue", "rc"}      # answered by a replica job (nndb.distributed.travel)
_NOT_ACROSS = {"timeline": "time travel", "timelines": "time travel", "s": "step", "step": "step",
               "run": "run", "r": "run", "detach": "detach"}
_STOP_WAIT_S = 3.0
_ABORT_WAIT_S = 10.0   # (quit with a rank held in a collective: its helper thread ends it after 1.5 s)
_HELLO_WAIT_S = 120.0   # (after the first rank's hello: the other nodes' ranks start with it, then import)


def _shown(rep: dict) -> str:
    return stacks.format_rank(rep) if "error" not in rep else f"rank {rep['rank']}: {rep['error']}"


def _across(word: str) -> str:
    """How the command table says ``word`` goes across ranks ("option", "suffix" or "")."""
    try:
        return TABLE.lookup(word.partition("/")[0]).ranks
    except CommandError:
        return ""


class Console:
    def __init__(self, front: Front, frontend, message: Callable[[str], None]):
        self.front = front
        self.fe = frontend
        self.say = message
        self.current = 0
        self._job_done = threading.Event()
        self.exit_code: Optional[int] = None
        self._error: Optional[BaseException] = None
        self._replaying = False
        self._last_out: dict = {}
        self.held: dict = {}     # rank -> where it waits (another rank stopped inside a step)
        self._queued: list = []  # the -x/-e lines not run yet

    def _read_line(self, prompt: str) -> Optional[str]:
        """The next startup line (-x, -e), else one typed at the prompt."""
        return self._queued.pop(0) if self._queued else self.fe.read_line(prompt)

    def _finished(self) -> bool:
        return self._job_done.is_set()

    def _agent(self, worker_argv, trace_dir) -> None:
        try:
            self.exit_code = self.front.run(worker_argv, trace_dir)
        except BaseException as e:          # (a usage error of the launcher: raised again in the main thread)
            self._error = e
        finally:
            self._job_done.set()

    def _launch(self, worker_argv: list, show: bool = True) -> None:
        self._job_done.clear()
        self.exit_code = None
        self._thread = threading.Thread(target=self._agent, args=(worker_argv, self._trace_dir), name="nndb-job",
                                        daemon=True)
        self._thread.start()
        n = self.front.options.nproc_per_node * int(self.front.options.nnodes.split(":")[-1])
        if not self.front.wait_hello(n, self._finished, _HELLO_WAIT_S):     # (every node's: nndb.distributed.nodes)
            why = (f"only {len(self.front.state.ranks)} of {n} ranks reached this nndb front within "
                   f"{_HELLO_WAIT_S:g} s of the first (does every node run nndb run?)")
            self.say(f"nndb: error: {why}")
            self.front.state.refused = why
            self.front._abort_all("killed", EXIT_USAGE, why)
            self._job_done.wait()
            return
        self._wait_stopped(show)

    def run(self, worker_argv: list, trace_dir: Optional[str], trace_path: Optional[str] = None,
            startup: Sequence[str] = ()) -> int:
        """``trace_path``: the job's --trace as the ranks' command line has it (a travel runs the
        job again with a fresh one: nndb.distributed.travel.fresh_trace); ``startup``: the
        ``-x``/``-e`` lines, run at the first prompt as if typed there."""
        self._queued = list(startup)
        self.front.interactive = True
        self._argv, self._trace_dir, self._trace_path = list(worker_argv), trace_dir, trace_path
        self._points: list = []              # the lines that set points on every rank (a replay sets them again)
        self._changes: list = []             # [changes.Change]: 'set' at a stop (a replay makes it again)
        self._warned = False
        self._launch(self._argv)
        while True:
            if not self.front.live_ranks():     # (every rank has ended: the launcher is finishing)
                self._job_done.wait()
            if self._finished():
                break
            try:
                line = self._read_line(f"(nndb r{self.current}) ")
            except KeyboardInterrupt:
                self.say("Quit")
                continue
            if line is None:
                line = "quit"
            if not line.strip():
                continue
            try:
                self.execute(line.strip())
            except KeyboardInterrupt:
                self.say("Quit")
        self._thread.join()
        if self._error is not None:
            raise self._error
        code = self.exit_code if self.exit_code is not None else 0
        self.say(f"nndb: the job ended (exit code {code})")
        return code

    # -- waiting for the ranks --------------------------------------------------------------------
    def _wait_stopped(self, show: bool = True) -> None:
        """Until every rank is at its prompt (or the job ended); Ctrl-C asks them to stop."""
        asked = False
        while True:
            try:
                if self._settle(None if not asked else _STOP_WAIT_S):
                    break
                self._show_stacks("nndb: not every rank stopped within "
                                  f"{_STOP_WAIT_S:g} s (a hang?); every rank's stack:")
                self.say("nndb: Ctrl-C again ends the job")
                self.front.wait(self.front.live_ranks(), finished=self._finished)
                break
            except KeyboardInterrupt:
                if asked:
                    self.say("nndb: ending the job")
                    self.front.state.interrupted = self.front.state.interrupted or []
                    self.front._abort_all("interrupted", 130, "KeyboardInterrupt (Ctrl-C twice at the nndb front)")
                    self._job_done.wait()
                    return
                asked = True
                self.front.interrupt()
                self.say("nndb: stopping every rank at the next step end (Ctrl-C again ends the job)")
        if self._finished() or not show:
            return
        self._show_stop()

    def _settle(self, timeout: Optional[float]) -> bool:
        """True once every rank is at its prompt, or some are and each other
        is held where it is (Front.settle: kept in ``held``); False after ``timeout``."""
        held = self.front.settle(self._finished, timeout)
        self.held = held or {}
        return held is not None

    def _stopped(self) -> list:
        return [r for r in self.front.live_ranks() if r not in self.held]

    def _show_stop(self) -> None:
        ranks = self._stopped()
        if not ranks:
            return
        if self.current not in ranks:
            self.current = ranks[0]
        steps = {self.front.state.ranks[r].stop_step for r in ranks}
        for r in ranks:
            out = self.front.take_output(r)
            if self._replaying:                 # (silent: only where the replay stopped)
                out = [(t, e) for t, e in out if not t.startswith("Stopped at the start of the run")]
                out = out[:1]
            if r == self.current:
                for text, _ in out:
                    self.say(text)
            elif out and "another rank stopped" not in out[0][0] and not out[0][0].startswith("Interrupted"):
                self.say(f"[r{r}] {out[0][0]}")
        raised = self._raised()
        if self.held:
            for r, coll in sorted(self.held.items()):
                self.say(f"nndb: rank {r} did not stop: it waits in {coll} (a stop inside a step leaves the "
                         f"other ranks where they are)")
            self.say(f"nndb: {len(ranks)} of {len(ranks) + len(self.held)} rank(s) stopped: "
                     + ", ".join(f"r{r}" for r in ranks))
        elif raised:
            self.say(f"nndb: all {len(ranks)} rank(s) stopped: " + ", ".join(
                f"r{r}" + (" (post-mortem)" if self.front.state.ranks[r].raised else "") for r in ranks))
        elif len(steps) == 1:
            step = steps.pop()
            at = f"at the end of step {step}" if step is not None else "at the start"
            self.say(f"nndb: all {len(ranks)} rank(s) stopped {at}")
        else:
            self.say("nndb: the ranks stopped at different steps: "
                     + ", ".join(f"r{r} {self.front.state.ranks[r].stop_step}" for r in ranks))
        if raised:
            self.say(f"nndb: post-mortem of {raised}: 'where', 'up', 'p', 'stats' look there; 'continue' "
                     f"or 'quit' ends the job")

    def _raised(self) -> str:
        """The stopped ranks at their post-mortem, for a line ('rank 1 (RuntimeError in step 2)'), or ''."""
        infos = [self.front.state.ranks[r] for r in self._stopped()]
        return ", ".join(f"rank {i.rank} ({i.raised} in step {i.stop_step})" for i in infos if i.raised)

    def _show_stacks(self, head: str) -> None:
        self.say("\n".join([head] + [_shown(r) for r in self.front.all_stacks()]))

    # -- one command ------------------------------------------------------------------------------
    def _on(self, rank: int, text: str) -> list:
        """Run ``text`` on a stopped rank; its output lines [(text, is_error)]."""
        if rank in self.held:               # (its main thread waits in a collective: only its stack is there)
            word = text.split()[0] if text.split() else ""
            if _across(word) == "option" and TABLE.lookup(word).name == "where":
                return [(_shown(rep), False) for rep in self.front.all_stacks() if rep["rank"] == rank]
            return [(f"rank {rank} is not at a stop: it waits in {self.held[rank]}", True)]
        self.front.send_line(rank, text)
        self.front.wait([rank], finished=self._finished)
        return self.front.take_output(rank)

    def _show(self, out: list) -> None:
        for text, _ in out:
            self.say(text)

    def _catch_up(self) -> None:
        """A rank left where it waited (another stopped inside a step) that came to a prompt by
        itself since, its script raised there (the collective it waited in timed out): it is at
        its post-mortem now, said before the next command (it was still taken for a waiting rank:
        'where' showed nndb's own prompt as its stack, and 'quit' ended it 'killed', exit code 0)."""
        came = [r for r in self.held if self.front.state.ranks[r].at_prompt]
        if came:
            for r in came:
                del self.held[r]
            self._show_stop()

    def execute(self, line: str) -> None:
        self._catch_up()
        word, _, rest = line.partition(" ")
        ranks = self.front.live_ranks()
        if word == "rank":
            if not rest.strip():
                self.say(f"rank {self.current} of {len(ranks)}")
                return
            if not rest.strip().isdigit() or int(rest) not in ranks:
                self.say(f"no rank {rest.strip()} (ranks: {', '.join(map(str, ranks))})")
                return
            self.current = int(rest)
            info = self.front.state.ranks[self.current]
            # (at the start stop no step has finished: it read 'rank 1: step None')
            self.say(f"rank {self.current}: " + ("not at a stop" if not info.at_prompt else
                                                 f"at its post-mortem ({info.raised} in step {info.stop_step})"
                                                 if info.raised else
                                                 "at the start, no step finished" if info.stop_step is None
                                                 else f"step {info.stop_step}"))
            return
        if word in _BACK:
            self._travel(word, rest.strip(), ranks)
            return
        if word in _REPLICA:
            step = self._stopped_step(ranks)
            if step is not None:
                from . import travel
                if word == "predict":
                    travel.predict(self, rest, ranks, step)
                else:
                    travel.reverse_continue(self, ranks, step)
            return
        if word in _NOT_ACROSS:
            what = _NOT_ACROSS[word]
            self.say("timelines are not kept across ranks (time travel across ranks runs the job again)"
                     if what == "time travel" else
                     f"'{word}' is not available across ranks yet (stops inside a step cannot be agreed "
                     f"on by every rank)" if what == "step" else f"'{word}' is not available across ranks yet")
            return
        across = _across(word)
        if across == "option" and "--ranks" in rest:
            try:
                which, rest = split_ranks(rest)
                if which is not None:
                    self._side_by_side((word + " " + rest).strip(), chosen(which, ranks))
                    return
            except CommandError as e:
                self.say(str(e))
                return
        if word in _RESUME and self._raised():
            # (a rank's script raised: its run cannot go on, as in one process, and the
            # job cannot go on without it; the others would break in its collectives)
            self.say(f"nndb: the job cannot go on past {self._raised()}: ending it")
            word = "kill"
        if word in _END:
            # A rank held in a collective by another's stop inside a step reads no line: it is
            # ended first, from its helper thread (its trace closed "killed", exit code 0), so
            # that the stopped ranks' end does not break its collective under it (it was
            # "rank 0 failed: exit code 1 (RuntimeError: ... Connection closed by peer)",
            # its trace "failed", the job's exit code 1, for a quit).  A rank at its
            # post-mortem ends as its script did: failed, its exit code the job's.
            held = [r for r in ranks if r in self.held]
            if held:
                self.front.abort(held, "killed", 0, "killed from the debugger")
                self.front.wait(held, timeout=_ABORT_WAIT_S, finished=self._finished)
            for r in ranks:
                if r not in held:
                    self.front.send_line(r, "kill")
            self._job_done.wait()
            return
        if word in _RESUME:
            for r in self._stopped():     # (a held rank runs on by itself)
                self.front.send_line(r, line)
            self._wait_stopped()
            return
        if across == "suffix" and TABLE.lookup(word).name == "commands":
            self._commands(line, ranks)
            return
        if across == "suffix":
            targets, text = self._targets(line, ranks)
            outs = {r: self._on(r, text) for r in targets}
            if not any(e for out in outs.values() for _, e in out):
                if word == "set":
                    at = self.front.state.ranks[self.current].stop_step
                    self._changes.append(Change(line, at, "start" if at is None else "end"))
                else:
                    self._points.append(line)
            first = next(iter(outs.values()), [])
            self._show(first)
            for r, out in list(outs.items())[1:]:
                if [t for t, e in out if e] and out != first:
                    self._show([(f"[r{r}] {t}", e) for t, e in out])
            return
        self._show(self._on(self.current, line))

    def _commands(self, line: str, ranks: list) -> None:
        """``commands [N] [rank R]``: the block is read here once, then given
        to every rank's breakpoint N (or rank R's), as if typed there."""
        targets, text = self._targets(line, ranks)
        where = f"rank {targets[0]}" if len(targets) == 1 else "every rank"
        self.say(f'Type commands for when the breakpoint is hit (on {where}), one per line.\n'
                 'End with a line saying just "end".')
        block = []
        while True:
            got = self._read_line(">")
            if got is None:
                self.say("'commands' without a closing 'end'")
                return
            block.append(got.strip())
            if got.strip() == "end":
                break
        errors = {}
        for r in targets:
            out = self._on(r, text)
            for typed in block:
                out += self._on(r, typed)
            errors[r] = [t for t, e in out if e]
        if not any(errors.values()):
            self._points.append("\n".join([line] + block))
        for r, errs in errors.items():
            self._show([(f"[r{r}] {t}" if len(targets) > 1 else t, True) for t in errs])

    @staticmethod
    def _targets(line: str, ranks: list):
        """A point's ranks: every rank, or the one named by ``... rank N``; and the line without it."""
        which, text = split_suffix(line)
        if which is None:
            return ranks, line
        return [r for r in ranks if r == int(which)], text

    # -- time travel: the whole job again, to the step ----------------------------------------------
    def _travel(self, word: str, arg: str, ranks: list) -> None:
        """``reverse-step [K]`` / ``goto N``: fork checkpoints cannot share a
        process group, so every rank is respawned (the job is run again from
        its start, in a new run directory) and runs silently to the end of
        the target step, where the points are set again."""
        step = self._stopped_step(ranks)
        if step is None:
            return
        try:
            if word == "goto":
                target = int(arg)
            else:
                target = step - (int(arg) if arg else 1)
        except ValueError:
            self.say(f"usage: {word} {'N' if word == 'goto' else '[K]'}")
            return
        if target < 0:
            self.say(f"there is no step {target}: the job's first step is 0")
            return
        if target > step:
            self.say(f"step {target} is ahead: 'until {target}' runs to it")
            return
        if not self._warned:
            self._warned = True
            self.say("nndb: across ranks, time travel runs the whole job again from its start (every rank "
                     "respawned, a new run directory): it lands on the same values when the script is "
                     "deterministic (seeded; CPU and gloo); nndb checks each rank's loss and parameters at the "
                     "step against the run before")
        from . import travel
        t0 = time.monotonic()
        for r in ranks:
            self.front.send_line(r, "kill")
        self._job_done.wait()
        self._thread.join()
        for r in ranks:
            self.front.take_output(r)
        paths = {r: self.front.state.ranks[r].trace for r in ranks if self.front.state.ranks[r].trace}
        before, weights = travel.trace_losses(paths, target), travel.trace_weights(paths, target)
        keep = kept_before(self._changes, target)
        if self._trace_path:           # (--trace: the job run again writes beside the run before, not over it)
            fresh = travel.fresh_trace(self._trace_path)
            self._argv = travel.with_trace(self._argv, self._trace_path, fresh)
            self._trace_path = fresh
            self.say(f"nndb: the job run again records to {fresh}")
        self._replaying = True
        try:
            self._launch(travel.without_run_flag(self._argv), show=False)    # (every rank at its start stop)
            why = None if self._finished() else travel.to_step(self, self.front.live_ranks(), target, keep,
                                                                         self._targets)
        finally:
            self._replaying = False
        if self._finished():
            return
        if why:
            self.say(f"nndb: {why}")
            return
        # (gdb keeps the points: set again, each on its ranks, with its commands block)
        travel.set_points(self, self._targets, self.front.live_ranks(), self._points)
        for change in self._changes:
            if change not in keep:
                self.say(f"nndb: {change.describe()} is not made again: the job is at the end of step {target} "
                         f"as it ran there")
        self._changes = keep
        for text, err in self._last_out.get(self.current, []):
            if not err and not text.startswith("Stopped at the start of the run"):
                self.say(text)
        self.say(f"nndb: all {len(self.front.live_ranks())} rank(s) stopped at the end of step {target}")
        self.say(travel.check_travel(self, self.front.live_ranks(), target, before, weights))
        self.say(f"nndb: the job is at step {target} again ({time.monotonic() - t0:.1f} s)")

    # -- what nndb.distributed.travel drives: this job's ranks, as a replica job's ------------------------
    def on(self, rank: int, line: str) -> list:
        return self._on(rank, line)

    @property
    def argv(self) -> list:
        """The ranks' command line (a replica job runs the same)."""
        return self._argv

    @property
    def changes(self) -> list:
        """[nndb.debugger.changes.Change]: the job's changes made at stops (a replay makes them again)."""
        return self._changes

    @property
    def point_lines(self) -> list:
        """The lines that set the job's points (a replica job sets them again)."""
        return self._points

    targets = staticmethod(_targets.__func__)

    def travel(self, word: str, arg: str, ranks: list) -> None:
        self._travel(word, arg, ranks)

    def resume(self, line: str) -> dict:
        """A run-control line on every rank; their output at the next all-stop ({} if the job ended)."""
        ranks = self.front.live_ranks()
        for r in ranks:
            self.front.send_line(r, line)
        self.front.wait(ranks, finished=self._finished)
        if self._finished():
            return {}
        self._last_out = {r: self.front.take_output(r) for r in ranks}
        return self._last_out

    def stop_step(self) -> Optional[int]:
        steps = {self.front.state.ranks[r].stop_step for r in self.front.live_ranks()}
        return steps.pop() if len(steps) == 1 else None

    def _stopped_step(self, ranks: list) -> Optional[int]:
        """The step at whose end every rank stopped (else None, said): where
        time travel across ranks starts, on one node (it starts every rank again)."""
        if not self.front.options.single_node():
            self.say("time travel across nodes is not available: it starts every rank again, and node 0 "
                     "cannot start another node's ranks")
            return None
        now = {self.front.state.ranks[r].stop_step for r in ranks}
        if self.held:
            now = {None}
        if len(now) != 1 or None in now:
            self.say("time travel across ranks starts from a step end where every rank stopped")
            return None
        return now.pop()

    def _side_by_side(self, cmd: str, ranks: list) -> None:
        from tabulate import tabulate
        outs = {r: [t for t, _ in self._on(r, cmd)] for r in ranks}
        if all(len(o) <= 1 for o in outs.values()):
            self.say(tabulate([[f"r{r}", o[0] if o else ""] for r, o in outs.items()],
                              headers=["rank", cmd], disable_numparse=True))
            return
        for r, o in outs.items():
            self.say(f"-- rank {r} --")
            for t in o:
                self.say(t)
