"""The floors of docs/architecture.md, checked on the import graph of smartnsq/ and compat/.

Three kinds of check: the floors (below), no import circle at any level of the package tree
(:func:`test_no_import_circle`), and the size each module may reach (the table of
docs/architecture.md's "Sizes" section, read by :func:`test_no_module_outgrows_its_size`).

The graph is read from the source with ``ast`` (every ``import``, at module level or inside a
function, under ``TYPE_CHECKING`` or not). A module imports only from its own floor or the
floors below; nothing on floors 1-5 imports compat; compat imports floors 1-5 only; and no
module reaches into another module's private names (``from x import _y``, ``x._y`` on an
imported module, or a private module such as ``smartnsq.transport._private``).

Floors are given by folder: each folder (or module) directly under ``smartnsq/`` has one
floor, and every module inside it is on that floor, with no exception. A new folder fails
:func:`test_floors_are_given_by_folder` until it is placed here and in docs/architecture.md.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {"smartnsq": ROOT / "smartnsq", "smartnsq.compat": ROOT / "compat"}

SIDE = 0  # compat: beside the floors, sees the floors up to the clients' (5)

FLOORS: dict[str, int] = {
    # 1: values and pure decisions, no I/O (the codec is sans-I/O; the models take the time in)
    "smartnsq.protocol": 1,
    "smartnsq.model": 1,
    "smartnsq.errors": 1,
    "smartnsq.config": 1,
    "smartnsq.message": 1,
    "smartnsq.extensions": 1,  # which of those modules run compiled (reads the package's files)
    # 2: what the clients count and how it is reported (no sockets, no client classes)
    "smartnsq.observability": 2,
    # 3: the asyncio shell: one connection, one HTTP client, the loop thread
    "smartnsq.transport": 3,
    # 4: many connections and HTTP: who leads what, the node pool, administration
    "smartnsq.discovery": 4,
    "smartnsq.admin": 4,
    # 5: the clients and their blocking facades
    "smartnsq.producer": 5,
    "smartnsq.consumer": 5,
    "smartnsq.sync": 5,
    # 6: programs and servers built on the clients, and the test infrastructure
    "smartnsq.cli": 6,
    "smartnsq.spark": 6,
    "smartnsq.devcluster": 6,
    "smartnsq.testing": 6,
    "smartnsq.__main__": 6,
    # beside: classic fallback, mixed clusters, pynsq's API (public names up to floor 5 only)
    "smartnsq.compat": SIDE,
}
"""The floors, one entry per folder (or module) directly under ``smartnsq/``: a module's floor
is its folder's, with no exception (``test_floors_are_given_by_folder``)."""

ROOT_PACKAGE = "smartnsq"
"""``smartnsq/__init__.py`` re-exports the public names lazily (importlib, so the graph does not
see those), and everyone may read ``smartnsq.__version__`` from it: it sits outside the floors."""

CLIENT_FLOOR = 5


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
        if mine <= CLIENT_FLOOR:
            return ("the core imports compat (the clients ask it through "
                    "smartnsq.model.dialect)")
        return None
    if mine == SIDE:
        return "compat imports a program (floor 6)" if theirs > CLIENT_FLOOR else None
    if theirs > mine:
        return f"runs up from floor {mine} to floor {theirs}"
    return None


def test_every_module_has_a_floor() -> None:
    unplaced = sorted(m for m in MODULES if m != ROOT_PACKAGE and floor_of(m) is None)
    assert not unplaced, f"place these in FLOORS and docs/architecture.md: {unplaced}"


def test_no_import_runs_up_a_floor_or_into_privates() -> None:
    problems = [f"{edge}: {why}" for edge in GRAPH if (why := _problem(edge)) is not None]
    assert not problems, "\n".join(sorted(set(problems)))


