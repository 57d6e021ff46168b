"""Time travel end to end: real scripts under ``nndb run --batch -x``.

The script has everything that makes a replay hard: dropout, a shuffling
DataLoader (num_workers=0), Adam, an LR scheduler and loop variables.  The
state after going back to step k must equal the original run's at step k,
bit for bit (a SHA-1 of every parameter's bytes), and the live run must end
exactly as a plain Python run does after reverse-step, predict, bisect and
replay --verify."""
import os
import re
import textwrap

import pytest

from conftest import ROOT, Ran, nndb, python

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork replicas need fork()")

SCRIPT = textwrap.dedent('''
    import hashlib, sys, threading, time
    import torch, torch.nn as nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 3, 0.5)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True, num_workers=workers,
                                         persistent_workers=workers > 0)
    if "--thread" in sys.argv:
        threading.Thread(target=time.sleep, args=(60,), name="prefetcher", daemon=True).start()

    def digest():
        h = hashlib.sha1()
        for p in model.parameters():
            h.update(p.detach().numpy().tobytes())
        return h.hexdigest()[:16]

    it = 0
    for epoch in range(3):
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            sched.step()
            it += 1
    print("final", digest(), repr(loss.item()))
''')

STATE = 'p ("STATE", it, epoch, digest(), loss.item(), opt.param_groups[0]["lr"])'


@pytest.fixture
def script(tmp_path):
    p = tmp_path / "train.py"
    p.write_text(SCRIPT)
    return str(p)


def run(tmp_path, script, commands, *extra, args=()):
    cmds = tmp_path / "cmds.nndb"
    cmds.write_text("\n".join(commands) + "\n")
    r = nndb("run", "--batch", "--nx", "--trace", str(tmp_path / "t.h5"), "--force", *extra, "-x", str(cmds),
             script, *args, cwd=str(tmp_path))
    Ran(r, ["run", "--batch", "--nx", *extra, "-x", "cmds.nndb", script, *args, "#", *commands])
    assert "Traceback" not in r.stderr, r.stderr
    return r


def states(out: str) -> list:
    return re.findall(r"\('STATE', .*\)", out)


def final(out: str) -> str:
    return [line for line in out.splitlines() if line.startswith("final ")][-1]


def test_reverse_step_restores_the_state_of_step_k_bit_for_bit(tmp_path, script):
    plain = python(script, cwd=str(tmp_path), forked=True)
    # the original run's state at step 7
    a = run(tmp_path, script, ["break step 7", "continue", STATE, "continue"])
    # another run goes to step 12, then back 5 steps: a replay from the
    # checkpoint at step 5 (--total-steps 100 puts early ones every 5 steps)
    b = run(tmp_path, script, ["break step 12", "continue", STATE, "reverse-step 5", STATE,
                               "present", STATE, "continue"], "--total-steps", "100")
    sa, sb = states(a.stdout), states(b.stdout)
    assert len(sa) == 1 and len(sb) == 3, (a.stdout, b.stdout)
    assert sb[1] == sa[0]                        # step 7 as it was: parameters, loss, epoch, lr
    assert sb[2] == sb[0]                        # the present is untouched
    assert "In the past (timeline 0): step 7 finished" in b.stdout
    assert "2 step(s) replayed from the checkpoint at step 5" in b.stdout
    assert "Back in the present (timeline 0): step 12." in b.stdout
    # the live run finishes exactly as plain Python does
    assert final(a.stdout) == final(b.stdout) == final(plain.stdout)
    assert "may not be exact" not in b.stderr


def test_goto_continue_and_next_replay_forward_in_the_past(tmp_path, script):
    a = run(tmp_path, script, ["break step 4", "break step 6", "continue", STATE, "continue", STATE, "continue"])
    b = run(tmp_path, script, ["break step 10", "continue", "goto 3", "delete 1", "break step 4",
                               "continue", STATE, "next 2", STATE, "present", "continue"])
    sa, sb = states(a.stdout), states(b.stdout)
    assert sb == sa, (a.stdout, b.stdout)          # steps 4 and 6, reached forward from the past


