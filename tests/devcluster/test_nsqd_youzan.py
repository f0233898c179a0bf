"""youzan nsqd over real loopback sockets: what the captures in tests/fixtures/youzan show."""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator

import pytest
from nsqd_helpers import Nodes, RawClient, error_then_close, running

from smartnsq.devcluster.nsqd.channels import Channel
from smartnsq.protocol import commands
from smartnsq.protocol.frames import HEARTBEAT, ErrorFrame, Response
from smartnsq.protocol.responses import parse_publish_response


@pytest.fixture
async def yz() -> AsyncIterator[Nodes]:
    async with running(3) as nodes:
        yield nodes


def sized(line: bytes, body: bytes) -> bytes:
    return line + struct.pack(">i", len(body)) + body


def receipt(answer: object) -> tuple[int, int, int, int]:
    assert isinstance(answer, Response), answer
    got = parse_publish_response(answer.data)
    assert got is not None
    return got.internal_id, got.trace_id, got.queue_offset, got.raw_size


# -- publishing ---------------------------------------------------------------------------------


async def test_publish_family_ids_offsets_and_raw_sizes_as_captured(yz: Nodes) -> None:
    yz.topic("test_p2r2", 2, 2, channels=["ch1"])
    producer = await yz.client(yz.leader("test_p2r2", 0))
    assert await producer.call(commands.pub("test_p2r2", b"hello-pub-1", 0)) == Response(b"OK")
    # tcp_04: PUB_TRACE answers OK + id + trace id + queue offset + raw size
    traced = await producer.call(commands.pub_trace("test_p2r2", b"hello-trace-2",
                                                    0x0102030405060708, 0))
    assert receipt(traced) == (3, 0x0102030405060708, 41, 43)
    assert receipt(await producer.call(commands.pub_trace("test_p2r2", b"hello-trace-0", 0, 0))
                   ) == (4, 0, 84, 43)
    # tcp_05: MPUB answers OK, MPUB_TRACE the first id, trace 0, the batch's offset and size
    assert await producer.call(commands.mpub("test_p2r2", [b"mpub-a", b"mpub-b"], 0)
                               ) == Response(b"OK")
    batch = commands.mpub_trace("test_p2r2", [(0xAA, b"mpubtrace-a"), (0xBB, b"mpubtrace-b")], 0)
    assert receipt(await producer.call(batch)) == (7, 0, 199, 82)
    # a second partition counts on its own: (1 << 50) | 2
    p1 = await yz.client(yz.leader("test_p2r2", 1))
    first = await p1.call(commands.pub_trace("test_p2r2", b"x", 1, 1))
    assert receipt(first) == ((1 << 50) | 2, 1, 0, 31)


async def test_pub_trace_without_a_body_is_fatal(yz: Nodes) -> None:
    yz.topic("t")
    producer = await yz.client(yz.leader("t"))
    line = sized(b"PUB_TRACE t 0\n", struct.pack(">Q", 1))
    assert await error_then_close(producer, line) == \
        b"E_BAD_BODY invalid body size 8 with trace id enabled"


async def test_pub_without_partition_uses_the_partition_the_node_leads(yz: Nodes) -> None:
    yz.topic("t", 3, 1)
    for partition in range(3):
        producer = await yz.client(yz.leader("t", partition))
        answer = await producer.call(commands.pub_trace("t", b"x", 5))
        assert receipt(answer)[0] >> 50 == partition


async def test_size_limits_are_checked_on_the_length_before_the_body(yz: Nodes) -> None:
    yz.topic("t")
    leader = yz.leader("t")
    producer = await yz.client(leader)
    too_big = b"PUB t 0\n" + struct.pack(">i", 1024 * 1024 + 1)  # no body follows
    assert await error_then_close(producer, too_big) == \
        b"E_BAD_MESSAGE message too big 1048577 > 1048576"
    producer = await yz.client(leader)
    assert await error_then_close(producer, b"PUB t 0\n" + struct.pack(">i", 0)) == \
        b"E_BAD_BODY invalid body size 0"
    producer = await yz.client(leader)
    body = b"MPUB t 0\n" + struct.pack(">i", 5 * 1024 * 1024 + 1)
    assert await error_then_close(producer, body) == b"E_BAD_BODY body too big 5242881 > 5242880"
    producer = await yz.client(leader)
    body = b"MPUB t 0\n" + struct.pack(">ii", 100, 0)
    assert await error_then_close(producer, body) == b"E_BAD_BODY MPUB invalid message count 0"


