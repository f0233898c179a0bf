"""The dev cluster's modules import each other without cycles, type-only imports included
(the nsqd node and the modules serving its connections once imported each other)."""

from __future__ import annotations

import ast
from pathlib import Path

import smartnsq.devcluster

PACKAGE = Path(smartnsq.devcluster.__file__).parent


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.glob("*.py"):
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    deps.add(node.module.split(".")[0])
                else:
                    deps.update(alias.name for alias in node.names)
        graph[path.stem] = deps
    return graph


def test_no_import_cycle() -> None:
    graph = _graph()
    cycles = []
    for start in graph:
        stack = [(start, [start])]
        while stack:
            name, path = stack.pop()
            for dep in graph.get(name, ()):
                if dep == start:
                    cycles.append(" -> ".join([*path, dep]))
                elif dep not in path:
                    stack.append((dep, [*path, dep]))
    assert not cycles, cycles


def test_no_runtime_node_class_lookup() -> None:
    source = (PACKAGE / "cluster.py").read_text()
    assert "importlib" not in source and "inspect.signature" not in source