def test_predict_runs_ahead_and_leaves_the_live_run_bit_identical(tmp_path, script):
    plain = python(script, cwd=str(tmp_path), forked=True)
    r = run(tmp_path, script, ["break step 4", "continue", "predict 3", "predict 2 --set lr=0.5",
                               "next", 'p ("LOSS5", repr(loss.item()))', "continue"])
    assert final(r.stdout) == final(plain.stdout)
    assert "Predicted 3 step(s) ahead on a replica" in r.stdout
    rows = re.findall(r"^(\d+)\s+([-\d.e+]+)\s+([-\d.e+]+)\s+(\S+)$", r.stdout, re.M)
    assert [int(x[0]) for x in rows[:3]] == [5, 6, 7]
    live5 = float(re.search(r"\('LOSS5', '([^']+)'\)", r.stdout).group(1))
    assert float(rows[0][1]) == float(f"{live5:.6g}")       # predicted step 5 = what step 5 then did
    assert "baseline and lr 0.5 on replicas" in r.stdout
    assert "They first differ at step 6." in r.stdout       # lr acts from the first step after it


def test_respawn_replica_reaches_the_same_state_as_fork(tmp_path, script):
    cmds = ["break step 9", "continue", "reverse-step 4", STATE, "present", STATE, "continue"]
    f = run(tmp_path, script, cmds, "--replica", "fork")
    s = run(tmp_path, script, cmds, "--replica", "respawn")
    assert states(f.stdout) == states(s.stdout) and len(states(s.stdout)) == 2, (f.stdout, s.stdout)
    assert "6 step(s) replayed from the start" in s.stdout
    assert final(f.stdout) == final(s.stdout)


def test_changing_the_past_starts_a_timeline(tmp_path, script):
    r = run(tmp_path, script, ["break step 8", "continue", "rs 3", "set lr 0.5",
                               'p ("LR", opt.param_groups[0]["lr"])', "timelines", "next", "present", "timelines",
                               'p ("LR", opt.param_groups[0]["lr"])', "continue"])
    out = r.stdout
    assert "changing the past starts timeline 1 (from step 5 of timeline 0)" in out
    assert re.search(r"^1\s+step 5 of timeline 0\s+set lr 0.5\s+here, at step 5", out, re.M), out
    assert "In the past (timeline 1)" not in out and "Step 6 finished" in out
    assert "('LR', 0.5)" in out
    assert re.search(r"^1\s+step 5 of timeline 0\s+set lr 0.5\s+left", out, re.M), out
    assert re.search(r"^0\s+the live run\s+-\s+present, here, at step 8", out, re.M), out
    assert "('LR', 0.0025)" in out                 # the live run kept its own lr


def test_reverse_continue_bisect_and_replay_verify(tmp_path, script):
    r = run(tmp_path, script, ["break step 3", "break step 10", "continue", "continue", "rc",
                               'p ("AT", it)', "present", "bisect it >= 7",
                               "replay --verify", "replay --verify 2:6", "continue"])
    out = r.stdout
    # back at the end of step 3 (a step ends inside opt.step(): 'it' is still 3 there)
    assert "('AT', 3)" in out, out
    assert "it >= 7 first became true at step 7" in out
    assert re.search(r"replay --verify 0:11: 11 step\(s\) replayed from the checkpoint at step 0: "
                     r"identical to the trace, bit for bit \(\d+ values\)", out), out
    assert "replay --verify 2:6: 4 step(s) replayed" in out         # A:B leaves B out, as --steps does


def test_reverse_continue_counts_the_hit_and_deletes_a_tbreak(tmp_path, script):
    # gdb: a breakpoint reverse-continue stops at counts a hit; a temporary one is deleted
    r = run(tmp_path, script, ["until 6", "tbreak step 4", "break step 2", "rc", "info breakpoints",
                               "rc", "info breakpoints", "present", "info breakpoints", "continue"])
    out = r.stdout
    assert "In the past (timeline 0): step 4 finished" in out and "reverse-continue: 1 held" in out, out
    assert "In the past (timeline 0): step 2 finished" in out and "reverse-continue: 2 held" in out, out
    tables = out.split("Num    Type")[1:]
    assert len(tables) == 3, out
    assert "step 4" not in tables[0] and re.search(r"step 2\s+0", tables[0]), tables[0]
    for t in tables[1:]:                          # (in the past and back in the present)
        assert "step 4" not in t and "breakpoint already hit 1 time" in t, t


