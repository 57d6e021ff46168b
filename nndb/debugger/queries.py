"""What the debugger's commands look at: the last recorded step's statistics,
nndb's ``$`` variables, the models, optimizers and series of the live run, and
a series' history from the trace.  ``RunView`` is owned by the session
(``session.view``): it reads the session's run and stop and keeps only its
caches (module names, the last record's statistics, the optimizers that were
alive before the run, the run's optimizers as the rules name them); it
changes nothing."""
from __future__ import annotations

import fnmatch
import re
import sys
import weakref
from typing import Optional

import numpy as np

from .. import globs
from ..errors import CommandError
from ..text import NOT_MEASURED
from ..store.measured import measured, measured_column
from ..schema import KINDS, default_stat
from . import evaluate as E
from .hyperparams import numpy_number
from . import points as P


# Why a tensor is recorded under a name other than the one the script gives it (queries'
# renamed_points, and the watch that names it so)
RENAMED_WHY = ("a parametrized or pruned layer's tensor is recorded under the name of the parameter that "
               "holds it, weights tied at several paths under the first")


def _as_the_script_names_it(name: str) -> str:
    """``0.weight`` for the tensor a parametrization or torch.nn.utils.prune keeps it in."""
    head, sep, tail = name.rpartition(".parametrizations.")
    if sep and re.fullmatch(r"[^.]+\.original\d*", tail):
        return f"{head}.{tail.split('.')[0]}"
    return name[:-len("_orig")] if name.endswith("_orig") else name


def _plain(v) -> bool:
    return isinstance(v, (int, float, bool, str, type(None))) or \
        (isinstance(v, tuple) and all(isinstance(x, (int, float)) for x in v)) or _one_number(v) \
        or numpy_number(v) is not None


def _one_number(v) -> bool:
    """A tensor of one real number: a tensor lr (torch's compiled-optimizer recipe,
    ``Adam(lr=torch.tensor(0.01))``; the lr AdafactorSchedule writes)."""
    import torch
    return isinstance(v, torch.Tensor) and v.numel() == 1 and not v.is_complex() and v.layout is torch.strided


class _TensorNumber:
    """How ``info optimizer`` shows a one-number tensor: its value with every digit, ``.item()``'s."""

    def __init__(self, t):
        self.value = t.detach().item()

    def __repr__(self) -> str:
        return f"tensor({self.value!r})"


def _shown(v):
    if _one_number(v):
        return _TensorNumber(v)
    x = numpy_number(v)
    return v if x is None else x


