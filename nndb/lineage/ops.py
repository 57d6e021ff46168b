"""The op recorder: a TorchDispatchMode (the mechanism of PyTorch's
FlopCounterMode) that sees every ATen operation of a step, forward, backward
and the optimizer's, and notes its name, its input and output tensors (ids
stable within the step), shapes, dtypes, the module it ran in and the
script's source line.

Tensor ids: a tensor gets the next id the first time it is seen, and a new
one when an in-place operation changes it (a new *version*), so the lineage
stays a graph without cycles.  Identity is checked by weakref, never by
``id()`` alone (a freed tensor's id is reused).

Modules: the tracer's forward hooks feed it the stack of module names during the
forward pass; after a module's forward its new autograd nodes are tagged with
it, and a backward operation is attributed through the autograd node that
runs it (``torch._C._current_autograd_node``).  The optimizer's operations
run between the optimizer step hooks.

With ``check`` on (``catch nan``), every floating-point output is tested for
NaN/Inf; an output that is not finite while the inputs were (or NaN while
they held none) is noted in the step's ``events`` and, when set, calls
``on_nonfinite(op, info)``.  Nothing here changes a tensor or draws a random
number: the run's numbers stay the same.

Why this size: one dispatch mode and the graph it fills, read together.  The
step's graph (``StepLineage``: ids and versions, where a NaN or Inf began or
came in, what the step absorbed) is written only by the mode's ``_note`` and
``_check``, with the same records; apart, each would reach into the other's.
"""
from __future__ import annotations

import contextlib
import os
import sys
import weakref
from typing import Callable, Optional

import torch
from torch.utils._python_dispatch import (TorchDispatchMode, _disable_current_modes,
                                          _get_current_dispatch_mode_stack, _pop_mode, _push_mode)

from ..tracer.funcmode import TRAMPOLINE, take_out
from .oprecord import DTYPES, FIELDS, INS, OP_STATS, OUTS, PHASE, op_name  # noqa: F401  (FIELDS: the layout of cur.ops' records)

_IN_BACKWARD = torch._C._current_graph_task_id     # -1 outside a backward

_TORCH_DIR = os.path.dirname(torch.__file__)
_NNDB_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STDLIB = os.path.dirname(os.__file__)
_SKIP = {torch.ops.profiler._record_function_enter_new.default,
         torch.ops.profiler._record_function_exit._RecordFunction}

# Operations whose output is uninitialised memory (nn.Linear's weight before its init fills
# it): a NaN bit pattern there is no value the script computed, and not checked.
_UNINITIALISED = {getattr(torch.ops.aten, n) for n in ("empty", "empty_like", "empty_strided", "new_empty",
                                                     "new_empty_strided", "empty_permuted")
                  if hasattr(torch.ops.aten, n)}


MAX_EVENTS = 50         # a step's events kept (the first ones are what a catch point reports)

_SCRIPT: dict = {}      # code object -> is it the script's own code


def _is_script(code) -> bool:
    f = code.co_filename
    v = not (f.startswith("<") or os.path.abspath(f).startswith((_TORCH_DIR, _NNDB_DIR, _STDLIB))
             or code.co_name == TRAMPOLINE)
    _SCRIPT[code] = v
    return v


def script_location(frame) -> tuple:
    """(file, line) of the nearest frame of the script's own code (run on
    every operation: one dict lookup per frame)."""
    get = _SCRIPT.get
    while frame is not None:
        code = frame.f_code
        v = get(code)
        if v is None:
            v = _is_script(code)
        if v:
            return code.co_filename, frame.f_lineno
        frame = frame.f_back
    return None, None