def test_reverse_continue_spends_ignore_counts_newest_first_as_gdb(tmp_path, script):
    """gdb counts a crossing whichever way it runs: in reverse the newest hit uses up an
    ignore count.  The scan replica spent it on the oldest hit of its segment and never
    gave it back: `break if it % 4 == 2` (it: 2, 6, 10 at those step ends), `ignore 1 1`,
    `rc` from step 12 went to step 10 (it should cross 10 and stop at 6), and 'info
    breakpoints' still said 'will ignore next 1 crossings'; with `break step 4`, `ignore 2 1`,
    every `rc` said there was no earlier hit."""
    r = run(tmp_path, script, ["until 12", "break if it % 4 == 2", "ignore 1 1", "rc", 'p ("AT", it)',
                               "info breakpoints", "present", "info breakpoints",
                               "delete 1", "break step 4", "ignore 2 1", "rc", "info breakpoints", "rc",
                               'p ("AT", it)', "info breakpoints", "present", "delete", "continue"])
    out = r.stdout
    # (a step ends inside opt.step(): 'it' there is the step's number)
    assert out.count("('AT', ") == 2 and "('AT', 6)" in out and "('AT', 4)" in out, out
    tables = out.split("Num    Type")[1:]
    assert len(tables) == 4, out
    for t in tables:
        assert "will ignore" not in t, t
    for t in tables[:2]:                          # crossed at 10 (ignored), stopped at 6: two hits
        assert re.search(r"if it % 4 == 2\s+2\s+breakpoint already hit 2 times", t), t
    # the first rc crossed step 4 (ignored: one hit), found nothing before it, and stayed;
    # the second stopped there (two)
    assert "No earlier step where a breakpoint or watchpoint held" in out, out
    assert re.search(r"step 4\s+1\s+breakpoint already hit 1 time", tables[2]), tables[2]
    assert re.search(r"step 4\s+2\s+breakpoint already hit 2 times", tables[3]), tables[3]


def test_reverse_continue_stops_at_a_module_breakpoint_in_the_past(tmp_path, script):
    """gdb's reverse-continue stops at the last place a breakpoint held, inside a step too.
    A module breakpoint never held in the scan (its replica installed no module hooks):
    `break module 0` at the end of step 6, `rc` said "No earlier step where a breakpoint or
    watchpoint held"; and the forward pass of the step where the search started (a checkpoint
    at its end) was scanned by no segment."""
    r = run(tmp_path, script, ["until 6", "break module 0", "rc", "p ('AT', $step)", "rc", "p ('AT', $step)",
                               "info breakpoints", "present", "delete", "continue"])
    out = r.stdout
    assert re.findall(r"^Breakpoint 1, module 0 forward \(step (\d+)\)$", out, re.M) == ["6", "5"], out
    assert re.findall(r"\('AT', (\d+)\)", out) == ["6", "5"], out
    assert re.search(r"module 0 forward\s+2\s+breakpoint already hit 2 times", out), out


LEVELS = textwrap.dedent('''
    import torch
    w = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([w], lr=0.0)
    for it, level in enumerate([1, 5, 5, 5, 1, 1, 5, 5, 5, 5, 1, 1]):
        opt.zero_grad()
        loss = (w * level).sum()
        loss.backward()
        opt.step()
''')


@pytest.mark.parametrize("extra", [(), ("--total-steps", "12")])
def test_reverse_continue_stops_where_a_watch_set_later_would_have_hit_wherever_the_checkpoints_are(
        tmp_path, extra):
    """A watch is edge-triggered: 'watch loss mean > 3' over losses 1 5 5 5 1 1 5 5 5 5 1 1 hits
    at steps 1 and 6.  Set at step 11, rc went to 6 then 1 with one checkpoint at step 0, but with
    one a step (--total-steps 12) to 9, 8, 7, 6, 3 ...: each scan's replica, forked before the
    watch was set, judged its segment with a watch that had seen no step before it."""
    script = tmp_path / "levels.py"
    script.write_text(LEVELS)
    r = run(tmp_path, str(script), ["until 11", "watch loss mean > 3", "rc", "rc", "rc", "info watchpoints",
                                    "present", "continue"], *extra)
    out = r.stdout
    assert re.findall(r"^In the past \(timeline 0\): step (\d+) finished", out, re.M) == ["6", "1", "1"], out
    assert "no earlier step where a breakpoint or watchpoint held; back where you were" in out, out
    assert re.search(r"loss \* mean > 3\s+2\s+breakpoint already hit 2 times", out), out


TWICE = textwrap.dedent('''
    import torch, torch.nn as nn
    torch.manual_seed(0)
    enc = nn.Linear(4, 4)
    opt = torch.optim.SGD(enc.parameters(), lr=0.1)
    for it in range(8):
        a, b = torch.randn(8, 4), torch.randn(8, 4)
        opt.zero_grad()
        za = enc(a)
        zb = enc(b)
        loss = (za - zb).pow(2).mean()
        loss.backward()
        opt.step()
''')


