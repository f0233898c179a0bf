"""smartnsq.sync.Producer: blocking calls from plain threads against the dev cluster.

The dev cluster runs on its own loop thread here, as a remote cluster would: the test code is
ordinary blocking code, as in a WSGI app or a Spark executor.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from support import WAIT, BackgroundCluster

from smartnsq import BatchResult, PublishResult, sync
from smartnsq.errors import InvalidArgument, Timeout, TopicNotFound
from smartnsq.model.sharding import murmur3_partition
from smartnsq.transport import loop_thread
from smartnsq.transport.loop_thread import LoopThread


@pytest.fixture
def bg() -> Iterator[BackgroundCluster]:
    background = BackgroundCluster(2, {"orders": 4, "small": 1}, WAIT)
    yield background
    background.stop()


def test_publish_blocks_until_acknowledged(bg: BackgroundCluster) -> None:
    with sync.Producer(lookupd=bg.lookupd) as producer:
        result = producer.publish("orders", b"hello", sharding_key="hello", trace_id=42)
        plain = producer.publish("small", b"plain")
        batch = producer.publish_many("orders", [b"a", b"b"], partition=1)
        routes = producer.routes("orders")
    assert isinstance(result, PublishResult) and isinstance(batch, BatchResult)
    assert result.partition == murmur3_partition("hello", 4) == 3
    (stored,) = bg.messages("orders", 3)
    assert (stored.body, stored.trace_id, stored.internal_id, stored.queue_offset) == \
        (b"hello", 42, result.internal_id, result.queue_offset)
    assert plain.partition == 0 and [m.body for m in bg.messages("small", 0)] == [b"plain"]
    assert [m.body for m in bg.messages("orders", 1)] == [b"a", b"b"] and batch.count == 2
    assert routes.partition_num == 4 and sorted(routes.leaders) == [0, 1, 2, 3]
    assert producer.closed


def test_many_threads_share_one_producer(bg: BackgroundCluster) -> None:
    results: list[PublishResult] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    with sync.Producer(lookupd=bg.lookupd) as producer:
        def work(worker: int) -> None:
            try:
                for i in range(100):
                    r = producer.publish("orders", b"w%d-%d" % (worker, i),
                                         sharding_key=f"user-{worker}")
                    with lock:
                        results.append(r)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
    assert errors == [] and len(results) == 800
    for worker in range(8):
        partition = murmur3_partition(f"user-{worker}", 4)
        mine = [m.body for m in bg.messages("orders", partition)
                if m.body.startswith(b"w%d-" % worker)]
        assert mine == [b"w%d-%d" % (worker, i) for i in range(100)]  # per-key order kept


def test_errors_arrive_in_the_calling_thread(bg: BackgroundCluster) -> None:
    with sync.Producer(lookupd=bg.lookupd, timeout=0.3) as producer:
        with pytest.raises(InvalidArgument, match="topic"):
            producer.publish("bad topic", b"x")
        with pytest.raises(InvalidArgument, match="4 partitions"):
            producer.publish("orders", b"x", partition=9)
        with pytest.raises(InvalidArgument, match="DPUB"):
            producer.publish("orders", b"x", delay=1)
        with pytest.raises(TopicNotFound):
            producer.publish("missing", b"x")
        # a partition without a leader: the call gives up at its deadline
        bg.thread.run(bg.cluster.stop_node(bg.cluster.leader_of("small", 0)), WAIT)
        with pytest.raises(Timeout):
            producer.publish("small", b"x", partition=0)


def test_producers_share_the_process_loop_thread(bg: BackgroundCluster) -> None:
    a = sync.Producer(lookupd=bg.lookupd)
    b = sync.Producer(lookupd=bg.lookupd)
    try:
        assert a.loop_thread is b.loop_thread and a.loop_thread.running
        a.publish("small", b"from a")
        b.publish("small", b"from b")
    finally:
        a.close()
        b.close()
    assert not a.loop_thread.running  # the last user stopped it
    with pytest.raises(RuntimeError, match="closed"):
        a.publish("small", b"late")
    a.close()  # idempotent


def test_an_explicit_loop_thread(bg: BackgroundCluster) -> None:
    mine = LoopThread("mine").start()
    try:
        with sync.Producer(lookupd=bg.lookupd, loop_thread=mine) as producer:
            assert producer.loop_thread is mine
            producer.publish("small", b"x")
        assert mine.running  # not ours to stop
    finally:
        mine.stop()


def test_set_trace_from_any_thread(bg: BackgroundCluster) -> None:
    with sync.Producer(lookupd=bg.lookupd) as producer:
        producer.set_trace(True, "small")
        assert producer.trace_enabled("small") is True
        result = producer.publish("small", b"traced now")
        assert result.internal_id is not None
        producer.set_trace(None, "small")
        assert producer.trace_enabled("small") is None


def test_a_blocking_call_on_the_loop_thread_is_refused(bg: BackgroundCluster) -> None:
    with sync.Producer(lookupd=bg.lookupd) as producer:
        async def inside() -> None:
            producer.publish("small", b"x")

        with pytest.raises(RuntimeError, match="own event-loop thread"):
            producer.loop_thread.run(inside())


def test_garbage_collected_producer_releases_the_loop(bg: BackgroundCluster) -> None:
    producer = sync.Producer(lookupd=bg.lookupd)
    thread = producer.loop_thread
    producer.publish("small", b"x")
    del producer
    import gc

    gc.collect()
    assert not thread.running
    assert loop_thread._shared is None


def test_construction_errors_release_the_loop(bg: BackgroundCluster) -> None:
    with pytest.raises(InvalidArgument):
        sync.Producer(lookupd=bg.lookupd, timeout=-1)
    with pytest.raises(InvalidArgument):
        sync.Producer()
    assert loop_thread._shared is None


def test_sync_producer_inside_a_running_event_loop_thread_is_fine(
        bg: BackgroundCluster) -> None:
    # an asyncio program may use the facade from a worker thread (run_in_executor)
    async def main() -> PublishResult:
        with sync.Producer(lookupd=bg.lookupd) as producer:
            return await asyncio.to_thread(producer.publish, "small", b"from a thread")

    result = asyncio.run(main())
    assert result.partition == 0
