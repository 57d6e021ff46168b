"""``nndb check``: the checklist practitioners run by hand on a new training
script, run on the first steps of the real, unmodified script.  UI-free:
``check(target)`` returns a CheckReport; nndb/render/check.py prints it.

How it sees the script: the script runs in this process under the tracer
(runner.Recording) for ``steps`` steps; at its next module call or
optimizer step KillRun unwinds it, as the debugger's ``kill`` does.  Tracer probes see each root module's inputs and
output and each optimizer step; a TorchFunctionMode, pushed only while the
script runs, sees the calls of torch.nn.functional's losses (so
``nn.CrossEntropyLoss`` and ``F.cross_entropy`` alike) with their input and
target.  *The model* is the root module whose output the loss was computed
on (else the one whose parameters the optimizer holds); nothing of the
script is changed, so its numbers are those of a plain run.  (One visible
difference: a warning torch raises inside a function called through the
mode names the mode's line as its location.)

The checks, in order, and their thresholds (constants in checks.py):

1. ``data``: the model's input tensors (shape, dtype, range, mean, std) and,
   for a classification loss, the label set.  FAIL: NaN/Inf; a float input
   in [0, 255] reaching RAW_PIXELS_MIN_MAX with >= 99% whole numbers (raw
   pixels); |x| beyond INPUT_ABS_MAX (not normalised); labels outside
   [0, C); one label for all of >= CONSTANT_LABELS_MIN targets.  An input
   after the first holding only -inf and one finite value is an additive
   attention mask (generate_square_subsequent_mask): said, not judged.
2. ``shapes``: prediction vs target.  FAIL: an element-wise loss (MSE, L1,
   BCE...) whose prediction and target shapes differ (they broadcast).
3. ``initial-loss``: the first loss vs the loss of a uniform prediction
   (ln C for cross-entropy/NLL, C from the class dim; ln 2 for binary
   cross-entropy).  FAIL: above max(INIT_LOSS_FACTOR x, + INIT_LOSS_MARGIN),
   a negative NLL, or cross-entropy fed probabilities (a softmax before it).
   A lower loss passes (a pretrained model).
4. ``finite-loss``: every loss backward() was called on is finite.
5. ``gradients``: every parameter an optimizer holds (requires_grad) gets
   a finite gradient with a non-zero element in some captured step, and
   never a NaN/Inf one.
6. ``zero-grad``: each optimizer's ``.grad`` is reset between its steps:
   the live ``stale_grad`` rule's probe (a tensor hook on one sample
   parameter per optimizer) and thresholds; FAIL at the first step whose
   ``.grad`` is the last step's gradient plus the new ones (one stale step
   is enough; the live rule waits for two in a row).  SKIP when no
   optimizer stepped twice.
7. ``updates``: every parameter that got a non-zero gradient changes in
   ``optimizer.step()``, in some captured step.
8. ``overfit``: a deep copy of the model (taken at its first forward, in the
   train/eval modes of its first forward with autograd on: the training one) and a fresh optimizer of the same class
   and hyper-parameters (a scheduler's ``initial_lr`` as the lr) train on
   the captured batch (its first OVERFIT_BATCH samples) for up to
   OVERFIT_ITERS iterations, the global RNG saved and restored.  "Close to
   zero": the loss gets below OVERFIT_REL of its first value, or below
   OVERFIT_ABS; where the loss has a floor above 0 (the targets' entropy:
   soft targets, label smoothing), OVERFIT_REL of the way from it.  Missed at
   the script's lr without diverging: trained again from the same start at
   overfit.FASTER times every group's lr, PASS where that gets there.

A check that cannot be decided (no optimizer, no loss function seen, the
script raised first) is SKIP with the reason.  ``run`` is FAIL if the
script raised (or exited non-zero) in the first steps.
"""
from __future__ import annotations

import contextlib
import gc
import os
import sys
import tempfile
import traceback
from typing import Callable

from ..run import launcher, meta as runmeta
from ..run.config import RunConfig
from ..errors import KillRun, UsageError
from ..run.launcher import Target
from ..run.runner import Recording
from ..text import printable
from .capture import Capture, LossMode
from .checks import (OVERFIT_ITERS, Check, CheckReport, Outcome, data_check, finite_check, grad_reset_check,
                     gradients_check, initial_loss_check, shapes_check, updates_check)
from .overfit import overfit as overfit_check

CHECK_STEPS = 2                 # steps of the script the checks look at (a warmup from lr 0 passes)

__all__ = ["check", "run_checks", "Check", "CheckReport", "CHECK_STEPS", "OVERFIT_ITERS"]


# -- running it ----------------------------------------------------------------------------
def _where(exc: BaseException) -> str:
    """The innermost frame of the script's own code in the traceback."""
    from ..tracer.naming import skip_dirs
    frames = traceback.extract_tb(launcher.user_traceback(exc.__traceback__))
    own = [f for f in frames if not f.filename.startswith(skip_dirs())] or frames
    if not own:
        return ""
    f = own[-1]
    return f" at {os.path.basename(f.filename)}:{f.lineno} in {f.name}"


