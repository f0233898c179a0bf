"""The replay source's driver side, planned and read without a SparkSession.

What a Spark query relies on, driven directly on the reader objects against the shared dev
cluster: initial and latest offsets (``earliest``/``latest``/explicit, limits shared by
backlog), the ranges planned for a batch (a partition added since the start offsets, data
removed by retention, ``minPartitions``, ordered ranges read over several channels in
queue order), the checks of offsets given by the user, the stream's wait for a partition
whose leader is missing or behind (and its failure past ``leaderTimeout``), lag metrics,
``commitChannel`` moving a real channel's cursor, and what travels to the executors.
"""

from __future__ import annotations

import itertools
import json
import pickle
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from smartnsq import sync
from smartnsq.errors import ClusterError, DataLoss, InvalidArgument, PartitionUnavailable
from smartnsq.spark import availability
from smartnsq.spark.offsets import parse_offsets
from smartnsq.spark.options import SourceOptions
from smartnsq.spark.source import NSQBatchReader, NSQRangePartition, NSQStreamReader, _read

pytestmark = pytest.mark.spark


def publish(nsq: Any, topic: str, count: int, partition: int = 0, prefix: str = "m") \
        -> list[bytes]:
    bodies = [f"{prefix}{i}".encode() for i in range(count)]
    with sync.Producer(lookupd=nsq.lookupd.split(",")) as producer:
        for start in range(0, count, 200):
            producer.publish_many(topic, bodies[start:start + 200], partition=partition)
    return bodies


def rows_of(options: SourceOptions, parts: Any) -> list[dict[str, Any]]:
    return [row for part in parts for batch in _read(options, part)
            for row in batch.to_pylist()]


def source(nsq: Any, topic: str, streaming: bool = True, **options: str) -> SourceOptions:
    return SourceOptions.parse({"lookupd": nsq.lookupd, "topic": topic, **options},
                               streaming=streaming)


@pytest.fixture
def stream_reader() -> Iterator[list[NSQStreamReader]]:
    """Stream readers the test builds, stopped after it (their HTTP clients)."""
    readers: list[NSQStreamReader] = []
    yield readers
    for reader in readers:
        reader.stop()


def stream(readers: list[NSQStreamReader], options: SourceOptions) -> NSQStreamReader:
    reader = NSQStreamReader(options)
    readers.append(reader)
    return reader


# -- bounded reads --------------------------------------------------------------------------------

def test_a_bounded_read_plans_one_range_per_partition_and_reads_it_all(nsq: Any) -> None:
    nsq.create_topic("plan_bounded", partitions=2)
    zero = publish(nsq, "plan_bounded", 5, partition=0, prefix="a")
    one = publish(nsq, "plan_bounded", 3, partition=1, prefix="b")
    options = source(nsq, "plan_bounded", streaming=False)
    reader = NSQBatchReader(options)
    parts = reader.partitions()
    assert [(p.topic, p.partition, p.start) for p in parts] == \
        [("plan_bounded", 0, 0), ("plan_bounded", 1, 0)]
    assert all(isinstance(p, NSQRangePartition) and p.end > p.start for p in parts)
    rows = [row for part in parts for batch in reader.read(part) for row in batch.to_pylist()]
    assert [r["body"] for r in rows if r["partition"] == 0] == zero
    assert [r["body"] for r in rows if r["partition"] == 1] == one


def test_user_offsets_are_checked_against_the_queues(nsq: Any) -> None:
    nsq.create_topic("plan_checked", partitions=1)
    publish(nsq, "plan_checked", 4)
    end = NSQBatchReader(source(nsq, "plan_checked", streaming=False)).partitions()[0].end

    def plan(**options: str) -> Any:
        return NSQBatchReader(source(nsq, "plan_checked", streaming=False,
                                     **options)).partitions()

    with pytest.raises(InvalidArgument, match="outside the queue") as outside:
        plan(startingOffsets=json.dumps({"plan_checked": {"0": end + 1000}}))
    assert outside.value.field == "startingOffsets"
    with pytest.raises(InvalidArgument, match="has no partition") as unknown:
        plan(startingOffsets='{"plan_checked": {"7": 0}}')
    assert unknown.value.field == "startingOffsets"
    with pytest.raises(InvalidArgument, match="before its start") as backwards:
        plan(startingOffsets=json.dumps({"plan_checked": {"0": end}}),
             endingOffsets='{"plan_checked": {"0": 0}}')
    assert backwards.value.field == "endingOffsets"
    # an explicit end for the one partition: exactly that range; nothing at start == end
    (part,) = plan(endingOffsets=json.dumps({"plan_checked": {"0": end}}))
    assert (part.start, part.end) == (0, end)
    assert plan(startingOffsets="latest") == []