class RunView:
    """Queries over a session's run (bdb's get_stack/get_breaks role)."""

    def __init__(self, session):
        self.s = session
        self._module_names: dict = {}        # id(module) -> (roots_version, name, weakref)
        self.stats_cache = (None, None)      # (record, its statistics): read by the rules at every step end
        self._earlier_optimizers: tuple = ()
        self.rule_optimizers = None          # (stoppoints._NamedOptimizers of the run, made once by run_rules)

    def module_name(self, module) -> str:
        naming = self.s.rec.naming
        cached = self._module_names.get(id(module))
        if cached is not None and cached[0] == naming.roots_version and cached[2]() is module:
            return cached[1]
        name = naming.module_name(module)
        try:
            self._module_names[id(module)] = (naming.roots_version, name, weakref.ref(module))
        except TypeError:
            pass
        return name

    def stats_of(self, record):
        if self.stats_cache[0] is not record:
            self.stats_cache = (record, record.stats)
        return self.stats_cache[1]

    def cached_stats(self, record):
        """``record``'s statistics if they were asked for already, else None."""
        return self.stats_cache[1] if self.stats_cache[0] is record else None

    def known_names(self, kind: str) -> set:
        """Names that a glob of this kind can match now: modules ("module"),
        or series of a trace kind, from the models seen so far and the last step."""
        names: set = set()
        rec = self.s.record
        if rec is not None:
            names |= {n for n, k in rec.names if k == kind or (kind == "module" and k == "act")}
        if self.s.rec is None:
            return names
        last = self.s.rec.recorder.last
        if last is not None and last is not rec:
            # (a hand-written loop's prompt shows step N as far as it is known; the record
            # written last, step N-1's, has what comes after a step's end: clip_grad_norm_)
            names |= {n for n, k in last.names if k == kind or (kind == "module" and k == "act")}
        naming = self.s.rec.naming
        if kind in ("module", "act"):
            for root in self.roots():
                names |= {naming.module_name(m) for _, m in root.named_modules()}
        elif kind in ("param", "grad", "update"):
            # (the tensors a script trains outside any module too: Naming.adopt; a frozen one,
            # requires_grad=False, has no gradient to match: its '$grad' read 'not measured')
            names |= {naming.param_name(p) for p in naming.root_params() if kind != "grad" or p.requires_grad}
        return names

    def point_names(self, kind: str) -> set:
        """known_names, and for a module stop point the names it also matches: the modules'
        names qualified by their model's variable where they are not (``model.2`` for ``2``:
        Naming.qualified_alias), which Tab does not offer twice."""
        names = self.known_names(kind)
        if kind == "module" and self.s.rec is not None:
            # (the models' own, and their modules' names as the trace has them once the models
            # are gone: a run killed before 'break module model.2' stopped)
            names |= {f"{m}.{n}" for m in self.s.rec.naming.unqualified_models() for n in set(names)}
        return names

    def pending_points(self) -> list:
        """The watchpoints and module breakpoints whose glob matches nothing
        seen (gdb's pending breakpoints), as the run ends: neither a name known
        now nor a series recorded at any step (a run whose last row is a partial
        step, a forward the script raised after, has no loss there: a loss
        watchpoint that matched every step before was said to be pending, exit 2)."""
        out, recorded = [], None
        for p in sorted(self.s.points.values(), key=lambda p: p.number):
            kind = p.kind if isinstance(p, P.Watch) else "module" if isinstance(p, P.ModuleBreak) else None
            if kind is None or p.hits:
                continue
            if any(globs.matches(n, p.glob) for n in self.point_names(kind)):
                continue
            if recorded is None:
                recorded = self.series_names()
            series_kind = "act" if kind == "module" else kind
            if not any(k == series_kind and globs.matches(n, p.glob) for n, k in recorded):
                out.append(p)
        return out

    def renamed_points(self) -> list:
        """[(watchpoint, the tensors it did not look at)] of the parameter, gradient and update
        watchpoints never hit whose glob leaves out tensors it would match under the name the
        script gives them: a parametrized layer's weight is recorded as its original
        (``0.parametrizations.weight.original``: weight_norm's two, spectral_norm's,
        orthogonal's), a pruned one's as ``0.weight_orig``; ``watch grad *.weight`` on a
        spectral-normed discriminator looked at none of its weights, and said nothing.  So are
        weights tied at several paths, recorded under the first (``watch grad lm_head.weight``
        on GPT-2, whose ``transformer.wte.weight`` it is, was said to match no tensor)."""
        out = []
        tied = self.s.rec.naming.tied_paths() if self.s.rec is not None else {}
        for p in sorted(self.s.points.values(), key=lambda p: p.number):
            if not isinstance(p, P.Watch) or p.hits or p.kind not in ("param", "grad", "update"):
                continue
            missed = self.renamed_matches(p.kind, p.glob, tied)
            if missed:
                out.append((p, missed))
        return out

    def tied_names(self) -> dict:
        """{the other path of weights tied at several paths: the name they are recorded under}."""
        tied = self.s.rec.naming.tied_paths() if self.s.rec is not None else {}
        return {a: n for n, others in tied.items() for a in others}

    def renamed_matches(self, kind: str, glob: str, tied=None) -> list:
        """The tensors of ``kind`` that ``glob`` does not match by the names they are recorded
        under but by a name the script gives them (``renamed_points``)."""
        tied = (self.s.rec.naming.tied_paths() if self.s.rec is not None else {}) if tied is None else tied
        return sorted(n for n in self.known_names(kind) if not globs.matches(n, glob) and (
            globs.matches(_as_the_script_names_it(n), glob) or any(globs.matches(a, glob) for a in tied.get(n, ()))))

    def compiled_points(self) -> list:
        """[(module breakpoint or activation watchpoint, the modules it matches,
        their compiled module)] of the points never hit whose modules all run
        inside a ``torch.compile``'d module, where nndb's module hooks do not
        look (an activation watch that also matches a recorded series, the
        compiled module's own, is not one)."""
        out = []
        if self.s.rec is None:
            return out
        naming = self.s.rec.naming
        rec = self.s.record
        recorded = [n for n, k in rec.names if k == "act"] if rec is not None else []
        for p in sorted(self.s.points.values(), key=lambda p: p.number):
            if p.hits:
                continue
            if isinstance(p, P.Watch):
                if p.kind != "act" or any(globs.matches(n, p.glob) for n in recorded):
                    continue
            elif not isinstance(p, P.ModuleBreak):
                continue
            matched = [m for root in self.roots() for _, m in root.named_modules()
                       if globs.matches(naming.module_name(m), p.glob)]
            around = {naming.compiled_around(m) for m in matched}
            if matched and None not in around:
                out.append((p, sorted({naming.module_name(m) for m in matched}), ", ".join(sorted(around))))
        return out

    def note_earlier_optimizers(self) -> None:
        """At a run's start: the optimizers alive then are not the run's (the
        tracer's own list of them: one scan serves both)."""
        self._earlier_optimizers = self.s.rec.tracer.preexisting_optimizers()

    def optimizers(self) -> list:
        """[(name, optimizer)] the script holds."""
        if self.s.rec is None:
            return []
        from ..tracer.hooks import find_optimizers
        naming = self.s.rec.naming
        # Only this run's: an earlier run's (before 'run') may still be alive.
        # (One made before the run but stepped in it is this run's too.)
        earlier = self._earlier_optimizers
        stepped = self.s.rec.tracer.optimizers()
        ours = inner_optimizers([o for o in find_optimizers() if o not in earlier or o in stepped])
        # Name them from the script's frames, as the tracer does when it first
        # sees one step: the first name asked for is kept for the whole run.
        frame = self.s.here.frames[-1][0] if self.s.here.frames else None
        # by name: the garbage collector's order depends on what ran before in the process
        return sorted(((naming.optimizer_name(o, frame), o) for o in ours), key=lambda no: no[0])

    def optimizer_named(self, name: str, opts: Optional[list] = None) -> list:
        """[(nndb's name, optimizer)] that ``name`` means at this stop, as a
        debugger scopes a name: the stopped frame's own first (a local, or an
        attribute of its ``self``: ``self.opt`` of the stage that steps now,
        where nndb's table may call another optimizer ``opt``), then nndb's
        names.  [] when neither has it."""
        opts = self.optimizers() if opts is None else opts
        frame = self.s.here.frames[-1][0] if self.s.here.frames else None
        if frame is not None:
            local = frame.f_locals
            me = local.get("self")
            for cand in (local.get(name), getattr(me, "__dict__", {}).get(name) if me is not None else None):
                mine = [(n, o) for n, o in opts if o is cand]
                if cand is not None and mine:
                    return mine
        return [(n, o) for n, o in opts if n == name]

    def kinds_of(self, name: str) -> list:
        """The kinds ``name`` is recorded as, in the order ``nndb inspect --series``
        shows them side by side (param, update, grad; then the others)."""
        order = ("param", "update", "grad", "act", "loss")
        kinds = {k for n, k in self.series_names() if n == name}
        return sorted(kinds, key=lambda k: order.index(k) if k in order else len(order))

    def history(self, name: str, kind: Optional[str], stat: Optional[str]):
        """(steps, values, kind) of one series, from the trace (and the steps
        the writer has not flushed yet); a value is None where it was not measured.
        ``stat`` None: the kind's default (schema.default_stat)."""
        series = self.series_names()
        if not any(n == name for n, _ in series):
            name = self.tied_names().get(name, name)    # (weights tied at several paths: one series)
        if kind is None:
            kinds = sorted({k for n, k in series if n == name})
            if not kinds:
                near = sorted({n for n, _ in series if fnmatch.fnmatchcase(n, f"*{name}*")})[:6]
                raise CommandError(f"no tensor named '{name}' has been recorded"
                                   + (f" (did you mean: {', '.join(near)})" if near else ""))
            if len(kinds) > 1:
                raise CommandError(f"'{name}' is recorded as {', '.join(kinds)}: say which "
                                   f"(history {kinds[0]} {name})")
            kind = kinds[0]
        elif (name, kind) not in series:
            raise CommandError(f"no {kind} tensor named '{name}' has been recorded")
        steps, block = self.history_rows(name, kind)
        return list(steps), measured_column(block, stat or default_stat(kind), P.STATS), kind

    def history_rows(self, name: str, kind: str):
        """(steps, (N, 10) statistics) of one series, from the trace (while the
        run is live, through its writer: the latest steps too), and the step
        that just ended where the trace does not hold it yet (``unwritten``)."""
        steps, block = [], np.zeros((0, len(P.STATS)))
        with self.trace_reader() as reader:
            s = reader.find(name, kind)
            if s:
                steps, block = reader.history(s[0])
                steps = [int(x) for x in steps]
        last = self.unwritten()
        if last is not None and (name, kind) in last.names:
            row = self.stats_of(last)[last.names.index((name, kind))]
            steps, block = steps + [last.step], np.concatenate([block, row[None]])
        return steps, block

    def partial_steps(self) -> set:
        """The steps of the rows that are no whole step (the work after the run's
        last step end, the step the script raised in: nndb.Trace.partial), in the
        trace and the record not written yet."""
        with self.trace_reader() as reader:
            out = {int(x) for x in np.asarray(reader.steps)[np.asarray(reader.partial, dtype=bool)]}
        last = self.unwritten()
        if last is not None and last.partial:
            out.add(last.step)
        return out

    def unwritten(self):
        """The record of the step that just ended if the trace does not hold
        it yet (a hand-written loop's step N, written with its update at the
        end of N+1: its loss, gradients and activations), else None."""
        rec, w = self.s.step_record, self.s.rec.writer if self.s.rec is not None else None
        if rec is None or w is None or w.closed or (w.last_step is not None and w.last_step >= rec.step):
            return None
        return rec

    def trace_reader(self):
        """A TraceReader of this session's trace: through the live writer (its
        steps not flushed yet too) while the run writes, else from the file."""
        from ..store.reader import TraceReader
        w = self.s.rec.writer if self.s.rec is not None else None
        if w is not None and not w.closed:
            return TraceReader.from_writer(w)
        return TraceReader(self.s.log.trace_path)

    def series_names(self) -> set:
        # (the live writer's registry of series ids, not a read of the trace:
        # completion asks at each key, and must not flush the writer)
        if self.s.rec is not None and not self.s.rec.writer.closed:
            last = self.unwritten()
            return set(self.s.rec.writer.series) | set(last.names if last is not None else ())
        if self.s.log.trace_path:
            from ..store.reader import TraceReader
            try:
                with TraceReader(self.s.log.trace_path) as reader:
                    return {(s.name, s.kind) for s in reader.series()}
            except Exception:
                return set()
        return set()

    def roots(self) -> list:
        return self.s.rec.naming.roots() if self.s.rec is not None else []

    def module_summary(self) -> list:
        """[(name, type name, parameters of its own)] of every module of the models seen."""
        rows = []
        naming = self.s.rec.naming if self.s.rec is not None else None
        for root in self.roots():
            for _, m in root.named_modules():
                rows.append((naming.module_name(m), type(m).__name__,
                             sum(p.numel() for p in m.parameters(recurse=False))))
        return rows

    def param_summary(self) -> list:
        """[(name, shape, dtype, requires_grad, norm, grad norm or None)] of every
        parameter of the models seen (a shared one once), then of the tensors the
        script trains outside any module: by hand, or in an optimizer (LBFGS over an image,
        style transfer's ``optimizer = LBFGS([input_img])``: it was left out, and the table
        showed the frozen model's parameters alone), norms in float64."""
        rows = []
        naming = self.s.rec.naming if self.s.rec is not None else None
        params = naming.root_params() if naming is not None else []
        if naming is not None:
            seen = set(map(id, params))
            for _, opt in self.optimizers():
                for g in opt.param_groups:
                    for p in g["params"]:
                        if id(p) not in seen:
                            seen.add(id(p))
                            params.append(p)
        for p in params:
            g = p.grad
            rows.append((naming.param_name(p), tuple(p.shape), str(p.dtype).replace("torch.", ""),
                         p.requires_grad, float(p.detach().double().norm()),
                         float(g.detach().coalesce().values().double().norm() if g.is_sparse
                               else g.detach().double().norm()) if g is not None else None))
        return rows

    def optimizer_groups(self) -> list:
        """[(optimizer name, optimizer, group index, params, {hyper-parameter: value})]:
        the plain values of each param group (numbers, strings, tuples of numbers, and a tensor
        of one number by its value: a tensor lr was left out, so no lr was shown); ``params``,
        their number, or the name of a group's one parameter (an optimizer per parameter,
        stepped in its post-accumulate-grad hook: its optimizers adam, adam2 ... said nothing of
        which parameter each steps, and 'set lr' and 'predict --set' ask for one by name)."""
        naming = self.s.rec.naming if self.s.rec is not None else None

        def params(g):
            ps = g["params"]
            return naming.param_name(ps[0]) if len(ps) == 1 and naming is not None else len(ps)
        return [(name, opt, gi, params(g), {k: _shown(v) for k, v in g.items() if k != "params" and _plain(v)})
                for name, opt in self.optimizers() for gi, g in enumerate(opt.param_groups)]

    # -- what commands look at --------------------------------------------------------------
    def stat_rows(self, kind: Optional[str] = None, unrecorded: bool = False) -> dict:
        """{kind: {name: StatRow}} of the last recorded step (NOT_MEASURED:
        a statistic not measured at the step; ``unrecorded``: every one, the
        step asked about was not recorded)."""
        out: dict = {k: {} for k in KINDS}
        rec = self.s.record
        if rec is None:
            return out
        stats = self.stats_of(rec)
        mask = (np.zeros(stats.shape, dtype=bool) if unrecorded else measured(stats)).tolist()
        for (name, k), row, ok in zip(rec.names, stats.tolist(), mask):   # (one numpy pass: conditions ask every step)
            out[k][name] = E.StatRow(name, k, *(v if m else NOT_MEASURED for v, m in zip(row, ok)))
        return out

    def unrecorded_step(self, step_end: bool = False, stop=None) -> bool:
        """At the end of a step that was not recorded (--every N, --steps A:B):
        the last record is an earlier step's, which ``$loss``, ``$grad``... and
        the stop line must not show as this one's."""
        cur = stop if stop is not None else self.s.here.stop
        at_end = step_end or (cur is not None and cur.at_step_end)
        return at_end and self.s.record is not None and self.s.step_record is None

    @staticmethod
    def _loss_values(rows: dict) -> list:
        return [(name, E.loss_value(row)) for name, row in rows["loss"].items()]

    def last_loss(self):
        """The last recorded step's (first) loss, or None: what the bottom bar shows."""
        return next(iter(self._loss_values(self.stat_rows("loss"))), (None, None))[1]

    def losses(self) -> list:
        """[(name, value)] of the last recorded step's losses, in the record's
        order: one (``loss``), or one per optimizer (a GAN's ``loss/optimizerD``
        first, the optimizer that stepped first; a WGAN's critic, the closing optimizer, before
        the generator that stepped in some of its steps only).  ``$loss`` is the first.
        [] at the end of a step that was not recorded."""
        return [] if self.unrecorded_step() else self._loss_values(self.stat_rows("loss"))

    def variables(self, frame=None, step_end: bool = False, stop=None) -> dict:
        """``stop``: the stop being decided (a module call's, for a point's
        condition), when it is not the current one yet."""
        cur = stop if stop is not None else self.s.here.stop
        step = (self.s.last_step if (step_end or cur is None or cur.at_step_end)
                else cur.step if cur.step is not None else self.s.step_in_progress())
        # $loss, $grad ... are the statistics of the step $step names, or not measured: never an
        # earlier step's (a step not recorded; a stop inside a step, whose statistics are not
        # taken yet: they were the last step's; the start of the run, before any)
        rec = self.s.record
        unrecorded = self.unrecorded_step(step_end, stop) or rec is None or rec.step != step
        rows = self.stat_rows(unrecorded=unrecorded)
        loss = next(iter(self._loss_values(rows)), (None, NOT_MEASURED))[1]
        v = {
            "step": step,
            "loss": loss,
            "grad": E.StatTable("grad", rows["grad"], lambda: self.known_names("grad"), self.tied_names),
            "param": E.StatTable("param", rows["param"], lambda: self.known_names("param"), self.tied_names),
            "weight": E.StatTable("param", rows["param"], lambda: self.known_names("param"), self.tied_names),
            "update": E.StatTable("update", rows["update"], lambda: self.known_names("update"), self.tied_names),
            "act": E.StatTable("act", rows["act"], lambda: self.known_names("act")),
            "losses": E.StatTable("loss", rows["loss"]),
            "full": E.FullLookup(self.trace_reader),
        }
        if cur is not None and cur.module is not None and not cur.at_step_end:
            v["module"] = self.s.here.module
            v[cur.note or "inputs"] = self.s.here.payload
        if cur is not None and cur.exception is not None:
            v["exception"] = cur.exception
        return v


