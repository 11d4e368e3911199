"""No runtime import cycle in `rubric_core`: its layers point down only.

Every module's imports are read from its source, at module level and inside functions alike
(those under ``if TYPE_CHECKING:`` are not run, so not counted). ``from P import N`` depends on
the module ``P.N`` when there is one, else on the package ``P`` itself (its ``__init__``); a
module that imports by name at run time (``importlib.import_module``) depends on every module
its string constants name. A cycle is a set of modules that reach each other this way.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "rubric_core"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(name: str, source: str, modules: dict[str, Path], *, is_package: bool = False
             ) -> set[str]:
    """The modules of ``rubric_core`` that ``name`` (its ``source``) imports when it runs."""
    tree = ast.parse(source)
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    dynamic = False

    def owner(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    def visit(node: ast.AST) -> None:
        nonlocal dynamic
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for other in child.orelse:
                    visit_one(other)
                continue
            visit_one(child)

    def visit_one(node: ast.AST) -> None:
        nonlocal dynamic
        if isinstance(node, ast.Import):
            found.update(m for a in node.names if (m := owner(a.name)) is not None)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            if base.split(".")[0] == PACKAGE:
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    hit = target if target in modules else owner(base)
                    if hit is not None:
                        found.add(hit)
        elif (isinstance(node, ast.Attribute) and node.attr == "import_module"):
            dynamic = True
        visit(node)

    visit(tree)
    if dynamic:
        found.update(c.value for c in ast.walk(tree) if isinstance(c, ast.Constant)
                     and isinstance(c.value, str) and c.value in modules)
    found.discard(name)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path.read_text(encoding="utf-8"), modules,
                           is_package=path.name == "__init__.py")
            for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return cycles


FUNCTION_LEVEL = "def f():\n    from rubric_core.a import x\n"
TYPE_ONLY = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rubric_core.a import x\n"
DYNAMIC = "import importlib\nimportlib.import_module(HOME)\nHOME = 'rubric_core.a'\n"


@pytest.mark.parametrize(("source", "cyclic"), [
    pytest.param(FUNCTION_LEVEL, True, id="a_function_level_import_counts"),
    pytest.param(TYPE_ONLY, False, id="a_type_only_import_does_not"),
    pytest.param(DYNAMIC, True, id="an_import_by_name_counts"),
])
def test_the_walk(source: str, cyclic: bool) -> None:
    modules = {"rubric_core.a": Path("a.py"), "rubric_core.b": Path("b.py")}
    graph = {"rubric_core.a": _imports("rubric_core.a", "from rubric_core import b\n", modules),
             "rubric_core.b": _imports("rubric_core.b", source, modules)}
    assert graph["rubric_core.a"] == {"rubric_core.b"}
    assert bool(_cycles(graph)) is cyclic


def test_no_runtime_import_cycle() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "runtime import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)
