"""nsqd's HTTP API (youzan and classic) with httpx, against the http_nsqd_* captures."""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from nsqd_helpers import FIXTURES, Nodes, running

from smartnsq.devcluster.nsqd.channels import Channel
from smartnsq.protocol import commands
from smartnsq.protocol.frames import Response

V1 = {"Accept": "application/vnd.nsq; version=1.0"}


@pytest.fixture
async def yz() -> AsyncIterator[Nodes]:
    async with running(3) as nodes:
        yield nodes


@pytest.fixture
async def cl() -> AsyncIterator[Nodes]:
    async with running(1, classic=True) as nodes:
        yield nodes


def captured(path: Path) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (lower-cased) and body of a capture's response."""
    lines = path.read_text().split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("HTTP/1.1"))
    status = int(lines[start].split()[1])
    headers = {}
    i = start + 1
    while lines[i].strip():
        key, _, value = lines[i].partition(":")
        headers[key.strip().lower()] = value.strip()
        i += 1
    return status, headers, "\n".join(lines[i + 1:]).strip("\n").encode()


def base(node: object) -> str:
    return f"http://{node.http_address}"  # type: ignore[attr-defined]


# -- youzan ---------------------------------------------------------------------------------


async def test_youzan_ping_info(yz: Nodes) -> None:
    node = yz.nodes[0]
    async with httpx.AsyncClient() as client:
        ping = await client.get(f"{base(node)}/ping")
        assert (ping.status_code, ping.text) == (200, "OK")
        info = (await client.get(f"{base(node)}/info", headers=V1)).json()
        expected = json.loads(captured(FIXTURES / "youzan/http_nsqd_info_v1.txt")[2])
        assert list(info) == list(expected)
        assert info["version"] == "0.3.7-HA.1.13.0" and info["ha_support"] is True
        assert (info["tcp_port"], info["http_port"]) == (node.tcp_port, node.http_port)
        wrapped = (await client.get(f"{base(node)}/info")).json()
        assert wrapped["status_code"] == 200 and wrapped["data"] == info


async def test_youzan_pub_pubtrace_pub_ext_mpub(yz: Nodes) -> None:
    yz.topic("t", 2, 1, channels=["c"])
    yz.topic("te", 1, 1, ext=True, channels=["c"])
    leader = yz.leader("t", 1)
    async with httpx.AsyncClient(headers=V1) as client:
        url = base(leader)
        resp = await client.post(f"{url}/pub", params={"topic": "t", "partition": "1"},
                                 content=b"x")
        assert (resp.status_code, resp.text) == (200, "OK")
        resp = await client.post(f"{url}/pub", params={"topic": "t"}, content=b"default")
        assert resp.status_code == 200  # the partition this node leads
        resp = await client.post(f"{url}/pubtrace",
                                 params={"topic": "t", "partition": "1", "trace_id": "99"},
                                 content=b"traced")
        assert resp.json() == {"status": "OK", "id": (1 << 50) | 4, "trace_id": "99",
                               "queue_offset": 68, "rawsize": 36}
        resp = await client.post(f"{url}/pubtrace", params={"topic": "t", "trace_id": "x"},
                                 content=b"x")
        assert (resp.status_code, resp.json()) == (400, {"message": "INVALID_TRACE_ID"})
        resp = await client.post(f"{url}/mpub", params={"topic": "t", "partition": "1"},
                                 content=b"a\nb\n\nc")
        assert (resp.status_code, resp.text) == (200, "OK")
        binary = struct.pack(">ii", 1, 3) + b"bin"
        resp = await client.post(f"{url}/mpub", params={"topic": "t", "binary": "true"},
                                 content=binary)
        assert resp.status_code == 200
        resp = await client.post(f"{url}/pub", params={"topic": "t", "partition": "1"})
        assert (resp.status_code, resp.json()) == (406, {"message": "MSG_EMPTY"})
        resp = await client.post(f"{url}/pub", params={"topic": "nope"}, content=b"x")
        assert (resp.status_code, resp.json()) == (404, {"message": "E_TOPIC_NOT_EXIST"})
        other = yz.leader("t", 0)
        resp = await client.post(f"{base(other)}/pub", params={"topic": "t", "partition": "1"},
                                 content=b"x")
        assert resp.status_code in (400, 404)
        resp = await client.post(f"{url}/pub_ext", params={"topic": "t", "ext": '{"k":"v"}'},
                                 content=b"x")
        assert (resp.status_code, resp.json()) == (400, {"message": "E_EXT_NOT_SUPPORT"})
        ext_leader = yz.leader("te")
        resp = await client.post(f"{base(ext_leader)}/pub_ext",
                                 params={"topic": "te", "ext": '{"##trace_id":"7"}'},
                                 headers={"X-Nsqext-Color": "red"}, content=b"x")
        assert resp.json()["trace_id"] == "7"
    p1 = yz.state.partition("t", 1)
    assert p1 is not None and [m.body for m in p1.log.messages] == \
        [b"x", b"default", b"traced", b"a", b"b", b"c", b"bin"]
    pe = yz.state.partition("te", 0)
    assert pe is not None and pe.log.messages[0].ext == b'{"##trace_id":"7","color":"red"}'


