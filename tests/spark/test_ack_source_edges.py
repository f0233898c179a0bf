"""The acknowledging source (``mode=ack``) driven as Spark drives it, without a SparkSession.

What a query relies on: each planned micro-batch numbers at most ``maxMessagesPerTrigger``
buffered messages (all of them when Spark reads everything available); its rows reach the
executors with their bodies; a message is FINed only once Spark ran its batch: as soon as
Spark asks for the next offset from that batch's end (its commit log entry is written by then),
or at its commit; a batch re-planned after a driver restart takes the messages that came back;
stop() FINs what the checkpoint (when the reader is given it) says Spark committed and gives
the rest back; a consumer that never reaches an nsqd fails the query past ``connectTimeout``,
saying whether no lookupd answered or no nsqd has the topic, and only the options travel to
the executors.
"""

from __future__ import annotations

import json
import pathlib
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
from smartnsq.spark.ack_source import NSQAckPartition, NSQAckStreamReader, _committed_seq
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
    # Spark asks for the next offset with the end of a batch whose commit log entry it has
    # written: that batch is FINed then, before its commit() (which comes with batch 3's
    # planning, or never)
    wait_for(lambda: channel_backlog(nsq, "ack_cycle", "spark") == 3, "the 2 FINs")
    # nothing new: no empty batch is asked for; the next trigger FINs the rest
    assert reader.latestOffset(rest, None) == rest
    wait_for(lambda: channel_backlog(nsq, "ack_cycle", "spark") == 0, "every FIN")
    reader.commit(rest)  # Spark's late commit: nothing left to FIN
    # a checkpoint of the versions that planned empty "tick" batches: the tick is kept
    assert reader.latestOffset({"seq": 5, "tick": 2}, None) == {"seq": 5, "tick": 2}


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