def test_a_partitions_option_naming_a_missing_partition_is_refused(nsq: Any) -> None:
    nsq.create_topic("plan_chosen", partitions=1)
    reader = NSQBatchReader(source(nsq, "plan_chosen", streaming=False, partitions="0,3"))
    with pytest.raises(InvalidArgument, match="has no partition") as chosen:
        reader.partitions()
    assert chosen.value.field == "partitions"


def test_min_partitions_cuts_a_range_at_message_boundaries(nsq: Any) -> None:
    nsq.create_topic("plan_split", partitions=1)
    bodies = publish(nsq, "plan_split", 120)
    options = source(nsq, "plan_split", streaming=False, minPartitions="4")
    parts = NSQBatchReader(options).partitions()
    assert len(parts) == 4
    assert [p.start for p in parts[1:]] == [p.end for p in parts[:-1]]  # no gap, no overlap
    rows = rows_of(options, parts)
    assert [r["body"] for r in rows] == bodies
    assert {r["queue_offset"] for r in rows} >= {p.start for p in parts}  # cut at a message


def test_an_ordered_range_is_read_over_several_channels_in_queue_order(nsq: Any) -> None:
    nsq.create_topic("plan_ordered", partitions=1, ordered=True)
    bodies = publish(nsq, "plan_ordered", 600)
    options = source(nsq, "plan_ordered", streaming=False, orderedReadChannels="2")
    (part,) = NSQBatchReader(options).partitions()
    assert part.ordered and len(part.splits) == 1 and part.start < part.splits[0] < part.end
    rows = rows_of(options, [part])
    assert [r["body"] for r in rows] == bodies
    offsets = [r["queue_offset"] for r in rows]
    assert offsets == sorted(offsets) and len(set(offsets)) == 600


# -- streams ---------------------------------------------------------------------------------------

def test_a_stream_plans_limited_batches_and_reports_its_lag(
        nsq: Any, stream_reader: list[NSQStreamReader]) -> None:
    nsq.create_topic("plan_stream", partitions=2)
    publish(nsq, "plan_stream", 30, partition=0)
    publish(nsq, "plan_stream", 10, partition=1)
    options = source(nsq, "plan_stream", startingOffsets="earliest",
                     maxMessagesPerTrigger="8")
    reader = stream(stream_reader, options)
    start = reader.initialOffset()
    assert start == {"plan_stream": {"0": 0, "1": 0}}
    end = reader.latestOffset()  # from the last end Spark saw: the initial offsets
    latest = reader.reportLatestOffset()
    assert latest is not None and all(latest["plan_stream"][p] > 0 for p in ("0", "1"))
    parts = reader.partitions(start, end)
    rows = rows_of(options, parts)
    by_partition = {p: [r for r in rows if r["partition"] == p] for p in (0, 1)}
    assert len(rows) == 8  # the limit, shared by backlog
    assert len(by_partition[0]) > len(by_partition[1]) >= 1
    metrics = reader.metrics()
    gaps = [latest["plan_stream"][p] - end["plan_stream"][p] for p in ("0", "1")]
    assert metrics["offsetsBehindLatest"]["plan_stream"] == dict(zip(("0", "1"), gaps, strict=True))
    assert metrics["maxOffsetsBehindLatest"] == str(max(gaps))
    assert metrics["partitionsWithoutLeader"] == []
    assert reader.metrics(latest)["maxOffsetsBehindLatest"] == "0"


def test_available_now_stops_at_the_ends_seen_when_it_began(
        nsq: Any, stream_reader: list[NSQStreamReader]) -> None:
    nsq.create_topic("plan_now", partitions=1)
    publish(nsq, "plan_now", 5)
    reader = stream(stream_reader, source(nsq, "plan_now", startingOffsets="earliest"))
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    first_end = reader.latestOffset(start, None)
    publish(nsq, "plan_now", 5, prefix="late")
    assert reader.latestOffset(start, None) == first_end
    fresh = stream(stream_reader, source(nsq, "plan_now"))
    assert fresh.latestOffset(start, None)["plan_now"]["0"] > first_end["plan_now"]["0"]


