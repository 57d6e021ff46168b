"""The MLflow sink: ``MlflowClient`` (the ``mlflow`` extra; mlflow-skinny
is enough), imported when the sink is opened.

Metrics go out through ``log_batch`` in batches within MLflow's limits per
call; the run's parameters as params, the findings as tags
(``nndb.finding.N``, in order), the trace file as an artifact.  MLflow allows
letters, digits and ``_ - . / space`` in a key: any other character of a
tensor name (``act#2``) becomes ``_``.  A key is at most 250 characters.  A
key that had to change (a character replaced, or longer than that) keeps its
start and its last part (the statistic, ``/norm``) with a digest of the whole
tag between them (``act/act_2-1a2b3c4d5e/norm``,
``grad/deep.enc-1a2b3c4d5e/norm``), so that no two tags share a key: cut at
250, the ten statistics of a long name, and its weight's and bias's, were
one metric; ``act#2`` (a module's second call) and a module named ``act_2``
were one metric holding both layers' values at each step.
"""
from __future__ import annotations

import hashlib
import os
import re
import time

# MLflow's limits per log_batch call (mlflow.utils.validation): 1000 metrics,
# 100 params and tags together, 1000 entities in all; and of a key and values.
MAX_METRICS = 1000
MAX_PARAMS_TAGS = 100
MAX_KEY = 250
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 5000
FINDING_TAG = "nndb.finding."
ALLOW_FILE_STORE = "MLFLOW_ALLOW_FILE_STORE"
CONNECT_SECS = 3.0

_KEY_BAD = re.compile(r"[^A-Za-z0-9_\-./ ]")


def key(text: str) -> str:
    """An MLflow key for a tag or parameter name: one of at most MAX_KEY
    characters for each text (one that had to change: its start, a digest
    of the text, and its last ``/`` part)."""
    k = _KEY_BAD.sub("_", text).replace("..", "._").lstrip("/") or "_"
    if k == text and len(k) <= MAX_KEY:
        return k
    head, sep, tail = k.rpartition("/")
    tail = sep + tail if head and len(tail) < 40 else ""
    digest = "-" + hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    start = k[:min(len(k) - len(tail), MAX_KEY - len(digest) - len(tail))].rstrip("./ ")
    return start + digest + tail


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 3] + "..."


def _client(MlflowClient, uri):
    """A client of ``uri``.  A local file store (``./mlruns``, nndb's default:
    MLflow's own, sqlite, needs SQLAlchemy, which mlflow-skinny lacks) is
    refused by MLflow 3 unless MLFLOW_ALLOW_FILE_STORE is set: nndb sets it
    while the client opens its store, and puts it back."""
    if not (uri.startswith("file:") or "://" not in uri):
        return MlflowClient(tracking_uri=uri)
    old = os.environ.get(ALLOW_FILE_STORE)
    os.environ[ALLOW_FILE_STORE] = "true"
    try:
        client = MlflowClient(tracking_uri=uri)
        client.search_experiments(max_results=1)           # (the store opens here)
        return client
    finally:
        if old is None:
            os.environ.pop(ALLOW_FILE_STORE, None)
        else:
            os.environ[ALLOW_FILE_STORE] = old


def check_reachable(uri: str) -> None:
    """An HTTP tracking server that refuses connections fails here, at once,
    not after the client's minutes of retries."""
    import socket
    from urllib.parse import urlsplit
    if not uri.startswith(("http://", "https://")):
        return
    u = urlsplit(uri)
    port = u.port or (443 if u.scheme == "https" else 80)
    with socket.create_connection((u.hostname, port), timeout=CONNECT_SECS):
        pass


class MlflowSink:
    def __init__(self, tracking_uri: str, experiment: str = "nndb", run_name=None, tags=None):
        check_reachable(tracking_uri)
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.tracking import MlflowClient
        self._Metric, self._Param, self._RunTag = Metric, Param, RunTag
        self.client = _client(MlflowClient, tracking_uri)
        exp = self.client.get_experiment_by_name(experiment)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(exp_id, run_name=run_name,
                                             tags={key(k): _clip(v, MAX_TAG_VALUE) for k, v in (tags or {}).items()}
                                             ).info.run_id
        self._metrics: list = []
        self._others: list = []          # params and tags, MAX_PARAMS_TAGS a call
        self._findings = 0
        self.metrics_logged = 0

    def scalars(self, series) -> None:
        k = key(series.tag)
        M = self._Metric
        for step, value, wall in zip(series.steps.tolist(), series.values.tolist(), series.walltimes.tolist()):
            self._metrics.append(M(k, value, int(wall * 1000), step))
            if len(self._metrics) >= MAX_METRICS:
                self._send_metrics()

    def findings(self, step: int, lines: list, walltime=None) -> None:
        for line in lines:
            self._others.append(self._RunTag(f"{FINDING_TAG}{self._findings}",
                                             _clip(f"step {step}: {line}", MAX_TAG_VALUE)))
            self._findings += 1
        if len(self._others) >= MAX_PARAMS_TAGS:
            self._send_others()

    def params(self, params: dict, step: int = 0) -> None:
        for k, v in params.items():
            self._others.append(self._Param(key(k), _clip(str(v), MAX_PARAM_VALUE)))
        self._send_others()

    def artifact(self, path: str) -> None:
        self.client.log_artifact(self.run_id, path)

    def _send_metrics(self) -> None:
        batch, self._metrics = self._metrics[:MAX_METRICS], self._metrics[MAX_METRICS:]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)
            self.metrics_logged += len(batch)

    def _send_others(self) -> None:
        while self._others:
            batch, self._others = self._others[:MAX_PARAMS_TAGS], self._others[MAX_PARAMS_TAGS:]
            params = [x for x in batch if isinstance(x, self._Param)]
            tags = [x for x in batch if not isinstance(x, self._Param)]
            self.client.log_batch(self.run_id, params=params, tags=tags)

    def flush(self) -> None:
        while self._metrics:
            self._send_metrics()
        self._send_others()

    def close(self, status: str = "finished") -> None:
        self.flush()
        state = {"finished": "FINISHED", "killed": "KILLED", "interrupted": "KILLED",
                 "terminated": "KILLED"}.get(status, "FAILED")
        self.client.set_terminated(self.run_id, status=state, end_time=int(time.time() * 1000))

    def abort(self) -> None:
        """Stopped (Ctrl-C): what was sent stays; the run is marked KILLED."""
        self.close("interrupted")
