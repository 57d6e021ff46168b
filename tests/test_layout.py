"""Architecture rules the code base keeps (see ../shared/STYLE.md)."""
import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "nndb")
UI_ALLOWED = ("__main__.py", "cli" + os.sep, os.path.join("frontends", "repl.py"),
              os.path.join("frontends", "completer.py"), os.path.join("frontends", "toolbar.py"))


def modules():
    for d, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                yield os.path.relpath(path, ROOT), ast.parse(open(path).read(), path)


def imported(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module.split(".")[0]


def test_core_is_free_of_ui_packages():
    offenders = [rel for rel, tree in modules()
                 if not rel.startswith(UI_ALLOWED) and {"click", "prompt_toolkit"} & set(imported(tree))]
    assert offenders == []


def test_nothing_is_unpickled():
    for rel, tree in modules():
        assert not {"pickle", "dill", "cloudpickle", "marshal", "shelve"} & set(imported(tree)), rel
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load":
                owner = getattr(node.func.value, "id", None)
                if owner == "torch":
                    kw = {k.arg: k.value for k in node.keywords}
                    assert isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True, rel
                if owner in ("np", "numpy"):
                    assert not any(k.arg == "allow_pickle" for k in node.keywords), rel


SIZE_LINES = 600


def oversized_without_reason(rel, source, tree):
    """Size is a reason to look, not a wall: a module over SIZE_LINES lines
    says why in its docstring, in a paragraph starting 'Why this size:'."""
    n = len(source.splitlines())
    if n <= SIZE_LINES or "Why this size:" in (ast.get_docstring(tree) or ""):
        return None
    return f"{rel} has {n} lines and its docstring does not say why ('Why this size: ...')"


def test_a_large_module_says_why():
    offenders = [msg for rel, tree in modules()
                 for msg in [oversized_without_reason(rel, open(os.path.join(ROOT, rel)).read(), tree)] if msg]
    assert offenders == []


def test_the_size_check_sees_a_large_module_without_a_reason():
    body = "x = 1\n" * (SIZE_LINES + 1)
    assert oversized_without_reason("big.py", body, ast.parse(body))
    reasoned = '"""One parser.\n\nWhy this size: one grammar, read whole."""\n' + body
    assert oversized_without_reason("big.py", reasoned, ast.parse(reasoned)) is None
    assert oversized_without_reason("small.py", "x = 1\n", ast.parse("x = 1\n")) is None


SIZE_ATTRIBUTES = 25


def instance_attributes(cls: ast.ClassDef) -> set:
    """The names a class's own methods assign on their first argument (``self.X = ...``)."""
    names = set()
    for item in cls.body:
        if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) or not item.args.args or \
                any(getattr(d, "id", None) == "staticmethod" for d in item.decorator_list):
            continue
        me = item.args.args[0].arg
        for node in ast.walk(item):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                    isinstance(node.value, ast.Name) and node.value.id == me:
                names.add(node.attr)
    return names


