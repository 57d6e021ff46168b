"""The step boundary rules of nndb.tracer.stepclock, event by event."""
from nndb.tracer.stepclock import Mode, StepClock


class Opt:
    pass


def test_single_optimizer_closes_at_each_step_return():
    c, a = StepClock(), Opt()
    closes = []
    for _ in range(3):
        assert c.backward_end(1) is None           # backward never ends a step here
        assert c.optimizer_pre(a, 1) is None
        closes.append(c.optimizer_post(a))
    assert [x.step for x in closes] == [0, 1, 2]
    assert all(x.retro is None for x in closes)
    assert c.mode is Mode.SINGLE


def test_gradient_accumulation_is_one_step_per_optimizer_step():
    c, a = StepClock(), Opt()
    steps = []
    for _ in range(2):
        for _ in range(4):
            assert c.backward_end(1) is None
        c.optimizer_pre(a, 1)
        steps.append(c.optimizer_post(a).step)
    assert steps == [0, 1]


def test_gan_iteration_is_learnt_and_step0_closed_retroactively():
    c, d, g = StepClock(), Opt(), Opt()
    assert c.optimizer_pre(d, 2) is None
    assert c.optimizer_post(d) is None
    assert c.optimizer_pre(g, 2) is None
    assert c.optimizer_post(g) is None
    first = c.optimizer_pre(d, 2)                  # D steps again: the iteration was [D, G]
    assert first.step == 0 and first.retro == 2
    assert c.optimizer_post(d) is None
    c.optimizer_pre(g, 2)
    assert c.optimizer_post(g).step == 1           # from now on G's return closes the step
    c.optimizer_pre(d, 2)
    c.optimizer_post(d)
    c.optimizer_pre(g, 2)
    assert c.optimizer_post(g).step == 2


def test_an_iteration_in_which_every_optimizer_stepped_ends_step0_at_its_last_return():
    """Counted at the return of the last of them (the caller asks when worth it), every
    optimizer of the run having stepped once: step 0 ends there, as the later steps do
    (it was closed inside the next iteration's first step(), whose frame the stop showed)."""
    c, a, b = StepClock(), Opt(), Opt()
    assert c.optimizer_pre(a, 2) is None
    assert not c.completes_iteration(a)
    assert c.optimizer_post(a, None) is None
    assert c.optimizer_pre(b, 2) is None
    assert c.completes_iteration(b)
    first = c.optimizer_post(b, 2)
    assert (first.step, first.retro) == (0, None) and not c.mark
    assert c.mode is Mode.CYCLE and c.closer is b
    assert c.optimizer_pre(a, 2) is None and c.optimizer_post(a) is None
    c.optimizer_pre(b, 2)
    assert c.optimizer_post(b).step == 1


def test_an_optimizer_made_after_the_count_keeps_step0_open():
    """A third optimizer made after the first stepped (counted afresh at the second's
    return: 3): the iteration is learnt as before, when the first steps again."""
    c, a, b, z = StepClock(), Opt(), Opt(), Opt()
    c.optimizer_pre(a, 2)
    c.optimizer_post(a, None)
    c.optimizer_pre(b, 2)
    assert c.optimizer_post(b, 3) is None and c.mark
    c.optimizer_pre(z, 3)
    assert c.optimizer_post(z, 3).step == 0


def test_two_optimizers_but_only_one_steps():
    c, a = StepClock(), Opt()
    c.optimizer_pre(a, 2)
    c.optimizer_post(a)
    close = c.optimizer_pre(a, 2)
    assert close.step == 0 and close.retro == 1
    assert c.optimizer_post(a).step == 1


def test_manual_updates_close_at_each_backward():
    c = StepClock()
    assert c.backward_end(0).step == 0
    assert c.backward_end(0).step == 1
    assert c.mode is Mode.MANUAL


def test_optimizer_appearing_after_manual_steps_takes_over():
    # its first step applies the gradients of the backward that ended step 0: step 0's update
    c, a = StepClock(), Opt()
    assert c.backward_end(0).step == 0
    c.optimizer_pre(a, 1)
    assert c.optimizer_post(a) is None
    assert c.backward_end(1) is None
    c.optimizer_pre(a, 1)
    assert c.optimizer_post(a).step == 1


