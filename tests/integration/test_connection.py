"""Connection against the embedded dev cluster over real loopback sockets.

Handshakes (youzan and classic), requests and their FIFO matching, pipelining, error
attribution (fatal, non-fatal, fire-and-forget), heartbeats, stalls, timeouts and closing.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from typing import Any

import pytest
from support import WAIT

from smartnsq.config import ConnectionConfig
from smartnsq.errors import (
    ConnectionClosed,
    ConnectionFailed,
    NonRetriableServerError,
    RefreshLookupError,
    ServerError,
    Timeout,
)
from smartnsq.protocol import commands
from smartnsq.protocol.frames import (
    CLASSIC_LAYOUT,
    YOUZAN_LAYOUT,
    MessageFrame,
    MessageLayout,
    youzan_message_id,
)
from smartnsq.protocol.responses import parse_publish_response
from smartnsq.transport.connection import Connection


def address(cluster: Any, index: int = 0) -> tuple[str, int]:
    host, port = cluster.nsqd_tcp_addresses[index].rsplit(":", 1)
    return host, int(port)


async def connect(cluster: Any, index: int = 0, **config: Any) -> Connection:
    return await Connection.connect(*address(cluster, index), ConnectionConfig(**config))


class Inbox:
    """Collects delivered messages; tests wait for a count with a timeout."""

    def __init__(self) -> None:
        self.messages: list[MessageFrame] = []
        self._changed = asyncio.Event()

    def __call__(self, msg: MessageFrame) -> None:
        self.messages.append(msg)
        self._changed.set()

    async def wait_for(self, count: int) -> list[MessageFrame]:
        async def until() -> None:
            while len(self.messages) < count:
                self._changed.clear()
                await self._changed.wait()
        await asyncio.wait_for(until(), WAIT)
        return self.messages


# -- handshake --------------------------------------------------------------------------

@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_youzan_handshake(nsq_cluster: Any) -> None:
    conn = await connect(nsq_cluster)
    try:
        assert conn.is_ready and not conn.is_closed
        assert conn.is_youzan and "-HA." in conn.version
        ident = conn.identify_response
        assert ident.negotiated and ident.max_rdy_count == conn.max_rdy_count == 2500
        assert conn.msg_timeout == 60.0 and conn.max_msg_timeout == 900.0
        assert conn.layout == YOUZAN_LAYOUT
        assert conn.compression == "none" and not conn.tls and conn.auth_response is None
        assert "youzan ready" in repr(conn)
    finally:
        await conn.close()


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, mode="classic")
async def test_classic_handshake(nsq_cluster: Any) -> None:
    conn = await connect(nsq_cluster, msg_timeout=30)
    try:
        assert not conn.is_youzan and conn.version == "1.3.0"
        assert conn.layout == CLASSIC_LAYOUT
        assert conn.msg_timeout == 30.0
        assert await conn.request(commands.pub("cl_t", b"hello"), "PUB") == b"OK"
    finally:
        await conn.close()


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_extend_support_sets_the_ext_layout(nsq_cluster: Any) -> None:
    host, port = address(nsq_cluster)
    conn = await Connection.connect(host, port, extend_support=True)
    try:
        assert conn.extend_support and conn.layout == MessageLayout(youzan=True, ext=True)
    finally:
        await conn.close()


async def test_connect_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectionFailed):
        await Connection.connect("127.0.0.1", port)


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, proxied=True)
async def test_connect_timeout_when_the_server_is_silent(nsq_cluster: Any) -> None:
    nsq_cluster.stall(0)
    with pytest.raises(Timeout):
        await connect(nsq_cluster, connect_timeout=0.3)


# -- requests ---------------------------------------------------------------------------

@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_pub_and_traced_pub(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("t_pub", partitions=2)
    conn = await connect(nsq_cluster)
    try:
        assert await conn.request(commands.pub("t_pub", b"plain", 1), "PUB") == b"OK"
        first = parse_publish_response(
            await conn.request(commands.pub_trace("t_pub", b"traced body 1", 77, 1), "PUB_TRACE"))
        second = parse_publish_response(
            await conn.request(commands.pub_trace("t_pub", b"traced body 2", 78, 1), "PUB_TRACE"))
        assert first is not None and second is not None
        assert first.partition == second.partition == 1
        assert (first.trace_id, second.trace_id) == (77, 78)
        assert second.internal_id == first.internal_id + 1
        assert second.queue_offset == first.queue_offset + first.raw_size
        assert conn.pending_count == 0
    finally:
        await conn.close()


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_pipelined_requests_resolve_in_order_in_one_write(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("t_pipe")
    conn = await connect(nsq_cluster)
    try:
        writes = conn.write_count
        calls = [conn.request(commands.pub_trace("t_pipe", b"body %04d" % i, i + 1, 0),
                              "PUB_TRACE") for i in range(1000)]
        answers = await asyncio.gather(*calls)
        receipts = [parse_publish_response(a) for a in answers]
        assert all(r is not None for r in receipts)
        assert [r.trace_id for r in receipts if r] == list(range(1, 1001))
        ids = [r.internal_id for r in receipts if r]
        assert ids == sorted(ids) and len(set(ids)) == 1000
        for before, after in itertools.pairwise(receipts):
            assert before and after
            assert after.queue_offset == before.queue_offset + before.raw_size
        # 1000 commands queued in one event-loop iteration leave in one socket write
        assert conn.write_count - writes == 1
    finally:
        await conn.close()


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_now_writes_in_the_same_turn_and_keeps_order(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("t_now")
    conn = await connect(nsq_cluster)
    try:
        writes = conn.write_count
        lone = conn.submit(commands.pub("t_now", b"lone"), "PUB", now=True)
        assert conn.write_count - writes == 1  # written before the call returned
        assert await lone == b"OK"
        # queued commands are written first, in order, together with the urgent one
        queued = [conn.submit(commands.pub("t_now", b"q%d" % i), "PUB") for i in range(3)]
        writes = conn.write_count
        last = conn.submit(commands.pub("t_now", b"last"), "PUB", now=True)
        assert conn.write_count - writes == 1
        assert await asyncio.gather(*queued, last) == [b"OK"] * 4
    finally:
        await conn.close()


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_send_now_writes_at_once_behind_what_is_queued(nsq_cluster: Any) -> None:
    """``send_now`` (the ordered FIN's path) writes before it returns, after whatever was
    queued and in the same write; refused once closed."""
    await nsq_cluster.create_topic("t_send_now")
    conn = await connect(nsq_cluster)
    try:
        writes = conn.write_count
        conn.send_now(commands.nop())
        assert conn.write_count - writes == 1
        conn.send(commands.nop())  # queued for the turn's batch
        writes = conn.write_count
        conn.send_now(commands.nop())
        assert conn.write_count - writes == 1  # both NOPs, one write
        assert await conn.submit(commands.pub("t_send_now", b"x"), "PUB") == b"OK"
    finally:
        await conn.close()
    with pytest.raises(ConnectionClosed):
        conn.send_now(commands.nop())


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_fatal_error_fails_every_pending_call(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("t_fatal")
    conn = await connect(nsq_cluster)
    before = [conn.submit(commands.pub("t_fatal", b"ok %d" % i, 0), "PUB") for i in range(3)]
    # a topic that does not exist: E_TOPIC_NOT_EXIST, after which nsqd closes the connection
    doomed = conn.submit(commands.pub("t_missing", b"x", 0), "PUB")
    after = [conn.submit(commands.pub("t_fatal", b"late %d" % i, 0), "PUB") for i in range(5)]
    assert await asyncio.gather(*before) == [b"OK"] * 3
    with pytest.raises(RefreshLookupError) as caught:
        await doomed
    error = caught.value
    assert error.code == "E_TOPIC_NOT_EXIST" and error.fatal and error.command == "PUB"
    for call in after:
        with pytest.raises(ConnectionClosed) as closed:
            await call
        assert closed.value.__cause__ is error
    assert conn.is_closed
    assert await asyncio.wait_for(conn.closed, WAIT) is error
    with pytest.raises(ConnectionClosed):
        conn.submit(commands.pub("t_fatal", b"x", 0), "PUB")
    with pytest.raises(ConnectionClosed):
        conn.send(commands.nop())
    await conn.close()


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_non_fatal_error_fails_one_call_and_keeps_the_connection(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("t_plain")  # not an ext topic: headers are refused
    conn = await connect(nsq_cluster)
    try:
        first = conn.submit(commands.pub("t_plain", b"a", 0), "PUB")
        refused = conn.submit(commands.pub_ext("t_plain", b"b", {"k": "v"}, 0), "PUB_EXT")
        last = conn.submit(commands.pub("t_plain", b"c", 0), "PUB")
        assert await first == b"OK"
        with pytest.raises(NonRetriableServerError) as caught:
            await refused
        assert caught.value.code == "E_EXT_NOT_SUPPORT" and not caught.value.fatal
        assert await last == b"OK"
        assert conn.is_ready
    finally:
        await conn.close()


@pytest.mark.nsq_cluster(nodes=2, lookupds=1)
async def test_not_leader_on_pub_keeps_the_connection(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("t_move", partitions=1, replicas=2)
    leader = nsq_cluster.nodes.index(nsq_cluster.leader_of("t_move", 0))
    conn = await connect(nsq_cluster, leader)
    try:
        assert await conn.request(commands.pub("t_move", b"a", 0), "PUB") == b"OK"
        nsq_cluster.move_leader("t_move", 0)
        with pytest.raises(RefreshLookupError) as caught:
            await conn.request(commands.pub("t_move", b"b", 0), "PUB")
        assert caught.value.code == "E_FAILED_ON_NOT_LEADER" and not caught.value.fatal
        assert conn.is_ready
    finally:
        await conn.close()


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, mode="classic")
async def test_fire_and_forget_error_goes_to_on_error(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("cl_fin", channels=["ch"])
    conn = await connect(nsq_cluster)
    errors: list[ServerError] = []
    got_error = asyncio.Event()

    def on_error(error: ServerError) -> None:
        errors.append(error)
        got_error.set()

    conn.on_error = on_error
    try:
        assert await conn.request(commands.sub("cl_fin", "ch"), "SUB") == b"OK"
        conn.send(commands.fin(b"0123456789abcdef"))  # not in flight: E_FIN_FAILED
        # a request pending at the same time gets its own answer, not the FIN's error
        assert await conn.request(commands.pub("cl_fin", b"x"), "PUB") == b"OK"
        await asyncio.wait_for(got_error.wait(), WAIT)
        assert [e.code for e in errors] == ["E_FIN_FAILED"]
        assert errors[0].command == "FIN" and not errors[0].fatal
        assert conn.is_ready
    finally:
        await conn.close()


# -- consuming --------------------------------------------------------------------------

@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_messages_reach_on_message_with_the_layout_set_after_sub(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("t_cons", channels=["ch"])
    inbox = Inbox()
    host, port = address(nsq_cluster)
    conn = await Connection.connect(host, port, on_message=inbox)
    producer = await connect(nsq_cluster)
    try:
        for i in range(3):
            await producer.request(commands.pub("t_cons", b"m%d" % i, 0), "PUB")
        assert await conn.request(commands.sub_advanced("t_cons", "ch", 0), "SUB_ADVANCED") \
            == b"OK"
        conn.layout = MessageLayout.for_subscription(
            youzan=conn.is_youzan, extend_support=conn.extend_support, command="SUB_ADVANCED")
        conn.send(commands.rdy(10))
        messages = await inbox.wait_for(3)
        assert [m.body for m in messages] == [b"m0", b"m1", b"m2"]
        assert messages[0].queue_offset == 0  # the detail block was decoded
        for before, after in itertools.pairwise(messages):
            assert before.queue_offset is not None and before.raw_size is not None
            assert after.queue_offset == before.queue_offset + before.raw_size
        assert all(m.partition == 0 and m.attempts == 1 for m in messages)
        for m in messages:
            conn.send(commands.fin(m.id))
        assert await conn.request(commands.cls(), "CLS") == b"CLOSE_WAIT"
    finally:
        await conn.close()
        await producer.close()


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_fatal_error_after_fire_and_forget_closes(nsq_cluster: Any) -> None:
    conn = await connect(nsq_cluster)
    errors: list[ServerError] = []
    conn.on_error = errors.append
    conn.send(commands.fin(youzan_message_id(0)))  # id 0 before SUB: fatal E_INVALID
    reason = await asyncio.wait_for(conn.closed, WAIT)
    assert isinstance(reason, ServerError) and reason.fatal and reason.code == "E_INVALID"
    assert errors == [reason]
    await conn.close()


# -- heartbeats, stalls, timeouts -------------------------------------------------------

@pytest.mark.nsq_cluster(nodes=1, lookupds=1, mode="classic")
async def test_heartbeats_are_answered(nsq_cluster: Any) -> None:
    # classic nsqd closes a client that stays silent for 2 heartbeat intervals (tcp_10);
    # three heartbeats on an otherwise idle connection prove the NOPs went out
    conn = await connect(nsq_cluster, heartbeat_interval=1)
    beats = asyncio.Event()

    def on_heartbeat() -> None:
        if conn.heartbeats >= 3:
            beats.set()

    conn.on_heartbeat = on_heartbeat
    try:
        await asyncio.wait_for(beats.wait(), WAIT)
        assert conn.is_ready
        assert await conn.request(commands.pub("cl_hb", b"alive"), "PUB") == b"OK"
    finally:
        await conn.close()


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, proxied=True)
async def test_stalled_connection_is_detected_and_closed(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("t_stall")
    conn = await connect(nsq_cluster, heartbeat_interval=1, request_timeout=None)
    nsq_cluster.stall(0)
    pending = conn.submit(commands.pub("t_stall", b"x", 0), "PUB")
    reason = await asyncio.wait_for(conn.closed, WAIT)
    assert isinstance(reason, ConnectionClosed) and "stalled" in str(reason)
    with pytest.raises(ConnectionClosed):
        await pending
    await conn.close()


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, proxied=True)
async def test_request_timeout_keeps_the_other_calls(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("t_slow")
    conn = await connect(nsq_cluster)
    nsq_cluster.stall(0)
    patient = conn.submit(commands.pub("t_slow", b"a", 0), "PUB", timeout=None)
    late = conn.submit(commands.pub("t_slow", b"b", 0), "PUB", timeout=30)
    with pytest.raises(Timeout):  # the shortest deadline counts, whatever its place
        await conn.request(commands.pub("t_slow", b"c", 0), "PUB", timeout=0.2)
    # the connection stays; the other calls get their own answers once the server speaks
    assert not conn.is_closed and conn.timed_out_count == 1 and conn.pending_count == 3
    nsq_cluster.resume(0)
    assert await asyncio.wait_for(patient, WAIT) == b"OK"
    assert await asyncio.wait_for(late, WAIT) == b"OK"
    assert await conn.request(commands.pub("t_slow", b"d", 0), "PUB") == b"OK"
    assert conn.timed_out_count == 0 and not conn.is_closed
    await conn.close()


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, proxied=True)
async def test_connection_cut_fails_pending_calls(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("t_cut")
    conn = await connect(nsq_cluster)
    nsq_cluster.stall(0)
    pending = [conn.submit(commands.pub("t_cut", b"x", 0), "PUB") for _ in range(3)]
    await conn.drain()
    assert nsq_cluster.cut_connections(0) == 1
    for call in pending:
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(call, WAIT)
    reason = await asyncio.wait_for(conn.closed, WAIT)
    assert isinstance(reason, ConnectionClosed)
    await conn.close()


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_cancelled_call_keeps_fifo_order(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("t_cancel")
    conn = await connect(nsq_cluster)
    try:
        first = asyncio.ensure_future(
            conn.request(commands.pub_trace("t_cancel", b"one......", 1, 0), "PUB_TRACE"))
        second = asyncio.ensure_future(
            conn.request(commands.pub_trace("t_cancel", b"two......", 2, 0), "PUB_TRACE"))
        # one scheduler turn runs each task up to waiting for its answer, which cannot be
        # back yet (the server needs several turns to read and answer): both calls are queued
        await asyncio.sleep(0)
        assert conn.pending_count == 2 and not first.done() and not second.done()
        first.cancel()
        receipt = parse_publish_response(await second)
        assert receipt is not None and receipt.trace_id == 2
        assert conn.is_ready and conn.pending_count == 0
    finally:
        await conn.close()


# -- closing ----------------------------------------------------------------------------

@pytest.mark.nsq_cluster(nodes=1, lookupds=1, proxied=True)
async def test_close_fails_pending_calls_and_settles_closed(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("t_close")
    conn = await connect(nsq_cluster)
    nsq_cluster.stall(0)
    pending = conn.submit(commands.pub("t_close", b"x", 0), "PUB")
    await conn.close()
    with pytest.raises(ConnectionClosed):
        await pending
    assert conn.closed.done() and conn.closed.result() is None
    assert conn.is_closed and not conn.is_ready
    with pytest.raises(ConnectionClosed):
        await conn.request(commands.pub("t_close", b"x", 0), "PUB")
    await conn.close()  # twice is fine


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_server_side_close_settles_closed(nsq_cluster: Any) -> None:
    conn = await connect(nsq_cluster)
    await nsq_cluster.stop_node(0)
    reason = await asyncio.wait_for(conn.closed, WAIT)
    assert isinstance(reason, ConnectionClosed)
    await conn.close()
