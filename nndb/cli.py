"""The ``nndb`` command line.  click stays here: flags become a RunConfig,
results become exit codes (see nndb.errors for the table)."""
from __future__ import annotations

import sys

import click

from .version import __version__
from .errors import EXIT_FAIL_ACTION, EXIT_INTERNAL, EXIT_OK, EXIT_SIGINT, NndbError, UsageError
from .numbers import to_json
from .safetext import printable
from .store.schema import KINDS as KIND_CHOICES, STAT_NAMES as STAT_CHOICES  # (a leaf: no torch, no h5py)


def _target(module, script, args):
    """SCRIPT ARGS or -m MODULE ARGS -> a launcher Target."""
    from .launcher import Target
    args = list(args)
    if module:
        if script is not None:
            args.insert(0, script)
        return Target(module=module, args=args)
    if script is None:
        raise click.UsageError("missing SCRIPT (or -m MODULE)")
    import os
    return Target(path=script, args=args, cwd=os.getcwd())


def _fail(e: NndbError) -> None:
    click.echo(printable(f"nndb: error: {e}"), err=True)
    sys.exit(e.exit_code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="nndb")
def cli():
    """nndb: a debugger for PyTorch training, in the style of gdb and pdb."""


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-m", "module", metavar="MODULE", help="Run a library module as a script, like python -m.")
@click.option("--trace", "trace_path", metavar="PATH", type=click.Path(),
              help="Write the trace here (default: a new file under ./nndb-runs/); an existing file is refused. "
                   "Under torchrun the rank goes in: DIR/rank<R>.h5 for a directory, else PATH.rank<R>.h5.")
@click.option("--force", is_flag=True, help="Let --trace overwrite an existing nndb trace (never another file).")
@click.option("--every", type=int, metavar="N", help="Record every N-th step (default: every step).")
@click.option("--steps", "steps_range", metavar="A:B", help="Record only steps A to B-1 (A: or :B open).")
@click.option("--full-every", type=int, metavar="N",
              help="Measure all ten statistics every N-th recorded step (default 32; 1 = every step); "
                   "the steps between measure count, norm and NaN/Inf (the loss: all ten).")
@click.option("--act-every", type=int, metavar="N",
              help="Record module outputs on the first 20 recorded steps, then every N-th (default 32; "
                   "1 = every step) and at full steps.")
@click.option("--flush-every", "flush_steps", type=click.IntRange(min=1), default=500, show_default=True,
              metavar="N", help="Write the buffered steps to the trace every N steps...")
@click.option("--flush-secs", type=click.FloatRange(min=0), default=2.0, show_default=True, metavar="S",
              help="...or every S seconds, whichever comes first.")
@click.option("-q", "--quiet", is_flag=True, help="Do not print the trace path.")
@click.option("--batch", is_flag=True,
              help="No prompt: run the command files, continue at every stop (also when stdin is not a terminal).")
@click.option("--run", "go", is_flag=True, help="Do not stop at the start of step 0.")
@click.option("-x", "command_files", multiple=True, metavar="FILE", type=click.Path(dir_okay=False),
              help="Run the debugger commands in FILE (repeatable).")
@click.option("-e", "--eval-command", "eval_commands", multiple=True, metavar="CMD",
              help="Run debugger command CMD (repeatable, in order, after the -x files).")
@click.option("--nx", is_flag=True, help="Read neither ~/.nndbrc nor ./.nndbrc.")
@click.option("--report", "report_path", metavar="FILE.json", type=click.Path(dir_okay=False),
              help="Write a JSON report of the session (stops, exit) to FILE.json.")
@click.option("--rules", "rules", default="default", show_default=True, metavar="default|FILE.yaml|none",
              help="The diagnostic rules to run: the built-in set, a YAML rule file, or none.")
