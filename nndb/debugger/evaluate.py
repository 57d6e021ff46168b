"""Python expressions and statements in the script's frame (pdb semantics),
nndb's ``$`` convenience variables, stack walking and value summaries.

Nothing here prints: errors become ``CommandError`` (one line), values are
returned to the caller.
"""
from __future__ import annotations

import contextlib
import ctypes
import math
import os
import re
import runpy
import sys
import warnings
from dataclasses import dataclass, fields
from typing import Optional

from .. import globs
from ..errors import CommandError
from ..text import NOT_MEASURED, fmt, is_not_measured

VARS_NAME = "__nndb_vars__"
_DOLLAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
_NNDB_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_HIDDEN = (_NNDB_DIR, os.path.dirname(runpy.__file__) + os.sep + "runpy.py")
_LAUNCHER = os.path.join(_NNDB_DIR, "run", "launcher.py")


def _torch_dir() -> str:
    import torch
    return os.path.dirname(torch.__file__)


# -- frames ----------------------------------------------------------------------
def is_nndb_frame(frame) -> bool:
    name = frame.f_code.co_filename
    return name.startswith(_HIDDEN[0]) or name == _HIDDEN[1] or name == "<frozen runpy>" \
        or frame.f_code.co_name == "_nndb_call"   # (nndb.tracer.funcmode.TRAMPOLINE: the script's line, nndb's frame)


_CALL_MACHINERY = ("_wrapped_call_impl", "_call_impl", "inner")


def _is_call_machinery(frame) -> bool:
    """torch.nn.Module.__call__'s own frames, between the caller and forward()."""
    code = frame.f_code
    return code.co_name in _CALL_MACHINERY and code.co_filename.endswith(os.path.join("nn", "modules", "module.py"))


def _is_launcher(frame) -> bool:
    return frame.f_code.co_name == "run" and frame.f_code.co_filename == _LAUNCHER


def stop_frame(start) -> Optional[object]:
    """The innermost frame at or above ``start`` that is neither torch's nor nndb's."""
    skip = (_NNDB_DIR, _torch_dir())
    f = start
    while f is not None and (f.f_code.co_filename.startswith(skip) or is_nndb_frame(f)):
        f = f.f_back
    return f


def stack_from(frame) -> list:
    """Outermost-first list of the script's frames from ``frame`` up to the
    script's top level; nndb's frames (and whatever runs nndb) hidden."""
    out = []
    f = frame
    while f is not None and not _is_launcher(f):
        if not is_nndb_frame(f) and not _is_call_machinery(f):
            out.append(f)
        f = f.f_back
    out.reverse()
    return out


def stack_from_traceback(tb) -> list:
    out = []
    while tb is not None:
        if not (is_nndb_frame(tb.tb_frame) or _is_launcher(tb.tb_frame) or _is_call_machinery(tb.tb_frame)):
            out.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    return out


# -- expressions ----------------------------------------------------------------
def with_dollars(source: str) -> str:
    """``$name`` -> a lookup in nndb's convenience variables: an attribute, no quotes (a
    subscript's quotes ended the string of a replacement field: "p f'step {$step}'" was
    "f-string: unmatched '['").  Only in code: a string literal's text is its own, as in
    gdb ('print "cost $step"' prints the string; 'p "cost $step"' printed 'cost
    __nndb_vars__.step'), an f-string's replacement fields being code."""
    if "$" not in source:
        return source
    out: list = []
    _code(source, 0, out, False)
    return "".join(out)


_WORD = re.compile(r"[A-Za-z_0-9]\w*")
_PREFIXES = {"", "r", "u", "b", "f", "br", "rb", "fr", "rf"}