def test_optimizer_with_its_own_backward_after_manual_steps_closes_its_step():
    # (LBFGS's closure, an optimizer stepped inside a backward: its gradients are its own)
    c, a = StepClock(), Opt()
    assert c.backward_end(0).step == 0
    c.optimizer_pre(a, 1, own_backward=True)
    assert c.optimizer_post(a).step == 1


def test_replaced_optimizer_hands_over_closing():
    c = StepClock()
    a = Opt()
    c.optimizer_pre(a, 1)
    assert c.optimizer_post(a).step == 0
    del a                                          # the old optimizer is gone
    b = Opt()
    c.optimizer_pre(b, 1)
    assert c.optimizer_post(b).step == 1


def test_a_new_optimizer_takes_over_from_one_that_lives_on_but_no_longer_steps():
    """The old optimizer kept alive (in a list, a global): the new one's first
    step goes into the open step; its second, before the old one stepped
    again, closes that step after the fact (its first segment) and makes the
    new one the closer."""
    c, old, new = StepClock(), Opt(), Opt()
    c.optimizer_pre(old, 1)
    assert c.optimizer_post(old).step == 0
    assert c.marks(new) and not c.marks(old)        # another's step ends a segment
    assert c.optimizer_pre(new, 2) is None
    assert c.optimizer_post(new) is None             # the new one's first step: still step 1
    took = c.optimizer_pre(new, 2)                   # its second, the old one idle since
    assert (took.step, took.retro) == (1, 1)
    assert c.closer is new and c.mode is Mode.SINGLE
    assert c.optimizer_post(new).step == 2


def test_a_second_optimizer_stepping_after_the_closer_each_iteration_does_not_take_over():
    """A second optimizer that joins later and steps after the closer in every
    iteration, where nothing says where the script calls them (no call sites: the
    tracer gives them, and then it joins the iteration, below): nothing changes."""
    c, a, b = StepClock(), Opt(), Opt()
    c.optimizer_pre(a, 1)
    c.optimizer_post(a)
    for step in (1, 2, 3):
        assert c.optimizer_pre(a, 2) is None
        assert c.optimizer_post(a).step == step
        assert c.optimizer_pre(b, 2) is None and c.optimizer_post(b) is None
    assert c.closer is a


def test_a_class_name_is_named_as_a_variable_would_be():
    """Roots and optimizers with no variable of the script's are named after
    their class: 's_g_d' and 're_l_u' before, now as a person writes them."""
    from nndb.tracer.naming import snake
    got = {n: snake(n) for n in ("SGD", "AdamW", "LBFGS", "ReLU", "LeakyReLU", "SmallCNN", "BatchNorm2d",
                                  "TinyTransformer", "MultiheadAttention", "LSTM", "Net")}
    assert got == {"SGD": "sgd", "AdamW": "adamw", "LBFGS": "lbfgs", "ReLU": "relu", "LeakyReLU": "leaky_relu",
                   "SmallCNN": "small_cnn", "BatchNorm2d": "batch_norm2d", "TinyTransformer": "tiny_transformer",
                   "MultiheadAttention": "multihead_attention", "LSTM": "lstm", "Net": "net"}


def test_a_replica_told_of_a_handover_closes_the_step_at_the_new_optimizers_return():
    """The live clock learns a handover one optimizer step late (closed after the
    fact); a replica told of it (the optimizer's place by first step: a respawned
    replica's objects are new ones) ends the step at that optimizer's first
    return, and the steps after it as the live run did."""
    live, old, new = StepClock(), Opt(), Opt()
    live.seen(old)
    live.optimizer_pre(old, 1)
    live.optimizer_post(old)
    live.seen(new)
    live.optimizer_pre(new, 2)
    live.optimizer_post(new)
    took = live.optimizer_pre(new, 2)
    assert (took.step, took.retro) == (1, 1) and live.late == 1
    assert live.handovers == {1: (1, 1)}
    replica, old, new = StepClock(), Opt(), Opt()
    replica.know({str(k): list(v) for k, v in live.handovers.items()})     # (as JSON brings it)
    replica.seen(old)
    replica.optimizer_pre(old, 1)
    assert replica.optimizer_post(old).step == 0
    replica.seen(new)
    assert replica.optimizer_pre(new, 2) is None
    closed = replica.optimizer_post(new)
    assert (closed.step, closed.retro) == (1, None) and not replica.mark and replica.late is None
    assert replica.closer is new
    assert replica.optimizer_pre(new, 2) is None and replica.optimizer_post(new).step == 2


