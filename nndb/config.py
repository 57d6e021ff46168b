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


def default_trace_path(target: Target, rank: int = 0, world_size: int = 1,
                       directory: str = "nndb-runs") -> str:
    """A new file under ./nndb-runs/: <script>-<time>[-rankR].h5, never an existing one."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    suffix = f"-rank{rank}" if world_size > 1 else ""
    base = os.path.join(directory, f"{target.stem}-{stamp}{suffix}")
    path, i = base + ".h5", 1
    while os.path.exists(path):
        i += 1
        path = f"{base}-{i}.h5"
    return path