def inner_optimizers(opts: list) -> list:
    """``opts`` less the wrappers of another of them (accelerate's AcceleratedOptimizer, a
    torch.optim.Optimizer holding the script's as ``.optimizer``; Opacus's DPOptimizer, as
    ``.original_optimizer``: held under any attribute, with ``param_groups`` that are the held
    one's): one optimizer to name, set and predict, the one its scheduler drives.
    And less the shard optimizer a ZeroRedundancyOptimizer holds as ``.optim`` (its
    ``param_groups`` are its own, which the wrapper overwrites with its own groups' values at
    each step: a change made to the shard's is undone; the script's is the wrapper)."""
    ids = {id(o) for o in opts}
    shards = {id(o.optim) for o in opts if _holds_shard(o)}
    return [o for o in opts if not any(id(x) in ids and x is not o and _same_groups(o, x) for x in _attributes(o))
            and id(o) not in shards]


def _attributes(o) -> list:
    """The values of ``o``'s own attributes (none for an object without a ``__dict__``)."""
    try:
        d = object.__getattribute__(o, "__dict__")
    except Exception:
        return []
    return list(d.values()) if isinstance(d, dict) else []


def _holds_shard(o) -> bool:
    """A wrapper whose held optimizer, ``.optim``, keeps groups of its own that it syncs
    from the wrapper's (torch.distributed.optim.ZeroRedundancyOptimizer)."""
    # (from the script's own import, never ours: importing torch.distributed.optim compiles its
    # functional optimizers with TorchScript, 1.3 s on this machine, at the first stop of every run)
    zero = sys.modules.get("torch.distributed.optim.zero_redundancy_optimizer")
    cls = getattr(zero, "ZeroRedundancyOptimizer", None)
    return cls is not None and isinstance(o, cls) and not _same_groups(o, getattr(o, "optim", None))


def _same_groups(a, b) -> bool:
    try:
        return a.param_groups is b.param_groups
    except Exception:
        return False
