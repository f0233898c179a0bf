"""``Writer.pub(..., sharding_key=)`` on youzan NSQ, and the hint for an ordered topic.

A sharding key (a keyword-only extension of pynsq's ``pub``/``mpub``) routes as the native
``smartnsq.Producer`` routes it: every message of a key to the key's partition. A Writer given
``nsqd_tcp_addresses`` (no lookupd) publishing to an ordered youzan topic is refused by the
server with ``E_BAD_PARTITION ... -1``; its callback's error says what to do instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pynsq_support import DEADLINE, in_thread, served_cluster

from smartnsq import sync
from smartnsq.compat import pynsq as nsq
from smartnsq.devcluster import DevCluster
from smartnsq.errors import ServerError

KEYS = (1001, 1002, 1003, "order-7")


@pytest.fixture(scope="module")
def cluster() -> Iterator[DevCluster]:
    """A youzan dev cluster: ``plain`` (4 partitions) and ``ordered`` (4, ordered)."""
    with served_cluster("sharding-devcluster", {
            "plain": {"partitions": 4, "channels": ["c"]},
            "ordered": {"partitions": 4, "ordered": True, "channels": ["c"]}},
            nodes=2, lookupds=1) as dev:
        yield dev


def native_partitions(cluster: DevCluster, topic: str) -> dict[Any, int]:
    """Where the native Producer puts each key."""
    with sync.Producer(lookupd=cluster.lookupd_http_addresses) as producer:
        return {key: producer.publish(topic, b"native", sharding_key=key).partition
                for key in KEYS}


@pytest.mark.parametrize("topic", ["plain", "ordered"])
def test_a_sharding_key_lands_on_the_keys_partition(cluster: DevCluster, topic: str) -> None:
    expected = native_partitions(cluster, topic)
    answers: list[tuple[Any, Any]] = []
    results: dict[Any, list[int | None]] = {}

    def scenario() -> None:
        writer = nsq.Writer(lookupd_http_addresses=cluster.lookupd_http_addresses)
        total = 2 * len(KEYS) + len(KEYS)

        def callback(conn: Any, data: Any) -> None:
            answers.append((conn, data))
            if len(answers) == total:
                nsq.stop()

        try:
            futures = []
            for key in KEYS:
                for n in range(2):
                    futures.append((key, writer.pub(topic, b"m%d" % n, callback,
                                                    sharding_key=key)))
                futures.append((key, writer.mpub(topic, [b"x", b"y"], callback,
                                                 sharding_key=key)))
            writer.io_loop.call_later(DEADLINE, nsq.stop)
            nsq.run()
            for key, future in futures:
                results.setdefault(key, []).append(future.result(DEADLINE).partition)
        finally:
            writer.close()

    in_thread(scenario)
    assert [data for _, data in answers] == [b"OK"] * len(answers)
    assert results == {key: [expected[key]] * 3 for key in KEYS}


def test_nsqd_addresses_and_an_ordered_topic_get_a_hint(cluster: DevCluster) -> None:
    got: list[Any] = []

    def scenario() -> None:
        writer = nsq.Writer(cluster.nsqd_tcp_addresses[0])

        def callback(conn: Any, data: Any) -> None:
            got.append(data)
            nsq.stop()

        try:
            writer.pub("ordered", b"no partition", callback)
            writer.io_loop.call_later(DEADLINE, nsq.stop)
            nsq.run()
        finally:
            writer.close()

    in_thread(scenario)
    [error] = got
    assert isinstance(error, nsq.Error)
    assert isinstance(error.error, ServerError) and error.error.code == "E_BAD_PARTITION"
    text = str(error)
    assert "E_BAD_PARTITION" in text
    assert "lookupd_http_addresses" in text and "sharding_key" in text


def test_reconnect_interval_caps_the_redial_wait() -> None:
    """pynsq waits ``reconnect_interval`` before redialling a failed nsqd; smartnsq's redial
    wait doubles from 50 ms, and the Writer's ``reconnect_interval`` is its ceiling."""
    writer = nsq.Writer("127.0.0.1:1", reconnect_interval=5)
    default = nsq.Writer("127.0.0.1:1")
    try:
        config = writer.producer.async_producer.config
        assert (config.reconnect_delay, config.reconnect_delay_max) == (0.05, 5.0)
        assert writer.reconnect_interval == 5.0
        assert default.producer.async_producer.config.reconnect_delay_max == 2.0
        assert default.reconnect_interval == 2.0
    finally:
        writer.close()
        default.close()
    with pytest.raises(AssertionError, match="reconnect_interval"):
        nsq.Writer("127.0.0.1:1", reconnect_interval=0)
