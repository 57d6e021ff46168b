"""Stable, readable names for the modules, parameters and optimizers of a run.

Names are module paths as ``named_modules()`` gives them (``encoder.0``,
``encoder.0.weight``).  A *root* is a module called when no other module is
running (the model, but also a loss module).  When the first recorded step
saw more than one root that owns parameters (a GAN), every name is qualified
by its root's variable name in the script (``netD.main.0.weight``); a root
with parameters first seen later is always qualified.  A root's own output is
named by that variable name (``model``).  Variable names come from the
script's frames (locals, those of code the user wrote before an installed
package's, then globals, then attributes of ``self``; a method's ``self`` is
not the name of the object it is); where none is found, the class name in
snake case.  An optimizer that no variable of the user's code holds is named by
one that holds a wrapper the script steps in its place (Lightning's ``opt_g,
opt_d = self.optimizers()``) before a library's.  A parameter no forward reached by the time
its optimizer first steps (a module given to the optimizer and never called) is
named by its path in a module a script's variable holds (``extra.weight``), else
by its place in the optimizer (``opt.group0.3``).  A tensor no module holds (trained by
hand) is named by the script's variable, but not a ``for`` loop's, else by its path through
the script's own objects and containers (``model.layers.2.weight``): find_tensor_path.

Why this size: one question, what the script calls a thing, asked of modules, parameters,
optimizers and tensors trained by hand, each answered by looking through the script's frames
and objects the same way (its variables before a loop's, its own code before a library's,
wrappers seen through); ``Naming`` keeps the answers stable for the whole run.  Split by the
kind of thing named, the frame walk and its rules would be written once per kind.
"""
from __future__ import annotations

import dis
import functools
import os
import re
import site
import sys
import sysconfig
import types
import weakref
from typing import Callable, Optional

import torch

from .funcmode import TRAMPOLINE

_SKIP_PREFIXES: tuple = ()


def skip_dirs() -> tuple:
    global _SKIP_PREFIXES
    if not _SKIP_PREFIXES:
        import os
        nndb_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # (not 'import nndb': the
        _SKIP_PREFIXES = (os.path.dirname(torch.__file__), nndb_dir)             # package is the API, above)
    return _SKIP_PREFIXES


def is_compiled_module(m) -> bool:
    """Is ``m`` a ``torch.compile``'d module (an OptimizedModule around its ``_orig_mod``)?  By
    its class's name: importing torch._dynamo to ask would load it into every script (Python
    then ends a KeyboardInterrupt with exit 1, not by SIGINT as without nndb)."""
    return type(m).__name__ == "OptimizedModule" and isinstance(getattr(m, "_orig_mod", None), torch.nn.Module)


def user_frame(depth: int = 1):
    """The innermost frame that belongs to neither torch nor nndb."""
    skip = skip_dirs()
    f = sys._getframe(depth)
    while f is not None and (f.f_code.co_filename.startswith(skip) or f.f_code.co_name == TRAMPOLINE):
        f = f.f_back
    return f


def _library_dirs() -> tuple:
    """Where installed packages and the standard library live (site-packages, the stdlib)."""
    paths = sysconfig.get_paths()
    dirs = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    try:
        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    except Exception:            # (a Python without them: a virtual environment of an old kind)
        pass
    out = set()
    for d in dirs:
        if d:
            out.add(os.path.join(os.path.abspath(d), ""))
            out.add(os.path.join(os.path.realpath(d), ""))
    return tuple(sorted(out))


_LIBRARY = _library_dirs()


def is_library_frame(frame) -> bool:
    """Is ``frame`` an installed package's or the standard library's (not code the user wrote)?"""
    name = frame.f_code.co_filename
    return name.startswith(_LIBRARY) or name.startswith("<frozen ")


def _foreign(frame) -> bool:
    """A frame of code the user did not write: an installed package's, the standard library's,
    torch's or nndb's."""
    return is_library_frame(frame) or frame.f_code.co_filename.startswith(skip_dirs())


