"""``info memory``: what this process holds, and how much of it is nndb's.

Host: the process's resident set (``/proc/self/status``; the fork
checkpoints, each a process of its own, are ``info checkpoints``'s).  Each CUDA device
the process initialised: torch's allocator figures for the whole process
(script and nndb: ``memory_allocated``, ``memory_reserved``,
``max_memory_allocated``) and the bytes of the device tensors nndb keeps
between calls right now (the recorder's parameter values before an
optimizer step, the rule probes' saved gradients).  nndb's per-step
statistics buffers live only inside a step; their peak is what
``scripts/gpu_check.py`` measures (the recorded loop's peak against the
plain loop's)."""
from __future__ import annotations

from typing import Optional


def _rss_kib() -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def held_tensors(s) -> list:
    """The tensors nndb keeps now: the recorder's and the rule probes'."""
    out = []
    if s.rec is not None:
        out += s.rec.recorder.held_tensors()
    if s.rules is not None:
        for probe in s.rules.probes():
            out += probe.held_tensors()
    return out


def by_device(tensors) -> dict:
    """{device string: bytes}, each storage counted once."""
    seen, out = set(), {}
    for t in tensors:
        try:
            st = t.untyped_storage()
            key = (str(t.device), st.data_ptr())
            if key in seen:
                continue
            seen.add(key)
            out[str(t.device)] = out.get(str(t.device), 0) + st.nbytes()
        except Exception:
            continue
    return out


def report(s) -> dict:
    """The figures ``info memory`` shows (bytes; None where unknown)."""
    import torch
    held = by_device(held_tensors(s))
    rss = _rss_kib()
    info = {"rss_bytes": rss * 1024 if rss is not None else None,
            "nndb_host_tensor_bytes": held.get("cpu", 0), "devices": []}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i in range(torch.cuda.device_count()):
            name = f"cuda:{i}"
            info["devices"].append({
                "device": name, "name": torch.cuda.get_device_name(i),
                "allocated_bytes": torch.cuda.memory_allocated(i),
                "reserved_bytes": torch.cuda.memory_reserved(i),
                "peak_allocated_bytes": torch.cuda.max_memory_allocated(i),
                "nndb_held_bytes": held.get(name, 0) + (held.get("cuda", 0) if i == 0 else 0)})
    return info
