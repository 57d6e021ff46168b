"""``predict``: fork the current process at the stop and run it N steps
ahead as a replica that reports per-step figures and ends.  The live process
only waits: it must finish as if predict had never been used."""
from __future__ import annotations

from . import forking
from .channel import Channel


def fork_and_wait(s, machine, become):
    """Fork a helper replica of this stop (``predict``, ``fuzz``): in the child
    ``become(chan)`` takes over and None is returned; the live run waits for
    the child's last message and returns it."""
    with machine.watching_files(s):
        parent, child = Channel.pair()
        pid = forking.fork(close=tuple(c.chan for c in machine.checkpoints.values()) + (parent,))
        if pid == 0:
            become(child)
            return None
        child.close()
        try:
            return machine._wait(s, parent, None)
        finally:
            parent.close()
            forking.reap(pid)


def predict(s, machine, n: int, set_lines: list) -> dict:
    """``set_lines``: [{"line": a set command, "label": KEY=VALUE, "read": (what, name, key)}]."""
    msg = fork_and_wait(s, machine, lambda chan: _become_predictor(s, machine, chan, n, set_lines))
    return {} if msg is None else msg


def _become_predictor(s, machine, chan, n: int, set_lines: list) -> None:
    from .roles import Predict
    from . import sandbox
    machine.replica = True
    machine.checkpoints = {}
    s.rec.writer.detach()
    sandbox.enter()                    # (the script's own writes go to scratch copies)
    role = Predict(chan, {"kind": "predict", "steps": n})
    s.become_replica(role)
    role.begin(s)                      # (output to /dev/null from here)
    s.queue.clear()                    # the rest of a command file is the live run's
    for change in set_lines:
        read = _reader(s, change["read"])
        try:
            before = read()
            s.table.dispatch(s, change["line"])
            role.watch.append((change["label"], read, before, read()))
        except Exception as e:         # (the live run checked the change; say why it failed here)
            role.fail(f"--set {change['label']}: {e}")
    s.set_continue()                   # the stop's prompt loop ends; the script runs on here


def _reader(s, what: list):
    """A function that reads the setting a change makes: an optimizer's
    hyper-parameter in each group, or a variable of the script's frame."""
    from ..debugger import evaluate as E
    if what[0] == "hyper":
        opts = dict(s.view.optimizers())
        opt = opts[what[1]]
        return lambda: [float(g[what[2]]) if not isinstance(g[what[2]], tuple) else g[what[2]]
                        for g in opt.param_groups]
    code = E.compile_expr(what[1])
    return lambda: E.evaluate(code, s.stop_frame(), s.view.variables(s.stop_frame()))