def test_reverse_continue_visits_each_call_of_a_module_called_twice_a_step_newest_first(tmp_path):
    """gdb's reverse-continue stops at every place a breakpoint held, newest first.  An encoder
    called on a and on b in each step: rc from the end of step 5 stopped at enc(a) of step 5
    (the first call, not the newest), and the next rc at enc(a) of step 4, never at enc(b)."""
    script = tmp_path / "twice.py"
    script.write_text(TWICE)
    said = 'p ("AT", $step, "b" if $inputs[0].sum().item() == b.sum().item() else "a")'
    r = run(tmp_path, str(script), ["until 5", "break module enc", "rc", said, "rc", said, "rc", said, "rc", said,
                                    "info breakpoints", "present", "delete", "continue"])
    out = r.stdout
    assert re.findall(r"\('AT', (\d+), '(\w)'\)", out) == [("5", "b"), ("5", "a"), ("4", "b"), ("4", "a")], out
    assert re.search(r"module enc forward\s+4\s+breakpoint already hit 4 times", out), out


def test_reverse_continue_from_a_stop_after_an_ignored_hit_in_its_step_stops_at_that_hit(tmp_path):
    """'ignore 1 1' then 'continue': the ignore count swallowed enc(a) of step 6 and the run stopped
    at enc(b).  gdb's reverse-continue stops at enc(a), a crossing in reverse; rc went to enc(b) of
    step 5: the live run numbered its stop at enc(b) 0th in the step (the stops alone), where the
    scan numbers every place the breakpoint held (enc(a) 0th, enc(b) 1st)."""
    script = tmp_path / "twice.py"
    script.write_text(TWICE)
    said = 'p ("AT", $step, "b" if $inputs[0].sum().item() == b.sum().item() else "a")'
    r = run(tmp_path, str(script), ["until 5", "break module enc", "ignore 1 1", "continue", said, "rc", said,
                                    "rc", said, "present", "delete", "continue"])
    assert re.findall(r"\('AT', (\d+), '(\w)'\)", r.stdout) == [("6", "b"), ("6", "a"), ("5", "b")], r.stdout


MODULE0 = textwrap.dedent('''
    import torch, torch.nn as nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for it in range(4):
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        opt.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        opt.step()
''')


def test_reverse_continue_finds_a_module_hit_in_step_0_before_the_only_checkpoint(tmp_path):
    """The only checkpoint is at step 0's end.  rc from module 0's hit in step 1 said 'No earlier
    step where a breakpoint or watchpoint held' where it held in step 0's forward pass: the search
    never replayed step 0 (e5795af).  It does, from the start (respawn), and shows that hit at step
    0's end; rc there finds nothing earlier without a replay.  With --replica fork, which cannot
    replay step 0, the answer says what it did not search."""
    script = tmp_path / "module0.py"
    script.write_text(MODULE0)
    cmds = ["until 2", "break module 0", "rc", "rc", "p ('AT', $step)", "rc", "rc", "p ('AT', $step)",
            "info breakpoints", "present", "delete", "continue"]
    out = run(tmp_path, str(script), cmds).stdout
    assert re.findall(r"^Breakpoint 1, module 0 forward \(step (\d+)\)$", out, re.M) == ["2", "1"], out
    assert "(reverse-continue: 1 held in step 0 (shown at its end); " in out, out
    assert re.findall(r"\('AT', (\d+)\)", out) == ["1", "0"], out
    assert "reverse-continue: no earlier step where a breakpoint or watchpoint held; back where you were" in out
    assert re.search(r"module 0 forward\s+3\s+breakpoint already hit 3 times", out), out
    r = run(tmp_path, str(script), cmds[:4] + ["rc", "p ('AT', $step)", "present", "delete", "continue"],
            "--replica", "fork")
    assert "No earlier step where a breakpoint or watchpoint held after the checkpoint at step 0 (what came " \
           "before it cannot be replayed with --replica fork); back where you were." in r.stdout, r.stdout
    assert "('AT', 1)" in r.stdout, r.stdout


SLOW_REPLAY = textwrap.dedent('''
    import os, subprocess, time, torch, torch.nn as nn
    torch.manual_seed(0)
    m = nn.Linear(4, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for step in range(6):
        opt.zero_grad()
        loss = m(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        if step == 1 and os.path.exists("slow"):    # (a replay of step 1, once the run made "slow")
            subprocess.run(["touch", "replaying"])  # (for real: a replica's own writes go to scratch copies)
            time.sleep(120)
        if step == 2:
            open("slow", "w").close()
        print("step", step, flush=True)
''')