class StepLineage:
    """The operations of one step, and what names its tensors have."""

    def __init__(self, step: int):
        self.step = step
        self.ops: list = []
        self.labels: dict = {}          # tensor id -> "param fc.weight" | "act fc" | "loss" | "input"
        self._ids: dict = {}            # id(tensor) -> (weakref, version, tid)
        self._next = 0
        self.nonfinite: list = []       # [op index] whose output was not finite while the inputs were
        # op index -> the forward operation whose own backward it ran (``maker_of``): the same origin
        self.echoes: dict = {}
        self._maker_outs: list = []     # [(weakref of an output, op index)] of forward makers, until
        self._maker_nodes: dict = {}    # ... their autograd node is known: id(node) -> (node, op index)
        # (checked steps) the ids of the tensors that held NaN/Inf: the outputs that did, and
        # ``entries``: those no operation of the step made (a parameter, the batch), id ->
        # [op index, input position] of the first operation that took it
        self.bad: set = set()
        self.entries: dict = {}
        self._clean: set = set()        # ids of tensors no operation made, found finite
        self.producer: dict = {}        # tensor id -> index of the op that made it
        self._views: dict = {}          # (data_ptr, shape, stride, offset, dtype) -> id of an op's output
        self.checked = False            # NaN/Inf were looked for (catch, origin)
        self.first_bad: dict = {}       # phase -> index of its first op with a non-finite output
        self.stats: dict = {}           # op index -> [min, max, mean, nan, inf] of its first output
        # modules whose forward ran other modules: an op attributed to one of
        # them is the functional code of its forward (F.relu between two layers)
        self.containers: set = set()
        self._param_storage: Optional[dict] = None   # storage address -> parameter name (views by storage)
        # [op index, info] of the ops a catch point may want (what on_nonfinite is
        # given), in order: a replay of the step hands them to the live run
        self.events: list = []
        # Where a NaN that no operation of the step made came in (``_check``): looked for
        # until found, and not in a step after one that held non-finite values already
        # (a NaN kept in the parameters is where it began, a step earlier: said once).
        self.look_for_entry = True
        self.had_nan = False            # an operation's output held NaN (checked steps)

    def tid(self, t: torch.Tensor) -> int:
        """The id of this tensor as it is now: a tensor seen for the first time,
        or changed in place since, gets a new one."""
        try:
            v = t._version
        except Exception:
            v = -1
        e = self._ids.get(id(t))
        if e is not None and e[0]() is t:
            if e[1] == v:
                return e[2]
            if e[1] is None:
                # a view's version counter is its base's, shared only once the
                # view op has returned (above the dispatch mode): bound at first use
                self._ids[id(t)] = (e[0], v, e[2])
                return e[2]
        if e is None or e[0]() is not t:
            # autograd re-wraps a view an op returned (as_view): the same view,
            # another Python object; it is found by what it looks at
            same = self._views.get(_view_key(t))
            if same is not None:
                return same
        tid = self._next
        self._next += 1
        try:
            self._ids[id(t)] = (weakref.ref(t), v, tid)
        except TypeError:
            pass
        return tid

    def new(self, t: torch.Tensor, written: bool = False, view: bool = False) -> int:
        """A new id for an operation's output.  ``written``: an in-place
        operation's, whose version counter is bumped above the dispatch mode,
        after it returns; ``view``: a view op's, whose version counter becomes
        its base's after it returns (a parameter's ``t()`` in ``nn.Linear``)."""
        tid = self._next
        self._next += 1
        try:
            self._ids[id(t)] = (weakref.ref(t), None if view else t._version + (1 if written else 0), tid)
        except Exception:
            pass
        return tid

    def origin_of(self, ids: list) -> tuple:
        """Where the non-finite values among these tensors began, followed back
        through tensors that held NaN/Inf only (a causal mask's -inf that the
        softmax after it absorbed is no ancestor of a NaN the values' Inf
        made): (the latest op that made one from finite inputs, None), else
        (None, [op index, input position] where one came into the step), else
        (None, None)."""
        makers = set(self.nonfinite)
        seen, stack, best, entry = set(), list(ids), None, None
        while stack:
            tid = stack.pop()
            if tid in seen:
                continue
            seen.add(tid)
            i = self.producer.get(tid)
            if i is None:
                e = self.entries.get(tid)
                if e is not None and (entry is None or e[0] < entry[0]):
                    entry = e
                continue
            if tid not in self.bad:
                continue
            if i in makers:
                i = self.echoes.get(i, i)
                best = i if best is None else max(best, i)
                continue
            stack.extend(self.ops[i][INS])
        return (best, None) if best is not None else (None, entry)

    def provenance(self, tid: int) -> dict:
        """What a catch stop says of an input that held NaN/Inf, where those values began:
        ``from``, the operation of the step that made them from finite inputs (the ``exp``
        that overflowed, for the Inf a ``0 * inf`` took), else ``came_in``, the name of the
        tensor they came into the step with (a parameter an earlier step made Inf; "" for
        one nndb has no name for: the batch); and ``label``, the input's own name, where it
        has one."""
        d = {}
        label = self.labels.get(tid)
        if label:
            d["label"] = label
        made, entry = self.origin_of([tid])
        if made is not None:
            d["from"] = made
            info = next((info for i, info in self.events if i == made), None)
            if info is not None:       # (what it made: an input written in place shows what it holds after)
                d["held"] = "NaN/Inf" if info["nan"] and info["inf"] else "NaN" if info["nan"] else "Inf"
        elif entry is not None:
            d["came_in"] = self.labels.get(self.ops[entry[0]][INS][entry[1]]) or ""
        return d

    def event_inputs(self, idx: int) -> Optional[list]:
        """The inputs (as a catch stop shows them) the event of operation ``idx`` noted."""
        return next((info.get("inputs") for i, info in self.events if i == idx), None)

    def maker_of(self, node) -> Optional[int]:
        """The forward operation of this step that made a NaN/Inf from finite inputs and
        whose autograd node is ``node``, or None.  (A forward operation's output gets its
        node above the dispatch mode, after the operation returns: looked up at a later
        operation that takes it, or in the backward while the script holds it.)"""
        for ref, idx in self._maker_outs:
            t = ref()
            fn = getattr(t, "grad_fn", None)
            if fn is not None:
                self._maker_nodes.setdefault(id(fn), (fn, idx))
        self._maker_outs = []
        e = self._maker_nodes.get(id(node)) if node is not None else None
        return e[1] if e is not None and e[0] is node else None

    def forget_nodes(self) -> None:
        """The step is over: its autograd nodes are let go (a node holds its saved tensors)."""
        self._maker_outs = []
        self._maker_nodes = {}

    def find(self, t) -> Optional[int]:
        """The id of a live tensor of this step (its latest version), or None."""
        if not isinstance(t, torch.Tensor):
            return None
        e = self._ids.get(id(t))
        if e is not None and e[0]() is t:
            return e[2]
        return None

    def absorbed(self, idx: int, users: Optional[dict] = None) -> bool:
        """Did the NaN/Inf that operation ``idx`` output end within the step, in operations
        whose floating-point outputs are finite (a causal mask's -inf in the softmax after it,
        a ``nan_to_num``)?  One that reaches a tensor no operation took afterwards (the loss,
        a gradient, a parameter), or one that only a non-floating result took (``.item()``,
        ``isnan``), did not.  ``users``: ``self.users()``, where it is at hand."""
        users = self.users() if users is None else users
        stack, seen = [t for t in self.ops[idx][OUTS] if t in self.bad], set()
        if not stack:
            return False         # (it wrote the value into an input: batch norm's running statistics)
        while stack:
            tid = stack.pop()
            if tid in seen:
                continue
            seen.add(tid)
            if not users.get(tid):
                return False
            for i in users[tid]:
                bad = [t for t in self.ops[i][OUTS] if t in self.bad]
                if bad:
                    stack.extend(bad)
                elif not any(d.startswith(("float", "bfloat", "complex")) for d in self.ops[i][DTYPES]):
                    return False
        return True

    def users(self) -> dict:
        """Tensor id -> the indices of the operations that read its values, in order (not
        those that take only its shape and dtype: the backward's ``ones_like(loss)``)."""
        users: dict = {}
        for i, op in enumerate(self.ops):
            name = op_name(op)
            if name.endswith("_like") or name.startswith("new_"):
                continue
            for tid in op[INS]:
                users.setdefault(tid, []).append(i)
        return users

    def as_dict(self) -> dict:
        users = self.users() if self.checked and self.events else None
        for idx, info in self.events:
            if users is not None and "absorbed" not in info and self.absorbed(idx, users):
                info["absorbed"] = True
        return {"step": self.step, "ops": self.ops, "labels": {str(k): v for k, v in self.labels.items()},
                "nonfinite": self.nonfinite, "checked": self.checked,
                "echoes": {str(k): v for k, v in self.echoes.items()},
                "first_bad": self.first_bad, "stats": {str(k): v for k, v in self.stats.items()},
                "containers": sorted(self.containers),
                "events": self.events}


