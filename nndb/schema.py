"""The nndb trace schema, version 1.  One HDF5 file per run (per rank).

::

    /                         attrs: nndb_format = "nndb-trace", schema_version = 1
    ├── meta                  uint8[]      UTF-8 JSON object: the run's metadata (written at start)
    ├── series                uint8[...]   UTF-8 JSON lines, one per series, in id order:
    │                                      {"id": int, "name": str, "kind": str[, "shape": [int]]
    │                                      [, "local_shape": [int]]}
    │                                      (shape: the tensor's, on param, grad and update series;
    │                                      absent in traces written before it was recorded;
    │                                      local_shape: this rank's shard of a DTensor (FSDP)
    │                                      parameter, whose rows describe the shard only)
    ├── steps/
    │   ├── step              int64[N]     step number of each recorded row (rows follow the
    │   │                                  recording schedule, so steps may have gaps)
    │   ├── time              float64[N]   seconds since the run started, at the step's end
    │   ├── backward_count    int32[N]     backward() passes in the step
    │   ├── optimizer_steps   int32[N]     optimizer.step() calls in the step
    │   └── partial           uint8[N]     1 if the run ended inside this step (the script raised
    │                                      or exited before the step's end): what it did so far
    ├── stats                 float64[N, S, 10]
    │                                      stats[i, j] = statistics of series j at row i,
    │                                      columns as attrs["columns"] (STAT_NAMES);
    │                                      NaN where series j has no value at row i
    │                                      (chunks of 16 rows and 16 series (STATS_CHUNK), deflated:
    │                                      a NaN costs next to nothing)
    ├── committed             int64[16]    the lengths a reader trusts, attrs["names"] (COMMITTED):
    │                                      rows of stats and steps/*, bytes of series, events, end,
    │                                      optimizers, hyper, rows of lineage/*, bytes of
    │                                      lineage/sequences, bytes of full/index and elements of
    │                                      full/u16, full/f32, full/f64, rows of hist/*, bytes of
    │                                      fingerprints, modules, clips; written after each block's
    │                                      data (absent in traces written before it: the shortest
    │                                      extent; a reader takes each length by its name)
    ├── fingerprints          uint8[...]   UTF-8 JSON lines at the observed steps: input, parameter and
    │                                      BatchNorm checksums, data/compute/forward time (nndb.tracer.fingerprint;
    │                                      absent in older traces)
    ├── optimizers            uint8[...]   UTF-8 JSON lines, written at a recorded step's end when they
    │                                      changed: {"step": int, "optimizers": [{"name": str,
    │                                      "family": str, "groups": [[parameter name, ...], ...]}, ...]
    │                                      | null}: the optimizers from that step on, in the order the
    │                                      rules get them, their class names ("family": absent in traces
    │                                      written before it) and the parameters of each param group
    │                                      (null: no longer known)
    ├── hyper                 uint8[...]   UTF-8 JSON lines, written when one changed: {"step": int,
    │                                      "optimizer": str, "group": int, "lr": float | null[,
    │                                      "weight_decay", "momentum": float | null, "betas": [b1, b2]]}:
    │                                      a param group's hyper-parameters from that step on (null: not
    │                                      a number, or a tensor on an accelerator; absent: the group has
    │                                      none, or a trace written before they were kept: lr alone)
    │                                      (optimizers and hyper: absent in traces written before them)
    ├── modules               uint8[...]   UTF-8 JSON lines, written at a recorded step's end when a root
    │                                      module was added: {"step": int, "modules": [module name, ...]}:
    │                                      the model's modules in registration order (absent in older traces)
    ├── clips                 uint8[...]   UTF-8 JSON lines, written at a recorded step's end when they
    │                                      changed: {"step": int, "clips": {series name: [max_norm |
    │                                      null, scaled: bool]} | null}: each clip_grad_norm_ call's
    │                                      max_norm and whether a GradScaler had not unscaled its
    │                                      gradients yet (absent in older traces)
    ├── events                uint8[...]   UTF-8 JSON lines: {"time", "step", "kind", "message"[,
    │                                      "detail"]}, kind one of EVENT_KINDS (warnings such as a
    │                                      recording that stopped) or RECORD_KINDS (a rule's finding,
    │                                      a debugger stop: "detail" is the report's object for it; a
    │                                      change made at a stop: "detail" {"line", "step", "place"}; what
    │                                      the loss is, kind "loss_kind": "detail" {"step", "kind", "where"});
    │                                      step: the step in progress (of a record: its step), or null
    ├── lineage/              the operations of the steps whose lineage was recorded (nndb.lineage)
    │   ├── step              int64[L]     a step with lineage
    │   ├── seq               int64[L]     its operation sequence: a line number of ``sequences``
    │   └── sequences         uint8[...]   UTF-8 JSON lines, one per distinct sequence (a step that
    │                                      repeats an earlier one's is stored once):
    │                                      {"ops": [[op, phase, [input ids], [output ids], [shapes],
    │                                      [dtypes], module, file, line, autograd node], ...],
    │                                      "labels": {id: "param NAME" | "act MODULE" | "loss" | "input"},
    │                                      "nonfinite": [op index ...], "echoes": {op index: the
    │                                      forward op index whose own backward it is}}   (ids: per step)
    │                                      (absent in traces written before lineage existed)
    ├── full/                 whole tensors kept by ``--record-full`` (absent in older traces)
    │   ├── index             uint8[...]   UTF-8 JSON lines, one per stored tensor: {"name", "kind"
    │   │                                  (FULL_KINDS), "step", "shape": [int], "dtype" (the
    │   │                                  tensor's, "float32"), "asked" and "used" (the precision
    │   │                                  asked for and the one stored: nndb.store.precision),
    │   │                                  "scale" (fp16: the values were divided by it), "store"
    │   │                                  (u16 | f32 | f64), "offset", "count" (its elements there)}
    │   ├── u16               uint16[...]  fp16 and bf16 elements, as their bits
    │   ├── f32               float32[...] fp32 elements
    │   └── f64               float64[...] fp64 elements (a float64 tensor fp32 cannot hold)
    ├── hist/                 histograms at full steps (absent in older traces)
    │   ├── step              int64[H]     the step of each histogram row
    │   └── counts            int64[H, S, HIST_BINS]  counts[i, j]: series j's histogram at
    │                                      row i (bins: nndb.histogram), -1 where it has none
    └── end                   uint8[...]   UTF-8 JSON object, written when the run ends:
                                           {"status", "exit_code", "reason", "steps", "last_step",
                                           "end_time"}, status one of STATUSES
                                           ("steps": the rows written, a partial one included;
                                           "last_step": the last row's step)
                                           (empty while running or after a kill)

Series kinds (``KINDS``): ``param``, ``grad``, ``update``, ``act``, ``loss``.

Every dataset is created before the file enters HDF5's SWMR mode; afterwards
the writer only resizes and appends, and flushes in batches (each block's
data, then ``committed``), so the file can be read (``swmr=True``) while the
run writes it, after the writer was killed, and after its disk filled up, up
to the last committed block.  JSON is the only serialisation used: nothing
in a trace is ever unpickled.  The version is bumped on any change a reader
of the previous version would misread; readers refuse newer versions.  Added
datasets and JSON keys are not such a change (a reader ignores what it does
not know, and reads a trace without them as written before them): ``shape``,
``optimizers``, ``hyper``, ``fingerprints``, the series' ``local_shape`` and the root's
rank attributes came that way, for the rules on a trace
(nndb.rules.offline), and ``committed`` and the compression of ``stats``,
and ``full/`` and ``hist/`` (whole tensors and histograms; their lengths are
new names in ``committed``).  HDF5's SWMR mode allows no new dataset once it
has started, so the whole tensors of every series share the ``full/`` data
datasets, created at open, and the index says where each one is.

This module owns the trace's vocabulary (the statistics, series kinds, end
statuses and event kinds) and imports nothing from nndb: the tracer below
it and everything above read the names from here.
"""
from __future__ import annotations

