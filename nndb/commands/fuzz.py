"""``fuzz``: coverage-guided fuzzing of the model at a stop, on a replica
(nndb.fuzz).  The command checks the options and the session, forks the
fuzzing replica, keeps the input found and turns the report into lines."""
from __future__ import annotations

import os
import shlex
import tempfile
from dataclasses import dataclass
from typing import Optional

from ..errors import CommandError, UsageError
from ..run.paths import claim_output
from ..debugger.modes import State
from ..debugger.points import parse_int
from .table import Command

USAGE = ("fuzz [--until nan|EXPR] [--against fp16|bf16] [--tolerance T] [--budget N] [--layers GLOB] "
         "[--seed S] [--random] [--scale F] [--threshold D] [--save FILE.pt]")
DEFAULT_BUDGET = 1000
DEFAULT_SCALE = 0.1


@dataclass
class FuzzArgs:
    until: str = "nan"
    against: Optional[str] = None
    tolerance: Optional[float] = None
    budget: int = DEFAULT_BUDGET
    layers: Optional[str] = None
    seed: int = 0
    random: bool = False
    scale: float = DEFAULT_SCALE
    threshold: Optional[float] = None
    save: Optional[str] = None


def _float(text: str, what: str, low: float = 0.0, high: float = float("inf")) -> float:
    try:
        v = float(text)
    except ValueError:
        raise CommandError(f"{what} must be a number, not '{text}'") from None
    if not (low < v <= high):
        raise CommandError(f"{what} must be in ({low:g}, {high:g}], not {text}")
    return v


def parse(text: str) -> FuzzArgs:
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise CommandError(f"cannot split the arguments: {e}") from None
    a = FuzzArgs()
    valued = {"--until", "--against", "--tolerance", "--budget", "--layers", "--seed", "--scale",
              "--threshold", "--save"}
    while words:
        w = words.pop(0)
        key, eq, val = w.partition("=")
        if key in valued:
            if not eq:
                if not words:
                    raise CommandError(f"{key} needs a value")
                val = words.pop(0)
            if key == "--until":
                a.until = val.strip() or "nan"
                if a.until != "nan":
                    from ..debugger import evaluate as E
                    E.compile_expr(a.until)
            elif key == "--against":
                if val not in ("fp16", "bf16"):
                    raise CommandError(f"--against takes fp16 or bf16, not '{val}'")
                a.against = val
            elif key == "--tolerance":
                a.tolerance = _float(val, "--tolerance")
            elif key == "--budget":
                a.budget = parse_int(val, "the budget")
                if a.budget < 1:
                    raise CommandError(f"the budget must be at least 1, not {a.budget}")
            elif key == "--layers":
                a.layers = val
            elif key == "--seed":
                a.seed = parse_int(val, "the seed")
            elif key == "--scale":
                a.scale = _float(val, "--scale", 0.0, 1.0)
            elif key == "--threshold":
                a.threshold = _float(val, "--threshold")
            else:
                a.save = val
        elif w == "--random":
            a.random = True
        else:
            raise CommandError(f"unexpected '{w}'")
    if a.against and a.until != "nan":
        raise CommandError("--against and --until are two objectives: give one")
    if a.tolerance is not None and not a.against:
        raise CommandError("--tolerance goes with --against")
    if a.save is not None:
        if not a.save.endswith(".pt"):
            raise CommandError(f"--save {a.save}: the file is a .pt (torch.save of tensors)")
        try:
            claim_output(a.save, "--save", "fuzz")
        except UsageError as e:
            raise CommandError(str(e)) from None
    return a


def _fresh_path(step, directory: str = ".") -> str:
    base = os.path.join(directory, f"nndb-fuzz-step{step}")
    path, i = base + ".pt", 1
    while os.path.exists(path):
        i += 1
        path = f"{base}-{i}.pt"
    return os.path.abspath(path)


def run_fuzz(s, a: FuzzArgs) -> Optional[dict]:
    """Fuzz at this stop; the replica's report (raises CommandError when it could not; None in the replica)."""
    from .timetravel import machine
    m = machine(s)
    if m.replica:
        raise CommandError("fuzz runs from the live run ('present' returns to it)")
    if s.control.state is not State.LIVE:
        raise CommandError("fuzz needs a live run stopped at a step")
    if s.here.stop is not None and not s.here.stop.at_step_end:
        # (inside a step the model's forward has begun: its next module call is not the model's)
        raise CommandError("fuzz starts at a step end (the batch of the next step): 'finish' first")
    from ..timetravel import forking
    why = forking.blockers()
    if why:
        raise CommandError("fuzz needs a fork() replica, and this process cannot be forked safely: " + "; ".join(why))
    from ..timetravel.fuzz import fuzz
    tmp = tempfile.mkdtemp(prefix="nndb-fuzz-")
    goal = {"until": a.until, "against": a.against, "tolerance": a.tolerance, "budget": a.budget,
            "layers": a.layers, "seed": a.seed, "random": a.random, "scale": a.scale, "threshold": a.threshold,
            "save_tmp": os.path.join(tmp, "found.pt")}
    res = fuzz(s, m, goal)
    if res is None:
        return None            # (in the replica: the script runs on to where it fuzzes)
    try:
        if res.get("error"):
            raise CommandError(f"fuzz: {res['error']}; the live run is unchanged")
        if res.get("saved"):
            res["saved"] = _keep(res, a.save)
    finally:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    s.log.fuzz_reports.append(res)
    return res


