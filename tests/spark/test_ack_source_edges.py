"""The acknowledging source (``mode=ack``) driven as Spark drives it, without a SparkSession.

What a query relies on: each planned micro-batch numbers at most ``maxMessagesPerTrigger``
buffered messages (all of them when Spark reads everything available); its rows reach the
executors with their bodies; a message is FINed only once Spark commits its batch; an empty
"tick" batch lets Spark commit the last one when nothing new can arrive; a batch re-planned
after a driver restart takes the messages that came back; stop() gives the uncommitted ones
back; a consumer that never reaches an nsqd fails the query past ``connectTimeout``, saying
whether no lookupd answered or no nsqd has the topic, and only the options travel to the
executors.
"""

from __future__ import annotations

import pickle
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from smartnsq import sync
from smartnsq.errors import ClusterError
from smartnsq.observability.stats import LookupStats
from smartnsq.spark.ack_source import NSQAckPartition, NSQAckStreamReader
from smartnsq.spark.cluster import ClusterClient
from smartnsq.spark.options import AckSourceOptions, SourceOptions

pytestmark = pytest.mark.spark

DEADLINE = 20.0
_NO_LOOKUP = LookupStats()


class _AllAvailable:
    """A read limit without ``max_rows``: Spark's ReadAllAvailable."""


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)  # polling a condition, with a deadline


@pytest.fixture
def readers() -> Iterator[list[NSQAckStreamReader]]:
    built: list[NSQAckStreamReader] = []
    yield built
    for reader in built:
        reader.stop()


def ack_reader(built: list[NSQAckStreamReader], **options: str) -> NSQAckStreamReader:
    reader = NSQAckStreamReader(AckSourceOptions.parse({"mode": "ack", **options}))
    built.append(reader)
    return reader


def channel_backlog(nsq: Any, topic: str, channel: str) -> int:
    """Messages of the channel not FINed yet (its depth, in flight included), over every
    partition."""
    options = SourceOptions.parse({"lookupd": nsq.lookupd, "topic": topic}, streaming=False)
    with ClusterClient(options.cluster) as client:
        layout = client.layout(topic)
        return sum(client.channel_depth(topic, partition, leader, channel)
                   for partition, leader in layout.leaders.items())


def publish(nsq: Any, topic: str, bodies: list[bytes]) -> None:
    with sync.Producer(lookupd=nsq.lookupd.split(",")) as producer:
        producer.publish_many(topic, bodies, partition=0)


def bodies_of(reader: NSQAckStreamReader, parts: Any) -> list[bytes]:
    return [row["body"] for part in parts for batch in reader.read(part)
            for row in batch.to_pylist()]


def test_batches_are_numbered_read_and_fined_on_commit(
        nsq: Any, readers: list[NSQAckStreamReader]) -> None:
    nsq.create_topic("ack_cycle", partitions=1, channels=["spark"])
    sent = [b"m%d" % i for i in range(5)]
    publish(nsq, "ack_cycle", sent)
    reader = ack_reader(readers, lookupd=nsq.lookupd, topic="ack_cycle", channel="spark",
                        maxMessagesPerTrigger="2")
    start = reader.initialOffset()
    assert start == {"seq": 0}
    assert reader.latestOffset(start, None)["seq"] <= 2  # starts the consumer
    wait_for(lambda: len(reader._buffer) + len(reader._numbered) == 5, "5 buffered messages")
    first = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert first == {"seq": 2}
    parts = reader.partitions(start, first)
    assert [type(p) for p in parts] == [NSQAckPartition]
    got = bodies_of(reader, parts)
    rest = reader.latestOffset(first, _AllAvailable())  # everything buffered
    assert rest == {"seq": 5}
    got += bodies_of(reader, reader.partitions(first, rest))
    assert sorted(got) == sent
    reader.commit(first)
    wait_for(lambda: channel_backlog(nsq, "ack_cycle", "spark") == 3, "the 2 FINs")
    # nothing new, messages waiting for their commit: an empty batch moves the offset
    tick = reader.latestOffset(rest, None)
    assert tick == {"seq": 5, "tick": 1}
    assert reader.partitions(rest, tick) == []
    assert channel_backlog(nsq, "ack_cycle", "spark") == 3  # the uncommitted 3: not FINed
    reader.commit(tick)
    wait_for(lambda: channel_backlog(nsq, "ack_cycle", "spark") == 0, "every FIN")
    assert reader.latestOffset(tick, None) == {"seq": 5, "tick": 1}  # nothing more


