"""Mixed precision as training scripts do it (nanoGPT's train.py): float16 autocast
with a ``torch.amp.GradScaler`` whose first loss scale overflows, so that it skips
the optimizer's first steps and halves the scale (every float16 run starts so).
What nndb shows is the script's own numbers: the loss it computes (not the loss
times the scale), the gradients' norm of the steps the optimizer took, and no
NaN finding for the skips; a NaN the scaler cannot mend is still caught."""
import re
import textwrap

import numpy as np

from conftest import Ran, nndb, plain_and_recorded
from nndb.text import fmt

# One step a line: "it N skip|step LOSS CLIP ACT" (repr of the script's floats).
SCALER = textwrap.dedent('''
    import sys
    import torch, torch.nn as nn, torch.nn.functional as F
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=sys.argv[3] == "fused")
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 22, growth_interval=3)
    data, labels = torch.randn(256, 16), torch.randint(0, 4, (256,))
    accum = int(sys.argv[1])
    k = 0
    for it in range(10):
        total, hsq = torch.zeros(()), 0.0
        for micro in range(accum):
            x, y = data[k:k + 16], labels[k:k + 16]
            k = (k + 16) % 240
            with torch.autocast("cpu", dtype=torch.float16):
                h = model[0](x)
                loss = F.cross_entropy(model[2](model[1](h)), y) / accum
            total += loss.detach()
            hsq += h.detach().double().norm().item() ** 2      # (the step's activations: every micro-batch's)
            scaler.scale(loss).backward()
        scaler.unscale_(opt)
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scale = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        skipped = scaler.get_scale() < scale
        opt.zero_grad(set_to_none=sys.argv[2] == "none")
        print("it", it, "skip" if skipped else "step", repr(total.item()), repr(gn.item()),
              repr(hsq ** 0.5))
''')


def _steps(out: str) -> list:
    return [m.groups() for m in re.finditer(r"^it \d+ (skip|step) (\S+) (\S+) (\S+)$", out, re.M)]


def test_a_grad_scalers_skipped_steps_and_scaled_loss_are_not_the_steps(tmp_path):
    """The trace's loss was the scaled loss (2.5e6 for 1.39 at a scale of 2**21), the
    first step's clip_grad_norm_ was the first skipped iteration's NaN and each skip's Inf
    came as clip_grad_norm_#2.. of the next step (nonfinite: 'error' at steps 0 and 3 of
    a healthy run), and the first step's activation norm was the merged rows of the
    skipped iterations' forwards (1.7x the step's).  With ``zero_grad(set_to_none=False)``
    a skipped iteration's scaled loss was also added to the next step's (11062649 for
    1.374955).  A fused optimizer (which the scaler steps with its found_inf, to skip the
    update itself) made every skipped iteration a step: NaN gradients, 'nonfinite' errors
    and an exploding_gradient warning."""
    from nndb.store.reader import TraceReader
    for zero, fused in (("none", "foreach"), ("zeros", "foreach"), ("none", "fused")):
        plain, trace = plain_and_recorded(tmp_path, SCALER, "2", zero, fused)
        rows = _steps(plain.stdout)
        assert [r[0] for r in rows].count("skip") >= 3 and rows[0][0] == "skip", plain.stdout
        taken = [r[1:] for r in rows if r[0] == "step"]
        with TraceReader(trace) as t:
            _, losses = t.history(t.find("loss", "loss")[0], "mean")
            _, clips = t.history(t.find("clip_grad_norm_", "grad")[0], "mean")
            _, acts = t.history(t.find("0", "act")[0], "norm")
            names = {s.name for s in t.series()}
            findings = t.records("finding")
        assert [repr(float(v)) for v in clips] == [c for _, c, _ in taken]
        # (the micro-batches' float32 losses, summed in float32 as the script sums them)
        assert [repr(float(v)) for v in losses] == [lo for lo, _, _ in taken]
        np.testing.assert_allclose(acts, [float(a) for _, _, a in taken], rtol=1e-6)
        assert "clip_grad_norm_#2" not in names
        assert not findings, findings


REAL_NAN = textwrap.dedent('''
    import torch, torch.nn as nn, torch.nn.functional as F
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 22)
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
    for it in range(8):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        if it == 5:
            loss = loss + torch.log(loss - 100.0)     # NaN: no loss scale mends it
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        scale = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        print("it", it, "skip" if scaler.get_scale() < scale else "step", repr(loss.item()))
''')