def _stderr(msg: str) -> None:
    print(printable(msg), file=sys.stderr, flush=True)


class _UserInterrupt:
    """Tells a Ctrl-C (SIGINT: the user stops nndb check) from a KeyboardInterrupt
    the script raises itself (a FAIL line, like any exception of the script)."""

    def __init__(self):
        self.seen = False
        self._old = None

    def __enter__(self):
        import signal
        import threading
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._old = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        self.seen = True
        raise KeyboardInterrupt

    def __exit__(self, *exc):
        if self._old is not None:
            import signal
            signal.signal(signal.SIGINT, self._old)


def check(target: Target, steps: int = CHECK_STEPS, overfit_iters: int = OVERFIT_ITERS,
          message: Callable[[str], None] = _stderr, script_stdout=None,
          on_step_end: Callable[[int], None] = None) -> CheckReport:
    """Run the script's first ``steps`` steps and the checklist on them.
    ``script_stdout``: where the script's prints go (default: stdout);
    ``on_step_end(step)``: called as each step of the script ends."""
    if steps < 1:
        raise UsageError(f"--steps must be at least 1, not {steps}")
    if overfit_iters < 1:
        raise UsageError(f"--overfit-iters must be at least 1, not {overfit_iters}")
    prepared = launcher.prepare(target)
    gc.collect()            # an earlier run's optimizers must not look alive to the step clock
    outcome = Outcome()
    with tempfile.TemporaryDirectory(prefix="nndb-check-") as tmp:
        config = RunConfig(target, os.path.join(tmp, "check.h5"), quiet=True)
        meta = runmeta.collect(target, config.schedule.describe())
        rec = Recording(config.trace_path, meta, config, message, on_step_end)
        cap = Capture(rec, steps)
        cap.install()
        out = contextlib.redirect_stdout(script_stdout) if script_stdout is not None else contextlib.nullcontext()
        user = _UserInterrupt()
        try:
            with user, rec, out, LossMode(cap):
                launcher.run(prepared)
        except KillRun:
            pass
        except SystemExit as e:
            code = launcher.system_exit_code(e)
            if code:
                outcome = Outcome("exited", f"the script exited with status {code} (sys.exit({e.code!r}))")
        except KeyboardInterrupt as e:
            if user.seen:
                raise
            outcome = Outcome("raised", f"KeyboardInterrupt{': ' + str(e) if str(e) else ''}, raised by "
                                        f"the script{_where(e)}")
        except BaseException as e:      # the script raised: a FAIL line, never a traceback
            outcome = Outcome("raised", f"{type(e).__name__}: {e}{_where(e)}")
        finally:
            cap.uninstall()
            rec.close("killed" if outcome.status == "finished" else "failed", 0, outcome.error)
    return CheckReport(target.display, cap.steps_done, _context(cap), run_checks(cap, outcome, overfit_iters))


CHECKS = (("data", data_check), ("shapes", shapes_check), ("initial-loss", initial_loss_check),
          ("finite-loss", finite_check), ("gradients", gradients_check), ("zero-grad", grad_reset_check),
          ("updates", updates_check))


def run_checks(cap: Capture, outcome: Outcome, overfit_iters: int = OVERFIT_ITERS) -> list:
    """The checklist on what the first steps showed: ``run``, then the eight checks in order."""
    steps = cap.steps_done
    if outcome.status == "finished":
        ran = Check("run", "PASS", f"{steps} step(s) ran" + ("" if steps >= cap.steps else " (the script ended)"),
                    numbers={"steps": steps})
    else:
        ran = Check("run", "FAIL", f"after {steps} step(s): {outcome.error}",
                    "the script itself fails in its first steps: fix that first", numbers={"steps": steps})
    checks = [ran]
    for name, fn in CHECKS:
        checks.append(_safely(name, fn, cap, outcome))
    checks.append(_safely("overfit", overfit_check, cap, outcome, overfit_iters))
    if cap.errors:
        ran.evidence += "; nndb could not watch everything: " + "; ".join(cap.errors)
    return checks


def _safely(name: str, fn, *args) -> Check:
    try:
        return fn(*args)
    except Exception as e:          # a check nndb could not carry out is skipped, not a traceback
        # (one line: torch's errors go on for pages, a dispatcher's kernel table)
        said = (str(e).strip().splitlines() or [""])[0]
        said = said if len(said) <= 200 else said[:197] + "..."
        return Check(name, "SKIP", f"nndb could not run this check: {type(e).__name__}: {said}")


def _context(cap: Capture) -> dict:
    seen, call = cap.model(), cap.primary_loss()
    model = None
    if seen is not None:
        chain = cap.chain(call) if call is not None else None
        mods = [s.module for s, _ in chain] if chain and chain[0][0] is seen else [seen.module]
        names = [(cap.rec.naming.module_name(m), type(m).__name__) for m in mods]
        model = " -> ".join(f"{name} ({cls})" if name else cls for name, cls in names)
    return {"model": model, "optimizers": [type(o.opt).__name__ for o in cap.optimizers],
            "loss": call.name if call else None}