def _code(src: str, i: int, out: list, field: bool) -> int:
    """Copy code from ``i`` with its ``$name``s replaced; in an f-string's replacement field
    (``field``), up to the ``}``, ``!`` conversion or ``:`` format spec that ends it."""
    n, depth = len(src), 0
    while i < n:
        c = src[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            if field and depth == 0:
                return i
            depth -= 1
        elif field and depth == 0 and (c == ":" or (c == "!" and src[i + 1:i + 2] != "=")):
            return i
        elif c == "$":
            m = _DOLLAR.match(src, i)
            if m:
                out.append(f"{VARS_NAME}.{m.group(1)}")
                i = m.end()
                continue
        elif c in "'\"":
            i = _string(src, i, "", out)
            continue
        elif c == "#":
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(src[i:j])
            i = j
            continue
        else:
            m = _WORD.match(src, i)
            if m:
                word = m.group(0)
                out.append(word)
                i = m.end()
                if i < n and src[i] in "'\"" and word.lower() in _PREFIXES:
                    i = _string(src, i, word.lower(), out)
                continue
        out.append(c)
        i += 1
    return i


def _string(src: str, i: int, prefix: str, out: list) -> int:
    """Copy the string literal whose quote is at ``i``; an f-string's replacement fields
    go through ``_code``.  Returns the index after its closing quote (or the end)."""
    n = len(src)
    quote = src[i] * 3 if src[i:i + 3] == src[i] * 3 else src[i]
    out.append(quote)
    i += len(quote)
    fstring = "f" in prefix
    while i < n:
        if src.startswith(quote, i):
            out.append(quote)
            return i + len(quote)
        c = src[i]
        if c == "\\":
            out.append(src[i:i + 2])
            i += 2
            continue
        if fstring and c in "{}":
            if src[i + 1:i + 2] == c:            # ({{ and }}: the braces themselves)
                out.append(c * 2)
                i += 2
                continue
            if c == "{":
                i = _field(src, i, out)
                continue
        out.append(c)
        i += 1
    return i


def _field(src: str, i: int, out: list) -> int:
    """Copy an f-string's replacement field from its ``{``: the expression, a ``!r``
    conversion, a format spec with its own nested fields, up to and with its ``}``."""
    n = len(src)
    out.append("{")
    i = _code(src, i + 1, out, True)
    if i < n and src[i] == "!":
        j = i + 1
        while j < n and src[j] not in ":}":
            j += 1
        out.append(src[i:j])
        i = j
    if i < n and src[i] == ":":
        out.append(":")
        i += 1
        while i < n and src[i] != "}":
            if src[i] == "{":
                i = _field(src, i, out)
            else:
                out.append(src[i])
                i += 1
    if i < n:
        out.append("}")
        i += 1
    return i


def compile_expr(source: str, mode: str = "eval"):
    """Compile now, so a syntax error is reported when the expression is set."""
    src = source.strip()
    if not src:
        raise CommandError("an expression is needed")
    try:
        with _syntax_warnings() as said:     # "is" with a literal...: one error line
            code = compile(with_dollars(src), "<nndb>", mode)
    except SyntaxWarning as e:                # (the script's filters make it an error)
        raise CommandError(f"in '{src}': {e}") from None
    except SyntaxError as e:
        raise CommandError(f"syntax error in '{src}': {e.msg}") from None
    except (ValueError, OverflowError, MemoryError, RecursionError) as e:
        raise CommandError(f"cannot compile '{src}': {e}") from None
    if said:
        raise CommandError(f"syntax error in '{src}': {said[0]}")
    return code


@contextlib.contextmanager
def _syntax_warnings():
    """The compiler's SyntaxWarnings about an expression of nndb's (``<nndb>``), taken
    from Python's way of showing warnings: not by ``warnings.catch_warnings`` or a
    filter, whose every change makes Python forget which once-per-line warnings it
    has shown, and show the script's own again after each ``p`` (and at every step
    under a ``break if``: a deprecation warning of the VAE tutorial's loop, once
    under plain Python, 30 times in 30 steps).  The others are shown as they
    would be."""
    said: list = []
    show = warnings.showwarning

    def take(message, category, filename, lineno, file=None, line=None):
        if filename == "<nndb>" and issubclass(category, SyntaxWarning):
            said.append(str(message))
        else:
            show(message, category, filename, lineno, file, line)
    warnings.showwarning = take
    try:
        yield said
    finally:
        if warnings.showwarning is take:
            warnings.showwarning = show


class ConvenienceVars:
    """nndb's ``$`` variables as attributes (``with_dollars``); no other attribute than the
    variables' (a dict's ``update`` would hide ``$update``)."""
    __slots__ = ("__vars",)

    def __init__(self, variables: dict):
        self.__vars = variables

    def __getattr__(self, key):
        try:
            return self.__vars[key]
        except KeyError:
            raise CommandError(f"no convenience variable ${key} here (have: "
                               + ", ".join("$" + k for k in sorted(self.__vars)) + ")") from None


def namespace(frame, variables: dict, merged: bool = False) -> tuple[dict, dict]:
    """(globals, locals) for evaluating in ``frame``.  ``merged``: globals that
    hold the frame's locals and nndb's variables too (a copy), for an
    expression: a comprehension, generator or lambda in it has a scope of its
    own that sees only globals ('p [$grad[k].norm for k in names]' was
    "NameError: name '__nndb_vars__' is not defined")."""
    cv = ConvenienceVars(variables)
    if frame is None:
        g = {"__builtins__": __builtins__, VARS_NAME: cv}
        return g, g
    loc = dict(frame.f_locals)
    loc[VARS_NAME] = cv
    if not merged:
        return frame.f_globals, loc
    if frame.f_locals is frame.f_globals:       # (a module's frame: its locals are its globals)
        return loc, loc
    g = dict(frame.f_globals)
    g.update(loc)
    return g, loc


def _unseen():
    """The tracers pass the debugger's own evaluation by (nndb.tracer.hooks.unseen);
    with the tracer not even imported (a trace read offline) none is recording."""
    hooks = sys.modules.get("nndb.tracer.hooks")
    return hooks.unseen() if hooks is not None else contextlib.nullcontext()


@contextlib.contextmanager
def _generators_kept():
    """The global random generators the script draws from (torch's CPU one, CUDA's where
    initialised, Python's ``random``, numpy's legacy global one) as they were before:
    an expression is the debugger's (``p model(x)`` through a dropout, ``p
    dist.sample()``, a condition), and a draw of its own would shift every later draw
    of the run, a change no replay makes ('the replay diverged ... nothing was
    changed').  A ``!`` statement is a change made at the prompt: its draws stay."""
    torch = sys.modules.get("torch")
    pyrandom = sys.modules.get("random")
    nprandom = getattr(sys.modules.get("numpy"), "random", None)
    saved = []
    try:
        if torch is not None:
            saved.append((torch.set_rng_state, torch.get_rng_state()))
            cuda = getattr(torch, "cuda", None)
            if cuda is not None and cuda.is_initialized():
                saved.append((cuda.set_rng_state_all, cuda.get_rng_state_all()))
        if pyrandom is not None:
            saved.append((pyrandom.setstate, pyrandom.getstate()))
        if nprandom is not None:
            saved.append((nprandom.set_state, nprandom.get_state()))
    except Exception:
        pass                        # (a generator that cannot be read is left to the expression)
    try:
        yield
    finally:
        for put, state in saved:
            try:
                put(state)
            except Exception:
                pass


def evaluate(code, frame, variables: dict, what: str = ""):
    g, loc = namespace(frame, variables, merged=True)
    try:
        with _unseen(), _generators_kept():
            return eval(code, g, loc)
    except CommandError:
        raise
    except (Exception, SystemExit) as e:   # pdb: exit() is an error here
        raise CommandError(f"{what}{type(e).__name__}: {e}{_no_frame(e, frame)}") from None


def _no_frame(e: BaseException, frame) -> str:
    """A name not found with no frame to look in: the script's names are gone, not undefined."""
    if frame is None and isinstance(e, NameError):
        return " (the script is not stopped in a frame: its variables are gone; nndb's $ variables are left)"
    return ""


def execute(source: str, frame, variables: dict) -> None:
    """Run a statement in ``frame``; assignments to its variables stick."""
    code = compile_expr(source, "single")
    if frame is None:
        g, _ = namespace(None, variables)
        try:
            with _unseen():
                exec(code, g)
        except (Exception, SystemExit) as e:   # pdb: exit() is an error here
            raise CommandError(f"{type(e).__name__}: {e}{_no_frame(e, None)}") from None
        return
    is_module = frame.f_locals is frame.f_globals
    g, loc = namespace(frame, variables)
    # (in the globals while it runs: a comprehension or lambda of the statement sees them only)
    g[VARS_NAME] = loc[VARS_NAME]
    if is_module:
        loc = frame.f_globals
    try:
        with _unseen():
            exec(code, g, loc)
    except (Exception, SystemExit) as e:   # pdb: exit() is an error here
        raise CommandError(f"{type(e).__name__}: {e}") from None
    finally:
        frame.f_globals.pop(VARS_NAME, None)
    if not is_module:
        loc.pop(VARS_NAME, None)
        _write_locals(frame, loc)


def _write_locals(frame, values: dict) -> None:
    """Make assignments to a function's locals stick (before Python 3.13,
    f_locals is a snapshot that PyFrame_LocalsToFast writes back)."""
    proxy = frame.f_locals
    changed = {k: v for k, v in values.items() if k not in proxy or proxy[k] is not v}
    if not changed:
        return
    if sys.version_info >= (3, 13):
        for k, v in changed.items():
            proxy[k] = v
        return
    proxy.update(changed)
    try:
        ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(frame), ctypes.c_int(0))
    except Exception:  # pragma: no cover - not CPython
        raise CommandError("cannot change a function's local variables on this Python") from None