def test_catch_nan_passes_the_scalers_overflow_and_stops_at_a_real_nan(tmp_path):
    """catch nan stopped at the first step of every float16 run (the scaler's Inf
    gradients, which it skips); a NaN loss is still caught, at its step."""
    script = tmp_path / "nan.py"
    script.write_text(REAL_NAN)
    argv = ["run", "--batch", "-q", "--trace", str(tmp_path / "n.h5"), "-e", "catch nan",
            "-e", "commands 1", "-e", 'p ("AT", $step, repr($loss))', "-e", "end", "-e", "continue", str(script)]
    r = Ran(nndb(*argv, cwd=str(tmp_path)), argv)
    assert r.returncode == 0, r.stderr
    # (the iterations the scaler skipped made no step: iteration 5 is step 5 - skips)
    skips = len(re.findall(r"^it [0-4] skip ", r.stdout, re.M))
    assert skips >= 2, r.stdout
    assert re.findall(r"\('AT', (\d+), '([^']+)'\)", r.stdout) == [(str(5 - skips), "nan")], r.stdout
    assert "made Inf" not in r.stdout + r.stderr and "Inf first" not in r.stderr, r.stdout
    assert re.findall(r"nonfinite at step (\d+): NaN first appeared in loss", r.stderr) == [str(5 - skips)], r.stderr


def test_nndb_check_reads_the_loss_the_scaler_scaled(tmp_path):
    """finite-loss said 'first 5.844e+06' of a loss of 1.393 (the loss times 2**22)."""
    script = tmp_path / "scaled.py"
    script.write_text(SCALER)
    r = Ran(nndb("check", str(script), "1", "none", "foreach", cwd=str(tmp_path)), ["check"])
    line = next(l for l in r.stdout.splitlines() if "finite-loss" in l)
    first = float(re.search(r"first (\S+),", line).group(1))
    assert 1.0 < first < 2.0, line


FOREVER = textwrap.dedent('''
    import torch, torch.nn as nn, torch.nn.functional as F
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 4)
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
    for it in range(9):
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(x)
            # finite, but its gradient is NaN at any scale (sqrt's at 0 times 0)
            loss = F.cross_entropy(out, y) + (out.float() * 0).pow(2).sum().sqrt()
        scale = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        print("it", it, scale, repr(loss.item()))
''')


def test_gradients_no_loss_scale_mends_make_steps_that_catch_nan_stops_at(tmp_path):
    """The scaler skips every step (it halves its scale for ever): nndb recorded no step,
    said nothing, and catch nan never stopped (before the skips were dropped, the trace's
    one partial step held clip_grad_norm_ .. #9, NaN, and no finding either).  Once the
    scale an iteration ran at is below 1, the iteration is a step: iterations 0-4 ran at
    16..1 and are skips, iteration 5 (scale 0.5) is step 0."""
    script = tmp_path / "forever.py"
    script.write_text(FOREVER)
    argv = ["run", "--batch", "-q", "--trace", str(tmp_path / "f.h5"), "-e", "catch nan",
            "-e", "commands 1", "-e", 'p ("AT", $step, repr($loss), it)', "-e", "end", "-e", "continue", str(script)]
    r = Ran(nndb(*argv, cwd=str(tmp_path)), argv)
    assert r.returncode == 0, r.stderr
    printed = dict(re.findall(r"^it (\d+) \S+ (\S+)$", r.stdout, re.M))
    assert re.findall(r"\('AT', (\d+), '([^']+)', (\d+)\)", r.stdout)[0] == ("0", printed["5"], "5"), r.stdout
    assert "SqrtBackward0" in r.stdout, r.stdout
    assert re.search(r"nonfinite at step 0: NaN first appeared in grad", r.stderr), r.stderr
    # each such step has the parameters and their (NaN) gradients, and replays bit for bit (step 0
    # had none: the skips before it had counted them as a skipped optimizer's; the steps after it
    # lost a gradient whose new .grad took its predecessor's id, and replay --verify diverged)
    argv = ["run", "--batch", "-q", "--trace", str(tmp_path / "g.h5"), "-e", "break step 3", "-e", "commands 1",
            "-e", "replay --verify", "-e", "end", "-e", "continue", str(script)]
    r = Ran(nndb(*argv, cwd=str(tmp_path)), argv)
    assert re.search(r"replay --verify 0:4: 4 step\(s\) replayed .*identical to the trace", r.stdout), r.stdout
    from nndb.store.reader import TraceReader
    with TraceReader(str(tmp_path / "g.h5")) as t:
        for name in ("0.weight", "0.bias", "2.weight", "2.bias"):
            steps, nans = t.history(t.find(name, "grad")[0], "nan_count")
            assert list(steps) == [0, 1, 2, 3] and all(nans > 0), (name, steps, nans)