def test_a_partition_added_after_the_start_offsets_is_read_from_its_beginning(
        nsq: Any, stream_reader: list[NSQStreamReader]) -> None:
    nsq.create_topic("plan_added", partitions=2)
    publish(nsq, "plan_added", 3, partition=0, prefix="a")
    later = publish(nsq, "plan_added", 2, partition=1, prefix="b")
    options = source(nsq, "plan_added", startingOffsets="earliest")
    reader = stream(stream_reader, options)
    end = reader.latestOffset({"plan_added": {"0": 0}})
    parts = reader.partitions({"plan_added": {"0": 0}}, end)
    assert [(p.partition, p.start) for p in parts] == [(0, 0), (1, 0)]
    assert [r["body"] for r in rows_of(options, parts) if r["partition"] == 1] == later


@pytest.mark.parametrize("fail", [True, False])
def test_a_planned_start_that_retention_removed(
        nsq: Any, stream_reader: list[NSQStreamReader], fail: bool) -> None:
    topic = f"plan_retained_{str(fail).lower()}"
    nsq.create_topic(topic, partitions=1)
    publish(nsq, topic, 4)
    reader = stream(stream_reader, source(nsq, topic, failOnDataLoss=str(fail).lower()))
    end = reader.latestOffset({topic: {"0": 0}})
    stop = end[topic]["0"]
    first = stop // 2  # as a refresh would see it once retention removed the first half
    reader.planner.bounds[topic][0] = (first, stop)
    if fail:
        with pytest.raises(DataLoss, match=f"{topic}/0: offsets 0\\.\\."):
            reader.partitions({topic: {"0": 0}}, end)
    else:
        (part,) = reader.partitions({topic: {"0": 0}}, end)
        assert (part.start, part.end) == (first, stop)


def test_a_leader_behind_the_offsets_read_is_waited_for(
        nsq: Any, stream_reader: list[NSQStreamReader]) -> None:
    """Never go back: an end before what was read keeps the offset read, the partition is
    reported without a usable leader, and past ``leaderTimeout`` the query fails."""
    nsq.create_topic("plan_behind", partitions=1)
    publish(nsq, "plan_behind", 2)
    reader = stream(stream_reader, source(nsq, "plan_behind", leaderTimeout="30"))
    ahead = {"plan_behind": {"0": 10_000_000}}
    assert reader.latestOffset(ahead, None) == ahead
    assert reader.metrics()["partitionsWithoutLeader"] == ["plan_behind/0"]
    assert "queue ends at" in reader.planner.down[("plan_behind", 0)]
    reader._down_since[("plan_behind", 0)] -= 31  # as if down since more than the timeout
    with pytest.raises(PartitionUnavailable, match="plan_behind"):
        reader.latestOffset(ahead, None)
    start = {"plan_behind": {"0": 0}}
    assert reader.latestOffset(start, None)["plan_behind"]["0"] > 0  # caught up: fine again
    assert reader.metrics()["partitionsWithoutLeader"] == []


def test_no_lookupd_answering_keeps_every_offset(
        nsq: Any, stream_reader: list[NSQStreamReader],
        monkeypatch: pytest.MonkeyPatch) -> None:
    nsq.create_topic("plan_dark", partitions=2)
    publish(nsq, "plan_dark", 2)
    reader = stream(stream_reader, source(nsq, "plan_dark"))
    start = reader.initialOffset()
    client = reader.planner.client

    def unreachable(topic: str) -> Any:
        raise ClusterError("no lookupd answers", transient=True)

    monkeypatch.setattr(client, "layout", unreachable)
    assert reader.latestOffset(start, None) == start
    assert reader.metrics()["partitionsWithoutLeader"] == ["plan_dark/0", "plan_dark/1"]

    def broken(topic: str) -> Any:
        raise ClusterError("lookupd refuses the topic name")

    monkeypatch.setattr(client, "layout", broken)
    with pytest.raises(ClusterError, match="refuses"):
        reader.latestOffset(start, None)


