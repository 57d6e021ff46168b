"""Run a script or module exactly as ``python SCRIPT ARGS`` / ``python -m MOD ARGS`` would.

``__main__``, ``sys.argv``, ``sys.path[0]``, the exit status and the
traceback of an uncaught exception are those Python itself would produce.
The script runs in a fresh module installed as ``sys.modules["__main__"]``
(so pickling classes defined in the script, and multiprocessing's spawn,
work), the way runpy does it.
"""
from __future__ import annotations

import builtins
import importlib.machinery
import importlib.util
import io
import os
import re
import runpy
import sys
import tokenize
import traceback
import types
from dataclasses import dataclass, field
from typing import Optional

from . import safepath, startup
from ..errors import ScriptNotFound, UsageError


@dataclass
class Target:
    """What to run: a script path or a module name, and its arguments."""
    path: Optional[str] = None
    module: Optional[str] = None
    args: list = field(default_factory=list)
    cwd: Optional[str] = None       # the directory a relative path is relative to (where nndb started)

    @property
    def file(self) -> Optional[str]:
        """The script's absolute path, whatever the script did with the working directory since."""
        if self.path is None:
            return None
        return os.path.abspath(os.path.join(self.cwd, self.path) if self.cwd else self.path)

    @property
    def display(self) -> str:
        return f"-m {self.module}" if self.module else str(self.path)

    @property
    def stem(self) -> str:
        if self.module:
            return self.module.rsplit(".", 1)[-1]
        return os.path.splitext(os.path.basename(self.path))[0] or "run"


@dataclass
class Prepared:
    target: Target
    code: Optional[types.CodeType]
    filename: str


def prepare(target: Target) -> Prepared:
    """Check the target and compile it, so a bad one fails before anything starts."""
    if target.module:
        undo = safepath.enter_script(os.getcwd())      # (where python -m looks first)
        try:
            spec = importlib.util.find_spec(target.module)
        except (ImportError, ValueError) as e:
            raise ScriptNotFound(f"cannot find module {target.module}: {e}") from None
        finally:
            undo()
        if spec is None:
            raise ScriptNotFound(f"no module named {target.module}")
        return Prepared(target, None, spec.origin or target.module)
    path = target.path
    filename = target.file
    if not os.path.exists(filename):
        raise ScriptNotFound(f"no such file: {path}")
    if os.path.isdir(filename):
        raise ScriptNotFound(f"{path} is a directory, not a Python script")
    try:
        with io.open_code(filename) as fh:
            raw = fh.read()
    except OSError as e:
        raise ScriptNotFound(f"cannot read {path}: {e.strerror or e}") from None
    if b"\0" in raw:
        raise UsageError(f"{path} is not a Python script (binary file)")
    undeclared = _not_utf8(raw)
    if undeclared:
        raise UsageError(f"{path} is not a Python script: {undeclared}")
    try:
        with tokenize.open(filename) as fh:
            source = fh.read()
        code = compile(source, filename, "exec", dont_inherit=True)
    except SyntaxError as e:
        where = f" (line {e.lineno})" if e.lineno else ""
        raise UsageError(f"{path} is not a Python script: {e.msg}{where}") from None
    except (UnicodeDecodeError, ValueError):
        raise UsageError(f"{path} is not a Python script (its text cannot be decoded)") from None
    return Prepared(target, code, filename)


_COOKIE = re.compile(rb"^[ \t\f]*#.*?coding[:=]")      # (PEP 263's declaration)


def _not_utf8(raw: bytes) -> Optional[str]:
    """Python's own words for a file that declares no encoding and is not
    UTF-8 (a binary file without a NUL byte); None if it is not that."""
    if raw.startswith(b"\xef\xbb\xbf") or any(_COOKIE.match(line) for line in raw.split(b"\n", 2)[:2]):
        return None                     # (a BOM or a declaration: tokenize.open's words below)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        return (f"Non-UTF-8 code starting with '\\x{raw[e.start]:02x}' on line {line}, but no encoding "
                f"declared; see https://peps.python.org/pep-0263/ for details")
    return None