async def test_topic_not_on_this_node_is_fatal_before_the_body(yz: Nodes) -> None:
    yz.topic("test_p2r2", 2, 2, channels=["ch1"])
    leader = yz.leader("test_p2r2", 0)
    for command in (commands.pub("test_p2r2", b"x", 5), commands.pub("no_such_topic", b"x", 0),
                    commands.pub("no_such_topic", b"x"), b"PUB bad*name 0\n\x00\x00\x00\x01x"):
        producer = await yz.client(leader)
        assert await error_then_close(producer, command) == b"E_TOPIC_NOT_EXIST "
    producer = await yz.client(yz.outsider("test_p2r2", 0))
    assert await error_then_close(producer, commands.pub("test_p2r2", b"x", 0)) == \
        b"E_TOPIC_NOT_EXIST "
    producer = await yz.client(leader)
    assert await error_then_close(producer, b"PUB test_p2r2 notanumber\n\x00\x00\x00\x01x") == \
        b'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: parsing "notanumber": ' \
        b"invalid syntax"


async def test_replica_refuses_writes_softly_and_subscriptions_fatally(yz: Nodes) -> None:
    yz.topic("test_p2r2", 2, 2, channels=["ch1"])
    replica = yz.replica("test_p2r2", 0)
    producer = await yz.client(replica)
    for command in (commands.pub("test_p2r2", b"x", 0), commands.pub("test_p2r2", b"x", 0),
                    commands.mpub("test_p2r2", [b"a", b"b"], 0),
                    commands.pub_trace("test_p2r2", b"x", 1, 0)):
        assert await producer.call(command) == ErrorFrame(b"E_FAILED_ON_NOT_LEADER ")
    consumer = await yz.client(replica)
    assert await error_then_close(consumer, commands.sub("test_p2r2", "ch1", 0)) == \
        b"E_FAILED_ON_NOT_LEADER "


async def test_unwritable_partition_refuses_writes_softly(yz: Nodes) -> None:
    yz.topic("t")
    producer = await yz.client(yz.leader("t"))
    yz.state.set_writable("t", 0, False)
    assert await producer.call(commands.pub("t", b"x", 0)) == \
        ErrorFrame(b"E_FAILED_ON_NOT_WRITABLE ")
    yz.state.set_writable("t", 0, True)
    assert await producer.call(commands.pub("t", b"x", 0)) == Response(b"OK")


# -- consuming ----------------------------------------------------------------------------------


async def test_sub_rdy_fin_req_touch_and_fin_failures(yz: Nodes) -> None:
    yz.topic("t", channels=["ch1"])
    leader = yz.leader("t")
    consumer = await yz.client(leader)
    assert await consumer.call(commands.sub("t", "ch1", 0)) == Response(b"OK")
    producer = await yz.client(leader)
    for body in (b"one", b"two", b"three"):
        assert await producer.call(commands.pub("t", body, 0)) == Response(b"OK")
    consumer.send(commands.rdy(1))
    first = await consumer.message()
    assert (first.internal_id, first.trace_id, first.attempts, first.body) == (2, 0, 1, b"one")
    consumer.send(commands.touch(first.id) + commands.fin(first.id))
    second = await consumer.message()
    assert second.body == b"two"
    consumer.send(commands.req(second.id, 0))
    again = await consumer.message()
    assert (again.id, again.attempts, again.body) == (second.id, 2, b"two")
    consumer.send(commands.fin(again.id))
    third = await consumer.message()
    consumer.send(commands.fin(third.id))
    # FIN of an id no longer in flight: non-fatal, the text shows the id as Go prints [16]byte
    answer = await consumer.call(commands.fin(first.id))
    assert answer == ErrorFrame(b"E_FIN_FAILED FIN [0 0 0 0 0 0 0 2 0 0 0 0 0 0 0 0] failed "
                                b"ErrType:7 ErrCode:0 : Message ID not in flight")
    answer = await consumer.call(b"FIN 0123456789abcdef\n")
    assert answer == ErrorFrame(b"E_FIN_FAILED FIN [48 49 50 51 52 53 54 55 56 57 97 98 99 100 "
                                b"101 102] failed ErrType:7 ErrCode:0 : Message ID not in flight")
    answer = await consumer.call(commands.req(first.id, 0))
    assert answer == ErrorFrame(b"E_REQ_FAILED REQ [0 0 0 0 0 0 0 2 0 0 0 0 0 0 0 0] failed "
                                b"Message ID not in flight")
    answer = await consumer.call(commands.touch(first.id))
    assert answer == ErrorFrame(b"E_TOUCH_FAILED TOUCH [0 0 0 0 0 0 0 2 0 0 0 0 0 0 0 0] failed "
                                b"Message ID not in flight")
    # still usable after the non-fatal errors
    assert await producer.call(commands.pub("t", b"four", 0)) == Response(b"OK")
    assert (await consumer.message()).body == b"four"