GAN = textwrap.dedent('''
    import torch, torch.nn as nn, torch.nn.functional as F
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16))
    D = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    optD = torch.optim.Adam(D.parameters(), lr=2e-4)
    optG = torch.optim.Adam(G.parameters(), lr=2e-4)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 20, growth_interval=4)
    real = torch.randn(64, 16) + 1
    for it in range(12):
        z = torch.randn(64, 8)
        optD.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            fake = G(z)
            errD = F.binary_cross_entropy_with_logits(D(real), torch.ones(64, 1)) + \\
                F.binary_cross_entropy_with_logits(D(fake.detach()), torch.zeros(64, 1))
        scaler.scale(errD).backward()
        before = D[0].weight.detach().clone()
        scaler.step(optD)
        stepped = not torch.equal(before, D[0].weight)
        optG.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            errG = F.binary_cross_entropy_with_logits(D(fake), torch.ones(64, 1))
        scaler.scale(errG).backward()
        scaler.step(optG)
        scaler.update()
        print("it", it, "D" if stepped else "-", repr(errD.item()), repr(errG.item()))
''')


def test_a_gan_under_one_scaler_has_no_finding_for_the_discriminators_skipped_steps(tmp_path):
    """The discriminator's first 4 steps skipped (its gradients overflowed): its .grad,
    Inf, then NaN once the generator's backward added to it, and scaled by 2**20, was
    recorded as the step's gradient of a parameter no optimizer stepped: 'nonfinite at
    step 0: NaN first appeared in grad D.2.bias', exploding_gradient (1.62e4) and
    vanishing_gradient (0.62, its true norm, '3.84e-05x its early median') on a healthy
    run; loss/optD was 91459.875 for 1.3955669."""
    from nndb.store.reader import TraceReader
    plain, trace = plain_and_recorded(tmp_path, GAN)
    rows = re.findall(r"^it \d+ (\S) (\S+) (\S+)$", plain.stdout, re.M)
    assert rows[0][0] == "-" and rows[-1][0] == "D", plain.stdout
    with TraceReader(trace) as t:
        _, d_losses = t.history(t.find("loss/optD", "loss")[0], "mean")
        _, d_grads = t.history(t.find("D.0.weight", "grad")[0], "norm")
        findings = t.records("finding")
    assert [repr(float(v)) for v in d_losses] == [d for stepped, d, _ in rows if stepped == "D"]
    assert len(d_grads) == sum(1 for r in rows if r[0] == "D") and np.all(d_grads < 10), d_grads
    assert not findings, findings


def test_nndb_check_fails_gradients_when_the_scaler_skips_every_step(tmp_path):
    """gradients, zero-grad and updates said SKIP 'no torch.optim optimizer stepped
    (hand-written updates?)' of a script whose scaler skipped all 19 of its steps."""
    script = tmp_path / "forever.py"
    script.write_text(FOREVER.replace("2.0 ** 4", "2.0 ** 2"))
    r = Ran(nndb("check", str(script), cwd=str(tmp_path)), ["check"])
    line = next(l for l in r.stdout.splitlines() if l.split()[1:2] == ["gradients"])
    assert line.startswith("FAIL") and "GradScaler skipped every optimizer step" in line, r.stdout
    assert "hand-written" not in r.stdout, r.stdout


# FSDP2 with FSDP's ShardedGradScaler (CPU, gloo, a process group of one: the shape of
# a sharded job's rank), and a scaler class of the script's own with a scale() of its own.
SHARDED = textwrap.dedent('''
    import sys
    import torch, torch.nn as nn, torch.nn.functional as F
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 2))
    if sys.argv[1] == "sharded":
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        scaler = ShardedGradScaler(device="cpu", init_scale=1024.0)
    else:
        class Scaler(torch.amp.GradScaler):
            def scale(self, outputs):
                if self._scale is None:
                    self._lazy_init_scale_growth_tracker(outputs.device)
                return outputs * self._scale
        scaler = Scaler("cpu", init_scale=1024.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 6), torch.randint(0, 2, (32,))
    for it in range(4):
        loss = F.cross_entropy(model(x[8 * it:8 * it + 8]), y[8 * it:8 * it + 8])
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        print("it", it, repr(loss.item()), scaler.get_scale())
''')


def test_a_grad_scaler_subclass_with_its_own_scale_records_the_scripts_loss(tmp_path):
    """FSDP's ShardedGradScaler has a scale() of its own, which never calls
    GradScaler's (nndb's wrapper): the trace's loss was the loss times the scale
    (743.85 for 0.7264 at 1024, on rank 0 of a 2-rank FSDP2 job); so for a script's
    own subclass."""
    from nndb.store.reader import TraceReader
    for kind in ("sharded", "own"):
        plain, trace = plain_and_recorded(tmp_path, SHARDED, kind)
        printed = re.findall(r"^it \d+ (\S+) 1024\.0$", plain.stdout, re.M)
        assert len(printed) == 4, plain.stdout
        with TraceReader(trace) as t:
            _, losses = t.history(t.find("loss", "loss")[0], "mean")
        assert [repr(float(v)) for v in losses] == printed