class OpRecorder(TorchDispatchMode):
    def __init__(self, tracer, check: bool = False,
                 on_nonfinite: Optional[Callable[[int, dict], None]] = None):
        super().__init__()
        self.tracer = tracer
        self.naming = tracer.naming
        self.check = check
        self.stats = False               # output statistics of every op (lineage on --stats)
        self.on_nonfinite = on_nonfinite
        self.current: Optional[StepLineage] = None
        self.modules: list = []          # names of the modules whose forward is running
        self._boundaries: list = []      # for each: ids of its inputs' autograd nodes
        self.node_module: dict = {}      # id(autograd node) -> (node, module name)
        self.phase = "forward"
        self.stepping = False            # inside an optimizer's step (between its pre and post hooks)
        self._on = False                 # on the dispatch stack
        self._want = False
        self._paused = 0
        self._names: dict = {}
        self.errors = 0

    # -- on / off ------------------------------------------------------------------------
    def start(self, step: int) -> None:
        self.current = StepLineage(step)
        self.node_module.clear()
        self.phase = "forward"
        self.tracer.lineage = self
        self.tracer.within.join("loss", self.label_loss)
        self._want = True
        self._settle()

    def stop(self) -> Optional[StepLineage]:
        self.tracer.lineage = None
        self.tracer.within.leave("loss", self.label_loss)
        self._want = False
        self._settle()
        done, self.current = self.current, None
        if done is not None:
            done.forget_nodes()
        self.node_module.clear()
        self.modules = []
        self._boundaries = []
        return done

    def next_step(self, step: int) -> Optional[StepLineage]:
        """Close this step's lineage and open the next's (the mode stays on)."""
        done = self.current
        self.current = StepLineage(step)
        if done is not None:
            done.forget_nodes()
            if done.had_nan:
                self.current.look_for_entry = False
        self.node_module.clear()
        self.phase = "forward"
        return done

    def _settle(self) -> None:
        """Put the mode on or take it off the dispatch stack, unless nndb's own
        work has the stack emptied just now (``paused``): then on the way out."""
        if self._paused:
            return
        if self._want and not self._on:
            self.__enter__()
            self._on = True
        elif not self._want and self._on:
            self._on = False
            try:
                self.__exit__(None, None, None)
            except Exception:
                pass

    def after_backward(self) -> None:
        """A ``backward()`` returned: the autograd engine ran its callbacks under the thread
        state of the call and put that state back as it returned, dispatch modes included.  A
        step that ended inside it (a hand-written update's: the step ends as the backward pass
        does) pushed the mode there, and lost it (nothing of the next step was recorded, and
        a catch's replay found no operation), or took it off, and found it on again: the
        stack is made what this recorder wants."""
        if self._paused:
            return
        stack = _get_current_dispatch_mode_stack()
        on = any(m is self for m in stack)
        if self._want and self._on and not on:
            _push_mode(self)
        elif not self._on and on:
            take_out(self, _pop_mode, _push_mode)

    @contextlib.contextmanager
    def paused(self):
        if not self._on or self._paused:
            yield
            return
        self._paused += 1
        try:
            with _disable_current_modes():
                yield
        finally:
            self._paused -= 1
            self._settle()

    # -- hooks ---------------------------------------------------------------------------------
    def _name(self, module) -> str:
        e = self._names.get(id(module))
        if e is not None and e[0]() is module:
            return e[1]
        name = self.naming.module_name(module)
        try:
            self._names[id(module)] = (weakref.ref(module), name)
        except TypeError:
            pass
        return name

    def module_pre(self, module, args):
        try:
            # the autograd nodes of its inputs end the walk of module_post: what
            # made them ran before this module (a functional op of the parent)
            boundary = {id(a.grad_fn) for a in _tensors(args, []) if a.grad_fn is not None}
            if self.modules and self.current is not None:
                self.current.containers.add(self.modules[-1])
            self.modules.append(self._name(module))
            self._boundaries.append(boundary)
            if len(self.modules) == 1 and self.current is not None:
                self.phase = "forward"
                for a in _tensors(args, []):
                    tid = self.current.tid(a)
                    self.current.labels.setdefault(tid, "input")
        except Exception:
            self.errors += 1

    def module_post(self, module, args, output):
        try:
            name = self.modules.pop() if self.modules else self._name(module)
            boundary = self._boundaries.pop() if self._boundaries else set()
            cur = self.current
            if cur is None:
                return
            outs = _tensors((output,), [])
            for t in outs:
                cur.labels[cur.tid(t)] = f"act {name}"
            # tag the autograd nodes this forward made (inner modules tagged
            # theirs first), down to the nodes of its inputs; through a child's
            # nodes, to the functional ops between children
            stack = [t.grad_fn for t in outs if t.grad_fn is not None]
            walked = set()
            while stack:
                node = stack.pop()
                if node is None or id(node) in walked or id(node) in boundary:
                    continue
                walked.add(id(node))
                self.node_module.setdefault(id(node), (node, name))
                stack.extend(fn for fn, _ in node.next_functions if fn is not None)
        except Exception:
            self.errors += 1

    def optimizer(self, opt, when: str) -> None:
        # after the step: what the script does next (its data) is not the optimizer's
        self.stepping = when == "pre"
        self.phase = "optimizer" if self.stepping else "forward"

    def label_loss(self, t: torch.Tensor) -> None:
        if self.current is not None:
            self.current.labels[self.current.tid(t)] = "loss"

    # -- every operation -----------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        cur = self.current
        t = self.tracer
        if cur is None or func in _SKIP or t.in_hook or t.busy:     # (nndb's own work is not the step's)
            return func(*args, **(kwargs or {}))
        try:
            ins = _tensors(args, [])
            if kwargs:
                _tensors(tuple(kwargs.values()), ins)
            in_ids = self._inputs(cur, ins)      # before the op: an in-place op makes a new version
        except Exception:
            self.errors += 1
            return func(*args, **(kwargs or {}))
        pre = writes = None
        if self.check and (_mutates(func) or _writes(func)[0]):
            try:
                pre = _flags(ins)                # (an in-place op's input is its output afterwards)
                writes = _written(func, args, kwargs)
            except Exception:
                self.errors += 1
        out = func(*args, **(kwargs or {}))
        try:
            self._note(cur, func, ins, in_ids, out, pre, writes, (args, kwargs))
        except Exception:
            self.errors += 1
        return out

    def _inputs(self, cur, ins: list) -> list:
        ids = []
        for a in ins:
            fresh = cur._next
            tid = cur.tid(a)
            ids.append(tid)
            if tid in cur.labels:
                continue
            if type(a) is torch.nn.Parameter:
                cur.labels[tid] = "param " + self.naming.param_name(a)
            elif tid >= fresh:
                # first seen here, made by no op of this step: a view of a
                # parameter made outside the step (or an in-place alias) is
                # that parameter's, found by its storage
                name = self._param_of_storage(cur, a)
                if name is not None:
                    cur.labels[tid] = f"param {name} (view)"
        return ids

    def _param_of_storage(self, cur, t) -> Optional[str]:
        try:
            if cur._param_storage is None:
                cur._param_storage = {}
                for root in self.naming.roots():
                    for p in root.parameters():
                        ptr = p.untyped_storage().data_ptr()
                        if ptr:
                            cur._param_storage.setdefault(ptr, self.naming.param_name(p))
            return cur._param_storage.get(t.untyped_storage().data_ptr())
        except Exception:
            return None

    def _note(self, cur, func, ins, in_ids, out, pre: Optional[tuple] = None, writes: Optional[list] = None,
              call: tuple = ((), None)) -> None:
        outs = _tensors((out,), [])
        node = torch._C._current_autograd_node()
        if node is not None:
            phase = "backward"
            e = self.node_module.get(id(node))
            module = e[1] if e is not None and e[0] is node else None
            node_name = node.name()
        elif _IN_BACKWARD() != -1 and not self.modules:
            # (inside a backward but no node's: DDP's reducer copying the all-reduced gradient
            # buckets back into the gradients as the backward ends; it read 'in the forward pass')
            phase, module, node_name = "backward", None, None
        else:
            if self.modules:
                self.phase = "forward"
            elif self.stepping and cur.ops and cur.ops[-1][PHASE] == "backward":
                # (the backward pass of a closure the step called ended: LBFGS's update of the
                # parameters follows, the optimizer's own, not the closure's forward)
                self.phase = "optimizer"
            phase = self.phase
            module = self.modules[-1] if self.modules else None
            node_name = None
        written = {id(a) for a in ins}
        view = func.is_view
        out_ids = [cur.new(o, id(o) in written, view) for o in outs]
        file, line = script_location(sys._getframe(2))
        idx = len(cur.ops)
        # in the order of oprecord.FIELDS
        cur.ops.append([func.__name__, phase, in_ids, out_ids, [list(o.shape) for o in outs],
                        [str(o.dtype).replace("torch.", "") for o in outs], module, file, line, node_name])
        for o, tid in zip(outs, out_ids):
            cur.producer[tid] = idx
            if o._base is not None or func.is_view:
                cur._views[_view_key(o)] = tid
        if self.stats and outs:
            d = describe(outs[0])
            if "min" in d:
                cur.stats[idx] = [d[k] for k in OP_STATS]
        if self.check:
            cur.checked = True
            if getattr(func, "overloadpacket", None) not in _UNINITIALISED:
                self._check(cur, idx, ins, in_ids, outs, pre, writes, func, call)

    def _check(self, cur, idx: int, ins: list, in_ids: list, outs: list, pre: Optional[tuple],
               writes: Optional[list] = None, func=None, call: tuple = ((), None)) -> None:
        """``pre``: the inputs' (NaN, Inf) before an in-place operation wrote
        them (after it, a written input holds the output); ``writes``: the
        inputs the operation wrote besides its outputs (batch norm's running
        statistics: a buffer the run makes is checked as an output is)."""
        checked = outs + [w for w in writes if not any(w is o for o in outs)] if writes else outs
        out_nan, out_inf = _flags(checked)
        if not (out_nan or out_inf):
            return
        if not getattr(func, "is_view", False):
            # (a view passes on its input's values, made nothing: the backward's detach of the
            # NaN output a LogSoftmaxBackward0 saved is not where the gradient went bad; nor
            # does a view of uninitialised memory hold a NaN of the step's: DDP's gradient
            # bucket, made by torch.empty at step 1 and viewed per parameter before anything
            # is written to it, held NaN bit patterns there (always so under
            # torch.use_deterministic_algorithms, which fills empty memory with NaN), and the
            # next step's catch no longer looked for where a NaN came in: the batch's NaN on
            # its rank, the all-reduced gradients' on the others)
            cur.first_bad.setdefault(cur.ops[idx][PHASE], idx)
            cur.had_nan = cur.had_nan or out_nan
        out_ids = cur.ops[idx][OUTS]
        cur.bad.update(out_ids if len(outs) == 1 else
                       (tid for o, tid in zip(outs, out_ids) if any(_flags([o]))))
        in_nan, in_inf = pre if pre is not None else _flags(ins)
        finite_in = not (in_nan or in_inf)
        if finite_in:
            cur.nonfinite.append(idx)        # this operation made the first non-finite value
            phase = cur.ops[idx][PHASE]
            if phase == "forward":
                for o in outs:
                    with contextlib.suppress(TypeError):
                        cur._maker_outs.append((weakref.ref(o), idx))
            elif phase == "backward":
                maker = cur.maker_of(torch._C._current_autograd_node())
                if maker is not None:
                    # the backward of the forward operation that made it (LogBackward0's
                    # division by the 0 that log took, MulBackward0's product with the NaN
                    # the forward multiplied by): the same origin, not a second one
                    cur.echoes[idx] = maker
                    return
        else:
            if cur._maker_outs:
                cur.maker_of(None)           # (the inputs' autograd nodes are set by now)
            _note_entries(cur, idx, ins, in_ids, pre)
            if not (out_nan and not in_nan):
                # It only passed on what came in; the first operation that takes a NaN no
                # operation of the step made (the batch's, a parameter's) is where it came in.
                # (after a NaN an operation made, a NaN coming in is not the first; an Inf made
                # before it, a causal mask's -inf, says nothing of where it came from)
                if cur.look_for_entry and in_nan and not any(e[1]["nan"] for e in cur.events):
                    self._came_in(cur, idx, ins, in_ids, checked, pre)
                return
        if len(cur.events) >= MAX_EVENTS and self.on_nonfinite is None:
            return
        origin, entered = (None, None) if finite_in else cur.origin_of(in_ids)
        inputs = [_described(a, checked, pre) for a in ins]
        info = {"nan": out_nan, "inf": out_inf, "in_nan": in_nan, "in_inf": in_inf,
                "origin": origin, "inputs": inputs}
        _name_inputs(cur, inputs, in_ids)
        numbers = _numbers(func, *call)
        if numbers:
            info["numbers"] = numbers       # (0 * x: the 0 is no tensor, and it made the NaN)
        if origin is not None:
            # (the stop names the operation that made the Inf: its inputs are listed as its
            # own, these as this operation's)
            info["origin_inputs"] = cur.event_inputs(origin)
            info["origin_numbers"] = next((i.get("numbers") for j, i in cur.events if j == origin), None)
        if entered is not None:
            # (a NaN from an Inf that came in with a tensor no operation of the step made:
            # a parameter an earlier step's update made Inf, which a 'catch nan' let pass)
            info.update(origin_entered=entered, origin_label=cur.labels.get(cur.ops[entered[0]][INS][entered[1]]))
        if len(cur.events) < MAX_EVENTS:
            cur.events.append([idx, info])
        if self.on_nonfinite is not None:
            self.on_nonfinite(idx, info)


    def _came_in(self, cur, idx: int, ins: list, in_ids: list, checked: list, pre: Optional[tuple]) -> None:
        """An event for the operation ``idx`` if one of its inputs holds a NaN that no
        operation of this step made: the step's data (or a tensor kept from before the
        step), which no operation's check can find (``entered``: its position; ``label``:
        what nndb calls it, a parameter's name)."""
        for j, (a, tid) in enumerate(zip(ins, in_ids)):
            if tid in cur.producer or not _flags([a])[0]:
                continue
            cur.look_for_entry = False
            info = {"nan": True, "inf": False, "in_nan": False, "in_inf": False, "origin": None,
                    "entered": j, "label": cur.labels.get(tid),
                    "inputs": _name_inputs(cur, [_described(x, checked, pre) for x in ins], in_ids)}
            cur.events.append([idx, info])
            if self.on_nonfinite is not None:
                self.on_nonfinite(idx, info)
            return