FORMAT = "nndb-trace"
SCHEMA_VERSION = 1

# The statistics of a series at a row: the columns of ``stats``, in order.
STAT_NAMES = ("count", "mean", "std", "min", "max", "norm", "mean_abs",
              "nan_count", "inf_count", "zero_frac")
COLUMNS = STAT_NAMES
N_STATS = len(STAT_NAMES)
# The statistics that count elements: whole numbers, shown whole at any size (a float's text
# gives a magnitude 4 significant digits: nndb.text.fmt)
COUNT_STATS = ("count", "nan_count", "inf_count")

KINDS = ("param", "grad", "update", "act", "loss")
# A ``grad`` series of no parameter: what ``torch.nn.utils.clip_grad_norm_`` returned in
# the step, the gradients' total norm before it clipped them (a step that calls it twice:
# ``clip_grad_norm_#2`` too).  The parameters' gradients are recorded as the optimizer
# applies them, after clipping, so that a gradient growing out of range under clipping
# shows here alone (nndb.rules.gradient_norms.ExplodingGradient reads it).  A one-element
# row: its norm, mean, min and max are the returned value.
CLIP_SERIES = "clip_grad_norm_"


def module_of_series(name: str, kind: str):
    """The module a series belongs to, as the trace's ``modules`` rows name it: an
    activation's module (a later call's ``#N`` left off), the name before a parameter's
    last dot for its value, gradient and update; None for a root's own parameter, a loss
    and a clip's total."""
    if kind == "act":
        return name.split("#", 1)[0]
    if kind in ("param", "grad", "update"):
        return name.rpartition(".")[0] or None
    return None


