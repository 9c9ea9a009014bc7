"""The import rules of docs/architecture.md, read from the source: `splitkv_common` knows no backend,
backends (`cuda_ref`, `ascend_ops`) never import each other, integrations (`splitkv_vllm`) may
import backends. A violating import anywhere in a module (top level or inside a function) fails, and
so does an import circle among the modules of the four packages (below)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMMON, BACKENDS, INTEGRATIONS = "splitkv_common", ("cuda_ref", "ascend_ops"), ("splitkv_vllm",)
ALLOWED = {
    COMMON: {COMMON},
    "cuda_ref": {COMMON, "cuda_ref"},
    "ascend_ops": {COMMON, "ascend_ops"},
    "splitkv_vllm": {COMMON, "splitkv_vllm", *BACKENDS},
}


def imported_packages(path: Path) -> set[tuple[str, int]]:
    """(top-level package, line) of every absolute import of a project package in ``path``."""
    found = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found |= {(n.split(".")[0], node.lineno) for n in names if n.split(".")[0] in ALLOWED}
    for node in ast.walk(tree):  # importlib.import_module("pkg...") is an import too
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            top = node.args[0].value.split(".")[0]
            if top in ALLOWED:
                found.add((top, node.lineno))
    return found


def _modules():
    return [p for pkg in ALLOWED for p in sorted((ROOT / pkg).rglob("*.py"))]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_follow_the_layering(path):
    pkg = path.relative_to(ROOT).parts[0]
    bad = sorted((top, line) for top, line in imported_packages(path) if top not in ALLOWED[pkg])
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}: {pkg} may import only {sorted(ALLOWED[pkg])}"


def test_the_rule_has_teeth(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from cuda_ref.launch import x\n    import importlib\n"
                 "    importlib.import_module('ascend_ops.ops')\n")
    assert imported_packages(f) == {("cuda_ref", 2), ("ascend_ops", 4)}


# "Commands import public APIs" (docs/architecture.md): scripts/*.py and the splitkv_bench suite
# import only the packages' public APIs, and no package imports the suite.
PACKAGES = {*ALLOWED, "splitkv_bench"}


def private_uses(path: Path, own: str | None = None) -> list[tuple[int, str]]:
    """(line, dotted name) of every private part of a project package that ``path`` imports or reads:
    a module or name with a leading underscore in an import, or ``mod._name`` on an imported project
    module. Names of ``own`` (the file's own package) are exempt."""
    tree = ast.parse(path.read_text(), str(path))
    bound, bad = {}, []

    def check(line, dotted):
        if dotted.split(".")[0] in PACKAGES - {own} and any(
                p.startswith("_") and not p.startswith("__") for p in dotted.split(".")):
            bad.append((line, dotted))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                check(node.lineno, a.name)
                name = a.asname or a.name.split(".")[0]
                bound[name] = a.name if a.asname else name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                check(node.lineno, f"{node.module}.{a.name}")
                bound[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            check(node.lineno, f"{bound[node.value.id]}.{node.attr}")
    return sorted(bad)


def _commands():
    return sorted((ROOT / "scripts").glob("*.py")) + sorted((ROOT / "splitkv_bench").rglob("*.py"))


@pytest.mark.parametrize("path", _commands(), ids=lambda p: str(p.relative_to(ROOT)))
def test_commands_import_only_public_apis(path):
    own = path.relative_to(ROOT).parts[0] if path.relative_to(ROOT).parts[0] in PACKAGES else None
    bad = private_uses(path, own)
    assert not bad, f"{path.relative_to(ROOT)} uses private names {bad}: make the name public in its package"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_package_imports_the_suite(path):
    tree = ast.parse(path.read_text(), str(path))
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module]
    bad = [n for n in names if n.split(".")[0] == "splitkv_bench"]
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}: the suite sits above every package"


def test_the_public_api_rule_has_teeth(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from cuda_ref.launch import _x, KernelConfig\nimport cuda_ref.backend as tb\n"
                 "import splitkv_common._y\ntb._unsupported(1)\ntb.run(tb.__doc__)\n"
                 "from splitkv_bench.perf_check import _own\n")
    assert private_uses(f) == [(1, "cuda_ref.launch._x"), (3, "splitkv_common._y"),
                               (4, "cuda_ref.backend._unsupported"), (6, "splitkv_bench.perf_check._own")]
    assert (6, "splitkv_bench.perf_check._own") not in private_uses(f, own="splitkv_bench")


# --- no import circles ------------------------------------------------------------------------------
# The graph: one node a module (a package is its ``__init__``) of the four packages; an edge for
# every import statement anywhere in a module (top level, inside functions, under ``if
# TYPE_CHECKING``) and every ``importlib.import_module("...")`` with a constant name, relative
# imports resolved; ``from p import n`` is an edge to ``p.n`` where that is a module, else to ``p``.
# Function-level imports count because deferring an import into a function is how a circle is
# hidden, not how it is broken. Not counted: imports of a computed name (the packages' lazy
# ``__getattr__``, ``importlib.import_module(f".{name}", ...)``), which run on the first use of a
# name, after both modules are loaded.


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_imports(path: Path, modules: set[str], root: Path = ROOT) -> set[str]:
    """The project modules ``path`` imports (see above), itself left out."""
    me = module_name(path, root)
    package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    targets = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module
            targets += [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            targets.append(node.args[0].value)
    found = set()
    for name in targets:
        while name and name not in modules:   # pkg.mod.attr -> pkg.mod
            name = name.rpartition(".")[0]
        if name and name != me:
            found.add(name)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    paths = {module_name(p, root): p for pkg in ALLOWED for p in sorted((root / pkg).rglob("*.py"))}
    return {m: module_imports(p, set(paths), root) for m, p in paths.items()}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on_stack.discard(comp[-1])
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_import_circles():
    graph = import_graph()
    assert "splitkv_common.plan_layout" in graph["splitkv_common.planner"]   # the graph sees relative imports
    circles = import_circles(graph)
    assert not circles, "import circles: " + "; ".join(
        " <-> ".join(c) + " (" + ", ".join(f"{m} imports {sorted(graph[m] & set(c))}" for m in c) + ")"
        for c in circles)


def test_the_circle_rule_has_teeth(tmp_path):
    pkg = tmp_path / "splitkv_common"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import x\n")
    (pkg / "b.py").write_text("def f():\n    from .sub import c\n")   # inside a function: counted
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from .. import a\n")
    (pkg / "d.py").write_text("import importlib\nimportlib.import_module('splitkv_common.a')\n")
    graph = import_graph(tmp_path)
    assert graph["splitkv_common.b"] == {"splitkv_common.sub.c"}
    assert graph["splitkv_common.d"] == {"splitkv_common.a"}
    assert import_circles(graph) == [["splitkv_common.a", "splitkv_common.b", "splitkv_common.sub.c"]]
