"""No code from the working directory runs because nndb started a process.

``python script.py`` puts the script's directory first on ``sys.path``, not
the working directory; ``python -m nndb`` (and ``python -c``) put the
working directory there.  A ``click.py`` or ``numpy.py`` in the directory
nndb is started from must therefore not run: not at ``nndb run`` (nor in the
process it starts again with Intel's OpenMP runtime preloaded), not at
``nndb run -m``, not in a respawned replica, not at ``nndb check`` or
``nndb inspect``.  The script still sees ``sys.path[0]`` as Python gives it,
and the processes it starts see the environment plain Python gives them."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT, nndb, python, run_in_process

# Modules nndb imports (click, numpy, yaml, tabulate, h5py) planted in the working
# directory: each writes a marker file when imported.
# (what nndb imports from the directory it starts in: start-up itself, never a zygote's child)
pytestmark = pytest.mark.real_subprocess
PLANTED = ("click", "numpy", "yaml", "tabulate", "h5py", "torch", "prompt_toolkit")

SCRIPT = textwrap.dedent('''
    import json, os, subprocess, sys
    import torch
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    child = subprocess.run([sys.executable, "-c", "import sys; print(sys.path[0])"],
                           capture_output=True, text=True).stdout.strip()
    print("PATHS " + json.dumps({"path0": sys.path[0], "cwd_on_path": os.getcwd() in sys.path or "" in sys.path,
                                 "safepath_env": os.environ.get("PYTHONSAFEPATH"),
                                 "child_path0": child}), flush=True)
''')


def _plant(cwd):
    cwd.mkdir(exist_ok=True)
    for name in PLANTED:
        (cwd / f"{name}.py").write_text(
            f"open({str(cwd / ('RAN-' + name))!r}, 'w').write('imported from the working directory')\n")


def _ran(cwd) -> list:
    return sorted(p.name[4:] for p in cwd.iterdir() if p.name.startswith("RAN-"))


def _paths(stdout: str) -> dict:
    line = [l for l in stdout.splitlines() if l.startswith("PATHS ")]
    assert line, stdout
    return json.loads(line[-1][6:])


def _setup(tmp_path):
    cwd, sdir = tmp_path / "work", tmp_path / "code"
    sdir.mkdir()
    (sdir / "train.py").write_text(SCRIPT)
    _plant(cwd)
    return cwd, sdir / "train.py"


def test_nndb_run_imports_nothing_from_the_working_directory(tmp_path):
    cwd, script = _setup(tmp_path)
    r = nndb("run", "--batch", "--nx", "--trace", str(tmp_path / "t.h5"), str(script), cwd=str(cwd))
    assert r.returncode == 0, r.stderr
    assert _ran(cwd) == [], r.stderr
    # the script's sys.path[0], environment and children are those of plain Python
    plain = python(str(script), cwd=str(cwd))
    assert plain.returncode == 0 and _ran(cwd) == [], plain.stderr
    assert _paths(r.stdout) == _paths(plain.stdout)
    assert _paths(r.stdout)["path0"] == str(script.parent)


def test_nndb_run_m_module_imports_nothing_from_the_working_directory(tmp_path):
    cwd = tmp_path / "work"
    _plant(cwd)
    (cwd / "trainmod.py").write_text(SCRIPT)
    for name in ("torch", "numpy"):     # python -m trainmod imports these from its directory too (torch: numpy)
        os.remove(cwd / f"{name}.py")
    r = nndb("run", "--batch", "--nx", "--trace", str(tmp_path / "t.h5"), "-m", "trainmod", cwd=str(cwd))
    assert r.returncode == 0, r.stderr
    assert _ran(cwd) == [], r.stderr
    plain = python("-m", "trainmod", cwd=str(cwd))     # (it imports the planted tabulate.py: torch does at exit)
    assert plain.returncode == 0, plain.stderr
    assert _paths(r.stdout) == _paths(plain.stdout)
    assert _paths(r.stdout)["path0"] == str(cwd)


def test_a_respawned_replica_imports_nothing_from_the_working_directory(tmp_path):
    cwd, script = _setup(tmp_path)
    r = nndb("run", "--batch", "--nx", "--replica", "respawn", "--trace", str(tmp_path / "t.h5"),
             "-e", "break step 2", "-e", "continue", "-e", "reverse-step", "-e", "present", "-e", "continue",
             str(script), cwd=str(cwd))
    assert r.returncode == 0, r.stderr
    assert "In the past" in r.stdout and "replayed from the start" in r.stdout, r.stdout + r.stderr
    assert _ran(cwd) == [], r.stderr


def test_nndb_check_imports_nothing_from_the_working_directory(tmp_path):
    cwd, script = _setup(tmp_path)
    r = nndb("check", "--steps", "2", "--overfit-iters", "5", str(script), cwd=str(cwd))
    assert r.returncode in (0, 1), r.stderr
    assert "PASS" in r.stdout or "FAIL" in r.stdout, r.stdout
    assert _ran(cwd) == [], r.stderr


def test_nndb_inspect_imports_nothing_from_the_working_directory(tmp_path):
    _, script = _setup(tmp_path)
    run_in_process(tmp_path, str(script), rules="none")
    cwd = tmp_path / "elsewhere"
    _plant(cwd)
    r = nndb("inspect", str(tmp_path / "run.h5"), cwd=str(cwd))
    assert r.returncode == 0, r.stderr
    assert "steps" in r.stdout, r.stdout
    assert _ran(cwd) == [], r.stderr


def test_the_nndb_console_script_imports_nothing_from_the_working_directory(tmp_path):
    """The ``nndb`` command pip installs (a setuptools entry point) has its own
    directory first on sys.path, which the script must not see either."""
    cwd, script = _setup(tmp_path)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nndb").write_text("import sys\nfrom nndb.cli import main\nif __name__ == '__main__':\n"
                                 "    sys.exit(main())\n")            # (what setuptools writes, less the shebang)
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, str(bindir / "nndb"), "run", "--batch", "--nx", "--trace",
                        str(tmp_path / "t.h5"), str(script)], cwd=str(cwd), env=env, capture_output=True,
                       text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert _ran(cwd) == [], r.stderr
    plain = python(str(script), cwd=str(cwd))
    assert _paths(r.stdout) == _paths(plain.stdout)