def _name_inputs(cur, inputs: list, in_ids: list) -> list:
    """A catch stop's inputs (``describe``'s), each with its name in the step, where it has
    one (a parameter's, a module's output), and, where it held NaN/Inf, where those values
    began (``StepLineage.provenance``): which input carried them, and from where."""
    for d, tid in zip(inputs, in_ids):
        if d.get("nan") or d.get("inf"):
            d.update(cur.provenance(tid))
        elif tid in cur.labels:
            d["label"] = cur.labels[tid]
    return inputs


def _numbers(func, args, kwargs) -> list:
    """[[argument name, value]] of the plain numbers an operation took as values (``0 * x``
    is ``mul(x, 0)``; an optimizer's ``add_(p, g, alpha=-lr)``): a catch stop lists them with
    its tensors.  Not the integers an argument of integer type takes (a dim, a size)."""
    try:
        arguments = func._schema.arguments
    except Exception:
        return []
    out = []
    kw = kwargs or {}
    for i, a in enumerate(arguments):
        v = args[i] if i < len(args) else kw.get(a.name)
        if isinstance(v, (int, float)) and not isinstance(v, bool) \
                and str(a.type).removeprefix("Optional[").rstrip("]") in ("Tensor", "number", "Scalar"):
            out.append([a.name, v])
    return out


