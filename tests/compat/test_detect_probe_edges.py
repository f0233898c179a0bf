"""Kind detection on odd answers, the probe's fall-back to ``/info``, and compat's lazy names.

Detection decides from what a server said and nothing else: answers that are not what a
lookupd normally sends (no partitions, partial peers, malformed ids, no version) must give
a verdict that errs on "unknown", never a guess; a ``/listlookup`` that proves nothing (a
5xx, a proxy's page) sends the probe on to ``/info``, and when that proves nothing too the
lookupd is unknown. The HTTP answers come from a small server on loopback that answers as
the case needs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

import smartnsq.compat as compat
from smartnsq.compat import pynsq
from smartnsq.compat.detect import (
    Kind,
    classify_lookup,
    kind_of_identify,
    kind_of_listlookup,
    kind_of_lookup,
    kind_of_node,
)
from smartnsq.compat.probe import LookupdGroups, group_lookupds, probe_lookupd
from smartnsq.protocol.lookup import Node
from smartnsq.protocol.responses import IdentifyResponse

YOUZAN_VERSION = "0.3.7-HA.1.13.0"


def peer(host: str, port: Any, version: Any = "1.3.0") -> dict[str, Any]:
    return {"broadcast_address": host, "tcp_port": port, "version": version}


# -- detect ------------------------------------------------------------------------------------

def test_kind_reads_as_its_value() -> None:
    assert str(Kind.YOUZAN) == "youzan" and f"{Kind.CLASSIC}" == "classic"
    assert Kind("classic") is Kind.CLASSIC


def test_a_lookup_answer_must_be_an_object() -> None:
    for body in ([], "text", None, {"status_code": 200, "status_txt": "OK", "data": [1]}):
        with pytest.raises(ValueError, match="JSON object"):
            kind_of_lookup(body)


def test_a_partition_less_answer_listing_only_youzan_nodes_is_youzan() -> None:
    """Youzan's migrate proxy leaves out an empty ``partitions``: its ``-HA.`` nodes tell."""
    only_youzan = {"channels": [], "producers": [peer("10.0.0.1", 4150, YOUZAN_VERSION)]}
    assert kind_of_lookup(only_youzan) is Kind.YOUZAN
    both = {"producers": [peer("10.0.0.1", 4150, YOUZAN_VERSION), peer("10.0.0.2", 4150)]}
    assert kind_of_lookup(both) is Kind.CLASSIC
    assert kind_of_lookup({"producers": ["not a peer", peer("h", 1, None)]}) is Kind.CLASSIC
    assert kind_of_lookup({"meta": {"partition_num": 2}}) is Kind.YOUZAN


def test_listlookup_success_proves_youzan_only_by_its_fields() -> None:
    assert kind_of_listlookup(200, {"lookupdleader": {"NodeIP": "10.0.0.1"}}) is Kind.YOUZAN
    assert kind_of_listlookup(200, {"something": "else"}) is None  # a proxy's JSON
    assert kind_of_listlookup(204, "html page") is None
    assert kind_of_listlookup(301, None) is None


def test_identify_and_nodes_without_a_version_tell_nothing() -> None:
    assert kind_of_identify(IdentifyResponse()) is None  # plain OK: nothing negotiated
    assert kind_of_identify(IdentifyResponse(negotiated=True, version="1.3.0")) is Kind.CLASSIC
    assert kind_of_identify(IdentifyResponse(negotiated=True, version=YOUZAN_VERSION)) \
        is Kind.YOUZAN
    assert kind_of_identify({"version": 130}) is None
    assert kind_of_identify(bytearray(b"OK")) is None and kind_of_identify(None) is None
    assert kind_of_node(Node("10.0.0.1", 4150, 4151)) is None
    assert kind_of_node(Node("10.0.0.1", 4150, 4151, version="1.2.1")) is Kind.CLASSIC
    assert kind_of_node(Node("10.0.0.1", 4150, 4151, version=YOUZAN_VERSION)) is Kind.YOUZAN


