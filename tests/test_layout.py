"""Architecture rules the code base keeps (see ../shared/STYLE.md)."""
import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "nndb")
UI_ALLOWED = ("cli.py", "__main__.py", "repl" + os.sep, "cli" + os.sep)


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


def test_cli_choices_match_the_trace_schema():
    from nndb import cli
    from nndb.store import schema
    assert cli.STAT_CHOICES == tuple(schema.COLUMNS)
    assert cli.KIND_CHOICES == tuple(schema.KINDS)


# -- the floors ---------------------------------------------------------------------------
# Top to bottom; a module imports only from its own floor or below (imports
# inside functions count).  A module belongs to the floor of its longest
# matching prefix.
# The package itself (its __init__) is the public facade: nndb.open and
# nndb.record import nndb.api when called, so it sits on the top floor, with
# the API; everything else of nndb's that is not listed is on the base floor.
FLOORS = [
    ("cli and the Python API", ("nndb.cli", "nndb.__main__", "nndb.checkrun", "nndb.api",
                                "nndb.__init__", "nndb.notebook", "nndb.fuzzrun",
                                "nndb.runsetup")),
    ("driver", ("nndb.debugger.driver", "nndb.dist")),
    ("front ends", ("nndb.repl", "nndb.debugger.frontend", "nndb.debugger.report", "nndb.inspect", "nndb.inspectrun",
                    "nndb.api.trace")),
    ("commands and renderers", ("nndb.debugger.commands", "nndb.debugger.rcfiles", "nndb.render", "nndb.plot")),
    ("time travel", ("nndb.timetravel", "nndb.fuzz")),
    ("debugger engine", ("nndb.debugger",)),
    ("recording", ("nndb.paths", "nndb.runner", "nndb.check", "nndb.launcher", "nndb.runmeta", "nndb.config", "nndb.export")),
    ("rules, lineage, store", ("nndb.rules", "nndb.lineage", "nndb.store")),
    ("tracer", ("nndb.tracer",)),
    ("base", ("nndb.errors", "nndb.cadence", "nndb.preload", "nndb.store.schema", "nndb.dist.job", "nndb")),
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


def floor_of(module: str) -> int:
    if module == "nndb":
        module = "nndb.__init__"
    best, depth = None, -1
    for i, (_, prefixes) in enumerate(FLOORS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > depth:
                best, depth = i, len(p)
    assert best is not None, f"{module} is on no floor: add it to FLOORS"
    return best


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


def test_the_floor_checks_see_an_upward_import_and_a_cycle():
    assert "nndb.debugger.session" in import_edges()["nndb.debugger.driver"]
    bad = {"nndb.debugger.session": {"nndb.debugger.commands"}, "nndb.debugger.commands": {"nndb.debugger.session"},
           "nndb.tracer.hooks": {"nndb.rules.engine"}}
    assert upward_imports(bad) == [
        "nndb.debugger.session (debugger engine) -> nndb.debugger.commands (commands and renderers)",
        "nndb.tracer.hooks (tracer) -> nndb.rules.engine (rules, lineage, store)"]
    assert import_cycles(bad) == [["nndb.debugger.commands", "nndb.debugger.session", "nndb.debugger.commands"]]