def write_checkpoint(folder: pathlib.Path, offsets: dict[int, list[str]],
                     committed: list[int]) -> None:
    """A checkpoint as Spark 4's HDFSMetadataLog leaves it: ``offsets/<id>`` (a version line,
    a metadata line, one line per source), ``commits/<id>`` once the batch is committed, and
    the ``.crc`` and temporary files beside them."""
    (folder / "offsets").mkdir(parents=True, exist_ok=True)
    (folder / "commits").mkdir(parents=True, exist_ok=True)
    for batch, sources in offsets.items():
        (folder / "offsets" / str(batch)).write_text(
            "\n".join(["v1", '{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}',
                       *sources]))
        (folder / "offsets" / f".{batch}.crc").write_bytes(b"crc")
    for batch in committed:
        (folder / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    (folder / "commits" / ".99.0f1e.tmp").write_text("a rename Spark has not done yet")


def test_the_checkpoint_tells_the_last_committed_end_only_when_it_is_clear(
        tmp_path: pathlib.Path) -> None:
    write_checkpoint(tmp_path / "one", {0: ['{"seq":2}'], 1: ['{"seq":5,"tick":1}'],
                                        2: ['{"seq":9}']}, committed=[0, 1])
    assert _committed_seq(str(tmp_path / "one")) == 5  # batch 2: planned, not committed
    assert _committed_seq((tmp_path / "one").as_uri()) == 5  # file: URI
    # another source in the query: its offset is told apart by its shape
    write_checkpoint(tmp_path / "two", {0: ['{"clicks":{"0":17}}', '{"seq":3}', "-"]},
                     committed=[0])
    assert _committed_seq(str(tmp_path / "two")) == 3
    # two sources of this shape, nothing committed, another format, not local: not told
    write_checkpoint(tmp_path / "twins", {0: ['{"seq":3}', '{"seq":3}']}, committed=[0])
    write_checkpoint(tmp_path / "none", {0: ['{"seq":3}']}, committed=[])
    (tmp_path / "v9" / "commits").mkdir(parents=True)
    (tmp_path / "v9" / "commits" / "0").write_text("v9")
    (tmp_path / "v9" / "offsets").mkdir()
    (tmp_path / "v9" / "offsets" / "0").write_text('v9\n{}\n{"seq":3}')
    for unclear in ("twins", "none", "v9", "absent"):
        assert _committed_seq(str(tmp_path / unclear)) is None, unclear
    assert _committed_seq("hdfs://namenode:8020/checkpoints/q") is None


def test_stop_fins_what_the_checkpoint_committed_and_requeues_the_rest(
        nsq: Any, readers: list[NSQAckStreamReader], tmp_path: pathlib.Path) -> None:
    """A clean stop after batch 1's commit log entry, before Spark asked for the next
    offset: Spark never tells the source, the checkpoint does. Batch 2 (planned, not
    committed) goes back to the channel."""
    nsq.create_topic("ack_stop", partitions=1, channels=["spark"])
    sent = [b"s%d" % i for i in range(5)]
    publish(nsq, "ack_stop", sent)
    checkpoint = tmp_path / "checkpoint"
    options = {"lookupd": nsq.lookupd, "topic": "ack_stop", "channel": "spark",
               "maxMessagesPerTrigger": "2", "checkpointLocation": str(checkpoint)}
    reader = ack_reader(readers, **options)
    start = reader.initialOffset()
    reader.latestOffset(start, None)
    wait_for(lambda: len(reader._buffer) + len(reader._numbered) == 5, "5 buffered messages")
    first = reader.latestOffset(start, reader.getDefaultReadLimit())  # batch 0: (0, 2]
    reader.partitions(start, first)
    second = reader.latestOffset(first, reader.getDefaultReadLimit())  # batch 1: (2, 4]
    reader.partitions(first, second)
    third = reader.latestOffset(second, reader.getDefaultReadLimit())  # batch 2: (4, 5]
    reader.partitions(second, third)
    assert (first, second, third) == ({"seq": 2}, {"seq": 4}, {"seq": 5})
    wait_for(lambda: channel_backlog(nsq, "ack_stop", "spark") == 1, "batches 0, 1 FINed")
    # batch 2 ran and was committed; the query stops before the next latestOffset
    write_checkpoint(checkpoint, {0: ['{"seq":2}'], 1: ['{"seq":4}'], 2: ['{"seq":5}']},
                     committed=[0, 1, 2])
    reader.stop()
    wait_for(lambda: channel_backlog(nsq, "ack_stop", "spark") == 0, "batch 2 FINed at stop")

    # the same with batch 2 planned but not committed: it is requeued, not FINed
    publish(nsq, "ack_stop", [b"t0", b"t1", b"t2"])
    checkpoint2 = tmp_path / "checkpoint2"
    again = ack_reader(readers, **{**options, "checkpointLocation": str(checkpoint2)})
    again.latestOffset(third, None)
    wait_for(lambda: len(again._buffer) + len(again._numbered) == 3, "3 buffered messages")
    fourth = again.latestOffset(third, _AllAvailable())
    again.partitions(third, fourth)
    write_checkpoint(checkpoint2, {2: ['{"seq":5}'], 3: [json.dumps(fourth)]}, committed=[2])
    again.stop()
    back = ack_reader(readers, **{**options, "checkpointLocation": ""})
    back.latestOffset(fourth, None)
    wait_for(lambda: len(back._buffer) + len(back._numbered) == 3, "the 3 requeued back")
    assert sorted(bodies_of(back, back.partitions(fourth, back.latestOffset(
        fourth, _AllAvailable())))) == [b"t0", b"t1", b"t2"]


def test_a_checkpoint_of_another_query_fins_nothing(
        nsq: Any, readers: list[NSQAckStreamReader], tmp_path: pathlib.Path) -> None:
    """A reader given a checkpoint whose last committed end is no batch this driver planned
    (another query's, or a stale one) requeues everything: FINing by a foreign commit log
    could lose messages."""
    nsq.create_topic("ack_foreign", partitions=1, channels=["spark"])
    publish(nsq, "ack_foreign", [b"f0", b"f1", b"f2"])
    checkpoint = tmp_path / "foreign"
    write_checkpoint(checkpoint, {7: ['{"seq":2}']}, committed=[7])
    options = {"lookupd": nsq.lookupd, "topic": "ack_foreign", "channel": "spark",
               "checkpointLocation": str(checkpoint)}
    reader = ack_reader(readers, **options)
    reader.latestOffset({"seq": 0}, None)
    wait_for(lambda: len(reader._buffer) + len(reader._numbered) == 3, "3 buffered messages")
    planned = reader.latestOffset({"seq": 0}, _AllAvailable())
    reader.partitions({"seq": 0}, planned)
    assert planned == {"seq": 3}
    reader.stop()
    back = ack_reader(readers, **{**options, "checkpointLocation": ""})
    back.latestOffset(None, None)
    wait_for(lambda: len(back._buffer) + len(back._numbered) == 3, "the 3 requeued back")


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