def test_reverse_continue_to_a_module_hit_shows_nothing_the_replay_printed_on_the_way(tmp_path):
    """rc to module 0's hit in step 2 replays to the end of step 1, then runs on to the hit: the
    replica was heard from step 1's end on, and printed 'it 1' again (the end of the iteration,
    after opt.step()), which the live run had printed; the next rc printed 'it 0' again."""
    script = tmp_path / "module0.py"
    script.write_text(MODULE0 + "    print('it', it)\n")
    out = run(tmp_path, str(script), ["until 2", "break module 0", "rc", "rc", "present", "delete",
                                      "continue"]).stdout
    assert re.findall(r"^Breakpoint 1, module 0 forward \(step (\d+)\)$", out, re.M) == ["2", "1"], out
    assert re.findall(r"^it (\d+)$", out, re.M) == ["0", "1", "2", "3"], out


def test_sigterm_during_a_replay_ends_the_run_without_waiting_for_the_replica(tmp_path):
    """SIGTERM to nndb (``timeout``, a job scheduler) while 'goto 3' replayed from the checkpoint at
    step 0: the live run said 'terminated (SIGTERM); trace closed' and then waited for the replica,
    which replayed on (a 120 s step here), arrived in the past and ran the commands queued after the
    goto there ('ARRIVED', then 'continue'); the run ended only then.  The replica is ended now, as a
    prediction's is, and the run ends with 143."""
    import signal
    import subprocess
    import time
    from conftest import nndb_started
    script = tmp_path / "slow.py"
    script.write_text(SLOW_REPLAY)
    p = nndb_started("run", "--batch", "--nx", "--trace", str(tmp_path / "t.h5"), "-e", "until 4", "-e", "p 'GOING'",
                     "-e", "goto 3", "-e", "p 'ARRIVED'", "-e", "continue", str(script), cwd=str(tmp_path),
                     stderr=subprocess.PIPE, start_new_session=True)
    try:
        out = ""
        while "GOING" not in out:
            line = p.stdout.readline()
            assert line, out
            out += line
        for _ in range(600):
            if (tmp_path / "replaying").exists():
                break
            time.sleep(0.1)
        assert (tmp_path / "replaying").exists(), out
        os.kill(p.pid, signal.SIGTERM)
        p.wait(timeout=90)            # (the replica's step takes 120 s: waiting for it fails here)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    out += p.stdout.read()
    err = p.stderr.read()
    assert p.returncode == 143, out + err
    assert "nndb: terminated (SIGTERM); trace closed" in err, err
    assert "ARRIVED" not in out and "In the past" not in out, out


def test_present_from_a_stop_inside_a_step_names_that_step(tmp_path, script):
    # stopped in step 2's forward pass ($step 2), back from the past: the present is step 2, not 1
    r = run(tmp_path, script, ["break module 0", "continue", "continue", "continue", "p ('NOW', $step)",
                               "rs", "present", "p ('NOW', $step)", "delete", "continue"])
    assert r.stdout.count("('NOW', 2)") == 2, r.stdout
    assert "Back in the present (timeline 0): step 2." in r.stdout, r.stdout


def test_displays_show_again_back_in_the_present(tmp_path, script):
    """``display`` shows at every stop: the past's stop showed them, the present's did not
    once the replica handed back ('Back in the present ... step 6.' and then the prompt)."""
    r = run(tmp_path, script, ["break step 6", "continue", "display ('D', $step)", "goto 3", "present",
                               "delete", "continue"])
    out = r.stdout
    assert re.findall(r"^1: \('D', \$step\) = \('D', (\d+)\)$", out, re.M) == ["6", "3", "6"], out
    back = out[out.index("Back in the present (timeline 0): step 6."):].splitlines()
    assert back[1] == "1: ('D', $step) = ('D', 6)", out


def test_reverse_continue_in_the_past_with_no_earlier_hit_stays_in_the_past(tmp_path, script):
    # it handed back to the live run, found nothing, and left the user in the present
    r = run(tmp_path, script, ["until 12", "rs 4", "break step 100", "rc", "p ('AT', $step)", "present", "continue"])
    out = r.stdout
    assert "(reverse-continue: no earlier step where a breakpoint or watchpoint held; back where you were" in out
    assert "('AT', 8)" in out and out.count("Back in the present") == 1, out
    # with no point at all: refused where it is (a failed batch line ends the batch: exit 2)
    r = run(tmp_path, script, ["until 12", "rs 4", "rc"])
    assert "no breakpoints or watchpoints: nothing to go back to" in r.stderr and "Back in the present" not in r.stdout


