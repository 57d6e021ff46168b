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


def test_modules_stay_small():
    for rel, tree in modules():
        n = len(open(os.path.join(ROOT, rel)).read().splitlines())
        assert n <= 500, f"{rel} has {n} lines; split it"


def test_cli_choices_match_the_trace_schema():
    from nndb import cli
    from nndb.store import schema
    assert cli.STAT_CHOICES == tuple(schema.COLUMNS)
    assert cli.KIND_CHOICES == tuple(schema.KINDS)
