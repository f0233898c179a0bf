"""The facades and the producer use their collaborators' public API, not their private state."""

from __future__ import annotations

import ast
from pathlib import Path

import smartnsq
from smartnsq import Consumer

PACKAGE = Path(smartnsq.__file__).parent


def test_consumer_drain_timeout_is_public() -> None:
    assert Consumer("t", "c", nsqd=["127.0.0.1:4150"]).drain_timeout == 30.0
    assert Consumer("t", "c", nsqd=["127.0.0.1:4150"], drain_timeout=2).drain_timeout == 2.0


def private_reads_through(path: Path, owners: set[str]) -> list[str]:
    """``x._name`` where ``x`` is one of ``owners`` (a name or ``self.<name>``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            continue
        owner = node.value
        name = (owner.id if isinstance(owner, ast.Name)
                else owner.attr if isinstance(owner, ast.Attribute) else None)
        if name in owners:
            found.append(f"{path.name}:{node.lineno} {name}.{node.attr}")
    return found


def test_producer_reads_the_pool_through_its_public_api() -> None:
    for module in sorted((PACKAGE / "producer").glob("*.py")):
        assert private_reads_through(module, {"pool", "_pool"}) == []


def test_sync_facade_reads_the_consumer_through_its_public_api() -> None:
    assert private_reads_through(PACKAGE / "sync.py", {"_consumer"}) == []
