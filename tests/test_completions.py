import os
import subprocess
import sys


from conftest import ROOT

BASH = os.path.join(ROOT, "completions", "nndb.bash")


def test_checked_in_completions_match_the_generator():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_completions.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_option_of_the_cli_is_in_every_shell():
    from nndb.cli import cli
    texts = {sh: open(os.path.join(ROOT, "completions", f"nndb.{sh}")).read() for sh in ("bash", "zsh", "fish")}
    for cmd in cli.commands.values():
        for p in cmd.params:
            for opt in getattr(p, "opts", []):
                if opt.startswith("--"):
                    for sh, text in texts.items():
                        assert (opt if sh != "fish" else f"-l {opt[2:]}") in text, (sh, opt)


def complete(line: str, tmp_path) -> list:
    """What bash completion offers for the last word of ``line``."""
    words = line.split(" ")
    script = (f"source {BASH}\n"
              f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
              "_nndb; printf '%s\\n' \"${COMPREPLY[@]}\"\n")
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    return [w for w in r.stdout.splitlines() if w]


def test_bash_completes_commands_options_choices_and_files(tmp_path):
    (tmp_path / "train.py").write_text("")
    assert complete("nndb ins", tmp_path) == ["inspect"]
    assert set(complete("nndb ", tmp_path)) >= {"run", "inspect", "trust"}
    assert complete("nndb run --eve", tmp_path) == ["--every"]
    assert complete("nndb run --ev", tmp_path) == ["--every", "--eval-command"]
    assert complete("nndb inspect t.h5 --stat z", tmp_path) == ["zero_frac"]
    assert complete("nndb inspect t.h5 --kind gr", tmp_path) == ["grad"]
    assert complete("nndb run --every 3 tr", tmp_path) == ["train.py"]
    # after SCRIPT every word is the script's: files, not nndb's options
    assert complete("nndb run train.py --ev", tmp_path) == []
    assert complete("nndb run train.py tr", tmp_path) == ["train.py"]


def test_command_and_rule_references_match_their_tables():
    """docs/commands.md and docs/rules.md are generated from the command table,
    the cadence and the rule catalog (scripts/gen_command_docs.py)."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_command_docs.py"), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
