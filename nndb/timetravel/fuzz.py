"""``fuzz`` at a stop: the live process forks, and the child (a replica, as
``predict`` makes) runs the script on to the model's next forward pass and
``loss.backward()``, recording the loss computation (nndb.fuzz.tape); at
``backward()``, before it runs, the child fuzzes the model with the batch it
was just given, reports, and ends.  The live process only waits: its
parameters, optimizer state, gradients, RNG states and data are those of
its own memory, which the child cannot touch.

Where the model's forward is seen but no ``loss.backward()`` follows it
within the step, the step's end is where the fuzzing happens, on the
model's output and activations alone (the report says so).
"""
from __future__ import annotations

import fnmatch
import math
import os
import traceback
from dataclasses import asdict
from typing import Optional

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.overrides import _push_mode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from ..run.paths import FUZZ_STAMP
from . import forking, sandbox
from ..debugger.modes import StepEnd
from .roles import Role, finish
from ..fuzz import search
from ..fuzz.mutate import spec_for
from ..fuzz.objective import ConditionFailed, Evaluator, Goal, Model
from ..fuzz.tape import Tape


def fuzz(s, machine, goal: dict) -> Optional[dict]:
    """Fork a fuzzing replica at this stop; its report (``{"error": ...}`` when it failed).
    None in the replica (whose command returns at once: the script runs on there)."""
    from .predict import fork_and_wait
    msg = fork_and_wait(s, machine, lambda chan: _become_fuzzer(s, machine, chan, goal))
    if msg is None:
        return None
    return msg.get("result") or {"error": msg.get("error", "the fuzzing replica reported nothing")}


def _become_fuzzer(s, machine, chan, goal: dict) -> None:
    machine.replica = True
    machine.checkpoints = {}
    s.rec.writer.detach()
    sandbox.enter(nndb_files=[s.log.trace_path])
    role = FuzzRole(chan, goal)
    s.become_replica(role)
    role.begin(s)
    s.input.queue.clear()
    s.set_continue()