def test_reverse_continue_from_a_module_stop_in_the_past_with_no_earlier_hit_stays_there(tmp_path, script):
    # from a stop inside step 3 in the past, rc found nothing earlier and sent the user to the present
    r = run(tmp_path, script, ["until 6", "break module 0 if $step == 3", "rc", "rc", "p ('AT', $step)",
                               "info breakpoints", "present", "delete", "continue"])
    out = r.stdout
    assert "No earlier step where a breakpoint or watchpoint held; back where you were." in out, out
    assert out.count("Breakpoint 1, module 0 forward (step 3)") == 2 and "('AT', 3)" in out, out
    assert out.count("Back in the present") == 1 and out.index("('AT', 3)") < out.index("Back in the present"), out
    assert re.search(r"module 0 forward\s+1\s+stop only if \$step == 3", out), out     # (one crossing, not two)


def test_reverse_step_stops_at_a_breakpoint_on_the_way_as_gdb_does(tmp_path, script):
    """gdb's reverse-step N (as next N forward) stops at a breakpoint it crosses: 'rs 6' from
    step 8 with 'break step 3' went straight to step 2; a module breakpoint inside step 7
    stops 'rs 3' from step 8 there; 'rs' again goes on."""
    r = run(tmp_path, script, ["until 8", "break step 3", "rs 6", "p ('AT', $step)", "rs 2", "p ('AT', $step)",
                               "present", "delete", "break module 0 if $step == 7", "rs 3", "p ('AT', $step)",
                               "info breakpoints", "present", "delete", "continue"])
    out = r.stdout
    assert re.findall(r"\('AT', (\d+)\)", out) == ["3", "1", "7"], out
    assert "(reverse-step 6: 1 held on the way, short of step 2; 3 step(s) replayed" in out, out
    assert "Breakpoint 2, module 0 forward (step 7)" in out, out
    assert re.search(r"module 0 forward\s+1\s+stop only if", out), out


def test_checkpoint_commands_and_memory(tmp_path, script):
    r = run(tmp_path, script, ["break step 5", "continue", "checkpoint", "info checkpoints",
                               "delete checkpoint 1", "info checkpoints", "continue"])
    out = r.stdout
    assert re.search(r"Checkpoint \d+ at the end of step 5", out) or "Kind" in out
    assert re.search(r"^\d+\s+5\s+stop\s+\d+\s+[\d.]+ ms\s+[\d.]+ MiB\s+[\d.]+ MiB", out, re.M), out
    assert "Memory of the checkpoints:" in out and "Replays: exact" in out
    assert "Deleted checkpoint 1 (step 0)." in out


def test_disk_checkpoints_load_with_weights_only(tmp_path, script):
    from nndb.timetravel import disk
    run(tmp_path, script, ["continue"], "--total-steps", "24")
    files = disk.list_checkpoints(str(tmp_path / "t.ckpt"))
    steps = [s for s, _ in files]
    # every 10% of the 24 steps, from 10% on (as the in-memory schedule allows)
    assert 8 <= len(steps) <= 12 and steps[0] >= 2, steps
    assert all(1 <= b - a <= 3 for a, b in zip(steps, steps[1:])), str(steps)
    ck = disk.load(files[0][1])
    assert ck["step"] == 2 and set(ck["modules"]) == {"model"} and ck["optimizers"]
    assert set(ck["modules"]["model"]) == {"0.weight", "0.bias", "3.weight", "3.bias"}


def test_reverse_step_with_dataloader_workers_alive_says_why_it_cannot_fork(tmp_path, script):
    w = run(tmp_path, script, ["break step 6", "continue", "reverse-step 2", "continue"], "--replica", "fork",
            args=("2",))
    assert "no checkpoint at or before step 4 (no fork checkpoints from step 0 on: " in w.stderr
    assert "worker process(es) are alive" in w.stderr


def test_reverse_step_with_threads_says_why_and_replays_in_a_new_process(tmp_path, script):
    t = run(tmp_path, script, ["break step 6", "continue", "reverse-step 2", STATE, "present", "reverse-step 1",
                               "present", "info checkpoints", "continue"], args=("0", "--thread"))
    # (why, at the first travel; the later ones say it is so again, not the whole reason)
    assert t.stderr.count("the script started threads (prefetcher) that do not survive fork()") == 1, t.stderr
    assert t.stderr.count("replaying from the start in a new process (respawn)") == 2, t.stderr
    assert "nndb: no fork checkpoints in this run ('info checkpoints' says why): replaying" in t.stderr
    assert "Fork checkpoints are off: no fork checkpoints from step 0 on: the script started threads (prefetcher)" \
        in t.stdout, t.stdout
    assert len(states(t.stdout)) == 1
    assert final(t.stdout) == final(python(script, "0", "--thread", cwd=str(tmp_path), forked=True).stdout)


