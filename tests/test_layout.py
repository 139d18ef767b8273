"""The layout's import rules (DESIGN.md): which package may import which, and no circles.

Every import counts, including those under ``if TYPE_CHECKING:`` and inside functions: a
circle kept alive by a lazy import is still a circle to a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("routing", "broker", "bridges")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")
    }


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The project modules ``path`` imports (``from a.b import c`` counts as a.b.c when c is a
    module, else as a.b)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names]
            targets = [t if t in known else base for t in targets]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(path, name, known) for name, path in modules.items()}


def _top(name: str) -> str:
    return name.partition(".")[0]


def test_routing_imports_neither_broker_nor_bridges() -> None:
    bad = {
        (module, target)
        for module, targets in _graph().items()
        for target in targets
        if _top(module) == "routing" and _top(target) != "routing"
    }
    assert bad == set()


def test_broker_never_imports_bridges() -> None:
    bad = {
        (module, target)
        for module, targets in _graph().items()
        for target in targets
        if _top(module) == "broker" and _top(target) == "bridges"
    }
    assert bad == set()


def test_the_core_imports_no_front_end_mesh_or_wire() -> None:
    outside = ("broker.native", "broker.mesh", "broker.wire", "broker.client", "broker.server")
    bad = {
        (module, target)
        for module, targets in _graph().items()
        for target in targets
        if module.startswith("broker.core") and target.startswith(outside)
    }
    assert bad == set()


def test_no_import_circles() -> None:
    graph = _graph()
    # A package's __init__ re-exports its modules; a module importing a sibling through the
    # package would be a circle through __init__, which this catches too.
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                cycles.append([*stack[stack.index(target) :], target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert cycles == []
