import os
import signal
import subprocess
import sys

# Each xdist worker's torch, and every run it starts, on its share of the
# cores (cores // workers threads; an OMP_NUM_THREADS of the caller's is
# kept).  With a thread per core in each of two workers on two cores, the
# OpenMP threads of the two spun against each other: two rule matrices side
# by side took 120 s, against 48 s on one thread each (33 s for one alone).
# Runs with and without nndb in a test see the same variable: the same
# numbers.  (Before torch is imported here: libgomp reads it when loaded.)
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
if _WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _WORKERS))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

import pytest  # noqa: E402

import schedule  # noqa: E402
import zygote  # noqa: E402

# The workers of every torchrun job a test starts (nndb's and plain torchrun's, whatever
# environment the test builds from this one): children of this process's zygote, which has
# imported torch and nndb, through torchrun's own hook for the interpreter (zygote.worker_python).
if os.environ.get(zygote.REAL_ENV) != "1":
    os.environ["PYTHON_EXEC"] = zygote.worker_python()

# A suite started in the background of a non-interactive shell (``pytest &``)
# inherits SIGINT ignored, and so does every run it starts (an ignored signal
# stays ignored across exec): the tests that send a run Ctrl-C then wait for
# nothing (four failed so on 2026-12-02).  Python's own handler, as in a
# foreground start: the runs then get the default disposition at exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "scripts", "examples")


def example(name: str) -> str:
    return os.path.join(EXAMPLES, name)


