"""What ``nndb run``'s options (one RunOptions) become: the run's RunConfig
and DebugOptions, torchrun's LaunchOptions, every file nndb writes checked
before the script starts.  No click here: ``nndb.cli.run`` parses the
command line (and ``%nndb run`` in a notebook parses its line with the same
command), then builds the run with these."""
from __future__ import annotations

import os

from ..errors import UsageError
from ..run.config import RunOptions


def run_setup(o: RunOptions, target, batch: bool, progress: bool, paths=None, nndb_argv: tuple = (),
              **overrides):
    """``nndb run``'s options ``o`` as the run's
    RunConfig and DebugOptions, every path checked before the script starts
    (``paths``: the (trace, report, trace directory) ``own_paths`` gave,
    when the caller checked them already).  ``%nndb run`` in a notebook
    parses its line with this same command and builds its run here too
    (``overrides``: the DebugOptions a kernel, or a rank, sets; ``nndb_argv``:
    nndb's options as given, kept in the trace's metadata)."""
    from ..run.config import RecordSchedule, RunConfig
    from ..driver import DebugOptions
    schedule = RecordSchedule.parse(o.every, o.steps_range, o.full_every, o.act_every)
    trace_path, report_path, trace_dir = paths or own_paths(target, o.trace_path, o.force, o.report_path,
                                                             o.command_files, o.rules)
    exports = export_targets(o.exports)
    from ..run.rank import place
    if place().in_job:                  # (one directory or run per rank, never one for all)
        exports = tuple(t.for_rank(place().rank) for t in exports)
    config = RunConfig(target, trace_path, schedule, o.flush_steps, o.flush_secs, o.quiet, trace_dir,
                       *full_rules(o.record_full, o.full_tensors_every, o.precision, o.full_tensors_buffer),
                       tuple(nndb_argv))
    options = dict(batch=batch, stop_at_start=not o.go, command_files=o.command_files,
                   eval_commands=o.eval_commands, no_rc=o.nx, report=report_path, rules=o.rules,
                   replica=o.replica, total_steps=o.total_steps, lineage=o.lineage,
                   checkpoint_every=o.checkpoint_every, checkpoint_memory=o.checkpoint_memory,
                   exports=exports, progress=progress, fail_on=o.fail_on)
    options.update(overrides)
    return config, DebugOptions(**options)


LAUNCH_FLAGS = ("nnodes", "node_rank", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf", "master_addr",
                "master_port", "hang_timeout")


def launch_options(o: RunOptions):
    """torchrun's flags -> nndb.distributed.front.LaunchOptions (None: no
    --nproc-per-node; one of LAUNCH_FLAGS given without it is an error)."""
    if o.nproc_per_node is None:
        given = [f for f in LAUNCH_FLAGS if f in o.given]
        if given:
            raise UsageError(f"--{given[0].replace('_', '-')} goes with --nproc-per-node N")
        return None
    from ..distributed.front import LaunchOptions, check_options
    launch = LaunchOptions(o.nproc_per_node, o.nnodes, o.node_rank, o.rdzv_backend, o.rdzv_endpoint, o.rdzv_id,
                           o.rdzv_conf, o.master_addr, o.master_port, 0, o.hang_timeout)
    check_options(launch)
    return launch


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
