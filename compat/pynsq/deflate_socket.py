"""pynsq's ``nsq.deflate_socket``: a socket that inflates what it receives, and the encoder
for what is sent, over smartnsq's deflate stream (:mod:`smartnsq.protocol.compression`).

pynsq's ``AsyncConn`` swapped its socket for these after negotiating deflate; smartnsq's
connection negotiates and compresses by itself, so these are for a program driving its own
socket (a ``SyncConn`` after IDENTIFY asked for ``deflate``).
"""

from __future__ import annotations

import errno
import socket
from typing import Any

from smartnsq.protocol.compression import DeflateStream, StreamTransform

__all__ = ["DeflateEncoder", "DeflateSocket", "TransformSocket"]


class TransformSocket:
    """A socket whose ``recv`` returns the decoded stream; every other attribute is the
    socket's, and ``send`` sends as given (encode first, with the matching encoder)."""

    def __init__(self, sock: socket.socket, transform: StreamTransform) -> None:
        self._socket = sock
        self._transform = transform
        self._bootstrapped = b""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._socket, name)

    def bootstrap(self, data: bytes) -> None:
        """Decode ``data``: bytes of the new stream read before the switch to it."""
        if data:
            self._bootstrapped += self._transform.decompress(data)

    def recv(self, size: int) -> bytes:
        return self._recv(size, self._socket.recv)

    def read(self, size: int) -> bytes:
        """``recv`` for an SSL socket's ``read``."""
        return self._recv(size, self._socket.read)  # type: ignore[attr-defined]

    def recv_into(self, buffer: bytearray | memoryview, nbytes: int = 0) -> int:
        wanted = nbytes or len(buffer)
        data = self.recv(wanted)
        if len(data) > wanted:  # decoded more than asked: the rest waits for the next call
            self._bootstrapped = data[wanted:] + self._bootstrapped
            data = data[:wanted]
        buffer[:len(data)] = data
        return len(data)

    def _recv(self, size: int, receive: Any) -> bytes:
        if self._bootstrapped:
            data, self._bootstrapped = self._bootstrapped, b""
            return data
        chunk = receive(size)
        if not chunk:
            return b""  # closed
        decoded = self._transform.decompress(chunk)
        if not decoded:  # a partial block: nothing to give yet, as a non-blocking socket says
            raise BlockingIOError(errno.EWOULDBLOCK, "no whole block decoded yet")
        return decoded

    def send(self, data: bytes) -> int:
        return self._socket.send(data)


class DeflateSocket(TransformSocket):
    """``DeflateSocket(socket, level)``: raw deflate (RFC 1951), as nsqd sends it."""

    def __init__(self, socket: socket.socket, level: int) -> None:
        super().__init__(socket, DeflateStream(min(max(int(level), 1), 9)))


class DeflateEncoder:
    """``encode(data)``: the deflated bytes for nsqd, each write ending in a sync flush."""

    def __init__(self, level: int) -> None:
        self._stream = DeflateStream(min(max(int(level), 1), 9))

    def encode(self, data: bytes) -> bytes:
        return self._stream.compress(data)
