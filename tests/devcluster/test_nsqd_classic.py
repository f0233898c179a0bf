"""Classic nsqd 1.3 mode over real sockets: what the captures in tests/fixtures/classic show."""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator

import pytest
from nsqd_helpers import Nodes, RawClient, error_then_close, running

from smartnsq.protocol import commands
from smartnsq.protocol.frames import HEARTBEAT, ErrorFrame, Response

AUTH = {
    "goodsecret": {"identity": "x", "identity_url": "",
                   "authorizations": [{"topic": "^allowed_.*$", "channels": [".*"],
                                       "permissions": ["subscribe", "publish"]}]},
    "noperms": {"identity": "y", "authorizations": []},
}


@pytest.fixture
async def cl() -> AsyncIterator[Nodes]:
    async with running(1, classic=True) as nodes:
        yield nodes


async def test_identify_answer_is_classic(cl: Nodes) -> None:
    client = await RawClient.connect(cl.nodes[0].tcp_address)
    cl.clients.append(client)
    answer = await client.call(commands.identify({
        "client_id": "rawpy", "hostname": "rawpy-host", "feature_negotiation": True,
        "heartbeat_interval": 30000, "user_agent": "rawnsq.py/0.1", "msg_timeout": 60000}))
    assert answer == Response(
        b'{"max_rdy_count":2500,"version":"1.3.0","max_msg_timeout":900000,"msg_timeout":60000,'
        b'"tls_v1":false,"deflate":false,"deflate_level":6,"max_deflate_level":6,"snappy":false,'
        b'"sample_rate":0,"auth_required":false,"output_buffer_size":16384,'
        b'"output_buffer_timeout":250}')
    assert await client.call(commands.identify({})) == Response(b"OK")  # a second one is fine
    for body, text in ((b'{"heartbeat_interval": 500}',
                        b"E_BAD_BODY IDENTIFY heartbeat interval (500) is invalid"),
                       (b'{"msg_timeout": 900001}',
                        b"E_BAD_BODY IDENTIFY msg timeout (900001) is invalid"),
                       (b"{not json", b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
                       (b'{"output_buffer_timeout": 5}',
                        b"E_BAD_BODY IDENTIFY output buffer timeout (5) is invalid")):
        bad = await cl.raw(cl.nodes[0])
        assert await error_then_close(bad, b"IDENTIFY\n" + struct.pack(">i", len(body)) +
                                      body) == text
    client = await cl.raw(cl.nodes[0])
    answer = await client.call(commands.identify({"feature_negotiation": True,
                                                   "heartbeat_interval": -1,
                                                   "output_buffer_timeout": -1}))
    assert json.loads(answer.data)["output_buffer_timeout"] == 0


async def test_pub_sub_with_hex_ids_and_extra_partition_tokens(cl: Nodes) -> None:
    node = cl.nodes[0]
    producer = await cl.client(node)
    assert await producer.call(commands.pub("cl_topic", b"before-any-channel", 0)) == \
        Response(b"OK")  # PUB T 0: the token is ignored, the topic created on first use
    info = cl.state.topics["cl_topic"]
    assert info.classic and [p.leader for p in info.partitions] == [node.node_id]
    assert await producer.call(b"MPUB cl_topic 0\n" + struct.pack(">iii", 13, 1, 5) + b"mpub1"
                               ) == Response(b"OK")
    consumer = await cl.client(node)
    assert await consumer.call(b"SUB cl_topic ch1 0\n") == Response(b"OK")
    consumer.send(commands.rdy(2))
    first, second = await consumer.message(), await consumer.message()
    # the first channel gets what the topic kept while it had none
    assert (first.body, second.body) == (b"before-any-channel", b"mpub1")
    assert len(first.id) == 16 and int(first.id, 16) >= 0
    consumer.send(commands.touch(first.id) + commands.fin(first.id) + commands.req(second.id, 0))
    again = await consumer.message()
    assert (again.id, again.attempts, again.timestamp) == (second.id, 2, second.timestamp)
    late = await cl.client(node)
    await late.call(commands.sub("cl_topic", "ch2"))  # a later channel starts at the end
    late.send(commands.rdy(1))
    await producer.call(commands.pub("cl_topic", b"new"))
    assert (await late.message()).body == b"new"


async def test_fin_failures_are_non_fatal_and_bad_ids_fatal(cl: Nodes) -> None:
    consumer = await cl.client(cl.nodes[0])
    await consumer.call(commands.sub("cl_finfail", "ch1"))
    assert await consumer.call(b"FIN 0123456789abcdef\n") == \
        ErrorFrame(b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight")
    assert await consumer.call(b"REQ 0123456789abcdef 0\n") == \
        ErrorFrame(b"E_REQ_FAILED REQ 0123456789abcdef failed ID not in flight")
    assert await consumer.call(b"TOUCH 0123456789abcdef\n") == \
        ErrorFrame(b"E_TOUCH_FAILED TOUCH 0123456789abcdef failed ID not in flight")
    assert await error_then_close(consumer, b"FIN 01234567\n") == b"E_INVALID invalid message ID"


async def test_youzan_only_commands_are_unknown(cl: Nodes) -> None:
    for command in (commands.sub_ordered("cl_topic", "ch1", 0),
                    commands.pub_trace("cl_topic", b"hello-trace", 1, 0)):
        client = await cl.client(cl.nodes[0])
        name = command.split(b" ")[0]
        assert await error_then_close(client, command) == b"E_INVALID invalid command " + name


async def test_errors_with_classic_texts(cl: Nodes) -> None:
    node = cl.nodes[0]
    cases = [
        (b"PUB bad*name\n\x00\x00\x00\x01x", b'E_BAD_TOPIC PUB topic name "bad*name" is not valid'),
        (b"SUB bad*name ch1\n", b'E_BAD_TOPIC SUB topic name "bad*name" is not valid'),
        (b"SUB cl_topic bad*chan\n", b'E_BAD_CHANNEL SUB channel name "bad*chan" is not valid'),
        (b"PUB cl_topic\n" + struct.pack(">i", 1048577),
         b"E_BAD_MESSAGE PUB message too big 1048577 > 1048576"),
        (b"PUB cl_topic\n" + struct.pack(">i", 0),
         b"E_BAD_MESSAGE PUB invalid message body size 0"),
        (b"MPUB cl_topic\n" + struct.pack(">i", 5242881),
         b"E_BAD_BODY MPUB body too big 5242881 > 5242880"),
        (b"MPUB cl_topic\n" + struct.pack(">iii", 1048590, 1, 1048577),
         b"E_BAD_MESSAGE MPUB message too big 1048577 > 1048576"),
        (b"MPUB cl_topic\n" + struct.pack(">ii", 4, 0), b"E_BAD_BODY MPUB invalid message count 0"),
        (b"DPUB cl_dpub 3600001\n\x00\x00\x00\x01x",
         b"E_INVALID DPUB timeout 3600001 out of range 0-3600000"),
        (commands.rdy(1), b"E_INVALID cannot RDY in current state"),
        (commands.cls(), b"E_INVALID cannot CLS in current state"),
    ]
    for command, text in cases:
        client = await cl.client(node)
        assert await error_then_close(client, command) == text
    client = await cl.client(node)
    await client.call(commands.sub("cl_rdy", "ch1"))
    client.send(b"RDY 2500\n" + b"RDY 0\n")
    assert await error_then_close(client, b"RDY 2501\n") == \
        b"E_INVALID RDY count 2501 out of range 0-2500"


async def test_cls_leaves_the_socket_open(cl: Nodes) -> None:
    node = cl.nodes[0]
    consumer = await cl.client(node)
    await consumer.call(commands.sub("cl_cls", "ch1"))
    producer = await cl.client(node)
    await producer.call(commands.pub("cl_cls", b"cls-msg"))
    consumer.send(commands.rdy(1))
    msg = await consumer.message()
    assert await consumer.call(commands.cls()) == Response(b"CLOSE_WAIT")
    consumer.send(commands.fin(msg.id))
    assert await consumer.call(b"FIN 0123456789abcdef\n") == \
        ErrorFrame(b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight")


async def test_dpub_and_req_with_delay_come_back_later(cl: Nodes) -> None:
    node = cl.nodes[0]
    consumer = await cl.client(node)
    await consumer.call(commands.sub("cl_dpub", "ch1"))
    consumer.send(commands.rdy(5))
    producer = await cl.client(node)
    assert await producer.call(commands.dpub("cl_dpub", 50, b"deferred")) == Response(b"OK")
    await producer.call(commands.pub("cl_dpub", b"now"))
    assert (await consumer.message()).body == b"now"
    deferred = await consumer.message()
    assert (deferred.body, deferred.attempts) == (b"deferred", 1)
    consumer.send(commands.req(deferred.id, 30))
    again = await consumer.message()
    assert (again.id, again.attempts) == (deferred.id, 2)
    consumer.send(b"REQ " + again.id + b" 3600001\n")  # out of range: clamped, no error
    assert await producer.call(commands.pub("cl_dpub", b"after")) == Response(b"OK")
    assert (await consumer.message()).body == b"after"


async def test_classic_leaves_a_gone_consumers_messages_in_flight_until_timeout() -> None:
    async with running(1, classic=True, msg_timeout=100) as cl:
        node = cl.nodes[0]
        first = await cl.client(node, msg_timeout=0)
        await first.call(commands.sub("t", "c"))
        producer = await cl.client(node)
        await producer.call(commands.pub("t", b"x"))
        first.send(commands.rdy(1))
        msg = await first.message()
        first.close()
        second = await cl.client(node)
        await second.call(commands.sub("t", "c"))
        second.send(commands.rdy(1))
        again = await second.message()  # only after the 100 ms in-flight timeout
        assert (again.id, again.attempts) == (msg.id, 2)
        channel = cl.state.topics["t"].partitions[0].channels["c"]
        assert channel.timeout_count == 1


async def test_heartbeat_deadline_is_two_intervals() -> None:
    async with running(1, classic=True, heartbeat_interval=50) as cl:
        client = await cl.client(cl.nodes[0], heartbeat_interval=0)
        assert await client.frame() is HEARTBEAT
        assert await client.closed()


async def test_pub_and_sub_without_identify_and_nop(cl: Nodes) -> None:
    client = await cl.raw(cl.nodes[0])
    client.send(commands.nop())
    assert await client.call(commands.pub("cl_topic", b"no-identify")) == Response(b"OK")
    assert await client.call(commands.sub("cl_topic", "ch_noid")) == Response(b"OK")


async def test_auth_flow_and_errors() -> None:
    async with running(1, classic=True, auth=AUTH) as cl:
        node = cl.nodes[0]
        client = await RawClient.connect(node.tcp_address)
        cl.clients.append(client)
        answer = await client.call(commands.identify({"feature_negotiation": True}))
        assert json.loads(answer.data)["auth_required"] is True
        assert await client.call(commands.auth("goodsecret")) == \
            Response(b'{"identity":"x","identity_url":"","permission_count":1}')
        assert await client.call(commands.pub("allowed_t", b"authed-pub")) == Response(b"OK")
        assert await client.call(commands.sub("allowed_t", "ch1")) == Response(b"OK")
        cases = [
            ([commands.auth("goodsecret"), commands.pub("other_t", b"x")],
             b'E_UNAUTHORIZED AUTH failed for PUB on "other_t" ""'),
            ([commands.auth("goodsecret"), commands.sub("other_t", "ch1")],
             b'E_UNAUTHORIZED AUTH failed for SUB on "other_t" "ch1"'),
            ([commands.pub("allowed_t", b"x")], b"E_AUTH_FIRST AUTH required before PUB"),
            ([commands.sub("allowed_t", "ch1")], b"E_AUTH_FIRST AUTH required before SUB"),
            ([commands.auth("badsecret")], b"E_AUTH_FAILED AUTH failed"),
            ([commands.auth("noperms")], b"E_UNAUTHORIZED AUTH no authorizations found"),
            ([commands.auth("goodsecret"), commands.auth("goodsecret")],
             b"E_INVALID AUTH already set"),
        ]
        for sequence, text in cases:
            client = await cl.client(node)
            for command in sequence[:-1]:
                assert isinstance(await client.call(command), Response)
            assert await error_then_close(client, sequence[-1]) == text
        early = await cl.raw(node)  # AUTH before IDENTIFY is accepted
        assert isinstance(await early.call(commands.auth("goodsecret")), Response)


async def test_auth_on_a_node_without_auth(cl: Nodes) -> None:
    client = await cl.client(cl.nodes[0])
    assert await error_then_close(client, commands.auth("goodsecret")) == \
        b"E_AUTH_DISABLED AUTH disabled"


async def test_youzan_auth_texts() -> None:
    async with running(1, auth=AUTH) as yz:
        client = await yz.client(yz.nodes[0])
        assert await error_then_close(client, commands.auth("noperms")) == \
            b"E_UNAUTHORIZED AUTH No authorizations found"
