"""The findings a run stored, in every reader of its trace: ``nndb inspect``
(text and JSON), ``nndb check-trace`` (text and JSON), ``nndb export`` and
``nndb plot``, each saying who found a finding: the live run (``run``: its
probes too, which a re-check cannot run) or the offline re-check
(``check-trace``), or both."""
import json
import os

import pytest

from conftest import nndb

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")


@pytest.fixture(scope="module")
def stale_trace(tmp_path_factory):
    """A run without zero_grad: the live stale_grad probe fires; no rule a
    trace can serve fires on it."""
    trace = str(tmp_path_factory.mktemp("stale") / "t.h5")
    p = nndb("run", "--batch", "--trace", trace, os.path.join(SCRIPTS, "planted_stale_grad_no_zero_grad.py"))
    assert p.returncode == 0, p.stderr
    line = next(x for x in p.stderr.splitlines() if "stale_grad" in x)
    assert line.startswith("nndb: error: stale_grad at step ")
    return trace, int(line.split("at step ")[1].split(":")[0])


def test_inspect_shows_the_runs_findings(stale_trace):
    trace, step = stale_trace
    p = nndb("inspect", trace)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    i = lines.index("findings   1 stored by the live run")
    assert lines[i + 1].split()[:5] == ["error", "stale_grad", "at", "step", f"{step}:"]
    d = json.loads(nndb("inspect", trace, "--json").stdout)
    assert [(f["rule"], f["step"], f["found_by"]) for f in d["findings"]] == [("stale_grad", step, ["run"])]


def test_check_trace_shows_the_runs_findings_and_says_whose(stale_trace):
    trace, step = stale_trace
    p = nndb("check-trace", trace)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith(f"nndb: error: stale_grad at step {step} [run]: gradients are not reset")
    assert lines[-1].endswith(": 1 finding (the run alone: 1, this re-check alone: 0, both: 0)")
    d = json.loads(nndb("check-trace", trace, "--json").stdout)
    assert [(f["rule"], f["found_by"]) for f in d["findings"]] == [("stale_grad", ["run"])]
    assert "stale_grad" in {s["rule"] for s in d["skipped"]}      # (the probe: not run again offline)


def test_export_carries_the_runs_findings(stale_trace, tmp_path):
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    trace, step = stale_trace
    out = str(tmp_path / "tb")
    p = nndb("export", trace, "--tensorboard", out)
    assert p.returncode == 0, p.stderr
    assert " and 1 finding(s) to tensorboard:" in p.stdout
    acc = ea.EventAccumulator(out, size_guidance={ea.TENSORS: 0})
    acc.Reload()
    texts = {e.step: e.tensor_proto.string_val[0].decode().replace("\\", "")     # (Markdown escapes)
             for e in acc.Tensors("findings/text_summary")}
    assert list(texts) == [step] and "error: stale_grad (0.bias) [run]: gradients are not reset" in texts[step]
    # --rules none: the run's findings still
    p = nndb("export", trace, "--tensorboard", str(tmp_path / "tb2"), "--rules", "none")
    assert " and 1 finding(s) to tensorboard:" in p.stdout, p.stderr


def test_merge_marks_each_finding_with_who_found_it():
    from nndb.rules.offline import merge_findings
    run = [{"rule": "stale_grad", "step": 4, "tensor": "w", "message": "m"},
           {"rule": "nonfinite", "step": 9, "tensor": "w", "message": "n"}]
    again = [{"rule": "loss_not_decreasing", "step": 2, "message": "l"},
             {"rule": "nonfinite", "step": 9, "tensor": "w", "message": "n"}]
    got = [(f["rule"], f["step"], f["found_by"]) for f in merge_findings(run, again)]
    assert got == [("loss_not_decreasing", 2, ["check-trace"]), ("stale_grad", 4, ["run"]),
                   ("nonfinite", 9, ["run", "check-trace"])]
    assert run[0] == {"rule": "stale_grad", "step": 4, "tensor": "w", "message": "m"}     # (not changed)


def test_fail_on_fails_a_batch_run_and_check_trace_on_a_finding_that_severe(stale_trace, tmp_path):
    script = os.path.join(SCRIPTS, "planted_stale_grad_no_zero_grad.py")
    p = nndb("run", "--batch", "--fail-on", "error", "--trace", str(tmp_path / "a.h5"), script)
    assert p.returncode == 4, p.stderr
    assert p.stderr.splitlines()[-1].startswith("nndb: --fail-on error: error stale_grad at step ")
    p = nndb("run", "--batch", "--fail-on", "warning", "--trace", str(tmp_path / "b.h5"),
             os.path.join(SCRIPTS, "healthy_mlp_adam.py"))
    assert p.returncode == 0 and "--fail-on" not in p.stderr, p.stderr
    trace, _ = stale_trace
    assert nndb("check-trace", trace).returncode == 0
    assert nndb("check-trace", trace, "--fail-on", "error").returncode == 4      # (the run's finding)
    p = nndb("run", "--batch", "--fail-on", "fatal", str(tmp_path / "x.py"))
    assert p.returncode == 2 and "Invalid value for '--fail-on'" in p.stderr


def test_fail_on_levels():
    from nndb.rules.base import failing_findings
    found = [{"rule": "a", "severity": "info"}, {"rule": "b", "severity": "warning"},
             {"rule": "c", "severity": "error"}]
    assert [f["rule"] for f in failing_findings(found, "warning")] == ["b", "c"]
    assert [f["rule"] for f in failing_findings(found, "error")] == ["c"]
    assert failing_findings(found, None) == []