def test_initial_offsets_wait_only_for_a_condition_that_can_pass(
        nsq: Any, stream_reader: list[NSQStreamReader],
        monkeypatch: pytest.MonkeyPatch) -> None:
    reader = stream(stream_reader, source(nsq, "plan_never_made", leaderTimeout="0.05"))

    def refused(topic: str) -> Any:
        raise ClusterError("no leader in lookup", transient=True)

    monkeypatch.setattr(reader.planner.client, "layout", refused)
    with pytest.raises(PartitionUnavailable, match="plan_never_made"):
        reader.initialOffset()


CONSUME_DISABLED = "ErrType:7 ErrCode:0 : Consume is disabled currently"  # the real nsqd's


def _refusing(address: str) -> ClusterError:
    """What ``ClusterClient.set_offset`` raises for the real nsqd's refusal of consumption."""
    from smartnsq.errors import AdminError

    refusal = AdminError(500, CONSUME_DISABLED, what="nsqd /channel/setoffset", address=address)
    try:
        raise ClusterError(f"set channel c of t/0 to virtual_queue:0 on {address}: {refusal}",
                           transient=True) from refusal
    except ClusterError as exc:
        return exc


def test_a_partition_whose_leader_refuses_reads_is_not_planned(
        nsq: Any, stream_reader: list[NSQStreamReader],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """youzan's "Consume is disabled currently" (a new leader, a changing replica set): its
    offset stays where it was, the other partition is read, and the condition says what the
    server answered; past leaderTimeout the query fails naming it."""
    nsq.create_topic("plan_no_reads", partitions=2)
    publish(nsq, "plan_no_reads", 3, partition=0)
    publish(nsq, "plan_no_reads", 3, partition=1)
    reader = stream(stream_reader, source(nsq, "plan_no_reads", startingOffsets="earliest",
                                          leaderTimeout="30"))
    start = reader.initialOffset()
    asked: list[int] = []

    def check(client: Any, topic: str, partition: int, leader: Any, offset: int,
              prefix: str) -> None:
        asked.append(partition)
        if partition == 0:
            raise _refusing(leader.http_address)

    monkeypatch.setattr(availability, "check_consumable", check)
    end = reader.latestOffset(start, None)
    assert end["plan_no_reads"]["0"] == 0 and end["plan_no_reads"]["1"] > 0
    assert sorted(asked) == [0, 1]
    condition = reader.planner.down[("plan_no_reads", 0)]
    assert condition.startswith("consumption disabled on its leader (nsqd 127.0.0.1:")
    assert "answered /channel/setoffset with HTTP 500: ErrType:7 ErrCode:0 : Consume is " \
        "disabled currently)" in condition, condition
    assert reader.metrics()["partitionsWithoutLeader"] == ["plan_no_reads/0"]
    assert [(p.partition, p.start) for p in reader.partitions(start, end)] == [(1, 0)]
    reader._down_since[("plan_no_reads", 0)] -= 31
    with pytest.raises(PartitionUnavailable, match="consumption disabled on its leader"):
        reader.latestOffset(end, None)
    monkeypatch.setattr(availability, "check_consumable", lambda *args: None)
    again = reader.latestOffset(end, None)
    assert again["plan_no_reads"]["0"] > 0  # served again: planned
    reader.planner.gate.unsettled["plan_no_reads"] = 0.0  # settled: nobody is asked now
    monkeypatch.setattr(availability, "check_consumable", check)
    asked.clear()
    publish(nsq, "plan_no_reads", 1, partition=0)
    assert reader.latestOffset(again, None)["plan_no_reads"]["0"] > again["plan_no_reads"]["0"]
    assert asked == []


@pytest.mark.parametrize("spec", ["earliest", "latest"])
def test_a_stream_starts_without_a_partition_that_has_no_leader(
        nsq: Any, stream_reader: list[NSQStreamReader], monkeypatch: pytest.MonkeyPatch,
        spec: str) -> None:
    """Started (or started again without a checkpoint) during a leader loss, the stream
    does not wait for the partition: it keeps Kafka's -2/-1 for it, reads the others, and
    takes the partition's earliest or latest offset once it is led again."""
    from smartnsq.spark.cluster import TopicLayout

    topic = f"plan_start_down_{spec}"
    nsq.create_topic(topic, partitions=2)
    publish(nsq, topic, 3, partition=0)
    publish(nsq, topic, 2, partition=1)
    reader = stream(stream_reader, source(nsq, topic, startingOffsets=spec))
    client = reader.planner.client
    real_layout = client.layout

    def without_zero(name: str) -> TopicLayout:
        layout = real_layout(name)
        return TopicLayout(layout.topic, layout.ordered, layout.ext,
                           {p: n for p, n in layout.leaders.items() if p != 0},
                           layout.partitions)

    monkeypatch.setattr(client, "layout", without_zero)
    start = reader.initialOffset()
    assert start[topic]["0"] == (-2 if spec == "earliest" else -1)
    one = start[topic]["1"]
    publish(nsq, topic, 2, partition=1, prefix="n")
    end = reader.latestOffset(start, None)
    assert end[topic]["0"] == start[topic]["0"]  # kept while down
    assert [(p.partition, p.start) for p in reader.partitions(start, end)] == [(1, one)]
    monkeypatch.setattr(client, "layout", real_layout)
    back = reader.latestOffset(end, None)
    zero_end = reader.planner.bounds[topic][0][1]
    assert back[topic]["0"] == (0 if spec == "earliest" else zero_end)
    assert all(p.partition != 0 for p in reader.partitions(end, back))  # resolved, not read
    publish(nsq, topic, 1, partition=0, prefix="z")
    later = reader.latestOffset(back, None)
    (zero,) = [p for p in reader.partitions(back, later) if p.partition == 0]
    assert zero.start == back[topic]["0"] and zero.end > zero.start
    assert reader.metrics()["partitionsWithoutLeader"] == []


def test_a_timed_start_still_waits_for_every_leader(
        nsq: Any, stream_reader: list[NSQStreamReader],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A time needs a search on each leader: that start waits (up to leaderTimeout)."""
    from smartnsq.spark.cluster import TopicLayout

    nsq.create_topic("plan_start_timed", partitions=2)
    reader = stream(stream_reader, source(nsq, "plan_start_timed", leaderTimeout="0.05",
                                          startingOffsets="timestamp:1700000000"))
    client = reader.planner.client
    real_layout = client.layout
    monkeypatch.setattr(client, "layout", lambda name: TopicLayout(
        name, False, False, {1: real_layout(name).leaders[1]}, (0, 1)))
    with pytest.raises(PartitionUnavailable, match="plan_start_timed/0"):
        reader.initialOffset()


def test_commit_moves_the_commit_channel_to_the_batch_end(
        nsq: Any, stream_reader: list[NSQStreamReader]) -> None:
    nsq.create_topic("plan_commit", partitions=1, channels=["audit"])
    publish(nsq, "plan_commit", 6)
    reader = stream(stream_reader, source(nsq, "plan_commit", startingOffsets="earliest",
                                          commitChannel="audit"))
    start = reader.initialOffset()
    planner = reader.planner
    leader = planner.layout("plan_commit").leaders[0]
    deadline = time.monotonic() + 10
    while planner.client.channel_depth("plan_commit", 0, leader, "audit") < 6:
        assert time.monotonic() < deadline, "the channel never saw the messages"
    end = reader.latestOffset(start, None)
    reader.commit(end)
    assert planner.client.channel_depth("plan_commit", 0, leader, "audit") == 0
    stream(stream_reader, source(nsq, "plan_commit")).commit(end)  # no commitChannel: no-op


def test_what_travels_to_the_executors_is_the_options_only(
        nsq: Any, stream_reader: list[NSQStreamReader]) -> None:
    nsq.create_topic("plan_pickle", partitions=1)
    options = source(nsq, "plan_pickle")
    reader = stream(stream_reader, options)
    reader.initialOffset()
    copy = pickle.loads(pickle.dumps(reader))
    stream_reader.append(copy)
    assert copy._options == options and copy._planner is None and copy._last_end is None
    part = NSQRangePartition("plan_pickle", 0, 0, 10, None, False, False, (5,))
    assert pickle.loads(pickle.dumps(part)) == part
    assert parse_offsets("latest", "startingOffsets", "earliest") == "latest"


# -- Kafka's names -------------------------------------------------------------------------------

def test_kafkas_minus_two_and_minus_one_are_earliest_and_latest(nsq: Any) -> None:
    nsq.create_topic("plan_kafka_json", partitions=2)
    first = publish(nsq, "plan_kafka_json", 4, partition=0)
    publish(nsq, "plan_kafka_json", 3, partition=1)
    options = source(nsq, "plan_kafka_json", streaming=False,
                     startingOffsets='{"plan_kafka_json": {"0": -2, "1": -1}}',
                     endingOffsets='{"plan_kafka_json": {"0": -1}}')
    rows = rows_of(options, NSQBatchReader(options).partitions())
    assert [(r["partition"], r["body"]) for r in rows] == [(0, b) for b in first]


def test_kafka_millisecond_timestamps_select_within_the_second(nsq: Any) -> None:
    nsq.create_topic("plan_kafka_ms", partitions=1)
    with sync.Producer(lookupd=nsq.lookupd.split(",")) as producer:
        for i in range(60):
            producer.publish("plan_kafka_ms", b"t%d" % i, partition=0)
            time.sleep(0.025)
    every = rows_of(source(nsq, "plan_kafka_ms", streaming=False),
                    NSQBatchReader(source(nsq, "plan_kafka_ms", streaming=False)).partitions())

    def ms(row: dict[str, Any]) -> int:
        return int(row["timestamp"].timestamp() * 1_000_000) // 1000

    # a message with an earlier one in its second: a search by seconds alone would take that
    pick = next(r for prev, r in itertools.pairwise(every)
                if ms(prev) // 1000 == ms(r) // 1000 and ms(prev) < ms(r))
    options = source(nsq, "plan_kafka_ms", streaming=False, startingTimestamp=str(ms(pick)),
                     endingOffsetsByTimestamp=json.dumps({"plan_kafka_ms": {
                         "0": ms(every[-5])}}))
    rows = rows_of(options, NSQBatchReader(options).partitions())
    expected = [r["body"] for r in every if ms(pick) <= ms(r) < ms(every[-5])]
    assert [r["body"] for r in rows] == expected and expected[0] == pick["body"]


def test_a_pattern_stream_reads_topics_that_appear_later_from_their_start(
        nsq: Any, stream_reader: list[NSQStreamReader], monkeypatch: pytest.MonkeyPatch) -> None:
    from smartnsq.spark import topics as topics_module

    monkeypatch.setattr(topics_module, "RELIST_INTERVAL", 0.0)
    nsq.create_topic("plan_pat_one", partitions=1)
    nsq.create_topic("plan_other", partitions=1)
    publish(nsq, "plan_pat_one", 2)
    publish(nsq, "plan_other", 2)
    options = SourceOptions.parse({"lookupd": nsq.lookupd, "subscribePattern": r"plan_pat_.*",
                                   "startingOffsets": "earliest"}, streaming=True)
    reader = stream(stream_reader, options)
    start = reader.initialOffset()
    assert set(start) == {"plan_pat_one"}
    nsq.create_topic("plan_pat_two", partitions=2)
    later = publish(nsq, "plan_pat_two", 3, partition=1, prefix="late")
    end = reader.latestOffset(start)
    assert set(end) == {"plan_pat_one", "plan_pat_two"}
    parts = reader.partitions(start, end)
    assert [r["body"] for r in rows_of(options, parts) if r["topic"] == "plan_pat_two"] == later
    nothing = SourceOptions.parse({"lookupd": nsq.lookupd, "subscribePattern": "plan_none_.*"},
                                  streaming=False)
    assert list(NSQBatchReader(nothing).partitions()) == []


def test_min_offsets_per_trigger_waits_for_messages_or_the_delay(
        nsq: Any, stream_reader: list[NSQStreamReader]) -> None:
    nsq.create_topic("plan_min", partitions=2)
    options = source(nsq, "plan_min", startingOffsets="earliest", minOffsetsPerTrigger="10",
                     maxTriggerDelay="1500ms")
    reader = stream(stream_reader, options)
    start = reader.initialOffset()
    publish(nsq, "plan_min", 3, partition=0)
    publish(nsq, "plan_min", 2, partition=1)
    assert reader.latestOffset(start) == start  # 5 < 10 and the delay has not passed
    time.sleep(1.6)
    end = reader.latestOffset(start)  # the delay passed: what there is
    assert end != start and len(rows_of(options, reader.partitions(start, end))) == 5
    publish(nsq, "plan_min", 4, partition=1)
    assert reader.latestOffset(end) == end  # the delay counts from the last batch
    publish(nsq, "plan_min", 6, partition=0)
    assert len(rows_of(options, reader.partitions(end, reader.latestOffset(end)))) == 10
