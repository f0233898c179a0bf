"""``Consumer.stats()`` and ``Consumer.lag()``: the typed snapshot built from the runtime's
counters (``smartnsq.observability.stats``), the live subscriptions and the flow control, and the
channel's backlog read from the nodes (through ``smartnsq.admin``).

Nothing here runs per message: the links count (``link.py``), this reads.
"""

from __future__ import annotations

import time
from typing import Any

from ..model.routes import address_text
from ..observability.counters import TIMED_OUT_CODES
from ..observability.stats import (
    ChannelLag,
    ConsumerPartitionStats,
    ConsumerStats,
    LookupStats,
    SubscriptionStats,
    latency_summary,
)
from .runtime import Runtime
from .subscription import Subscriptions

__all__ = ["lag_nodes", "read_lag", "snapshot"]


def snapshot(rt: Runtime, subs: Subscriptions | None, lookup: Any, max_in_flight: int,
             lag: ChannelLag | None) -> ConsumerStats:
    """The consumer's :class:`~smartnsq.observability.stats.ConsumerStats` now."""
    meter = rt.meter
    flow = rt.flow
    ctl = flow.ctl if flow is not None else None
    now = rt.loop.time() if rt.loop is not None else 0.0
    consumer_backoff = str(ctl.backoff.state) if ctl is not None else "normal"
    # each subscription now, and the gauges of the live ones summed per partition
    subscriptions = []
    gauges: dict[int | None, dict[str, Any]] = {}
    for sub in list(subs.subs.values()) if subs is not None else ():
        partition = sub.target.partition
        node = address_text(sub.target.address)
        last_error = None if sub.last_error is None else str(sub.last_error)
        g = gauges.setdefault(partition, {
            "node": None, "connected": False, "ordered": None, "in_flight": 0, "rdy": 0,
            "backoff": consumer_backoff, "last_error": None})
        g["node"] = node
        if last_error is not None:
            g["last_error"] = last_error
        link = sub.link
        if link is None or not link.alive:
            subscriptions.append(SubscriptionStats(node, partition, failures=sub.failures,
                                                   last_error=last_error))
            continue
        subscriptions.append(SubscriptionStats(
            node, partition, connected=True, ordered=link.ordered, in_flight=link.in_flight,
            rdy=link.rdy, failures=sub.failures, last_error=last_error))
        g["connected"] = True
        g["ordered"] = link.ordered
        g["in_flight"] += link.in_flight
        g["rdy"] += link.rdy
        if ctl is not None:
            state = ctl.backoff_state(link, now)
            if state is not None:
                g["backoff"] = state
    parts = []
    errors: dict[str, int] = {}
    timed_out = lost = duplicates = subscribe_failures = 0
    for partition, counts in sorted(list(meter.parts.items()),
                                    key=lambda i: -1 if i[0] is None else i[0]):
        g = gauges.pop(partition, {})
        in_flight = g.get("in_flight", 0)
        part_errors = dict(counts.errors)
        part_timed_out = sum(n for code, n in part_errors.items() if code in TIMED_OUT_CODES)
        for code, n in part_errors.items():
            errors[code] = errors.get(code, 0) + n
        timed_out += part_timed_out
        lost += counts.lost
        duplicates += counts.duplicates
        subscribe_failures += counts.subscribe_failures
        parts.append(ConsumerPartitionStats(
            partition, node=g.get("node") or counts.node, connected=g.get("connected", False),
            ordered=g.get("ordered"), received=counts.received,
            finished=max(0, counts.received - counts.requeued - counts.lost - in_flight),
            requeued=counts.requeued, timed_out=part_timed_out,
            duplicates_dropped=counts.duplicates, lost=counts.lost, server_errors=part_errors,
            in_flight=in_flight, rdy=g.get("rdy", 0),
            backoff=g.get("backoff", consumer_backoff),
            subscribe_failures=counts.subscribe_failures,
            leader_changes=counts.leader_changes, last_error=g.get("last_error")))
    for partition, g in gauges.items():  # subscribed, nothing counted yet
        parts.append(ConsumerPartitionStats(
            partition, g["node"], g["connected"], g["ordered"], in_flight=g["in_flight"],
            rdy=g["rdy"], backoff=g["backoff"], last_error=g["last_error"]))
    parts.sort(key=lambda p: -1 if p.partition is None else p.partition)
    subscriptions.sort(key=lambda s: (-1 if s.partition is None else s.partition, s.node))
    return ConsumerStats(
        at=time.time(), topic=rt.topic, channel=rt.channel,
        connections=len(subs.links()) if subs is not None else 0,
        received=rt.received, finished=rt.finished, requeued=rt.requeued, handled=rt.handled,
        handler_errors=rt.handler_errors, give_ups=rt.give_ups, undecodable=rt.undecodable,
        timed_out=timed_out,
        duplicates_dropped=duplicates, discarded=rt.discarded, lost=lost,
        lost_answers=rt.lost_answers, order_errors=rt.order_errors, server_errors=errors,
        subscribe_failures=subscribe_failures, leader_changes=meter.leader_changes,
        in_flight=rt.in_flight, queued=len(rt.queue) if rt.queue is not None else 0,
        max_in_flight=max_in_flight, rdy=sum(p.rdy for p in parts),
        backoff=consumer_backoff, starved=flow is not None and flow.is_starved(),
        handler_seconds=latency_summary(meter.handler), partitions=tuple(parts),
        subscriptions=tuple(subscriptions), lookup=LookupStats.of(lookup), lag=lag,
        dead_lettered=rt.dead_letters.parked if rt.dead_letters is not None else 0)


def lag_nodes(subs: Subscriptions | None) -> list[tuple[int | None, str]]:
    """``(partition, nsqd HTTP address)`` of every place the consumer reads: the lookup's
    HTTP address where known, else the TCP port + 1 (nsqd's default layout)."""
    out: list[tuple[int | None, str]] = []
    for sub in list(subs.subs.values()) if subs is not None else ():
        target = sub.target
        host, port = target.address
        out.append((target.partition, target.http or f"{host}:{port + 1}"))
    return out


async def read_lag(topic: str, channel: str, nodes: list[tuple[int | None, str]],
                   timeout: float) -> ChannelLag:
    """The channel's backlog on ``nodes`` (see :meth:`smartnsq.admin.AsyncAdmin.channel_lag`)."""
    from ..admin import AsyncAdmin  # HTTP code only for consumers that ask

    if not nodes:
        return ChannelLag(topic, channel, time.time())
    async with AsyncAdmin(timeout=timeout) as admin:
        return await admin.channel_lag(topic, channel, nodes=nodes)