def run(prepared: Prepared) -> None:
    """Run it in this process.  Returns normally or raises what the script raised."""
    t = prepared.target
    saved_argv, restore_path = sys.argv[:], None
    try:
        if t.module:
            sys.argv = [prepared.filename] + list(t.args)
            restore_path = safepath.enter_script(os.getcwd())
            unshadow(os.getcwd())
            with RecursionLimit(_depth()):
                runpy.run_module(t.module, run_name="__main__", alter_sys=True)
            return
        sys.argv = [t.path] + list(t.args)
        restore_path = safepath.enter_script(os.path.dirname(os.path.realpath(prepared.filename)))
        unshadow(os.path.dirname(os.path.realpath(prepared.filename)))
        main = types.ModuleType("__main__")
        main.__dict__.update({
            "__file__": prepared.filename,
            "__builtins__": builtins,
            "__loader__": importlib.machinery.SourceFileLoader("__main__", prepared.filename),
            "__spec__": None,
            "__package__": None,
            "__cached__": None,
        })
        saved_main = sys.modules.get("__main__")
        sys.modules["__main__"] = main
        try:
            with RecursionLimit(_depth()):
                exec(prepared.code, main.__dict__)
        finally:
            if saved_main is not None:
                sys.modules["__main__"] = saved_main
    finally:
        sys.argv = saved_argv
        if restore_path is not None:
            restore_path()


def _depth() -> int:
    """The recursion depth of the caller, as Python counts it against the
    limit (its frames and the C calls between them): read from the error of
    a limit set too low, which states it; else the frames under the caller's."""
    try:
        sys.setrecursionlimit(1)
    except RecursionError as e:
        m = re.search(r"at the recursion depth (\d+)", str(e))
        if m:
            return int(m.group(1)) - 1          # (less this function's own frame)
    f, n = sys._getframe(1), 0
    while f is not None:
        n, f = n + 1, f.f_back
    return n


class RecursionLimit:
    """The script's recursion limit counts the script's frames, as under
    plain Python: nndb's frames under the script's module (``offset``) are
    added to the limit while it runs, and ``sys.setrecursionlimit`` and
    ``sys.getrecursionlimit`` take them off the script's values (a script
    that sets a tight limit, 100, got 14 fewer frames under nndb).  There is
    no hook for this: the two functions of ``sys`` are replaced while the
    script runs, and put back after."""

    def __init__(self, offset: int):
        self.offset = offset
        self._set, self._get = sys.setrecursionlimit, sys.getrecursionlimit

    def __enter__(self):
        real_set, real_get, offset = self._set, self._get, self.offset

        def setrecursionlimit(limit, /):
            if isinstance(limit, int) and limit >= 1:
                return real_set(limit + offset)
            return real_set(limit)          # (Python's own error for anything else)

        def getrecursionlimit():
            return real_get() - offset

        for mine, real in ((setrecursionlimit, real_set), (getrecursionlimit, real_get)):
            mine.__name__, mine.__qualname__, mine.__doc__ = real.__name__, real.__qualname__, real.__doc__
        real_set(real_get() + offset)
        sys.setrecursionlimit, sys.getrecursionlimit = setrecursionlimit, getrecursionlimit
        return self

    def __exit__(self, *exc):
        sys.setrecursionlimit, sys.getrecursionlimit = self._set, self._get
        try:
            self._set(max(self._get() - self.offset, _depth() + 50))
        except (RecursionError, ValueError):
            pass
        return False


# Packages nndb itself imports from while the script runs (a submodule imported late resolves its
# package in sys.modules): never taken out, whatever the script's directory holds.
_KEEP = frozenset({"nndb", "torch", "numpy", "h5py", "click", "prompt_toolkit", "tabulate", "wcwidth"})