async def test_binary_ids_with_newlines_and_spaces_are_sliced_at_fixed_offsets(yz: Nodes) -> None:
    yz.topic("t", channels=["c"])
    leader = yz.leader("t")
    consumer = await yz.client(leader)
    await consumer.call(commands.sub("t", "c", 0))
    producer = await yz.client(leader)
    trace = int.from_bytes(b"\n \n \n\n\n\n", "big")  # every trace byte a newline or a space
    await producer.call(commands.pub_trace("t", b"x", trace, 0))
    consumer.send(commands.rdy(1))
    msg = await consumer.message()
    assert msg.trace_id == trace
    consumer.send(commands.touch(msg.id) + commands.req(msg.id, 0))
    again = await consumer.message()
    assert again.attempts == 2
    consumer.send(commands.fin(again.id))
    await producer.call(commands.pub("t", b"y", 0))
    assert (await consumer.message()).body == b"y"


async def test_state_checks_are_fatal(yz: Nodes) -> None:
    yz.topic("t", channels=["c"])
    leader = yz.leader("t")
    client = await yz.client(leader)
    assert await error_then_close(client, commands.rdy(1)) == \
        b"E_INVALID cannot RDY in current state"
    client = await yz.client(leader)
    assert await error_then_close(client, commands.cls()) == \
        b"E_INVALID cannot CLS in current state"
    client = await yz.client(leader)
    await client.call(commands.sub("t", "c", 0))
    assert await error_then_close(client, commands.sub("t", "c", 0)) == \
        b"E_INVALID cannot SUB in current state"
    client = await yz.client(leader)
    await client.call(commands.sub("t", "c", 0))
    assert await error_then_close(client, commands.identify({})) == \
        b"E_INVALID cannot IDENTIFY in current state"
    client = await yz.client(leader)
    await client.call(commands.sub("t", "c", 0))
    assert await error_then_close(client, b"RDY 2501\n") == \
        b"E_INVALID RDY count 2501 out of range 0-2500"
    client = await yz.client(leader, heartbeat_interval=-1)
    assert await error_then_close(client, commands.sub("t", "c", 0)) == \
        b"E_INVALID cannot SUB with heartbeats disabled"


async def test_sub_errors_as_captured(yz: Nodes) -> None:
    yz.topic("t", channels=["c"])
    leader = yz.leader("t")
    client = await yz.client(leader)
    assert await error_then_close(client, commands.sub("t", "c", 3)) == b"E_TOPIC_NOT_EXIST "
    client = await yz.client(leader)
    assert await error_then_close(client, b"SUB bad*name ch 0\n") == \
        b'E_BAD_TOPIC SUB topic name "bad*name" is not valid'
    client = await yz.client(leader)
    assert await error_then_close(client, b"SUB t bad*ch 0\n") == \
        b'E_BAD_CHANNEL SUB channel name "bad*ch" is not valid'


async def test_unknown_commands_are_fatal_with_the_params_printed_go_style(yz: Nodes) -> None:
    yz.topic("test_ordered", 2, 1, ordered=True, channels=["och"])
    client = await yz.client(yz.leader("test_ordered", 0))
    assert await error_then_close(client, b"SUB_ORDER test_ordered och 0\n") == \
        b"E_INVALID invalid command [[83 85 66 95 79 82 68 69 82] [116 101 115 116 95 111 114 " \
        b"100 101 114 101 100] [111 99 104] [48]]"
    client = await yz.client(yz.leader("test_ordered", 0))
    answer = await error_then_close(client, commands.dpub("test_ordered", 10, b"x"))
    assert answer.startswith(b"E_INVALID invalid command [[68 80 85 66] ")


