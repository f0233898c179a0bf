"""The library's HTTP client (smartnsq.transport.http) over real sockets: the dev cluster's
lookupd and nsqd, and the hostile peers of ``smartnsq.testing.hostile``.

Every request that may stall is wrapped in ``bounded``: it must end within its timeout + 1 s.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from support import bounded, wait_until

from smartnsq.errors import (
    AnswerTooLarge,
    ConnectionFailed,
    HttpConnectError,
    HttpTimeout,
    HttpTLSError,
    ProtocolError,
    Timeout,
)
from smartnsq.testing.hostile import DripLookupd, FakeLookupd, HugeLookupd, SilentLookupd
from smartnsq.transport.http import HttpClient

MIB = 1024 * 1024


class OneAnswerLookupd(FakeLookupd):
    """Answers one request per connection, then closes it without saying so beforehand (no
    ``Connection: close``), as a server whose keep-alive timer ran out does."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        self.requests.append(head.split(b"\r\n", 1)[0])
        await self.answer("/lookup", writer)


async def get(client: HttpClient, address: str, path: str = "/lookup?topic=t",
              timeout: float = 5.0, max_body: int = MIB) -> Any:
    return await client.request("GET", f"http://{address}{path}", timeout=timeout,
                                max_body=max_body)


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_the_dev_clusters_servers(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("orders")
    async with HttpClient(headers={"Accept": "application/vnd.nsq; version=1.0"}) as client:
        (lookupd,) = nsq_cluster.lookupd_http_addresses
        answer = await client.request("GET", f"http://{lookupd}/lookup", timeout=5,
                                      max_body=MIB, params={"topic": "orders", "access": "w"})
        assert answer.status == 200 and json.loads(answer.body)["partitions"]
        again = await get(client, lookupd, "/lookup?topic=nothing_here")  # the same connection
        assert again.keep_alive and json.loads(again.body)["producers"] == []
        (nsqd,) = nsq_cluster.nsqd_http_addresses
        stats = await client.request("GET", f"http://{nsqd}/stats", params={"format": "json"},
                                     timeout=5, max_body=16 * MIB)
        assert stats.status == 200 and "orders" in stats.body.decode()
        created = await client.request("POST", f"http://{nsqd}/channel/create",
                                       params={"topic": "orders", "channel": "c",
                                               "partition": "0"}, timeout=5, max_body=MIB)
        assert created.status == 200


async def test_requests_to_one_host_share_a_kept_connection() -> None:
    async with FakeLookupd() as lookupd, HttpClient() as client:
        for _ in range(3):
            answer = await get(client, lookupd.address)
            assert answer.status == 200 and answer.keep_alive
        assert lookupd.connections == 1 and len(lookupd.requests) == 3
        assert all(line.startswith(b"GET /lookup?topic=t HTTP/1.1")
                   for line in lookupd.requests)


async def test_a_kept_connection_the_server_closed_is_replaced() -> None:
    async with OneAnswerLookupd() as lookupd, HttpClient() as client:
        for _ in range(3):
            async with bounded(5.0):
                assert (await get(client, lookupd.address)).status == 200
        assert lookupd.connections == 3


@pytest.mark.parametrize("peer", [DripLookupd, SilentLookupd])
async def test_the_whole_request_has_one_deadline(peer: type) -> None:
    async with peer() as lookupd, HttpClient(connect_timeout=0.5) as client:
        async with bounded(1.0):
            with pytest.raises(HttpTimeout, match="no whole answer within 1s") as info:
                await get(client, lookupd.address, timeout=1.0)
        assert isinstance(info.value, Timeout) and info.value.peer == lookupd.address
        # the connection cut at the deadline is not reused: the next request dials again
        async with bounded(1.0):
            with pytest.raises(HttpTimeout):
                await get(client, lookupd.address, timeout=0.3)
        assert lookupd.connections == 2


async def test_a_huge_answer_is_cut_at_the_limit_with_bounded_memory() -> None:
    async with HugeLookupd(size=300 * MIB) as lookupd, HttpClient() as client:
        tracemalloc.start()
        try:
            with pytest.raises(AnswerTooLarge) as info:  # declared: refused before the body
                await get(client, lookupd.address, max_body=4 * MIB)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert info.value.declared is not None and info.value.declared > 4 * MIB
        assert isinstance(info.value, ProtocolError) and peak < 8 * MIB


async def test_a_refused_connection_names_the_peer_and_its_cause() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    async with HttpClient() as client:
        with pytest.raises(HttpConnectError, match=f"127.0.0.1:{port}: cannot connect") as info:
            await get(client, f"127.0.0.1:{port}")
    assert isinstance(info.value, ConnectionFailed) and info.value.__cause__ is not None


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture()
def https_files(ca: trustme.CA, tmp_path: Path) -> Iterator[tuple[ssl.SSLContext, str]]:
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    yield server, str(ca_file)


async def test_https(https_files: tuple[ssl.SSLContext, str]) -> None:
    server, ca_file = https_files
    async with FakeLookupd(ssl_context=server) as lookupd:
        url = f"https://{lookupd.address}/lookup?topic=t"
        async with HttpClient(tls_ca_file=ca_file) as client:
            for _ in range(2):
                answer = await client.request("GET", url, timeout=5, max_body=MIB)
                assert answer.status == 200
        assert lookupd.connections == 1  # kept over TLS too
        async with HttpClient() as client, bounded(5.0):  # the system store: not trusted
            with pytest.raises(HttpTLSError, match="certificate refused"):
                await client.request("GET", url, timeout=5, max_body=MIB)
        async with HttpClient(tls_verify=False) as client:
            assert (await client.request("GET", url, timeout=5, max_body=MIB)).status == 200


async def test_a_proxy_only_when_told_to_read_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async with FakeLookupd() as proxy:
        monkeypatch.setenv("HTTP_PROXY", f"http://{proxy.address}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.delenv("http_proxy", raising=False)
        async with HttpClient(trust_env=True) as client:
            assert (await get(client, "127.0.0.9:4161")).status == 200
        assert proxy.requests == [b"GET http://127.0.0.9:4161/lookup?topic=t HTTP/1.1"]
        monkeypatch.setenv("NO_PROXY", "127.0.0.9")
        async with HttpClient(trust_env=True) as client:
            with pytest.raises(HttpConnectError):  # asked directly: nobody listens there
                await get(client, "127.0.0.9:4161")
        async with HttpClient() as client:  # the default: the environment is not read
            with pytest.raises(HttpConnectError):
                await get(client, "127.0.0.9:4161")
        assert len(proxy.requests) == 1


async def test_a_cancelled_request_leaves_nothing_open() -> None:
    async with SilentLookupd() as lookupd, HttpClient() as client:
        task = asyncio.ensure_future(get(client, lookupd.address, timeout=30))
        await wait_until(lambda: bool(lookupd.requests))  # the request is on the wire
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with bounded(1.0):
            with pytest.raises(HttpTimeout):
                await get(client, lookupd.address, timeout=0.2)
        assert lookupd.connections == 2  # the cancelled exchange's connection was dropped


async def test_a_closed_client_refuses_requests_and_closes_kept_connections() -> None:
    async with FakeLookupd() as lookupd:
        client = HttpClient()
        await get(client, lookupd.address)
        await client.aclose()
        assert client.closed
        with pytest.raises(RuntimeError, match="closed"):
            await get(client, lookupd.address)
