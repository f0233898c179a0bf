"""The consumer's shell over the expansion hold (smartnsq.consumer.expansion), in memory: which
targets start a hold (an ordered topic's partition count growing after the first targets),
and what a link's last answered delivery tells the hold. No I/O: the /stats task is not run."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from smartnsq.consumer.config import ConsumerConfig
from smartnsq.consumer.expansion import ExpansionWatch
from smartnsq.consumer.runtime import Runtime
from smartnsq.consumer.targets import Target

A = ("127.0.0.1", 4150)


def _targets(count: int, *, ordered: bool = True) -> list[Target]:
    return [Target(A, p, True, ordered, False, http="127.0.0.1:4151", partition_num=count)
            for p in range(count)]


def _watch(links: list[Any], **config: Any) -> ExpansionWatch:
    rt = Runtime("t", "c", ConsumerConfig(**config))
    rt.loop = asyncio.get_running_loop()
    watch = ExpansionWatch(rt, lambda: links)
    watch._run = _idle  # type: ignore[method-assign]  # no /stats here
    return watch


async def _idle() -> None:
    return None


async def test_only_an_ordered_topic_growing_after_the_first_targets_is_held() -> None:
    watch = _watch([])
    watch.seen(_targets(2))  # the first targets: no expansion point
    assert not watch.hold.active
    watch.seen(_targets(4))
    assert watch.held(2) and watch.held(3) and not watch.held(1) and not watch.held(None)
    plain = _watch([])
    plain.seen(_targets(2, ordered=False))
    plain.seen(_targets(4, ordered=False))
    assert not plain.hold.active
    forced = _watch([], ordered=True)  # ordered=True on a topic whose meta says otherwise
    forced.seen(_targets(1, ordered=False))
    forced.seen(_targets(2, ordered=False))
    assert forced.held(1)
    chosen = _watch([], partitions=[0, 1])  # partitions= by hand: not held
    chosen.seen(_targets(2))
    chosen.seen(_targets(4))
    assert not chosen.hold.active
    static = _watch([])
    static.seen([Target(A, 0), Target(A, 1)])  # nsqd=: no partition count
    static.seen([Target(A, 0), Target(A, 1), Target(A, 2)])
    assert not static.hold.active
    watch.stop()


async def test_a_links_last_answered_delivery_is_its_partitions_progress() -> None:
    last = SimpleNamespace(finished=False, queue_offset=100, raw_size=20)
    links = [SimpleNamespace(partition=0, last=last), SimpleNamespace(partition=2, last=None)]
    watch = _watch(links)
    watch.seen(_targets(1))
    watch.seen(_targets(3))
    hold = watch.hold
    now = asyncio.get_running_loop().time()
    hold.written(1, now)
    hold.end(0, 120, now)
    watch._look()
    assert hold.open_partitions() == {0}  # delivered, not answered yet
    last.finished = True
    watch._look()
    assert hold.open_partitions() == frozenset()
    (release,) = hold.decide(now)
    assert release.new == {1, 2}
    watch.stop()
    closed: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
    await watch.wait(1, closed)  # a stopped watch holds nothing back