# -- values ----------------------------------------------------------------------
@dataclass(frozen=True)
class StatRow:
    """One series' statistics at one step, with attribute access for expressions
    (``$grad['fc1.weight'].norm``)."""
    name: str
    kind: str
    count: float
    mean: float
    std: float
    min: float
    max: float
    norm: float
    mean_abs: float
    nan_count: float
    inf_count: float
    zero_frac: float

    def __getitem__(self, stat: str) -> float:
        return getattr(self, stat)


def loss_value(row: StatRow) -> float:
    """A loss series' value at a step (``$loss``: the first series'): the
    step's loss as Python would compute it: NaN if it holds a NaN, +/-inf
    if an infinity (NaN for both signs); the statistics' mean is over the
    finite elements (a scalar loss is one number: the sum of what the step's
    backward passes received).  Not measured (a step not recorded): NOT_MEASURED."""
    if is_not_measured(row.mean) and is_not_measured(row.nan_count):
        return row.mean
    if row.nan_count:
        return math.nan
    if row.inf_count:
        pos, neg = row.max == math.inf, row.min == -math.inf
        return math.nan if pos == neg else math.inf if pos else -math.inf
    return row.mean


class StatTable(dict):
    """name -> StatRow for one kind; a glob key returns the single match.
    ``known``: () -> the names of this kind the run has (asked only on a
    miss): one of them that this step did not measure (an activation between
    observed steps) is a row of NOT_MEASURED, as a statistic skipped is, and
    not an error (a condition on it stopped every step with one).  ``tied``: () -> {another
    path of weights tied at several paths: the name they are recorded under} (GPT-2's
    ``lm_head.weight`` is ``transformer.wte.weight``: one tensor, one row)."""

    def __init__(self, kind: str, rows: dict, known=None, tied=None):
        super().__init__(rows)
        self.kind = kind
        self.known = known
        self.tied = tied

    def __missing__(self, key):
        if isinstance(key, str):
            hits = [k for k in self if globs.matches(k, key)]
            if len(hits) == 1:
                return dict.__getitem__(self, hits[0])
            if len(hits) > 1:
                raise CommandError(f"'{key}' matches {len(hits)} {self.kind} tensors: "
                                   + ", ".join(hits[:5]) + (" ..." if len(hits) > 5 else ""))
            elsewhere = sorted(n for n in (self.known() if self.known else ()) if globs.matches(n, key))
            if len(elsewhere) == 1:
                return StatRow(elsewhere[0], self.kind, *[NOT_MEASURED] * (len(fields(StatRow)) - 2))
            same = (self.tied() if self.tied else {}).get(key)
            if same is not None:
                return self[same]
        raise CommandError(f"no {self.kind} tensor named '{key}' at this step")


