"""The condition language of the rules a user writes in a YAML rule file.

A condition is a Python *expression* over one recorded step's statistics,
parsed with ``ast`` and compiled into a tree of small closures; only the
forms below are accepted (anything else is an error when the file is
loaded) and nothing is ever passed to ``eval``.

* ``grad``, ``weight`` (or ``param``), ``update``, ``act``, ``loss``: the
  tensors of that kind recorded at the step; ``grad['fc*']`` only those whose
  name matches the glob.  ``KIND.STAT`` (``grad.norm``, ``act['relu*'].zero_frac``)
  is the vector of that statistic over them; STAT is one of count mean std min
  max norm mean_abs nan_count inf_count zero_frac.
* ``step``: the step number.  Numbers, ``True``, ``False``.
* ``+ - * / // % **``, comparisons (also chained), ``and or not``: a vector
  and a number combine element-wise; two vectors combine tensor by tensor,
  matched by name (``grad.norm / weight.norm``).
* ``max min mean sum`` (of a vector, ignoring NaN; ``max``/``min`` also of
  several numbers), ``any all count`` (of a comparison), ``abs``, ``len``.

The condition must be true or false; a comparison over a vector is true if it
holds for any tensor (``grad.norm > 1e3``: some gradient norm is above 1e3),
and the finding names that tensor (for ``max``/``min`` the tensor they
picked).
"""
from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from .. import globs
from ..schema import KIND_WORDS
from .base import STAT_INDEX

KINDS = KIND_WORDS
MAX_LENGTH = 2000
FUNCTIONS = ("max", "min", "mean", "sum", "any", "all", "abs", "len", "count")

# static types of a sub-expression
SEL, VEC, VBOOL, NUM, BOOL = "selection", "vector", "vector of booleans", "number", "boolean"


class ConditionError(Exception):
    def __init__(self, message: str, col: Optional[int] = None):
        super().__init__(message)
        self.col = col


@dataclass
class Vec:
    """Values over tensors: ``x`` (float or bool array), ``names`` [(kind, name)];
    ``shown``/``what``: for a comparison, the compared values and their source."""
    x: np.ndarray
    names: list
    shown: Optional[np.ndarray] = None
    what: str = ""


@dataclass
class Num:
    """A number or a boolean; ``who``: the (kind, name) it came from, if one
    tensor; ``shown``/``what``: for a comparison, the compared value."""
    x: object
    who: Optional[tuple] = None
    shown: Optional[float] = None
    what: str = ""


@dataclass
class Result:
    true: bool
    who: Optional[tuple] = None        # (kind, name) of the tensor that made it true
    value: Optional[float] = None      # the compared value there
    what: str = ""                     # its source text
    count: int = 0                     # how many tensors made it true (vector conditions)
    hits: tuple = ()                   # (vector conditions) every (kind, name) that made it true, in order
    values: tuple = ()                 # the compared value of each (None where none is shown)


class Condition:
    def __init__(self, source: str):
        self.source = source.strip()
        if len(self.source) > MAX_LENGTH:
            raise ConditionError(f"the condition is longer than {MAX_LENGTH} characters")
        compiler = _Compiler(self.source)
        try:
            tree = ast.parse(self.source, mode="eval")
            t, self._fn = compiler.compile(tree.body)
        except SyntaxError as e:
            raise ConditionError(f"syntax error: {e.msg}", e.offset) from None
        except (RecursionError, MemoryError):
            raise ConditionError("the condition is nested too deeply") from None
        if t not in (BOOL, VBOOL):
            raise ConditionError(f"the condition is a {t}: it must be true or false "
                                 "(a comparison, e.g. max(grad.norm) > 1e3)", 1)
        self._vector = t == VBOOL
        self._filters = compiler.filters

    def unmatched(self) -> list:
        """The name filters (``grad['fc9*']``) judged at some step that matched no tensor at any
        step so far: [(text, kind, some of the kind's names seen)]: a condition that can never
        be true through them (a misspelt name)."""
        return [(f["text"], f["kind"], f["have"]) for f in self._filters if f["judged"] and not f["seen"]]

    def forget(self) -> None:
        """A new run: nothing judged yet."""
        for f in self._filters:
            f.update(judged=False, seen=False, have=[], names=None)

    def evaluate(self, ctx) -> Result:
        with np.errstate(all="ignore"):
            v = self._fn(ctx)
        if isinstance(v, Num):
            shown = v.shown if v.shown is None else float(v.shown)
            return Result(bool(v.x), v.who, shown, v.what)
        hits = np.flatnonzero(v.x)
        if hits.size == 0:
            return Result(False)
        i = int(hits[0])
        shown = float(v.shown[i]) if v.shown is not None else None
        values = tuple(float(v.shown[j]) if v.shown is not None else None for j in hits)
        return Result(True, v.names[i], shown, v.what, int(hits.size), tuple(v.names[j] for j in hits), values)