LOOP = object()          # (a frame's code: the training loop's)


def _gan_after_the_closer(c, d, g, iterations=3):
    """d steps alone for two iterations, then d and g (called on a later line) each iteration."""
    closes = []
    c.seen(d, ((LOOP, 10),))
    c.optimizer_pre(d, 2)
    closes.append(c.optimizer_post(d))
    for i in range(1, 2 + iterations):
        closes.append(c.optimizer_pre(d, 2, site=((LOOP, 10),) if c.wants_site else None))
        closes.append(c.optimizer_post(d))
        if i >= 2:
            if g not in c._ordinals:
                c.seen(g, ((LOOP, 20),))
            closes.append(c.optimizer_pre(g, 2))
            closes.append(c.optimizer_post(g))
    return [(x.step, x.retro) for x in closes if x is not None]


def test_a_second_optimizer_called_after_the_closer_from_a_later_iteration_on_joins_its_iteration():
    """A dcgan loop whose generator first steps at iteration 2, after the discriminator's step
    closed that iteration's step: the generator's first step is a step alone (closed after the
    fact, as it steps again), and from then on a step is one iteration, closed at its return
    (each step held the discriminator's iteration k and the generator's k - 1).  A replica told
    of it closes that step at the generator's first return and learns the same iteration."""
    live, d, g = StepClock(), Opt(), Opt()
    got = _gan_after_the_closer(live, d, g)
    # step 0 (learnt), 1, 2 the discriminator's; 3 the generator's first step alone; 4 iteration 3 ...
    assert got == [(0, 1), (1, None), (2, None), (3, 1), (4, None), (5, None)]
    assert live.mode is Mode.CYCLE and live.closer is g and live.joins == {3: True} and live.late is None
    replica, d, g = StepClock(), Opt(), Opt()
    replica.know({str(k): list(v) for k, v in live.handovers.items()})     # (as JSON brings it)
    assert _gan_after_the_closer(replica, d, g) == [(0, 1), (1, None), (2, None), (3, None), (4, None), (5, None)]
    assert replica.mode is Mode.CYCLE and replica.closer is g


def test_a_newcomer_whose_closer_steps_again_falls_in_the_closers_next_step():
    """A WGAN's critic, stepped 3 times a generator step: the generator's first step stays in the
    critic step after it (closed after the fact, as the critic steps again), as its later ones
    are; a replica told of it closes that step at the critic's return."""
    def wgan(c, d, g):
        out = []
        c.seen(d, ((LOOP, 10),))
        for it in range(2):
            for k in range(3):
                out.append(c.optimizer_pre(d, 2, site=((LOOP, 10),) if c.wants_site else None))
                out.append(c.optimizer_post(d))
            if g not in c._ordinals:
                c.seen(g, ((LOOP, 20),))
            out.append(c.optimizer_pre(g, 2))
            out.append(c.optimizer_post(g))
        return [(x.step, x.retro) for x in out if x is not None]
    live, d, g = StepClock(), Opt(), Opt()
    assert wgan(live, d, g) == [(0, 1), (1, None), (2, None), (3, 2), (4, None), (5, None)]
    assert live.mode is Mode.SINGLE and live.closer is d and live.joins == {3: False}
    replica, d, g = StepClock(), Opt(), Opt()
    replica.know({str(k): list(v) for k, v in live.handovers.items()})
    assert wgan(replica, d, g) == [(0, 1), (1, None), (2, None), (3, None), (4, None), (5, None)]


def test_a_newcomer_called_before_the_closer_starts_its_next_iteration():
    """A discriminator whose first steps a GradScaler skipped, stepped before the generator in
    the loop: its first step is part of the generator's next step, as it was."""
    c, d, g = StepClock(), Opt(), Opt()
    c.seen(g, ((LOOP, 20),))
    c.optimizer_pre(g, 2)
    c.optimizer_post(g)
    assert c.optimizer_pre(g, 2).step == 0 and c.optimizer_post(g).step == 1
    c.seen(d, ((LOOP, 10),))
    for step in (2, 3, 4):
        assert c.optimizer_pre(d, 2) is None and c.optimizer_post(d) is None
        assert c.optimizer_pre(g, 2, site=((LOOP, 20),) if c.wants_site else None) is None
        assert c.optimizer_post(g).step == step
    assert c.closer is g and not c.joins