def test_a_batch_re_planned_after_a_restart_takes_what_came_back(
        nsq: Any, readers: list[NSQAckStreamReader]) -> None:
    nsq.create_topic("ack_restart", partitions=1, channels=["spark"])
    sent = [b"r%d" % i for i in range(3)]
    publish(nsq, "ack_restart", sent)
    options = {"lookupd": nsq.lookupd, "topic": "ack_restart", "channel": "spark"}
    old = ack_reader(readers, **options)
    old.latestOffset({"seq": 0}, None)
    wait_for(lambda: len(old._buffer) + len(old._numbered) == 3, "3 buffered messages")
    planned = old.latestOffset({"seq": 0}, _AllAvailable())
    assert planned == {"seq": 3}
    old.stop()  # the driver goes away before the commit: the messages go back to nsqd
    new = ack_reader(readers, **options)
    new.latestOffset(planned, None)  # resumes after the checkpoint's offset
    wait_for(lambda: len(new._buffer) == 3, "the 3 messages back")
    parts = new.partitions({"seq": 0}, planned)  # Spark re-runs the planned batch
    assert sorted(bodies_of(new, parts)) == sent
    new.commit(planned)
    wait_for(lambda: channel_backlog(nsq, "ack_restart", "spark") == 0, "every FIN")


def test_a_consumer_that_never_connects_fails_past_the_connect_timeout(
        readers: list[NSQAckStreamReader]) -> None:
    reader = ack_reader(readers, nsqd="127.0.0.1:1", topic="ack_nowhere", channel="c",
                        connectTimeout="30")
    assert reader.latestOffset(None, None) == {"seq": 0}  # not connected yet: not failed
    assert reader._unconnected_since is not None
    reader._unconnected_since -= 31  # as if unconnected for longer than connectTimeout
    with pytest.raises(ClusterError, match="no nsqd connection for topic 'ack_nowhere'") \
            as info:
        reader.latestOffset(None, None)
    assert "nsqd 127.0.0.1:1" in str(info.value) and "connectTimeout" in str(info.value)


def test_a_dead_lookupd_is_named_as_the_reason_nothing_connects(
        readers: list[NSQAckStreamReader]) -> None:
    """No nsqd is found because no lookupd answers: the error says so, not that no nsqd has
    the topic (which would send the user to create a topic that exists)."""
    with socket.socket() as sock:  # bound and closed again: nothing listens there now
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"
    reader = ack_reader(readers, lookupd=dead, topic="ack_deadlookupd", channel="c",
                        connectTimeout="30")
    assert reader.latestOffset(None, None) == {"seq": 0}
    consumer = reader._consumer
    assert consumer is not None
    wait_for(lambda: (consumer.stats().lookup or _NO_LOOKUP).failed_rounds > 0,
             "a lookup round that failed")
    assert reader._unconnected_since is not None
    reader._unconnected_since -= 31
    with pytest.raises(ClusterError, match=rf"lookupd at {dead} does not answer \(connection "
                       r"refused\)") as info:
        reader.latestOffset(None, None)
    assert "no nsqd has the topic" not in str(info.value)


def test_a_topic_no_nsqd_has_is_told_from_a_silent_lookupd(
        nsq: Any, readers: list[NSQAckStreamReader]) -> None:
    reader = ack_reader(readers, lookupd=nsq.lookupd, topic="ack_nowhere_topic", channel="c",
                        connectTimeout="30")
    assert reader.latestOffset(None, None) == {"seq": 0}
    consumer = reader._consumer
    assert consumer is not None
    wait_for(lambda: (consumer.stats().lookup or _NO_LOOKUP).rounds > 0, "a lookup round")
    assert reader._unconnected_since is not None
    reader._unconnected_since -= 31
    with pytest.raises(ClusterError, match="lookupd answers, but no nsqd has the topic"):
        reader.latestOffset(None, None)


def test_only_the_options_travel_to_the_executors(readers: list[NSQAckStreamReader]) -> None:
    reader = ack_reader(readers, nsqd="127.0.0.1:1", topic="ack_pickled", channel="c",
                        maxMessagesPerTrigger="7")
    copy = pickle.loads(pickle.dumps(reader))
    readers.append(copy)
    assert copy._options == reader._options and copy._consumer is None
    assert copy.getDefaultReadLimit().max_rows == 7
    unlimited = ack_reader(readers, nsqd="127.0.0.1:1", topic="ack_pickled", channel="c")
    assert not hasattr(unlimited.getDefaultReadLimit(), "max_rows")
