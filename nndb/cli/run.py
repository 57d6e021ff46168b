"""``nndb run``: SCRIPT under the debugger.  The flags become one
RunOptions (nndb.run.config), built here once and handed to everything
below: the run's setup (nndb.cli.setup), a distributed job
(nndb.distributed.launch), the notebook's ``%nndb run`` (nndb.cli.magics,
which parses its line with this same command)."""
from __future__ import annotations

import os
import sys

import click

from ..errors import EXIT_SIGINT, NndbError, UsageError
from ..run.config import RunOptions
from .common import (SCRIPT_CONTEXT, Number, ScriptCommand, fail, message, session_frontend,
                     stderr_is_terminal, target_of)
from .setup import full_rules, launch_options, own_paths, run_setup


@click.command("run", cls=ScriptCommand, context_settings=SCRIPT_CONTEXT,
               short_help="Run SCRIPT under the debugger, recording a trace of its steps.")
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
              help="With --record-full: every N-th step (default: every step), of the steps recorded.")
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
def run(**_):
    """Run SCRIPT [ARGS]... (or -m MODULE [ARGS]...) under the debugger, as
    Python would, recording per-step tensor statistics into an HDF5 trace.
    Everything after SCRIPT is passed to the script untouched.  It stops at
    the start of step 0 with the (nndb) prompt unless --run, --batch, or
    stdin is not a terminal."""
    o = run_options(click.get_current_context())
    from ..run import rank as job
    if o.nproc_per_node is None and not job.place().in_job:     # (no time travel across ranks yet)
        from ..run.preload import maybe_restart
        maybe_restart(o.replica)        # (fork replicas: Intel's OpenMP runtime; returns if not)
    target = target_of(o.module, o.script, o.args)
    where = job.place()
    trace_path, report_path, batch, replica = o.trace_path, o.report_path, o.batch, o.replica
    link = None
    try:
        launch = launch_options(o)
        if where.in_job and trace_path:
            trace_path = job.rank_trace(trace_path, where, create=True)     # (never one file for all ranks)
        if where.in_job and report_path:
            report_path = job.rank_trace(report_path, where)
        from ..run.config import RecordSchedule
        RecordSchedule.parse(o.every, o.steps_range, o.full_every, o.act_every)    # (a bad value fails before any rank)
        full_rules(o.record_full, o.full_tensors_every, o.precision, o.full_tensors_buffer)
        rank_dir = launch is not None and trace_path and job.is_trace_dir(trace_path)
        paths = own_paths(target, None if rank_dir else trace_path, o.force, report_path, o.command_files, o.rules)
        if rank_dir:            # (each rank writes DIR/rank<R>.h5 in it, as under torchrun)
            paths = (job_trace_dir(trace_path),) + tuple(paths[1:2]) + (None,)
        if launch is not None:
            from ..distributed.launch import start_job
            interactive = not (batch or not sys.stdin.isatty())
            sys.exit(start_job(o, launch, target, _console_frontend() if interactive else None, *paths, message))
        from ..driver import debug     # (torch: after the checks above)
        off_reason = None
        if where.in_job:
            from ..distributed.worker import FrontLink
            if not batch and sys.stdin.isatty() and where.rank == 0 and "NNDB_FRONT_SOCKET" not in os.environ:
                message(f"nndb: rank 0 of {where.world_size} under torchrun: no prompt on any rank (batch "
                        f"mode); for the debugger across ranks use nndb run --nproc-per-node N")
            batch = True                # (ranks never prompt on their own)
            replica, off_reason = "off", "a rank keeps no checkpoints: across ranks, time travel runs the job again"
            link = FrontLink.connect(target)
            _replica_job_sandbox()
        agreement, frontend = None, None
        if link is not None and link.interactive:
            from ..distributed.allstop import StepAgreement
            from ..distributed.worker import RemoteFrontend
            batch, agreement, frontend = False, StepAgreement(), RemoteFrontend(link)
            link.agreement = agreement
        else:
            batch = batch or not sys.stdin.isatty()
        config, options = run_setup(o, target, batch, stderr_is_terminal() and not where.in_job, paths,
                                    nndb_argv=given_options(run, o), replica=replica,
                                    replica_off_reason=off_reason, companions=(link,) if link else (),
                                    agreement=agreement)
        config.ends_as_python = link is None        # (a rank under the front exits with the code it records)
        say = message
        if frontend is None and where.in_job and where.world_size > 1:
            # the ranks of a job in batch mode share the terminal: each of nndb's lines says whose
            # it is, as the job's prompt says it ('[r1] Watchpoint 1: ...'); the script's own
            # output is as torchrun shows it
            from ..frontends.batch import BatchFrontend, prefixed
            tag = f"[r{where.rank}] "
            frontend = BatchFrontend(prefix=tag)

            def say(text: str) -> None:
                message(prefixed(tag, text))
        result = debug(config, options, frontend or session_frontend(interactive=not batch), say)
    except NndbError as e:
        if link is not None:
            link.done(e.exit_code, str(e))
        fail(e)
    if link is not None:
        link.done(result.exit_code, result.reason)
    if result.exit_code == EXIT_SIGINT and link is None:
        INTERRUPTED.append(True)        # (nndb.cli.main ends as Python would)
    elif result.stranded:
        # a run ended at the prompt or by SIGTERM: threads of the script waiting on its loop
        # would keep Python from exiting (returns when they end by themselves)
        from ..run.leftover import JOIN_S, end_without
        term = result.run is not None and result.run.status == "terminated"
        end_without(result.stranded, result.exit_code, message, wait_s=0.0 if term else JOIN_S,
                    how="terminated (SIGTERM)" if term else "ended at the prompt")
    sys.exit(result.exit_code)


