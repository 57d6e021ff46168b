"""What the debugger's commands look at: the last recorded step's statistics,
nndb's ``$`` variables, the models, optimizers and series of the live run, and
a series' history from the trace.  A mixin of Session, kept apart so each file
stays readable."""
from __future__ import annotations

import weakref
from typing import Optional

from ..errors import CommandError
from ..store.schema import KINDS
from . import evaluate as E
from . import points as P


class RunQueries:
    def module_name(self, module) -> str:
        naming = self.rec.naming
        cached = self._module_names.get(id(module))
        if cached is not None and cached[0] == naming.roots_version and cached[2]() is module:
            return cached[1]
        name = naming.module_name(module)
        try:
            self._module_names[id(module)] = (naming.roots_version, name, weakref.ref(module))
        except TypeError:
            pass
        return name

    def _stats_of(self, record):
        if self._view_cache[0] is not record:
            self._view_cache = (record, record.stats)
        return self._view_cache[1]

    def known_names(self, kind: str) -> set:
        """Names that a glob of this kind can match now: modules ("module"),
        or series of a trace kind, from the models seen so far and the last step."""
        names: set = set()
        rec = self.record
        if rec is not None:
            names |= {n for n, k in rec.names if k == kind or (kind == "module" and k == "act")}
        if self.rec is None:
            return names
        naming = self.rec.naming
        for root in self.roots():
            if kind in ("module", "act"):
                names |= {naming.module_name(m) for _, m in root.named_modules()}
            elif kind in ("param", "grad", "update"):
                names |= {naming.param_name(p) for p in root.parameters()}
        return names

    def note_earlier_optimizers(self) -> None:
        """At a run's start: the optimizers alive then are not the run's (the
        tracer's own list of them: one scan serves both)."""
        self._earlier_optimizers = self.rec.tracer.preexisting_optimizers()

    def optimizers(self) -> list:
        """[(name, optimizer)] the script holds."""
        if self.rec is None:
            return []
        from ..tracer.hooks import find_optimizers
        naming = self.rec.naming
        # Only this run's: an earlier run's (before 'run') may still be alive.
        # (One made before the run but stepped in it is this run's too.)
        earlier = getattr(self, "_earlier_optimizers", ())
        stepped = getattr(self.rec.tracer, "_opt_seen", ())
        ours = [o for o in find_optimizers() if o not in earlier or o in stepped]
        # Name them from the script's frames, as the tracer does when it first
        # sees one step: the first name asked for is kept for the whole run.
        frame = self.frames[-1][0] if self.frames else None
        return [(naming.optimizer_name(o, frame), o) for o in ours]

    def history(self, name: str, kind: Optional[str], stat: str):
        """(steps, values, kind) of one series, from the trace (and the steps
        the writer has not flushed yet)."""
        import fnmatch
        series = self.series_names()
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
        col = P.STATS.index(stat)
        values = [row[col] for row in block]
        return list(steps), values, kind

    def history_rows(self, name: str, kind: str):
        """(steps, (N, 10) statistics) of one series, from the trace (while the
        run is live, through its writer: the latest steps too)."""
        with self.trace_reader() as reader:
            s = reader.find(name, kind)
            if not s:
                return [], []
            steps, block = reader.history(s[0])
            return [int(x) for x in steps], block

    def trace_reader(self):
        """A TraceReader of this session's trace: through the live writer (its
        steps not flushed yet too) while the run writes, else from the file."""
        from ..store.reader import TraceReader
        w = self.rec.writer if self.rec is not None else None
        if w is not None and not w.closed:
            return TraceReader.from_writer(w)
        return TraceReader(self.trace_path)

    def series_names(self) -> set:
        # (the live writer's registry of series ids, not a read of the trace:
        # completion asks at each key, and must not flush the writer)
        if self.rec is not None and not self.rec.writer.closed:
            return set(self.rec.writer.series)
        if self.trace_path:
            from ..store.reader import TraceReader
            try:
                with TraceReader(self.trace_path) as reader:
                    return {(s.name, s.kind) for s in reader.series()}
            except Exception:
                return set()
        return set()

    def roots(self) -> list:
        return self.rec.naming.roots() if self.rec is not None else []

    # -- what commands look at --------------------------------------------------------------
    @property
    def frame(self):
        if not self.frames:
            return None
        return self.frames[self.frame_index][0]

    @property
    def record(self):
        """The last recorded step (StepRecord), or None."""
        return self.rec.recorder.last if self.rec is not None else None

    def stat_rows(self, kind: Optional[str] = None) -> dict:
        """{kind: {name: StatRow}} of the last recorded step."""
        out: dict = {k: {} for k in KINDS}
        rec = self.record
        if rec is None:
            return out
        stats = self._stats_of(rec)
        for (name, k), row in zip(rec.names, stats):
            out[k][name] = E.StatRow(name, k, *map(float, row))
        return out

    def variables(self, frame=None, step_end: bool = False, stop=None) -> dict:
        """``stop``: the stop being decided (a module call's, for a point's
        condition), when it is not the current one yet."""
        rows = self.stat_rows()
        loss = next(iter(rows["loss"].values()), None)
        cur = stop if stop is not None else self.current
        v = {
            "step": self.last_step if (step_end or cur is None or cur.at_step_end)
            else cur.step if cur.step is not None else self._step_in_progress(),
            "loss": loss.mean if loss is not None else None,
            "grad": E.StatTable("grad", rows["grad"]),
            "param": E.StatTable("param", rows["param"]),
            "weight": E.StatTable("param", rows["param"]),
            "update": E.StatTable("update", rows["update"]),
            "act": E.StatTable("act", rows["act"]),
            "losses": E.StatTable("loss", rows["loss"]),
        }
        if cur is not None and cur.module is not None and not cur.at_step_end:
            v["module"] = getattr(self, "_module", None)
            v[cur.note or "inputs"] = getattr(self, "_payload", None)
        if cur is not None and cur.exception is not None:
            v["exception"] = cur.exception
        return v
