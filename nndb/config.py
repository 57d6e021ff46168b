"""Plain configuration the core receives (the CLI builds it from flags)."""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from typing import Optional

from .cadence import Cadence
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


def default_trace_path(target: Target, rank: int = 0, world_size: int = 1,
                       directory: str = "nndb-runs") -> str:
    """A new file under ./nndb-runs/: <script>-<time>[-rankR].h5, never an existing one:
    the name is claimed (created empty, exclusively) so that two runs started in
    the same second get two files (the second one ``-2``).  Absolute, so that a
    script's ``os.chdir`` does not move it."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    suffix = f"-rank{rank}" if world_size > 1 else ""
    base = os.path.join(os.path.abspath(directory), f"{target.stem}-{stamp}{suffix}")
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
    """An explicit ``--trace PATH`` under torchrun (``world_size`` > 1): one
    file per rank, never one shared by all.  A directory (existing, or
    written with a trailing slash) gets ``rank<R>.h5`` inside it, the run
    directory ``nndb inspect`` reads; a file name gets ``.rank<R>`` before
    its extension (``run.h5`` -> ``run.rank1.h5``).  One process: PATH."""
    if world_size <= 1:
        return path
    if path.endswith(("/", os.sep)) or os.path.isdir(path):
        return os.path.join(path, f"rank{rank}.h5")
    stem, ext = os.path.splitext(path)
    return f"{stem}.rank{rank}{ext or '.h5'}"


def shown(path: str) -> str:
    """A path as the user would type it here: relative below the working directory."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith(os.pardir) else rel
