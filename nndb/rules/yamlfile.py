"""The YAML rule file (``nndb run --rules FILE.yaml``).

The schema (every key is optional; an empty file means the built-in rules
with their defaults)::

    default: all              # all (the default): start from every built-in rule;
                              # none: start from no rule, only those listed below
    rules:
      - id: stale_grad        # a built-in rule (by its id): change it
        enabled: true         # true|false (with default: none, listing a rule enables it)
        action: fail          # warn (report and go on) | stop (stop at the prompt) |
                              # fail (stop; the run exits with code 4)
        severity: error       # error | warning | info
        thresholds: {steps: 3}   # only the rule's own thresholds ("info rules")
      - name: big_grad        # a new rule: its id
        condition: max(grad.norm) > 1e3    # nndb/rules/condition.py: the language
        message: "some gradient norm above 1e3"   # optional
        explanation: "..."    # optional: one line for "info rules"
        action: stop          # default warn
        severity: warning     # default warning
        enabled: true

Each rule appears once.  A new rule's ``name`` must not be a built-in id and
looks like an identifier (letters, digits, ``_ . -``).  A new rule reports
once per tensor that makes its condition true (once in all if the condition
names none), at the step it first does, with the tensor and the value in the
message (a vector condition: the first tensor not reported before, then the
others new at that step).

Every mistake (YAML syntax, an unknown key, rule id, action, severity,
threshold or statistic, a threshold out of its range, a bad condition, a
tag, a NUL byte or other binary data, a file over MAX_BYTES) raises
UsageError ``FILE:LINE: message`` when the file is loaded, before the script
runs.  The file is read with PyYAML's safe loader: no Python objects, no tags.
A threshold is a finite number >= 0 (a whole one where the default is: a
step count); an infinite one would silently turn its rule off.
"""
from __future__ import annotations

import math
import re

import yaml
from yaml.constructor import SafeConstructor

from ..errors import UsageError
from ..schema import series_label
from ..text import fmt
from .base import ACTIONS, SEVERITIES, Rule
from .condition import Condition, ConditionError

TOP_KEYS = ("default", "rules")
BUILTIN_KEYS = ("id", "enabled", "action", "severity", "thresholds")
NEW_KEYS = ("name", "condition", "message", "explanation", "action", "severity", "enabled")
DEFAULTS = {"all": True, "default": True, "none": False}
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\Z")
MAX_BYTES = 1 << 20         # a rule file is a few lines; this bounds reading /dev/zero and the like
# The tags a plain YAML rule file resolves to (no explicit tag: !foo, !!python/..., !!binary).
PLAIN_TAGS = tuple("tag:yaml.org,2002:" + t for t in ("str", "int", "float", "bool", "null", "seq",
                                                      "map", "timestamp", "merge"))


class CustomRule(Rule):
    """A rule from the rule file: a condition over the step's statistics,
    checked at every recorded step (as a watchpoint would be)."""
    THRESHOLDS: dict = {}
    EVERY_STEP = True
    ROW_ORDER = True        # (on a trace: it names the first tensor that makes the condition true)

    def __init__(self, rule_id: str, condition: Condition, message: str = "", explanation: str = "",
                 severity: str = "warning"):
        super().__init__()
        self.id = rule_id
        self.condition = condition
        self.message = message
        self.severity = severity
        self.explanation = explanation or f"custom rule: {condition.source}"
        self._reported: set = set()

    def reset(self) -> None:
        self._reported = set()
        self.condition.forget()

    def check(self, ctx):
        r = self.condition.evaluate(ctx)
        if not r.true:
            return
        more: list = []
        if r.hits:
            # A vector condition: once per tensor, so the finding names the first tensor that makes
            # it true and was not reported before (fc2.weight crossing at step 7 while fc1.weight,
            # reported at step 0, is still true); the others new now are named after it.
            new = [i for i, who in enumerate(r.hits) if who not in self._reported]
            if not new:
                return
            self._reported.update(r.hits[i] for i in new)
            r.who, r.value, r.count = r.hits[new[0]], r.values[new[0]], len(new)
            more = [r.hits[i][1] for i in new[1:]]
        where = ""
        if r.who is not None:
            kind, name = r.who
            where = series_label(name, kind)
            if r.value is not None and r.what:
                where += f": {r.what} = {fmt(r.value)}"
            if more:
                where += f" (and {len(more)} more: {', '.join(more[:4])}{', ...' if len(more) > 4 else ''})"
        elif r.value is not None and r.what:
            where = f"{r.what} = {fmt(r.value)}"
        text = self.message or f"{self.condition.source} is true"
        if where:
            text += f" ({where})"
        evidence = {"condition": self.condition.source}
        if r.who is not None:
            evidence["kind"] = r.who[0]
        if more:
            evidence["also"] = more
        if r.value is not None:
            evidence["value"] = None if math.isnan(r.value) else r.value
        yield self.finding(ctx, text, tensor=r.who[1] if r.who is not None else None, **evidence)

    def describe(self) -> dict:
        d = super().describe()
        d["condition"] = self.condition.source
        return d


