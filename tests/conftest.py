import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "scripts", "examples")


def example(name: str) -> str:
    return os.path.join(EXAMPLES, name)


def nndb(*args, cwd=None, timeout=180, env=None, **kw) -> subprocess.CompletedProcess:
    """Run ``python -m nndb ARGS`` in a subprocess."""
    e = dict(os.environ)
    e.pop("NNDB_DEBUG", None)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    if env:
        e.update(env)
    kw.setdefault("stdin", subprocess.DEVNULL)      # not a terminal: batch mode
    return subprocess.run([sys.executable, "-m", "nndb", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=e, **kw)


def python(*args, cwd=None, timeout=180) -> subprocess.CompletedProcess:
    """Run the same thing with plain Python, for comparison."""
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def without_nndb_lines(stderr: str) -> str:
    return "".join(l for l in stderr.splitlines(True) if not l.startswith("nndb: "))


@pytest.fixture
def trace(tmp_path):
    return str(tmp_path / "run.h5")


def run_in_process(tmp_path, script: str, args=(), rules="default", commands=(), frontend=None):
    """Run a script under nndb in this process (no torch import per run: fast),
    in batch mode; returns the driver's DebugResult (``.session.findings``)."""
    import gc
    from nndb.config import RunConfig
    from nndb.debugger.driver import DebugOptions, debug
    from nndb.debugger.frontend import ScriptedFrontend
    from nndb.launcher import Target
    gc.collect()     # an earlier test's optimizers must not look alive to the step clock
    fe = frontend or ScriptedFrontend([])
    cfg = RunConfig(Target(path=script, args=[str(a) for a in args]), str(tmp_path / "run.h5"), quiet=True)
    return debug(cfg, DebugOptions(batch=True, no_rc=True, rules=rules, eval_commands=tuple(commands)), fe)


def findings_of(result, severities=("error", "warning")) -> list:
    return [f for f in result.session.findings if f["severity"] in severities]
