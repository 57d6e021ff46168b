"""The diagnostic rules at the prompt: ``info rules`` and ``rule``
(enable, disable, action, severity, threshold, show).  They act on the
session's RuleEngine (``session.rules``; None with ``--rules none``)."""
from __future__ import annotations

from ..errors import CommandError, UsageError
from ..rules.base import ACTIONS, SEVERITIES
from .table import Command, Table

RULE_USAGE = ("rule enable|disable ID... | rule action ID warn|stop|fail | rule severity ID error|warning|info"
              " | rule threshold ID NAME VALUE | rule show ID")
SUBCOMMANDS = ("enable", "disable", "action", "severity", "threshold", "show")
RULES_OFF = "Rules are off (nndb run --rules none)."


def _engine(s):
    if s.rules is None:
        raise CommandError(RULES_OFF)
    return s.rules


def _rule(engine, rule_id: str):
    try:
        return engine.rule(rule_id)
    except UsageError as e:
        raise CommandError(str(e)) from None


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _settings(r) -> str:
    cond = getattr(r, "condition", None)
    if cond is not None:
        return f"if {cond.source}"
    return ", ".join(f"{k}={_fmt(v)}" for k, v in r.params.items())


def info_rules(s):
    if s.rules is None:
        return RULES_OFF
    counts: dict = {}
    for f in s.log.findings:
        counts[f["rule"]] = counts.get(f["rule"], 0) + 1
    rows = [(r.id, r.severity, r.action, "y" if r.enabled else "n", counts.get(r.id, 0), _settings(r))
            for r in s.rules.rules]
    return Table(("rule", "severity", "action", "enb", "found", "thresholds"), rows, empty="No rules.")


def _rule_arg(text):
    words = text.split()
    if not words:
        raise CommandError("rule what? (" + " | ".join(SUBCOMMANDS) + ")")
    sub, args = words[0], words[1:]
    hits = [c for c in SUBCOMMANDS if c.startswith(sub)]
    if sub not in SUBCOMMANDS:
        if len(hits) != 1:
            raise CommandError(f"unknown rule command '{sub}' (one of: {', '.join(SUBCOMMANDS)})")
        sub = hits[0]
    want = {"enable": None, "disable": None, "show": 1, "action": 2, "severity": 2, "threshold": 3}[sub]
    if not args:
        raise CommandError(f"rule {sub} needs a rule id (info rules lists them)")
    if want is not None and len(args) != want:
        raise CommandError(f"rule {sub} takes {want} word{'s' if want > 1 else ''}, not {len(args)}")
    if sub == "action" and args[1] not in ACTIONS:
        raise CommandError(f"unknown action '{args[1]}' (one of: {', '.join(ACTIONS)})")
    if sub == "severity" and args[1] not in SEVERITIES:
        raise CommandError(f"unknown severity '{args[1]}' (one of: {', '.join(SEVERITIES)})")
    if sub == "threshold":
        try:
            args[2] = float(args[2])
        except ValueError:
            raise CommandError(f"'{args[2]}' is not a number") from None
    return sub, args


def _rule_cmd(s, arg):
    sub, args = arg
    engine = _engine(s)
    if sub in ("enable", "disable"):
        rules = [_rule(engine, a) for a in dict.fromkeys(args)]       # all known before any change
        for r in rules:
            engine.set_enabled(r.id, sub == "enable")
        return f"Rule{'s' if len(rules) > 1 else ''} {', '.join(r.id for r in rules)} {sub}d."
    r = _rule(engine, args[0])
    if sub == "show":
        return _show(r)
    if sub == "action":
        r.action = args[1]
        return f"Rule {r.id}: action {r.action}."
    if sub == "severity":
        r.severity = args[1]
        return f"Rule {r.id}: severity {r.severity}."
    name, value = args[1], args[2]
    if name not in r.THRESHOLDS:
        known = ", ".join(r.THRESHOLDS) or "none"
        raise CommandError(f"rule {r.id} has no threshold '{name}' (it has: {known})")
    problem = r.threshold_problem(name, value)
    if problem:
        raise CommandError(problem)
    value = r.set_threshold(name, value)
    return f"Rule {r.id}: {name} = {_fmt(value)} (default {_fmt(r.THRESHOLDS[name].default)})."


def _show(r):
    lines = [f"{r.id} ({r.severity}, action {r.action}, {'enabled' if r.enabled else 'disabled'}): "
             f"{r.explanation}"]
    cond = getattr(r, "condition", None)
    if cond is not None:
        lines.append(f"  condition: {cond.source}")
    for k, t in r.THRESHOLDS.items():
        lines.append(f"  {k} = {_fmt(r.params[k])} (default {_fmt(t.default)}): {t.why}")
    return lines


COMMANDS = [
    Command("rule", RULE_USAGE, """Change a diagnostic rule for the rest of the session ("info rules" lists them).
  rule enable ID...      rule disable ID...
  rule action ID warn|stop|fail      warn: report; stop: stop here; fail: stop, and exit code 4
  rule severity ID error|warning|info
  rule threshold ID NAME VALUE       one of the rule's thresholds
  rule show ID                       what it catches, its thresholds and where they come from
A rule file (nndb run --rules FILE.yaml) sets the same things at start.""",
            _rule_cmd, _rule_arg, args=("sub:" + "|".join(SUBCOMMANDS), "rule"), group="rules",
            ranks="suffix"),
]