def _outwards(frame) -> tuple:
    """The frames from ``frame`` outwards: (those of code the user wrote, the others)."""
    own, other, f = [], [], frame
    while f is not None:
        (other if _foreign(f) else own).append(f)
        f = f.f_back
    return own, other


def find_variable_name(obj, frame, wrapped=None) -> Optional[str]:
    """The name a script uses for ``obj``, looking outwards from ``frame``: a variable of code
    the user wrote that holds it, else (given ``wrapped``, a test) one that holds a wrapper of
    it, else one of a library's frame (a library that runs the script's code, Lightning's
    Trainer, has names of its own for the script's objects: ``pl_module``, ``optimizer``),
    its globals, an attribute of a ``self``.  A method's ``self`` is no name for the object it
    is (a model that calls itself, ``self(x)`` in a LightningModule's ``training_step``: its
    output was the series 'self', its check's model 'self (Net)', two such models 'self' and
    'self2'): the callers' name is."""
    own, other = _outwards(frame)
    seen_selfs = []
    for frames, holds in ((own, lambda v: v is obj), (own if wrapped else (), wrapped),
                          (other, lambda v: v is obj)):
        for f in frames:
            for k, v in list(f.f_locals.items()):
                if not k.startswith(".") and k != "self" and holds(v):
                    return k
                if k == "self" and holds is not wrapped:
                    seen_selfs.append(v)
    if frame is not None:
        for k, v in frame.f_globals.items():
            if v is obj:
                return k
    for s in seen_selfs:
        d = getattr(s, "__dict__", None)
        if isinstance(d, dict):
            for k, v in d.items():
                if v is obj:
                    return k
    return None


def _wrapper_of(opt):
    """A test: is an object one standing for the optimizer ``opt`` that the script steps in
    its place (Lightning's ``LightningOptimizer``, accelerate's ``AcceleratedOptimizer``): not
    a module, with a ``zero_grad`` of its own (an LR scheduler holds its optimizer too, and
    has none), and ``opt`` among its own attributes?"""
    def test(v) -> bool:
        if isinstance(v, torch.nn.Module) or not callable(getattr(type(v), "zero_grad", None)):
            return False
        try:
            d = object.__getattribute__(v, "__dict__")
        except Exception:            # (no __dict__: slots, a C type)
            return False
        return isinstance(d, dict) and any(x is opt for x in list(d.values()))
    return test


def _scopes(frame) -> list:
    """The script's scopes seen from ``frame``: its locals and its callers', outwards, then its globals."""
    f, scopes = frame, []
    while f is not None:
        scopes.append(f.f_locals)
        f = f.f_back
    if frame is not None:
        scopes.append(frame.f_globals)
    return scopes


@functools.lru_cache(maxsize=64)      # (asked once per tensor named, of every frame's code)
def loop_targets(code) -> frozenset:
    """The names a ``for`` loop of ``code`` binds (``p`` of ``for p in parameters``, ``i`` and
    ``p`` of ``for i, p in enumerate(parameters)``): after the loop such a name holds its last
    item, no name of that tensor's (it named the last of a list's 12 tensors ``p``)."""
    out, ins = set(), list(dis.get_instructions(code)) if code is not None else []
    for i, ins_ in enumerate(ins):
        if ins_.opname != "FOR_ITER":
            continue
        want, j = 1, i + 1
        while want and j < len(ins):
            op = ins[j].opname
            if op == "UNPACK_SEQUENCE":
                want += ins[j].arg
            elif op.startswith("STORE_"):
                names = ins[j].argval
                out.update(names if isinstance(names, tuple) else [names])
            elif op not in ("EXTENDED_ARG", "CACHE", "NOP"):
                break
            want -= op.startswith("STORE_") or op == "UNPACK_SEQUENCE"
            j += 1
    return frozenset(n for n in out if isinstance(n, str))