async def test_youzan_channel_admin(yz: Nodes) -> None:
    yz.topic("test_ordered", 2, 1, ordered=True)
    p1 = yz.state.partition("test_ordered", 1)
    assert p1 is not None
    leader = yz.leader("test_ordered", 1)
    other = next(n for n in yz.nodes if n is not leader)
    async with httpx.AsyncClient() as client:
        params = {"topic": "test_ordered", "channel": "och", "partition": "1"}
        resp = await client.post(f"{base(other)}/channel/create", params=params)
        assert resp.status_code in (400, 404)
        resp = await client.post(f"{base(leader)}/channel/create", params=params)
        status, headers, body = captured(
            FIXTURES / "youzan/http_nsqd_channel_create_ordered_p1.txt")
        assert (resp.status_code, resp.content) == (status, body)
        assert resp.headers["x-nsq-content-type"] == headers["x-nsq-content-type"]
        assert isinstance(p1.channels["och"], Channel)
        for body in (b"a", b"b", b"c"):
            p1.log.append(body)
        resp = await client.post(f"{base(leader)}/channel/setoffset", params=params,
                                 content=b"msgcount:2")  # from 1: the second message
        assert resp.status_code == 200 and p1.channels["och"].cursor == 1
        resp = await client.post(f"{base(leader)}/channel/setoffset", params=params,
                                 content=b"later:1")
        assert (resp.status_code, resp.json()) == \
            (400, {"message": "invalid consume offset:later:1"})
        resp = await client.post(f"{base(leader)}/channel/empty", params=params)
        assert resp.status_code == 200 and p1.channels["och"].depth == 0
        resp = await client.post(f"{base(leader)}/channel/delete", params=params)
        assert resp.status_code == 200 and "och" not in p1.channels


async def test_youzan_channel_create_on_a_non_leader_as_captured(yz: Nodes) -> None:
    yz.topic("test_ordered", 2, 2, ordered=True)
    p1 = yz.state.partition("test_ordered", 1)
    assert p1 is not None
    replica = yz.node(next(r for r in p1.replicas if r != p1.leader))
    async with httpx.AsyncClient() as client:
        resp = await client.post(f"{base(replica)}/channel/create",
                                 params={"topic": "test_ordered", "channel": "och",
                                         "partition": "1"})
    status, headers, body = captured(
        FIXTURES / "youzan/http_nsqd_channel_create_on_nonleader.txt")
    assert (resp.status_code, resp.content) == (status, body)
    assert resp.headers["content-type"] == headers["content-type"]


async def test_youzan_stats(yz: Nodes) -> None:
    yz.topic("test_ordered", 2, 1, ordered=True, channels=["och"])
    leader = yz.leader("test_ordered", 0)
    consumer = await yz.client(leader)
    await consumer.call(commands.sub_ordered("test_ordered", "och", 0))
    producer = await yz.client(leader)
    await producer.call(commands.pub("test_ordered", b"ordered-0", 0))
    async with httpx.AsyncClient(headers=V1) as client:
        resp = await client.get(f"{base(leader)}/stats",
                                params={"format": "json", "topic": "test_ordered"})
    got = resp.json()
    expected = json.loads(captured(FIXTURES / "youzan/http_nsqd_stats_json_topic_v1.txt")[2])
    assert list(got) == list(expected)
    topic, want = got["topics"][0], expected["topics"][0]
    assert list(topic) == list(want)
    assert list(topic["channels"][0]) == list(want["channels"][0])
    assert (topic["topic_full_name"], topic["statsd_name"], topic["is_multi_ordered"],
            topic["is_leader"], topic["depth"], topic["message_count"]) == \
        ("test_ordered-0", "test_ordered.0", True, True, 39, 1)
    channel = topic["channels"][0]
    assert (channel["depth"], channel["client_num"], channel["clients"][0]["ready_count"]) == \
        (1, 1, 0)