def _keep(res: dict, save: Optional[str]) -> Optional[str]:
    """Move the input found from the replica's scratch file to ``save`` (or
    ./nndb-fuzz-stepN.pt); where that cannot be written (a path that passed
    the checks, /proc/x.pt, a full disk), to a fresh name in the working
    directory, else in the temporary directory, with a note saying why and
    where.  The input is never lost to a write error; None if nowhere took it."""
    import shutil
    step = res.get("step")
    tries = [os.path.abspath(save) if save else _fresh_path(step)]
    tries += [_fresh_path(step), _fresh_path(step, tempfile.gettempdir())]
    failed = []
    for dest in dict.fromkeys(tries):
        existed = os.path.lexists(dest)
        try:
            shutil.copyfile(res["saved"], dest)
        except OSError as e:
            failed.append(f"cannot write {dest}: {e.strerror or e}")
            if not existed and os.path.isfile(dest):
                try:
                    os.unlink(dest)          # (half a file, from a full disk)
                except OSError:
                    pass
            continue
        if failed:
            res.setdefault("notes", []).append(f"{failed[0]}; the input found is saved in {dest}")
        return dest
    res.setdefault("notes", []).append("; ".join(failed) + "; the input found is not saved")
    return None


def _fuzz(s, a: FuzzArgs):
    res = run_fuzz(s, a)
    return None if res is None else render(res)


def render(r: dict) -> list:
    """The report as lines (nndb fuzz --json prints the dict itself)."""
    def num(x):
        return x if isinstance(x, str) else f"{x:.6g}"
    mode = "random search" if r["mode"] == "random" else "coverage-guided"
    goal = r["goal"]
    objective = (f"disagreement with a {goal['against']} copy beyond {goal['tolerance']:g} (relative)"
                 if goal.get("against") else "a non-finite activation, loss or gradient"
                 if goal["until"] == "nan" else f"'{goal['until']}'")
    out = [f"Fuzzed the batch of step {r['step']} on a replica ({mode}, seed {r.get('seed', 0)}): "
           f"{r['tried']} mutant batch(es) of {r['rows']} row(s) in {r['seconds']:.2f} s; the live run is unchanged."]
    out.append(f"  objective: {objective}")
    out.append(f"  model: {r['model']}; coverage from: {', '.join(r['layers'])}; "
               f"nearest-neighbour distance threshold {num(r['threshold'])}")
    for i, inp in enumerate(r["inputs"]):
        out.append(f"  input {i}: {inp['dtype']} {tuple(inp['shape'])}: {inp['mutation']}")
    if r.get("loss_reproduced"):
        loss = r.get("seed_loss")
        out.append("  loss: replayed from the script's own computation"
                   + (f" (on the step's batch: {num(loss)})" if loss is not None else ""))
    out.append(f"  coverage: {r['coverage']} activation vector(s) ({r['seed_coverage']} from the step's batch); "
               f"corpus: {r['corpus']} input row(s)")
    for n in r.get("notes", []):
        out.append(f"  note: {n}")
    f = r.get("found")
    if f is None:
        out.append(f"Nothing found within the budget of {r['budget']} mutant batch(es).")
        return out
    what = f.get("what")
    if what == "nan":
        desc = {"activation": f"a non-finite output of {f.get('name')}", "loss": "a non-finite loss",
                "gradient": f"a non-finite gradient of {f.get('name')}"}.get(f.get("where"), "a non-finite value")
    elif what == "condition":
        desc = f"'{f.get('condition')}' true"
    else:
        desc = f"{f.get('against')} disagrees by {num(f.get('relative'))} (tolerance {num(f.get('tolerance'))})"
        if f.get("note"):
            desc += f": {f['note']}"
    loss = f.get("loss")
    out.append(f"Found: {desc} at mutant {f.get('mutant')}" + (f" (loss {num(loss)})" if loss is not None else "") + ".")
    loc = r.get("location")
    if loc:
        if loc.get("unlocated"):
            out.append(f"  where: not located ({loc['unlocated']})")
        else:
            mod = f" in {loc['module']}" if loc.get("module") else ""
            out.append(f"  where: {loc['op']} ({loc['phase']}){mod} at {os.path.basename(str(loc['file']))}:{loc['line']}")
    if r.get("saved"):
        out.append(f"  input saved: {r['saved']} (torch.load(..., weights_only=True): 'inputs' in the model's "
                   f"argument order, 'loss_constants' the loss's other tensors)")
    return out


COMMANDS = [
    Command("fuzz", USAGE, """Fuzz the model with mutants of the current batch, on a replica (TensorFuzz).
At a step end, a fork of the run goes on to the model's next forward pass and
loss.backward() (the current batch: the next step's), records the loss as the
script computes it, and mutates the batch: float inputs by bounded noise
(--scale, default 0.1, of their observed range), integer inputs (token ids)
within their vocabulary.  Mutants reaching new coverage (nearest-neighbour
distance of the --layers' activation vectors, default the model's output,
a wider layer on the batch's first principal axis, above --threshold,
default the batch's own median nearest-neighbour distance) are kept and
mutated further.  It stops at the objective:
a NaN/Inf activation, loss or gradient (default), --until EXPR (loss, output,
grad_norm), or --against fp16|bf16 disagreeing beyond --tolerance.  --random:
random search with the same mutations.  The input found is saved as a .pt.
The live run is never changed.""",
            _fuzz, parse, args=("sub:--until|--against|--tolerance|--budget|--layers|--seed|--random|--scale|"
                                "--threshold|--save",), group="time travel"),
]