@click.option("--replica", "replica", type=click.Choice(["auto", "fork", "respawn", "off"]), default="auto",
              show_default=True, help="How time travel copies the run: fork() checkpoints (auto: where safe, "
                                      "else respawn), a fresh process replaying from the start, or not at all.")
@click.option("--total-steps", type=click.IntRange(min=1), metavar="N",
              help="The run's length in steps, for the checkpoint schedule (else an adaptive one).")
@click.option("--checkpoint-every", "checkpoint_every", metavar="N|Ns",
              help="Take a checkpoint every N steps or every N seconds of run time (else the schedule's).")
@click.option("--checkpoint-memory", "checkpoint_memory", metavar="SIZE",
              help="The memory all checkpoints may hold, as their PSS (512M, 2G, 25%%); default a quarter of the "
                   "memory available at start.")
@click.option("--lineage", "lineage", metavar="STEPS",
              help="Record the operation lineage of these steps: N, A:B (B excluded), N,M or all.")
@click.option("--export", "exports", multiple=True, metavar="tensorboard:DIR|mlflow[:URI]",
              help="Stream each step's statistics and the findings to TensorBoard or MLflow while the run "
                   "goes (repeatable); an unreachable store is one warning, and the run goes on.")
@click.argument("script", required=False, metavar="SCRIPT")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(module, trace_path, force, every, steps_range, full_every, act_every, flush_steps, flush_secs, quiet,
        batch, go, command_files, eval_commands, nx, report_path, rules, replica, total_steps,
        checkpoint_every, checkpoint_memory, lineage, exports, script, args):
    """Run SCRIPT [ARGS]... (or -m MODULE [ARGS]...) under the debugger, as
    Python would, recording per-step tensor statistics into an HDF5 trace.
    Everything after SCRIPT is passed to the script untouched.  It stops at
    the start of step 0 with the (nndb) prompt unless --run, --batch, or
    stdin is not a terminal."""
    from .preload import maybe_restart
    maybe_restart(replica)              # (fork replicas: Intel's OpenMP runtime; returns if not)
    from .config import RecordSchedule, RunConfig
    from .debugger.driver import DebugOptions, debug

    target = _target(module, script, args)
    try:
        schedule = RecordSchedule.parse(every, steps_range, full_every, act_every)
        trace_path, report_path, trace_dir = _own_paths(target, trace_path, force, report_path,
                                                        command_files, rules)
        export_targets = _export_targets(exports)
        config = RunConfig(target, trace_path, schedule, flush_steps, flush_secs, quiet, trace_dir)
        batch = batch or not sys.stdin.isatty()
        options = DebugOptions(batch=batch, stop_at_start=not go, command_files=command_files,
                               eval_commands=eval_commands, no_rc=nx, report=report_path, rules=rules,
                               replica=replica, total_steps=total_steps, lineage=lineage,
                               checkpoint_every=checkpoint_every, checkpoint_memory=checkpoint_memory,
                               exports=export_targets, progress=_stderr_is_terminal())
        result = debug(config, options, _frontend(interactive=not batch))
    except NndbError as e:
        _fail(e)
    sys.exit(result.exit_code)


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _export_targets(specs) -> tuple:
    """--export values, checked before the script runs (the extra installed, the directory writable)."""
    if not specs:
        return ()
    from .export.targets import parse_spec
    return tuple(parse_spec(s) for s in specs)


def _own_paths(target, trace_path, force, report_path, command_files, rules):
    """The files nndb writes, absolute and checked before the script starts (nndb.paths)."""
    import os
    from . import paths, runmeta
    from .config import rank_trace_path
    if trace_path:
        ranks = runmeta.distributed()
        ranked = rank_trace_path(trace_path, ranks["rank"], ranks["world_size"])
        if ranked != trace_path and os.path.basename(ranked).startswith("rank"):
            try:
                os.makedirs(os.path.dirname(os.path.abspath(ranked)), exist_ok=True)
            except OSError:
                pass                # (resolve_trace says why the directory cannot be written)
        trace_path = ranked
    trace_path = paths.resolve_trace(trace_path, force)
    report_path = paths.resolve_report(report_path)
    trace_dir = None if trace_path else paths.default_dir_writable("nndb-runs")
    inputs = tuple(command_files) + ((rules,) if rules not in (None, "default", "none") else ())
    paths.check_distinct(target.file, trace_path, report_path, inputs)
    return trace_path, report_path, trace_dir


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-m", "module", metavar="MODULE", help="Check a library module run as a script, like python -m.")
@click.option("--steps", type=click.IntRange(min=1), default=2, show_default=True, metavar="N",
              help="Run the script's first N steps.")
