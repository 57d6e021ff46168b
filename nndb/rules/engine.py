"""The rule engine: runs the enabled rules on the recorded steps, live (the
debugger session calls ``on_record``) or offline, installs the probes they
need (armed only for the steps each wants: ``arm``), and reports each (rule,
tensor or module) once, at its first occurrence.

Which rule runs at a step (see nndb.rules.base): a rule that sets
``EVERY_STEP`` at every recorded step; a rule whose probes have facts for the
step; the others at the observed steps (``nndb.cadence.observed``)."""
from __future__ import annotations

import operator
import weakref
from typing import Iterable, Optional

from ..cadence import OBSERVE_EVERY, SETTLE, next_change, observed
from ..errors import UsageError
from ..tracer.pipeline import lr_number
from .base import Rule, StepContext
from .block import Block
from .probes import PROBES


# Steps judged together at most (nndb.rules.block), and how long the first
# of them may wait: a finding is printed at most this much later.  Blocks
# end at the observed steps anyway (one in OBSERVE_EVERY, judged alone):
# a block's cost is mostly fixed (a few dozen numpy calls), so it spans the
# whole stretch between two of them.
BLOCK_STEPS = OBSERVE_EVERY
BLOCK_SECONDS = 0.25
BLOCK_ROWS = 1 << 16           # (steps x series: the block's stacked rows stay a few MB)


class AsItWas:
    """What the rules read of an optimizer, as it was at a step: its
    parameter groups' parameters, learning rates and eps, and its family
    (the class name: nndb.rules.series.adaptive_eps)."""
    __slots__ = ("param_groups", "family")

    def __init__(self, opt):
        # (the lr's number now: a tensor lr is filled in place by the step a scheduler makes next)
        self.param_groups = [{"params": g["params"], "lr": lr_number(g.get("lr")), "eps": g.get("eps")}
                             for g in opt.param_groups]
        self.family = getattr(opt, "family", None) or type(opt).__name__


_ACTION = operator.attrgetter("action")


def _lr_key(lr):
    v = lr_number(lr)
    return id(lr) if v is None else v