def unshadow(directory: str) -> list:
    """Modules nndb loaded (not Python at its start-up) that a module file of
    the script's directory shadows (a ``statistics.py`` beside it): plain
    python would import the script's own, so they leave ``sys.modules`` (nndb
    keeps the module objects it holds).  Returns their names."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return []
    local = {n.split(".")[0] for n in entries if n.endswith((".py", ".so", ".pyd"))} | \
        {n for n in entries if os.path.isfile(os.path.join(directory, n, "__init__.py"))}
    out = sorted(n for n in local if n in sys.modules and n not in startup.MODULES and n not in _KEEP
                 and n not in sys.builtin_module_names and not hasattr(sys.modules[n], "__path__"))
    for name in out:
        del sys.modules[name]
    return out


_OWN_DIRS = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.path.dirname(runpy.__file__))   # (nndb/, runpy)


# torch's frames that only a mode of nndb's puts in a traceback: the dynamo-disable
# wrappers a TorchDispatchMode's __torch_dispatch__ is called through (torch >= 2.5), and
# the OpOverload the mode calls to run the operation (without a mode the dispatcher runs
# it in C++: no Python frame at all)
_INTO_DISPATCH_MODE = ((os.path.join("torch", "_compile.py"), "inner"),
                       (os.path.join("torch", "_dynamo", "eval_frame.py"), "_fn"))
_OP_CALL = os.path.join("torch", "_ops.py")


def _is_one_of(code, frames) -> bool:
    return any(code.co_name == name and code.co_filename.endswith(os.sep + path) for path, name in frames)


def user_traceback(tb):
    """The traceback Python would show without nndb: nndb's and runpy's own
    frames dropped from the top, and nndb's frames within with the torch
    frames that only led into them or out of them: its torch function mode
    on the first steps (a loss that raises went public API ->
    torch.overrides.handle_torch_function -> nndb -> the same API again; the
    two torch frames that led into the mode go), and its dispatch mode (the
    op recorder of 'lineage on' and 'catch nan --eager': an operation that
    raises went C++ -> torch's dynamo-disable wrappers -> nndb ->
    OpOverload.__call__; those torch frames go too, so the traceback and a
    post-mortem's frame end at the script's line, as without nndb)."""
    while tb is not None and (tb.tb_frame.f_code.co_filename.startswith(_OWN_DIRS[0])
                              or tb.tb_frame.f_code.co_filename == runpy.__file__):
        tb = tb.tb_next
    kept = []
    out_of_nndb = False        # (the frame before was nndb's)
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename.startswith(_OWN_DIRS[0]) or code.co_name == "_nndb_call":   # (funcmode.TRAMPOLINE)
            if kept and kept[-1].tb_frame.f_code.co_name == "handle_torch_function":
                kept.pop()                          # torch.overrides, into the mode
                if kept:
                    kept.pop()                      # the API's call of it (shown again below, as Python shows it)
            while kept and _is_one_of(kept[-1].tb_frame.f_code, _INTO_DISPATCH_MODE):
                kept.pop()
            out_of_nndb = True
        elif out_of_nndb and code.co_name == "__call__" and code.co_filename.endswith(os.sep + _OP_CALL):
            out_of_nndb = False                     # the operation the dispatch mode handed on
        else:
            kept.append(tb)
            out_of_nndb = False
        tb = tb.tb_next
    for a, b in zip(kept, kept[1:]):
        a.tb_next = b
    if kept:
        kept[-1].tb_next = None
    return kept[0] if kept else None


def print_script_exception(exc: BaseException) -> None:
    """Show an uncaught exception as Python would (honouring sys.excepthook)."""
    tb = user_traceback(exc.__traceback__)
    hook = sys.excepthook
    if hook is sys.__excepthook__ or hook is None:
        # Python's own display, which alone adds "Did you mean: 'loss'?" to a
        # NameError or AttributeError on 3.11 (traceback's does from 3.12); it
        # shows the exception's own traceback: nndb's frames taken off for it.
        full, exc.__traceback__ = exc.__traceback__, tb
        try:
            sys.__excepthook__(type(exc), exc, tb)
        except Exception:
            traceback.print_exception(type(exc), exc, tb, file=sys.stderr)
        finally:
            exc.__traceback__ = full
    else:
        # The script's own hook (torch.distributed's, which prefixes "[rankN]: " to each
        # line, installs one at init_process_group) that hands the exception on to
        # sys.__excepthook__: that shows the exception's own traceback, whatever it is
        # given, so nndb's frames come off it there too (they were shown above the script's).
        full, exc.__traceback__ = exc.__traceback__, tb
        try:
            hook(type(exc), exc, tb)
        except Exception:
            traceback.print_exception(type(exc), exc, tb, file=sys.stderr)
        finally:
            exc.__traceback__ = full
    sys.stderr.flush()


def system_exit_code(e: SystemExit) -> int:
    """Python's own mapping of SystemExit to a process status."""
    code = e.code
    if code is None:
        return 0
    if isinstance(code, bool):
        return int(code)
    if isinstance(code, int):
        return code & 0xFF if code >= 0 else code % 256
    print(code, file=sys.stderr)
    return 1