@click.option("--overfit-iters", type=click.IntRange(min=1), default=300, show_default=True, metavar="N",
              help="Iterations at most for the overfit-one-batch check.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object (the script's own output goes to stderr).")
@click.argument("script", required=False, metavar="SCRIPT")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def check(module, steps, overfit_iters, as_json, script, args):
    """Run the first steps of SCRIPT [ARGS]... and the checklist practitioners
    run by hand: data, shapes, initial loss, finite loss, gradients, updates,
    overfitting one batch.  One PASS/FAIL/SKIP line per check; exit code 0 if
    none failed, 1 if one did (a script that raises, KeyboardInterrupt
    included, or ends its process: run FAIL), 2 on a usage error, 130 at Ctrl-C."""
    from .checkrun import Interrupted, run_check
    from .launcher import prepare

    target = _target(module, script, args)
    try:
        prepare(target)                 # a bad SCRIPT fails here, before torch is imported
        report = run_check(target, steps, overfit_iters, script_stdout=sys.stderr if as_json else None)
        from .render.check import text
    except NndbError as e:
        _fail(e)
    except (Interrupted, KeyboardInterrupt):
        click.echo("nndb: check interrupted", err=True)
        sys.exit(EXIT_SIGINT)
    click.echo(to_json(report.to_dict()) if as_json else text(report))
    sys.exit(report.exit_code)


@cli.command()
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--force", is_flag=True, help="Trust even the filesystem root, a top-level directory, "
                                            "a mount point or the home directory.")
def trust(directory, force):
    """Trust DIR (and the directories under it): nndb then reads DIR/.nndbrc
    at start (gdb's auto-load safe-path)."""
    from .debugger.trust import trust as add_trusted, trust_file
    try:
        d = add_trusted(directory, force=force, warn=lambda m: click.echo(m, err=True))
    except NndbError as e:
        _fail(e)
    click.echo(f"nndb: trusted {d} (listed in {trust_file()})")


@cli.command()
@click.argument("trace", metavar="TRACE|RUNDIR")
@click.option("--series", "series_name", metavar="NAME", help="Print the history of one tensor.")
@click.option("--stat", type=click.Choice(STAT_CHOICES), default="norm", show_default=True,
              help="The statistic --series prints.")