class FullLookup:
    """``$full['NAME', STEP]``: a whole tensor the trace keeps (``record full``,
    ``--record-full``), as a torch tensor, read from the trace when asked.
    NAME may carry its kind (``'grad:conv1.weight'``); without one, the one
    kind kept under that name."""

    def __init__(self, reader_factory):
        self._reader = reader_factory          # () -> a TraceReader (context manager)

    def __getitem__(self, key):
        if not (isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], str)
                and isinstance(key[1], int) and not isinstance(key[1], bool)):
            raise CommandError("$full takes ['NAME', STEP] (or ['KIND:NAME', STEP])")
        from ..store import distributions as D
        from ..errors import NndbError
        spec, step = key
        try:
            with self._reader() as reader:
                if ":" in spec:
                    kind, name = D.parse_tensor_spec(spec, D.FULL_KINDS)
                else:
                    name = spec
                    kinds = sorted({e["kind"] for e in reader.full_index() if e["name"] == name})
                    if len(kinds) > 1:
                        raise CommandError(f"the trace keeps {name} as {', '.join(kinds)}: "
                                           f"say which, $full['{kinds[0]}:{name}', {step}]")
                    kind = kinds[0] if kinds else "grad"
                arr, _ = D.full_tensor(reader, name, kind, step)
        except NndbError as e:
            raise CommandError(str(e)) from None
        import torch
        return torch.from_numpy(arr.copy())

    def __repr__(self) -> str:
        return "<whole tensors of the trace: $full['NAME', STEP]>"


