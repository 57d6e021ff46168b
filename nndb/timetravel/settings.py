"""What ``predict --set KEY=VALUE`` changes in the predicting replica: each
``Setting`` as the edit it makes (nndb.debugger.changes' ``HyperChange`` or
``VarChange``: ``changes_for``, checked in the live run before a replica
runs), made and watched in the replica (``make_changes``: did it hold?).
Apart from nndb.timetravel.predict, which forks the replica, so that the
replica's role (nndb.timetravel.roles.Predict) makes them without importing
the module that makes it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ..debugger.changes import HyperChange, VarChange, hyper_value, make, set_target
from ..errors import CommandError


@dataclass(frozen=True)
class Setting:
    """One ``--set KEY=VALUE``: KEY an optimizer's hyper-parameter (KEY, or
    OPTIMIZER.KEY) or a variable of the script's frame; VALUE as typed."""
    key: str
    value: str

    @property
    def label(self) -> str:
        return f"{self.key}={self.value}"


@dataclass(frozen=True)
class PredictChange:
    """A ``--set`` as the edit the changed replica makes."""
    setting: Setting
    edit: Union[HyperChange, VarChange]

    @property
    def line(self) -> str:
        """The set command that makes the same change at the prompt."""
        return self.edit.line


def changes_for(s, sets) -> list:
    """Each ``Setting`` as the edit the changed replica makes: an
    optimizer's hyper-parameter (KEY, or OPTIMIZER.KEY) or a variable of the
    script's frame.  Anything else is refused here, before a replica runs."""
    from ..debugger.hyperparams import check_scheduled, is_numeric, schedulers_of
    opts = dict(s.view.optimizers())
    out = []
    for st in sets:
        key, value = st.key, st.value
        oname, dot, hyper = key.partition(".")
        scoped = s.view.optimizer_named(oname, list(opts.items())) if dot else []
        if scoped:
            chosen = [scoped[0][0]]             # (nndb's name: the replica finds it by that)
        else:
            hyper = key
            if set_target(s, key) == "var":
                out.append(PredictChange(st, VarChange(key, value)))
                continue
            if "." in key:
                raise CommandError(f"unknown key '{key}': no optimizer named '{oname}' and no such variable "
                                   f"(optimizers: {', '.join(opts) or 'none'})")
            chosen = list(opts)
        for name in chosen:
            groups = opts[name].param_groups
            if not all(hyper in g and hyper != "params" and is_numeric(g[hyper]) for g in groups):
                known = ", ".join(k for k in groups[0] if k != "params" and is_numeric(groups[0][k]))
                raise CommandError(f"unknown key '{key}': not a numeric hyper-parameter of {name} ({known}) "
                                   f"nor a variable of the script's frame")
        if len(chosen) > 1:
            raise CommandError(f"{len(chosen)} optimizers: say which, as in --set {chosen[0]}.{key}={value}")
        for name in chosen:
            check_scheduled(name, hyper, schedulers_of(opts[name]))
            try:
                number = hyper_value(value)
            except CommandError as e:
                raise CommandError(f"--set {st.label}: {e}") from None
            out.append(PredictChange(st, HyperChange(name, None, hyper, number,
                                                     line=f"set {hyper} {value} optimizer {name}")))
    return out


def make_changes(s, role, changes: list) -> None:
    """Make the --set ``changes`` in the predicting replica, each watched (did it hold?)."""
    for change in changes:
        read = _reader(s, change.edit)
        try:
            before = read()
            known = len(s.hold_checks)
            make(s, change.edit)
            # (an lr's check: what the optimizer steps with against what its schedule gives, unchanged
            # and followed from the change: a schedule rising from the value set is no change undone)
            role.watch.append((change.setting.label, read, before, read(), s.hold_checks[known:]))
        except Exception as e:         # (the live run checked the change; say why it failed here)
            role.fail(f"--set {change.setting.label}: {e}")


def _reader(s, edit):
    """A function that reads the setting an edit makes: an optimizer's
    hyper-parameter in each group, or a variable of the script's frame."""
    from ..debugger import evaluate as E
    if isinstance(edit, HyperChange):
        opt = dict(s.view.optimizers())[edit.optimizer]
        key = edit.key
        return lambda: [float(g[key]) if not isinstance(g[key], tuple) else g[key] for g in opt.param_groups]
    code = E.compile_expr(edit.name)
    # (read after the replica's first step, at its step end, before the session stands at a
    # stop there: the frame the change was made in, which the loop runs on in)
    made_in = s.stop_frame()

    def read():
        frame = s.stop_frame() or made_in
        return E.evaluate(code, frame, s.view.variables(frame))
    return read