class FuzzRole(Role):
    kind = "fuzz"

    def __init__(self, chan, goal: dict):
        super().__init__(chan, goal)
        self.s = None
        self.model = None            # the root module first called from here on
        self.args = None
        self.step = None
        self.depth = 0
        self.tape: Optional[Tape] = None
        self.rng: Optional[torch.Tensor] = None
        self._handles: list = []

    def begin(self, s) -> None:
        super().begin(s)
        self.s = s
        self._handles = [register_module_forward_pre_hook(self._pre), register_module_forward_hook(self._post)]
        s.rec.tracer.want_forward(True)          # (so that the tracer sees the forward as before)

    def interruptible(self) -> bool:
        return True

    def interrupted(self, s) -> None:
        self.fail("interrupted (Ctrl-C); nothing was changed")

    def before_stops(self, s, step: int):
        if self.model is not None and self.tape is not None:
            self.run(None, self.step)        # the step ended: no loss.backward() was seen
        return StepEnd.SKIP

    def run_ended(self, s, status: str, reason: str) -> None:
        self.fail(f"the script ended ({f'{status}: {reason}' if reason else status}) before the model's next "
                  "forward pass")

    def fail(self, message: str) -> None:
        forking.unsilence(self.saved_fds)
        self.saved_fds = None
        finish(self.chan, {"op": "fuzzed", "error": message})

    # -- what the step feeds the model ----------------------------------------------------------
    def _pre(self, module, args):
        if self.depth == 0 and self.model is None and next(module.parameters(), None) is not None:
            self.model, self.args = module, args
            # the random numbers the step's forward draws from (dropout): every mutant draws the same
            self.rng = torch.get_rng_state()
            st, stop = self.s.last_step, self.s.here.stop
            self.step = 0 if st is None else st + (1 if stop is None or stop.at_step_end else 0)
        self.depth += 1
        return None

    def _post(self, module, args, output):
        self.depth = max(0, self.depth - 1)
        if self.depth == 0 and module is self.model and self.tape is None:
            inputs = [t for t in pytree.tree_leaves(self.args) if isinstance(t, torch.Tensor)]
            self.outputs = [t for t in pytree.tree_leaves(output)]
            self.tape = Tape(inputs, self.outputs, self._backward)
            _push_mode(self.tape)
        return None

    def _backward(self, tape, loss) -> None:
        self.run(loss, self.step)

    # -- the fuzzing --------------------------------------------------------------------------------
    def run(self, loss, step) -> None:
        for h in self._handles:
            h.remove()
        s = self.s
        s.rec.tracer.want_forward(False)          # (nndb's own hooks see none of the mutants)
        try:
            with torch._C.DisableTorchFunction(), _disable_current_modes(), torch.enable_grad():
                result = self._fuzz(s, loss, step)
        except ConditionFailed as e:
            self.fail(str(e))
        except Exception as e:
            tb = traceback.format_exc(limit=-2).strip().splitlines()
            self.fail(f"fuzzing failed: {type(e).__name__}: {e} ({tb[-3].strip() if len(tb) > 2 else ''})")
        forking.unsilence(self.saved_fds)
        self.saved_fds = None
        finish(self.chan, {"op": "fuzzed", "result": result})

    def _fuzz(self, s, loss, step) -> dict:
        g = self.goal
        naming = s.rec.naming
        mod = self.model
        names = {m: naming.module_name(m) for m in mod.modules()}
        leaves, spec = pytree.tree_flatten((tuple(self.args), {}))
        at = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        m = Model(mod, names, leaves, spec, at, param_names={id(p): naming.param_name(p) for p in mod.parameters()},
                  rng=self.rng)
        notes = []
        tape = self.tape
        if loss is not None and tape is not None and tape.key_of(loss) is not None and not tape.overflow:
            m.tape, m.loss_key = tape, tape.key_of(loss)
            m.loss_calls = tape.needed(m.loss_key)
        else:
            notes.append("the loss could not be reproduced (no loss.backward() on a value computed from the "
                         "model's output after its forward pass): the model's output and activations are fuzzed "
                         "alone" + ("; a gradient objective needs the loss" if g.get("until") != "nan" else ""))
        layers = _layers(mod, names, g.get("layers"))
        goal = Goal(g.get("until") or "nan", g.get("against"), g.get("tolerance"))
        if goal.until != "nan":
            from ..debugger import evaluate as E
            goal.code = E.compile_expr(goal.until)
        ev = Evaluator(m, goal, layers)
        inputs = m.inputs()
        vocab = next((e.num_embeddings for e in mod.modules() if isinstance(e, torch.nn.Embedding)), None)
        specs = [spec_for(t, vocab) for t in inputs]
        if not inputs:
            raise ConditionFailed(f"{names.get(mod, type(mod).__name__)} was called with no tensor among its positional "
                                  "arguments: fuzz sees those only (a call such as model(x=batch) gives it none)")
        if all(sp.kind == "fixed" for sp in specs):
            raise ConditionFailed("the model's inputs cannot be mutated (no float or integer tensor with a range)")
        rows = search.batch_rows(inputs, specs)
        cfg = search.FuzzConfig(budget=int(g["budget"]), seed=int(g.get("seed", 0)), scale=float(g["scale"]),
                                random=bool(g.get("random")), threshold=g.get("threshold"))
        res = search.run(lambda x: ev(x, rows), inputs, specs, cfg)
        res.notes = notes + res.notes
        out = {k: v for k, v in asdict(res).items() if k != "inputs"}
        out.update(step=step, model=names.get(mod, type(mod).__name__),
                   layers=[n for n, _ in layers] or ["the model's output"], loss_reproduced=m.tape is not None,
                   inputs=[{"shape": list(t.shape), "dtype": str(t.dtype)[6:], "mutation": sp.describe()}
                           for t, sp in zip(inputs, specs)],
                   goal={"until": goal.until, "against": goal.against,
                         "tolerance": getattr(ev, "tolerance", None)},
                   evaluations=ev.evaluations, budget=cfg.budget, seed=cfg.seed, scale=cfg.scale)
        out["location"] = out["saved"] = None          # (the JSON report's keys are always there)
        if res.found is not None:
            if res.found.get("what") == "nan":
                out["location"] = _locate(s, ev, res.inputs, res.found, step)
            out["saved"] = _save(g.get("save_tmp"), res, m, step)
        ev.close()
        return _json_safe(out)


