"""The blocking facades at their edges, against a dev cluster on a loop thread of its own:
arguments the facade itself owns are refused before a loop thread is taken; every call on
a closed facade raises ``ClientClosed`` and sends nothing, while snapshots stay readable;
the consumer's controls (``set_max_in_flight``, ``set_trace``, ``is_starved``,
``stats(lag=True)``), iteration, ``run(timeout)`` and ``stop()`` behave as documented, and a
handler cannot ``close()`` its own consumer; a wedged loop thread costs a call its deadline
plus the guard, then a ``Timeout`` naming the call."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from support import WAIT, BackgroundCluster

from smartnsq import sync
from smartnsq.admin import Admin
from smartnsq.errors import ClientClosed, InvalidArgument, Timeout
from smartnsq.message import Message
from smartnsq.transport import loop_thread
from smartnsq.transport.loop_thread import LoopThread


@pytest.fixture(scope="module")
def bg() -> Iterator[BackgroundCluster]:
    cluster = BackgroundCluster(nodes=1, topics={"sfp": 1, "sfc": 1, "sfi": 1, "sfh": 1})
    with Admin(cluster.lookupd) as admin:  # the channels keep what is published before
        for topic in ("sfi", "sfh"):
            admin.create_channel(topic, "ch")
    yield cluster
    cluster.stop()


def test_the_facades_own_arguments_are_refused_before_a_loop_is_taken(
        bg: BackgroundCluster) -> None:
    users = loop_thread.shared_users()
    refusals = {
        "loop_thread": lambda: sync.Producer(bg.lookupd, loop_thread="the shared one"),
        "handler": lambda: sync.Consumer("sfc", "ch", bg.lookupd, handler="not callable"),
        "concurrency": lambda: sync.Consumer("sfc", "ch", bg.lookupd, handler=print,
                                             concurrency=4),
        "threads": lambda: sync.Consumer("sfc", "ch", bg.lookupd, handler=print, threads=0),
        "max_in_flight": lambda: sync.Consumer("sfc", "ch", bg.lookupd, handler=print,
                                               threads=2, max_in_flight=-1),
    }
    for field, make in refusals.items():
        with pytest.raises(InvalidArgument) as info:
            make()
        assert info.value.field == field
    with pytest.raises(InvalidArgument, match="threads="):
        refusals["concurrency"]()
    assert loop_thread.shared_users() == users


def test_a_closed_producer_refuses_every_call_and_keeps_its_snapshot(
        bg: BackgroundCluster) -> None:
    thread = LoopThread("sync-producer").start()
    producer = sync.Producer(bg.lookupd, loop_thread=thread, timeout=10)
    try:
        assert repr(producer) == "<smartnsq.sync.Producer open>"
        assert producer.loop_thread is thread and producer.config.timeout == 10
        assert producer.async_producer.config is producer.config
        batch = producer.publish_many("sfp", [b"a", b"b"])
        assert (batch.topic, batch.count) == ("sfp", 2)
        assert producer.routes("sfp").partition_num == 1
        producer.set_trace(True, "sfp")
        assert producer.trace_enabled("sfp") is True
        assert producer.stats().published == 2
    finally:
        producer.close()
    assert producer.closed and repr(producer) == "<smartnsq.sync.Producer closed>"
    calls = {"publish": lambda: producer.publish("sfp", b"x"),
             "publish_many": lambda: producer.publish_many("sfp", [b"x"]),
             "routes": lambda: producer.routes("sfp"),
             "set_trace": lambda: producer.set_trace(False)}
    for call in calls.values():
        with pytest.raises(ClientClosed, match="this Producer is closed"):
            call()
        with pytest.raises(RuntimeError):  # what these calls raised before ClientClosed
            call()
    producer.close()  # idempotent
    thread.stop()
    # the loop is gone: the snapshot is read directly, nothing mutates it any more
    assert producer.stats().published == 2


def test_the_consumers_controls_iteration_and_run_with_a_timeout(
        bg: BackgroundCluster) -> None:
    with sync.Producer(bg.lookupd) as producer:
        for i in range(3):
            producer.publish("sfi", b"%d" % i)
    consumer = sync.Consumer("sfi", "ch", bg.lookupd, max_in_flight=5,
                             reconnect_delay=0.05)
    try:
        assert repr(consumer) == "<smartnsq.sync.Consumer sfi/ch open>"
        got: list[bytes] = []
        for msg in consumer:
            got.append(msg.body)
            msg.fin()
            if len(got) == 3:
                break
        assert sorted(got) == [b"0", b"1", b"2"]
        consumer.set_max_in_flight(2)
        consumer.set_trace(False)
        # the async layer's refusals arrive in the calling thread
        with pytest.raises(InvalidArgument) as info:
            consumer.set_max_in_flight(-1)
        assert info.value.field == "max_in_flight"
        with pytest.raises(InvalidArgument) as info:
            consumer.set_trace("yes")  # type: ignore[arg-type]
        assert info.value.field == "trace"
        assert consumer.is_starved() is False  # every message answered
        stats = consumer.stats(lag=True, timeout=5)
        assert stats.max_in_flight == 2 and stats.finished == 3
        assert stats.lag is not None and stats.lag.topic == "sfi" and stats.lag.depth == 0
        assert consumer.run(timeout=0.01) is False  # still consuming
        consumer.stop()
        assert consumer.run(timeout=WAIT) is True
        consumer.stop()  # closed already: a no-op
    finally:
        consumer.close()
    assert consumer.closed and repr(consumer) == "<smartnsq.sync.Consumer sfi/ch closed>"
    assert consumer.run() is True  # stopped and closed: returns at once
    for call in (lambda: consumer.set_max_in_flight(1), lambda: consumer.set_trace(True),
                 consumer.is_starved, lambda: consumer.stats(lag=True),
                 lambda: iter(consumer)):
        with pytest.raises(ClientClosed, match="this Consumer is closed"):
            call()
    assert consumer.stats().finished == 3  # the last snapshot stays readable
    consumer.close()  # idempotent


def test_a_handler_cannot_close_its_own_consumer_but_may_stop_it(
        bg: BackgroundCluster) -> None:
    with sync.Producer(bg.lookupd) as producer:
        producer.publish("sfh", b"stop me")
    refused: list[str] = []
    done = threading.Event()
    consumer: sync.Consumer | None = None
    ready = threading.Event()

    def handler(msg: Message) -> None:
        ready.wait(WAIT)
        assert consumer is not None
        try:
            consumer.close()
        except RuntimeError as exc:
            refused.append(str(exc))
        consumer.stop()
        done.set()

    consumer = sync.Consumer("sfh", "ch", bg.lookupd, handler=handler, threads=1,
                             reconnect_delay=0.05)
    ready.set()
    try:
        assert done.wait(WAIT)
        assert consumer.run(timeout=WAIT) is True
        assert consumer.stats().finished == 1  # stopped and drained: the handler's FIN sent
    finally:
        consumer.close()
    assert refused == ["close() from a handler would wait for itself; use stop()"]


def test_a_wedged_loop_costs_a_call_its_deadline_plus_the_guard(
        bg: BackgroundCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sync, "_GUARD", 0.05)
    thread = LoopThread("wedged-facade").start()
    producer = sync.Producer(bg.lookupd, loop_thread=thread)
    gate = threading.Event()
    entered = threading.Event()

    def wedge() -> None:
        entered.set()
        gate.wait(WAIT)

    try:
        producer.publish("sfp", b"connects first", timeout=10)
        thread.call_soon(wedge)
        assert entered.wait(WAIT)
        with pytest.raises(Timeout, match=r"publish to 'sfp' did not finish within its 0\.1s "
                                          r"deadline \(\+0\.05s\)"):
            producer.publish("sfp", b"x", timeout=0.1)
        with pytest.raises(Timeout, match=r"publish_many to 'sfp' did not finish within its "
                                          r"0\.1s deadline .*event loop thread is blocked"):
            producer.publish_many("sfp", [b"x"], timeout=0.1)
    finally:
        gate.set()
        producer.close()
        thread.stop()
