"""The house rules of the package's imports: no circle, and no import from a lower layer to a higher one."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "packcli"

# Layers from the top; a module may import only from its own layer or lower ones (docs/architecture.md).
LAYERS = [
    {"packcli.cli", "packcli.__main__"},
    {"packcli.api"},
    {"packcli.pipeline", "packcli.report"},  # the run, and the read side (raw stats tokenize as pack does)
    {"packcli.engines"},
]
STAGES_MAY_NOT_IMPORT = ("packcli.cli", "packcli.api", "packcli.pipeline", "packcli.engines")


def _graph() -> dict[str, set[str]]:
    modules: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("packcli"):
                deps.add(node.module)
                deps.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names if alias.name.startswith("packcli"))
        modules[name] = deps
    return {m: {d for d in deps if d in modules and d not in (m, "packcli")} for m, deps in modules.items()}


def _layer(module: str) -> int | None:
    if module == "packcli":
        return 1  # the package's public face re-exports the library
    for i, names in enumerate(LAYERS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return i
    return None


def test_no_import_circle() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycle = [*path[path.index(dep) :], dep]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        path.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_imports_point_down() -> None:
    graph = _graph()
    for module, deps in graph.items():
        here = _layer(module)
        for dep in deps:
            there = _layer(dep)
            if here is None:  # a stage, or the packing core
                assert there is None, f"{module} (a stage) imports {dep} (a higher layer)"
            elif there is not None:
                assert there >= here, f"{module} imports {dep}, which is above it"
    allowed = {"packcli.contract", "packcli.errors", "packcli.training"}  # the contract, and the checks on it
    assert not graph["packcli.collate"] - allowed, "collate imports only the output contract and its checks"
    assert not graph["packcli.training"] - {"packcli.contract", "packcli.errors", "packcli.shard_formats"}
    assert not any(d.startswith(STAGES_MAY_NOT_IMPORT) for d in graph["packcli.packing"])