# How far find_tensor_path looks into the script's own objects and containers: three links
# (``model.layers.2.weight``), containers of at most _PATH_ITEMS items (a list of names read
# from a file is not looked through).
_PATH_DEPTH = 3
_PATH_ITEMS = 1024


def _links(v) -> list:
    """(name, value, is an attribute or key) of what a container or an object of the script's
    own classes holds, [] for anything else (modules and tensors are named elsewhere)."""
    if isinstance(v, (list, tuple)):
        return [(str(i), x, False) for i, x in enumerate(v)] if len(v) <= _PATH_ITEMS else []
    if isinstance(v, dict):
        return [(k, x, True) for k, x in list(v.items())[:_PATH_ITEMS] if isinstance(k, str) and k.isidentifier()] \
            if len(v) <= _PATH_ITEMS else []
    if isinstance(v, (type, types.ModuleType, types.FunctionType, types.MethodType, torch.Tensor, torch.nn.Module,
                      torch.optim.Optimizer)):
        return []
    d = getattr(v, "__dict__", None)
    mod = sys.modules.get(type(v).__module__)
    src = getattr(mod, "__file__", None) or ""
    if not isinstance(d, dict) or (type(v).__module__ != "__main__" and (
            not src or src.startswith(_LIBRARY) or src.startswith(skip_dirs()))):
        return []
    return [(k, x, True) for k, x in list(d.items())[:_PATH_ITEMS] if not k.startswith("_")]



def find_tensor_path(p, frame) -> Optional[str]:
    """The name a script uses for a tensor no module holds: its variable (``W1``), but not
    a ``for`` loop's; else its path through the script's own objects and containers, by
    attribute or key where one holds it so (``model.layers.2.weight``: the layer it is in,
    not its place in a flat list), else by place (``parameters.3``); None where none holds
    it within _PATH_DEPTH links."""
    # (a namespace with the loops of every code that runs in it: a notebook's cell runs in the
    # kernel's namespace under IPython's own ``run_cell_magic(...)`` line, which has none)
    scopes, loops, f = [], {}, frame
    while f is not None:
        if id(f.f_locals) not in loops:
            scopes.append(f.f_locals)
        loops[id(f.f_locals)] = loops.get(id(f.f_locals), frozenset()) | loop_targets(f.f_code)
        f = f.f_back
    if frame is not None and id(frame.f_globals) not in loops:
        scopes.append(frame.f_globals)
    queue, seen, by_place = [], set(), None
    for scope in scopes:
        skip = loops.get(id(scope), ())
        for k, v in list(scope.items()):
            if k.startswith((".", "_")) or k in skip:
                continue
            if v is p:
                return k
            queue.append((k, v))
    for _ in range(_PATH_DEPTH):
        nxt = []
        for path, v in queue:
            if id(v) in seen:
                continue
            seen.add(id(v))
            for name, x, named in _links(v):
                if x is p:
                    if named:
                        return f"{path}.{name}"
                    by_place = by_place or f"{path}.{name}"
                elif not isinstance(x, (str, int, float, bool, torch.Tensor)) and x is not None:
                    nxt.append((f"{path}.{name}", x))
        queue = nxt
    return by_place


# Containers that slicing makes anew at every call (``cnn[:2]`` is a new nn.Sequential of
# cnn's layers; a ModuleList's slice likewise)
_VIEW_TYPES = (torch.nn.Sequential, torch.nn.ModuleList)


def view_children(module) -> tuple:
    """The layers of a container that may be a slice of another model's (``cnn[:2]``), or ()."""
    return tuple(module.children()) if type(module) in _VIEW_TYPES else ()


