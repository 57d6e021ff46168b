"""What ``nndb run``'s options become: the run's RunConfig and DebugOptions,
every file nndb writes checked before the script starts.  No click here:
``nndb.cli`` parses the command line (and ``%nndb run`` in a notebook parses
its line with the same command), then builds the run with these."""
from __future__ import annotations

import os

from ..errors import NndbError, UsageError


def run_setup(p: dict, target, batch: bool, progress: bool, paths=None, nndb_argv: tuple = (), **overrides):
    """``nndb run``'s options (click's parameters ``p``) as the run's
    RunConfig and DebugOptions, every path checked before the script starts
    (``paths``: the (trace, report, trace directory) ``own_paths`` gave,
    when the caller checked them already).  ``%nndb run`` in a notebook
    parses its line with this same command and builds its run here too
    (``overrides``: the DebugOptions a kernel, or a rank, sets; ``nndb_argv``:
    nndb's options as given, kept in the trace's metadata)."""
    from ..run.config import RecordSchedule, RunConfig
    from ..driver import DebugOptions
    schedule = RecordSchedule.parse(p["every"], p["steps_range"], p["full_every"], p["act_every"])
    trace_path, report_path, trace_dir = paths or own_paths(target, p["trace_path"], p["force"], p["report_path"],
                                                             p["command_files"], p["rules"])
    exports = export_targets(p["exports"])
    from ..run.rank import place
    if place().distributed:             # (one directory or run per rank, never one for all)
        exports = tuple(t.for_rank(place().rank) for t in exports)
    config = RunConfig(target, trace_path, schedule, p["flush_steps"], p["flush_secs"], p["quiet"], trace_dir,
                       *full_rules(p["record_full"], p["full_tensors_every"], p["precision"],
                                    p["full_tensors_buffer"]), tuple(nndb_argv))
    options = dict(batch=batch, stop_at_start=not p["go"], command_files=p["command_files"],
                   eval_commands=p["eval_commands"], no_rc=p["nx"], report=report_path, rules=p["rules"],
                   replica=p["replica"], total_steps=p["total_steps"], lineage=p["lineage"],
                   checkpoint_every=p["checkpoint_every"], checkpoint_memory=p["checkpoint_memory"],
                   exports=exports, progress=progress, fail_on=p.get("fail_on"))
    options.update(overrides)
    return config, DebugOptions(**options)


LAUNCH_FLAGS = ("nnodes", "node_rank", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf", "master_addr",
                "master_port", "hang_timeout")


def launch_options(p: dict, on_command_line):
    """torchrun's flags -> nndb.distributed.front.LaunchOptions (None: no --nproc-per-node).
    ``on_command_line(name)``: whether that flag was given (one of
    LAUNCH_FLAGS without --nproc-per-node is an error)."""
    if p["nproc_per_node"] is None:
        given = [f for f in LAUNCH_FLAGS if on_command_line(f)]
        if given:
            raise UsageError(f"--{given[0].replace('_', '-')} goes with --nproc-per-node N")
        return None
    from ..distributed.front import LaunchOptions, check_options
    o = LaunchOptions(p["nproc_per_node"], p["nnodes"], p["node_rank"], p["rdzv_backend"], p["rdzv_endpoint"],
                      p["rdzv_id"], p["rdzv_conf"], p["master_addr"], p["master_port"], 0, p["hang_timeout"])
    check_options(o)
    return o


def full_rules(specs, every, precision, buffer_mib) -> tuple:
    """(rules, bound in bytes) from --record-full and the flags that go with it."""
    from ..tracer.fulltensors import parse_rule
    if not specs and (every is not None or precision is not None or buffer_mib is not None):
        raise UsageError("--full-tensors-every, --precision and --full-tensors-buffer go with --record-full")
    rules = tuple(parse_rule(s, every, precision) for s in specs)
    return rules, (None if buffer_mib is None else int(buffer_mib * (1 << 20)))


def export_targets(specs) -> tuple:
    """--export values, checked before the script runs (the extra installed, the directory writable)."""
    if not specs:
        return ()
    from ..export.targets import parse_spec
    return tuple(parse_spec(s) for s in specs)


def own_paths(target, trace_path, force, report_path, command_files, rules):
    """The files nndb writes, absolute and checked before the script starts (nndb.run.paths)."""
    from ..run import paths
    inputs = tuple(command_files) + ((rules,) if rules not in (None, "default", "none") else ())
    paths.check_distinct(target.file, trace_path and os.path.abspath(trace_path),
                         report_path and os.path.abspath(report_path), inputs)   # (the clearer line first)
    trace_path = paths.resolve_trace(trace_path, force)
    report_path = paths.resolve_report(report_path)
    trace_dir = None if trace_path else paths.default_dir_writable("nndb-runs")
    return trace_path, report_path, trace_dir


def export_to(reader, target, findings, progress=None):
    """One export; a store that refuses it (unreachable, read-only) is one line, exit 2.
    A KeyboardInterrupt (Ctrl-C) aborts the sink (its partial files removed,
    an MLflow run marked KILLED) and goes on up."""
    from ..export.offline import export_trace
    sink = None
    try:
        sink = target.open()
        return export_trace(reader, sink, findings, target.label, progress)
    except KeyboardInterrupt:
        if sink is not None:
            sink.abort()
        raise
    except NndbError:
        raise
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise UsageError(f"cannot export to {target.label}: {type(e).__name__}: {first}") from None