@click.option("--kind", type=click.Choice(KIND_CHOICES), help="With --series: only this kind.")
@click.option("--ranks", "side_by_side", is_flag=True,
              help="With a RUNDIR: each tensor's statistics per rank, side by side (default: merged).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def inspect(trace, series_name, stat, kind, side_by_side, as_json):
    """Print a trace's metadata, step count and recorded tensors.  Given a
    run directory of a distributed job (one rank<R>.h5 per rank): the job's
    ranks, their steps and findings, the cross-rank findings, and each
    tensor's statistics merged across ranks (--ranks: side by side).  Exit
    code 0; 2 for an unreadable trace, or a directory that is not one whole
    job (empty, mixed jobs or scripts, a rank missing)."""
    import os
    from . import inspect as queries
    from .render import text
    from .store.reader import TraceReader

    try:
        if os.path.isdir(trace):
            if series_name or kind:
                raise UsageError("--series and --kind go with a trace, not a run directory")
            from .store.job import job_summary, open_job
            with open_job(trace) as job:
                data = job_summary(job, ranks=side_by_side)
            out = to_json(data) if as_json else text.job(data)
        else:
            if side_by_side:
                raise UsageError("--ranks goes with a run directory (RUNDIR), not one trace")
            with TraceReader(trace) as reader:
                if series_name:
                    data = queries.series(reader, series_name, stat, kind)
                    out = to_json(data) if as_json else text.series(data)
                else:
                    if kind:
                        raise UsageError("--kind goes with --series")
                    data = queries.summary(reader)
                    out = to_json(data) if as_json else text.summary(data)
    except NndbError as e:
        _fail(e)
    click.echo(out)


@cli.command("check-trace")
@click.argument("trace", metavar="TRACE")
@click.option("--rules", "rules", default="default", show_default=True, metavar="default|FILE.yaml",
              help="The rules to run: the built-in set or a YAML rule file, as for nndb run.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def check_trace(trace, rules, as_json):
    """Run the diagnostic rules over a finished trace, as the live run did.
    Findings are printed as a live run prints them; rules that need the live
    run (its probes, optimizers) are named with the reason.  Exit code 0, or
    4 if a rule with the fail action fired, 2 for an unreadable trace or rule file."""
    from .render.offline import text
    from .rules.catalog import load
    from .rules.engine import RuleEngine
    from .rules.offline import check_trace as run_rules
    from .store.reader import TraceReader

    try:
        engine = load(rules) or RuleEngine([])
        with TraceReader(trace) as reader:
            result = run_rules(reader, engine)
    except NndbError as e:
        _fail(e)
    click.echo(to_json(result.to_dict()) if as_json else text(result))
    sys.exit(EXIT_FAIL_ACTION if result.failed else EXIT_OK)


@cli.command()
@click.argument("trace", metavar="TRACE")
@click.option("--tensorboard", "tb_dir", metavar="DIR", help="Write TensorBoard event files into DIR.")
@click.option("--mlflow", "mlflow_uri", is_flag=False, flag_value="", default=None, metavar="[TRACKING_URI]",
              help="Log an MLflow run (default tracking URI: MLFLOW_TRACKING_URI, else a file store in ./mlruns).")
@click.option("--experiment", default="nndb", show_default=True, metavar="NAME", help="The MLflow experiment.")
@click.option("--run-name", metavar="NAME", help="The MLflow run's name (default: the trace's file name).")
@click.option("--rules", "rules", default="default", show_default=True, metavar="default|FILE.yaml|none",
              help="The rules whose findings are exported (as nndb check-trace runs them).")
def export(trace, tb_dir, mlflow_uri, experiment, run_name, rules):
    """Export TRACE to TensorBoard and/or MLflow: every recorded statistic
    as a scalar at its step (tags KIND/NAME/STAT, the loss also as 'loss/value'), the
    findings as text (TensorBoard) or tags (MLflow), the run's parameters,
    and (MLflow) the trace as an artifact."""
    import os
    from .export.scalars import trace_findings
    from .export.targets import mlflow_target, tensorboard_target
    from .store.reader import TraceReader

    try:
        if tb_dir is None and mlflow_uri is None:
            raise UsageError("export where? --tensorboard DIR and/or --mlflow [TRACKING_URI]")
        targets = []
        if tb_dir is not None:
            targets.append(tensorboard_target(tb_dir, "nndb export --tensorboard"))
        if mlflow_uri is not None:
            name = run_name or os.path.splitext(os.path.basename(trace))[0]
            targets.append(mlflow_target(mlflow_uri, "nndb export --mlflow", experiment, name))
        with TraceReader(trace) as reader:
            findings = trace_findings(reader, rules)
            for t in targets:
                done = _export_to(reader, t, findings)
                click.echo(printable(f"nndb: exported {done.points} value(s) in {done.tags} tag(s) and "
                                     f"{done.findings} finding(s) to {done.target}"))
    except NndbError as e:
        _fail(e)


def _export_to(reader, target, findings):
    """One export; a store that refuses it (unreachable, read-only) is one line, exit 2."""
    from .export.offline import export_trace
    try:
        return export_trace(reader, target.open(), findings, target.label)
    except NndbError:
        raise
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise UsageError(f"cannot export to {target.label}: {type(e).__name__}: {first}") from None


@cli.command()
@click.argument("trace", metavar="TRACE")
@click.option("--what", type=click.Choice(["heatmap", "loss", "history", "ratio"]), default="heatmap",
              show_default=True, help="heatmap: layers x steps; loss: the loss curve; history: one tensor's "
                                      "statistics; ratio: update/weight ratio per layer.")
@click.option("--kind", type=click.Choice(KIND_CHOICES), help="The tensors' kind (default: grad; history: param).")
@click.option("--stat", type=click.Choice(STAT_CHOICES), default="norm", show_default=True,
              help="The statistic of the heat map.")
@click.option("--glob", metavar="PATTERN", help="Only the tensors whose names match (history: the tensor).")
@click.option("--rules", "rules", default="default", show_default=True, metavar="default|FILE.yaml|none",
              help="The rules whose findings are marked (as nndb check-trace runs them).")
@click.option("--report", "report_path", metavar="FILE.json", type=click.Path(dir_okay=False),
              help="Mark the stops of this nndb run --report too.")
@click.option("-o", "--output", metavar="FILE.png|FILE.svg",
              help="Write the picture here (default: beside the trace, named for what it shows).")
def plot(trace, what, kind, stat, glob, rules, report_path, output):
    """Draw a picture of TRACE: a heat map of a statistic per layer and step
    (log colour scale, layers in model order), the loss curve, one tensor's
    history, or the update/weight ratio per layer; findings (and with
    --report, stops) are marked.  Prints the picture's path."""
    from .extras import require
    from .plot.pictures import picture, stops_of_report
    from .export.scalars import trace_findings
    from .store.reader import TraceReader

    try:
        require("plot", "nndb plot")
        stops = stops_of_report(report_path) if report_path else []
        with TraceReader(trace) as reader:
            path = picture(reader, what, kind, stat, glob, trace_findings(reader, rules), stops, output)
    except NndbError as e:
        _fail(e)
    click.echo(printable(path))


def main(argv=None) -> None:
    try:
        cli.main(args=argv, prog_name="nndb", standalone_mode=True)
    except SystemExit:
        raise
    except Exception as e:  # a bug in nndb: one line, exit 3
        click.echo(f"nndb: internal error: {type(e).__name__}: {e} "
                   f"(please report it; set NNDB_DEBUG=1 for the traceback)", err=True)
        import os
        if os.environ.get("NNDB_DEBUG"):
            import traceback
            traceback.print_exc()
        sys.exit(EXIT_INTERNAL)


if __name__ == "__main__":
    main()


def _frontend(interactive: bool, scripted: bool = False):
    """The front end of a debugger session: the prompt_toolkit REPL at a
    terminal, else batch mode (a scripted one for a replica of a test's session)."""
    if scripted:
        from .debugger.frontend import ScriptedFrontend
        return ScriptedFrontend([])
    if interactive:
        from .repl import ReplFrontend
        return ReplFrontend()
    from .debugger.frontend import BatchFrontend
    return BatchFrontend()


def replica_main() -> None:
    """The entry point of a respawned replica (nndb.timetravel.respawn)."""
    import os
    from .debugger.driver import DebugOptions, build_session
    from .timetravel import respawn
    chan, msg = respawn.connect()
    if msg is None:
        os._exit(3)
    fe = _frontend(interactive=bool(msg.get("interactive")) and sys.stdin.isatty(),
                   scripted=bool(msg.get("scripted")))
    respawn.run(build_session(fe, DebugOptions(**respawn.session_options(msg))), chan, msg)
