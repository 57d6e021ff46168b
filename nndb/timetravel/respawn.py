"""Respawn replicas: a fresh process runs the script again from its start,
seeded as the original run was, up to the step asked for.  The fallback
where fork() is unsafe (CUDA, DataLoader workers, threads of the script, a
process group it started) and the choice of ``--replica respawn``.

What the new process needs comes from the live run's trace metadata
(``meta["replay"]``: the initial states of Python's and NumPy's global
generators and torch's CPU generator's initial seed, the hash seed, the
thread count) and from the live session (its ``snapshot()``: breakpoints,
queued commands, rule settings).  torch's generator is seeded too: torch
2.13 seeds it from the OS at import (``torch.initial_seed()`` differs from
one ``python`` to the next), so an unseeded script draws other numbers in a
new process (its model's initial weights, a DataLoader's shuffle and its
workers' seeds); one that seeds it does so again.

The new process starts at ``nndb.cli.replica_main``: the front end is chosen
at the top, the session is built by ``build_session`` as for ``nndb run``,
and ``run`` here carries out the replica's part.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

from .channel import Channel


def _entry() -> str:
    """The new process's program: nndb.cli.replica_main, with nothing of the
    working directory imported on the way (nndb.run.safepath)."""
    from ..run.safepath import replica_entry
    nndb_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))     # (the package, not imported:
    return replica_entry(os.path.dirname(nndb_dir))                              # it is the API, a floor above)


def spawn(s, machine, goal: dict):
    """Start a respawn replica; returns (channel, process) for TimeMachine.wait_for_replica."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    meta = getattr(s.rec, "meta", None) or {}
    replay = meta.get("replay", {})
    env = dict(os.environ)
    env["NNDB_REPLICA_FD"] = str(child.fileno())
    env["NNDB_REPLICA_PARENT"] = str(os.getpid())
    if replay.get("hash_seed") is not None:
        env["PYTHONHASHSEED"] = str(replay["hash_seed"])
    else:
        s.error("nndb: warning: PYTHONHASHSEED was not fixed for the live run; a respawned replay "
                "may order sets and dicts of strings differently")
    for f in (sys.stdout, sys.stderr):
        f.flush()
    proc = subprocess.Popen([sys.executable, "-c", _entry()], pass_fds=[child.fileno()], env=env,
                            cwd=meta.get("cwd") or os.getcwd())
    child.close()
    chan = Channel(parent)
    t = s.rec.target
    chan.send({"op": "resume", "goal": goal, "state": s.snapshot(), "timeline": machine.timeline,
               "target": {"path": t.path, "module": t.module, "args": list(t.args)},
               "replay": replay, "interactive": s.interactive,
               "scripted": hasattr(s.frontend, "snapshot"), "rules": machine.rules_spec,
               "lineage": machine.lineage_spec, "total_steps": machine.total_steps})
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
    if replay.get("torch_initial_seed") is not None:
        # (the CPU generator's alone, as the live run's started: torch.manual_seed would seed
        # the accelerators' generators too, which the live run did not have seeded so)
        torch.default_generator.manual_seed(int(replay["torch_initial_seed"]))
    if replay.get("num_threads"):
        torch.set_num_threads(int(replay["num_threads"]))


def connect():
    """In the new process: the channel to the live run and its orders, or
    (None, None) when the live run is gone."""
    from .forking import die_with_parent
    die_with_parent(int(os.environ.pop("NNDB_REPLICA_PARENT", os.getppid())))   # as fork checkpoints do
    fd = int(os.environ.pop("NNDB_REPLICA_FD"))
    chan = Channel(socket.socket(fileno=fd))
    msg = chan.recv()
    if msg is None:
        return None, None
    _restore_rng(msg.get("replay", {}))        # before anything of the script's can draw from them
    return chan, msg


def session_options(msg: dict) -> dict:
    """The ``DebugOptions`` fields the replica's session is built with: those
    of the live run's."""
    return {"batch": not msg.get("interactive"), "stop_at_start": False, "rules": msg.get("rules") or "none",
            "replica": "respawn", "total_steps": msg.get("total_steps"), "lineage": msg.get("lineage")}


def run(s, chan, msg: dict) -> None:
    """Run the script under the replica session ``s`` (built by build_session
    from ``session_options(msg)``) until its role ends this process."""
    from ..run.config import RunConfig
    from ..run.launcher import Target
    from ..run.runner import record
    from . import roles, sandbox

    machine = s.machine
    machine.replica = True
    machine.timeline = int(msg.get("timeline", 0))
    role = roles.make_role(msg["goal"], chan)
    s.become_replica(role)
    s.restore(msg["state"])
    tgt = msg["target"]
    d = sandbox.scratch_dir("nndb-replica-")
    cfg = RunConfig(Target(tgt.get("path"), tgt.get("module"), tgt.get("args") or []),
                    trace_path=os.path.join(d, "replica.h5"), quiet=True)
    # (after the trace's directory: the script's own writes only; before the role silences the
    # output, whose kept descriptors would be taken for files the script opened: a run sent to a
    # file, nndb run ... > log, lost everything the past printed)
    sandbox.enter(since=msg["goal"].get("files_since")).hide(msg["goal"].get("hidden") or ())      # (the files the run made since it started)
    signal.signal(signal.SIGINT, signal.default_int_handler)    # (the entry's, nndb.run.safepath.replica_entry)
    role.begin(s)
    try:
        record(cfg, message=lambda m: None, session=s)
    finally:
        # (a role that ended the process did not come back here)
        role.run_ended(s, "finished", "the script ended")