# The order the kinds' rows are listed in (``stats``, ``nndb inspect``): each kind's rows
# in the model's order (the loss, what the forward made, then the parameters).
KIND_ORDER = {"loss": 0, "act": 1, "param": 2, "update": 3, "grad": 4}


def model_order(pairs, modules, by_kind: bool = False) -> list:
    """The indexes of ``pairs`` ((name, kind) of series) in the model's order: by their
    module's place in ``modules`` (module names, the model's order; a root's own
    parameters, the loss and the clips' totals at the root, a series of no module known
    after the others), with ``by_kind`` by KIND_ORDER first, the activations then as
    given (the order of the calls, which registration need not be: a dropout declared
    beside another); as given where they tie."""
    place: dict = {}
    for n in modules:
        place.setdefault(n, len(place))
    end, last = len(place), len(KIND_ORDER)

    def key(i):
        name, kind = pairs[i]
        m = module_of_series(name, kind)
        at = place.get(m, 0 if m is None else end)
        if by_kind:
            return (KIND_ORDER.get(kind, last), 0 if kind == "act" else at, i)
        return (at, i)
    return sorted(range(len(pairs)), key=key)


def default_stat(kind) -> str:
    """The statistic shown where none is named: a loss's value (its mean: the one number a
    scalar loss is, with its sign: a policy gradient's or a log-likelihood's loss goes below 0),
    any other series' norm."""
    return "mean" if kind == "loss" else "norm"

# The words a user types for a kind, in the order they are listed: "weight"
# is kept beside "param" because that is what people call a parameter.
KIND_WORDS = {"grad": "grad", "weight": "param", "param": "param", "update": "update",
              "act": "act", "loss": "loss"}

# How a run ended (``end``'s status).  "killed": nndb ended it (the debugger's
# kill or run, or nndb check after its steps).  A reader of version 1 only shows the status, so adding one needs
# no version bump.  A trace without ``end`` reads as INCOMPLETE.
STATUSES = ("running", "finished", "failed", "interrupted", "terminated", "killed")
INCOMPLETE = "incomplete"

# What ``events`` records: the tracer stopped recording after an internal
# error; a rule or a probe failed and was switched off; a step of one optimizer's first
# step alone, which came after the step of its iteration had closed (steps_joined).
EVENT_KINDS = ("recording_stopped", "rule_disabled", "probe_disabled", "full_tensors_skipped", "steps_joined")
# What ``events`` also keeps of a debugger session (an addition to version 1:
# a reader of version 1 shows them as events): a rule's finding and a stop,
# each with a "detail" object, the one the session report (docs/report.md)
# holds for it; a change made at a stop of the live run (set, set --hold,
# unset, py: nndb.debugger.changes.Change.as_dict()); what the loss is, where
# it is not meant to go down (a policy-gradient surrogate, a moving target:
# nndb.rules.loss_watch), written once per kind by the loss probe.  TraceReader.events()
# leaves them out; .records(kind) reads them.
RECORD_KINDS = ("finding", "stop", "change", "loss_kind")
# The hyper-parameters of a param group that the ``hyper`` rows keep, as the readers name
# them (``nndb inspect --series NAME``, ``history NAME``, the exports' hyper/OPT.groupG/NAME):
# betas are beta1 and beta2 (an Adam's beta1 is what OneCycleLR cycles as its momentum)
HYPER_NAMES = ("lr", "weight_decay", "momentum", "beta1", "beta2")

