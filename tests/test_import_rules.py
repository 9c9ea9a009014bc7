"""The import rules of docs/architecture.md, read from the source: `splitkv_common` knows no backend,
backends (`cuda_ref`, `ascend_ops`) never import each other, integrations (`splitkv_vllm`) may
import backends. A violating import anywhere in a module (top level or inside a function) fails."""

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
