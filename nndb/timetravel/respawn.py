"""Respawn replicas: a fresh process runs the script again from its start,
seeded as the original run was, up to the step asked for.  The fallback
where fork() is unsafe (CUDA, DataLoader workers, threads of the script) and
the choice of ``--replica respawn``.

What the new process needs comes from the live run's trace metadata
(``meta["replay"]``: the initial states of Python's and NumPy's global
generators, the hash seed, the thread count) and from the live session (the
breakpoints, the queued commands).  torch's own generator needs nothing: it
starts from a fixed seed unless the script seeds it, and then it does so again.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile

from .channel import Channel
from .handover import export_state


def spawn(s, machine, goal: dict):
    """Start a respawn replica; returns (channel, process) for TimeMachine._wait."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    meta = getattr(s.rec, "meta", None) or {}
    replay = meta.get("replay", {})
    env = dict(os.environ)
    env["NNDB_REPLICA_FD"] = str(child.fileno())
    if replay.get("hash_seed") is not None:
        env["PYTHONHASHSEED"] = str(replay["hash_seed"])
    else:
        s.error("nndb: warning: PYTHONHASHSEED was not fixed for the live run; a respawned replay "
                "may order sets and dicts of strings differently")
    for f in (sys.stdout, sys.stderr):
        f.flush()
    cmd = [sys.executable, "-c", "from nndb.timetravel.respawn import main; main()"]
    proc = subprocess.Popen(cmd, pass_fds=[child.fileno()], env=env, cwd=meta.get("cwd") or os.getcwd())
    child.close()
    chan = Channel(parent)
    t = s.rec.target
    lines = getattr(s.frontend, "lines", None)
    chan.send({"op": "resume", "goal": goal, "state": export_state(s), "timeline": machine.timeline,
               "target": {"path": t.path, "module": t.module, "args": list(t.args)},
               "replay": replay, "interactive": s.interactive,
               "scripted": isinstance(lines, list), "rules": machine.rules_spec,
               "total_steps": machine.total_steps})
    return chan, proc


def _restore_rng(replay: dict) -> None:
    import random
    import numpy as np
    import torch
    if replay.get("python_random"):
        v, st, g = replay["python_random"]
        random.setstate((v, tuple(st), g))
    if replay.get("numpy_random"):
        name, key, pos, has_gauss, cached = replay["numpy_random"]
        np.random.set_state((name, np.array(key, dtype=np.uint32), pos, has_gauss, cached))
    if replay.get("num_threads"):
        torch.set_num_threads(int(replay["num_threads"]))


def main() -> None:
    """The respawned process: run the script under a replica session."""
    fd = int(os.environ.pop("NNDB_REPLICA_FD"))
    chan = Channel(socket.socket(fileno=fd))
    msg = chan.recv()
    if msg is None:
        os._exit(3)
    from ..config import RunConfig
    from ..debugger.frontend import BatchFrontend, ScriptedFrontend
    from ..debugger.session import Session
    from ..launcher import Target
    from ..runner import record
    from .machine import TimeMachine
    from .roles import make_role
    from .handover import import_state

    _restore_rng(msg.get("replay", {}))
    if msg.get("scripted"):
        frontend = ScriptedFrontend([])
    elif msg.get("interactive") and sys.stdin.isatty():
        from ..repl.app import ReplFrontend
        frontend = ReplFrontend()
    else:
        frontend = BatchFrontend()
    rules = None
    if msg.get("rules") and msg["rules"] != "none":
        from ..rules.catalog import load
        rules = load(msg["rules"])
    s = Session(frontend, interactive=bool(msg.get("interactive")), stop_at_start=False, rules=rules)
    machine = TimeMachine("respawn", msg.get("total_steps"), rules_spec=msg.get("rules") or "none")
    machine.replica = True
    machine.timeline = int(msg.get("timeline", 0))
    s.machine = machine
    role = make_role(msg["goal"], chan)
    s.replica = role
    import_state(s, msg["state"])
    tgt = msg["target"]
    d = tempfile.mkdtemp(prefix="nndb-replica-")
    from . import roles
    roles.CLEANUP.append(d)
    cfg = RunConfig(Target(tgt.get("path"), tgt.get("module"), tgt.get("args") or []),
                    trace_path=os.path.join(d, "replica.h5"), quiet=True)
    role.begin(s)
    try:
        record(cfg, message=lambda m: None, session=s)
    finally:
        # (a role that ended the process did not come back here)
        role.run_ended(s, "finished", "the script ended")
