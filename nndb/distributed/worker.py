"""A worker's link to the ``nndb run --nproc-per-node`` front process.

The front passes NNDB_FRONT_SOCKET (a Unix socket in a directory only its
user can enter) and NNDB_FRONT_SECRET in the environment (the other nodes
of a job of several: the front's address is read from torchrun's store, the
secret is the user's NNDB_JOB_SECRET, nndb.distributed.nodes); the worker connects,
says who it is (rank, pid, nndb version, script digest) with a proof of the
secret, checks the front's, every message after that is sealed with an HMAC
(nodes.SealedChannel), and a helper thread then answers the front: its Python stacks (the
main thread may be stuck in a collective: the helper still answers), and
``abort`` (the watchdog ends a hung job: the trace is closed from here and
the process ends).  At each step end the worker tells the front which step
finished (at most every 0.1 s): the watchdog's clock.  Messages are JSON
(nndb.timetravel.channel), never pickles.
"""
from __future__ import annotations

import _thread
import hashlib
import os
import queue
import signal
import socket
import threading
import time
from typing import Optional

from ..errors import UsageError
from ..timetravel.channel import Channel
from ..version import __version__
from . import nodes, stacks
from ..run.rank import place

SOCKET_ENV = "NNDB_FRONT_SOCKET"
SECRET_ENV = "NNDB_FRONT_SECRET"
# A replica job's rank (predict, reverse-continue across ranks): its job's directory, nndb's own;
# the script's writes elsewhere go to scratch copies (nndb.timetravel.sandbox), as a replica's do
REPLICA_JOB_ENV = "NNDB_REPLICA_JOB"
_STEP_EVERY_S = 0.1
_GRACE_S = 1.5            # (an abort: how long the main thread has to end the run itself)


def script_digest(path: Optional[str]) -> Optional[str]:
    if not path:
        return None
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return None


