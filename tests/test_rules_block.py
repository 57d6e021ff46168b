"""The every-step rules judged in blocks (nndb.rules.block): a block costs the same
few calls whatever its number of steps and tensors (issue 43: rules over the ring,
vectorised), and the history a block keeps is what step-by-step judgement keeps."""
import gc
import random
import sys
from types import SimpleNamespace

import numpy as np

from nndb.rules.base import StepContext
from nndb.rules.block import Block
from nndb.rules.stats_rules import RULES, LossNotDecreasing
from nndb.tracer.stats import N_RAW, RAW_ABS, RAW_INF, RAW_MAX, RAW_MIN, RAW_N, RAW_NAN, RAW_SQ, RAW_SUM, RAW_ZERO


def _names(layers: int) -> list:
    """A step's series: the loss, then each layer's weight and bias as gradient, value and update."""
    params = [f"fc{i}.{w}" for i in range(layers) for w in ("weight", "bias")]
    return [("loss", "loss")] + [(p, k) for k in ("grad", "param", "update") for p in params]


def _record(step: int, names: list, rng) -> SimpleNamespace:
    """A usual step's raw rows: counts, norms and NaN/Inf counts (the loss: its sum too)."""
    raw = np.full((len(names), N_RAW), np.nan)
    raw[:, RAW_N] = [1 if k == "loss" else 256 if n.endswith("weight") else 16 for n, k in names]
    raw[:, RAW_NAN] = raw[:, RAW_INF] = 0
    scale = {"grad": 0.1, "param": 1.0, "update": 1e-3}
    raw[:, RAW_SQ] = [(scale.get(k, 1.0) * (1 + 0.1 * rng.random())) ** 2 for _, k in names]
    raw[0, [RAW_SUM, RAW_MIN, RAW_MAX, RAW_ABS]] = 2.0 - 0.01 * step
    raw[0, RAW_ZERO] = 0
    return SimpleNamespace(step=step, names=names, raw=raw, time=0.0)


def _block_calls(layers: int, steps: int) -> tuple:
    """(Python calls the every-step rules' check_block make on one block of ``steps`` steps
    of a model of ``layers`` layers, what each returned), after 96 steps judged one by one."""
    rng = random.Random(0)
    names = _names(layers)
    rules = [cls() for cls in RULES if cls.EVERY_STEP]
    for r in rules:
        r.reset()
    for i in range(96):
        ctx = StepContext(_record(i, names, rng))
        for r in rules:
            list(r.check(ctx) or ())
    records = [_record(96 + i, names, rng) for i in range(steps)]
    block = Block.of(records, lambda rec: StepContext(rec))
    calls = [0]

    def count(frame, event, arg):
        if event == "call":
            calls[0] += 1
    # (no collection inside the count: a finaliser of another test's garbage, run by a
    # collection the block's allocations set off, counted 181 calls for 179 in CI)
    gc.collect()
    gc.disable()
    sys.setprofile(count)
    try:
        done = [r.check_block(block) for r in rules]
    finally:
        sys.setprofile(None)
        gc.enable()
    return calls[0], done


def test_a_block_makes_the_same_calls_whatever_its_steps_and_tensors():
    """Before, a block paid Python calls per step (the list of series compared by a generator,
    the loss history kept value by value: 2 x 31 of a bench MLP block's ~600 calls) and per
    tensor (zero_gradients looked at each bias beside its weight: one numpy reduction a bias)."""
    small, done = _block_calls(layers=2, steps=4)
    assert done == [True] * len(done)           # (every rule judged the whole block)
    assert _block_calls(layers=2, steps=31)[0] == small
    assert _block_calls(layers=12, steps=31)[0] == small


def test_the_loss_history_kept_by_a_block_is_the_one_kept_value_by_value():
    """LossNotDecreasing keeps every stride-th loss and halves what it kept at KEEP values
    (the stride doubles); a block's values go in as a slice while the stride stays."""
    rng = random.Random(1)
    keep, LossNotDecreasing.KEEP = LossNotDecreasing.KEEP, 64
    try:
        for _ in range(200):
            one, many = [[], 1, 0], [[], 1, 0]
            for _ in range(rng.randint(1, 30)):
                vals = [rng.random() for _ in range(rng.randint(1, 40))]
                for v in vals:
                    LossNotDecreasing._keep(one, v)
                LossNotDecreasing._keep_all(many, vals)
                assert many == one
    finally:
        LossNotDecreasing.KEEP = keep


def test_a_block_takes_what_each_step_s_context_takes():
    """The block finalises each statistic once for every series of every step (``column``)
    and the rules take their rows from it; a step's context finalises its own column: the
    same numbers, NaN where a parameter has no row, the rows with no finite element included."""
    from nndb.rules.series import Tensors, layout
    rng = random.Random(2)
    names = _names(3)[:-1]            # (the last bias without an update row)
    records = [_record(i, names, rng) for i in range(6)]
    records[2].raw[3, RAW_NAN] = records[2].raw[3, RAW_N]      # (a gradient all NaN)
    records[4].raw[5, RAW_INF] = 1
    records[3].raw[1, RAW_N] = 0                               # (an empty tensor)
    block = Block.of(records, lambda rec: StepContext(rec))
    own = Tensors()
    _, lay = block.layout(own)
    for kind in ("grad", "param", "update"):
        for stat in ("norm", "count", "inf_count", "zero_frac"):
            steps = np.stack([layout(StepContext(r), own)[1].take(StepContext(r), kind, stat) for r in records])
            np.testing.assert_array_equal(block.take(lay, kind, stat), steps)
    means = [StepContext(r).mean_of(int(lay.loss_rows[0])) for r in records]
    np.testing.assert_array_equal(block.loss_means(lay)[:, 0], means)


def test_steps_judged_in_a_block_read_the_module_classes_they_saw():
    """Steps wait in a block and are judged later, at the run's end for the last ones: by then
    the script may have replaced its model (word_language_model loads its best model into
    `model` after training).  The block's steps read the module classes of the run's end, where
    `encoder` (an nn.Embedding) was gone: the gradient rules took its table for a layer and
    found an exploding_gradient at step 22 that check-trace and a step-by-step judgement did not.
    Each waiting step keeps the classes it saw."""
    from nndb.rules.base import Rule
    from nndb.rules.engine import RuleEngine

    class Seen(Rule):
        id, EVERY_STEP, PROBES = "seen", True, ()

        def reset(self):
            self.types = {}

        def check(self, ctx):
            self.types[ctx.step] = ctx.module_types.get("encoder")
            return ()

    def module(name, kind):         # (a stand-in module: its class's name is the kind)
        m = type(kind, (), {})()
        m.name = name
        return m

    class Naming:
        roots_version = 1
        model = [module("encoder", "Embedding"), module("head", "Linear")]

        def roots(self):
            return [SimpleNamespace(named_modules=lambda: [(m.name, m) for m in self.model])]

        def module_name(self, m):
            return m.name

    rule, naming = Seen(), Naming()
    engine = RuleEngine([rule])
    engine.attach(SimpleNamespace(naming=naming, recorder=SimpleNamespace(step=0)))
    names = _names(1)
    for step in (21, 22, 23):
        assert engine.on_record(_record(step, names, random.Random(step)), defer=True) == []
    assert engine.waiting and rule.types == {}
    naming.model, naming.roots_version = [module("model2.encoder", "Embedding")], 2     # the model replaced
    engine.flush()
    assert rule.types == {21: "Embedding", 22: "Embedding", 23: "Embedding"}