def unmatched_notes(rules) -> list:
    """One line per name filter of a rule file's rule that matched no tensor in the run (or the
    trace): its condition was judged without it, so a misspelt name is never silently 0 findings."""
    notes = []
    for r in rules:
        if not isinstance(r, CustomRule):
            continue
        for text, kind, have in r.condition.unmatched():
            there = (f"there are: {', '.join(have[:8])}{', ...' if len(have) > 8 else ''}" if have
                     else f"no {kind} tensor was recorded")
            notes.append(f"rule {r.id}: {text} matched no {kind} tensor in the run ({there}); its "
                         "condition was judged without it")
    return notes


class _File:
    def __init__(self, path: str):
        self.path = path
        self._construct = SafeConstructor()

    def fail(self, node, message: str):
        line = node.start_mark.line + 1 if node is not None else 1
        raise UsageError(f"{self.path}:{line}: {message}")

    # -- reading nodes -------------------------------------------------------------------
    def mapping(self, node, what: str, keys: tuple) -> dict:
        """A mapping node -> {key: (key node, value node)}; unknown and repeated keys fail."""
        if not isinstance(node, yaml.MappingNode):
            self.fail(node, f"{what} must be a mapping (key: value)")
        out: dict = {}
        for k, v in node.value:
            key = self.scalar(k)
            if not isinstance(key, str):
                self.fail(k, f"{what}: a key must be a word, not {key!r}")
            if key in out:
                self.fail(k, f"{what}: '{key}' given twice (first at line {out[key][0].start_mark.line + 1})")
            if key not in keys:
                self.fail(k, f"{what}: unknown key '{key}' (there are: {', '.join(keys)})")
            out[key] = (k, v)
        return out

    def scalar(self, node):
        if not isinstance(node, yaml.ScalarNode):
            self.fail(node, "expected a single value here, not a list or mapping")
        try:
            return self._construct.construct_object(node, deep=True)
        except yaml.YAMLError as e:
            self.fail(node, f"cannot read this value: {_one_line(getattr(e, 'problem', None) or e)}")

    def check_tags(self, root) -> None:
        """No node has a tag of its own (the safe loader would refuse it later, in several lines)."""
        todo, seen = [root], set()
        while todo:
            node = todo.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if node.tag not in PLAIN_TAGS:
                tag = node.tag.replace("tag:yaml.org,2002:", "!!")
                self.fail(node, f"unknown tag {tag} (a rule file has plain values, lists and mappings only)")
            if isinstance(node, yaml.MappingNode):
                for k, v in node.value:
                    todo += [k, v]
            elif isinstance(node, yaml.SequenceNode):
                todo += node.value

    def text(self, node, what: str) -> str:
        v = self.scalar(node)
        if not isinstance(v, str):
            self.fail(node, f"{what} must be text, not {v!r}")
        return v

    def choice(self, node, what: str, choices) -> str:
        v = self.scalar(node)
        if not isinstance(v, str) or v not in choices:
            self.fail(node, f"unknown {what} '{v}' (one of: {', '.join(choices)})")
        return v

    def boolean(self, node, what: str) -> bool:
        v = self.scalar(node)
        if not isinstance(v, bool):
            self.fail(node, f"{what} must be true or false, not {v!r}")
        return v

    def number(self, node, what: str) -> float:
        v = self.scalar(node)
        if isinstance(v, str):            # YAML 1.1 reads 1e3 (no dot) as text
            try:
                v = float(v)
            except ValueError:
                pass
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
            self.fail(node, f"{what} must be a number, not {v!r}")
        return v

    # -- the file ----------------------------------------------------------------------------
    def load(self, text: str, builtin: list) -> list:
        loader = None
        try:
            loader = yaml.SafeLoader(text)
            root = loader.get_single_node()
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            line = mark.line + 1 if mark is not None else 1
            problem = " ".join(x for x in (e.context, e.problem) if x)
            raise UsageError(f"{self.path}:{line}: YAML syntax error: {problem}") from None
        except yaml.reader.ReaderError as e:
            line = text.count("\n", 0, max(0, e.position)) + 1
            ch = f"U+{e.character:04X}" if isinstance(e.character, int) else repr(e.character)
            raise UsageError(f"{self.path}:{line}: not a YAML rule file: the character {ch} "
                             "is not allowed in YAML") from None
        except yaml.YAMLError as e:
            raise UsageError(f"{self.path}:1: YAML error: {_one_line(e)}") from None
        except RecursionError:
            raise UsageError(f"{self.path}:1: YAML error: the lists or mappings are nested too deeply") from None
        finally:
            if loader is not None:
                loader.dispose()
        if root is not None:
            self.check_tags(root)
        if root is None or (isinstance(root, yaml.ScalarNode) and root.tag.endswith(":null")):
            return builtin
        top = self.mapping(root, "the rule file", TOP_KEYS)
        start_all = True
        if "default" in top:
            v = top["default"][1]
            start_all = DEFAULTS[self.choice(v, "default", tuple(DEFAULTS))]
        entries = []
        if "rules" in top:
            v = top["rules"][1]
            if isinstance(v, yaml.ScalarNode) and v.tag.endswith(":null"):
                v = yaml.SequenceNode("tag:yaml.org,2002:seq", [], v.start_mark, v.end_mark)
            if not isinstance(v, yaml.SequenceNode):
                self.fail(v, "'rules' must be a list (each item starts with '- ')")
            entries = v.value
        by_id = {r.id: r for r in builtin}
        listed: dict = {}           # rule id -> line
        chosen: set = set()
        custom: list = []
        for node in entries:
            rid, custom_rule = self.entry(node, by_id, listed)
            if custom_rule is not None:
                custom.append(custom_rule)
            else:
                chosen.add(rid)
        kept = [r for r in builtin if start_all or r.id in chosen]
        return kept + custom

    def entry(self, node, by_id: dict, listed: dict):
        if not isinstance(node, yaml.MappingNode):
            self.fail(node, "a rule must be a mapping with 'id' (a built-in rule) or 'name' (a new rule)")
        raw = {self.scalar(k): (k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode)}
        if "id" in raw and "name" in raw:
            self.fail(node, "a rule has 'id' (a built-in rule to change) or 'name' (a new rule), not both")
        if "id" in raw:
            return self.builtin(node, by_id, listed), None
        if "name" in raw:
            return None, self.new(node, by_id, listed)
        self.fail(node, "a rule needs 'id' (a built-in rule to change) or 'name' (a new rule)")

    def _claim(self, node, rid: str, listed: dict) -> None:
        if rid in listed:
            self.fail(node, f"rule '{rid}' is listed twice (first at line {listed[rid]})")
        listed[rid] = node.start_mark.line + 1

    def builtin(self, node, by_id: dict, listed: dict) -> str:
        fields = self.mapping(node, "a built-in rule", BUILTIN_KEYS)
        v = fields["id"][1]
        rid = self.text(v, "'id'")
        rule = by_id.get(rid)
        if rule is None:
            self.fail(v, f"unknown rule id '{rid}' (built-in rules: {', '.join(by_id) or 'none'}; "
                         "a new rule takes 'name:' and 'condition:')")
        self._claim(v, rid, listed)
        for key, (_, vn) in fields.items():
            if key == "enabled":
                rule.enabled = self.boolean(vn, "'enabled'")
            elif key == "action":
                rule.action = self.choice(vn, "action", ACTIONS)
            elif key == "severity":
                rule.severity = self.choice(vn, "severity", SEVERITIES)
            elif key == "thresholds":
                self.thresholds(vn, rule)
        return rid

    def thresholds(self, node, rule: Rule) -> None:
        names = tuple(rule.THRESHOLDS)
        if not isinstance(node, yaml.MappingNode):
            self.fail(node, f"thresholds of {rule.id} must be a mapping, e.g. {{{names[0] if names else 'name'}: 3}}")
        if not names:
            self.fail(node, f"rule {rule.id} has no thresholds")
        for name, (_, vn) in self.mapping(node, f"thresholds of {rule.id}", names).items():
            v = self.number(vn, f"threshold {name} of {rule.id}")
            problem = rule.threshold_problem(name, v)
            if problem:
                self.fail(vn, problem)
            rule.set_threshold(name, v)

    def new(self, node, by_id: dict, listed: dict) -> CustomRule:
        fields = self.mapping(node, "a new rule", NEW_KEYS + ("thresholds",))
        v = fields["name"][1]
        rid = self.text(v, "'name'")
        if rid in by_id:
            self.fail(v, f"'{rid}' is a built-in rule: change it with 'id: {rid}'")
        if not NAME_RE.match(rid):
            self.fail(v, f"rule name '{rid}': use letters, digits, '_', '.' and '-' (and no space)")
        self._claim(v, rid, listed)
        if "thresholds" in fields:
            self.fail(fields["thresholds"][0], f"new rule {rid}: no thresholds (write the numbers in its condition)")
        if "condition" not in fields:
            self.fail(node, f"new rule {rid} needs a 'condition', e.g. condition: max(grad.norm) > 1e3")
        cn = fields["condition"][1]
        src = self.scalar(cn)
        if isinstance(src, bool) or not isinstance(src, str) or not src.strip():
            self.fail(cn, f"condition of {rid} must be an expression, e.g. max(grad.norm) > 1e3")
        try:
            cond = Condition(src)
        except ConditionError as e:
            cond, problem = None, f"condition of {rid}: {e}" + (f" (column {e.col})" if e.col else "")
        if cond is None:
            self.fail(cn, problem)
        rule = CustomRule(rid, cond,
                          message=self.text(fields["message"][1], "'message'") if "message" in fields else "",
                          explanation=self.text(fields["explanation"][1], "'explanation'")
                          if "explanation" in fields else "",
                          severity=self.choice(fields["severity"][1], "severity", SEVERITIES)
                          if "severity" in fields else "warning")
        if "action" in fields:
            rule.action = self.choice(fields["action"][1], "action", ACTIONS)
        if "enabled" in fields:
            rule.enabled = self.boolean(fields["enabled"][1], "'enabled'")
        return rule


def load_file(path: str, rules: list) -> list:
    """The rules of the YAML rule file ``path``, starting from ``rules`` (the
    built-in rules with their defaults, changed in place); UsageError
    ``FILE:LINE: message`` on any mistake."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such rule file (--rules takes default, none or a YAML file)") from None
    except OSError as e:
        raise UsageError(f"{path}: cannot read the rule file: {e.strerror or e}") from None
    return _File(path).load(_text(path, raw), list(rules))


def _text(path: str, raw: bytes) -> str:
    """The file's text, or UsageError FILE:LINE for what no rule file holds."""
    if len(raw) > MAX_BYTES:
        raise UsageError(f"{path}:1: not a rule file: larger than {MAX_BYTES >> 20} MiB")
    nul = raw.find(b"\0")
    if nul >= 0:
        raise UsageError(f"{path}:{_line_at(raw, nul)}: not a rule file: a NUL byte (binary data)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}:{_line_at(raw, e.start)}: not a rule file: "
                         "its text is not UTF-8") from None


def _line_at(raw: bytes, offset: int) -> int:
    return raw.count(b"\n", 0, offset) + 1


def _one_line(e) -> str:
    return " ".join(str(e).split())