# Chunk shapes: a ``stats`` chunk holds 16 steps of 16 series (20 KiB before
# compression).  HDF5 pays about 50 us a chunk besides compressing it (with
# one step a chunk, writing the trace cost ~70 us a step on the 0.7 ms MLP
# step, with 4 steps of 64 series about 40), and it deflates a chunk whole,
# the series past the dataset's width included: 16 series wide, a run of 25
# series deflates 32 columns a row where 64 wide it deflated 64 (the bench
# MLP's writer: 30% less CPU, 6% fewer bytes; 60 series: the same as 4x64;
# docs/performance.md).  A compressed chunk written part-full is written anew
# when it fills (SWMR mode reuses no space; a flush per step once wasted 80%
# of the file), so a flush on time (--flush-secs: steps that outlast it flush
# at every step) writes whole chunks and holds the last few steps back
# (blocks.whole_chunks): at most HOLD_SECS, after which a chunk is written
# part-full, once.  The other flushes (--flush-every N steps, a checkpoint's
# fork, a reader, the end) write every step: one part-full chunk each at
# most.  A series' history reads one chunk per 16 steps.
STATS_CHUNK = (16, 16, N_STATS)
# ``stats`` is stored deflated (level 1): a statistic that was not measured
# (NaN), and a series absent at a row, cost next to nothing on disk.  Not
# shuffled: the rows are mostly runs of the same 8-byte NaN, which deflate
# finds as they are; on 500-step blocks of the benchmark's traces the
# shuffle cost 37-50% more writer time and 31-37% more bytes (MLP 13.5 ms
# and 403 B/step against 9.9 ms and 308; CNN 19.1 ms and 749 against 12.8
# and 547).  A reader needs nothing new: deflate is HDF5's own filter.
STATS_FILTERS = {"compression": "gzip", "compression_opts": 1}

# The root attributes of a rank's trace under torchrun (the same values are in meta).
RANK_ATTRS = ("rank", "world_size", "local_rank", "job_id")

# The lengths a reader trusts (``committed``, written after each block's data):
# the rows of ``stats`` and ``steps/*``, the rows of ``lineage/step`` and
# ``lineage/seq``, and the bytes of each JSON blob.
COMMITTED = ("rows", "series", "events", "end", "optimizers", "hyper", "lineage", "lineage/sequences",
             "full/index", "full/u16", "full/f32", "full/f64", "hist", "fingerprints", "modules", "clips")

# Full-tensor history (``full/``): the kinds whose whole tensors can be kept,
# the precisions a user asks for (nndb.store.precision has the error bounds),
# and the flat data datasets (one per stored element type; an index line says
# where each tensor's elements are).  Chunks of 4 Ki elements, shuffled and
# deflated (gzip, which every HDF5 tool reads): a tensor's read touches only
# the chunks that hold it.  Small chunks, because a flush rewrites the last,
# partly filled chunk, and HDF5 writes a compressed chunk that grew anew (the
# old space is lost): at most one chunk per flush is lost that way.
FULL_KINDS = ("param", "grad", "act")
# The precisions a user may ask for (nndb.store.precision: fp64 is only ever a fallback).
FULL_PRECISIONS = ("fp16", "bf16", "fp32")
FULL_DATA = {"u16": "u2", "f32": "f4", "f64": "f8"}
FULL_CHUNK = (1 << 12,)
FULL_FILTERS = {"compression": "gzip", "compression_opts": 1, "shuffle": True}
# Histograms (``hist/``): N_BINS counts per series at each full step
# (nndb.histogram has the bins); -1 where a series has none at that row.
HIST_BINS = 200
HIST_CHUNK = (1, 16, HIST_BINS)
HIST_FILTERS = {"compression": "gzip", "compression_opts": 1, "shuffle": True}
# Bytes kept free for HDF5's metadata beside a block's data (the room check).
ROOM_MARGIN = 256 * 1024
STEPS_CHUNK = (1024,)
BLOB_CHUNK = (4096,)


def series_label(name: str, kind: str) -> str:
    """A series as messages name it: ``grad fc1.weight``, and the loss
    ``loss`` (not ``loss loss``); ``loss/d`` for a second loss."""
    return name if kind == "loss" and name.startswith("loss") else f"{kind} {name}"