async def test_internal_create_topic_is_refused_softly(yz: Nodes) -> None:
    client = await yz.client(yz.nodes[0])
    assert await client.call(b"INTERNAL_CREATE_TOPIC new_t 0\n") == ErrorFrame(
        b"E_CREATE_TOPIC_FAILED CREATE_TOPIC is not allowed here while cluster feature enabled.")
    assert await client.call(b"INTERNAL_CREATE_TOPIC new_t 0\n") == ErrorFrame(
        b"E_CREATE_TOPIC_FAILED CREATE_TOPIC is not allowed here while cluster feature enabled.")


async def test_cls_answers_close_wait_and_keeps_the_socket(yz: Nodes) -> None:
    yz.topic("t", channels=["c"])
    leader = yz.leader("t")
    consumer = await yz.client(leader)
    await consumer.call(commands.sub("t", "c", 0))
    producer = await yz.client(leader)
    await producer.call(commands.mpub("t", [b"a", b"b"], 0))
    consumer.send(commands.rdy(1))
    msg = await consumer.message()
    assert await consumer.call(commands.cls()) == Response(b"CLOSE_WAIT")
    consumer.send(commands.rdy(5) + commands.fin(msg.id))  # RDY ignored, FIN still accepted
    answer = await consumer.call(commands.fin(msg.id))  # the connection is still there
    assert isinstance(answer, ErrorFrame) and answer.payload.startswith(b"E_FIN_FAILED")


async def test_message_timeout_redelivers_with_attempts_plus_one() -> None:
    async with running(1, msg_timeout=100) as yz:  # clients that do not ask get 100 ms
        yz.topic("t", channels=["c"])
        node = yz.nodes[0]
        consumer = await yz.client(node, msg_timeout=0)
        await consumer.call(commands.sub("t", "c", 0))
        producer = await yz.client(node)
        await producer.call(commands.pub("t", b"late", 0))
        consumer.send(commands.rdy(1))
        first = await consumer.message()
        second = await consumer.message()  # never FINed: it comes back
        assert (second.id, second.attempts) == (first.id, 2)
        channel = yz.state.partition("t", 0).channels["c"]  # type: ignore[union-attr]
        assert channel.timeout_count == 1


async def test_youzan_requeues_a_gone_consumers_messages_at_once(yz: Nodes) -> None:
    yz.topic("t", channels=["c"])
    leader = yz.leader("t")
    first = await yz.client(leader)
    await first.call(commands.sub("t", "c", 0))
    producer = await yz.client(leader)
    await producer.call(commands.pub("t", b"x", 0))
    first.send(commands.rdy(1))
    msg = await first.message()
    first.close()
    second = await yz.client(leader)
    await second.call(commands.sub("t", "c", 0))
    second.send(commands.rdy(1))
    again = await second.message()
    assert (again.id, again.attempts) == (msg.id, 2)


async def test_heartbeats_then_the_silent_client_is_dropped() -> None:
    async with running(1, heartbeat_interval=50) as yz:  # a client's default before IDENTIFY
        client = await yz.client(yz.nodes[0], heartbeat_interval=0)
        assert await client.frame() is HEARTBEAT
        assert await client.frame() is HEARTBEAT
        assert await client.closed()  # 3 intervals without a command: closed, no error frame


# -- ordered topics ---------------------------------------------------------------------------


