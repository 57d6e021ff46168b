"""``nndb inspect``: one trace (its summary, one tensor's history, a kept
whole tensor) or a distributed job's run directory, as text or JSON.  The
command line (nndb.cli) parses the flags; this answers them."""
from __future__ import annotations

import os
from typing import Optional

from ..errors import UsageError
from ..text import to_json


def inspect_text(trace: str, series_name: Optional[str], stat: str, kind: Optional[str], side_by_side: bool,
                 as_json: bool, tensor_spec: Optional[str], tensor_step: Optional[int],
                 npy_path: Optional[str]) -> str:
    from ..api import inspect as queries
    from ..render import text
    from ..store.reader import TraceReader

    if (tensor_step is not None or npy_path) and not tensor_spec:
        raise UsageError("--step and --npy go with --tensor KIND:NAME")
    if os.path.isdir(trace):
        if series_name or kind or tensor_spec:
            raise UsageError("--series, --kind and --tensor go with a trace, not a run directory")
        from ..rules.crossrank import judge_rundir
        from ..store.job import job_summary, open_job
        with open_job(trace) as job:
            data = job_summary(job, judge_rundir(job), ranks=side_by_side)
        return to_json(data) if as_json else text.job(data)
    if side_by_side:
        raise UsageError("--ranks goes with a run directory (RUNDIR), not one trace")
    with TraceReader(trace) as reader:
        if tensor_spec:
            if tensor_step is None:
                raise UsageError("--tensor needs --step N")
            data = queries.tensor_at(reader, tensor_spec, tensor_step, npy_path)
            return to_json(data) if as_json else text.tensor_at(data)
        if series_name:
            data = queries.series(reader, series_name, stat, kind)
            return to_json(data) if as_json else text.series(data)
        if kind:
            raise UsageError("--kind goes with --series")
        data = queries.summary(reader)
        return to_json(data) if as_json else text.summary(data)