def _num(x):
    return float(x) if isinstance(x, (np.floating, float, int, np.integer)) and not isinstance(x, bool) else x


def _align(a: Vec, b: Vec):
    """Two vectors over the same tensors, matched by name (kinds may differ)."""
    if a.names == b.names:
        return a.x, b.x, a.names
    where = {n: i for i, (_, n) in enumerate(b.names)}
    ia = [i for i, (_, n) in enumerate(a.names) if n in where]
    ib = [where[a.names[i][1]] for i in ia]
    return a.x[ia], b.x[ib], [a.names[i] for i in ia]


def _shown_from(out: Vec, vals: list) -> Vec:
    """Keep the compared values of the first operand over the same tensors."""
    for v in vals:
        if isinstance(v, Vec) and v.shown is not None and v.names == out.names:
            out.shown, out.what = v.shown, v.what
            break
    return out


def _binary(op, a, b):
    """Element-wise ``op`` on numbers and vectors."""
    if isinstance(a, Num) and isinstance(b, Num):
        return Num(_num(op(a.x, b.x)), a.who or b.who)
    if isinstance(a, Vec) and isinstance(b, Vec):
        xa, xb, names = _align(a, b)
        return Vec(np.asarray(op(xa, xb)), names)
    if isinstance(a, Vec):
        return Vec(np.asarray(op(a.x, b.x)), a.names)
    return Vec(np.asarray(op(a.x, b.x)), b.names)


_ARITH = {ast.Add: np.add, ast.Sub: np.subtract, ast.Mult: np.multiply, ast.Div: np.true_divide,
          ast.FloorDiv: np.floor_divide, ast.Mod: np.mod, ast.Pow: np.power}
_COMPARE = {ast.Lt: np.less, ast.LtE: np.less_equal, ast.Gt: np.greater, ast.GtE: np.greater_equal,
            ast.Eq: np.equal, ast.NotEq: np.not_equal}


