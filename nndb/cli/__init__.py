"""The ``nndb`` command line.  click stays here: flags become a RunConfig,
results become exit codes (see nndb.errors for the table)."""
from __future__ import annotations

import os
import sys

import click

from ..version import __version__
from ..errors import EXIT_FAIL_ACTION, EXIT_INTERNAL, EXIT_OK, EXIT_SIGINT, NndbError, UsageError
from ..text import to_json
from .setup import export_to, full_rules, launch_options, own_paths, run_setup
from ..text import printable
from ..schema import KINDS as KIND_CHOICES, STAT_NAMES as STAT_CHOICES  # (a leaf: no torch, no h5py)


class Number(click.FloatRange):
    """click's FloatRange, NaN refused (it passes every comparison's range check)."""

    def convert(self, value, param, ctx):
        v = super().convert(value, param, ctx)
        if v != v:
            self.fail(f"{value!r} is not a number.", param, ctx)
        return v


def _target(module, script, args):
    """SCRIPT ARGS or -m MODULE ARGS -> a launcher Target."""
    from ..run.launcher import Target
    args = list(args)
    if module:
        if script is not None:
            args.insert(0, script)
        return Target(module=module, args=args)
    if script is None:
        raise click.UsageError("missing SCRIPT (or -m MODULE)")
    if script.startswith("-") and script != "-":
        _unknown_option(script)
    import os
    return Target(path=script, args=args, cwd=os.getcwd())


