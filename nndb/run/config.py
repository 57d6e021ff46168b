"""Plain configuration the core receives (the CLI builds it from flags)."""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from typing import Optional

from ..cadence import Cadence
from .launcher import Target

# The run's recording schedule is the cadence policy (--every, --steps, --full-every, --act-every).
RecordSchedule = Cadence


@dataclass
class RunConfig:
    target: Target
    trace_path: Optional[str] = None
    schedule: RecordSchedule = field(default_factory=RecordSchedule)
    flush_steps: int = 500
    flush_secs: float = 2.0
    quiet: bool = False
    trace_dir: Optional[str] = None     # where the default trace goes (absolute; else ./nndb-runs)
    full_rules: tuple = ()              # --record-full: nndb.tracer.fulltensors.FullRule, in order
    full_max_bytes: Optional[int] = None   # --full-tensors-buffer (bytes); None: the default bound
    nndb_argv: tuple = ()               # nndb's own options as given (``--every 2 --rules none``): meta["nndb_argv"]
    # the process ends when the script does, as Python's would (``nndb run``; not a rank under nndb's
    # front, which exits with the code recorded, nor a notebook's kernel): a KeyboardInterrupt is
    # recorded with the status the process will end with (nndb.run.runner._python_exits_1_on_interrupt)
    ends_as_python: bool = False


@dataclass(frozen=True)
class RunOptions:
    """``nndb run``'s command line, parsed: one field per parameter of the
    command (same name, same default), built once by the command (``nndb
    run`` in a shell, ``%nndb run`` in a notebook: nndb.cli.run.run_options)
    and handed to everything below it, as black's ``Mode``: the run's setup
    (nndb.cli.setup), torchrun's flags (``launch_options``), a distributed
    job's workers (nndb.distributed.launch) and the notebook magics.  Plain
    values only: what needs checking against the filesystem (paths, rule
    files, exports) is checked where it is used, before the script starts."""
    module: Optional[str] = None                # -m MODULE
    trace_path: Optional[str] = None            # --trace PATH
    force: bool = False                         # --force
    every: Optional[int] = None                 # --every N
    steps_range: Optional[str] = None           # --steps A:B
    full_every: Optional[int] = None            # --full-every N
    act_every: Optional[int] = None             # --act-every N
    flush_steps: int = 500                      # --flush-every N
    flush_secs: float = 2.0                     # --flush-secs S
    quiet: bool = False                         # -q, --quiet
    batch: bool = False                         # --batch
    go: bool = False                            # --run (no stop at the start of step 0)
    command_files: tuple = ()                   # -x FILE, in order
    eval_commands: tuple = ()                   # -e CMD, in order
    nx: bool = False                            # --nx
    report_path: Optional[str] = None           # --report FILE.json
    rules: str = "default"                      # --rules default|FILE.yaml|none
    fail_on: Optional[str] = None               # --fail-on warning|error
    replica: str = "auto"                       # --replica auto|fork|respawn|off
    total_steps: Optional[int] = None           # --total-steps N
    checkpoint_every: Optional[str] = None      # --checkpoint-every N|Ns
    checkpoint_memory: Optional[str] = None     # --checkpoint-memory SIZE
    lineage: Optional[str] = None               # --lineage STEPS
    record_full: tuple = ()                     # --record-full KIND:GLOB, in order
    full_tensors_every: Optional[int] = None    # --full-tensors-every N
    precision: Optional[str] = None             # --precision fp16|bf16|fp32
    full_tensors_buffer: Optional[float] = None     # --full-tensors-buffer MIB
    exports: tuple = ()                         # --export tensorboard:DIR|mlflow[:URI], in order
    nproc_per_node: Optional[int] = None        # --nproc-per-node N (a job of N workers)
    nnodes: str = "1"                           # torchrun's flags, from here to --hang-timeout
    node_rank: int = 0
    rdzv_backend: Optional[str] = None
    rdzv_endpoint: Optional[str] = None
    rdzv_id: Optional[str] = None
    rdzv_conf: Optional[str] = None
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    hang_timeout: Optional[float] = None        # --hang-timeout SECS
    script: Optional[str] = None                # SCRIPT (with -m: the module's first argument)
    args: tuple = ()                            # the script's arguments, untouched
    given: tuple = ()                           # the parameters the command line set, in the command's order


def default_trace_path(target: Target, directory: str = "nndb-runs", where=None) -> str:
    """A new file under ./nndb-runs/: <script>-<time>.h5, never an existing one:
    the name is claimed (created empty, exclusively) so that two runs started in
    the same second get two files (the second one ``-2``).  Absolute, so that a
    script's ``os.chdir`` does not move it.  One rank of several (torchrun):
    ``<script>-<time>/rank<R>.h5`` in the job's run directory (nndb.run.rank)."""
    from . import rank as job
    where = where or job.place()
    if where.in_job:
        try:
            return job.rank_file(job.job_run_dir(directory, target.stem, where), where)
        except OSError:
            return job.rank_file(os.path.join(os.path.abspath(directory), target.stem), where)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = os.path.join(os.path.abspath(directory), f"{target.stem}-{stamp}")
    path, i = base + ".h5", 1
    try:
        os.makedirs(os.path.dirname(base), exist_ok=True)
    except OSError:
        return path                     # (the writer reports the directory it cannot create)
    while True:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            return path
        except FileExistsError:
            i += 1
            path = f"{base}-{i}.h5"
        except OSError:
            return path                 # (the writer reports why it cannot create it)


def rank_trace_path(path: str, rank: int, world_size: int) -> str:
    """An explicit ``--trace PATH`` for rank ``rank`` of ``world_size`` (nndb.run.rank.rank_trace)."""
    from .rank import Place, rank_trace
    return rank_trace(path, Place(rank=rank, world_size=world_size, local_rank=rank))


def shown(path: str) -> str:
    """A path as the user would type it here: relative below the working directory."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith(os.pardir) else rel
