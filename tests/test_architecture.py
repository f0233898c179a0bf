"""The floors of docs/architecture.md, checked on the import graph of smartnsq/ and compat/.

The graph is read from the source with ``ast`` (every ``import``, at module level or inside a
function, under ``TYPE_CHECKING`` or not). A module imports only from its own floor or the
floors below; nothing on floors 1-4 imports compat; compat imports floors 1-4 only; and no
module reaches into another module's private names (``from x import _y``, ``x._y`` on an
imported module, or a private module such as ``smartnsq._loop_thread``).

Floors are given by module-name prefix (the longest one wins), so a new module inside a
placed package (``smartnsq.producer.routing``) is placed by its package; a module no prefix
covers fails the test until it is given a floor here and in docs/architecture.md.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {"smartnsq": ROOT / "smartnsq", "smartnsq.compat": ROOT / "compat"}

SIDE = 0  # compat: beside the floors, sees floors 1-4

FLOORS: dict[str, int] = {
    # 1: pure values and decisions, no I/O (protocol is sans-I/O; the models take time as input)
    "smartnsq.protocol": 1,
    "smartnsq.errors": 1,
    "smartnsq.config": 1,
    "smartnsq.dialect": 1,
    "smartnsq.sharding": 1,
    "smartnsq.message": 1,
    "smartnsq.trace": 1,
    "smartnsq.logs": 1,
    "smartnsq.backoff": 1,
    "smartnsq.rdy": 1,
    "smartnsq.stats": 1,
    "smartnsq.counters": 1,
    "smartnsq.routes.table": 1,  # route values; the routes policy and lookupd health (pure)
    "smartnsq.routes.policy": 1,
    "smartnsq.routes.health": 1,
    # 2: the asyncio shell: one connection; the loop thread the blocking facades run on
    "smartnsq.connection": 2,
    "smartnsq.event_loop": 2,
    "smartnsq.loop_thread": 2,
    "smartnsq._loop_thread": 2,
    "smartnsq.http": 2,
    # 3: many connections and HTTP: partitions to connections, discovery, administration
    "smartnsq.pool": 3,
    "smartnsq.routes": 3,  # who leads what and when to ask again (book, chase, lookup source)
    "smartnsq.lookup": 3,
    "smartnsq.admin": 3,
    # 4: the clients and their blocking facades
    "smartnsq.producer": 4,
    "smartnsq.consumer": 4,
    "smartnsq.sync": 4,
    "smartnsq.otel": 4,  # spans around the clients' calls (opt-in; imports opentelemetry)
    # 5: programs and servers built on the clients
    "smartnsq.cli": 5,
    "smartnsq.demo": 5,
    "smartnsq.spark": 5,
    "smartnsq.devcluster": 5,
    "smartnsq.realcluster": 5,  # the real servers as processes, DevCluster's twin
    "smartnsq.prometheus": 5,  # a collector reading the clients' snapshots at scrape time
    "smartnsq.reference": 5,  # the docs' reference tables, generated from floors 1-4
    "smartnsq.__main__": 5,
    # beside: classic fallback, mixed clusters, pynsq's API (public names of floors 1-4 only)
    "smartnsq.compat": SIDE,
}

ROOT_PACKAGE = "smartnsq"
"""``smartnsq/__init__.py`` re-exports the public names lazily (importlib, so the graph does not
see those), and everyone may read ``smartnsq.__version__`` from it: it sits outside the floors."""

# Imports that break a rule today in files the architecture work (issue 14) could not change:
# each is (importer, imported, why). The lead empties this list after merging the consumer,
# producer, spark and devcluster branches; an entry that no longer occurs fails the test, so
# the list only shrinks.
ALLOWED: set[tuple[str, str]] = {
    # issue 14: dialect's Protocols name pool.TopicRoutes in their signatures (a type-only
    # import, floor 1 -> 3); fix: describe the routes the choosers need as a Protocol (or a
    # value type) on floor 1, which pool.TopicRoutes satisfies
    ("smartnsq.dialect", "smartnsq.pool"),
}


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str          # the module imported (or whose name is imported)
    private: str = ""      # the private name reached, when one is
    line: int = 0

    def __str__(self) -> str:
        what = f"{self.imported}.{self.private}" if self.private else self.imported
        return f"{self.importer}:{self.line} imports {what}"


def _module_files() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package, directory in SOURCES.items():
        for path in sorted(directory.rglob("*.py")):
            parts = list(path.relative_to(directory).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([package, *parts])
            if package == "smartnsq" and parts[:1] == ["compat"]:
                continue
            modules[name] = path
    return modules


MODULES = _module_files()
PACKAGES = {m for m, p in MODULES.items() if p.name == "__init__.py"}


def floor_of(module: str) -> int | None:
    covering = [p for p in FLOORS if module == p or module.startswith(p + ".")]
    return FLOORS[max(covering, key=len)] if covering else None


def _resolve(importer: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    if importer not in PACKAGES:
        base = base[:-1]
    if node.level > 1:
        base = base[:-(node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _ours(module: str) -> bool:
    return module == ROOT_PACKAGE or module.startswith(ROOT_PACKAGE + ".")


def imports_of(module: str, path: Path) -> Iterator[Import]:
    tree = ast.parse(path.read_text(), str(path))
    aliases: dict[str, str] = {}  # local name -> module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _ours(alias.name):
                    target = alias.name
                    aliases[alias.asname or alias.name.split(".")[0]] = \
                        target if alias.asname else alias.name.split(".")[0]
                    yield Import(module, target, line=node.lineno)
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            if not _ours(source):
                continue
            for alias in node.names:
                full = f"{source}.{alias.name}"
                if full in MODULES:  # a submodule
                    aliases[alias.asname or alias.name] = full
                    yield Import(module, full, line=node.lineno)
                elif _private(alias.name):
                    yield Import(module, source, alias.name, node.lineno)
                else:
                    yield Import(module, source, line=node.lineno)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in aliases and _private(node.attr):
            yield Import(module, aliases[node.value.id], node.attr, node.lineno)


def _graph() -> list[Import]:
    return [i for module, path in sorted(MODULES.items()) for i in imports_of(module, path)]


GRAPH = _graph()


def _problem(edge: Import) -> str | None:
    importer, imported = edge.importer, edge.imported
    if imported == ROOT_PACKAGE or importer == ROOT_PACKAGE:
        return None
    if importer == imported or imported.startswith(importer + "."):
        return None  # a package and its own modules (its __init__ re-exports them)
    mine, theirs = floor_of(importer), floor_of(imported)
    if mine is None or theirs is None:
        return None  # reported by test_every_module_has_a_floor
    private_module = any(_private(part) for part in imported.split(".")) \
        and not importer.startswith(imported.rsplit(".", 1)[0] + "._")
    if edge.private and not importer.startswith(imported + "."):
        return f"reaches into a private name of {imported}"
    if private_module and floor_of(importer) is not None and imported != importer:
        return "imports a private module"
    if theirs == SIDE and mine != SIDE:
        if mine <= 4:
            return "the core imports compat (floors 1-4 ask it through smartnsq.dialect)"
        return None
    if mine == SIDE:
        return "compat imports a program (floor 5)" if theirs == 5 else None
    if theirs > mine:
        return f"runs up from floor {mine} to floor {theirs}"
    return None


def test_every_module_has_a_floor() -> None:
    unplaced = sorted(m for m in MODULES if m != ROOT_PACKAGE and floor_of(m) is None)
    assert not unplaced, f"place these in FLOORS and docs/architecture.md: {unplaced}"


def test_no_import_runs_up_a_floor_or_into_privates() -> None:
    problems = []
    seen_allowed = set()
    for edge in GRAPH:
        why = _problem(edge)
        if why is None:
            continue
        key = (edge.importer, edge.imported)
        if key in ALLOWED:
            seen_allowed.add(key)
            continue
        problems.append(f"{edge}: {why}")
    assert not problems, "\n".join(sorted(set(problems)))
    stale = ALLOWED - seen_allowed
    assert not stale, f"allowed but no longer occurring (remove from ALLOWED): {sorted(stale)}"


def test_the_floor_table_matches_the_architecture_doc() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    missing = sorted(prefix for prefix in FLOORS if f"`{prefix}`" not in text)
    assert not missing, f"docs/architecture.md does not place: {missing}"


@pytest.mark.parametrize(("module", "floor"), [
    ("smartnsq.producer.retry", 4), ("smartnsq.consumer.flow", 4),
    ("smartnsq.protocol.admin", 1), ("smartnsq.cli.stats", 5), ("smartnsq.compat.pynsq", SIDE)])
def test_new_modules_are_placed_by_prefix(module: str, floor: int) -> None:
    assert floor_of(module) == floor


def test_the_checker_sees_what_it_must() -> None:
    """The rules on made-up edges, so a checker that sees nothing cannot pass."""
    assert _problem(Import("smartnsq.protocol.frames", "smartnsq.connection")) is not None
    assert _problem(Import("smartnsq.pool", "smartnsq.compat")) is not None
    assert _problem(Import("smartnsq.compat.pynsq", "smartnsq.cli")) is not None
    assert _problem(Import("smartnsq.compat.pynsq", "smartnsq.consumer", "_Link")) is not None
    assert _problem(Import("smartnsq.cli.stats", "smartnsq._loop_thread")) is not None
    assert _problem(Import("smartnsq.sync", "smartnsq.consumer")) is None
    assert _problem(Import("smartnsq.cli.stats", "smartnsq.cli.util")) is None
    assert any(e.importer == "smartnsq.admin" and e.imported == "smartnsq.protocol.admin"
               for e in GRAPH)
