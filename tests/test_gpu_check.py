"""scripts/gpu_check.py, the check a session with a GPU runs (`--device
cuda`), run here on the CPU with small step counts, so that only the device
is new when it runs there.  The ratios are reported, never asserted."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "gpu_check.py")


def _run(*args, timeout=300):
    env = dict(os.environ)
    env.pop("NNDB_DEBUG", None)
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL, cwd=ROOT)


def test_gpu_check_passes_on_the_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    p = _run("--device", "cpu", "--steps", "8", "--pairs", "1", "--record-steps", "25",
             "--overfit-iters", "20", "--jobs", "2", "--json", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    r = json.loads(out.read_text())
    assert r["gpu_check"] == 1 and r["device"] == "cpu" and r["ok"] is True
    assert r["timings_valid"] is False and r["jobs"] == 2
    checks = {c["name"]: c for c in r["checks"]}
    assert list(checks) == ["overhead:cnn", "overhead:transformer", "recording", "catch-nan", "nan-recorded",
                            "break-watch-replay", "disk-checkpoint", "check"]
    assert all(c["ok"] and c["reason"] == "" for c in checks.values())
    for name in ("overhead:cnn", "overhead:transformer"):
        o = checks[name]
        assert len(o["plain_s"]) == len(o["nndb_s"]) == 1 and o["ratio_median"] > 0
        assert o["same_numbers"] is True and o["same_numbers_judged"] is True   # nndb changes no number
        assert len(o["loop_step_s"]["plain"]) == len(o["loop_step_s"]["nndb"]) == 1 and o["loop_ratio_median"] > 0
        assert o["plain_openmp"] in ("libiomp5 preloaded, as nndb run does", "the default")
    assert checks["overhead:cnn"]["target"] == 1.05
    rec = checks["recording"]
    assert rec["compared_values"] >= 4 * 10 * 2     # norm, mean, min, max of 10 params and grads at step 0
    assert rec["worst_rel_error"] < 1e-5
    info = rec["memory"]["info_memory"]          # ('info memory' at the last step; no CUDA figures on the CPU)
    assert set(rec["memory"]) == {"info_memory"} and info["devices"] == [] and info["rss_bytes"] > 10 * 2**20
    s = rec["syncs"]
    assert s["stand_in"] is True and s["counted_on"] == "cpu" and s["total"] > 0
    assert s["per_step_after_20_median"] is not None and s["where"]
    assert all(w.startswith("nndb" + os.sep) for w in s["where"])
    assert checks["catch-nan"]["stop"]["op"] == "log" and checks["catch-nan"]["stop"]["step"] == 3
    assert checks["catch-nan"]["stop"]["module"] == "head"
    nan = checks["nan-recorded"]
    assert nan["nonfinite_first_step"] == 3 and nan["loss_step3"]["nan_count"] == 1
    dk = checks["disk-checkpoint"]
    assert dk["files"] == 9 and dk["resumed_steps_equal"] == 9 and dk["cuda_rng_states"] == 0
    bwr = checks["break-watch-replay"]
    assert bwr["stops"] == [["watchpoint", 0], ["breakpoint", 5]]
    assert bwr["replay"] == "bit-exact" and bwr["values_compared"] > 0
    assert checks["check"]["checks"]["overfit"] == "PASS"
    assert "n/a on cpu" in r["fork_refusal"]
    assert "recording" in p.stdout and "host reads from nndb" in p.stdout      # the table


def test_cuda_without_a_device_is_one_line(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    p = _run("--device", "cuda", "--json", str(tmp_path / "x.json"), timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "no CUDA device" in p.stderr
    assert not (tmp_path / "x.json").exists()


def test_sync_counter_counts_nndb_calls_only_and_puts_torch_back():
    import torch

    from nndb.tracer import stats
    gc = _gpu_check()
    before = {m: torch.Tensor.__dict__.get(m) for m in gc.SyncCounter.METHODS}
    t = torch.arange(3000, dtype=torch.float32)       # a small CPU tensor: read with .numpy()
    with gc.SyncCounter(torch, "cpu") as c:
        t.sum().item()                                # from this test: not counted
        float(t[0])
        stats.stats_of(t)                             # nndb's own reads
        assert gc._to_host(("cpu",), {}) and not gc._to_host((t,), {}) and not gc._to_host((torch.float64,), {})
    assert c.total > 0 and c.total == sum(c.where.values())
    assert all(w.startswith(os.path.join("nndb", "tracer", "stats.py") + ":") for w in c.where)
    assert {m: torch.Tensor.__dict__.get(m) for m in gc.SyncCounter.METHODS} == before
    with gc.SyncCounter(torch, "cuda") as c:          # CPU tensors are not what a cuda count counts
        stats.stats_of(t)
    assert c.total == 0


def _gpu_check():
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", SCRIPT)
    gc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gc)
    return gc


def test_memory_growth_is_judged_after_the_settling_steps_against_the_plain_loop():
    gc = _gpu_check()
    plain = [1000] * 50
    once = [1000] * 5 + [1512] * 45                    # a one-off at step 5, before settling (step 10)
    g = gc._growth(once, plain, 2, 10)
    assert g["growth_bytes"] == 0 and g["growth_from_early_bytes"] == 512 and g["changes_after_settled"] == []
    leak = [1000 + 512 * (i // 10) for i in range(50)]  # a block every 10 steps
    g = gc._growth(leak, plain, 2, 10)
    assert g["growth_bytes"] == 512 * 3 and g["changes_after_settled_count"] == 3
    assert g["changes_after_settled"][0] == (20, 512) and g["plain_growth_bytes"] == 0


def test_only_runs_the_named_checks_and_refuses_an_unknown_one(tmp_path):
    # (the recording check, in gpu_check's own process: no run of nndb started for it)
    p = _run("--device", "cpu", "--only", "recording", "--record-steps", "2", "--json", str(tmp_path / "o.json"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert [c["name"] for c in json.loads((tmp_path / "o.json").read_text())["checks"]] == ["recording"]
    p = _run("--device", "cpu", "--only", "nan-recordd")
    assert p.returncode == 2 and "no check nan-recordd" in p.stderr and "Traceback" not in p.stderr
