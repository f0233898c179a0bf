"""A TCP proxy in front of a dev-cluster port, for connection faults a server cannot fake.

A killed server, a network partition and a slow link look different to a client: the first
resets the socket, the second leaves it open and silent, the third delivers late. The proxy
forwards raw bytes (so TLS, snappy and deflate pass through untouched) and can:

* :meth:`cut` every current connection (both sides see the socket close, as after a reset),
* :meth:`stall` forwarding in both directions (connections stay open, bytes are held) until
  :meth:`resume` delivers what was held, in order,
* delay what the server sends (``response_delay``) or what the client sends
  (``request_delay``), each chunk delivered that many seconds after it arrived, order kept,
* :meth:`refuse` new connections (the listener closes; :meth:`accept` reopens it on the same
  port) while existing ones keep working.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

__all__ = ["TCPProxy"]

log = logging.getLogger("smartnsq.devcluster.proxy")

_CHUNK = 65536


class _Pipe:
    """One direction of one proxied connection: read, hold/delay, write."""

    def __init__(self, proxy: TCPProxy, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, to_client: bool) -> None:
        self.proxy = proxy
        self.reader = reader
        self.writer = writer
        self.to_client = to_client
        self.queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await self.reader.read(_CHUNK)
                if not data:
                    break
                self.queue.put_nowait((loop.time(), data))
        except (ConnectionError, OSError):
            pass
        finally:
            self.queue.put_nowait((loop.time(), b""))

    async def write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                received, data = await self.queue.get()
                delay = (self.proxy.response_delay if self.to_client
                         else self.proxy.request_delay)
                wait = received + delay - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                await self.proxy._flowing.wait()
                if not data:
                    if self.writer.can_write_eof():
                        self.writer.write_eof()
                    break
                self.writer.write(data)
                await self.writer.drain()
        except (ConnectionError, OSError):
            pass


class _Link:
    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter,
                 tasks: list[asyncio.Task[None]]) -> None:
        self.client = client
        self.server = server
        self.tasks = tasks

    def abort(self) -> None:
        self.client.transport.abort()
        self.server.transport.abort()
        for task in self.tasks:
            task.cancel()


class TCPProxy:
    """Listen on ``host:port`` (0: ephemeral) and forward each connection to the target."""

    def __init__(self, target_host: str, target_port: int, *, host: str = "127.0.0.1",
                 port: int = 0, name: str = "proxy") -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.host = host
        self.port = port
        self.name = name
        self.response_delay = 0.0
        self.request_delay = 0.0
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def connections(self) -> int:
        """How many client connections are currently proxied."""
        return len(self._links)

    @property
    def stalled(self) -> bool:
        return not self._flowing.is_set()

    async def start(self) -> int:
        await self.accept()
        return self.port

    async def accept(self) -> None:
        """(Re)open the listener on the same port."""
        if self._server is None:
            self._server = await asyncio.start_server(self._handle, self.host, self.port,
                                                      reuse_address=True)
            self.port = self._server.sockets[0].getsockname()[1]

    async def refuse(self) -> None:
        """Close the listener: new connections are refused, current ones keep flowing."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)

    async def stop(self) -> None:
        await self.refuse()
        self.cut()
        self.resume()
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=1.0)

    def cut(self) -> int:
        """Drop every current connection on both sides; returns how many were cut."""
        links = list(self._links)
        for link in links:
            link.abort()
        self._links.clear()
        if links:
            log.info("%s: cut %d connection(s)", self.name, len(links))
        return len(links)

    def stall(self) -> None:
        """Stop forwarding in both directions; connections stay open and silent."""
        self._flowing.clear()

    def resume(self) -> None:
        """Forward again, delivering what was held while stalled."""
        self._flowing.set()

    def set_delay(self, response: float = 0.0, request: float = 0.0) -> None:
        """Deliver each chunk ``response``/``request`` seconds after it arrived (0: no delay)."""
        self.response_delay = max(0.0, response)
        self.request_delay = max(0.0, request)

    async def _handle(self, client_reader: asyncio.StreamReader,
                      client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        link: _Link | None = None
        try:
            try:
                server_reader, server_writer = await asyncio.open_connection(
                    self.target_host, self.target_port)
            except OSError:
                client_writer.transport.abort()  # the target is down: the client sees a reset
                return
            up = _Pipe(self, client_reader, server_writer, to_client=False)
            down = _Pipe(self, server_reader, client_writer, to_client=True)
            tasks = [asyncio.create_task(coro) for coro in (
                up.read_loop(), up.write_loop(), down.read_loop(), down.write_loop())]
            link = _Link(client_writer, server_writer, tasks)
            self._links.add(link)
            # the server closing ends the link (its EOF has reached the client by then); the
            # client closing first only half-closes it, until the server closes in turn
            await asyncio.wait([tasks[3]])
            self._links.discard(link)
            for pipe_task in tasks:
                pipe_task.cancel()
            client_writer.close()
            server_writer.close()
            link = None
        except asyncio.CancelledError:
            pass
        finally:
            if link is not None:
                self._links.discard(link)
                link.abort()
            else:
                client_writer.close()
            self._handlers.discard(task)