async def test_ordered_topic_rules_and_one_message_in_flight(yz: Nodes) -> None:
    yz.topic("test_ordered", 2, 1, ordered=True, channels=["och"])
    leader = yz.leader("test_ordered", 0)
    for sub in (commands.sub("test_ordered", "och", 0),
                commands.sub_advanced("test_ordered", "och", 0)):
        client = await yz.client(leader)
        assert await error_then_close(client, sub) == \
            b"E_SUB_ORDER_IS_MUST this topic is configured only allow ordered sub"
    consumer = await yz.client(leader)
    assert await consumer.call(commands.sub_ordered("test_ordered", "och", 0)) == Response(b"OK")
    consumer.expect(detail=True)
    producer = await yz.client(leader)
    for i in range(3):
        await producer.call(commands.pub("test_ordered", b"ordered-%d" % i, 0))
    traced = await producer.call(commands.pub_trace("test_ordered", b"ordered-trace", 0x77, 0))
    assert receipt(traced) == (5, 0x77, 117, 43)
    assert await error_then_close(producer, commands.pub("test_ordered", b"x")) == \
        b"E_BAD_PARTITION topic partition is not valid for multi partition: -1"
    consumer.send(commands.rdy(2))  # RDY 2 still yields one message at a time
    offsets = []
    channel = yz.state.partition("test_ordered", 0).channels["och"]  # type: ignore[union-attr]
    for _ in range(4):
        msg = await consumer.message()
        assert isinstance(channel, Channel) and channel.in_flight == 1
        offsets.append((msg.queue_offset, msg.raw_size))
        if msg.body == b"ordered-1":
            consumer.send(commands.req(msg.id, 5000))  # delays are ignored on ordered channels
        consumer.send(commands.fin(msg.id))
    assert offsets == [(0, 39), (39, 39), (78, 39), (117, 43)]


async def test_sub_ordered_on_a_normal_topic_orders_that_channel(yz: Nodes) -> None:
    yz.topic("t", channels=["c"])
    leader = yz.leader("t")
    consumer = await yz.client(leader)
    assert await consumer.call(commands.sub_ordered("t", "c", 0)) == Response(b"OK")
    channel = yz.state.partition("t", 0).channels["c"]  # type: ignore[union-attr]
    assert isinstance(channel, Channel) and channel.ordered
    client = await yz.client(leader, sample_rate=50)
    assert await error_then_close(client, commands.sub_ordered("t", "c", 0)) == \
        b"E_INVALID order consume is not allowed while sample rate is not 0"


# -- SUB_ADVANCED -------------------------------------------------------------------------------


async def test_sub_advanced_frames_carry_offset_and_raw_size(yz: Nodes) -> None:
    yz.topic("test_p2r2", 2, 2)
    leader = yz.leader("test_p2r2", 1)
    consumer = await yz.client(leader)
    assert await consumer.call(commands.sub_advanced("test_p2r2", "ch2", 1)) == Response(b"OK")
    consumer.expect(detail=True)
    producer = await yz.client(leader)
    await producer.call(commands.pub("test_p2r2", b"adv-msg", 1))
    consumer.send(commands.rdy(1))
    msg = await consumer.message()
    assert (msg.internal_id, msg.queue_offset, msg.raw_size, msg.body) == \
        ((1 << 50) | 2, 0, 37, b"adv-msg")


@pytest.mark.parametrize(("start", "first"), [
    (b"msgcount:0", b"m0"), (b"msgcount:1", b"m0"), (b"msgcount:2", b"m1"),
    (b"virtual_queue:64", b"m2"), (b"special:-1", b"new"),
    (b"timestamp:0", b"m0")])
async def test_sub_advanced_start_positions(yz: Nodes, start: bytes, first: bytes) -> None:
    yz.topic("t", channels=["c"])
    leader = yz.leader("t")
    producer = await yz.client(leader)
    await producer.call(commands.mpub("t", [b"m0", b"m1", b"m2"], 0))  # offsets 0, 32, 64
    consumer = await yz.client(leader)
    assert await consumer.call(b"SUB_ADVANCED t c 0 " + start + b"\n") == Response(b"OK")
    consumer.expect(detail=True)
    await producer.call(commands.pub("t", b"new", 0))
    consumer.send(commands.rdy(1))
    assert (await consumer.message()).body == first


async def test_sub_advanced_bad_start_is_fatal(yz: Nodes) -> None:
    yz.topic("t", channels=["c"])
    client = await yz.client(yz.leader("t"))
    assert await error_then_close(client, b"SUB_ADVANCED t c 0 later:5\n") == \
        b"E_INVALID invalid consume offset:later:5"


# -- ext topics ---------------------------------------------------------------------------------