# -- classic --------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "method", "target", "body"), [
    ("http_nsqd_ping.txt", "GET", "/ping", b""),
    ("http_nsqd_pub.txt", "POST", "/pub?topic=cl_topic", b"http-pub-1"),
    ("http_nsqd_pub_v1.txt", "POST", "/pub?topic=cl_topic", b"http-pub-2"),
    ("http_nsqd_pub_defer.txt", "POST", "/pub?topic=cl_topic&defer=1000", b"http-pub-deferred"),
    ("http_nsqd_mpub.txt", "POST", "/mpub?topic=cl_topic",
     b"http-mpub-a\nhttp-mpub-b\nhttp-mpub-c"),
    ("http_nsqd_mpub_binary.txt", "POST", "/mpub?topic=cl_topic&binary=true",
     bytes.fromhex("000000020000000d62696e2d6d7075622d610a78780000000a62696e2d6d7075622d62")),
    ("http_nsqd_mpub_binary_bad.txt", "POST", "/mpub?topic=cl_topic&binary=true",
     bytes.fromhex("0000000200000032") + b"short"),
    ("http_nsqd_pub_bad_topic.txt", "POST", "/pub?topic=bad*name", b"x"),
    ("http_nsqd_pub_missing_topic.txt", "POST", "/pub", b"x"),
    ("http_nsqd_pub_empty_body.txt", "POST", "/pub?topic=cl_topic", b""),
    ("http_nsqd_pub_get_method.txt", "GET", "/pub?topic=cl_topic", b""),
    ("http_nsqd_topic_create.txt", "POST", "/topic/create?topic=cl_created", b""),
    ("http_nsqd_channel_create.txt", "POST", "/channel/create?topic=cl_created&channel=chc", b""),
])
async def test_classic_http_as_captured(cl: Nodes, name: str, method: str, target: str,
                                        body: bytes) -> None:
    status, headers, expected = captured(FIXTURES / "classic" / name)
    async with httpx.AsyncClient() as client:
        resp = await client.request(method, f"{base(cl.nodes[0])}{target}", content=body)
    assert (resp.status_code, resp.content) == (status, expected)
    for header in ("content-type", "x-nsq-content-type", "allow"):
        assert resp.headers.get(header) == headers.get(header), header


async def test_classic_info_and_stats(cl: Nodes) -> None:
    node = cl.nodes[0]
    consumer = await cl.client(node, client_id="stats-consumer")
    await consumer.call(commands.sub("cl_topic", "ch1"))
    consumer.send(commands.rdy(1))
    producer = await cl.client(node)
    assert await producer.call(commands.pub("cl_topic", b"x")) == Response(b"OK")
    await consumer.message()
    async with httpx.AsyncClient() as client:
        info = (await client.get(f"{base(node)}/info")).json()
        stats = (await client.get(f"{base(node)}/stats",
                                  params={"format": "json", "topic": "cl_topic",
                                          "channel": "ch1"})).json()
        text = (await client.get(f"{base(node)}/stats")).text
    want_info = json.loads(captured(FIXTURES / "classic/http_nsqd_info_v1.txt")[2])
    assert list(info) == list(want_info) and info["max_heartbeat_interval"] == 60_000_000_000
    want = json.loads(captured(FIXTURES / "classic/http_nsqd_stats_json_topic.txt")[2])
    assert list(stats) == list(want)
    topic = stats["topics"][0]
    assert list(topic) == list(want["topics"][0])
    channel = topic["channels"][0]
    assert list(channel) == list(want["topics"][0]["channels"][0])
    assert (channel["in_flight_count"], channel["client_count"]) == (1, 1)
    assert list(channel["clients"][0]) == list(want["topics"][0]["channels"][0]["clients"][0])
    assert channel["clients"][0]["client_id"] == "stats-consumer"
    assert "[cl_topic" in text and "Producers: None" in text
