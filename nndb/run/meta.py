"""The run's metadata, recorded at the start of every trace."""
from __future__ import annotations

import datetime
import os
import platform
import socket
import subprocess
import time

import h5py
import numpy as np
import torch

from ..version import __version__ as nndb_version
from ..schema import SCHEMA_VERSION


def openmp_runtime() -> str:
    """Which OpenMP runtime the process has loaded (it decides what a forked
    replica can do and whether a replay is bit-exact)."""
    libs = set()
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                name = os.path.basename(line.rsplit(" ", 1)[-1].strip())
                for known in ("libgomp", "libiomp5", "libomp"):
                    if name.startswith(known):
                        libs.add(name)
    except OSError:
        pass
    if libs:
        return ",".join(sorted(libs))
    info = torch.__config__.parallel_info()
    for line in info.splitlines():
        if "OpenMP" in line and ":" in line:
            return line.split(":", 1)[1].strip()
    return "unknown"


def replay_state() -> dict:
    """What a respawned replica needs to run the script again as this run
    did, and what decides whether a forked replica replays it exactly: the
    initial states of Python's and NumPy's global generators and the seed
    of torch's CPU generator (torch seeds it from the OS at import), the hash seed, the thread count, the OpenMP
    runtime (GNU libgomp cannot run threads in a forked child)."""
    import random
    from . import preload
    v, st, g = random.getstate()
    name, key, pos, has_gauss, cached = np.random.get_state()
    runtime = openmp_runtime()
    threads = torch.get_num_threads()
    return {
        "python_random": [v, list(st), g],
        "numpy_random": [name, [int(x) for x in key], int(pos), int(has_gauss), float(cached)],
        "torch_initial_seed": int(torch.initial_seed()),
        "hash_seed": os.environ.get("PYTHONHASHSEED") or preload.HASH_SEED,
        "num_threads": threads,
        "openmp": runtime,
        "fork_exact": threads == 1 or "libiomp5" in runtime or "libgomp" not in runtime,
    }


def git_commit(directory: str) -> dict:
    try:
        out = subprocess.run(["git", "-C", directory, "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=3)
        if out.returncode != 0:
            return {}
        dirty = subprocess.run(["git", "-C", directory, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=3)
        return {"git_commit": out.stdout.strip(), "git_dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {}


def distributed() -> dict:
    """Rank and world size as torchrun sets them (one trace per rank; the
    job's id is added by the runner, which knows the run directory)."""
    from .rank import place
    p = place()
    return {"rank": p.rank, "world_size": p.world_size, "local_rank": p.local_rank}


def device() -> dict:
    d = {"device": "cpu", "cuda_available": False}
    try:
        if torch.cuda.is_available():
            d.update(cuda_available=True, device="cuda",
                     cuda_devices=[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
                     cuda_version=torch.version.cuda)
    except Exception:
        pass
    return d


def collect(target, schedule_text: str) -> dict:
    now = time.time()
    if target.module:
        script, directory = target.module, os.getcwd()
    else:
        script = target.file
        directory = os.path.dirname(script)
    meta = {
        "nndb_version": nndb_version,
        "schema_version": SCHEMA_VERSION,
        "script": script,
        "module": bool(target.module),
        "argv": [target.display if not target.module else target.module] + list(target.args),
        "cwd": os.getcwd(),
        "start_time": now,
        "start_time_iso": datetime.datetime.fromtimestamp(now, datetime.timezone.utc).isoformat(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "h5py": h5py.__version__,
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "num_threads": torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
        "openmp": openmp_runtime(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "schedule": schedule_text,
    }
    meta["replay"] = replay_state()
    meta.update(device())
    meta.update(distributed())
    meta.update(git_commit(directory))
    return meta