def _note_entries(cur, idx: int, ins: list, in_ids: list, pre: Optional[tuple]) -> None:
    """The inputs of operation ``idx`` that no operation of the step made and that hold
    NaN/Inf (looked at once each): where a non-finite value came into the step
    (``StepLineage.entries``).  An in-place operation's input is its output afterwards:
    left for the next operation that takes it."""
    if pre is not None:
        return
    for j, (a, tid) in enumerate(zip(ins, in_ids)):
        if tid in cur.producer or tid in cur.entries or tid in cur._clean:
            continue
        if any(_flags([a])):
            cur.entries[tid] = [idx, j]
        else:
            cur._clean.add(tid)


_MUTABLE: dict = {}     # op overload -> does it write one of its inputs


_WRITES: dict = {}      # op overload -> ([(position, name)] of the arguments it writes, "training" position)


def _writes(func) -> tuple:
    """Which arguments an operation writes: those its schema marks
    (``Tensor(a!)``: an in-place op's self); and batch norm's running_mean
    and running_var, which ``aten.native_batch_norm`` (and the cuDNN/MIOpen
    kernels) update in place in training without saying so in the schema."""
    w = _WRITES.get(func)
    if w is None:
        try:
            arguments = func._schema.arguments
            names = [a.name for a in arguments]
            marked = [(i, a.name) for i, a in enumerate(arguments)
                      if a.alias_info is not None and a.alias_info.is_write]
            if not marked and {"running_mean", "running_var", "training"} <= set(names):
                w = ([(names.index(n), n) for n in ("running_mean", "running_var")], names.index("training"))
            else:
                w = (marked, None)
        except Exception:
            w = ([], None)
        _WRITES[func] = w
    return w


