"""``nndb check`` run in a child process, so that a script that ends its own
process in its first steps (``os._exit(5)``, a signal, a crash in C) still
gets its FAIL line: the checks run in a ``fork()`` of nndb, which tells the
parent each step that ends and, at the end, the report (JSON, over a pipe);
a child that ends without a report is the script's doing, and the parent
writes the report: ``run`` FAIL with the step and the status, every other
check SKIP.  Nothing of the script is changed (no ``os._exit`` is patched).

The parent forks before torch is imported (it only waits); Ctrl-C reaches
the child (same process group), which ends its check as ``nndb check``
always did.  Without ``fork()`` the check runs in this process.
"""
from __future__ import annotations

import json
import os
import signal
import sys
from typing import Optional

from ..errors import EXIT_SIGINT, NndbError

CHECK_NAMES = ("run", "data", "shapes", "initial-loss", "finite-loss", "gradients", "zero-grad", "updates",
               "overfit")


class Interrupted(Exception):
    """The user pressed Ctrl-C during the check (exit 130)."""


def run_check(target, steps: int, overfit_iters: int, script_stdout=None):
    """The CheckReport of ``nndb check``; NndbError, Interrupted as the check raised them."""
    if not hasattr(os, "fork"):
        from . import check
        try:
            return check(target, steps, overfit_iters, script_stdout=script_stdout)
        except KeyboardInterrupt:
            raise Interrupted() from None
    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                        # the child: never returns
        os.close(r)
        _child(w, target, steps, overfit_iters, script_stdout)
    os.close(w)
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # (the child gets the Ctrl-C and says so)
    try:
        last_step, final = _listen(r)
        status = _wait(pid)
    finally:
        signal.signal(signal.SIGINT, old)
        os.close(r)
    if final is None:
        return _ended_early(target, last_step, status)
    if "report" in final:
        return _from_dict(final["report"])
    if final.get("interrupted"):
        raise Interrupted()
    err = NndbError(final.get("error", "the check failed"))
    err.exit_code = int(final.get("exit_code", err.exit_code))
    raise err


def _send(fd: int, msg: dict) -> None:
    data = (json.dumps(msg) + "\n").encode("utf-8")
    while data:
        data = data[os.write(fd, data):]


def _child(w: int, target, steps: int, overfit_iters: int, script_stdout) -> None:
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from . import check
        def progress(step):
            try:
                _send(w, {"step": int(step)})
            except OSError:
                pass
        report = check(target, steps, overfit_iters, script_stdout=script_stdout, on_step_end=progress)
        _send(w, {"report": report.to_dict()})
    except NndbError as e:
        _send(w, {"error": str(e), "exit_code": e.exit_code})
    except KeyboardInterrupt:
        _send(w, {"interrupted": True})
    except BaseException as e:      # (an nndb bug: the parent reports it as main() would)
        try:
            _send(w, {"error": f"internal error: {type(e).__name__}: {e}", "exit_code": 3})
        except OSError:
            code = 3
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        os._exit(code)


def _listen(r: int):
    """(the last step that ended, the final message or None) from the child's pipe."""
    buf, last_step, final = b"", None, None
    while True:
        try:
            chunk = os.read(r, 65536)
        except InterruptedError:
            continue
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "step" in msg:
                last_step = msg["step"]
            else:
                final = msg
    return last_step, final


def _wait(pid: int) -> int:
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return status
        except InterruptedError:
            continue
        except ChildProcessError:
            return 0


def _how(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"the script's process was killed by {name}"
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else status
    return f"the script ended its process with status {code} (os._exit({code}) or the like)"


def _ended_early(target, last_step: Optional[int], status: int):
    from .checks import Check, CheckReport
    steps = 0 if last_step is None else last_step + 1
    where = f"in step {steps}" if steps else "before its first step ended"
    checks = [Check("run", "FAIL", f"after {steps} step(s): {_how(status)} {where}",
                    "the script ends its own process in its first steps: nndb cannot look at the rest",
                    numbers={"steps": steps})]
    checks += [Check(name, "SKIP", "the script ended its process before the checks could run")
               for name in CHECK_NAMES[1:]]
    # (the child found the model, optimizer and loss, but ended before it could say: not 'none seen')
    return CheckReport(target.display, steps, {"model": None, "optimizers": [], "loss": None,
                                               "unknown": "model, optimizer and loss not known: the script "
                                                          "ended its process before nndb could report them"},
                       checks)


def _from_dict(d: dict):
    from .checks import Check, CheckReport
    return CheckReport(d["target"], d["steps"], d["context"], [Check(**c) for c in d["checks"]])


__all__ = ["run_check", "Interrupted", "EXIT_SIGINT"]
