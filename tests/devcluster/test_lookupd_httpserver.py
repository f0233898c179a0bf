"""The dev cluster's HTTP server: renderings, routing errors, keep-alive, pause and stop.

Raw bytes over asyncio streams show what goes on the wire (headers, status line, keep-alive);
httpx shows that a real HTTP client is content with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from smartnsq.devcluster.httpserver import (
    NEGOTIATE,
    PLAIN,
    V1,
    V1_ACCEPT,
    HTTPError,
    HTTPServer,
    Request,
    Response,
    go_json,
)

TIMEOUT = 5.0


@pytest.fixture
async def server() -> AsyncIterator[HTTPServer]:
    srv = HTTPServer(name="test")

    async def data(req: Request) -> object:
        return {"topic": req.arg("topic"), "all": req.query.get("x", []), "body": len(req.body)}

    async def fail(req: Request) -> object:
        raise HTTPError(400, "MISSING_ARG_TOPIC")

    async def nothing(req: Request) -> None:
        return None

    async def text(req: Request) -> str:
        return "OK"

    async def crash(req: Request) -> None:
        raise ZeroDivisionError

    async def chunked(req: Request) -> Response:
        return Response(200, b'{"a":1}', [("Content-Type", "application/json")], chunked=True)

    srv.route("GET", "/data", data, NEGOTIATE)
    srv.route("POST", "/data", data, V1)
    srv.route("GET", "/fail", fail, NEGOTIATE)
    srv.route("POST", "/fail", fail, V1)
    srv.route("POST", "/nothing", nothing, V1)
    srv.route("GET", "/ping", text, PLAIN)
    srv.route("GET", "/pub", text, NEGOTIATE)
    srv.route("GET", "/crash", crash, NEGOTIATE)
    srv.route("GET", "/chunked", chunked, NEGOTIATE)
    await srv.start()
    yield srv
    await srv.stop()


async def raw(server: HTTPServer, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(65536), TIMEOUT)
    writer.close()
    return data


async def test_renderings(server: HTTPServer) -> None:
    async with httpx.AsyncClient(base_url=f"http://{server.address}") as client:
        resp = await client.get("/data", params={"topic": "t", "x": ["1", "2"]})
        assert resp.json() == {"status_code": 200, "status_txt": "OK",
                               "data": {"topic": "t", "all": ["1", "2"], "body": 0}}
        assert "x-nsq-content-type" not in resp.headers
        resp = await client.get("/data", params={"topic": "t"}, headers={"Accept": V1_ACCEPT})
        assert resp.content == b'{"topic":"t","all":[],"body":0}'
        assert resp.headers["x-nsq-content-type"] == "nsq; version=1.0"
        resp = await client.post("/data", content=b"12345")
        assert resp.json()["body"] == 5
        resp = await client.get("/fail")
        assert resp.status_code == 500
        assert resp.content == b'{"status_code":500,"status_txt":"MISSING_ARG_TOPIC","data":null}'
        resp = await client.post("/fail")
        assert (resp.status_code, resp.content) == (400, b'{"message":"MISSING_ARG_TOPIC"}')
        resp = await client.post("/nothing")
        assert resp.content == b"" and "content-type" not in resp.headers
        resp = await client.get("/pub")  # a string is sent as is, wrapped or not
        assert (resp.text, resp.headers["content-type"]) == ("OK", "text/plain; charset=utf-8")
        resp = await client.get("/crash", headers={"Accept": V1_ACCEPT})
        assert (resp.status_code, resp.json()) == (500, {"message": "INTERNAL_ERROR"})
        resp = await client.get("/chunked")
        assert resp.headers["transfer-encoding"] == "chunked" and resp.json() == {"a": 1}


async def test_routing_errors_are_v1_rendered(server: HTTPServer) -> None:
    async with httpx.AsyncClient(base_url=f"http://{server.address}") as client:
        resp = await client.get("/nope")
        assert (resp.status_code, resp.json()) == (404, {"message": "NOT_FOUND"})
        assert resp.headers["x-nsq-content-type"] == "nsq; version=1.0"
        resp = await client.delete("/data")
        assert (resp.status_code, resp.json()) == (405, {"message": "METHOD_NOT_ALLOWED"})
        assert resp.headers["allow"] == "GET, POST"


async def test_classic_server_never_wraps() -> None:
    srv = HTTPServer(classic=True)

    async def fail(req: Request) -> object:
        raise HTTPError(404, "TOPIC_NOT_FOUND")

    srv.route("GET", "/lookup", fail, NEGOTIATE)
    srv.route("POST", "/pub", fail, NEGOTIATE)
    await srv.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://{srv.address}") as client:
            resp = await client.get("/lookup")
            assert (resp.status_code, resp.json()) == (404, {"message": "TOPIC_NOT_FOUND"})
            assert resp.headers["x-nsq-content-type"] == "nsq; version=1.0"
            resp = await client.get("/pub")
            assert resp.headers["allow"] == "OPTIONS, POST"  # http_nsqd_pub_get_method.txt
    finally:
        await srv.stop()


async def test_wire_format_and_keep_alive(server: HTTPServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    for _ in range(3):  # several requests on one connection
        writer.write(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"Content-Length: 2\r\n" in head and b"Date: " in head
        assert await asyncio.wait_for(reader.readexactly(2), TIMEOUT) == b"OK"
    writer.write(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    rest = await asyncio.wait_for(reader.read(), TIMEOUT)  # then the server closes
    assert rest.endswith(b"OK")
    writer.close()


async def test_garbage_gets_400(server: HTTPServer) -> None:
    data = await raw(server, b"NOT HTTP AT ALL\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 400")


async def test_expect_100_continue(server: HTTPServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"POST /data HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
                 b"Expect: 100-continue\r\n\r\n")
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
    assert interim.startswith(b"HTTP/1.1 100")
    writer.write(b"abc")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
    assert head.startswith(b"HTTP/1.1 200")
    writer.close()


async def test_pause_holds_requests_until_resume(server: HTTPServer) -> None:
    server.pause()
    async with httpx.AsyncClient(base_url=f"http://{server.address}") as client:
        pending = asyncio.ensure_future(client.get("/ping"))
        done, _ = await asyncio.wait([pending], timeout=0.2)
        assert not done
        server.resume()
        assert (await asyncio.wait_for(pending, TIMEOUT)).text == "OK"


async def test_stop_drops_open_connections_and_refuses(server: HTTPServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\nOK"), TIMEOUT)
    port = server.port
    await server.stop()
    try:
        eof = await asyncio.wait_for(reader.read(), TIMEOUT)
    except ConnectionResetError:
        eof = b""
    assert eof == b""
    writer.close()
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)
    await server.start()  # restarts on the same port
    assert server.port == port
    assert (await raw(server, b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")).endswith(b"OK")


def test_go_json_escapes_like_go() -> None:
    assert go_json({"a": "<&>", "b": [1, None, True], "c": "é"}) == (
        b'{"a":"\\u003c\\u0026\\u003e","b":[1,null,true],"c":"\xc3\xa9"}')
