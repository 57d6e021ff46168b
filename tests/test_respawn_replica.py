"""A respawned replica (``--replica respawn``: the script run again in a new
process) is built by the same build_session() as the live run: lineage,
catch points and the rule settings changed at the prompt work there too."""
import re
import textwrap

from conftest import Ran, nndb

NAN = textwrap.dedent('''
    import torch, torch.nn as nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3), nn.Softmax(dim=1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):
        x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
        p = model(x)
        onehot = nn.functional.one_hot(y, 3).float()
        if step == 3:
            p = p * onehot                       # the other classes get a probability of exactly 0
        logp = torch.log(p)                      # LOG LINE
        loss = -(onehot * logp).sum(1).mean()    # 0 * -inf = NaN
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("done")
''')


def _run(tmp_path, commands, rules="none"):
    script = tmp_path / "nan.py"
    script.write_text(NAN)
    argv = ["run", "--batch", "--nx", "--replica", "respawn", "--rules", rules, "--trace", str(tmp_path / "t.h5")]
    for c in commands:
        argv += ["-e", c]
    r = Ran(nndb(*argv, str(script), cwd=str(tmp_path)), argv)
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    return r


def test_lineage_of_a_step_in_a_respawned_replica(tmp_path):
    r = _run(tmp_path, ["break step 4", "continue", "goto 1", "lineage on", "next",
                        "lineage loss --depth 2", "present", "continue"])
    assert "2 step(s) replayed from the start" in r.stdout
    assert "lineage of loss in step 2" in r.stdout, r.stdout
    assert re.search(r"\bmean\b", r.stdout.split("lineage of loss in step 2")[1])
    assert "done" in r.stdout


def test_catch_nan_stops_in_a_respawned_replica(tmp_path):
    r = _run(tmp_path, ["break step 4", "continue", "goto 1", "catch nan", "continue", "present", "continue"])
    past = r.stdout.split("In the past")[1].split("Back in the present")[0]
    assert re.search(r"Catchpoint 2 \(catch nan\): log made Inf in the forward pass of step 3 \(nan.py:12\)",
                     past), r.stdout
    assert "-> loss = -(onehot * logp)" in past          # stopped where the NaN was made


def test_rule_settings_changed_at_the_prompt_hold_in_a_respawned_replica(tmp_path):
    # (the past ends at the present: it is past step 3, where the NaN is)
    r = _run(tmp_path, ["break step 4", "continue", "delete 1", "rule action nonfinite stop", "goto 0",
                        "continue", "present", "rule action nonfinite warn", "continue"], rules="default")
    past = r.stdout.split("In the past")[1].split("Back in the present")[0]
    assert "Rule nonfinite (" in past, r.stdout
    assert r.stdout.count("Rule nonfinite (") == 1         # the live run, set back to warn, only warns
    assert "done" in r.stdout


def test_a_respawned_past_prints_to_the_file_the_run_prints_to(tmp_path):
    """nndb run ... > log: a respawned replica silenced its output, then took the kept
    descriptors of that file for files the script had opened and pointed them at scratch
    copies: the 'In the past' line and every command's output in the past were lost."""
    import subprocess
    from conftest import nndb_started
    script = tmp_path / "s.py"
    script.write_text(textwrap.dedent("""
        import torch
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for step in range(8):
            loss = m(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
            print("step", step, repr(loss.item()), flush=True)
        """))
    out = tmp_path / "out.txt"
    with open(out, "w") as fh:
        r = nndb_started("run", "--batch", "-q", "--replica", "respawn", "--nx", "-e", "until 6", "-e", "rs 3",
                         "-e", 'p ("AT", $step, $loss)', "-e", "present", "-e", "continue", str(script),
                         cwd=tmp_path, stdout=fh, stderr=subprocess.STDOUT)
        try:
            code = r.wait(timeout=180)
        finally:
            if r.poll() is None:
                r.kill()
    text = out.read_text()
    assert code == 0, text
    printed = dict(re.findall(r"^step (\d+) (\S+)$", text, re.M))
    assert "In the past (timeline 0): step 3 finished" in text, text
    assert f"('AT', 3, {printed['3']})" in text and "went to scratch copies" not in text


def test_a_respawned_replica_keeps_the_hits_the_live_run_counted(tmp_path):
    """A respawned replica attached its session as a new run, which zeroes every point's
    hits, and its state came back to the live run: after 'rc' and 'present', 'info
    breakpoints' showed 0 hits for breakpoints hit twice and once (a fork replica: 2 and 1)."""
    r = _run(tmp_path, ["break step 1", "break step 4", "continue", "continue", "reverse-continue",
                        "info breakpoints", "present", "info breakpoints", "continue"])
    assert "replayed from the start" in r.stdout, r.stdout
    rows = re.findall(r"^([12]) +breakpoint +keep +y +step \d +(\d+)", r.stdout, re.M)
    assert rows == [("1", "2"), ("2", "1")] * 2, r.stdout     # in the past (rc counts a hit), and back
    assert "done" in r.stdout


# makemore --resume: the script starts from the snapshot it saves over as it trains.
RESUMES = textwrap.dedent('''
    import os
    import torch, torch.nn as nn
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    if os.path.exists("snap.pt"):
        model.load_state_dict(torch.load("snap.pt", weights_only=True))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(8):
        x = torch.randn(16, 4)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 3:
            torch.save(model.state_dict(), "snap.pt")
''')


def test_a_drift_names_the_file_the_run_saved_over_since_it_started(tmp_path):
    """makemore --resume overwrites the model.pt it resumed from; a replay from the start then
    began from the new one and drifted at once, the message listing 'a file that changed since'
    among three causes without naming it.  (A snapshot the run made since it started is not
    there for the replay.)"""
    script = tmp_path / "resume.py"
    script.write_text(RESUMES)
    (tmp_path / "untouched.txt").write_text("written before the run")
    argv = ["run", "--batch", "--nx", "--replica", "respawn", "--trace", str(tmp_path / "t.h5"), "--force",
            "-e", "until 5", "-e", "goto 1"]
    # (no snapshot at the start: the one the run saved is not there for a replay from the start,
    # which starts afresh as the run did)
    r = Ran(nndb(*argv, str(script), cwd=str(tmp_path)), argv)
    assert "In the past (timeline 0): step 1 finished" in r.stdout, r
    assert "it read the files" not in r.stderr, r.stderr
    # (a snapshot there at the start, which the run saves over: read as it is now, named)
    import torch
    torch.manual_seed(1)
    torch.save(torch.nn.Linear(4, 1).state_dict(), tmp_path / "snap.pt")
    r = Ran(nndb(*argv, str(script), cwd=str(tmp_path)), argv)
    said = [l for l in r.stderr.splitlines() if "it read the files the run wrote since it started" in l]
    assert len(said) == 1 and said[0].endswith("as they are now: snap.pt"), r.stderr
    assert "step 0" in said[0] and "untouched.txt" not in said[0], said
