"""``nndb run --nproc-per-node N ... SCRIPT``: the front process.

The job is started by torch's own launcher, ``torch.distributed.run``
(torchrun) imported as a library: the flags are turned into torchrun's
argument list, parsed by its parser and run by its ``run`` (elastic_launch),
so they mean what they mean to torchrun.  Every worker is
``python -u -m nndb run --batch ... SCRIPT ARGS`` (the worker's nndb flags),
with NNDB_FRONT_SOCKET/NNDB_FRONT_SECRET in its environment
(nndb.distributed.worker connects back) and, on one node without ``--trace``, the
run directory the front chose (NNDB_RUN_DIR): one trace per rank in it.

The front listens on a Unix socket in a fresh directory only its user can
enter (node 0 of a job of several nodes: on TCP too, on the nodes'
interface, found through torchrun's store, the secret given out of band:
nndb.distributed.nodes and docs/distributed.md), and checks each worker's proof of
the per-job secret, nndb version and script digest.  With ``--hang-timeout SECS`` a watchdog asks every rank for its
Python stacks when no rank has finished a step for SECS seconds, prints
them, keeps them for the report, ends the job and exits with EXIT_HANG (5).
"""
from __future__ import annotations

import logging
import os
import secrets
import signal
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..errors import EXIT_HANG, EXIT_OK, EXIT_SCRIPT_ERROR, EXIT_SIGINT, EXIT_SIGTERM, EXIT_USAGE, UsageError
from ..timetravel.channel import Channel
from ..version import __version__
from . import nodes, stacks
from .judge import LiveJudge
from ..run.rank import JOB_ID_ENV, RUN_DIR_ENV, claim_run_dir, run_dir_name
from .worker import REPLICA_JOB_ENV, SECRET_ENV, SOCKET_ENV, script_digest

_STACKS_WAIT_S = 5.0
_POLL_S = 0.5
_HELD_POLLS = 3          # (a rank not at its prompt: seen at the same place this many polls running)
_START_S = 60.0          # the watchdog's patience before the job's first step


@dataclass
class LaunchOptions:
    """torchrun's flags (same names and meaning) and the front's own."""
    nproc_per_node: int
    nnodes: str = "1"
    node_rank: int = 0
    rdzv_backend: Optional[str] = None
    rdzv_endpoint: Optional[str] = None
    rdzv_id: Optional[str] = None
    rdzv_conf: Optional[str] = None
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    max_restarts: int = 0
    hang_timeout: Optional[float] = None
    log_dir: Optional[str] = None       # a replica job (nndb.distributed.replica): the workers' output goes here

    def single_node(self) -> bool:
        return self.nnodes.split(":")[-1].strip() == "1"

    def follower(self) -> bool:
        """A node other than node 0 of a job of several: its ranks report to node 0's front."""
        return not self.single_node() and self.node_rank > 0

    def torchrun_argv(self, worker_argv: list) -> list:
        a = ["--nproc-per-node", str(self.nproc_per_node), "--nnodes", self.nnodes,
             "--node-rank", str(self.node_rank), "--max-restarts", str(self.max_restarts),
             "--signals-to-handle", "SIGTERM,SIGHUP,SIGQUIT"]      # (Ctrl-C is the front's: Front.run)
        if self.single_node() and not self.rdzv_endpoint and not self.rdzv_backend and not self.master_port:
            a.append("--standalone")       # (torchrun's own one-node default: a free port, a fresh run id)
        for flag, value in (("--rdzv-backend", self.rdzv_backend), ("--rdzv-endpoint", self.rdzv_endpoint),
                            ("--rdzv-id", self.rdzv_id), ("--rdzv-conf", self.rdzv_conf),
                            ("--master-addr", self.master_addr), ("--master-port", self.master_port)):
            if value is not None:
                a += [flag, str(value)]
        if self.log_dir:
            a += ["--log-dir", self.log_dir, "--redirects", "3"]
        # ('--': what follows is the worker's command line, the script's arguments with it; torchrun's
        # parser took a script's --n for an ambiguous abbreviation of --nnodes/--nproc-per-node...:
        # torchrun's usage and exit code 2, where python gives the script its --n)
        return a + ["--module", "--", "nndb"] + list(worker_argv)


