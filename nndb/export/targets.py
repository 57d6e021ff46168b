"""Where an export goes: ``tensorboard:DIR`` or ``mlflow[:TRACKING_URI]``,
checked before anything runs (the extra installed, the directory writable),
and the sink opened for it."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from ..errors import UsageError
from ..extras import require

KINDS = ("tensorboard", "mlflow")


@dataclass(frozen=True)
class ExportTarget:
    kind: str                        # tensorboard | mlflow
    where: Optional[str]             # the log directory (absolute), or the tracking URI
    experiment: str = "nndb"
    run_name: Optional[str] = None

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.where}" if self.where else self.kind

    def with_suffix(self, suffix: str) -> "ExportTarget":
        """The target of a later run of the same session (``run``): a
        directory of its own, or a run of its own."""
        if self.kind == "tensorboard":
            return ExportTarget(self.kind, self.where + suffix, self.experiment, self.run_name)
        return ExportTarget(self.kind, self.where, self.experiment, (self.run_name or "nndb") + suffix)

    def for_rank(self, rank: int) -> "ExportTarget":
        """One rank's part of a job of several: DIR/rank<R>, or the run <name>-rank<R>."""
        if self.kind == "tensorboard":
            return ExportTarget(self.kind, os.path.join(self.where, f"rank{rank}"), self.experiment, self.run_name)
        return ExportTarget(self.kind, self.where, self.experiment, f"{self.run_name or 'nndb'}-rank{rank}")

    def open(self):
        if self.kind == "tensorboard":
            from .tensorboard import TensorBoardSink
            return TensorBoardSink(self.where)
        from .mlflow import MlflowSink
        return MlflowSink(self.where, self.experiment, self.run_name)


def tensorboard_target(directory: str, command: str) -> ExportTarget:
    require("tensorboard", command)
    if not directory:
        raise UsageError(f"{command} needs a directory")
    d = os.path.abspath(directory)
    if os.path.exists(d) and not os.path.isdir(d):
        raise UsageError(f"cannot export to {directory}: it is a file, not a directory")
    parent = d
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"cannot export to {directory}: {parent} is not writable")
    return ExportTarget("tensorboard", d)


def mlflow_target(uri: Optional[str], command: str, experiment: str = "nndb",
                  run_name: Optional[str] = None) -> ExportTarget:
    require("mlflow", command)
    return ExportTarget("mlflow", uri or default_tracking_uri(), experiment or "nndb", run_name)


def default_tracking_uri() -> str:
    """MLFLOW_TRACKING_URI, else a file store in ./mlruns: MLflow's own default
    (sqlite) needs SQLAlchemy, which mlflow-skinny does not install."""
    return os.environ.get("MLFLOW_TRACKING_URI") or "file:" + os.path.abspath("mlruns")


def parse_spec(spec: str) -> ExportTarget:
    """``nndb run --export``'s value: ``tensorboard:DIR`` or ``mlflow[:URI]``
    (everything after the first colon is the directory or URI)."""
    kind, _, where = spec.partition(":")
    command = f"nndb run --export {kind}"
    if kind == "tensorboard":
        if not where:
            raise UsageError("--export tensorboard needs a directory: --export tensorboard:DIR")
        return tensorboard_target(where, command)
    if kind == "mlflow":
        return mlflow_target(where or None, command)
    raise UsageError(f"unknown export {spec!r}: tensorboard:DIR or mlflow[:TRACKING_URI]")
