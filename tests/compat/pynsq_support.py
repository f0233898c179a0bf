"""What the pynsq-layer tests share: a dev cluster served from a loop thread of its own (the
tests are plain functions that block, as pynsq programs do) and a scenario run on a fresh
thread, which has no event loop yet."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from smartnsq.devcluster import DevCluster
from smartnsq.transport.loop_thread import LoopThread

DEADLINE = 20.0


@contextmanager
def served_cluster(name: str, topics: dict[str, dict[str, Any]],
                   **cluster: Any) -> Iterator[DevCluster]:
    """A started ``DevCluster(**cluster)`` with ``topics`` (name -> create_topic keywords),
    its loop on a thread named ``name``; stopped, and the thread with it, on exit."""
    thread = LoopThread(name).start()
    dev = DevCluster(**cluster)
    try:
        thread.run(dev.start())
        for topic, options in topics.items():
            thread.run(dev.create_topic(topic, **options))
        yield dev
    finally:
        try:
            thread.run(dev.stop())
        finally:
            thread.stop()


def classic_nsqd(name: str, *topics: str) -> Any:
    """:func:`served_cluster` of one classic nsqd whose ``topics`` have the channel ``c``."""
    return served_cluster(name, {t: {"channels": ["c"]} for t in topics},
                          nodes=1, lookupds=1, mode="classic")


def in_thread(scenario: Callable[[], None], deadline: float = DEADLINE * 2) -> None:
    """Run ``scenario`` on a new thread (no event loop yet), re-raising its error."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            scenario()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(deadline)
    assert not thread.is_alive(), "the scenario did not finish"
    if errors:
        raise errors[0]
