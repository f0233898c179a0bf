"""The pure parts of ``smartnsq.observability.stats``: histograms, summaries, the meters'
bookkeeping."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from smartnsq.errors import ServerError
from smartnsq.observability.counters import (
    LATENCY_BOUNDS,
    PUBLISH_SAMPLE,
    ConsumeMeter,
    Histogram,
    PublishMeter,
    reason_of,
)
from smartnsq.observability.stats import (
    ConsumerStats,
    LatencySummary,
    ProducerStats,
    latency_summary,
)


def test_histogram_buckets_are_upper_bounds_inclusive() -> None:
    h = Histogram()
    for seconds in (0.0001, 0.00011, 0.003, 20.0):
        h.observe(seconds)
    s = latency_summary(h)
    assert s.count == 4 and s.max == 20.0 and s.sum == pytest.approx(20.00321)
    assert s.buckets[0] == 1 and s.buckets[1] == 1 and s.buckets[-1] == 1
    assert s.cumulative()[-1] == (float("inf"), 4)
    assert s.quantile(0.5) == LATENCY_BOUNDS[1]
    assert s.quantile(1.0) == 20.0  # the last bucket: max
    assert LatencySummary().quantile(0.5) is None and LatencySummary().mean is None
    both = s + s
    assert both.count == 8 and both.max == 20.0


def test_publish_meter_counts_per_partition_and_reason() -> None:
    meter = PublishMeter()
    meter.ok("t", 0, 1, 1.0, lambda: 1.002)  # (start, clock): 2 ms
    meter.ok("t", 0, 100, 1.0, lambda: 1.004)
    meter.ok("t", None, 1, 1.0, lambda: 1.001)
    meter.retried("t", 0, ServerError("E_FAILED_ON_NOT_LEADER", "moved"))
    meter.failed("t", 1, TimeoutError())
    stats = ProducerStats.build(meter, leaders={("t", 0): "a:1"}, connections=2, on_wire=0,
                                leader_changes=1, lookup=None, at=5.0)
    assert stats.published == 102 and stats.publish_seconds.count == 3
    assert stats.retried == {"E_FAILED_ON_NOT_LEADER": 1}
    assert stats.failed == {"TimeoutError": 1}
    assert [(p.topic, p.partition) for p in stats.partitions] == [("t", None), ("t", 0),
                                                                   ("t", 1)]
    p0 = stats.partition("t", 0)
    assert p0 is not None and p0.leader == "a:1" and p0.published == 101
    with pytest.raises(dataclasses.FrozenInstanceError):
        p0.published = 0  # type: ignore[misc]


def test_publish_latency_is_sampled_after_the_first_calls_and_counts_stay_exact() -> None:
    meter = PublishMeter()
    reads = 0

    def clock() -> float:
        nonlocal reads
        reads += 1
        return 2.0

    calls = 4 * PUBLISH_SAMPLE
    for _ in range(calls):
        meter.ok("t", 0, 2, 1.0, clock)
    meter.ok("t", 1, 1, 1.5, clock)  # another partition: measured from its first call
    # every call of the first PUBLISH_SAMPLE, then one in PUBLISH_SAMPLE: the clock is read
    # on those only
    timed = PUBLISH_SAMPLE + (calls - PUBLISH_SAMPLE) // PUBLISH_SAMPLE
    assert reads == timed + 1
    stats = ProducerStats.build(meter, leaders={}, connections=1, on_wire=0,
                                leader_changes=0, lookup=None, at=1.0)
    p0, p1 = stats.partition("t", 0), stats.partition("t", 1)
    assert p0 is not None and p1 is not None
    assert p0.published == 2 * calls and stats.published == 2 * calls + 1
    assert p0.publish_seconds.count == timed and p0.publish_seconds.sum == pytest.approx(timed)
    assert p1.publish_seconds.count == 1 and p1.publish_seconds.max == 0.5


def test_reason_of() -> None:
    assert reason_of(ServerError("E_BAD_TOPIC", "no")) == "E_BAD_TOPIC"
    assert reason_of(ValueError()) == "ValueError"
    assert reason_of(None) == "unknown"


def test_consume_meter_counts_leader_moves() -> None:
    @dataclasses.dataclass
    class Target:
        address: tuple[str, int]
        partition: int | None

    meter = ConsumeMeter()
    meter.targets([Target(("a", 1), 0), Target(("b", 1), 1), Target(("c", 1), None)])
    meter.targets([Target(("b", 1), 0), Target(("b", 1), 1)])
    assert meter.leader_changes == 1
    assert meter.partition(0).leader_changes == 1 and meter.partition(0).node == "b:1"
    assert meter.timed(lambda m: m * 2, 21) == 42
    assert latency_summary(meter.handler).count == 1


def test_consumer_stats_is_a_plain_frozen_value() -> None:
    fields: dict[str, Any] = {f.name: 0 for f in dataclasses.fields(ConsumerStats)}
    fields.update(topic="t", channel="c", server_errors={}, backoff="normal", starved=False,
                  handler_seconds=LatencySummary(), partitions=(), subscriptions=(),
                  lookup=None, lag=None, at=1.0)
    stats = ConsumerStats(**fields)
    assert not isinstance(stats, dict) and not hasattr(stats, "as_dict")
    assert stats.topic == "t" and stats.partition(0) is None and stats.subscriptions == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.finished = 1  # type: ignore[misc]
    assert "stale_dropped" not in {f.name for f in dataclasses.fields(ConsumerStats)}