def find_container(module, frame):
    """The largest module a script's variable holds (looking outwards from
    ``frame``, then its globals) that has ``module`` inside it, or None: the
    model whose layers the script calls one by one (``model[0](x)``), or whose
    slice it calls (``cnn[:2](x)``: all of ``module``'s layers are in it)."""
    best, size = None, 0
    kids = {id(k) for k in view_children(module)}
    for scope in _scopes(frame):
        values = list(scope.values())
        own = scope.get("self")
        if own is not None and not isinstance(own, torch.nn.Module):
            # (a model of the script's own class that is no module, whose method calls the
            # layers of a ModuleDict or ModuleList it holds, ``for name, m in self.blocks.items()``:
            # they were roots named by the loop's variable, 'm' and 'm2')
            values += [x for _, x, _ in _links(own)]
        for v in values:
            if isinstance(v, torch.nn.Module) and v is not module:
                mods = list(v.modules())
                if len(mods) > size and not _wraps(v, module) and (
                        any(m is module for m in mods) or (kids and kids <= {id(m) for m in mods})):
                    best, size = v, len(mods)
    return best


def find_module_path(p, frame) -> Optional[str]:
    """``var.path`` of ``p`` in a module a script's variable holds (looking outwards from
    ``frame``, then its globals), or None: a module given to an optimizer but never called
    (``extra.weight``), which no forward names."""
    for scope in _scopes(frame):
        for k, v in list(scope.items()):
            if isinstance(v, torch.nn.Module) and not k.startswith("."):
                for sub, q in _named(v.named_parameters(remove_duplicate=True)):
                    if q is p:
                        return f"{k}.{sub}"
    return None


# Where a wrapper keeps the model it wraps (DDP and DataParallel: ``module``; torch.compile:
# ``_orig_mod``; FSDP's: ``_fsdp_wrapped_module``)
_WRAPPED = ("module", "_orig_mod", "_fsdp_wrapped_module")


def _wraps(outer, module) -> bool:
    """``outer`` only wraps ``module`` (DDP, DataParallel, torch.compile's module: the same
    parameters, ``module`` held where a wrapper keeps it): the script's model is ``module``
    itself.  A model that holds ``module`` as a part of its own (a LightningModule's
    ``self.net``, the same parameters too) is no wrapper: ``module`` is named by its path in it."""
    if not any(getattr(outer, a, None) is module for a in _WRAPPED):
        return False
    return {id(p) for p in outer.parameters()} == {id(p) for p in module.parameters()}


def _named(items):
    """Module paths as the script knows them: torch.compile's wrapper puts the
    model under ``_orig_mod`` (``_orig_mod.0.weight`` is ``0.weight``)."""
    for sub, x in items:
        yield (_ORIG_MOD.sub("", sub) if "_orig_mod." in sub else sub), x


_ORIG_MOD = re.compile(r"(?:(?<=\.)|^)_orig_mod\.")


def unique(base: str, used: set) -> str:
    """``base``, or ``base2``, ``base3``...: the first not in ``used`` (which it joins)."""
    name, i = base, 1
    while name in used:
        i += 1
        name = f"{base}{i}"
    used.add(name)
    return name


def snake(name: str) -> str:
    """A class's name as a variable's: ``SmallCNN`` -> ``small_cnn``, ``SGD`` ->
    ``sgd``, ``ReLU`` -> ``relu``, ``BatchNorm2d`` -> ``batch_norm2d`` (a run of
    capitals is one word, as is a capital with one more after it and no
    lower case: the ``LU`` of ``ReLU``; it read ``s_g_d`` and ``re_l_u``)."""
    words = re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+", name)
    out = []
    for w in words:
        if out and len(w) <= 2 and w.isupper() and out[-1][:1].isupper() and out[-1][1:].islower():
            out[-1] += w                  # (ReLU, GeLU: one word)
        else:
            out.append(w)
    return "_".join(out).lower() if out else name.lower()


