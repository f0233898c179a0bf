"""A wrong address gives an error that says what answered and which port was
probably meant, over real sockets: nsqd's TCP or HTTP port or a web server given as a lookupd,
nsqlookupd's HTTP port given as an nsqd. No answer body reaches an error or the log."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from support import bounded

from smartnsq import Producer
from smartnsq.errors import NSQError
from smartnsq.testing.hostile import _Peer

PAGE = (b"<!DOCTYPE html>\r\n<html>\r\n<head><title>Welcome</title></head>\r\n<body>\r\n"
        + b"<p>secret-ish page content</p>\r\n" * 200 + b"</body>\r\n</html>\r\n")


class WebServer(_Peer):
    """Answers every HTTP request with an HTML page (``status``), keeping the connection."""

    def __init__(self, status: int = 200) -> None:
        super().__init__()
        self.status = status

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(f"HTTP/1.1 {self.status} X\r\nContent-Type: text/html\r\n"
                         f"Content-Length: {len(PAGE)}\r\n\r\n".encode() + PAGE)
            await writer.drain()


async def publish_error(caplog: pytest.LogCaptureFixture, **where: Any) -> str:
    """The error of a publish through ``where`` (lookupd= or nsqd=), with its causes, checking
    that neither it nor any library log line carries the answer's body."""
    caplog.set_level(logging.DEBUG, logger="smartnsq")
    async with Producer(**where, connect_timeout=1.0) as p:
        with pytest.raises(NSQError) as info:
            async with bounded(1.5):
                await p.publish("t", b"x", timeout=1.5)
    error: BaseException | None = info.value
    texts: list[str] = []
    seen: set[int] = set()
    while error is not None:
        assert id(error) not in seen, f"a loop of causes: {texts}"
        seen.add(id(error))
        texts.append(str(error))
        error = error.__cause__
    text = " <- ".join(texts)
    for record in caplog.records:
        if record.name.startswith("smartnsq"):
            line = record.getMessage()
            assert "\n" not in line and "secret-ish" not in line, line
    assert "secret-ish" not in text and "\n" not in text
    return text


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_nsqds_tcp_port_given_as_a_lookupd(nsq_cluster: Any,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    text = await publish_error(caplog, lookupd=nsq_cluster.nsqd_tcp_addresses[:1])
    assert "nsqd's TCP port (usually 4150)" in text
    assert "nsqlookupd's HTTP port (usually 4161)" in text


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_nsqds_http_port_given_as_a_lookupd(nsq_cluster: Any,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    text = await publish_error(caplog, lookupd=nsq_cluster.nsqd_http_addresses[:1])
    assert "nsqd's HTTP port (usually 4151)" in text
    assert "nsqlookupd's HTTP port (usually 4161)" in text


@pytest.mark.parametrize("status", [200, 404])
async def test_a_web_server_given_as_a_lookupd(status: int,
                                               caplog: pytest.LogCaptureFixture) -> None:
    async with WebServer(status) as web:
        text = await publish_error(caplog, lookupd=[web.address])
    assert "HTML page" in text and "nsqlookupd's HTTP port (usually 4161)" in text


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_an_http_port_given_as_an_nsqd(nsq_cluster: Any,
                                             caplog: pytest.LogCaptureFixture) -> None:
    for address in (nsq_cluster.lookupd_http_addresses[0], nsq_cluster.nsqd_http_addresses[0]):
        caplog.clear()
        text = await publish_error(caplog, nsqd=[address])
        assert "HTTP/1.1 400" in text and "nsqd's TCP port (usually 4150)" in text