def test_a_process_group_of_the_scripts_own_turns_fork_checkpoints_off(tmp_path):
    """A script that starts a gloo group of one itself (DINO's init_distributed_mode under plain
    ``nndb run``) and all-reduces in each step: a forked replica hung in its first collective
    (goto 3 never came back, nor did the run on SIGTERM).  The group is a fork blocker now: the
    replay runs in a new process, which makes a group of its own."""
    script = os.path.join(ROOT, "tests", "scripts", "self_distillation.py")
    t = run(tmp_path, script, ["break step 6", "continue", "goto 3", 'p ("STATE", it, loss.item())', "present",
                               "continue"], args=("--dist",))
    plain = python(script, "--dist", cwd=str(tmp_path)).stdout
    assert "a torch.distributed process group (gloo) is initialised in this process" in t.stderr, t.stderr
    assert "replaying from the start in a new process (respawn)" in t.stderr
    loss3 = re.search(r"^epoch 0 it 3 loss (\S+)", plain, re.M).group(1)
    assert states(t.stdout) == [f"('STATE', 3, {loss3})"], t.stdout
    assert final(t.stdout) == final(plain)


# A stand-in for tqdm (not installed here) with the two things nndb relies on: a monitor
# thread of class tqdm._monitor.TMonitor, and its work done under the class lock
# TqdmDefaultWriteLock.th_lock, which the bars take to print.  This monitor holds the lock
# most of the time: a fork that did not take it first would copy it held, and the replica's
# first bar update would wait for it for good.
FAKE_TQDM = {
    "__init__.py": "from .std import tqdm, TqdmDefaultWriteLock\n",
    "_monitor.py": """
import threading, time
class TMonitor(threading.Thread):
    def __init__(self, tqdm_cls, sleep_interval):
        threading.Thread.__init__(self, name="tqdm_monitor", daemon=True)
        self.tqdm_cls, self.sleep_interval = tqdm_cls, sleep_interval
        self.start()
    def run(self):
        while True:
            with self.tqdm_cls.get_lock():
                time.sleep(self.sleep_interval)
            time.sleep(0.0005)
""",
    "std.py": """
import sys, threading
from ._monitor import TMonitor
class TqdmDefaultWriteLock:
    th_lock = threading.RLock()
    def __enter__(self):
        self.th_lock.acquire()
    def __exit__(self, *exc):
        self.th_lock.release()
class tqdm:
    monitor = None
    @classmethod
    def get_lock(cls):
        if not hasattr(cls, "_lock"):
            cls._lock = TqdmDefaultWriteLock()
        return cls._lock
    def __init__(self, iterable):
        self.iterable = iterable
        if tqdm.monitor is None:
            tqdm.monitor = TMonitor(tqdm, 0.01)
    def __iter__(self):
        for i, x in enumerate(self.iterable):
            yield x
            with self.get_lock():
                sys.stderr.write(f"\\r{i + 1}/{len(self.iterable)}")
""",
}


def test_tqdms_monitor_thread_leaves_fork_checkpoints_on(tmp_path):
    # Until 2026-12 any thread turned fork checkpoints off, tqdm's monitor too (started by
    # the first progress bar: most training scripts): every travel replayed from the start in
    # a new process (on a 224-step tqdm loop, 50.4 s for rs, 2 goto, predict, replay --verify
    # against 12.8 s).  nndb takes tqdm's lock around the fork instead.
    pkg = tmp_path / "tqdm"
    pkg.mkdir()
    for name, text in FAKE_TQDM.items():
        (pkg / name).write_text(textwrap.dedent(text))
    script = tmp_path / "bar.py"
    script.write_text(SCRIPT.replace("import torch, torch.nn as nn", "import torch, torch.nn as nn\nfrom tqdm import tqdm")
                      .replace("for x, y in loader:", "for x, y in tqdm(loader):"))
    cmds = ["break step 12", "continue", "reverse-step 5", STATE, "present", STATE, "continue"]
    t = run(tmp_path, str(script), cmds, "--checkpoint-every", "4")
    p = run(tmp_path, str(script), ["break step 7", "continue", STATE, "continue"])
    assert "tqdm_monitor" not in t.stderr and "respawn" not in t.stderr
    assert "3 step(s) replayed from the checkpoint at step 4" in t.stdout, t.stdout
    assert states(t.stdout)[0] == states(p.stdout)[0]                 # step 7 as it was
    assert final(t.stdout) == final(python(str(script), cwd=str(tmp_path)).stdout)