def _base_env() -> dict:
    e = dict(os.environ)
    e.pop("NNDB_DEBUG", None)
    e.pop(zygote.REAL_ENV, None)
    # (no empty entry: an empty PYTHONPATH component is the working directory)
    e["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in e.get("PYTHONPATH", "").split(os.pathsep) if p])
    return e


def nndb(*args, cwd=None, timeout=180, env=None, **kw) -> subprocess.CompletedProcess:
    """Run ``python -m nndb ARGS`` as a subprocess would: in a child of the
    pre-imported zygote (tests/zygote.py) where it can stand in for one, else
    (and with NNDB_TEST_REAL_SUBPROCESS=1, or in a test marked
    ``real_subprocess``) in a real subprocess."""
    e = dict(_base_env(), **(env or {}))
    kw.setdefault("stdin", subprocess.DEVNULL)      # not a terminal: batch mode
    if _zygote_may_run(e, _ZYGOTE_ENV, kw):
        return zygote.run(list(args), cwd, e, _ZYGOTE_ENV, timeout, kw["stdin"])
    return subprocess.run([sys.executable, "-m", "nndb", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=e, **kw)


def nndb_started(*args, cwd=None, env=None, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, start_new_session=False):
    """``python -m nndb ARGS`` started, as ``subprocess.Popen(..., text=True)``
    gives it, for a test that reads its output as it comes or signals it: in
    a child of the zygote where ``nndb()`` would take one (zygote.Started;
    ``stdout`` a pipe or a file, ``stderr`` a pipe or ``subprocess.STDOUT``;
    a process group of its own, as with ``start_new_session``), else a real
    subprocess."""
    e = dict(_base_env(), **(env or {}))
    if _zygote_may_run(e, _ZYGOTE_ENV, {"stdin": stdin}) and stderr in (subprocess.PIPE, subprocess.STDOUT) \
            and (stdout == subprocess.PIPE or hasattr(stdout, "fileno")):
        return zygote.Started(list(args), cwd, e, _ZYGOTE_ENV, stdin,
                              None if stdout == subprocess.PIPE else stdout, stderr)
    return subprocess.Popen([sys.executable, "-m", "nndb", *args], cwd=cwd, env=e, stdin=stdin, stdout=stdout,
                            stderr=stderr, text=True, start_new_session=start_new_session)


_ZYGOTE_ENV = _base_env()            # (the zygotes' own: the session's at its start)
_real_subprocess_test = [False]        # the running test is marked real_subprocess


def _zygote_may_run(env: dict, base: dict, kw: dict) -> bool:
    if os.environ.get(zygote.REAL_ENV) == "1" or _real_subprocess_test[0] or set(kw) != {"stdin"}:
        return False
    stdin = kw["stdin"]
    if stdin != subprocess.DEVNULL and not hasattr(stdin, "fileno"):
        return False
    return zygote.env_fits(env, base)


def pytest_configure(config):
    config.addinivalue_line("markers", "real_subprocess: nndb() runs real subprocesses in this test "
                                       "(its point is start-up, or it needs what only one gives)")
    config.addinivalue_line("markers", "real_workers: torchrun's workers are real processes in this test "
                                       "(its point rests on how a real interpreter ends)")


def pytest_unconfigure(config):
    zygote.close_all()


@pytest.hookimpl(tryfirst=True)        # (before xdist's own hook reads the xdist_group marks)
def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput") and getattr(config.option, "loadgroup", False):   # (a worker's dist is "no")
        schedule.order(items, schedule.load(), pytest.mark.xdist_group)


def pytest_collection_finish(session):
    """What this process holds once the tests are collected (torch, nndb, the
    test modules and items) lives to its end: out of the collector's sight
    (gc.freeze).  The in-process runs (run_in_process, the rule matrix) collect
    (gc.collect) before each run and nndb scans the referrers of the optimizer
    and DataLoader classes to find the run's own; those walk the run's
    objects then, not the whole worker (the rule matrix: 3.4x faster).  The
    runs' own objects are made later and are not frozen: the same found.
    (The modules a run imports are imported first, as the zygote does.)"""
    import gc
    import h5py  # noqa: F401
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401
    import nndb.cli  # noqa: F401
    import nndb.driver  # noqa: F401
    gc.collect()
    gc.freeze()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _real_subprocess_test[0] = item.get_closest_marker("real_subprocess") is not None
    if _WORKERS > 1 and os.environ.get(zygote.REAL_ENV) != "1":
        zygote.start(_ZYGOTE_ENV)      # (at once: a test's torchrun workers find them ready, or nearly)
    if item.get_closest_marker("real_workers") is not None and "PYTHON_EXEC" in os.environ:
        _worker_python.append(os.environ.pop("PYTHON_EXEC"))


def pytest_runtest_teardown(item):
    if _worker_python:
        os.environ["PYTHON_EXEC"] = _worker_python.pop()


_worker_python: list = []       # the shim, while a real_workers test runs without it


def python(*args, cwd=None, timeout=180, forked=False, input=None, env=None) -> subprocess.CompletedProcess:
    """Run the same thing with plain Python, for comparison.  ``forked``:
    ``python SCRIPT ARGS`` in a child of the zygote where ``nndb()`` would
    take one (no torch import of its own; the runs' environment): for what a
    script computes and prints, never for what Python itself does (start-up,
    sys.modules, the recursion limit, how it ends).  ``input``: text on its
    stdin, a pipe (else /dev/null with ``forked``, the caller's without);
    ``env``: its whole environment (else the runs' with ``forked``, the
    caller's without)."""
    if forked and args and str(args[0]).endswith(".py"):
        e = _base_env() if env is None else dict(env)
        stdin = _pipe_with(input) if input is not None else subprocess.DEVNULL
        try:
            if _zygote_may_run(e, _ZYGOTE_ENV, {"stdin": stdin}):
                return zygote.run([str(a) for a in args], cwd, e, _ZYGOTE_ENV, timeout, stdin, script=True)
        finally:
            if stdin is not subprocess.DEVNULL:
                stdin.close()
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          input=input, env=env)


def _pipe_with(text: str):
    """The read end of a pipe that holds ``text`` and then its end (as
    ``subprocess.run(input=...)`` gives it; text this short fits in the pipe)."""
    r, w = os.pipe()
    with os.fdopen(w, "w") as fh:
        fh.write(text)
    return os.fdopen(r, "rb")


def plain_and_recorded(tmp_path, source: str, *args):
    """The script ``source`` run by python and by ``nndb run --batch`` (same
    output); (python's result, the trace's path)."""
    script = tmp_path / "script.py"
    script.write_text(source)
    trace = str(tmp_path / f"script-{'-'.join(args)}.h5")
    plain = python(str(script), *args, forked=True)
    r = nndb("run", "--batch", "--trace", trace, str(script), *args)
    assert r.returncode == 0, r.stderr
    assert r.stdout == plain.stdout
    return plain, trace


# accelerate's optimizer wrapper (every Hugging Face Trainer's), for scripts that import torch first
ACCELERATE_WRAPPER = '''
class Wrapped(torch.optim.Optimizer):
    """accelerate's AcceleratedOptimizer's shape: no Optimizer.__init__, the script's
    optimizer held as .optimizer, its param_groups the held one's."""
    def __init__(self, optimizer):
        self.optimizer = optimizer
    @property
    def param_groups(self):
        return self.optimizer.param_groups
    @property
    def state(self):
        return self.optimizer.state
    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none)
    def step(self, closure=None):
        return self.optimizer.step(closure)
'''


def without_nndb_lines(stderr: str) -> str:
    return "".join(l for l in stderr.splitlines(True) if not l.startswith("nndb: "))


@pytest.fixture
def trace(tmp_path):
    return str(tmp_path / "run.h5")


def run_in_process(tmp_path, script: str, args=(), rules="default", commands=(), frontend=None):
    """Run a script under nndb in this process (no torch import per run: fast),
    in batch mode; returns the driver's DebugResult (``.session.log.findings``)."""
    import gc
    from nndb.run.config import RunConfig
    from nndb.driver import DebugOptions, debug
    from nndb.frontends.batch import ScriptedFrontend
    from nndb.run.launcher import Target
    gc.collect()     # an earlier test's optimizers must not look alive to the step clock
    fe = frontend or ScriptedFrontend([])
    cfg = RunConfig(Target(path=script, args=[str(a) for a in args]), str(tmp_path / "run.h5"), quiet=True)
    return debug(cfg, DebugOptions(batch=True, no_rc=True, rules=rules, eval_commands=tuple(commands)), fe)


def rule_matrix():
    """scripts/rule_matrix.py as a module (loaded once: its dataclasses look their module up)."""
    import importlib.util
    if "rule_matrix" not in sys.modules:
        spec = importlib.util.spec_from_file_location("rule_matrix", os.path.join(ROOT, "scripts", "rule_matrix.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules["rule_matrix"] = module
        spec.loader.exec_module(module)
    return sys.modules["rule_matrix"]


@pytest.fixture(scope="session")
def distrun_join_plain(tmp_path_factory):
    """tests/scripts/distrun_join.py run by torchrun alone (2 gloo ranks), the
    truth two tests compare nndb's job with (test_allstop_job.py,
    test_distributed_travel.py): one job for both, whose output is the same
    wherever the script lies.  (They are in the ``distrun_join`` xdist group:
    one worker runs both.)"""
    from test_distributed_run import _copy, _torchrun
    tmp = tmp_path_factory.mktemp("distrun_join_plain")
    plain = _torchrun(_copy(tmp, "distrun_join.py"), cwd=tmp)
    assert plain.returncode == 0, plain.stderr[-2000:]
    return plain


@pytest.fixture(scope="session")
def matrix_outcomes():
    """The rule matrix over tests/scripts (each planted and healthy script on
    each seed, in this process, default rules), computed once per worker: a
    test that reads it goes in the ``rule_matrix`` xdist group, so that one
    worker computes it for all of them."""
    from nndb.rules import engine
    matrix = rule_matrix()
    # (blocks cut by step count only, as on a quiet machine: on a loaded one
    # the 0.25 s cut makes them shorter; the findings are the same either way)
    seconds, engine.BLOCK_SECONDS = engine.BLOCK_SECONDS, float("inf")
    try:
        return [matrix.run_one(s, seed) for s in matrix.scripts() if not s.name.startswith("examples/")
                for seed in matrix.SEEDS]
    finally:
        engine.BLOCK_SECONDS = seconds


def findings_of(result, severities=("error", "warning")) -> list:
    return [f for f in result.session.log.findings if f["severity"] in severities]


# -- transcripts: a session as it was typed, shown when a test fails ---------------------------

PROMPT = "(nndb) "


class Transcript:
    """What a scripted session printed: each typed command after its prompt,
    then its output.  ``after(cmd)`` is one command's output; a test that fails
    while holding a Transcript (made in the test or given by a fixture) shows
    the whole session under "nndb session" in pytest's report."""

    def __init__(self, text: str, result=None, title: str = "nndb session"):
        self.text = text
        self.result = result          # the driver's DebugResult, for in-process sessions
        self.title = title
        _made_in_this_test.append(self)

    def after(self, command: str, nth: int = 1) -> str:
        """What was printed after the nth typing of ``command`` and before the next prompt."""
        chunks = self.text.split(PROMPT)[1:]
        hits = [c for c in chunks if c.split("\n", 1)[0] == command]
        assert len(hits) >= nth, f"{command!r} typed {len(hits)} time(s), not {nth} (the session is below)"
        body = hits[nth - 1].split("\n", 1)
        return body[1] if len(body) > 1 else ""

    def count(self, text: str) -> int:
        return self.text.count(text)

    def __contains__(self, text: str) -> bool:
        return text in self.text

    def __repr__(self) -> str:
        return f"<Transcript of {self.text.count(PROMPT)} command(s)>"

    def section(self) -> str:
        return self.text


class Ran:
    """A subprocess run of ``nndb`` (a CompletedProcess) with its command line,
    shown (command, exit code, stdout, stderr) in pytest's report when a test
    holding it fails."""

    def __init__(self, proc, argv=(), title: str = "nndb run"):
        self.proc = proc
        self.argv = list(argv)
        self.returncode, self.stdout, self.stderr = proc.returncode, proc.stdout, proc.stderr
        self.title = title
        _made_in_this_test.append(self)

    def __repr__(self) -> str:
        return f"<Ran nndb exit {self.returncode}>"

    def section(self) -> str:
        return (f"$ nndb {' '.join(self.argv)}\n(exit code {self.returncode})\n"
                f"--- stdout\n{self.stdout}--- stderr\n{self.stderr}")


_made_in_this_test: list = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    del _made_in_this_test[:]
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when != "call" or not rep.failed:
        return
    shown = [v for v in getattr(item, "funcargs", {}).values() if isinstance(v, (Transcript, Ran))]
    shown += [v for v in _made_in_this_test if all(v is not s for s in shown)]
    for v in shown:
        rep.sections.append((v.title, v.section()))
