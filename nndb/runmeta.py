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

from .version import __version__ as nndb_version
from .store.schema import SCHEMA_VERSION


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
    initial states of Python's and NumPy's global generators (torch's
    starts from a fixed seed), the hash seed, the thread count, the OpenMP
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
    """Rank and world size as torchrun sets them (one trace per rank)."""
    def _int(name, default):
        try:
            return int(os.environ.get(name, default))
        except ValueError:
            return default
    return {"rank": _int("RANK", 0), "world_size": _int("WORLD_SIZE", 1),
            "local_rank": _int("LOCAL_RANK", 0), "job_id": job_id()}


def job_id() -> str:
    """What the ranks of one job share and no other job does, as far as the
    environment tells: NNDB_JOB_ID (set by ``nndb run --nproc-per-node``),
    else torchrun's run id when it is not its default "none", else its
    agent's directory (TORCHELASTIC_ERROR_FILE: one per agent, i.e. per node)
    with the rendezvous endpoint, else "" (one process: no job)."""
    env = os.environ
    if env.get("NNDB_JOB_ID"):
        return env["NNDB_JOB_ID"]
    world = env.get("WORLD_SIZE", "1")
    if not world.isdigit() or int(world) <= 1:
        return ""
    run = env.get("TORCHELASTIC_RUN_ID", "")
    endpoint = f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"
    if run and run != "none":
        return f"{run}@{endpoint}"
    err = env.get("TORCHELASTIC_ERROR_FILE", "")
    parts = err.split(os.sep)
    agent = next((p for p in parts if p.startswith("torchelastic_")), "")
    return f"{agent or run}@{endpoint}"


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