def test_bad_time_travel_commands_get_one_line(tmp_path, script):
    # each from a breakpoint's commands of its own: an error there ends that list (gdb), not
    # the run (an error in a -e line itself ends a batch run with exit 2)
    bad = ["goto 9", "present", "predict 0", "replay", "replay --verify 5:3", "bisect", "reverse-step 5",
           "delete checkpoint 99"]
    cmds = [c for b in bad for c in ("break step 2", "commands", b, "end")] + ["continue"]
    args = [a for c in cmds for a in ("-e", c)]
    r = nndb("run", "--batch", "--nx", "--trace", str(tmp_path / "t.h5"), *args, script, cwd=str(tmp_path))
    assert "Traceback" not in r.stderr, r.stderr
    err = r.stderr
    assert "step 9 has not run yet (the present is step 2): use 'until 9'" in err
    assert "already in the present (the live run)" in err
    assert "the number of steps must be at least 1, not 0" in err
    assert "replay needs --verify" in err
    assert "the range 5:3 is empty" in err
    assert "bisect needs an expression" in err
    assert "cannot go back before the end of step 0" in err
    assert "no checkpoint number 99" in err
    assert r.returncode == 0


def test_goto_before_any_step_has_finished_is_one_line_and_exit_2(tmp_path, script):
    # at the start stop no step has ended: goto had compared the target with
    # None ("internal error ... TypeError") and the batch run exited 0
    r = nndb("run", "--batch", "--nx", "--trace", str(tmp_path / "t.h5"), "-e", "goto 3", "-e", "kill",
             script, cwd=str(tmp_path))
    assert "internal error" not in r.stderr, r.stderr
    assert "step 3 has not run yet (no step has finished): use 'until 3'" in r.stderr
    assert r.returncode == 2


def test_quit_in_the_past_ends_the_live_run_too(tmp_path, script):
    q = run(tmp_path, script, ["break step 6", "continue", "rs 2", "quit"])
    assert "In the past (timeline 0): step 4 finished" in q.stdout
    assert "final" not in q.stdout and "Back in the present" not in q.stdout


def test_kill_in_the_past_kills_the_replica_and_the_live_run_goes_on(tmp_path, script):
    k = run(tmp_path, script, ["break step 6", "continue", "rs 2", "kill", STATE, "continue"])
    assert "the replica is killed; back to the present." in k.stdout
    assert re.search(r"\('STATE', 6, ", k.stdout) and "final" in k.stdout, k.stdout


def test_run_in_the_past_restarts_the_live_run(tmp_path, script):
    r = run(tmp_path, script, ["break step 6", "continue", "rs 2", "run", "delete", "continue"])
    assert r.stdout.count("Breakpoint 1, step 6 finished") == 1 and "final" in r.stdout, r.stdout
    assert (tmp_path / "t-run2.h5").exists()


PATTERN = textwrap.dedent('''
    import torch, torch.nn as nn
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    extra = [5, 5, 5, 1, 5, 5, 1, 1, 5, 1, 5, 5]      # the loss is below 2 at steps 3, 6, 7, 9
    for step in range(12):
        opt.zero_grad()
        loss = ((p - 1) ** 2).sum() * 0.01 + extra[step]
        loss.backward()
        opt.step()
''')


def test_reverse_continue_finds_a_watchpoints_earlier_hit(tmp_path):
    """A watchpoint's hits at steps 3 and 6 (edge-triggered: 7 is the same stretch): rc from
    the second found no first ('No earlier step where a breakpoint or watchpoint held'): the
    checkpoint taken at the first hit's stop held the watch's streak after that step, and
    checking that step end again counted it twice.  A step judged again gives its answer."""
    (tmp_path / "pattern.py").write_text(PATTERN)
    r = run(tmp_path, str(tmp_path / "pattern.py"),
            ["watch loss mean < 2", "continue", "continue", "p ('HIT', $step)", "rc", "p ('AT', $step)",
             "rc", "p ('AT', $step)", "present", "continue"])
    out = r.stdout
    assert "('HIT', 6)" in out and out.count("('AT', 3)") == 2, out
    assert "reverse-continue: 1 held" in out and "reverse-continue: no earlier step" in out, out
    # two steps in a row below 2: 6 and 7 -> the hit at 7 (3 and 9 alone); rc from step 10 finds it
    r = run(tmp_path, str(tmp_path / "pattern.py"),
            ["watch loss mean < 2 consecutive 2", "continue", "p ('HIT2', $step)", "until 10", "rc",
             "p ('AT2', $step)", "present", "continue"])
    assert "('HIT2', 7)" in r.stdout and "('AT2', 7)" in r.stdout, r.stdout