def tensor_summary(t) -> str:
    """One line: shape, dtype, device and statistics."""
    head = f"tensor(shape={list(t.shape)}, dtype={str(t.dtype).replace('torch.', '')}, device={t.device}"
    if t.requires_grad:
        head += ", requires_grad"
    head += ")"
    if t.numel() == 0 or t.is_sparse or t.is_complex():
        return head
    if t.numel() == 1:
        return head + f" value={t.item()!r}"
    try:
        # the statistics the trace records (nndb.tracer.stats), over the finite elements
        from ..tracer.stats import stats_of
        x = t.detach()
        st = stats_of(x if x.is_floating_point() else x.double())
        parts = [f"{k}={fmt(st[k])}" for k in ("mean", "std", "min", "max", "norm", "zero_frac")]
        if st["nan_count"] or st["inf_count"]:
            parts += [f"nan={int(st['nan_count'])}", f"inf={int(st['inf_count'])}"]
        return head + " " + " ".join(parts)
    except Exception:
        return head


def safe_repr(value, full: bool = False) -> str:
    """What ``print`` shows.  A tensor is one line unless ``full``."""
    try:
        import torch
        if isinstance(value, torch.Tensor):
            if not full:
                return tensor_summary(value)
            saved = torch._tensor_str.PRINT_OPTS.threshold
            torch.set_printoptions(threshold=sys.maxsize)
            try:
                return repr(value)
            finally:
                torch.set_printoptions(threshold=saved)
        if not full and type(value) in (tuple, list) and 0 < len(value) <= 64 \
                and any(isinstance(v, torch.Tensor) for v in value):
            # a module's $inputs / $grad_output: one summary per tensor
            parts = [safe_repr(v) for v in value]
            if isinstance(value, list):
                return "[" + ", ".join(parts) + "]"
            return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
        return repr(value)
    except Exception as e:
        return f"<unprintable {type(value).__name__}: {type(e).__name__}: {e}>"


def safe_pformat(value) -> str:
    """What ``pp`` shows: ``pprint.pformat`` (pdb's pp), a tensor as ``print`` shows it."""
    try:
        import torch
        if isinstance(value, torch.Tensor):
            return safe_repr(value)
        import pprint
        return pprint.pformat(value)
    except Exception as e:
        return f"<unprintable {type(value).__name__}: {type(e).__name__}: {e}>"