def _unknown_option(word: str) -> None:
    """An option before SCRIPT that the command does not have: click's own
    error (with its 'Did you mean'), not 'no such file'.  (The commands take
    unknown options as SCRIPT, so that everything after SCRIPT is the script's.)"""
    import difflib
    ctx = click.get_current_context()
    names = [n for p in ctx.command.params if isinstance(p, click.Option) for n in p.opts + p.secondary_opts]
    name = word.split("=", 1)[0]
    raise click.NoSuchOption(name, possibilities=difflib.get_close_matches(name, names), ctx=ctx)


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
                   "With several ranks (torchrun or --nproc-per-node) the rank goes in: DIR/rank<R>.h5 for a "
                   "directory (an existing one, or DIR/), else PATH.rank<R>.h5.")
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
@click.option("--flush-secs", type=Number(min=0), default=2.0, show_default=True, metavar="S",
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
@click.option("--fail-on", "fail_on", type=click.Choice(["warning", "error"]),
              help="Exit with code 4 when the run ends if a rule found anything this severe (warning: a warning "
                   "or an error; error: an error), as a rule with the fail action would, without one.")
@click.option("--replica", "replica", type=click.Choice(["auto", "fork", "respawn", "off"]), default="auto",
              show_default=True, help="How time travel copies the run: fork() checkpoints (auto: where safe, "
                                      "else respawn), a fresh process replaying from the start, or not at all.")
@click.option("--total-steps", type=click.IntRange(min=1), metavar="N",
              help="The run's length in steps, for the checkpoint schedule (else an adaptive one).")
@click.option("--checkpoint-every", "checkpoint_every", metavar="N|Ns",
              help="Take a checkpoint every N steps or every N seconds of run time (else the schedule's).")
@click.option("--checkpoint-memory", "checkpoint_memory", metavar="SIZE",
              help="The memory all checkpoints may hold, as their PSS (512M, 2G, 25%); default a quarter of the "
                   "memory available at start.")
@click.option("--lineage", "lineage", metavar="STEPS",
              help="Record the operation lineage of these steps: N, A:B (B excluded), N,M or all.")
@click.option("--record-full", "record_full", multiple=True, metavar="KIND:GLOB",
              help="Keep whole tensors in the trace: KIND param, grad or act, GLOB of names "
                   "('grad:conv*'; repeatable).")
@click.option("--full-tensors-every", "full_tensors_every", type=int, metavar="N",
              help="With --record-full: every N-th step (default: every step).")
@click.option("--precision", "precision", type=click.Choice(["fp16", "bf16", "fp32"]), default=None,
              help="With --record-full: how whole tensors are stored (default fp16; a tensor it cannot "
                   "hold within its stated error falls back to a wider one).")
@click.option("--full-tensors-buffer", "full_tensors_buffer", type=Number(min=0), metavar="MIB",
              help="With --record-full: the most MiB of whole tensors waiting for a write (default 256); "
                   "a step's tensor over it is skipped and said.")
@click.option("--export", "exports", multiple=True, metavar="tensorboard:DIR|mlflow[:URI]",
              help="Stream each step's statistics and the findings to TensorBoard or MLflow while the run "
                   "goes (repeatable); an unreachable store is one warning, and the run goes on.")
@click.option("--nproc-per-node", "nproc_per_node", type=int, metavar="N",
              help="Start a distributed job of N workers on this node through torchrun's launcher "
                   "(torch.distributed.run), each running SCRIPT under nndb; the torchrun flags below "
                   "mean what they mean to torchrun.")
@click.option("--nnodes", default="1", show_default=True, metavar="N|MIN:MAX", help="torchrun's --nnodes.")
@click.option("--node-rank", "node_rank", type=int, default=0, show_default=True, metavar="K",
              help="torchrun's --node-rank.")
@click.option("--rdzv-backend", "rdzv_backend", metavar="NAME", help="torchrun's --rdzv-backend.")
@click.option("--rdzv-endpoint", "rdzv_endpoint", metavar="HOST:PORT", help="torchrun's --rdzv-endpoint.")
@click.option("--rdzv-id", "rdzv_id", metavar="ID", help="torchrun's --rdzv-id.")
@click.option("--rdzv-conf", "rdzv_conf", metavar="K=V,...", help="torchrun's --rdzv-conf.")
@click.option("--master-addr", "master_addr", metavar="HOST", help="torchrun's --master-addr.")
@click.option("--master-port", "master_port", type=int, metavar="PORT", help="torchrun's --master-port.")
@click.option("--hang-timeout", "hang_timeout", type=float, metavar="SECS",
              help="With --nproc-per-node: when no rank has finished a step for SECS seconds, print every "
                   "rank's Python stack and the collective it waits in, and end the job (exit code 5).")
@click.argument("script", required=False, metavar="SCRIPT")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(module, trace_path, force, every, steps_range, full_every, act_every, flush_steps, flush_secs, quiet,
        batch, go, command_files, eval_commands, nx, report_path, rules, replica, total_steps,
        checkpoint_every, checkpoint_memory, lineage, record_full, full_tensors_every, precision,
        full_tensors_buffer, exports, fail_on, nproc_per_node, nnodes, node_rank, rdzv_backend,
        rdzv_endpoint, rdzv_id, rdzv_conf, master_addr, master_port, hang_timeout, script, args):
    """Run SCRIPT [ARGS]... (or -m MODULE [ARGS]...) under the debugger, as
    Python would, recording per-step tensor statistics into an HDF5 trace.
    Everything after SCRIPT is passed to the script untouched.  It stops at
    the start of step 0 with the (nndb) prompt unless --run, --batch, or
    stdin is not a terminal."""
    from ..run import rank as job
    if nproc_per_node is None and not job.place().distributed:     # (no time travel across ranks yet)
        from ..run.preload import maybe_restart
        maybe_restart(replica)          # (fork replicas: Intel's OpenMP runtime; returns if not)
    target = _target(module, script, args)
    ctx = click.get_current_context()
    where = job.place()
    link = None
    try:
        launch = launch_options(ctx.params, lambda f: ctx.get_parameter_source(f)
                                == click.core.ParameterSource.COMMANDLINE)
        if where.distributed and trace_path:
            trace_path = job.rank_trace(trace_path, where, create=True)     # (never one file for all ranks)
        if where.distributed and report_path:
            report_path = job.rank_trace(report_path, where)
        from ..run.config import RecordSchedule
        RecordSchedule.parse(every, steps_range, full_every, act_every)     # (a bad value fails before any rank)
        full_rules(record_full, full_tensors_every, precision, full_tensors_buffer)
        rank_dir = launch is not None and trace_path and job.is_trace_dir(trace_path)
        paths = own_paths(target, None if rank_dir else trace_path, force, report_path, command_files, rules)
        if rank_dir:            # (each rank writes DIR/rank<R>.h5 in it, as under torchrun)
            paths = (job_trace_dir(trace_path),) + tuple(paths[1:2]) + (None,)
        if launch is not None:
            from ..distributed.launch import start_job
            interactive = not (batch or not sys.stdin.isatty())
            sys.exit(start_job(ctx.params, launch, target, _console_frontend() if interactive else None, *paths,
                               _message))
        from ..driver import debug     # (torch: after the checks above)
        off_reason = None
        if where.distributed:
            from ..distributed.worker import FrontLink
            if not batch and sys.stdin.isatty() and where.rank == 0 and "NNDB_FRONT_SOCKET" not in os.environ:
                _message(f"nndb: rank 0 of {where.world_size} under torchrun: no prompt on any rank (batch "
                         f"mode); for the debugger across ranks use nndb run --nproc-per-node N")
            batch = True                # (ranks never prompt on their own)
            replica, off_reason = "off", "a rank keeps no checkpoints: across ranks, time travel runs the job again"
            link = FrontLink.connect(target)
        agreement, frontend = None, None
        if link is not None and link.interactive:
            from ..distributed.allstop import StepAgreement
            from ..distributed.worker import RemoteFrontend
            batch, agreement, frontend = False, StepAgreement(), RemoteFrontend(link)
            link.agreement = agreement
        else:
            batch = batch or not sys.stdin.isatty()
        config, options = run_setup(ctx.params, target, batch, _stderr_is_terminal() and not where.distributed,
                                    paths, nndb_argv=given_options(ctx), replica=replica, replica_off_reason=off_reason,
                                    companions=(link,) if link else (), agreement=agreement)
        result = debug(config, options, frontend or _frontend(interactive=not batch))
    except NndbError as e:
        if link is not None:
            link.done(e.exit_code, str(e))
        _fail(e)
    if link is not None:
        link.done(result.exit_code, result.reason)
    if result.exit_code == EXIT_SIGINT and link is None:
        _INTERRUPTED.append(True)       # (main ends as Python would: below)
    sys.exit(result.exit_code)


_INTERRUPTED: list = []     # nndb run ended by a KeyboardInterrupt (the script's own, or Ctrl-C)


def parse_run_line(words: list, prog: str):
    """``nndb run``'s arguments parsed by its own command, outside the CLI
    (``%nndb run``): (params, target), None after --help (printed); a bad
    line is a UsageError."""
    try:
        p = run.make_context(prog, list(words)).params
        return p, _target(p["module"], p["script"], p["args"])
    except click.exceptions.Exit:
        return None
    except click.ClickException as e:
        raise UsageError(e.format_message()) from None


def given_options(ctx) -> tuple:
    """nndb's options as the command line gave them (``--every 2 --rules none``),
    in the command's order; not SCRIPT and its arguments."""
    out = []
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or ctx.get_parameter_source(param.name) \
                != click.core.ParameterSource.COMMANDLINE:
            continue
        flag = max(param.opts, key=len)
        value = ctx.params.get(param.name)
        for v in (value if param.multiple else (value,)):
            out += [flag] if param.is_flag else [flag, str(v)]
    return tuple(out)


def job_trace_dir(path: str) -> str:
    """``--trace DIR/`` of ``nndb run --nproc-per-node``: DIR made if new,
    as the ranks get it (absolute, with its trailing slash)."""
    d = os.path.abspath(path)
    try:
        os.makedirs(d, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create the trace directory {d}: {e.strerror or e}") from None
    if not os.access(d, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write traces in {d}: it is not writable")
    return d + os.sep


def _console_frontend():
    """The prompt of a distributed job (input(): the ranks' sessions do the completion-free work)."""
    from ..frontends.batch import InputFrontend
    return InputFrontend()


def _message(text: str) -> None:
    click.echo(printable(text), err=True)


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


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
    from ..check.child import Interrupted, run_check
    from ..run.launcher import prepare

    target = _target(module, script, args)
    try:
        prepare(target)                 # a bad SCRIPT fails here, before torch is imported
        report = run_check(target, steps, overfit_iters, script_stdout=sys.stderr if as_json else None)
        from ..render.check import text
    except NndbError as e:
        _fail(e)
    except (Interrupted, KeyboardInterrupt):
        click.echo("nndb: check interrupted", err=True)
        sys.exit(EXIT_SIGINT)
    click.echo(to_json(report.to_dict()) if as_json else text(report))
    sys.exit(report.exit_code)


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-m", "module", metavar="MODULE", help="Fuzz a library module run as a script, like python -m.")
@click.option("--step", type=click.IntRange(min=0), required=True, metavar="N",
              help="Fuzz the batch of training step N (the run goes to the end of step N-1 first).")
@click.option("--until", default="nan", show_default=True, metavar="nan|EXPR",
              help="The objective: a non-finite activation, loss or gradient, or a condition such as 'loss > 1e3'.")
@click.option("--against", type=click.Choice(["fp16", "bf16"]),
              help="The objective: the model and its copy in this precision disagree beyond --tolerance.")
@click.option("--tolerance", type=Number(min=0, min_open=True), metavar="T",
              help="--against's relative tolerance (default 0.01 for fp16, 0.05 for bf16).")
@click.option("--budget", type=click.IntRange(min=1), default=1000, show_default=True, metavar="N",
              help="Mutant batches evaluated at most.")
@click.option("--layers", metavar="GLOB", help="Coverage from these modules' outputs (default: the model's output).")
@click.option("--seed", type=int, default=0, show_default=True, help="The mutations' random seed.")
@click.option("--random", "random_search", is_flag=True, help="Random search: the same mutations, no coverage guidance.")
@click.option("--scale", type=Number(min=0, max=1, min_open=True), default=0.1, show_default=True,
              metavar="F", help="Mutation size: a share of each float input's range (of the elements, for integers).")
@click.option("--threshold", type=Number(min=0, min_open=True), metavar="D",
              help="Coverage distance (default: the median nearest-neighbour distance in the step's batch).")
@click.option("--save", metavar="FILE.pt", type=click.Path(dir_okay=False),
              help="Where the input found is saved (default ./nndb-fuzz-stepN.pt).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the report as one JSON object (the script's own output goes to stderr).")
@click.argument("script", required=False, metavar="SCRIPT")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def fuzz(module, step, until, against, tolerance, budget, layers, seed, random_search, scale, threshold, save,
         as_json, script, args):
    """Run SCRIPT [ARGS]... (or -m MODULE) to training step N and fuzz the
    model with mutants of that step's batch on a replica (coverage-guided,
    TensorFuzz), then end the run.  Exit code 0 if nothing was found within
    the budget, 1 if the objective was reached (the report says how, and the
    input is saved), 2 on a usage error or when fuzzing could not be done
    (the script ended before step N, no model or loss seen), 130 at Ctrl-C."""
    from ..run.preload import maybe_restart
    maybe_restart("fork")
    import tempfile
    from .fuzz import command_line, run_fuzz_batch
    from ..run.launcher import prepare

    target = _target(module, script, args)
    line = command_line(click.get_current_context().params)
    try:
        prepare(target)
        report, code = run_fuzz_batch(target, step, line, as_json, tempfile.gettempdir())
    except NndbError as e:
        _fail(e)
    except KeyboardInterrupt:
        click.echo("nndb: fuzz interrupted", err=True)
        sys.exit(EXIT_SIGINT)
    if as_json:
        click.echo(to_json(report))
    elif report.get("error"):
        click.echo(printable(f"nndb: error: {report['error']}"), err=True)
    sys.exit(code)


@cli.command()
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--force", is_flag=True, help="Trust even the filesystem root, a top-level directory, "
                                            "a mount point or the home directory.")
def trust(directory, force):
    """Trust DIR (and the directories under it): nndb then reads DIR/.nndbrc
    at start (gdb's auto-load safe-path)."""
    from ..commands.trust import trust as add_trusted, trust_file
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
@click.option("--tensor", "tensor_spec", metavar="KIND:NAME",
              help="A whole tensor kept by --record-full, or a histogram, at --step.")
@click.option("--step", "tensor_step", type=int, metavar="N", help="With --tensor: the step.")
@click.option("--npy", "npy_path", metavar="OUT.npy", type=click.Path(dir_okay=False),
              help="With --tensor: write the kept tensor to OUT.npy (numpy's format).")
def inspect(trace, series_name, stat, kind, side_by_side, as_json, tensor_spec, tensor_step, npy_path):
    """Print a trace's metadata, step count and recorded tensors.  Given a
    run directory of a distributed job (one rank<R>.h5 per rank): the job's
    ranks, their steps and findings, the cross-rank findings, and each
    tensor's statistics merged across ranks (--ranks: side by side).  Exit
    code 0; 2 for an unreadable trace, or a directory that is not one whole
    job (empty, mixed jobs or scripts, a rank missing)."""
    from .inspect import inspect_text
    try:
        out = inspect_text(trace, series_name, stat, kind, side_by_side, as_json, tensor_spec, tensor_step,
                           npy_path)
    except NndbError as e:
        _fail(e)
    click.echo(out)


@cli.command("check-trace")
@click.argument("trace", metavar="TRACE")
@click.option("--rules", "rules", default="default", show_default=True, metavar="default|FILE.yaml",
              help="The rules to run: the built-in set or a YAML rule file, as for nndb run.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--fail-on", "fail_on", type=click.Choice(["warning", "error"]),
              help="Exit with code 4 if a finding (the run's or the re-check's) is this severe or worse.")
def check_trace(trace, rules, as_json, fail_on):
    """Run the diagnostic rules over a finished trace, as the live run did,
    and give the findings the live run stored with them, each marked with
    who found it ([run], [check-trace]).  Findings are printed as a live run
    prints them; rules that need the live run (its probes, optimizers) are
    named with the reason.  Exit code 0, or 4 if a rule with the fail action
    fired (or, with --fail-on, a finding that severe), 2 for an unreadable
    trace or rule file."""
    from ..render.offline import text
    from ..rules.catalog import load
    from ..rules.engine import RuleEngine
    from ..rules.offline import check_trace as run_rules
    from ..store.reader import TraceReader

    try:
        engine = load(rules) or RuleEngine([])
        with TraceReader(trace) as reader:
            result = run_rules(reader, engine)
    except NndbError as e:
        _fail(e)
    from ..rules.base import failing_findings
    click.echo(to_json(result.to_dict()) if as_json else text(result))
    failed = result.failed or failing_findings(result.all_findings(), fail_on)
    sys.exit(EXIT_FAIL_ACTION if failed else EXIT_OK)


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
    findings as text (TensorBoard) or tags (MLflow), each param group's
    learning rate at every step (hyper/OPT.groupG/lr), the run's parameters,
    the histograms (TensorBoard) and (MLflow) the trace as an artifact.  On
    a terminal a progress line shows on stderr.  Exit code 0; 2 for an
    unreadable trace or a store that refuses the export; 130 at Ctrl-C
    (the TensorBoard event files begun are removed, an MLflow run begun is
    marked KILLED)."""
    import os
    from ..debugger.progress import CountLine
    from ..export.scalars import trace_findings
    from ..export.targets import mlflow_target, tensorboard_target
    from ..store.reader import TraceReader

    line = None
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
                line = CountLine(printable(f"nndb: exporting to {t.label}"), "series and histograms") \
                    if _stderr_is_terminal() else None
                done = export_to(reader, t, findings, line.update if line else None)
                if line:
                    line.clear()
                hists = f", {done.histograms} histogram(s)" if done.histograms else ""
                click.echo(printable(f"nndb: exported {done.points} value(s) in {done.tags} tag(s){hists} and "
                                     f"{done.findings} finding(s) to {done.target}"))
    except NndbError as e:
        _fail(e)
    except KeyboardInterrupt:
        if line:
            line.clear()
        click.echo("nndb: export interrupted (Ctrl-C): the event files it had begun are removed; an MLflow run "
                   "begun is marked KILLED; exports finished before stay", err=True)
        sys.exit(EXIT_SIGINT)


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
    from ..extras import require
    from ..render.pictures import picture, stops_of_report
    from ..export.scalars import trace_findings
    from ..store.reader import TraceReader

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
        if _INTERRUPTED:
            # The script's KeyboardInterrupt (its traceback shown already)
            # ends the process as Python would have ended the script: Python
            # ends itself by SIGINT after its exit handlers (raised on out of
            # nndb, with a silent excepthook, Python does just that) -- but
            # exits 1 once torch._dynamo.utils is loaded (an optimizer loads
            # it): seen with torch 2.13 on Python 3.11, followed as seen.
            if "torch._dynamo.utils" in sys.modules:
                sys.exit(1)
            sys.excepthook = lambda *exc: None
            raise KeyboardInterrupt from None
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
        from ..frontends.batch import ScriptedFrontend
        return ScriptedFrontend([])
    if interactive:
        from ..frontends.repl import ReplFrontend
        return ReplFrontend()
    from ..frontends.batch import BatchFrontend
    return BatchFrontend()


def replica_main() -> None:
    """The entry point of a respawned replica (nndb.timetravel.respawn)."""
    import os
    from ..driver import DebugOptions, build_session
    from ..timetravel import respawn
    chan, msg = respawn.connect()
    if msg is None:
        os._exit(3)
    fe = _frontend(interactive=bool(msg.get("interactive")) and sys.stdin.isatty(),
                   scripted=bool(msg.get("scripted")))
    respawn.run(build_session(fe, DebugOptions(**respawn.session_options(msg))), chan, msg)