class _Compiler:
    """ast node -> (static type, function(ctx) -> Vec | Num | selection)."""

    def __init__(self, source: str):
        self.source = source
        self.filters: list = []         # the name filters' state, for Condition.unmatched

    def text(self, node) -> str:
        return ast.get_source_segment(self.source, node) or ""

    def fail(self, node, message: str):
        raise ConditionError(message, getattr(node, "col_offset", 0) + 1)

    def compile(self, node):
        method = getattr(self, "c_" + type(node).__name__, None)
        if method is None:
            what = type(node).__name__
            self.fail(node, f"'{self.text(node) or what}' is not allowed in a condition "
                            f"(only statistics, numbers, arithmetic, comparisons, and/or/not and "
                            f"{', '.join(FUNCTIONS)})")
        return method(node)

    # -- leaves ---------------------------------------------------------------------------
    def c_Constant(self, node):
        v = node.value
        if isinstance(v, bool):
            return BOOL, lambda ctx, v=v: Num(v)
        if isinstance(v, (int, float)):
            x = float(v)
            return NUM, lambda ctx, x=x: Num(x)
        self.fail(node, f"{self.text(node)}: only numbers here (a string only as a name filter: grad['fc*'])")

    def c_Name(self, node):
        if node.id in KINDS:
            return SEL, _selection(KINDS[node.id], None)
        if node.id == "step":
            return NUM, lambda ctx: Num(float(ctx.step))
        self.fail(node, f"unknown name '{node.id}' (there are: {', '.join(KINDS)}, step)")

    def c_Subscript(self, node):
        t, _ = self.compile(node.value)
        if t != SEL or not isinstance(node.value, ast.Name):
            self.fail(node, f"{self.text(node)}: only a kind takes a name filter, e.g. grad['fc*'].norm")
        glob = node.slice
        if not (isinstance(glob, ast.Constant) and isinstance(glob.value, str)):
            self.fail(glob, f"{self.text(node)}: the filter must be a quoted name or glob, e.g. grad['fc*']")
        track = {"text": self.text(node), "kind": KINDS[node.value.id]}
        self.filters.append(track)
        return SEL, _selection(KINDS[node.value.id], glob.value, track)

    def c_Attribute(self, node):
        t, sel = self.compile(node.value)
        if t != SEL:
            self.fail(node, f"{self.text(node)}: only a kind has statistics (grad.norm, act['relu*'].zero_frac)")
        if node.attr not in STAT_INDEX:
            self.fail(node, f"unknown statistic '{node.attr}' (one of: {', '.join(STAT_INDEX)})")
        stat, label = node.attr, self.text(node)
        return VEC, lambda ctx: sel(ctx, stat, label)

    # -- operators --------------------------------------------------------------------------
    def _operand(self, node, allowed, what):
        t, fn = self.compile(node)
        if t == SEL:
            self.fail(node, f"{self.text(node)} needs a statistic, e.g. {self.text(node)}.norm")
        if t not in allowed:
            self.fail(node, f"{self.text(node)} is a {t}: {what}")
        return t, fn

    def c_BinOp(self, node):
        op = _ARITH.get(type(node.op))
        if op is None:
            self.fail(node, f"{self.text(node)}: operator not allowed (only + - * / // % **)")
        ta, fa = self._operand(node.left, (NUM, VEC), "arithmetic needs numbers")
        tb, fb = self._operand(node.right, (NUM, VEC), "arithmetic needs numbers")
        return (VEC if VEC in (ta, tb) else NUM), lambda ctx: _binary(op, fa(ctx), fb(ctx))

    def c_UnaryOp(self, node):
        if isinstance(node.op, ast.Not):
            t, f = self._operand(node.operand, (BOOL, VBOOL), "'not' needs a comparison")
            if t == BOOL:
                return BOOL, lambda ctx: Num(not f(ctx).x)
            return VBOOL, _each(f, np.logical_not)
        if isinstance(node.op, (ast.USub, ast.UAdd)):
            t, f = self._operand(node.operand, (NUM, VEC), "a sign needs a number")
            sign = -1.0 if isinstance(node.op, ast.USub) else 1.0
            return t, _each(f, lambda x: sign * x)
        self.fail(node, f"{self.text(node)}: operator not allowed")

    def c_BoolOp(self, node):
        parts = [self._operand(v, (BOOL, VBOOL), "'and'/'or' need comparisons") for v in node.values]
        is_and = isinstance(node.op, ast.And)
        fns = [f for _, f in parts]
        if all(t == BOOL for t, _ in parts):
            def scalar(ctx):
                first = None
                for f in fns:                     # Python's short-circuit
                    v = f(ctx)
                    if bool(v.x) != is_and:
                        return Num(False) if is_and else v
                    if first is None or (first.who is None and v.who is not None):
                        first = v
                return first if is_and else Num(False)
            return BOOL, scalar
        op = np.logical_and if is_and else np.logical_or

        def vector(ctx):
            vals = [f(ctx) for f in fns]
            out = vals[0]
            for v in vals[1:]:
                out = _binary(op, out, v)
            return _shown_from(out, vals)
        return VBOOL, vector

    def c_Compare(self, node):
        items = [node.left, *node.comparators]
        parts = [self._operand(n, (NUM, VEC), "only numbers compare") for n in items]
        ops = [_COMPARE[type(o)] if type(o) in _COMPARE else self.fail(node, "only < <= > >= == != compare")
               for o in node.ops]
        vector = any(t == VEC for t, _ in parts)
        fns = [f for _, f in parts]
        texts = [self.text(n) for n in items]

        def compare(ctx):
            vals = [f(ctx) for f in fns]
            out = None
            for op, a, b in zip(ops, vals, vals[1:]):
                r = _binary(op, a, b)
                out = r if out is None else _binary(np.logical_and, out, r)
            if isinstance(out, Num):
                i = next((k for k, v in enumerate(vals) if v.who is not None), 0)
                return Num(bool(out.x), vals[i].who, vals[i].x, texts[i])
            out.x = out.x.astype(bool)
            for v, text in zip(vals, texts):
                if isinstance(v, Vec) and v.names == out.names:
                    out.shown, out.what = v.x, text
                    break
            return out
        return (VBOOL if vector else BOOL), compare

    # -- functions ----------------------------------------------------------------------------
    def c_Call(self, node):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            self.fail(node, f"{self.text(node.func)}(): not a function here (there are: {', '.join(FUNCTIONS)})")
        name = node.func.id
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            self.fail(node, f"{name}() takes plain arguments")
        if not node.args:
            self.fail(node, f"{name}() needs an argument")
        if len(node.args) > 1:
            if name not in ("max", "min"):
                self.fail(node, f"{name}() takes one argument")
            fns = [self._operand(a, (NUM,), f"{name}() of several arguments takes numbers")[1] for a in node.args]
            pick = max if name == "max" else min

            def several(ctx):
                vals = [f(ctx) for f in fns]
                return pick(vals, key=lambda v: -math.inf if math.isnan(v.x) else v.x)
            return NUM, several
        arg = node.args[0]
        if name in ("len", "count"):
            t, f = self.compile(arg)
            if t == SEL:
                return NUM, lambda ctx: Num(float(len(f(ctx, "count", "").names)))
            if t in (VEC, VBOOL):
                if name == "count" and t == VBOOL:
                    return NUM, lambda ctx: Num(float(np.count_nonzero(f(ctx).x)))
                return NUM, lambda ctx: Num(float(len(f(ctx).names)))
            self.fail(node, f"{name}() counts tensors: {name}(grad), count(grad.norm > 1)")
        if name == "abs":
            t, f = self._operand(arg, (NUM, VEC), "abs() takes numbers")
            return t, _each(f, np.abs)
        if name in ("any", "all"):
            t, f = self._operand(arg, (BOOL, VBOOL), f"{name}() takes a comparison, e.g. {name}(act.zero_frac == 1)")
            if t == BOOL:
                return BOOL, f
            return BOOL, lambda ctx: _any_all(f(ctx), name == "any")
        t, f = self._operand(arg, (VEC, NUM), f"{name}() takes a vector of statistics, e.g. {name}(grad.norm)")
        if t == NUM:
            return NUM, f
        return NUM, lambda ctx: _reduce(name, f(ctx))


