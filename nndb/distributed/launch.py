"""``nndb run --nproc-per-node N``: the worker's command line, the checks
before the job starts, the front's run and its report."""
from __future__ import annotations

import os
from typing import Callable, Optional

from ..errors import UsageError
from ..run.config import RunOptions
from ..run.launcher import prepare
from ..version import __version__
from .front import Front, LaunchOptions

# nndb run's flags a worker gets as they were given: (RunOptions field, flag, takes a value)
_PASSED = (("every", "--every", True), ("steps_range", "--steps", True), ("full_every", "--full-every", True),
           ("act_every", "--act-every", True), ("flush_steps", "--flush-every", True),
           ("flush_secs", "--flush-secs", True), ("quiet", "--quiet", False), ("rules", "--rules", True),
           ("force", "--force", False), ("nx", "--nx", False), ("lineage", "--lineage", True),
           ("fail_on", "--fail-on", True))
# ...and those a job of several ranks cannot take yet (one line each, before anything starts)
_NOT_YET = (("replica", "auto", "across ranks, time travel runs the whole job again and takes no checkpoints: --replica is not taken"),
            ("total_steps", None, "across ranks, time travel runs the whole job again and takes no checkpoints: --total-steps is not taken"),
            ("checkpoint_every", None, "across ranks, time travel runs the whole job again and takes no checkpoints: --checkpoint-every is not taken"),
            ("checkpoint_memory", None, "across ranks, time travel runs the whole job again and takes no checkpoints: --checkpoint-memory is not taken"))


def worker_argv(o: RunOptions, trace_path: Optional[str], commands: bool = True) -> list:
    """``nndb run --batch ...`` for every worker (the launcher puts ``python -u -m nndb`` before it);
    without ``commands``, no ``-x``/``-e`` (the job's prompt runs them: nndb.distributed.console)."""
    argv = ["run", "--batch"]
    for name, flag, valued in _PASSED:
        value = getattr(o, name)
        if valued and value is not None:
            argv += [flag, str(value)]
        elif not valued and value:
            argv.append(flag)
    for spec in o.exports:      # (each rank exports its own: nndb.export.targets.for_rank)
        argv += ["--export", spec]
    if trace_path:
        argv += ["--trace", trace_path]
    for f in o.command_files if commands else ():
        argv += ["-x", os.path.abspath(f)]
    for c in o.eval_commands if commands else ():
        argv += ["-e", c]
    if o.module:
        argv += ["-m", o.module]
        if o.script is not None:
            argv.append(o.script)
    else:
        argv.append(os.path.abspath(o.script))
    return argv + list(o.args)


def start_job(o: RunOptions, launch: LaunchOptions, target, frontend, trace_path: Optional[str],
              report_path: Optional[str], trace_dir: Optional[str], message: Callable[[str], None]) -> int:
    """``frontend``: the prompt's front end (None: batch mode)."""
    for name, default, why in _NOT_YET:
        if getattr(o, name) not in (default, None):
            raise UsageError(why)
    if launch.follower():
        if launch.hang_timeout:
            raise UsageError("--hang-timeout goes to node 0's nndb run: its watchdog sees every rank of every node")
        frontend = None                 # (the prompt is node 0's: its front controls every rank)
        if not o.quiet:
            message(f"nndb: node {launch.node_rank}: the job's prompt (or, in batch mode, its watchdog) is on "
                    f"node 0; the ranks here record their traces locally")
    if frontend is not None and launch.hang_timeout:
        raise UsageError("--hang-timeout goes with --batch (at the prompt, Ctrl-C shows a hung job's stacks)")
    prepare(target)                     # (a missing or broken script: one line here, no worker started)
    from ..export.targets import parse_spec
    for spec in o.exports:      # (the extra missing, a directory not writable: one line here)
        parse_spec(spec)
    front = Front(target, launch, message)
    try:
        if frontend is None:
            code = front.run(worker_argv(o, trace_path), trace_dir)
        else:
            from .console import Console
            from ..commands.rcfiles import startup_lines
            # -x and -e run at the job's prompt, as if typed there, across the ranks (each rank ran
            # them on its own: '--ranks all' was refused, and 'kill' ended the job unseen)
            startup = [q.text for q in startup_lines(list(o.command_files), list(o.eval_commands), True, message)]
            argv = worker_argv(o, trace_path, commands=False)
            argv.remove("--batch")      # (the ranks' sessions are interactive, through the front)
            if o.go:
                argv.insert(1, "--run")
            code = Console(front, frontend, message).run(argv, trace_dir, trace_path, startup)
    finally:
        front.close()
    code = _fail_on_across_ranks(front, o.fail_on, code, message)
    if front.state.run_dir and not o.quiet:
        message(f"nndb: traces of the {launch.nproc_per_node} rank(s) in {front.state.run_dir}")
    if report_path:
        from ..render import report
        report.write(report_path, job_report(front, target, code))
    return code


def _fail_on_across_ranks(front: Front, fail_on: Optional[str], code: int, message: Callable[[str], None]) -> int:
    """``--fail-on``: a finding of the rules across ranks (judged in the front, no rank's own) that
    severe fails the job as a rank's own finding fails its rank (exit code 4, the first named), as
    in one process over the script's own exit code; a job the watchdog, Ctrl-C, SIGTERM or a
    refusal ended keeps its code, and so does one a rank failed with exit code 4 already."""
    from ..errors import EXIT_OK, EXIT_SCRIPT_ERROR, EXIT_FAIL_ACTION
    from ..rules.base import failing_findings
    if code not in (EXIT_OK, EXIT_SCRIPT_ERROR) or front.judge is None:
        return code
    failing = failing_findings([f.as_dict() for f in front.judge.findings], fail_on)
    if not failing:
        return code
    first = failing[0]
    message(f"nndb: --fail-on {fail_on}: {first['severity']} {first['rule']} at step {first['step']} "
            f"(across ranks) (exit code {EXIT_FAIL_ACTION})")
    return EXIT_FAIL_ACTION


def job_report(front: Front, target, code: int) -> dict:
    from ..text import json_value
    reason = ("the job hung" if front.state.hang is not None else
              front.state.refused if front.state.refused else f"exit code {code}")
    return json_value(dict({"nndb_report": 1, "nndb_version": __version__,
                            "script": target.path or f"-m {target.module}", "argv": list(target.args),
                            "exit": {"code": code, "reason": reason}}, **front.report()))