def crowded_without_reason(rel, tree):
    """A class with more than SIZE_ATTRIBUTES instance attributes says why in
    its docstring, in a paragraph starting 'Why this size:'."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            n = len(instance_attributes(node))
            if n > SIZE_ATTRIBUTES and "Why this size:" not in (ast.get_docstring(node) or ""):
                out.append(f"{rel}: class {node.name} has {n} attributes and its docstring does not say why "
                           f"('Why this size: ...')")
    return out


def test_a_large_class_says_why():
    offenders = [msg for rel, tree in modules() for msg in crowded_without_reason(rel, tree)]
    assert offenders == []


def test_the_size_check_sees_a_large_class_without_a_reason():
    body = "".join(f"        self.a{i} = {i}\n" for i in range(SIZE_ATTRIBUTES + 1))
    crowded = "class Big:\n    def __init__(self):\n" + body
    assert crowded_without_reason("big.py", ast.parse(crowded)) == [
        f"big.py: class Big has {SIZE_ATTRIBUTES + 1} attributes and its docstring does not say why "
        f"('Why this size: ...')"]
    reasoned = 'class Big:\n    """One thing.\n\n    Why this size: one recorder, read whole."""\n' \
        "    def __init__(self):\n" + body
    assert crowded_without_reason("big.py", ast.parse(reasoned)) == []
    spread = "class Small:\n    def a(me):\n        me.x, me.y = 1, 2\n    def b(self):\n        self.x = 3\n"
    assert instance_attributes(ast.parse(spread).body[0]) == {"x", "y"}
    assert crowded_without_reason("small.py", ast.parse(spread)) == []


def test_cli_choices_match_the_trace_schema():
    from nndb import cli
    from nndb import schema
    assert cli.STAT_CHOICES == tuple(schema.COLUMNS)
    assert cli.KIND_CHOICES == tuple(schema.KINDS)


# -- the floors ---------------------------------------------------------------------------
# Top to bottom; a module imports only from its own floor or below (imports
# inside functions count).  A floor holds whole packages and leaf modules of
# the root, never a part of a package: the folder tree is the plan.  Every
# package and root module is listed (a new one must be placed), and no two
# packages import each other, even on one floor.
FLOORS = [
    ("face", ("nndb.__init__", "nndb.__main__", "nndb.cli")),
    ("Python API", ("nndb.api",)),
    ("composition", ("nndb.driver", "nndb.distributed")),
    ("front ends", ("nndb.frontends",)),
    ("commands and renderers", ("nndb.commands", "nndb.render")),
    ("time travel", ("nndb.timetravel", "nndb.fuzz")),
    ("debugger engine", ("nndb.debugger",)),
    ("running, checks, exports", ("nndb.run", "nndb.check", "nndb.export")),
    ("rules and lineage", ("nndb.rules", "nndb.lineage")),
    ("store", ("nndb.store",)),
    ("tracer", ("nndb.tracer",)),
    ("leaves", ("nndb.errors", "nndb.schema", "nndb.cadence", "nndb.globs", "nndb.histogram", "nndb.text",
                "nndb.version", "nndb.extras")),
]


def _module_names() -> dict:
    out = {}
    for rel, tree in modules():
        name = "nndb." + rel[:-3].replace(os.sep, ".")
        is_pkg = name.endswith(".__init__")
        out[name[: -len(".__init__")] if is_pkg else name] = (tree, is_pkg)
    return out


def import_edges() -> dict:
    """module -> the nndb modules it imports (a name imported from a package
    counts as its submodule when it is one)."""
    mods = _module_names()
    edges = {m: set() for m in mods}
    for m, (tree, is_pkg) in mods.items():
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = m.split(".") if is_pkg else m.split(".")[:-1]
                    parts = parts[: len(parts) - (node.level - 1)]
                    stem = ".".join(parts + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in mods else stem for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m and t.startswith("nndb"):
                    edges[m].add(t)
    return edges


def unit_of(module: str) -> str:
    """The package or root module a module belongs to (``nndb.X``)."""
    if module == "nndb":
        return "nndb.__init__"
    return ".".join(module.split(".")[:2])


def floor_of(module: str) -> int:
    unit = unit_of(module)
    for i, (_, units) in enumerate(FLOORS):
        if unit in units:
            return i
    raise AssertionError(f"{unit} is on no floor: add it to FLOORS")


def unit_cycles(edges: dict) -> list:
    """Cycles between packages (and root modules): the knots a floor plan hides."""
    units: dict = {}
    for m, ts in edges.items():
        for t in ts:
            a, b = unit_of(m), unit_of(t)
            if a != b and not (a == "nndb.__init__" and m == "nndb"):
                units.setdefault(a, set()).add(b)
    return import_cycles(units)


def upward_imports(edges: dict) -> list:
    return sorted(f"{m} ({FLOORS[floor_of(m)][0]}) -> {t} ({FLOORS[floor_of(t)][0]})"
                  for m, ts in edges.items() for t in ts
                  if floor_of(t) < floor_of(m) and not m.startswith(t + "."))   # (a package's own __init__)


def import_cycles(edges: dict) -> list:
    state, cycles = {}, []

    def visit(m, path):
        state[m] = 1
        for t in sorted(edges.get(m, ())):
            if state.get(t) == 1:
                cycles.append(path[path.index(t):] + [t])
            elif t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    return cycles


def test_no_module_imports_a_floor_above_its_own():
    assert upward_imports(import_edges()) == []


def test_no_import_cycles():
    assert import_cycles(import_edges()) == []


def test_no_two_packages_import_each_other():
    assert unit_cycles(import_edges()) == []


def test_every_package_and_root_module_is_on_a_floor():
    units = {unit_of(m) for m in import_edges()}
    listed = [u for _, us in FLOORS for u in us]
    assert sorted(units) == sorted(listed)
    assert len(listed) == len(set(listed))


def test_the_floor_checks_see_an_upward_import_and_a_cycle():
    assert "nndb.debugger.session" in import_edges()["nndb.driver"]
    bad = {"nndb.debugger.session": {"nndb.commands"}, "nndb.commands": {"nndb.debugger.session"},
           "nndb.tracer.hooks": {"nndb.rules.engine"}}
    assert upward_imports(bad) == [
        "nndb.debugger.session (debugger engine) -> nndb.commands (commands and renderers)",
        "nndb.tracer.hooks (tracer) -> nndb.rules.engine (rules and lineage)"]
    assert import_cycles(bad) == [["nndb.commands", "nndb.debugger.session", "nndb.commands"]]


# -- private names stay in their package ---------------------------------------------------

# torch's own private attributes that nndb reads on torch's objects and that
# are also names of nndb's (a tensor's ``_version`` counter).
TORCH_PRIVATE = {"_version"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in TORCH_PRIVATE


def private_reaches(trees: dict) -> list:
    """Uses of a ``_private`` name of nndb's (a function, class, constant or
    attribute defined in one package) from another package: ``obj._x`` and
    ``from ..pkg.mod import _x``.  An attribute of a module that is not
    nndb's (``torch._C``, ``sys._getframe``) is the other library's business."""
    defined: dict = {}
    for rel, tree in trees.items():
        unit = unit_of("nndb." + rel[:-3].replace(os.sep, "."))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names = [node.attr]
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names = [node.id]
            defined.update({n: defined.get(n, set()) | {unit} for n in names if _private(n)})
    out = []
    for rel, tree in trees.items():
        unit = unit_of("nndb." + rel[:-3].replace(os.sep, "."))
        foreign = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                   for a in node.names if not a.name.startswith("nndb")}
        for node in ast.walk(tree):
            used = []
            if isinstance(node, ast.Attribute) and _private(node.attr):
                base = node.value
                if not (isinstance(base, ast.Name) and (base.id in ("self", "cls") or base.id in foreign)):
                    used = [node.attr]
            elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("nndb")):
                used = [a.name for a in node.names if _private(a.name)]
            out += [f"{rel}:{node.lineno} {n} (of {', '.join(sorted(defined[n]))})"
                    for n in used if n in defined and unit not in defined[n]]
    return sorted(out)


def test_no_package_touches_another_packages_private_names():
    assert private_reaches({rel: tree for rel, tree in modules()}) == []


def test_the_private_check_sees_a_reach():
    owner = ast.parse("class T:\n    def _set_forward(self, on):\n        self._busy = on\n")
    user = ast.parse("import torch\ndef f(t):\n    t._set_forward(True)\n    return t._busy, torch._C\n")
    inside = ast.parse("def g(t):\n    t._set_forward(False)\n")
    found = private_reaches({os.path.join("tracer", "hooks.py"): owner, os.path.join("rules", "x.py"): user,
                             os.path.join("tracer", "y.py"): inside})
    assert found == ["rules/x.py:3 _set_forward (of nndb.tracer)".replace("/", os.sep),
                     "rules/x.py:4 _busy (of nndb.tracer)".replace("/", os.sep)]