class RuleEngine:
    def __init__(self, rules: Iterable[Rule]):
        self.rules: list = list(rules)
        self.findings: list = []          # every finding reported, in order
        self._seen: set = set()           # (rule id, subject)
        self._probes: dict = {}           # name -> installed probe
        self._arm_groups: Optional[list] = None   # [(wants, [probes])]: the probes by cadence function
        # ``arm`` is due again at this step (before it, no probe's answer changes: a step end asks
        # nothing; cadence.next_change); 0: at the next step end
        self.arm_due = 0
        self._rec = None
        self.errors: list = []            # rules that raised (reported once each, then disabled)
        self._every: Optional[list] = None     # the enabled every-step rules (None: to be listed again)
        # Some probe is in for the step now running: only then can one have
        # facts or an error (most steps: none, and nothing to ask them).
        self.armed = False
        self.probe_news = False           # a probe failed since take_errors last looked (Probe.fail)
        self._queue: list = []            # (record, optimizers, module types) of steps waiting to be judged as a block
        self._types: tuple = (None, None)     # (roots_version, module_types()) as the queued steps saw them
        self._queued_rows = 0
        self.ending = False               # the step being judged is the run's last, as the script raised
        self.longest_block = 0            # most steps judged together so far (a figure for tests and bench)
        self.steps_in_blocks = 0          # steps judged in blocks of two or more (the same)
        self._snapshot = None             # (optimizers' weakrefs, learning rates, [(name, AsItWas)]): as the last step left them
        self._changes: Optional[int] = None   # the optimizers' rows' changes count it was taken at

    # -- the rule set -------------------------------------------------------------

    def probes(self) -> list:
        """The probes installed now."""
        return list(self._probes.values())
    def rule(self, rule_id: str) -> Rule:
        for r in self.rules:
            if r.id == rule_id:
                return r
        raise UsageError(f"no rule '{rule_id}' (there are: {', '.join(r.id for r in self.rules)})")

    def set_enabled(self, rule_id: str, on: bool) -> Rule:
        r = self.rule(rule_id)
        if on and not r.enabled:
            r.resumed()
        r.enabled = on
        self._every = None
        self._sync_probes()
        return r

    def settings(self) -> list:
        """What the prompt may change of each rule (enabled, action, severity,
        thresholds), as plain data: a replica takes them over."""
        return [{"id": r.id, "enabled": r.enabled, "action": r.action, "severity": r.severity,
                 "params": dict(r.params)} for r in self.rules]

    def restore_settings(self, settings: list) -> None:
        by_id = {r.id: r for r in self.rules}
        for d in settings:
            r = by_id.get(d["id"])
            if r is None:
                continue
            r.action, r.severity = d["action"], d["severity"]
            r.params.update(d["params"])
            if r.enabled != d["enabled"]:
                self.set_enabled(r.id, d["enabled"])

    # -- a run --------------------------------------------------------------------
    def attach(self, rec) -> None:
        """A run starts (``rec``: runner.Recording): rules forget, probes go in."""
        self.detach()
        self._rec = rec
        self._every = None
        self._seen.clear()
        for r in self.rules:
            r.reset()
        self._sync_probes()

    def detach(self) -> None:
        self._queue, self._queued_rows = [], 0      # (the session flushes before: nothing is left here)
        self._snapshot = None
        self._types = (None, None)
        for p in self._probes.values():
            p.uninstall()
        self._probes = {}
        self._arm_groups = None
        self.arm_due = 0
        self._rec = None
        self.armed = False

    def _sync_probes(self) -> None:
        self._arm_groups = None
        self.arm_due = 0
        if self._rec is None:
            return
        wanted = {name for r in self.rules if r.enabled for name in r.PROBES}
        for name in list(self._probes):
            if name not in wanted:
                self._probes.pop(name).uninstall()
        for name in wanted:
            if name not in self._probes:
                probe = PROBES[name](self._rec)
                probe.on_fail = self._probe_failed
                probe.on_fact = self._probe_fact
                probe.install()
                self._probes[name] = probe
        self.arm(self._rec.recorder.step)

    def arm(self, step: int) -> None:
        """The step ``step`` starts: the probes it needs are in the tracer, the others out.
        ``arm_due`` says when to call again: the first step where some probe's answer may
        change (the caller skips the steps before it)."""
        groups = self._arm_groups
        if groups is None:
            # Probes that share a cadence function (most of them: nndb.cadence's) ask it once.
            by: dict = {}
            for p in self._probes.values():
                by.setdefault(p.wants, []).append(p)
            groups = self._arm_groups = list(by.items())
        armed = False
        due = step + OBSERVE_EVERY
        for wants, probes in groups:
            on = wants(step)
            for p in probes:
                if on != p._armed:
                    p.arm(on)
            armed = armed or on
            due = min(due, next_change(wants, step))
        self.armed = armed
        self.arm_due = due

    def on_record(self, record, stats=None, optimizers=(), naming=None, defer: bool = False,
                  facts: Optional[dict] = None) -> list:
        """Run the rules on one recorded step; returns the new findings.
        ``naming``: the run's names where there is no run (a trace's stand-ins).
        ``facts``: probe facts given from outside (a trace's, offline).
        ``defer``: a step on which only every-step rules would run, all of
        them with the action ``warn``, may wait in a block (nndb.rules.block)
        to be judged with the next ones; ``flush`` judges what waits (the
        findings returned are then of earlier steps: each names its step)."""
        step = record.step
        if not self.armed and not facts and defer and stats is None and self._rec is not None \
                and not (step < SETTLE or step % OBSERVE_EVERY == 0):      # (observed(step), inline: every step)
            # The usual step: no probe in (so no facts, no probed rule), only
            # every-step rules; they wait in a block if every one only warns.
            every = self._every if self._every is not None else self._every_rules()
            if every and list(map(_ACTION, every)).count("warn") == len(every):      # (_every_warn)
                return self._wait(record, optimizers)
        # (a probe gathers facts only while its callbacks are in: the steps it is armed for)
        given = facts
        facts = {name: p.take(record.step) for name, p in self._probes.items() if p._armed} if self.armed else {}
        if given:                         # (a trace's facts, for the probes it serves: nndb.rules.offline)
            facts.update(given)
        if observed(record.step):
            rules = [r for r in self.rules if r.enabled]
        else:
            every = self._every_rules()
            live = {name for name, f in facts.items() if f}
            probed = [r for r in self.rules if r.enabled and not r.EVERY_STEP and not live.isdisjoint(r.PROBES)] \
                if live else []
            if defer and stats is None and self._rec is not None and every and self._every_warn(every):
                # the every-step rules wait in a block; a probe's rules judge this step now
                new = self._wait(record, optimizers)
                if probed:
                    ctx = StepContext(record, stats, facts, self.module_types, optimizers, self._rec.naming)
                    for r in probed:
                        self._judge(r, ctx, new)
                    ctx.judged()
                return new
            rules = [r for r in self.rules if r in every or r in probed] if probed else every
        new = self.flush() if self._queue else []
        if not rules:
            return new
        naming = self._rec.naming if self._rec is not None else naming
        ctx = StepContext(record, stats, facts, self.module_types, optimizers, naming)
        for r in rules:
            self._judge(r, ctx, new)
        ctx.judged()
        return new

    def _every_rules(self) -> list:
        """The enabled every-step rules (listed again after a rule is switched on or off)."""
        if self._every is None:
            self._every = [r for r in self.rules if r.EVERY_STEP and r.enabled]
        return self._every

    @staticmethod
    def _every_warn(every: list) -> bool:
        """Does every one of these rules only warn (the prompt may change an action at any stop)?"""
        return [r.action for r in every].count("warn") == len(every)

    def _wait(self, record, optimizers) -> list:
        q = self._queue
        # The modules' classes as the step saw them: judged later (at the run's end), its
        # model may be gone (word_language_model loads its best model into ``model`` after
        # training: the last block's embedding looked like a layer, a false exploding_gradient).
        version = self._rec.naming.roots_version
        if version != self._types[0]:
            self._types = (version, self.module_types())
        # The optimizers as they were: the last snapshot while the step pipeline saw none of
        # their rows change (nndb.tracer.pipeline.WriteRecords.changes), else taken again.
        state = getattr(optimizers, "state", None)
        changes = state.changes if state is not None else None
        if changes is None or changes != self._changes or self._snapshot is None:
            q.append((record, self._as_it_was(optimizers), self._types[1]))
            self._changes = changes
        else:
            q.append((record, self._snapshot[2], self._types[1]))
        self._queued_rows += len(record.names)
        if len(q) < BLOCK_STEPS and self._queued_rows < BLOCK_ROWS and record.time - q[0][0].time < BLOCK_SECONDS:
            return []
        return self.flush()

    def _as_it_was(self, optimizers) -> list:
        """[(name, AsItWas)] of the optimizers now: judged later, a step still
        reads the learning rate it had (a scheduler may change it before).
        The last snapshot again while no learning rate has changed."""
        raw = getattr(optimizers, "raw", None)       # (the optimizers without their names: cheaper)
        opts = None if raw is not None else optimizers() if callable(optimizers) else optimizers
        objs = raw() if raw is not None else [o for _, o in opts]
        # (one list of every group's learning rate; a float compares as itself, anything else by _lr_key)
        lrs = []
        for o in objs:                       # (loops, not comprehensions: no call of their own, once a step)
            for g in o.param_groups:
                lr = g.get("lr")
                lrs.append(lr if type(lr) is float else _lr_key(lr))
        # (the optimizers by weak reference: two alive compare as themselves, a dead one as none other)
        refs = list(map(weakref.ref, objs))
        last = self._snapshot
        if last is None or last[0] != refs or last[1] != lrs:
            if opts is None:
                opts = optimizers()
            self._snapshot = last = (refs, lrs, [(name, AsItWas(o)) for name, o in opts])
        return last[2]

    @property
    def waiting(self) -> bool:
        """Steps wait to be judged (``flush``)."""
        return bool(self._queue)

    def flush(self) -> list:
        """Judge the steps waiting in a block (nndb.rules.block); the new findings, in step order."""
        q, self._queue, self._queued_rows = self._queue, [], 0
        if not q:
            return []
        self.longest_block = max(self.longest_block, len(q))
        if len(q) > 1:
            self.steps_in_blocks += len(q)
        rules = self._every_rules()
        naming = self._rec.naming if self._rec is not None else None

        def context(record, opts=q[-1][1], types=q[-1][2]):
            return StepContext(record, None, {}, types, opts, naming)
        block = Block.of([rec for rec, _, _ in q], context, [opts for _, opts, _ in q]) if len(q) > 1 else None
        rest = []
        for r in rules:
            done = None
            if block is not None:
                try:
                    done = r.check_block(block)
                except Exception as e:
                    self._failed(r, e)
                    continue
            if not done:
                rest.append(r)
        new: list = []
        if rest:
            for rec, opts, types in q:     # (step by step, in the order a step judges them)
                ctx = context(rec, opts, types)
                for r in rest:
                    if r.enabled:
                        self._judge(r, ctx, new)
        return new

    def _judge(self, r: Rule, ctx: StepContext, new: list) -> None:
        if self.ending:
            ctx.ending = True
        try:
            found = list(r.check(ctx) or ())
        except Exception as e:   # a rule never breaks the run: it is switched off, said once
            self._failed(r, e)
            return
        for f in found:
            key = (f.rule, f.subject)
            if key in self._seen:
                continue
            self._seen.add(key)
            self.findings.append(f)
            new.append(f)

    def _failed(self, r: Rule, e: Exception) -> None:
        r.enabled = False
        self._every = None
        self.errors.append(f"rule {r.id} failed and is disabled: {type(e).__name__}: {e}")

    def _probe_failed(self) -> None:
        self.probe_news = True

    def _probe_fact(self) -> None:
        self.armed = True       # (this step's end takes the facts; arm() says again at arm_due)

    def take_errors(self) -> list:
        """Rules and probes that failed since the last call (each said once,
        and kept in the trace's events)."""
        if not self.errors and not self.probe_news:
            return []
        out = list(self.errors)
        self.errors = []
        if self._rec is not None:
            for msg in out:
                self._rec.note("rule_disabled", msg)
        if self.probe_news:
            for p in self._probes.values():
                if p.error is not None and not getattr(p, "_said", False):
                    p._said = True
                    out.append(p.error)
                    if self._rec is not None:
                        self._rec.note("probe_disabled", p.error)
            self.probe_news = False
        return out

    def module_types(self) -> dict:
        """Activation series name -> module class name, for the modules seen
        (computed again only when a new model appears)."""
        if self._rec is None:
            return {}
        naming = self._rec.naming
        cached = getattr(self, "_types_cache", None)
        if cached is not None and cached[0] is naming and cached[1] == naming.roots_version:
            return cached[2]
        out = {}
        for root in naming.roots():
            for _, m in root.named_modules():
                out[naming.module_name(m)] = type(m).__name__
        self._types_cache = (naming, naming.roots_version, out)
        return out


def describe(engine: Optional[RuleEngine]) -> list:
    return [r.describe() for r in engine.rules] if engine is not None else []