def _replica_job_sandbox() -> None:
    """A replica job's rank (predict, reverse-continue across ranks) leaves the user's files as
    they are: the script's writes go to scratch copies (its snapshot.pt, its logs), as in a
    replica of one process; its job's directory (traces, logs) is nndb's own."""
    from ..distributed.worker import REPLICA_JOB_ENV
    job_dir = os.environ.get(REPLICA_JOB_ENV)
    if not job_dir:
        return
    import atexit
    from ..timetravel import sandbox
    sandbox.OWN.append(os.path.abspath(job_dir))
    sandbox.enter()
    atexit.register(sandbox.cleanup)


INTERRUPTED: list = []      # nndb run ended by a KeyboardInterrupt (the script's own, or Ctrl-C)


def run_options(ctx: click.Context) -> RunOptions:
    """The command line ``ctx`` parsed, as the one RunOptions of the run."""
    given = tuple(p.name for p in ctx.command.params
                  if ctx.get_parameter_source(p.name) == click.core.ParameterSource.COMMANDLINE)
    return RunOptions(**ctx.params, given=given)


def parse_run_line(words: list, prog: str):
    """``nndb run``'s arguments parsed by its own command, outside the CLI
    (``%nndb run``): (RunOptions, Target), None after --help (printed); a
    bad line is a UsageError."""
    try:
        ctx = run.make_context(prog, list(words))
        with ctx:                   # (an unknown option that reaches SCRIPT is told through the context)
            o = run_options(ctx)
            return o, target_of(o.module, o.script, o.args)
    except click.exceptions.Exit:
        return None
    except click.ClickException as e:
        raise UsageError(e.format_message()) from None


def given_options(command: click.Command, o: RunOptions) -> tuple:
    """nndb's options as the command line gave them (``--every 2 --rules none``),
    in the command's order; not SCRIPT and its arguments."""
    out = []
    for param in command.params:
        if not isinstance(param, click.Option) or param.name not in o.given:
            continue
        flag = max(param.opts, key=len)
        value = getattr(o, param.name)
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
