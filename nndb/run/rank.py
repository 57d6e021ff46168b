"""Which job and which rank this process is, and where its trace goes.

torchrun (torch.distributed.run) tells each worker its place through the
environment: RANK, WORLD_SIZE, LOCAL_RANK, TORCHELASTIC_RUN_ID,
MASTER_ADDR/MASTER_PORT.  With more than one rank every trace of a job goes
into one run directory, ``nndb-runs/<script>-<time>/rank<R>.h5``, and every
trace names the same ``job_id`` (the directory's name).  All ranks must
agree on that name without each reading its own clock:

1. ``NNDB_RUN_DIR`` / ``NNDB_JOB_ID``: set by ``nndb run --nproc-per-node``
   (the front chose them before starting the workers);
2. else torchrun's own rendezvous store (the agent's TCPStore at
   MASTER_ADDR:MASTER_PORT, which every worker of the job reaches): rank 0
   claims the name, the others read it;
3. else (no store reachable) a name every rank derives alike from
   TORCHELASTIC_RUN_ID, MASTER_ADDR and MASTER_PORT.

With ``--trace PATH`` and more than one rank the rank is inserted before the
extension: ``run.h5`` -> ``run.rank1.h5`` (never one file for all ranks).
"""
from __future__ import annotations

import datetime
import hashlib
import os
from dataclasses import dataclass
from typing import Optional

RUN_DIR_ENV = "NNDB_RUN_DIR"
JOB_ID_ENV = "NNDB_JOB_ID"
_STORE_KEY = "nndb/run_dir"
STORE_TIMEOUT_S = 60.0


def _int(env: dict, name: str, default: int) -> int:
    try:
        return int(env.get(name, default))
    except (TypeError, ValueError):
        return default


@dataclass(frozen=True)
class Place:
    """This process's place in its job."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    restart: int = 0            # TORCHELASTIC_RESTART_COUNT
    launched: bool = False      # a worker of nndb run --nproc-per-node (its front named the job)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def in_job(self) -> bool:
        """Its trace, report and exports are a rank's (``rank<R>.h5`` in the job's run directory):
        one of several ranks, or the one worker of ``nndb run --nproc-per-node 1``, whose front
        announced 'traces of the 1 rank(s) in DIR' while the trace went to nndb-runs/<script>-<time>.h5
        beside that empty directory, and ``--trace DIR/`` was refused as a directory."""
        return self.distributed or self.launched


def place(env: Optional[dict] = None) -> Place:
    env = os.environ if env is None else env
    return Place(_int(env, "RANK", 0), _int(env, "WORLD_SIZE", 1), _int(env, "LOCAL_RANK", 0),
                 _int(env, "TORCHELASTIC_RESTART_COUNT", 0), bool(env.get(JOB_ID_ENV)))


def run_dir_name(stem: str, now: Optional[datetime.datetime] = None) -> str:
    now = now or datetime.datetime.now()
    return f"{stem}-{now.strftime('%Y%m%d-%H%M%S')}"


def claim_run_dir(parent: str, stem: str) -> str:
    """A new directory under ``parent`` (created, never an existing one: ``-2`` ...)."""
    base = os.path.join(os.path.abspath(parent), run_dir_name(stem))
    path, i = base, 1
    os.makedirs(os.path.abspath(parent), exist_ok=True)
    while True:
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            i += 1
            path = f"{base}-{i}"


def _fallback_name(stem: str, env) -> str:
    key = "|".join(str(env.get(k, "")) for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT",
                                                   "TORCHELASTIC_RESTART_COUNT"))
    return f"{stem}-job-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def _through_store(parent: str, stem: str, where: Place, env) -> Optional[str]:
    """The run directory agreed through torchrun's store, or None without one."""
    try:
        store = agent_store(env)
        if store is None:
            return None
        key = f"{_STORE_KEY}/{where.restart}"
        if where.rank == 0:         # (the name only: each node puts it under its own ./nndb-runs)
            store.set(key, os.path.basename(claim_run_dir(parent, stem)))
        return os.path.join(os.path.abspath(parent), store.get(key).decode("utf-8"))
    except Exception:           # (no store after all: the derived name below)
        return None


def agent_store(env, timeout: float = STORE_TIMEOUT_S):
    """torchrun's agent store as a client (None when the workers were not given one)."""
    if str(env.get("TORCHELASTIC_USE_AGENT_STORE", "")).lower() != "true":
        return None
    host, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if not host or not str(port or "").isdigit():
        return None
    from datetime import timedelta
    from torch.distributed import TCPStore
    return TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout))


def job_run_dir(parent: str, stem: str, where: Place, env: Optional[dict] = None) -> str:
    """The run directory of this job (absolute; created)."""
    env = os.environ if env is None else env
    given = env.get(RUN_DIR_ENV)
    if given:
        path = os.path.abspath(given)
    else:
        path = _through_store(parent, stem, where, env) or \
            os.path.join(os.path.abspath(parent), _fallback_name(stem, env))
    os.makedirs(path, exist_ok=True)
    return path


def job_id(run_dir: Optional[str], env: Optional[dict] = None) -> str:
    """The job's id, the same in every rank's trace: NNDB_JOB_ID, else the run directory's name."""
    env = os.environ if env is None else env
    if env.get(JOB_ID_ENV):
        return env[JOB_ID_ENV]
    if run_dir:
        return os.path.basename(run_dir.rstrip(os.sep))
    rid = env.get("TORCHELASTIC_RUN_ID")
    return rid if rid and rid != "none" else _fallback_name("job", env)


def is_trace_dir(path: str) -> bool:
    """Does ``--trace PATH`` name a directory for a job's ranks: an existing
    one, or a path written with a trailing slash?  (One rule for ``torchrun -m
    nndb run`` and ``nndb run --nproc-per-node``.)"""
    return path.endswith(("/", os.sep)) or os.path.isdir(path)


def rank_trace(path: str, where: Place, create: bool = False) -> str:
    """``--trace PATH`` for one rank of several, never one file shared by all:
    a directory (existing, or written with a trailing slash) gets
    ``rank<R>.h5`` inside it (created: the run directory ``nndb inspect``
    reads; ``create``: made here); a file name gets ``.rank<R>`` before its
    extension (``run.h5`` -> ``run.rank1.h5``).  One process: PATH."""
    if not where.in_job:
        return path
    if is_trace_dir(path):
        if create:
            try:
                os.makedirs(path, exist_ok=True)
            except OSError:
                pass                # (the trace's own check says why it cannot be written)
        return os.path.join(path, f"rank{where.rank}.h5")
    base, ext = os.path.splitext(path)
    return f"{base}.rank{where.rank}{ext or '.h5'}"


def rank_file(run_dir: str, where: Place) -> str:
    return os.path.join(run_dir, f"rank{where.rank}.h5")
