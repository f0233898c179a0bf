"""pynsq-style Reader / Writer / run() against the dev cluster (classic and youzan).

These tests are plain functions: ``run()`` blocks the calling thread as ``nsq.run()`` does,
so the dev cluster runs on a loop thread of its own. A watchdog stops ``run()`` if a test
goes wrong, so a failure never hangs the suite.
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import smartnsq.compat.pynsq_loops as loops
from smartnsq.compat import pynsq as nsq
from smartnsq.compat.pynsq import options as pynsq_options
from smartnsq.compat.pynsq import reader as pynsq_reader
from smartnsq.devcluster import DevCluster
from smartnsq.errors import InvalidArgument
from smartnsq.transport.loop_thread import LoopThread

WATCHDOG = 20.0


@pytest.fixture
def cluster_of(pynsq_objects: Any) -> Iterator[Callable[..., DevCluster]]:
    thread = LoopThread("devcluster-test").start()
    clusters: list[DevCluster] = []

    def make(topic: str = "t", channel: str = "c", **kwargs: Any) -> DevCluster:
        async def start() -> DevCluster:
            cluster = DevCluster(**kwargs)
            await cluster.start()
            if kwargs.get("mode") == "classic":
                await cluster.create_topic(topic, channels=[channel])
            else:
                await cluster.create_topic(topic, partitions=2, channels=[channel])
            return cluster

        cluster = thread.run(start())
        clusters.append(cluster)
        return cluster

    yield make
    try:
        pynsq_objects.close_all()  # before the clusters stop: a failed test's Readers too
        for cluster in clusters:
            thread.run(cluster.stop())
    finally:
        thread.stop()


def run_until(done: threading.Event) -> None:
    """nsq.run() until ``done`` is set (by a handler) or the watchdog fires."""
    timer = threading.Timer(WATCHDOG, nsq.stop)
    timer.start()
    try:
        nsq.run()
    finally:
        timer.cancel()
    assert done.is_set(), "the watchdog stopped run()"


def classic(cluster_of: Callable[..., DevCluster]) -> DevCluster:
    return cluster_of(nodes=2, lookupds=1, mode="classic")


def test_writer_then_reader_classic(cluster_of: Callable[..., DevCluster]) -> None:
    cluster = classic(cluster_of)
    writer = nsq.Writer(cluster.nsqd_tcp_addresses)
    answers: list[tuple[Any, Any]] = []
    got: list[bytes] = []
    done = threading.Event()

    def finish_pub(conn: Any, data: Any) -> None:
        answers.append((conn, data))

    writer.pub("t", b"one", finish_pub)
    writer.mpub("t", [b"two", b"three"], callback=finish_pub)
    writer.dpub("t", 10, b"four", callback=finish_pub)
    writer.pub("t", "five")  # str bodies, no callback

    def handler(message: nsq.Message) -> bool:
        got.append(message.body)
        assert len(message.id) == 16 and message.attempts == 1
        if len(got) == 5:
            done.set()
            nsq.stop()
        return True

    reader = nsq.Reader(topic="t", channel="c", message_handler=handler,
                        lookupd_http_addresses=[f"http://{cluster.lookupd_http_addresses[0]}"],
                        max_in_flight=10, lookupd_poll_interval=1)
    run_until(done)
    assert sorted(got) == [b"five", b"four", b"one", b"three", b"two"]
    assert [data for _, data in answers] == [b"OK", b"OK", b"OK"]
    assert {conn.id for conn, _ in answers} <= set(cluster.nsqd_tcp_addresses)
    reader.close().result(10)
    writer.close()


def test_a_reader_nobody_keeps_still_runs(cluster_of: Callable[..., DevCluster],
                                          pynsq_objects: list[Any]) -> None:
    """``nsq.Reader(...)`` without keeping it, then ``nsq.run()``: pynsq runs it (its IOLoop
    holds the Reader's callbacks), and so must we, whenever a garbage collection happens.

    The Reader's own references used to form a cycle nothing else held: a collection between
    the constructor and run() (any thread's allocations can trigger one, so under load it
    came at random) freed it, and run() waited for ever -- examples/pynsq_migration.py's
    "timed out" in CI.
    """
    cluster = classic(cluster_of)
    writer = nsq.Writer(cluster.nsqd_tcp_addresses)
    writer.pub("t", b"kept").result(10)
    got: list[bytes] = []
    done = threading.Event()

    def handler(message: nsq.Message) -> bool:
        got.append(message.body)
        done.set()
        nsq.stop()
        return True

    nsq.Reader(topic="t", channel="c", message_handler=handler,
               lookupd_http_addresses=[f"http://{cluster.lookupd_http_addresses[0]}"],
               lookupd_poll_interval=1)
    reader = weakref.ref(pynsq_objects.pop())  # the fixture's reference: let go of it too
    gc.collect()
    alive = reader()
    assert alive is not None, "the Reader was garbage-collected before run()"
    del alive
    try:
        run_until(done)
        assert got == [b"kept"]
    finally:
        still = reader()
        if still is not None:
            still.close().result(10)
    writer.close()


def test_handler_semantics(cluster_of: Callable[..., DevCluster]) -> None:
    """True finishes, False and a raise requeue, enable_async answers later, max_tries gives up."""
    cluster = cluster_of(nodes=1, lookupds=1, mode="classic")
    writer = nsq.Writer(cluster.nsqd_tcp_addresses)
    for body in (b"ok", b"false-once", b"raise-once", b"async", b"never"):
        writer.pub("t", body).result(10)
    seen: dict[bytes, list[int]] = {}
    gave_up: list[bytes] = []
    held: list[nsq.Message] = []
    done = threading.Event()

    class MyReader(nsq.Reader):
        def giving_up(self, message: nsq.Message) -> None:
            gave_up.append(message.body)
            super().giving_up(message)

    def check_done() -> None:
        if seen.get(b"ok") and len(seen.get(b"false-once", [])) == 2 and \
                len(seen.get(b"raise-once", [])) == 2 and gave_up and not held \
                and seen.get(b"async"):
            done.set()
            nsq.stop()

    def handler(message: nsq.Message) -> bool:
        seen.setdefault(message.body, []).append(message.attempts)
        try:
            if message.body == b"ok":
                return True
            if message.body in (b"false-once", b"never"):
                return message.attempts > 1 and message.body != b"never"
            if message.body == b"raise-once" and message.attempts == 1:
                raise RuntimeError("boom")
            if message.body == b"async":
                message.enable_async()
                held.append(message)
                return False  # ignored: async
            return True
        finally:
            if message.body == b"ok" and held:
                held.pop().finish()  # answered later, from another message's handler
            check_done()

    def release_held() -> None:
        while held:
            held.pop().finish()
        check_done()

    reader = MyReader("t", "c", handler, nsqd_tcp_addresses=cluster.nsqd_tcp_addresses,
                      max_in_flight=5, max_tries=2, requeue_delay=0, max_backoff_duration=0.05)
    run_until_with(done, release_held)
    assert seen[b"ok"] == [1]
    assert seen[b"false-once"] == [1, 2] and seen[b"raise-once"] == [1, 2]
    assert seen[b"never"] == [1, 2] and gave_up == [b"never"]  # 3rd delivery: giving_up
    assert seen[b"async"] == [1]
    reader.close().result(10)
    writer.close()


def run_until_with(done: threading.Event, tick: Callable[[], None]) -> None:
    """run() with ``tick`` called on the run() loop every 50 ms (for async answers)."""
    loop = loops.user_loop()

    def again() -> None:
        tick()
        if not done.is_set():
            loop.call_later(0.05, again)

    loop.call_soon(again)
    run_until(done)


def test_coroutine_handler_and_starved(cluster_of: Callable[..., DevCluster]) -> None:
    cluster = cluster_of(nodes=1, lookupds=1)  # youzan, 2 partitions
    writer = nsq.Writer(lookupd_http_addresses=cluster.lookupd_http_addresses)
    futures = [writer.pub("t", b"m%d" % i) for i in range(6)]
    assert {f.result(10).partition for f in futures} == {0, 1}
    got: list[Any] = []
    done = threading.Event()

    async def handler(message: nsq.Message) -> bool:
        got.append((message.body, message.partition, len(message.id)))
        if len(got) == 6:
            done.set()
            nsq.stop()
        return True

    reader = nsq.Reader("t", "c", handler, lookupd_http_addresses=cluster.lookupd_http_addresses,
                        max_in_flight=6)
    run_until(done)
    assert sorted(b for b, _, _ in got) == [b"m%d" % i for i in range(6)]
    assert {p for _, p, _ in got} == {0, 1} and {n for _, _, n in got} == {32}
    assert reader.is_starved() in (True, False)
    reader.set_max_in_flight(0)
    reader.close().result(10)
    writer.close()


def test_publish_errors_reach_the_callback(cluster_of: Callable[..., DevCluster]) -> None:
    cluster = cluster_of(nodes=1, lookupds=1)  # youzan: no DPUB
    writer = nsq.Writer(lookupd_http_addresses=cluster.lookupd_http_addresses)
    answers: list[Any] = []
    done = threading.Event()

    def callback(conn: Any, data: Any) -> None:
        answers.append((conn, data))
        done.set()
        nsq.stop()

    writer.dpub("t", 100, b"x", callback)
    run_until(done)
    conn, data = answers[0]
    assert conn is None and isinstance(data, nsq.Error)
    assert isinstance(data.error, InvalidArgument)
    writer.close()


def test_arguments() -> None:
    with pytest.raises(InvalidArgument):
        nsq.Reader("t", "c", lambda m: True)  # no address
    with pytest.raises(InvalidArgument):
        nsq.Reader("t", "c", lambda m: True, nsqd_tcp_addresses="127.0.0.1:1", bogus=1)
    with pytest.raises(InvalidArgument):
        nsq.Writer()
    options, delay = pynsq_options.connection_options({"snappy": True, "heartbeat_interval": 10,
                                             "output_buffer_timeout": 5, "msg_timeout": 30,
                                             "requeue_delay": 3, "auth_secret": b"s"})
    assert options == {"compression": "snappy", "heartbeat_interval": 10.0,
                       "output_buffer_timeout": 0.01, "msg_timeout": 30.0,
                       "auth_secret": "s"} and delay == 3.0
    with pytest.raises(InvalidArgument):
        pynsq_options.connection_options({"heartbeat_interval": 100})


def test_tornado_patterns_keep_working(cluster_of: Callable[..., DevCluster]) -> None:
    """pynsq's Writer example: a tornado PeriodicCallback publishes, IOLoop.stop() ends run()."""
    tornado_ioloop = pytest.importorskip("tornado.ioloop")
    cluster = cluster_of(nodes=1, lookupds=1, mode="classic")
    writer = nsq.Writer(cluster.nsqd_tcp_addresses)
    answers: list[Any] = []
    done = threading.Event()

    def finish_pub(conn: Any, data: Any) -> None:
        answers.append(data)
        if len(answers) == 3:
            done.set()
            tornado_ioloop.IOLoop.current().stop()

    def pub_message() -> None:
        writer.pub("t", b"tick", finish_pub)

    periodic = tornado_ioloop.PeriodicCallback(pub_message, 20)
    periodic.start()
    try:
        run_until(done)
    finally:
        periodic.stop()
    assert answers[:3] == [b"OK"] * 3
    writer.close()


def test_answers_by_hand_and_both_sources(cluster_of: Callable[..., DevCluster]) -> None:
    """requeue(delay=0, backoff=False), touch(), a second answer refused; nsqd + lookupd."""
    cluster = cluster_of(nodes=1, lookupds=1, mode="classic")
    writer = nsq.Writer(cluster.nsqd_tcp_addresses)
    writer.pub("t", b"again").result(10)
    seen: list[int] = []
    refused: list[BaseException] = []
    done = threading.Event()

    def handler(message: nsq.Message) -> None:
        seen.append(message.attempts)
        message.enable_async()
        message.touch()
        if message.attempts == 1:
            message.requeue(delay=0, backoff=False)
        else:
            message.finish()
            try:
                message.finish()
            except Exception as exc:  # a second answer
                refused.append(exc)
            done.set()
            nsq.stop()

    reader = nsq.Reader("t", "c", handler, nsqd_tcp_addresses=cluster.nsqd_tcp_addresses,
                        lookupd_http_addresses=cluster.lookupd_http_addresses,
                        max_in_flight=3)
    run_until(done)
    assert seen == [1, 2] and len(refused) == 1 and reader.message_handler is handler
    assert [s.topic for s in reader.stats()] == ["t", "t"]  # one consumer per source
    assert pynsq_reader._split(3, 2) == [2, 1] and pynsq_reader._split(1, 2) == [1, 1]
    assert pynsq_reader._split(0, 2) == [0, 0] and pynsq_reader._split(7, 1) == [7]
    reader.close().result(10)
    writer.close()


def test_writer_over_both_clusters(cluster_of: Callable[..., DevCluster]) -> None:
    """The Writer's lookupd extension with a migration policy: one pynsq Writer, two clusters."""
    from smartnsq.compat import MigrationPolicy

    old = cluster_of("moving", nodes=1, lookupds=1, mode="classic")
    new = cluster_of("moving", nodes=1, lookupds=1)
    writer = nsq.Writer(lookupd_http_addresses=[*old.lookupd_http_addresses,
                                                *new.lookupd_http_addresses],
                        producer_options={"migration": MigrationPolicy(prefer="classic")})
    classic_result = writer.pub("moving", b"x").result(10)
    writer.close()
    writer = nsq.Writer(lookupd_http_addresses=[*old.lookupd_http_addresses,
                                                *new.lookupd_http_addresses])
    youzan_result = writer.pub("moving", b"y").result(10)
    writer.close()
    assert classic_result.node == old.nsqd_tcp_addresses[0] and classic_result.partition is None
    assert youzan_result.node == new.nsqd_tcp_addresses[0] and youzan_result.partition is not None


def test_close_after_run_gives_back_what_no_handler_took(
        cluster_of: Callable[..., DevCluster]) -> None:
    cluster = cluster_of(nodes=1, lookupds=1, mode="classic")
    writer = nsq.Writer(cluster.nsqd_tcp_addresses)
    writer.mpub("t", [b"%d" % i for i in range(5)]).result(10)
    first: list[bytes] = []
    done = threading.Event()

    def stop_at_first(message: nsq.Message) -> bool:
        first.append(message.body)
        done.set()
        nsq.stop()  # the other deliveries wait on the stopped loop
        return True

    reader = nsq.Reader("t", "c", stop_at_first, nsqd_tcp_addresses=cluster.nsqd_tcp_addresses,
                        max_in_flight=5)
    run_until(done)
    reader.close().result(10)  # no drain wait for messages nobody will handle
    rest: list[nsq.Message] = []
    done = threading.Event()

    def take(message: nsq.Message) -> bool:
        rest.append(message)
        if len(rest) + len(first) == 5:
            done.set()
            nsq.stop()
        return True

    second = nsq.Reader("t", "c", take, nsqd_tcp_addresses=cluster.nsqd_tcp_addresses,
                        max_in_flight=5)
    run_until(done)
    assert sorted(first + [m.body for m in rest]) == [b"%d" % i for i in range(5)]
    second.close().result(10)
    writer.close()


def test_tls_and_compression_arguments() -> None:
    import ssl

    options, _ = pynsq_options.connection_options({
        "tls_v1": True, "deflate": True, "deflate_level": 3, "timeout": 2.0,
        "tls_options": {"cert_reqs": ssl.CERT_NONE, "ca_certs": "/ca.pem",
                        "certfile": "/c.pem", "keyfile": "/k.pem"}})
    assert options == {"tls": True, "tls_verify": False, "tls_ca_file": "/ca.pem",
                       "tls_cert_file": "/c.pem", "tls_key_file": "/k.pem",
                       "compression": "deflate", "deflate_level": 3, "connect_timeout": 2.0}
    with pytest.raises(InvalidArgument, match="snappy or deflate"):
        pynsq_options.connection_options({"snappy": True, "deflate": True})


def test_max_tries_is_the_readers_own_past_the_cores_default(
        cluster_of: Callable[..., DevCluster]) -> None:
    """pynsq counts ``max_tries`` itself (``giving_up`` past it): the core consumer's own
    give-up (5 attempts by default) must not finish the message first. With
    ``max_tries=10`` a message failed six times reaches its seventh attempt."""
    cluster = classic(cluster_of)
    attempts: list[int] = []
    gave_up: list[int] = []
    done = threading.Event()

    def handler(message: nsq.Message) -> bool:
        attempts.append(message.attempts)
        if message.attempts == 7:
            done.set()
            nsq.stop()
            return True
        message.requeue(delay=0, backoff=False)
        return False

    writer = nsq.Writer(cluster.nsqd_tcp_addresses)
    writer.pub("t", b"again")
    reader = nsq.Reader(topic="t", channel="c", message_handler=handler, max_tries=10,
                        lookupd_http_addresses=cluster.lookupd_http_addresses,
                        lookupd_poll_interval=1)
    reader.giving_up = lambda message: gave_up.append(message.attempts)  # type: ignore
    run_until(done)
    assert attempts == [1, 2, 3, 4, 5, 6, 7] and gave_up == []
    reader.close().result(10)
    writer.close()