def check_options(o: LaunchOptions) -> None:
    """Bad flags: one line (UsageError) before anything starts."""
    if o.nproc_per_node < 1:
        raise UsageError(f"--nproc-per-node must be at least 1, not {o.nproc_per_node}")
    try:
        lo, _, hi = o.nnodes.partition(":")
        lo_n, hi_n = int(lo), int(hi or lo)
    except ValueError:
        raise UsageError(f"--nnodes must be N or MIN:MAX, not {o.nnodes!r}") from None
    if not 0 < lo_n <= hi_n:
        raise UsageError(f"--nnodes must be at least 1 (MIN <= MAX), not {o.nnodes!r}")
    if o.node_rank < 0 or o.node_rank >= hi_n:
        raise UsageError(f"--node-rank must be in 0..{hi_n - 1}, not {o.node_rank}")
    if o.hang_timeout is not None and not o.hang_timeout > 0:      # (NaN too)
        raise UsageError(f"--hang-timeout must be a positive number of seconds, not {o.hang_timeout}")
    if o.rdzv_endpoint:
        nodes.check_endpoint(o.rdzv_endpoint)


@dataclass
class RankInfo:
    rank: int
    pid: int
    chan: Channel
    trace: Optional[str] = None
    step: Optional[int] = None
    status: Optional[str] = None
    reason: Optional[str] = None
    ended_at: Optional[float] = None                # when it said it ended (time.time() where it ran)
    outbox: list = field(default_factory=list)      # an interactive job: [(text, is_error)] since the last line
    at_prompt: bool = False                         # stopped, waiting for a command line
    stop_step: Optional[int] = None
    raised: Optional[str] = None                    # at its post-mortem: what its script raised


@dataclass
class FrontState:
    """What the front knows of the job (read by the report)."""
    ranks: dict = field(default_factory=dict)       # rank -> RankInfo
    refused: Optional[str] = None                   # the line a refused worker got
    hang: Optional[dict] = None                     # {"timeout": s, "ranks": [stack reports]}
    interrupted: Optional[list] = None              # Ctrl-C: the stack reports ([] while they are read)
    run_dir: Optional[str] = None
    job_id: Optional[str] = None