def _layers(mod, names: dict, glob: Optional[str]) -> list:
    if not glob:
        return []
    hits = [(n, m) for m, n in names.items() if m is not mod and (fnmatch.fnmatchcase(n, glob)
                                                                  or fnmatch.fnmatchcase(n.split(".", 1)[-1], glob))]
    if not hits:
        inner = [n for m, n in names.items() if m is not mod]
        raise ConditionFailed(f"--layers {glob}: no module of {names.get(mod)} matches " +
                              (f"(have: {', '.join(inner[:8])})" if inner else
                               f"({names.get(mod)} has no submodules: leave --layers out, its output is the default)"))
    return hits


def _save(path: Optional[str], res, m: Model, step) -> Optional[str]:
    """The input found, as tensors only (loads with torch.load(weights_only=True))."""
    if not path:
        return None
    sandbox.OWN.append(os.path.dirname(os.path.abspath(path)))     # (the live run's directory for it, not the user's)
    consts = m.tape.constants(m.loss_calls) if m.tape is not None else []
    torch.save({FUZZ_STAMP: 1, "inputs": [t.detach().clone() for t in res.inputs],
                "loss_constants": [t.detach().clone() for t in consts],
                "step": int(step), "found": str(res.found.get("what")), "mutant": int(res.tried)}, path)
    return path


def _locate(s, ev: Evaluator, inputs: list, found: dict, step) -> dict:
    """The operation and source line that made the first non-finite value:
    the found input run again under catch nan's op recorder."""
    from types import SimpleNamespace
    from ..lineage.catchstep import catch_detail
    from ..lineage.ops import OpRecorder
    from ..tracer.within import WithinStep
    stand_in = SimpleNamespace(naming=s.rec.naming, lineage=None, in_hook=False, busy=0, within=WithinStep())
    rec = OpRecorder(stand_in, check=True)
    handles = []
    for mod in ev.m.module.modules():
        handles.append(mod.register_forward_pre_hook(lambda mod, args: rec.module_pre(mod, args)))
        handles.append(mod.register_forward_hook(lambda mod, args, out: rec.module_post(mod, args, out)))
    starts: list = []
    rec.start(int(step or 0))
    try:
        out = ev.forward(inputs, hooks=False)
        for h in handles:
            h.remove()
        loss = ev.loss(inputs, out, before=lambda idx: starts.append((len(rec.current.ops), idx)))
        if found.get("where") == "gradient" or loss is not None and bool(torch.isfinite(loss.detach()).all()):
            ev.grads(loss if loss is not None else out)
    finally:
        for h in handles:
            h.remove()
        lin = rec.stop()
    data = lin.as_dict() if lin is not None else {}
    ops = data.get("ops", [])
    # (an operation that made it: where a NaN came in with an input is no finding of the input's)
    events = [e for e in data.get("events", []) if e[1].get("entered") is None]
    if not events:
        return {"unlocated": "no operation made a non-finite value from finite inputs on the replay"}
    idx, info = events[0]
    detail = catch_detail(ops, int(step or 0), int(idx), info)
    op_idx = int(idx) if info.get("origin") is None else int(info["origin"])
    first = max((k for k in starts if k[0] <= op_idx), default=None)
    if first is not None and detail.get("phase") == "forward" and not detail.get("module"):
        call = ev.m.tape.calls[first[1]]
        detail["file"], detail["line"] = call.where
    return {k: detail.get(k) for k in ("op", "phase", "module", "file", "line", "nan")}


def _json_safe(x):
    if isinstance(x, float):
        return x if math.isfinite(x) else repr(x)
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x
