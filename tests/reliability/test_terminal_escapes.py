"""Nothing from a file reaches the terminal unescaped (issue 20): a trace whose
metadata, tensor names or events hold escape sequences (an OSC that retitles
the terminal, a CSI that clears the screen) is shown by ``nndb inspect`` and
``nndb check-trace`` with the escapes visible (``\\x1b``), never sent; the
debugger shows a script's names the same way."""
import json

import h5py
import numpy as np
import pytest

from conftest import example, nndb, run_in_process
from nndb.frontends.batch import ScriptedFrontend
from nndb.text import printable, printable_line

OSC = "\x1b]0;pwned\x07"          # retitles the terminal
CLEAR = "\x1b[2J"                 # clears the screen
RAW = ("\x1b", "\x07", "\x9b")    # ESC, BEL, the C1 CSI


def test_printable_shows_control_characters_and_keeps_the_rest():
    assert printable(OSC + CLEAR) == "\\x1b]0;pwned\\x07\\x1b[2J"
    assert printable("a\tb\nc\rd\x7f\x9be") == "a\tb\nc\\x0dd\\x7f\\x9be"
    assert printable_line("a\nb\tc") == "a\\x0ab\\x09c"
    assert printable("naïve ∑ 日本") == "naïve ∑ 日本"


def _set_blob(f, name, text):
    data = text.encode("utf-8")
    del f[name]
    f.create_dataset(name, data=np.frombuffer(data, dtype=np.uint8), maxshape=(None,), chunks=True)
    from nndb.schema import COMMITTED
    if "committed" in f and name in COMMITTED:      # the reader trusts the lengths the writer committed
        f["committed"][COMMITTED.index(name)] = len(data)


@pytest.fixture(scope="module")
def hostile_trace(tmp_path_factory):
    """A trace written by nndb's own writer, then given escapes with h5py."""
    trace = str(tmp_path_factory.mktemp("escapes") / "t.h5")
    r = nndb("run", "--trace", trace, example("nan_lr.py"), "--steps", "3", "--lr", "0.01")
    assert r.returncode == 0, r.stderr
    with h5py.File(trace, "r+") as f:
        meta = json.loads(bytes(f["meta"][:]).decode())
        meta.update(script=f"/tmp/{OSC}train.py", hostname=CLEAR, argv=["x.py", OSC, "\x9b2J"], openmp=OSC)
        _set_blob(f, "meta", json.dumps(meta))
        lines = [json.loads(line) for line in bytes(f["series"][:]).decode().splitlines() if line.strip()]
        lines[0]["name"] = f"fc{CLEAR}{OSC}"
        _set_blob(f, "series", "".join(json.dumps(d) + "\n" for d in lines))
        cols = json.loads(f["stats"].attrs["columns"])
        f["stats"][2, lines[0]["id"], cols.index("nan_count")] = 3.0     # a finding that names it
        event = {"time": 0.0, "step": 1, "kind": "recording_stopped", "message": f"boom {OSC}{CLEAR}"}
        _set_blob(f, "events", bytes(f["events"][:]).decode() + json.dumps(event) + "\n")
    return trace, lines[0]["name"], lines[0]["kind"]


def _assert_safe(r):
    for stream in (r.stdout, r.stderr):
        assert not any(c in stream for c in RAW), stream


def test_inspect_text_shows_the_escapes(hostile_trace):
    trace, _, _ = hostile_trace
    r = nndb("inspect", trace)
    assert r.returncode == 0, r.stderr
    _assert_safe(r)
    assert "\\x1b]0;pwned\\x07train.py" in r.stdout and "\\x1b[2J" in r.stdout and "\\x9b2J" in r.stdout
    assert "fc\\x1b[2J\\x1b]0;pwned\\x07" in r.stdout and "boom \\x1b]0;pwned" in r.stdout


def test_inspect_json_escapes_and_keeps_the_text(hostile_trace):
    trace, name, _ = hostile_trace
    r = nndb("inspect", trace, "--json")
    assert r.returncode == 0, r.stderr
    _assert_safe(r)
    data = json.loads(r.stdout)
    assert data["meta"]["hostname"] == CLEAR and name in [t["name"] for t in data["tensors"]]


def test_inspect_series_of_a_hostile_name(hostile_trace):
    trace, name, kind = hostile_trace
    for extra in ((), ("--json",)):
        r = nndb("inspect", trace, "--series", name, "--kind", kind, *extra)
        assert r.returncode == 0, r.stderr
        _assert_safe(r)
    r = nndb("inspect", trace, "--series", name + "x")          # the error names it too
    assert r.returncode == 2
    _assert_safe(r)


def test_check_trace_shows_the_escapes(hostile_trace):
    trace, _, _ = hostile_trace
    r = nndb("check-trace", trace)
    assert r.returncode == 0, r.stderr
    _assert_safe(r)
    assert "nonfinite" in r.stdout and "fc\\x1b[2J\\x1b]0;pwned\\x07" in r.stdout
    r = nndb("check-trace", trace, "--json")
    assert r.returncode == 0, r.stderr
    _assert_safe(r)


def test_the_debugger_shows_a_scripts_hostile_names_escaped(tmp_path):
    script = str(__import__("pathlib").Path(__file__).parent.parent / "scripts" / "escapes_module_names.py")
    fe = ScriptedFrontend([])
    run_in_process(tmp_path, script, args=["--steps", "3"], rules="none",
                   commands=["break step 1", "continue", "stats", "info modules", "history grad \x1b]0;pwned\x07.weight"],
                   frontend=fe)
    text = fe.text
    assert not any(c in text for c in RAW), text
    assert "\\x1b]0;pwned\\x07.weight" in text and "\\x1b[2J" in text


def test_plot_draws_the_escapes_and_sends_none(hostile_trace, tmp_path):
    """matplotlib warns of each glyph its font lacks, with the character in the
    message: ESC and BEL of a tensor name reached the terminal so (issue 41)."""
    pytest.importorskip("matplotlib")
    trace, name, kind = hostile_trace
    out = tmp_path / "h.svg"
    r = nndb("plot", trace, "--kind", kind, "--rules", "none", "-o", str(out))
    assert r.returncode == 0, r.stderr
    _assert_safe(r)
    assert "Glyph" not in r.stderr, r.stderr
    assert "fc\\x1b[2J" in out.read_text()          # drawn as written, escaped