class Naming:
    def __init__(self):
        # (the roots held by weak references: a value that held its key kept every model a
        # script let go alive, a k-fold loop's each fold's model)
        self._module_path: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # module -> (weakref root, sub)
        self._param_path: dict = {}      # id(param) -> (weakref param, weakref root, sub)
        self._root_names: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._used_root_names: set = set()
        self._paramless_names: set = set()   # root names given to modules without parameters
        self._param_roots: list = []     # weakrefs of roots that own parameters, in order seen
        self._qualified_roots: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        # weakref of a root with parameters -> (its name, qualified?): the names of its parameters
        # once it is gone while they live on (an optimizer, or the rules' step some steps behind
        # the script, holds them: a k-fold loop's fold ended)
        self._prefixes: dict = {}
        self._frozen = False
        self._compiled: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # module -> its OptimizedModule
        # id(an OptimizedModule's _orig_mod) -> a weakref of it: its call is the compiled module's
        # own (torch.compile compiles its forward; its hooks run as Python), not a module of its own
        self.compiled_bodies: dict = {}
        self._opt_names: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._used_opt_names: set = set()
        self._loose_names: dict = {}     # id(param) -> (weakref param, name)
        self._adopted: list = []         # weakrefs of tensors trained outside any module (``adopt``)
        self._used_loose: set = set()
        self.loss_qualified = False
        # id -> weakref of the slices of a known model called (``cnn[:2](x)``, a new container
        # at every call): no root of their own, their layers named in that model, no series
        self.views: dict = {}
        self.roots_version = 0           # bumped when a root is added      # set once a step had losses for several optimizers

    # -- registration -----------------------------------------------------
    def knows(self, module) -> bool:
        return module in self._module_path

    def is_view(self, module) -> bool:
        ref = self.views.get(id(module))
        return ref is not None and ref() is module

    def _view(self, module) -> None:
        views = self.views
        views[id(module)] = weakref.ref(module, lambda _, i=id(module): views.pop(i, None))

    def add_root(self, root: torch.nn.Module, frame) -> None:
        if root in self._module_path:
            return
        kids = view_children(root)
        if kids and all(k in self._module_path for k in kids):
            # a slice of a known model (``cnn[:2](x)`` at every step: a new container each
            # call, a new root 'sequential2', 'sequential3'... and a series each, without end)
            self._view(root)
            return
        outer = find_container(root, frame) if frame is not None else None
        if outer is not None and outer not in self._module_path:
            # a layer called on its own (``model[0](x)``, ``for layer in model: h = layer(h)``):
            # named by its path in the model a variable holds ('0.weight', as
            # model.named_parameters() names it), not by its class or the loop's variable
            # ('linear.weight' or 'layer.weight', then 'layer3.weight'); a slice of it
            # (``cnn[:2]``) likewise, the slice no model of its own
            if kids and not any(m is root for m in outer.modules()):
                self._view(root)
            root = outer
        var = find_variable_name(root, frame)
        used = self._used_root_names
        if next(root.parameters(), None) is None:
            # A module without parameters that the script makes again (a criterion made in each
            # epoch's train(), ``nn.CrossEntropyLoss()(out, y)`` at each step): the name of one
            # that is gone is free for it, one series ('criterion' for every epoch; it was
            # 'criterion', then 'criterion2', 'criterion3', a series per epoch).
            live = set(self._root_names.values())
            used = used - {n for n in self._paramless_names if n not in live}
            name = unique(var or snake(type(root).__name__), used)
            self._used_root_names.add(name)
            self._paramless_names.add(name)
        else:
            name = unique(var or snake(type(root).__name__), used)
        self._root_names[root] = name
        self.roots_version += 1
        # A module called on its own before step 0 ends, and so taken for a root, that turns out
        # to be inside this one (spectral_norm's ParametrizationList calls itself as it is made)
        # is part of it: named by its path in it ('0.parametrizations.weight.original').
        inside = {m for _, m in root.named_modules()} if not self._frozen else ()
        ref_root = weakref.ref(root)
        absorbed = set()
        for sub, m in _named(root.named_modules(remove_duplicate=True)):
            self._note_compiled(m)
            entry = self._module_path.get(m)
            held = entry[0]() if entry is not None else None
            if entry is not None and held is not root and held in inside:
                absorbed.add(held)
                entry = None
            if entry is None:
                self._module_path[m] = (ref_root, sub)
        for gone in absorbed:
            self._used_root_names.discard(self._root_names.pop(gone, None))
            self._param_roots = [r for r in self._param_roots if r() is not gone]
        has_params = False
        for sub, p in _named(root.named_parameters(remove_duplicate=True)):
            has_params = True
            entry = self._param_path.get(id(p))
            if entry is None or entry[0]() is not p or entry[1]() in absorbed:
                self._param_path[id(p)] = (weakref.ref(p), ref_root, sub)
        if has_params:
            self._param_roots.append(weakref.ref(root))
            # (after tensors trained outside any module, nn_tutorial's ``weights`` and ``bias``
            # trained by hand and then a model's: its unqualified 'weights' was their series,
            # and its own parameters had none)
            if self._frozen and (len(self._param_roots) > 1 or any(r() is not None for r in self._adopted)):
                self._qualified_roots[root] = True
            self._prefixes[ref_root] = (name, root in self._qualified_roots)

    def _note_compiled(self, m) -> None:
        if is_compiled_module(m):
            self.compiled_bodies[id(m._orig_mod)] = weakref.ref(m._orig_mod)
            for inner in m._orig_mod.modules():
                if inner is not m._orig_mod:
                    self._compiled[inner] = m

    def compiled_around(self, module) -> Optional[str]:
        """The name of the ``torch.compile``'d module that ``module`` runs
        inside (nndb's module hooks do nothing there: nndb.tracer.hooks), or None."""
        outer = self._compiled.get(module)
        return None if outer is None else self.module_name(outer)

    def roots(self) -> list:
        """Every root module seen so far (alive ones), in the order seen."""
        return list(self._root_names.keys())

    @property
    def frozen(self) -> bool:
        return self._frozen

    def freeze(self) -> None:
        """Called when step 0 ends: decide whether names are qualified."""
        if self._frozen:
            return
        self._frozen = True
        roots = [r() for r in self._param_roots if r() is not None]
        if len(roots) > 1:
            for r in roots:
                self._qualified_roots[r] = True
                ref = weakref.ref(r)
                if ref in self._prefixes:
                    self._prefixes[ref] = (self._prefixes[ref][0], True)
            self.roots_version += 1      # (what the names resolve to changed: '2' is 'body.2' now)

    def root_params(self) -> list:
        """Parameters of every root seen so far (alive ones), then the tensors adopted."""
        out, seen = [], set()
        for ref in self._param_roots:
            r = ref()
            if r is None:
                continue
            for p in r.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        for ref in self._adopted:
            p = ref()
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                out.append(p)
        return out

    def has_path(self, p: torch.Tensor) -> bool:
        """Is ``p`` a parameter of a root seen (named by its module path)?"""
        entry = self._param_path.get(id(p))
        return entry is not None and entry[0]() is p

    def names_param(self, p: torch.Tensor) -> bool:
        """Does the run name ``p`` (a root's parameter, or one trained outside any module)?"""
        if self.has_path(p):
            return True
        loose = self._loose_names.get(id(p))
        return loose is not None and loose[0]() is p

    def adopt(self, p: torch.Tensor, frame, along=()) -> None:
        """A tensor a script trains by hand outside any module (``w -= lr * w.grad``): one of
        the run's parameters, named as the script names it (``find_tensor_path``: ``w``,
        ``layers.0.weight``), else ``tensor<i>``.  ``along``: the tensors one backward adopts
        with it.  The name of one adopted before and not among them is free for it: the script
        made the tensor anew (``W = torch.randn(..., requires_grad=True)`` again, a notebook's
        init cell run again), and its series goes on under the name (it was ``tensor2``: the
        first ``W`` lived on, in nndb's record of the step before)."""
        if any(r() is p for r in self._adopted):
            return
        self._adopted.append(weakref.ref(p))
        ids = {id(t) for t in along}
        free = {self._loose_names[id(q)][1] for r in self._adopted if (q := r()) is not None
                and id(q) not in ids and id(q) in self._loose_names}
        self.note_param(p, frame, fallback=lambda: unique("tensor", self._used_loose), free=free)

    # -- names ------------------------------------------------------------
    def _qualify(self, root, sub: str, ref=None) -> str:
        """``root``: the root module, or None where it is gone (then as it was named while
        it lived, ``ref`` its weakref; its path alone where that is not known)."""
        if root is None:
            name, qualified = self._prefixes.get(ref, (None, False)) if ref is not None else (None, False)
            if not sub:
                return name or "model"
            return f"{name}.{sub}" if qualified else sub
        rname = self._root_names.get(root, "model")
        if not sub:
            return rname
        if root in self._qualified_roots:
            return f"{rname}.{sub}"
        return sub

    def module_name(self, module) -> str:
        """``module`` may be a module class: the modules of it that no model holds
        (made in a forward, hooks.Tracer._forward_post_quiet)."""
        if isinstance(module, type):
            return snake(module.__name__)
        entry = self._module_path.get(module)
        if entry is None:        # (new modules with parameters are found by refresh as those are hooked)
            return snake(type(module).__name__)
        root, sub = entry[0](), entry[1]
        if root is not None and sub and sub == self._root_names.get(root):
            # (a layer at the path its model's variable is named, char_rnn's ``rnn.rnn``, HF's
            # ``model.model``: its output and the model's were one series, the model's)
            return f"{sub}.{sub}"
        return self._qualify(root, sub)

    def qualified_alias(self, module) -> Optional[str]:
        """The name ``module`` has qualified by its model's variable (``body.2`` for ``2``, the
        path the script writes), where its name is not: before step 0 ends, while names are not
        yet qualified (``freeze``), and in a run whose names stay so (one model); else None.
        A module stop point written with it stops at step 0 too, where the model turns out
        to be one of several, and at every step where it is the only one: 'break module
        model.2' stopped at step 0 alone, the names settled unqualified ('2') as it ended."""
        if isinstance(module, type):
            return None
        entry = self._module_path.get(module)
        if entry is None:
            return None
        return self._alias(entry[0](), entry[1])

    def _alias(self, root, sub: str) -> Optional[str]:
        rname = self._root_names.get(root) if root is not None else None
        if not sub or rname is None or root in self._qualified_roots:
            return None
        return f"{rname}.{sub}"

    def qualified_param_alias(self, p: torch.Tensor) -> Optional[str]:
        """``qualified_alias`` of a parameter: ``D.0.weight`` for ``0.weight`` while names are not
        yet qualified (step 0), so that a glob written for it matches there too; else None."""
        entry = self._param_path.get(id(p))
        if entry is None or entry[0]() is not p:
            return None
        return self._alias(entry[1](), entry[2])

    def refresh(self) -> None:
        """Modules and parameters new in the known roots (a head replaced, weights loaded with
        ``assign=True``): named by their place in the root, as the first ones were.  A parameter
        the root now holds at another path (pruning's ``0.weight`` is ``0.weight_orig`` until
        ``prune.remove``; a parametrization's ``0.parametrizations.weight.original``) is named
        by that path from now on, as ``named_parameters()`` names it."""
        moved = {}                       # (root, path) -> id of the parameter now there
        renamed = False
        for root in self.roots():
            ref_root = weakref.ref(root)
            for sub, m in _named(root.named_modules(remove_duplicate=True)):
                self._note_compiled(m)
                if m not in self._module_path:
                    self._module_path[m] = (ref_root, sub)
            for sub, p in _named(root.named_parameters(remove_duplicate=True)):
                entry = self._param_path.get(id(p))
                if entry is None or entry[0]() is not p:
                    self._param_path[id(p)] = (weakref.ref(p), ref_root, sub)
                    moved[(id(root), sub)] = id(p)
                elif entry[1]() is root and entry[2] != sub:
                    self._param_path[id(p)] = (entry[0], ref_root, sub)
                    renamed = True
        if renamed and not moved:
            self.roots_version += 1      # (what the names resolve to changed)
        if not moved:
            return
        # A tensor that held one of these places (alive in an optimizer) is no longer the model's:
        # it is named as a tensor no module holds, "replaced.<its old name>".
        for i, (ref, rref, sub) in list(self._param_path.items()):
            old, root = ref(), rref()
            if root is not None and moved.get((id(root), sub), i) != i:
                del self._param_path[i]
                if old is not None:
                    self._loose_names[i] = (ref, unique("replaced." + self._qualify(root, sub), self._used_loose))
        self.roots_version += 1          # (what the names resolve to changed)

    def note_param(self, p: torch.Tensor, frame, fallback: Callable[[], str], free=frozenset()) -> None:
        """Remember a name for a parameter that may belong to no module: the
        script's name for it if it has one, else ``fallback``'s.  A module
        path found later (the model's first forward) takes precedence.  ``free``: names
        another parameter has that this one may have too (``adopt``)."""
        if id(p) in self._param_path and self._param_path[id(p)][0]() is p:
            return
        loose = self._loose_names.get(id(p))
        if loose is not None and loose[0]() is p:       # (named already: "replaced.<name>" stays)
            return
        # (a name another parameter has already is not this one's: a loop variable holding each layer
        # in turn, ``for layer in layers: layer.forward(x)``, named both layers' weights layer.weight,
        # one series of two tensors)
        taken = {name for ref, name in self._loose_names.values() if ref() is not None} - set(free)
        found = [n for n in (find_tensor_path(p, frame), find_module_path(p, frame)) if n and n not in taken]
        self._loose_names[id(p)] = (weakref.ref(p), found[0] if found else fallback())

    def param_name(self, p: torch.Tensor) -> str:
        entry = self._param_path.get(id(p))
        if entry is not None and entry[0]() is p:
            _, rref, sub = entry
            return self._qualify(rref(), sub, rref)
        loose = self._loose_names.get(id(p))
        if loose is not None and loose[0]() is p:
            return loose[1]
        self.refresh()
        entry = self._param_path.get(id(p))
        if entry is not None and entry[0]() is p:
            return self._qualify(entry[1](), entry[2], entry[1])
        return f"tensor{id(p):x}"

    def unqualified_models(self) -> list:
        """The variable names of the models with parameters, alive or gone, whose names are
        not qualified by them (the one model of a run: its '2', which 'model.2' names as the
        script writes it; qualified_alias)."""
        return [name for name, qualified in self._prefixes.values() if not qualified]

    def tied_paths(self) -> dict:
        """{a parameter's name: its other paths in its model, named as the recorded names are}
        for a parameter a model holds at several paths (weights tied: a language model's output
        layer and its embedding, GPT-2's ``lm_head.weight`` and ``transformer.wte.weight``),
        which ``named_parameters()``, and so the trace, names once, by the first."""
        out: dict = {}
        for root in self.roots():
            first: dict = {}
            for sub, p in _named(root.named_parameters(remove_duplicate=False)):
                if first.setdefault(id(p), sub) != sub:
                    out.setdefault(self.param_name(p), []).append(self._qualify(root, sub))
        return out

    def optimizer_name(self, opt, frame=None) -> str:
        name = self._opt_names.get(opt)
        if name is None:
            # (``opt_g, opt_d = self.optimizers()`` in a LightningModule's training_step:
            # Lightning's wrappers, each stepped in its precision plugin's
            # optimizer_step(optimizer): they were 'optimizer' and 'optimizer2')
            base = (find_variable_name(opt, frame, _wrapper_of(opt)) if frame is not None else None) \
                or snake(type(opt).__name__)
            name = unique(base, self._used_opt_names)
            self._opt_names[opt] = name
        return name
