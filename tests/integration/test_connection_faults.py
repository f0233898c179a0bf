"""Connection under faults: late answers, stalls and hostile nsqds.

The dev cluster's proxy stalls and resumes a real nsqd; ``smartnsq.testing.hostile`` gives
the peers no real server would be (unasked deflate, a deflate bomb, half a frame, silence).
Each public call runs under ``bounded``: it must end within its timeout + 1 s.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest
from support import bounded

from smartnsq.config import ConnectionConfig
from smartnsq.errors import ConnectionClosed, ProtocolError, Timeout
from smartnsq.protocol import commands
from smartnsq.testing.hostile import DeflatingNsqd, LateNsqd, SilentNsqd, StallingNsqd
from smartnsq.transport.connection import Connection

WAIT = 10.0


def address(cluster: Any, index: int = 0) -> tuple[str, int]:
    host, port = cluster.nsqd_tcp_addresses[index].rsplit(":", 1)
    return host, int(port)


def stored(cluster: Any, topic: str, partition: int = 0) -> list[bytes]:
    return [m.body for m in cluster.state.topics[topic].partitions[partition].log.messages]


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, proxied=True)
async def test_a_timed_out_request_keeps_a_healthy_connection(nsq_cluster: Any) -> None:
    # before: "PUB timed out after 0.2s; closing" - the connection was dropped
    await nsq_cluster.create_topic("t_late")
    conn = await Connection.connect(*address(nsq_cluster))
    try:
        nsq_cluster.stall(0)
        async with bounded(0.2):
            with pytest.raises(Timeout) as caught:
                await conn.request(commands.pub("t_late", b"first", 0), "PUB", timeout=0.2)
        assert caught.value.retriable and not caught.value.fatal
        assert not conn.is_closed and conn.pending_count == 1  # its slot is kept
        nsq_cluster.resume(0)
        async with bounded(WAIT):  # the late OK goes to the kept slot, this one gets its own
            assert await conn.request(commands.pub("t_late", b"second", 0), "PUB") == b"OK"
        assert not conn.is_closed and conn.pending_count == 0
        assert stored(nsq_cluster, "t_late") == [b"first", b"second"]
    finally:
        await conn.close()


async def test_late_answers_go_to_their_own_slots() -> None:
    async with LateNsqd(delay=0.6) as nsqd:
        conn = await Connection.connect(nsqd.host, nsqd.port)
        try:
            patient = conn.submit(commands.pub("t", b"b"), "PUB", timeout=None)
            async with bounded(0.4):
                with pytest.raises(Timeout):
                    await conn.request(commands.pub("t", b"a"), "PUB", timeout=0.4)
            # both answers come at 0.6 s (under twice 0.4 s: not deemed dead); each goes to
            # its own slot, the timed-out one's is discarded
            async with bounded(WAIT):
                assert await patient == b"OK"
            async with bounded(WAIT):
                assert await conn.request(commands.pub("t", b"c"), "PUB") == b"OK"
            assert not conn.is_closed
        finally:
            await conn.close()


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, proxied=True)
async def test_too_many_timed_out_requests_mean_a_dead_connection(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("t_dead")
    conn = await Connection.connect(*address(nsq_cluster), ConnectionConfig(max_timed_out=3))
    try:
        nsq_cluster.stall(0)
        calls = [conn.submit(commands.pub("t_dead", b"x", 0), "PUB", timeout=0.1)
                 for _ in range(4)]
        for call in calls:
            async with bounded(0.1):
                with pytest.raises((Timeout, ConnectionClosed)):
                    await call
        async with bounded(0.0):
            reason = await conn.closed
        assert isinstance(reason, ConnectionClosed) and "4 requests timed out" in str(reason)
    finally:
        await conn.close()


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, proxied=True)
async def test_a_slot_unanswered_for_twice_its_timeout_means_dead(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("t_dead2")
    conn = await Connection.connect(*address(nsq_cluster))
    try:
        nsq_cluster.stall(0)
        async with bounded(0.3):
            with pytest.raises(Timeout):
                await conn.request(commands.pub("t_dead2", b"x", 0), "PUB", timeout=0.3)
        assert not conn.is_closed
        async with bounded(0.3):
            reason = await conn.closed
        assert isinstance(reason, ConnectionClosed) and "unanswered" in str(reason)
    finally:
        await conn.close()


async def test_no_time_left_means_not_sent() -> None:
    async with LateNsqd(delay=0) as nsqd:
        conn = await Connection.connect(nsqd.host, nsqd.port)
        try:
            for timeout in (0, -0.03):
                with pytest.raises(Timeout, match="not sent"):
                    conn.submit(commands.pub("t", b"x"), "PUB", timeout=timeout)
            assert not conn.is_closed and nsqd.requests == [b"IDENTIFY"]
        finally:
            await conn.close()


# -- hostile nsqds ----------------------------------------------------------------------------

async def test_a_silent_nsqd_times_the_connect_out() -> None:
    async with SilentNsqd() as nsqd, bounded(0.5):
        with pytest.raises(Timeout):
            await Connection.connect(nsqd.host, nsqd.port, ConnectionConfig(connect_timeout=0.5))


async def test_a_frame_stalled_midway() -> None:
    async with StallingNsqd() as nsqd:
        conn = await Connection.connect(nsqd.host, nsqd.port,
                                        ConnectionConfig(heartbeat_interval=1))
        try:
            async with bounded(0.3):
                with pytest.raises(Timeout):
                    await conn.request(commands.pub("t", b"x"), "PUB", timeout=0.3)
            async with bounded(2.0):  # no heartbeat either: the watchdog closes it
                reason = await conn.closed
            assert isinstance(reason, ConnectionClosed)
        finally:
            await conn.close()


async def test_deflate_switched_on_unasked_is_refused() -> None:
    # before: the client inflated whatever followed, as if it had asked
    async with DeflatingNsqd() as nsqd, bounded(5.0):
        with pytest.raises(ProtocolError, match=r"deflate.*not asked") as caught:
            await Connection.connect(nsqd.host, nsqd.port)
    assert caught.value.fatal and not caught.value.retriable
    assert nsqd.asked[0]["deflate"] is False


@pytest.mark.parametrize("compression", ["none", "snappy"])
async def test_any_other_compression_than_asked_is_refused(compression: str) -> None:
    async with DeflatingNsqd() as nsqd, bounded(5.0):
        with pytest.raises(ProtocolError, match="not asked"):
            await Connection.connect(nsqd.host, nsqd.port,
                                     ConnectionConfig(compression=compression))  # type: ignore[arg-type]


async def test_a_deflate_bomb_fails_fast_with_bounded_memory() -> None:
    # 256 MiB of zeros in ~250 KiB of deflate, right after a negotiated upgrade;
    # before: one read inflated to ~260 MB at once
    async with DeflatingNsqd(bomb=256 * 1024 * 1024) as nsqd:
        tracemalloc.start()
        try:
            async with bounded(5.0):
                try:
                    conn = await Connection.connect(
                        nsqd.host, nsqd.port, ConnectionConfig(compression="deflate"))
                except ProtocolError as exc:
                    reason: BaseException | None = exc
                else:
                    reason = await conn.closed
                    await conn.close()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert isinstance(reason, ProtocolError) and "frame size 0" in str(reason)
    assert peak < 32 * 1024 * 1024
