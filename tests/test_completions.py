import os
import subprocess
import sys

from conftest import ROOT


def test_checked_in_completions_match_the_generator():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_completions.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for shell in ("bash", "zsh", "fish"):
        assert os.path.getsize(os.path.join(ROOT, "completions", f"nndb.{shell}")) > 100


def _complete(words, cword):
    env = dict(os.environ, COMP_WORDS=words, COMP_CWORD=str(cword), _NNDB_COMPLETE="bash_complete",
               PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-m", "nndb"], env=env, capture_output=True, text=True)
    return r.stdout.split()


def test_completion_answers_subcommands_options_and_choices():
    assert "plain,inspect" in _complete("nndb ins", 1)
    assert {"plain,run", "plain,inspect"} <= set(_complete("nndb ", 1))
    assert "plain,--every" in _complete("nndb run --ev", 2)
    assert "plain,zero_frac" in _complete("nndb inspect t.h5 --stat z", 4)