def _written(func, args, kwargs) -> list:
    """The tensors among an operation's arguments that it writes (``_writes``)."""
    where, training = _writes(func)
    kw = kwargs or {}
    if training is not None and not (args[training] if training < len(args) else kw.get("training")):
        return []
    out = []
    for i, name in where:
        v = args[i] if i < len(args) else kw.get(name)
        if isinstance(v, torch.Tensor):
            out.append(v)
    return out


def _mutates(func) -> bool:
    m = _MUTABLE.get(func)
    if m is None:
        try:
            m = _MUTABLE[func] = bool(func._schema.is_mutable)
        except Exception:
            m = _MUTABLE[func] = False
    return m


def _described(t: torch.Tensor, outs: list, pre: Optional[tuple]) -> dict:
    """An input as a catch stop shows it; one an in-place operation wrote is
    seen after it (marked so)."""
    d = describe(t)
    if pre is not None and any(o is t for o in outs):
        d["written"] = True
    return d


def _tensors(xs, acc: list) -> list:
    """The tensors in an op's arguments or results (tuples and lists of them):
    torch's pytree is general, and too slow to run on every operation."""
    for x in xs:
        if isinstance(x, torch.Tensor):
            acc.append(x)
        elif isinstance(x, (tuple, list)):
            _tensors(x, acc)
        elif isinstance(x, dict):
            _tensors(tuple(x.values()), acc)
    return acc


def _view_key(t: torch.Tensor):
    try:
        return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype)
    except Exception:
        return None


def _flags(ts: list) -> tuple:
    nan = inf = False
    for t in ts:
        if (t.is_floating_point() or t.is_complex()) and t.numel() and not bool(torch.isfinite(t).all()):
            nan = nan or bool(torch.isnan(t).any())
            inf = inf or bool(torch.isinf(t).any())
    return nan, inf


def describe(t: torch.Tensor) -> dict:
    """A tensor's shape, dtype and a few statistics (for a catch stop's report)."""
    d = {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}
    if (t.is_floating_point() or t.is_complex()) and t.numel():
        with torch.no_grad():
            # (float64 stays float64: .float() made a 1e300 an Inf that was none; the mean is the float64
            # sum of x / n: the sum of -2e37s overflowed, 'mean -inf' of an input with 'inf 0')
            f = t.detach() if t.dtype == torch.float64 else t.detach().float()
            d.update(min=float(f.min()), max=float(f.max()), mean=float((f / f.numel()).sum(dtype=torch.float64)),
                     nan=int(torch.isnan(f).sum()), inf=int(torch.isinf(f).sum()))
    return d
