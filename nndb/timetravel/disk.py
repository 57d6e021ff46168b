"""On-disk checkpoints, in a directory beside the trace.

A trace ``run.h5`` keeps its checkpoints in ``run.ckpt/step_00001000.pt``.
Each file is a plain ``torch.save`` of a dict holding only tensors, numbers,
strings, lists and dicts, so it loads with ``weights_only=True`` -- a
checkpoint is data, and opening one must never run code.

Writes are atomic: a crash mid-write leaves either the previous state or the
complete new file, never a truncated checkpoint under the final name.
"""
from __future__ import annotations

import collections
import os
import random
import re
import tempfile
from typing import Callable, Optional

import numpy as np
import torch

from ..run.paths import checkpoint_dir

FORMAT = "nndb-checkpoint"
VERSION = 1
_NAME = re.compile(r"^step_(\d+)\.pt$")


directory_for = checkpoint_dir     # (nndb.run.paths checks the directory at start: nndb's own, or refused)


def file_name(step: int) -> str:
    """``step_00001000.pt``: zero padded so a plain listing sorts by step."""
    return f"step_{step:08d}.pt"


def _fsync_directory(directory: str) -> None:
    """Make the rename itself durable. Some filesystems refuse to open or
    fsync a directory; the file's own data is already synced, so go on."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.Tensor, torch.nn.Parameter)
_DROP = object()


def plain(value, where: str, dropped: list):
    """``value`` with what ``torch.load(weights_only=True)`` cannot read taken
    out: a class instance in a param group's extra key, a module's
    ``get_extra_state()`` object, a set.  Each left out is noted in
    ``dropped`` as (where, type name); NumPy scalars become Python numbers."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if isinstance(value, np.generic) and isinstance(value.item(), (bool, int, float)):
        return value.item()
    if kind in (dict, collections.OrderedDict):
        out = kind()
        for k, v in value.items():
            if type(k) not in (str, int):
                dropped.append((f"{where}[{k!r}]", "a key of type " + type(k).__name__))
                continue
            v = plain(v, f"{where}[{k!r}]", dropped)
            if v is not _DROP:
                out[k] = v
        return out
    if kind in (list, tuple, torch.Size):
        mark = len(dropped)
        items = [plain(v, f"{where}[{i}]", dropped) for i, v in enumerate(value)]
        if any(v is _DROP for v in items):     # (a list with a hole would change what the positions mean)
            inner = sorted({what for _, what in dropped[mark:]})
            del dropped[mark:]
            dropped.append((where, f"a {kind.__name__} holding {', '.join(inner)}"))
            return _DROP
        return kind(items)
    dropped.append((where, kind.__name__))
    return _DROP


def save(directory: str, step: int, modules: dict[str, torch.nn.Module],
         optimizers: dict[str, torch.optim.Optimizer], rng: dict | None = None,
         warn: Optional[Callable[[str], None]] = None) -> str:
    """Write the checkpoint after ``step`` and return its path.

    ``rng`` is stored as given (``capture_rng()`` for the current state);
    ``None`` records that no RNG state was captured rather than silently
    capturing one that may not belong to this step. Raises ``OSError`` with
    the path in the message on any failure, leaving no temporary file behind.
    A value ``weights_only=True`` cannot load is left out (``plain``), with
    one line to ``warn`` naming its key.
    """
    final = os.path.join(directory, file_name(step))
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise OSError(f"cannot create checkpoint directory {directory!r}: {exc}") from exc
    if not os.path.isdir(directory):
        raise OSError(f"cannot create checkpoint directory {directory!r}: "
                      "a file of that name is in the way")
    dropped: list = []
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "step": int(step),
        "modules": {name: plain(m.state_dict(), f"module {name}", dropped) for name, m in modules.items()},
        "optimizers": {name: plain(o.state_dict(), f"optimizer {name}", dropped)
                       for name, o in optimizers.items()},
        "rng": rng,
    }
    for where, what in dropped:
        if warn is not None:
            warn(f"nndb: warning: checkpoints on disk leave out {where} ({what}: not a tensor, number or "
                 "string, and a checkpoint loads with weights_only=True)")
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".step_", suffix=".tmp")
    except OSError as exc:
        raise OSError(f"cannot write checkpoint {final!r}: {exc}") from exc
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(payload, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, Exception):     # Ctrl-C and friends propagate as they are
            raise OSError(f"cannot write checkpoint {final!r}: {exc}") from exc
        raise
    _fsync_directory(directory)
    return final


def load(path: str) -> dict:
    """Read a checkpoint onto the CPU (``weights_only=True``: never code).

    Raises ``ValueError`` for a file that is not an nndb checkpoint or comes
    from a newer nndb.
    """
    data = torch.load(path, weights_only=True, map_location="cpu")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path!r} is not an nndb checkpoint")
    if data.get("version", 0) > VERSION:
        raise ValueError(f"{path!r} has checkpoint format version {data['version']}; "
                         f"this nndb reads up to {VERSION}")
    return data


def list_checkpoints(directory: str) -> list[tuple[int, str]]:
    """``(step, path)`` of every checkpoint in ``directory``, sorted by step
    (temporary files and strangers are ignored; a missing directory is
    empty)."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for name in names:
        match = _NAME.match(name)
        if match:
            found.append((int(match.group(1)), os.path.join(directory, name)))
    return sorted(found)


def capture_rng() -> dict:
    """Every RNG a training step commonly draws from, as weights_only-safe
    values: torch CPU (a uint8 tensor), CUDA (only if CUDA is already
    initialised -- capturing must not initialise it), Python ``random`` and
    numpy's legacy global ``RandomState``."""
    version, py_state, gauss_next = random.getstate()
    np_name, np_key, np_pos, np_has_gauss, np_cached = np.random.get_state(legacy=True)
    cuda = []
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda = [s.clone() for s in torch.cuda.get_rng_state_all()]
    return {
        "torch": torch.get_rng_state().clone(),
        "cuda": cuda,
        "python": {"version": int(version), "state": [int(x) for x in py_state],
                   "gauss_next": None if gauss_next is None else float(gauss_next)},
        "numpy": {"name": str(np_name),
                  "key": torch.from_numpy(np.asarray(np_key, dtype=np.int64)),
                  "pos": int(np_pos), "has_gauss": int(np_has_gauss),
                  "cached_gaussian": float(np_cached)},
    }


def restore_rng(state: dict) -> None:
    """The inverse of ``capture_rng``. CUDA states are restored only when
    some were captured and CUDA is available here."""
    torch.set_rng_state(state["torch"].to(device="cpu", dtype=torch.uint8))
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.to(device="cpu", dtype=torch.uint8) for s in cuda])
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss_next"]))
    npst = state["numpy"]
    key = npst["key"].numpy().astype(np.uint32)
    np.random.set_state((npst["name"], key, npst["pos"], npst["has_gauss"],
                         npst["cached_gaussian"]))