LOSSES = textwrap.dedent('''
    import sys
    import torch, torch.nn as nn, torch.nn.functional as F
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    head = nn.Linear(32, 1)
    opt = torch.optim.SGD(list(model.parameters()) + list(head.parameters()), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    data, labels = torch.randn(96, 16), torch.randint(0, 4, (96,))
    for it in range(6):
        x, y = data[it * 16:it * 16 + 16], labels[it * 16:it * 16 + 16]
        with torch.autocast("cpu", dtype=torch.float16):
            h = model[1](model[0](x))
            l1 = F.cross_entropy(model[2](h), y)
            l2 = head(h).float().pow(2).mean()
        if sys.argv[1] == "each":
            (scaler.scale(l1) + scaler.scale(l2)).backward()
        else:
            scaled = scaler.scale([l1, l2] if sys.argv[1] in ("list", "sum") else (l1, l2))
            if sys.argv[1] == "sum":
                sum(scaled).backward()
            else:
                torch.autograd.backward(scaled)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        print("it", it, repr((l1 + l2).item()))
''')


def test_the_loss_of_losses_a_scaler_scaled_together_is_their_sum(tmp_path):
    """``torch.autograd.backward(scaler.scale([l1, l2]))`` (scale() takes a list or tuple
    of losses): the trace's loss was the scaled sum, 1444.7 for the script's 1.4109 at a
    scale of 2**10, where ``scaler.scale(l1 + l2).backward()`` recorded 1.4109; so did
    ``sum(scaler.scale([l1, l2])).backward()`` and ``(scaler.scale(l1) +
    scaler.scale(l2)).backward()``, whose loss is no output of scale() itself."""
    from nndb.store.reader import TraceReader
    for kind in ("list", "tuple", "sum", "each"):
        plain, trace = plain_and_recorded(tmp_path, LOSSES, kind)
        truth = re.findall(r"^it \d+ (\S+)$", plain.stdout, re.M)
        with TraceReader(trace) as t:
            _, losses = t.history(t.find("loss", "loss")[0], "mean")
        assert [repr(float(v)) for v in losses] == truth


CLIP_ORDER = textwrap.dedent('''
    import sys
    import torch, torch.nn as nn, torch.nn.functional as F
    torch.manual_seed(0)
    order = sys.argv[1]      # clip-first | unscale-first | fp32 | disabled
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16, enabled=order.endswith("-first"))
    data, labels = torch.randn(96, 16), torch.randint(0, 4, (96,))
    for it in range(6):
        x, y = data[it * 16:it * 16 + 16], labels[it * 16:it * 16 + 16]
        with torch.autocast("cpu", dtype=torch.float16, enabled=order != "fp32"):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        if order != "clip-first":
            scaler.unscale_(opt)
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if order == "clip-first":
            scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        print("it", it, repr(loss.item()), repr(gn.item()))
''')


def test_clipping_before_the_scaler_unscales_is_an_error_and_the_right_order_is_not(tmp_path):
    """clip_grad_norm_ before ``scaler.unscale_(opt)`` clipped the gradients times 65536
    (it returned 7.28e4 for a true 1.11, clipping to 1.5e-5): no rule said so, and
    exploding_gradient called it 'exploding gradient before clipping'.  The right order,
    a float32 run and a disabled scaler stay silent."""
    from nndb.store.reader import TraceReader
    found, exploding = {}, {}
    for order in ("clip-first", "unscale-first", "fp32", "disabled"):
        plain, trace = plain_and_recorded(tmp_path, CLIP_ORDER, order)
        with TraceReader(trace) as t:
            found[order] = [f for f in t.records("finding") if f["rule"] == "clip_before_unscale"]
            exploding[order] = [f for f in t.records("finding") if f["rule"] == "exploding_gradient"]
        if order == "clip-first":
            scaled = float(re.search(r"^it 0 \S+ (\S+)$", plain.stdout, re.M).group(1))
        if order == "unscale-first":
            true = float(re.search(r"^it 0 \S+ (\S+)$", plain.stdout, re.M).group(1))
    assert not found["unscale-first"] and not found["fp32"] and not found["disabled"], found
    (f,) = found["clip-first"]
    assert f["step"] == 0 and f["severity"] == "error", f
    assert f["evidence"]["scale"] == 65536.0 and f["evidence"]["total_norm"] == scaled, f
    assert abs(scaled / 65536.0 - true) < 1e-3 * true, (scaled, true)
    assert f"the gradients' own: {fmt(true)}" in f["message"] and "scaler.unscale_(opt)" in f["message"], f
    # exploding_gradient judged the scaled totals (7.28e4, over its ceiling of 1e3, three steps
    # running) as gradients 'the optimizer applies clipped': they are the loss scale's
    assert not [f for f in exploding["clip-first"] if f["tensor"].startswith("clip_grad_norm_")], exploding
