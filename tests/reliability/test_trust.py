"""The trust file and nndb's private files (issue 20): a trusted path cannot
inject a second record, control characters and too-wide directories are
refused, the trust file is 0600 (a warning when others can write it), an old
one-path-per-line file is still read; the REPL history is 0600."""
import json
import os
import stat

import pytest

from conftest import nndb
from nndb.commands import rcfiles


@pytest.fixture
def xdg(tmp_path, monkeypatch):
    d = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(d))
    return d


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_newline_in_a_directory_name_trusts_nothing_else(tmp_path, xdg):
    """`nndb trust .` in "proj\\n<other>" must not trust <other>, whose .nndbrc would then run."""
    other = tmp_path / "other"
    other.mkdir()
    (other / ".nndbrc").write_text('p "INJECTED"\n')
    evil = tmp_path / f"proj\n{other}"                # (the second line's slashes make subdirectories)
    evil.mkdir(parents=True)
    r = nndb("trust", ".", cwd=str(evil), env={"XDG_CONFIG_HOME": str(xdg)})
    assert r.returncode == 2 and "control character" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert not rcfiles.is_trusted(str(other))
    assert not rcfiles.is_trusted(str(evil))


@pytest.mark.parametrize("name", ["tab\there", "esc\x1b[31m", "cr\rhere", "sep\u2028here"])
def test_control_characters_are_refused(tmp_path, xdg, name):
    d = tmp_path / name
    d.mkdir()
    with pytest.raises(rcfiles.UsageError, match="control character"):
        rcfiles.trust(str(d))
    assert rcfiles.trusted_dirs() == []


@pytest.mark.parametrize("directory", ["/", "/tmp", "~"])
def test_roots_need_force(xdg, directory, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    d = os.path.expanduser(directory)
    with pytest.raises(rcfiles.UsageError, match="--force"):
        rcfiles.trust(d)
    assert rcfiles.trusted_dirs() == []
    assert rcfiles.trust(d, force=True) == os.path.realpath(d)
    assert rcfiles.is_trusted(d)


def test_trust_from_the_command_line_refuses_the_root(xdg):
    r = nndb("trust", "/", env={"XDG_CONFIG_HOME": str(xdg)})
    assert r.returncode == 2 and "--force" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not (xdg / "nndb" / "trusted").exists()


def test_the_trust_file_is_one_json_record_per_path_mode_0600(tmp_path, xdg):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    rcfiles.trust(str(a))
    rcfiles.trust(str(b))
    f = xdg / "nndb" / "trusted"
    assert mode(f) == 0o600
    assert json.loads(f.read_text())["directories"] == [os.path.realpath(a), os.path.realpath(b)]


def test_a_trust_file_others_can_write_is_warned_about(tmp_path, xdg):
    a = tmp_path / "a"
    a.mkdir()
    rcfiles.trust(str(a))
    f = xdg / "nndb" / "trusted"
    os.chmod(f, 0o666)
    said = []
    assert rcfiles.is_trusted(str(a), warn=said.append)
    assert len(said) == 1 and "writable by others" in said[0] and str(f) in said[0]


def test_an_old_trust_file_is_read_and_its_control_characters_ignored(tmp_path, xdg):
    a, b = tmp_path / "a", tmp_path / "b\tc"
    a.mkdir(), b.mkdir()
    f = xdg / "nndb" / "trusted"
    f.parent.mkdir(parents=True)
    f.write_text(f"# nndb trusted directories\n{a}\n{b}\n")
    said = []
    assert rcfiles.trusted_dirs(warn=said.append) == [str(a)]
    assert len(said) == 1 and "control character" in said[0]
    assert rcfiles.is_trusted(str(a)) and not rcfiles.is_trusted(str(b))
    d = tmp_path / "d"
    d.mkdir()
    rcfiles.trust(str(d))                                  # rewritten in the new form
    assert json.loads(f.read_text())["directories"] == [str(a), os.path.realpath(d)]


@pytest.mark.parametrize("existing", [False, True])
def test_the_repl_history_is_private(tmp_path, existing):
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput
    from nndb.frontends.repl import ReplFrontend
    hist = tmp_path / "history"
    if existing:
        hist.write_text("")
        os.chmod(hist, 0o644)
    with create_pipe_input() as inp:
        fe = ReplFrontend(input=inp, output=DummyOutput(), history_path=str(hist))
        fe._prompt.history.append_string("py token = 'secret'")
    assert "secret" in hist.read_text()
    assert mode(hist) == 0o600