def _each(f, fn):
    """ctx -> ``fn`` applied to each number of ``f(ctx)`` (a Num or a Vec)."""
    def apply(ctx):
        v = f(ctx)
        if isinstance(v, Num):
            return Num(_num(fn(v.x)), v.who)
        return Vec(np.asarray(fn(v.x)), v.names)
    return apply


def _any_all(v: Vec, is_any: bool) -> Num:
    if is_any:
        hits = np.flatnonzero(v.x)
        if hits.size == 0:
            return Num(False)
        i = int(hits[0])
        return Num(True, v.names[i], float(v.shown[i]) if v.shown is not None else None, v.what)
    return Num(bool(v.x.size) and bool(np.all(v.x)))


def _reduce(name: str, v: Vec) -> Num:
    x = np.asarray(v.x, dtype=float)
    ok = ~np.isnan(x)
    if not ok.any():
        return Num(0.0 if name == "sum" else math.nan)
    if name in ("max", "min"):
        masked = np.where(ok, x, -np.inf if name == "max" else np.inf)
        i = int(np.argmax(masked) if name == "max" else np.argmin(masked))
        return Num(float(x[i]), v.names[i])
    return Num(float(np.nansum(x) if name == "sum" else np.nanmean(x)))


def _selection(kind: str, glob: Optional[str], track: Optional[dict] = None) -> Callable:
    """ctx, stat, label -> Vec of that statistic over the kind's tensors
    matching ``glob``; the indices are kept while the step's names stay the same.
    ``track`` (a name filter's): ``judged``, ``seen`` (it matched a tensor), ``have``
    (some of the kind's names), set when the names change."""
    match = globs.matcher(glob) if glob is not None else None
    cache = track if track is not None else {}
    cache.update(names=None, idx=None, labels=None, judged=False, seen=False, have=[])

    def select(ctx, stat: str, label: str) -> Vec:
        if cache["names"] is not ctx.names and cache["names"] != ctx.names:
            idx = np.flatnonzero(ctx.mask(kind))
            if match is not None:
                have = [ctx.names[i][0] for i in idx[:9]]
                idx = np.array([i for i in idx if match(ctx.names[i][0])], dtype=np.int64)
                cache.update(judged=True, seen=cache["seen"] or idx.size > 0,
                             have=cache["have"] or have)
            cache.update(names=ctx.names, idx=idx, labels=[(kind, ctx.names[i][0]) for i in idx])
        idx = cache["idx"]
        return Vec(np.asarray(ctx.col(stat)[idx], dtype=float), cache["labels"])
    return select