def test_floors_are_given_by_folder() -> None:
    """Each entry of FLOORS is one folder (or module) directly under ``smartnsq/``, and each of
    those has an entry: the folder list is the floor list."""
    top = {".".join(m.split(".")[:2]) for m in MODULES if m != ROOT_PACKAGE}
    deeper = sorted(p for p in FLOORS if p.count(".") > 1)
    assert not deeper, f"floors given below a folder (move the module instead): {deeper}"
    assert top == set(FLOORS), (f"unplaced: {sorted(top - set(FLOORS))}; "
                                f"gone: {sorted(set(FLOORS) - top)}")


def test_the_floor_table_matches_the_architecture_doc() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    missing = sorted(prefix for prefix in FLOORS if f"`{prefix}`" not in text)
    assert not missing, f"docs/architecture.md does not place: {missing}"


@pytest.mark.parametrize(("module", "floor"), [
    ("smartnsq.producer.retry", 5), ("smartnsq.consumer.flow", 5), ("smartnsq.model.rdy", 1),
    ("smartnsq.protocol.admin", 1), ("smartnsq.cli.stats", 6), ("smartnsq.compat.pynsq", SIDE),
    ("smartnsq.devcluster.nsqd.tcp", 6)])
def test_new_modules_are_placed_by_their_folder(module: str, floor: int) -> None:
    assert floor_of(module) == floor


def test_the_checker_sees_what_it_must() -> None:
    """The rules on made-up edges, so a checker that sees nothing cannot pass."""
    assert _problem(Import("smartnsq.protocol.frames", "smartnsq.transport.connection")) \
        is not None
    assert _problem(Import("smartnsq.model.dialect", "smartnsq.discovery.nodes")) is not None
    assert _problem(Import("smartnsq.observability.stats", "smartnsq.transport.http")) \
        is not None
    assert _problem(Import("smartnsq.discovery.nodes", "smartnsq.compat")) is not None
    assert _problem(Import("smartnsq.compat.pynsq", "smartnsq.cli")) is not None
    assert _problem(Import("smartnsq.compat.pynsq", "smartnsq.consumer", "_Link")) is not None
    assert _problem(Import("smartnsq.cli.stats", "smartnsq.transport._private")) is not None
    assert _problem(Import("smartnsq.sync", "smartnsq.consumer")) is None
    assert _problem(Import("smartnsq.cli.stats", "smartnsq.cli.util")) is None
    assert any(e.importer == "smartnsq.admin.client" and e.imported == "smartnsq.protocol.admin"
               for e in GRAPH)


# -- import circles -----------------------------------------------------------------------------
#
# What counts: every import the graph above sees, at module level, inside a function or under
# TYPE_CHECKING. A circle is two modules each needing to know the other, and moving one of the
# imports into a function or under TYPE_CHECKING only hides it from the interpreter, so each
# import is a dependency. Imports of the
# root package (``smartnsq.__version__``) are not: the root stands outside the floors.
#
# Where: at each level of the package tree, the children of one package (its modules, its
# subpackages each taken as one node with everything inside it, and the package's own
# ``__init__``) must form no circle. The top level is the children of ``smartnsq``. Any circle
# of modules shows at the level of the deepest package holding all of them, so no circle
# anywhere hides between the levels.

def _child(package: str, module: str) -> str | None:
    """The child of ``package`` that holds ``module`` (the package itself for its
    ``__init__``); None when ``module`` is outside ``package``."""
    if module == package:
        return package
    if not module.startswith(package + "."):
        return None
    return f"{package}.{module[len(package) + 1:].split('.')[0]}"


