"""The Python stacks of a process, read from a helper thread while the main
thread may be blocked (in a collective, for example): what ``where --ranks
all`` and the hang watchdog show.  Plain data: one dict per thread."""
from __future__ import annotations

import os
import sys
import threading
import traceback
from typing import Optional

_DIST_DIR = os.sep + os.path.join("torch", "distributed") + os.sep
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_AGREEMENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "allstop.py")
_SHM_BARRIER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shmbarrier.py")
AGREEMENT_SHM = "nndb's all-stop agreement at a step end (shared memory)"
_TORCH = os.sep + "torch" + os.sep


def collective(frames) -> Optional[str]:
    """The torch.distributed function the innermost frames are in
    (``all_reduce``, ``barrier`` ...), or None: read from the stack, so no
    collective is wrapped; AGREEMENT_SHM for nndb's own barrier in shared
    memory (no collective: ``waiting_in`` words both).  ``frames``:
    FrameSummary objects, outermost first."""
    if any(f.filename == _SHM_BARRIER for f in frames):
        return AGREEMENT_SHM
    if any(f.filename == _AGREEMENT for f in frames):
        return "all_reduce (nndb's all-stop agreement at a step end)"
    for f in reversed(frames):
        if _DIST_DIR in f.filename and os.path.basename(f.filename) == "distributed_c10d.py":
            return f.name
    return None


def waiting_in(coll: str) -> str:
    """Where a rank waits, in words, from ``collective``'s answer."""
    return coll if coll == AGREEMENT_SHM else f"torch.distributed.{coll}"


def _user_frames(summary) -> list:
    """The script's view of the main thread: from the script's top frame
    (the first ``<module>`` that is not nndb's or runpy's), without nndb's
    own frames and its torch function mode's detour (handle_torch_function
    -> nndb -> the same API again: shown once, as without nndb)."""
    frames = list(summary)
    top = next((i for i, f in enumerate(frames) if f.name == "<module>" and not f.filename.startswith(_OWN_DIR)
                and "runpy" not in f.filename), 0)
    kept = []
    for f in frames[top:]:
        if f.filename.startswith(_OWN_DIR) or f.name == "_nndb_call":
            if kept and kept[-1].name == "handle_torch_function":
                kept.pop()
                if kept:
                    kept.pop()
            continue
        if kept and (kept[-1].filename, kept[-1].lineno, kept[-1].name) == (f.filename, f.lineno, f.name):
            continue                # (the API's wrapper, entered again past the detour)
        kept.append(f)
    return kept


def thread_stacks(skip_current: bool = True) -> list:
    """Every thread's stack (the main thread first): [{thread, main, frames:
    [[file, line, function, text]], collective}]."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    me = threading.get_ident()
    out = []
    for ident, frame in sys._current_frames().items():
        if skip_current and ident == me:
            continue
        summary = traceback.extract_stack(frame)
        frames = _user_frames(summary) if ident == main else list(summary)
        out.append({"thread": names.get(ident, str(ident)), "main": ident == main,
                    "frames": [[f.filename, f.lineno, f.name, (f.line or "").strip()] for f in frames],
                    "collective": collective(summary)})
    out.sort(key=lambda t: (not t["main"], t["thread"]))
    return out


def main_stack(stacks: list) -> Optional[dict]:
    return next((t for t in stacks if t["main"]), None)


def format_rank(report: dict, limit: int = 12) -> str:
    """One rank's report ({rank, step, pid, stacks}) as text, the main thread's stack last-call-last."""
    main = main_stack(report.get("stacks") or [])
    coll = main.get("collective") if main else None
    step = report.get("step")
    done = f"{step} step(s) finished" if step is not None else "no step recorded"
    head = (f"rank {report.get('rank')} (pid {report.get('pid')}): {done}, "
            + (f"waiting in {waiting_in(coll)}" if coll else "not in a collective"))
    lines = [head]
    frames = (main or {}).get("frames") or []
    if len(frames) > limit:
        lines.append(f"  ... {len(frames) - limit} outer frame(s)")
        frames = frames[-limit:]
    for file, line, func, text in frames:
        lines.append(f"  {file}:{line} in {func}")
        if text:
            lines.append(f"    {text}")
    return "\n".join(lines)


def place(rep: dict):
    """(where a rank waits, in words; its whole main stack: the same place if it is unchanged)."""
    main = main_stack(rep.get("stacks") or [])
    if main is None or not main.get("frames"):
        return None
    frames = main["frames"]
    own = [f for f in frames if _TORCH not in f[0]] or frames     # (the script's innermost line)
    file, line, func, text = own[-1]
    where = (waiting_in(main["collective"]) if main.get("collective") else
             f"{os.path.basename(file)}:{line}" + (f" ({text})" if text else f" in {func}")
             + (", inside autograd's backward (where DDP all-reduces the gradients)"
                if frames[-1][2] == "_engine_run_backward" else ""))
    return where, tuple(tuple(f[:3]) for f in main["frames"]), rep.get("step")