async def test_ext_topic_as_captured(yz: Nodes) -> None:
    yz.topic("test_ext", 1, 2, ext=True)
    leader = yz.leader("test_ext")
    plain = await yz.client(leader)
    assert await error_then_close(plain, commands.sub("test_ext", "ech", 0)) == \
        b"E_SUB_EXTEND_NEED this topic is extended and should identify as extend support."
    consumer = await yz.client(leader, extend_support=True)
    assert await consumer.call(commands.sub("test_ext", "ech", 0)) == Response(b"OK")
    consumer.expect(ext=True)
    producer = await yz.client(leader, extend_support=True)
    header = b'{"##trace_id": "12345", "k1": "v1"}'
    ext_pub = sized(b"PUB_EXT test_ext 0\n", struct.pack(">H", len(header)) + header + b"ext-body")
    assert receipt(await producer.call(ext_pub)) == (2, 12345, 0, 76)
    assert await producer.call(commands.pub("test_ext", b"plain-body-on-ext-topic", 0)) == \
        Response(b"OK")
    consumer.send(commands.rdy(1))
    msg = await consumer.message()
    assert (msg.trace_id, msg.ext_version, msg.ext, msg.body) == (12345, 4, header, b"ext-body")
    consumer.send(commands.fin(msg.id))
    msg = await consumer.message()
    assert (msg.ext_version, msg.ext, msg.body) == (0, None, b"plain-body-on-ext-topic")
    p = yz.state.partition("test_ext", 0)
    assert p is not None and p.log.end_offset == 130  # the stats capture's topic depth


async def test_ext_rules_on_a_normal_topic(yz: Nodes) -> None:
    yz.topic("test_p2r2", 2, 2, channels=["ch1"])
    leader = yz.leader("test_p2r2", 0)
    producer = await yz.client(leader)
    header = b'{"k":"v"}'
    ext_pub = sized(b"PUB_EXT test_p2r2 0\n", struct.pack(">H", len(header)) + header + b"body")
    assert await producer.call(ext_pub) == \
        ErrorFrame(b"E_EXT_NOT_SUPPORT ext content not supported in topic test_p2r2")
    empty = sized(b"PUB_EXT test_p2r2 0\n", struct.pack(">H", 0) + b"body")
    assert await producer.call(empty) == \
        ErrorFrame(b"E_INVALID_JSON_HEADER fail to parse json header")
    bad_trace = b'{"##trace_id": 12}'
    traced = sized(b"PUB_EXT test_p2r2 0\n", struct.pack(">H", len(bad_trace)) + bad_trace + b"b")
    assert await producer.call(traced) == \
        ErrorFrame(b"INVALID_TRACE_ID passin trace id should be string")
    assert await producer.call(commands.pub("test_p2r2", b"still open", 0)) == Response(b"OK")
    consumer = await yz.client(leader, extend_support=True)
    assert await error_then_close(consumer, commands.sub("test_p2r2", "ch1", 0)) == \
        b"E_SUB_EXTEND_FORBIDDON this topic is not extended and should not identify as extend " \
        b"support."


async def test_desired_tag_dispatch(yz: Nodes) -> None:
    yz.topic("te", 1, 1, ext=True, channels=["c"])
    leader = yz.leader("te")
    tagged = await yz.client(leader, extend_support=True, desired_tag="blue")
    untagged = await yz.client(leader, extend_support=True)
    for client in (tagged, untagged):
        assert await client.call(commands.sub("te", "c", 0)) == Response(b"OK")
        client.expect(ext=True)
        client.send(commands.rdy(10))
    producer = await yz.client(leader, extend_support=True)
    await producer.call(commands.pub_ext("te", b"for-blue", {"##client_dispatch_tag": "blue"}, 0))
    await producer.call(commands.pub("te", b"for-anyone", 0))
    await producer.call(commands.pub_ext("te", b"for-red", {"##client_dispatch_tag": "red"}, 0))
    assert (await tagged.message()).body == b"for-blue"
    assert {(await untagged.message()).body for _ in range(2)} == {b"for-anyone", b"for-red"}