class FrontLink:
    """The worker's side (a RunExports-like companion of the debugger driver:
    ``start(rec)`` gives step listeners, ``finish(status, trace)`` ends)."""

    def __init__(self, chan: Channel):
        self.chan = chan
        self.rec = None
        self._send_lock = threading.Lock()
        self._last_sent = 0.0
        self._ended = False
        self._ended_event = threading.Event()
        self.where = place()
        self.lines: queue.Queue = queue.Queue()     # the front's command lines (an interactive job)
        self.agreement = None                       # nndb.distributed.allstop.StepAgreement (an interactive job)
        self.interactive = False    # the front holds a prompt: this rank's session reads its commands from it

    @staticmethod
    def _socket(env):
        """(a connected socket, the secret) to this worker's front, or None without one."""
        path = env.get(SOCKET_ENV)
        if path:
            if env.get(nodes.PUBLISH_ENV) and place(env).local_rank == 0:    # (node 0 of several nodes)
                nodes.publish(env, env[nodes.PUBLISH_ENV])
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(30)
                sock.connect(path)
                sock.settimeout(None)
            except OSError as e:
                raise UsageError(f"cannot reach the nndb front at {path}: {e.strerror or e}") from None
            return sock, env.get(SECRET_ENV, "")
        if env.get(nodes.FROM_STORE_ENV):
            record = nodes.lookup(env)
            return nodes.connect(record), env.get(SECRET_ENV, "")
        return None

    @classmethod
    def connect(cls, target, env=None) -> Optional["FrontLink"]:
        """Connect to the front, if this worker has one (unreachable:
        UsageError); refused (the front said why, in its one line): exit 2."""
        env = os.environ if env is None else env
        got = cls._socket(env)
        if got is None:
            return None
        sock, secret = got
        link = cls(Channel(sock))
        w = link.where
        first = link.chan.recv(limit=nodes.HELLO_LIMIT)
        mine = nodes.nonce()
        if first and first.get("op") == "nonce":
            link.send({"op": "hello", "proof": nodes.proof(secret, "rank", str(first.get("nonce"))), "nonce": mine,
                       "rank": w.rank, "local_rank": w.local_rank, "world_size": w.world_size, "pid": os.getpid(),
                       "nndb_version": __version__, "script": target.file or target.module,
                       "script_sha256": script_digest(target.file)})
        answer = link.chan.recv(limit=nodes.HELLO_LIMIT)
        if not answer or answer.get("op") != "ok":
            os._exit(2)                 # (the front printed why; nothing was opened here)
        if not nodes.proven(secret, "front", mine, answer.get("proof")):
            link.chan.close()
            raise UsageError("the process at the nndb front's address does not know this job's secret; "
                             "not attaching to it")
        link.chan = nodes.SealedChannel(link.chan, nodes.session_key(secret, str(first.get("nonce")), mine),
                                        "rank", "front")
        link.interactive = bool(answer.get("interactive"))
        threading.Thread(target=link._serve, name="nndb-front-link", daemon=True).start()
        return link

    def send(self, msg: dict) -> bool:
        with self._send_lock:
            return self.chan.send(msg)

    # -- the run ------------------------------------------------------------------------------
    def start(self, rec) -> list:
        self.rec = rec
        self.send({"op": "trace", "rank": self.where.rank, "path": rec.path})
        fp = getattr(rec, "fingerprints", None)
        if fp is not None:              # (the front judges the ranks' rows live: nndb.distributed.judge)
            write = fp.sink

            def sink(row, write=write):
                write(row)
                self.send({"op": "rows", "rank": self.where.rank, "row": row})
            fp.sink = sink
        return [self]

    def on_step(self, end) -> None:
        now = time.monotonic()
        if end.step is not None and now - self._last_sent >= _STEP_EVERY_S:
            self._last_sent = now
            self.send({"op": "step", "rank": self.where.rank, "step": end.step})

    def finish(self, status: str, trace_path: Optional[str]) -> None:
        rec = self.rec
        writer = getattr(rec, "writer", None)
        last = getattr(writer, "last_whole_step", None)
        if last is not None:
            # (steps are sent at most every _STEP_EVERY_S: the last one the rank finished, as the trace
            # ends with it; not a partial last row, the work of a step it did not finish)
            self.send({"op": "step", "rank": self.where.rank, "step": int(last)})
        self.rec = None             # (the trace is closed: an abort has nothing left to close)
        self._ended = True
        self._ended_event.set()

    def done(self, exit_code: int, reason: str) -> None:
        """The worker's run is over: how, for the front's summary line."""
        # (when, by this machine's clock: which rank failed first, where torchrun's one-second
        # timestamps tie: nndb.distributed.front.Front._failed)
        self.send({"op": "ended", "rank": self.where.rank, "status": "exit", "exit_code": exit_code,
                   "reason": reason, "at": time.time()})

    # -- the helper thread --------------------------------------------------------------------
    def report(self) -> dict:
        rec = self.rec
        step = rec.recorder.step if rec is not None else None
        return {"op": "stacks", "rank": self.where.rank, "pid": os.getpid(), "step": step,
                "stacks": stacks.thread_stacks()}

    def _serve(self) -> None:
        while True:
            msg = self.chan.recv()
            if msg is None:
                self._front_gone()
                return
            op = msg.get("op")
            if op == "stacks":
                self.send(self.report())
            elif op == "line":
                self.lines.put(msg.get("text"))
            elif op == "interrupt":
                if self.agreement is not None:
                    self.agreement.request_stop()
            elif op == "abort":
                self._abort(msg.get("status", "killed"), int(msg.get("exit_code", 5)), msg.get("reason", ""))

    def _abort(self, status: str, code: int, reason: str) -> None:
        """End this worker for the front.  A main thread that runs Python ends
        the run itself (a KeyboardInterrupt: the trace is closed as at Ctrl-C);
        one blocked in a collective cannot, so after a grace period the trace
        is closed from here (status, code) and the process ends."""
        if self.rec is not None and not self._ended:
            _thread.interrupt_main(signal.SIGINT)
            if self._ended_event.wait(_GRACE_S):
                return
        rec = self.rec
        if rec is not None and not self._ended:
            try:
                rec.writer.close(status, code, reason)
            except Exception:
                pass
        os._exit(code)

    def _front_gone(self) -> None:
        """The front process ended without telling us: end too (SIGTERM
        closes the trace; a main thread stuck in a collective cannot take it)."""
        if self._ended:
            return
        self._abort("terminated", 143, "the nndb front process ended")


class RemoteFrontend:
    """A rank's debugger front end in an interactive job: its output goes to
    the front, its command lines come from the front (one prompt for all
    ranks: nndb.distributed.console), at its stops and at its post-mortem (its
    script raised: the prompt says what, and the step).  After the run the
    rank reads no more: end of input, the session ends."""
    interactive = True

    def __init__(self, link: FrontLink):
        self.link = link
        self.session = None

    def _say(self, text: str, err: bool) -> None:
        self.link.send({"op": "out", "rank": self.link.where.rank, "text": text, "err": err})

    def message(self, text: str) -> None:
        self._say(text, False)

    def error(self, text: str) -> None:
        self._say(text, True)

    def read_line(self, prompt: str) -> Optional[str]:
        s = self.session
        # (a replica job's rank, predict's or reverse-continue's, holds no post-mortem: its job
        # ends, as the replica says)
        post_mortem = s is not None and s.control.state == "post-mortem" and not os.environ.get(REPLICA_JOB_ENV)
        if s is None or s.control.state == "exited" or not (s.live or post_mortem):
            return None
        stop = s.here.stop
        msg = {"op": "prompt", "rank": self.link.where.rank, "step": s.last_step,
               "kind": stop.kind if stop is not None else None}
        if post_mortem:         # (its script raised: pdb's post-mortem, at the job's prompt)
            exc = getattr(stop, "exception", None)
            msg.update(step=getattr(stop, "step", None),
                       raised=type(exc).__name__ if exc is not None else "an exception")
        if not self.link.send(msg):
            return None
        return self.link.lines.get()

    def confirm(self, question: str) -> bool:
        return True