class Front:
    def __init__(self, target, options: LaunchOptions, message: Callable[[str], None]):
        self.target = target
        self.options = options
        self.message = message
        self.state = FrontState()
        self.replica_dir: Optional[str] = None     # a replica job's: its directory (REPLICA_JOB_ENV)
        self.starts: list = []                     # when each run of the job started (time.time())
        # (one node: a fresh secret, through the workers' environment; several: the user's, given every node)
        self.secret = secrets.token_hex(16) if options.single_node() else nodes.job_secret(os.environ)
        self.digest = script_digest(target.file)
        self._dir = tempfile.mkdtemp(prefix="nndb-front-")       # (0700: only this user gets in)
        self.socket_path = os.path.join(self._dir, "front.sock")
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix.bind(self.socket_path)
        unix.listen(64)
        self._servers = [unix]
        self.tcp_port: Optional[int] = None      # node 0 of several: the other nodes' ranks connect here
        self.tcp_host = ""
        if not options.single_node() and not options.follower():
            self._servers.append(nodes.tcp_listener(nodes.bind_host(options.rdzv_endpoint or options.master_addr)))
            self.tcp_host, self.tcp_port = self._servers[-1].getsockname()[:2]
        self._lock = threading.Lock()
        self._replies: dict = {}
        self._replied = threading.Condition(self._lock)
        self._last_progress = time.monotonic()
        self._done = threading.Event()
        self.interactive = False            # set by nndb.distributed.console: the agent runs in a thread
        self.judge: Optional[LiveJudge] = None      # the rules across ranks, live (one node: every rank here)
        for server in self._servers:
            threading.Thread(target=self._accept, args=(server,), name="nndb-front-accept", daemon=True).start()

    # -- the workers' connections ------------------------------------------------------------
    def _accept(self, server) -> None:
        while True:                         # (until close() closes the socket)
            try:
                sock, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(Channel(sock),), name="nndb-front-rank",
                             daemon=True).start()

    def _hello(self, chan: Channel, msg: dict, mine: str) -> Optional[RankInfo]:
        rank = msg.get("rank")
        if not nodes.proven(self.secret, "rank", mine, msg.get("proof")) or not isinstance(rank, int):
            why = "a process without this job's secret tried to attach; refused"   # (the job goes on)
            self.message(f"nndb: error: {why}")
            chan.send({"op": "refuse", "reason": why})
            chan.close()
            return None
        why = None
        if msg.get("nndb_version") != __version__:
            why = f"rank {rank} runs nndb {msg.get('nndb_version')}, this front nndb {__version__}"
        elif msg.get("script_sha256") != self.digest:
            why = f"rank {rank} runs a different script than this front ({msg.get('script')})"
        if why is not None:
            with self._lock:
                self.state.refused = self.state.refused or why
            self.message(f"nndb: error: {why}")
            chan.send({"op": "refuse", "reason": why})
            self._abort_all("killed", EXIT_USAGE, why)
            return None
        theirs = str(msg.get("nonce", ""))
        chan.send({"op": "ok", "proof": nodes.proof(self.secret, "front", theirs), "interactive": self.interactive})
        sealed = nodes.SealedChannel(chan, nodes.session_key(self.secret, mine, theirs), "front", "rank")
        info = RankInfo(int(rank), int(msg.get("pid", 0)), sealed)
        with self._lock:
            self.state.ranks[info.rank] = info
            self._last_progress = time.monotonic()
        return info

    def _serve(self, chan: Channel) -> None:
        mine = nodes.nonce()
        chan.send({"op": "nonce", "nonce": mine})
        first = chan.recv(limit=nodes.HELLO_LIMIT)      # (not yet trusted)
        if not first or first.get("op") != "hello":
            chan.close()
            return
        info = self._hello(chan, first, mine)
        if info is None:
            return
        while True:
            msg = info.chan.recv()
            if msg is None:
                with self._lock:
                    info.status = info.status or "gone"
                    info.at_prompt = False
                    self._replied.notify_all()
                return
            op = msg.get("op")
            with self._lock:
                if op == "step":
                    info.step = msg.get("step")
                    self._last_progress = time.monotonic()
                elif op == "trace":
                    info.trace = msg.get("path")
                elif op == "ended":
                    info.status, info.reason = msg.get("status"), msg.get("reason")
                    at = msg.get("at")
                    info.ended_at = float(at) if isinstance(at, (int, float)) else time.time()
                    self._last_progress = time.monotonic()
                elif op == "stacks":
                    self._replies[info.rank] = msg
                elif op == "out":
                    info.outbox.append((str(msg.get("text", "")), bool(msg.get("err"))))
                elif op == "rows" and self.judge is not None and isinstance(msg.get("row"), dict):
                    self.judge.add(info.rank, msg["row"])
                elif op == "prompt":
                    info.at_prompt, info.stop_step = True, msg.get("step")
                    info.raised = str(msg["raised"]) if msg.get("raised") else None
                self._replied.notify_all()

    def _abort_all(self, status: str, code: int, reason: str) -> None:
        self.abort(None, status, code, reason)

    def abort(self, ranks, status: str, code: int, reason: str) -> None:
        """End ``ranks`` (None: every rank) from their helper threads
        (nndb.distributed.worker: a main thread that runs Python ends the run
        itself; one blocked in a collective has its trace closed for it)."""
        with self._lock:
            infos = [i for r, i in self.state.ranks.items() if ranks is None or r in ranks]
        for r in infos:
            r.chan.send({"op": "abort", "status": status, "exit_code": code, "reason": reason})

    # -- stacks and the watchdog ----------------------------------------------------------------
    def all_stacks(self, wait: float = _STACKS_WAIT_S) -> list:
        """Every connected rank's report ({rank, pid, step, stacks}), by rank;
        a rank that does not answer in time: {rank, pid, error}."""
        with self._lock:
            ranks = dict(self.state.ranks)
            self._replies = {}
        for r in ranks.values():
            r.chan.send({"op": "stacks"})
        deadline = time.monotonic() + wait
        with self._lock:
            while len(self._replies) < len(ranks) and time.monotonic() < deadline:
                self._replied.wait(max(0.0, deadline - time.monotonic()))
            got = dict(self._replies)
        out = []
        for rank in sorted(ranks):
            rep = got.get(rank)
            if rep is None:
                out.append({"rank": rank, "pid": ranks[rank].pid, "step": ranks[rank].step,
                            "error": "no answer"})
            else:
                rep = dict(rep)
                rep.pop("op", None)
                out.append(rep)
        return out

    def _watch(self, timeout: float) -> None:
        while not self._done.wait(min(0.2, timeout / 4)):
            with self._lock:
                idle = time.monotonic() - self._last_progress
                live = [r for r in self.state.ranks.values() if r.status is None]
                started = any(r.step is not None for r in self.state.ranks.values())
            # (before any step has finished: imports, the process group's start; at least _START_S)
            if not live or idle < (timeout if started else max(timeout, _START_S)):
                continue
            reports = self.all_stacks()
            self.state.hang = {"timeout": timeout, "ranks": reports}
            text = [f"nndb: the job hung: no rank finished a step for {timeout:g} s; every rank's stack:"]
            text += [_shown(rep) for rep in reports]
            self.message("\n".join(text))
            self.message(f"nndb: ending the job (exit code {EXIT_HANG})")
            self._abort_all("killed", EXIT_HANG, f"the job hung: no rank finished a step for {timeout:g} s")
            return

    # -- the job ---------------------------------------------------------------------------------
    # -- an interactive job: the console (nndb.distributed.console) drives these ------------------------
    def live_ranks(self) -> list:
        with self._lock:
            return sorted(r for r, i in self.state.ranks.items() if i.status is None)

    def send_line(self, rank: int, text: str) -> None:
        with self._lock:
            info = self.state.ranks[rank]
            info.outbox, info.at_prompt = [], False
        info.chan.send({"op": "line", "text": text})

    def interrupt(self) -> None:
        with self._lock:
            ranks = list(self.state.ranks.values())
        for r in ranks:
            r.chan.send({"op": "interrupt"})

    def wait(self, ranks, timeout: Optional[float] = None, finished: Callable[[], bool] = lambda: False) -> bool:
        """Until each of ``ranks`` is at its prompt or gone (True), or ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                pending = [r for r in ranks if self.state.ranks.get(r) is not None
                           and self.state.ranks[r].status is None and not self.state.ranks[r].at_prompt]
                if not pending or finished():
                    return True
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._replied.wait(0.2 if left is None else min(0.2, left))

    def settle(self, finished: Callable[[], bool], timeout: Optional[float] = None) -> Optional[dict]:
        """Once every live rank is at its prompt ({}), or some are and each
        other one has stayed at the same place for a while ({rank: where it
        waits}: held), or the job ended ({}); None after ``timeout``.  A
        stop inside a step (a module breakpoint) leaves the other ranks where
        they are (gdb's all-stop), which is waiting for the stopped rank in a
        collective: nndb's step-end agreement, one of the script's, or DDP's
        gradient all-reduce inside backward (C++: its Python stack ends in
        ``backward``); so does a rank out of inputs under Join, shadowing the
        others' collectives while they run to a stop."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last: dict = {}
        while True:
            live = self.live_ranks()
            if self.wait(live, timeout=_POLL_S, finished=finished):
                return {}
            pending = [r for r in live if not self.state.ranks[r].at_prompt]
            if len(pending) < len(live):
                now = {rep["rank"]: stacks.place(rep) for rep in self.all_stacks(wait=2.0)
                       if rep["rank"] in pending and "error" not in rep}
                last = {r: (now.get(r), last[r][1] + 1 if r in last and last[r][0] == now.get(r) else 1)
                        for r in pending}       # (rank -> (its place, polls running it was there))
                if all(now.get(r) is not None and last[r][1] >= _HELD_POLLS for r in pending):
                    return {r: last[r][0][0] for r in pending}
            if deadline is not None and time.monotonic() > deadline:
                return None

    def wait_hello(self, n: int, finished: Callable[[], bool], patience: float) -> bool:
        """Until ``n`` ranks have said hello (True), the job ended, or
        ``patience`` seconds passed since the first did (False)."""
        first = None
        with self._lock:
            while len(self.state.ranks) < n and not finished():
                if self.state.ranks and first is None:
                    first = time.monotonic()
                if first is not None and time.monotonic() - first > patience:
                    return False
                self._replied.wait(0.2)
        return True

    def take_output(self, rank: int) -> list:
        with self._lock:
            info = self.state.ranks.get(rank)
            if info is None:
                return []
            out, info.outbox = info.outbox, []
            return out

    def run(self, worker_argv: list, trace_dir: Optional[str]) -> int:
        from torch.distributed import run as torchrun
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.elastic.rendezvous.api import RendezvousError

        o = self.options
        with self._lock:                    # (a job run again: time travel across ranks)
            self.state.ranks = {}
            self._last_progress = time.monotonic()
        self._done.clear()
        if o.follower():                # (its ranks find node 0's front through torchrun's store)
            env = {nodes.FROM_STORE_ENV: "1", SOCKET_ENV: None, SECRET_ENV: self.secret, nodes.PUBLISH_ENV: None}
        else:
            env = {SOCKET_ENV: self.socket_path, SECRET_ENV: self.secret,
                   nodes.PUBLISH_ENV: None if self.tcp_port is None else f"{self.tcp_host}:{self.tcp_port}"}
        self.judge = LiveJudge(o.nproc_per_node, self.message) if o.single_node() else None
        if o.single_node():             # (several nodes agree through torchrun's store: nndb.run.rank)
            if trace_dir is not None:
                self.state.run_dir = claim_run_dir(trace_dir, self.target.stem)
                env[RUN_DIR_ENV] = self.state.run_dir
            self.state.job_id = os.path.basename(self.state.run_dir or run_dir_name(self.target.stem))
            env[JOB_ID_ENV] = self.state.job_id
        if "OMP_NUM_THREADS" not in os.environ and o.nproc_per_node > 1:
            env["OMP_NUM_THREADS"] = "1"      # (what torchrun sets, without its banner)
        env[REPLICA_JOB_ENV] = self.replica_dir
        self.starts.append(time.time())
        saved = {k: os.environ.get(k) for k in env}
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        quiet = _quiet_torch_logs()
        old_int = signal.signal(signal.SIGINT, self._ctrl_c) \
            if threading.current_thread() is threading.main_thread() and not self.interactive else None
        if o.hang_timeout:
            threading.Thread(target=self._watch, args=(o.hang_timeout,), name="nndb-watchdog",
                             daemon=True).start()
        try:
            args = torchrun.parse_args(o.torchrun_argv(worker_argv))
            torchrun.run(args)
            code = EXIT_OK
        except ChildFailedError as e:
            code = self._failed(e)
        except SignalException as e:
            code = EXIT_SIGINT if e.sigval == signal.SIGINT else EXIT_SIGTERM
            self.message(f"nndb: the job was {'interrupted' if code == EXIT_SIGINT else 'terminated'}; "
                         f"every rank was stopped")
        except KeyboardInterrupt:
            code = EXIT_SIGINT
            self.message("nndb: the job was interrupted; every rank was stopped")
        except RendezvousError as e:
            raise UsageError(f"the rendezvous failed: {type(e).__name__}: {_first_line(e)}") from None
        finally:
            self._judge_the_rest()
            self._done.set()
            if old_int is not None:
                signal.signal(signal.SIGINT, old_int)
            quiet()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        return code

    def _judge_the_rest(self, wait: float = 5.0) -> None:
        """Every rank's last rows (each said 'ended' after them, or its link closed) to the live judge."""
        deadline = time.monotonic() + wait
        with self._lock:
            while any(r.status is None for r in self.state.ranks.values()) and time.monotonic() < deadline:
                self._replied.wait(0.1)
        if self.judge is not None:
            self.judge.finish()

    def _ctrl_c(self, signum, frame) -> None:
        """The first Ctrl-C shows every rank's stack and ends the job (each
        rank closes its trace); the second ends it at once."""
        if self.state.interrupted is not None or self.options.follower():
            raise KeyboardInterrupt         # (a follower node: its ranks report to node 0, it ends its own)
        self.state.interrupted = []
        self.message("nndb: Ctrl-C: ending the job after every rank's stack (Ctrl-C again: at once)")
        threading.Thread(target=self._end_with_stacks, name="nndb-ctrl-c", daemon=True).start()

    def _end_with_stacks(self) -> None:
        reports = self.all_stacks()
        self.state.interrupted = reports
        self.message("\n".join(["nndb: every rank's stack at Ctrl-C:"] + [_shown(rep) for rep in reports]))
        self._abort_all("interrupted", EXIT_SIGINT, "KeyboardInterrupt (Ctrl-C at the nndb front)")

    def _failed(self, e) -> int:
        if self.state.hang is not None:
            return EXIT_HANG
        if self.state.interrupted is not None:
            self.message("nndb: the job was interrupted; every rank was stopped")
            return EXIT_SIGINT
        if self.state.refused is not None:
            return EXIT_USAGE
        failures = getattr(e, "failures", {}) or {}
        if self.options.follower() and failures:     # (the why is on node 0: its front ended the job or saw it)
            self.message("nndb: " + ", ".join(f"rank {r} ended (exit code {f.exitcode})"
                                              for r, f in sorted(failures.items()))
                         + "; node 0's nndb run says why")
            code = failures[min(failures)].exitcode
            return code if code is not None and 0 < code < 256 else EXIT_SCRIPT_ERROR
        if not failures:
            self.message(f"nndb: the job failed: {_first_line(e)}")
            return EXIT_SCRIPT_ERROR
        # the cause: a rank that ended by itself (an exit code) before one the launcher stopped (a
        # signal), the first to end first.  torchrun's timestamps are whole seconds: a rank that
        # failed on the connection another's death broke (gloo's 'Connection closed by peer') ends
        # within the same second, and the tie went to the lower rank; the ranks' own word of when
        # they ended (to the microsecond) comes first where they gave one
        def when(r):
            info = self.state.ranks.get(r)
            at = info.ended_at if info is not None else None
            return at if at is not None else float(failures[r].timestamp)
        order = sorted(failures, key=lambda r: ((failures[r].exitcode or 0) <= 0, when(r), r))
        for i, rank in enumerate(order):
            f = failures[rank]
            info = self.state.ranks.get(rank)
            why = f" ({_first_line(info.reason)})" if info is not None and info.reason else ""
            how = f"exit code {f.exitcode}" if f.exitcode is not None and f.exitcode >= 0 else \
                f"signal {-f.exitcode if f.exitcode is not None else '?'}"
            if i == 0:
                # (exit code 1: the script raised, its traceback printed; 2: nndb's own error line)
                said = "its traceback is above" if f.exitcode == 1 else "its error is above"
                self.message(f"nndb: rank {rank} failed: {how}{why}; {said}")
            else:
                self.message(f"nndb: rank {rank} ended too: {how}{why}")
        code = failures[order[0]].exitcode
        return code if code is not None and 0 < code < 256 else EXIT_SCRIPT_ERROR

    def close(self) -> None:
        self._done.set()
        for server in self._servers:
            try:
                server.close()
            except OSError:
                pass
        with self._lock:
            for r in self.state.ranks.values():
                r.chan.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def report(self) -> dict:
        """The front's part of the JSON report."""
        ranks = [{"rank": r.rank, "pid": r.pid, "trace": r.trace, "last_step": r.step, "status": r.status,
                  "reason": r.reason} for _, r in sorted(self.state.ranks.items())]
        return {"job_id": self.state.job_id, "run_dir": self.state.run_dir, "ranks": ranks,
                "hang": self.state.hang, "interrupted": self.state.interrupted,
                "cross_rank_findings": [f.as_dict() for f in self.judge.findings] if self.judge else None}


def _shown(rep: dict) -> str:
    return stacks.format_rank(rep) if "error" not in rep else f"rank {rep['rank']} (pid {rep['pid']}): {rep['error']}"


def _first_line(e) -> str:
    return (str(e).strip().splitlines() or [""])[0][:300]


def _quiet_torch_logs() -> Callable[[], None]:
    """torch.distributed.elastic logs each worker's failure in many lines;
    nndb says it in one per rank.  Returns the undo."""
    names = ("torch.distributed.elastic", "torch.distributed.run", "torch.distributed.launcher")
    saved = [(logging.getLogger(n), logging.getLogger(n).level) for n in names]
    for lg, _ in saved:
        lg.setLevel(logging.CRITICAL)

    def undo():
        for lg, lvl in saved:
            lg.setLevel(lvl)
    return undo