async def test_ext_filter_acknowledges_what_it_drops(yz: Nodes) -> None:
    yz.topic("te", 1, 1, ext=True, channels=["c"])
    leader = yz.leader("te")
    consumer = await yz.client(leader, extend_support=True, ext_filter={
        "type": 1, "filter_ext_key": "k", "filter_data": "yes"})
    await consumer.call(commands.sub("te", "c", 0))
    consumer.expect(ext=True)
    consumer.send(commands.rdy(5))
    producer = await yz.client(leader, extend_support=True)
    await producer.call(commands.pub_ext("te", b"dropped", {"k": "no"}, 0))
    await producer.call(commands.pub_ext("te", b"kept", {"k": "yes"}, 0))
    assert (await consumer.message()).body == b"kept"
    channel = yz.state.partition("te", 0).channels["c"]  # type: ignore[union-attr]
    assert isinstance(channel, Channel) and channel.depth == 0 and channel.in_flight == 1


# -- cluster events -----------------------------------------------------------------------------


async def test_leader_move_drops_subscribers_and_the_new_leader_redelivers(yz: Nodes) -> None:
    yz.topic("t", 1, 2, channels=["c"])
    old = yz.leader("t")
    consumer = await yz.client(old)
    await consumer.call(commands.sub("t", "c", 0))
    producer = await yz.client(old)
    await producer.call(commands.pub("t", b"moving", 0))
    consumer.send(commands.rdy(1))
    msg = await consumer.message()
    new = yz.node(yz.state.move_leader("t", 0))
    assert await consumer.closed()  # dropped, no error frame
    assert await producer.call(commands.pub("t", b"x", 0)) == \
        ErrorFrame(b"E_FAILED_ON_NOT_LEADER ")
    late = await yz.client(old)
    assert await error_then_close(late, commands.sub("t", "c", 0)) == b"E_FAILED_ON_NOT_LEADER "
    again = await yz.client(new)
    await again.call(commands.sub("t", "c", 0))
    again.send(commands.rdy(1))
    redelivered = await again.message()
    assert (redelivered.id, redelivered.attempts, redelivered.body) == (msg.id, 2, b"moving")


async def test_stopped_node_keeps_its_data_for_the_restart(yz: Nodes) -> None:
    yz.topic("t", channels=["c"])
    node = yz.leader("t")
    producer = await yz.client(node)
    await producer.call(commands.pub("t", b"kept", 0))
    await node.stop()
    assert await producer.closed()
    assert node.info is not None and not node.info.alive
    await node.start()
    consumer = await yz.client(node)
    await consumer.call(commands.sub("t", "c", 0))
    consumer.send(commands.rdy(1))
    assert (await consumer.message()).body == b"kept"


async def test_identify_answer_and_quirks(yz: Nodes) -> None:
    client = await RawClient.connect(yz.nodes[0].tcp_address)
    yz.clients.append(client)
    answer = await client.call(commands.identify({"feature_negotiation": True,
                                                   "output_buffer_timeout": 5}))
    assert isinstance(answer, Response)
    data = json.loads(answer.data)
    assert data["output_buffer_timeout"] == 10 and data["output_buffer_size"] == 100
    assert data["deflate_level"] == 0 and "desired_tag" not in data
    again = await client.call(commands.identify({"feature_negotiation": True,
                                                  "desired_tag": "blue"}))
    assert json.loads(again.data)["desired_tag"] == "blue"  # a second IDENTIFY is fine
    assert await client.call(commands.identify({"client_id": "x"})) == Response(b"OK")
    for body, text in ((b'{"heartbeat_interval": 500}',
                        b"E_BAD_BODY IDENTIFY heartbeat interval (500) is invalid"),
                       (b'{"msg_timeout": "x"}', b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
                       (b'{"desired_tag": "a b"}', b"E_BAD_BODY IDENTIFY invalid tag a b"),
                       (b'{"feature_negotiation": true, "snappy": true, "deflate": true}',
                        b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression")):
        bad = await RawClient.connect(yz.nodes[0].tcp_address)
        yz.clients.append(bad)
        assert await error_then_close(bad, sized(b"IDENTIFY\n", body)) == text


async def test_bad_magic(yz: Nodes) -> None:
    client = await yz.raw(yz.nodes[0], magic=b"  V1")
    assert await client.frame() == ErrorFrame(b"E_BAD_PROTOCOL")
    assert await client.closed()


async def test_connection_limit() -> None:
    async with running(1, max_connections=1) as yz:
        await yz.client(yz.nodes[0])
        second = await yz.raw(yz.nodes[0])
        assert await second.frame() == ErrorFrame(b"too much client connections")
        assert await second.closed()