def circles(edges: Iterable[tuple[str, str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        if a != b:
            graph[a].add(b)
            graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


def circles_in(package: str, graph: Iterable[Import] = GRAPH) -> list[frozenset[str]]:
    """The circles among the children of ``package`` (see the notes above)."""
    edges = []
    for edge in graph:
        if edge.imported == ROOT_PACKAGE or edge.importer == ROOT_PACKAGE:
            continue
        a, b = _child(package, edge.importer), _child(package, edge.imported)
        if a is not None and b is not None and a != b:
            edges.append((a, b))
    return circles(edges)


PACKAGE_LEVELS = sorted({ROOT_PACKAGE} | PACKAGES)


@pytest.mark.parametrize("package", PACKAGE_LEVELS)
def test_no_import_circle(package: str) -> None:
    found = [" -> ".join(sorted(c)) for c in circles_in(package)]
    assert not found, f"import circles among the modules of {package}: {found}"


def test_the_circle_finder_sees_what_it_must() -> None:
    """Made-up graphs: a circle hidden one level down shows at the level holding it, a
    package's ``__init__`` counts as a node, and a chain is no circle."""
    def edge(a: str, b: str) -> Import:
        return Import(a, b)

    two_packages = [edge("smartnsq.cli.pub", "smartnsq.devcluster.x"),
                    edge("smartnsq.devcluster.y", "smartnsq.cli.util")]
    assert circles_in(ROOT_PACKAGE, two_packages) == [
        frozenset({"smartnsq.cli", "smartnsq.devcluster"})]
    assert circles_in("smartnsq.cli", two_packages) == []
    via_init = [edge("smartnsq.cli", "smartnsq.cli.completion"),
                edge("smartnsq.cli.completion", "smartnsq.cli")]
    assert circles_in("smartnsq.cli", via_init) == [
        frozenset({"smartnsq.cli", "smartnsq.cli.completion"})]
    assert circles([("a", "b"), ("b", "c")]) == []
    assert circles([("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]) == [
        frozenset({"a", "b", "c"})]
    assert "smartnsq.producer" in PACKAGE_LEVELS and ROOT_PACKAGE in PACKAGE_LEVELS


# -- sizes ----------------------------------------------------------------------------------

DEFAULT_ROW = "every other module"
_SIZE_ROW = re.compile(r"^\| (?:`(?P<module>[\w.]+)`|(?P<default>every other module)) "
                       r"\| (?P<lines>[\d,]+) \| (?P<why>.*?) *\|$")


def size_table(text: str) -> dict[str, tuple[int, str]]:
    """The rows of the "Sizes" section's table: module (or ``DEFAULT_ROW``) -> (lines, why)."""
    section = text.split("\n## Sizes\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        found = _SIZE_ROW.match(line)
        if found:
            name = found["module"] or DEFAULT_ROW
            rows[name] = (int(found["lines"].replace(",", "")), found["why"].strip())
    return rows


SIZES = size_table((ROOT / "docs" / "architecture.md").read_text())


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_module_outgrows_its_size() -> None:
    """Each module stays within its row of the table (or the default row); a row above the
    default says why. Growing a module past its row means growing the row, in review."""
    assert DEFAULT_ROW in SIZES, "docs/architecture.md's size table has no default row"
    default = SIZES[DEFAULT_ROW][0]
    over = []
    for module, path in sorted(MODULES.items()):
        limit, _ = SIZES.get(module, SIZES[DEFAULT_ROW])
        lines = _lines(path)
        if lines > limit:
            over.append(f"{module} ({path.relative_to(ROOT)}): {lines} lines, its row says "
                        f"{limit}")
    assert not over, ("modules past their size in docs/architecture.md (split them, or raise "
                      "the row and say why):\n" + "\n".join(over))
    unexplained = [m for m, (limit, why) in SIZES.items() if limit > default and not why]
    assert not unexplained, f"rows above the default of {default} lines say no why: {unexplained}"
    stale = sorted(set(SIZES) - set(MODULES) - {DEFAULT_ROW})
    assert not stale, f"rows for modules that do not exist: {stale}"


def test_the_size_table_is_read() -> None:
    """The parser on a made-up section, so an unreadable table cannot pass as an empty one."""
    text = ("# x\n\n## Sizes\n\n| module | at most | why |\n|---|---|---|\n"
            "| every other module | 600 | the default |\n"
            "| `smartnsq.discovery.lookup` | 1,100 | one state machine |\n\n## Next\n"
            "| `smartnsq.discovery.nodes` | 900 | not in the section |\n")
    assert size_table(text) == {DEFAULT_ROW: (600, "the default"),
                                "smartnsq.discovery.lookup": (1100, "one state machine")}
    assert len(SIZES) > 5