def test_classify_skips_what_cannot_be_addressed_or_numbered() -> None:
    body = {
        "partitions": {
            "0": peer("10.0.0.1", 4150, YOUZAN_VERSION),
            "1": "not a peer",                                  # skipped
            "x": peer("10.0.0.9", 4150, YOUZAN_VERSION),        # no partition number
            "-1": peer("10.0.0.3", 4150, YOUZAN_VERSION),       # not a real partition
            "2": peer("", 4150, YOUZAN_VERSION),                # no address: no leader
        },
        "producers": [
            peer("10.0.0.1", 4150, YOUZAN_VERSION),             # listed twice: once
            peer("10.0.0.4", "4150"),                           # port not a number
            peer("10.0.0.5", 4150, None),                       # no version: unknown
            peer("10.0.0.6", 4150, 12),                         # version not text
            peer("10.0.0.3", 4150, None),                       # unknown, but known above
            "junk",
        ],
    }
    split = classify_lookup(body)
    assert split.lookupd is Kind.YOUZAN
    assert split.partitions == {0: "10.0.0.1:4150"}
    assert split.youzan_nodes == ("10.0.0.1:4150", "10.0.0.3:4150")
    assert split.classic_nodes == ()
    assert split.unknown_nodes == ("10.0.0.5:4150", "10.0.0.6:4150")
    assert not split.mixed


def test_classify_a_partitions_value_that_is_not_a_map() -> None:
    split = classify_lookup({"partitions": ["0"], "producers": [peer("10.0.0.2", 4150)]})
    assert split.lookupd is Kind.YOUZAN and split.partitions == {}
    assert split.classic_nodes == ("10.0.0.2:4150",)


# -- probe ---------------------------------------------------------------------------------------

Answer = tuple[int, str]


@pytest.fixture
async def fake_lookupd() -> AsyncIterator[Callable[[dict[str, Answer]], Awaitable[str]]]:
    """Start HTTP servers on loopback answering ``{path: (status, body)}`` (404 otherwise);
    each call gives the ``host:port`` of a new one."""
    servers: list[asyncio.Server] = []

    async def serve(routes: dict[str, Answer], reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode().split("?", 1)[0]
                status, body = routes.get(path, (404, '{"message":"NOT_FOUND"}'))
                data = body.encode()
                writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (status, len(data), data))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def start_async(routes: dict[str, Answer]) -> str:
        server = await asyncio.start_server(lambda r, w: serve(routes, r, w), "127.0.0.1", 0)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    yield start_async
    for server in servers:
        server.close()
        await server.wait_closed()


async def test_a_listlookup_proving_nothing_falls_back_to_info(fake_lookupd: Any) -> None:
    classic = await fake_lookupd({"/listlookup": (500, '{"message":"INTERNAL_ERROR"}'),
                                  "/info": (200, json.dumps({"version": "1.2.1"}))})
    youzan = await fake_lookupd({"/listlookup": (502, "<html>bad gateway</html>"),
                                 "/info": (200, json.dumps({"version": YOUZAN_VERSION}))})
    with_ha = await fake_lookupd({"/listlookup": (200, "<html>a proxy page</html>"),
                                  "/info": (200, json.dumps({"version": "1.0.0",
                                                             "ha_support": True}))})
    assert await probe_lookupd(classic) is Kind.CLASSIC
    assert await probe_lookupd(youzan) is Kind.YOUZAN
    assert await probe_lookupd(with_ha) is Kind.YOUZAN


async def test_a_lookupd_answering_neither_is_unknown(fake_lookupd: Any) -> None:
    broken = await fake_lookupd({"/listlookup": (500, "{}"), "/info": (503, "{}")})
    odd = await fake_lookupd({"/listlookup": (500, "{}"), "/info": (200, "[1, 2]")})
    assert await probe_lookupd(broken) is None
    assert await probe_lookupd(odd) is None
    groups = await group_lookupds([broken, odd, broken])
    assert groups == LookupdGroups(youzan=(), classic=(), unknown=(broken, odd))
    assert not groups.mixed


# -- the package's lazy names ----------------------------------------------------------------------

def test_compat_exports_pynsq_names_lazily() -> None:
    assert compat.Reader is pynsq.Reader and compat.Writer is pynsq.Writer
    assert compat.run is pynsq.run and compat.stop is pynsq.stop
    assert compat.Message is pynsq.Message and compat.Error is pynsq.Error
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        compat.Nope  # noqa: B018
    assert set(compat.__all__) >= {"Reader", "Writer", "run", "stop", "ClassicPolicy"}
