"""The import layers: attributions at the bottom, bort above it, audit in the middle, reports above
it, the command line on top. Parsed from the sources (every import, function-local ones included)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("attributions", "bort", "audit", "reports")
# Rank of each layer; a module may import only modules of its own rank or below.
CLI = {"audit.cli", "audit.__main__"}
RANK = {"attributions": 0, "bort": 1, "audit": 2, "reports": 3, "cli": 4}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The project modules ``path`` imports (``from a.b import c`` counts a.b.c when that is a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        out |= {t for t in targets if t.split(".")[0] in PACKAGES}
    return out


def _rank(module: str) -> int:
    return RANK["cli"] if module in CLI else RANK[module.split(".")[0]]


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(path, name, known) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` as a list of nodes, or None (iterative depth-first search)."""
    state: dict[str, int] = {}
    for root in graph:
        if state.get(root):
            continue
        stack = [(root, iter(sorted(graph[root])))]
        path = [root]
        state[root] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(child) == 1:
                return path[path.index(child):] + [child]
            elif child in graph and not state.get(child):
                state[child] = 1
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child)
    return None


def test_every_import_points_down():
    upward = [f"{m} -> {t}" for m, targets in _graph().items() for t in targets if _rank(t) > _rank(m)]
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)


@pytest.mark.parametrize("level", ["module", "subpackage", "package"])
def test_no_import_cycles(level):
    def key(module: str) -> str:
        if module in CLI and level != "module":
            return "cli"  # the command line is its own layer above reports
        parts = module.split(".")
        return {"module": module, "subpackage": ".".join(parts[:2]), "package": parts[0]}[level]

    graph: dict[str, set[str]] = {}
    for m, targets in _graph().items():
        graph.setdefault(key(m), set())
        # a package's __init__ re-exporting its own modules is not a dependency between layers
        graph[key(m)] |= {key(t) for t in targets if key(t) != key(m) and not (m.count(".") < t.count(".")
                                                                                and t.startswith(m + "."))}
    assert _cycle(graph) is None, f"import cycle at {level} level: {' -> '.join(_cycle(graph) or [])}"


def test_the_checker_finds_cycles_and_upward_imports():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    assert _rank("reports.build") > _rank("audit.run.runner") > _rank("bort.optim") > _rank("attributions.rules")
    assert _rank("audit.cli") > _rank("reports.build")


def test_the_graph_sees_function_local_and_package_imports(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text("def f():\n    from audit.run import runner\n    import reports.build\n")
    found = _imports(source, "bort.mod", set(_modules()))
    assert found == {"audit.run.runner", "reports.build"}


def test_the_layers_above_import_only_the_engines_declared_api():
    from attributions.engine_api import ENGINE_API

    undeclared = []
    for name, path in _modules().items():
        if name.split(".")[0] == "attributions":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "attributions":
                undeclared += [f"{name}: from {node.module} import {a.name}" for a in node.names
                               if a.name not in ENGINE_API.get(node.module or "", frozenset())]
            elif isinstance(node, ast.Import):
                undeclared += [f"{name}: import {a.name}" for a in node.names
                               if a.name.split(".")[0] == "attributions" and a.name not in ENGINE_API]
    assert not undeclared, "imports of the engine outside attributions.engine_api:\n" + "\n".join(undeclared)
