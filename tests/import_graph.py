"""The package's module-level import graph, to find import cycles (tests/test_import_cycles.py).

By default only imports that run when a module is imported count: those at module level and in
class bodies, not those inside functions (deferred on purpose) nor under `if TYPE_CHECKING:` (never
run). `deferred=True` counts every import statement, to find cycles that deferring only hides.
`from pkg import sub` is an edge to the submodule `pkg.sub` when there is one, else to `pkg` itself.
"""

from __future__ import annotations

import ast
from pathlib import Path


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Every module of `package` (rooted at `root/package`) by dotted name; a package is its __init__."""
    names = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _imports(tree: ast.Module, deferred: bool):
    """Import statements executed when the module is imported (every one, with `deferred`)."""
    if deferred:
        yield from (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)))
        return
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            pending.extend(node.orelse)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        else:
            pending.extend(n for n in ast.iter_child_nodes(node) if isinstance(n, ast.stmt))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[: len(parts) - node.level + 1]
    return ".".join(parts + ([node.module] if node.module else []))


def import_graph(root: Path, package: str, deferred: bool = False) -> dict[str, set[str]]:
    """module -> the package's modules it imports at import time (or anywhere, with `deferred`)."""
    modules = module_names(root, package)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path)), deferred):
            if isinstance(node, ast.Import):
                targets.update(_longest_module(alias.name, modules) for alias in node.names)
                continue
            base = _base(module, path.name == "__init__.py", node)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.add(sub if sub in modules else _longest_module(base, modules))
        graph[module] = {t for t in targets if t and t != module}
    return graph


def _longest_module(name: str, modules: dict[str, Path]) -> str:
    parts = name.split(".")
    while parts and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts)


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)
