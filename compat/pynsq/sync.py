"""pynsq's ``nsq.sync``: ``SyncConn``, a blocking socket to one nsqd.

For scripts and tests that write commands (built by :mod:`smartnsq.compat.pynsq.protocol`)
and read each answer in turn. No IDENTIFY, heartbeat or reconnection: a program needing those
wants ``smartnsq.sync.Producer`` / ``smartnsq.sync.Consumer`` instead.
"""

from __future__ import annotations

import socket
import struct

from smartnsq.protocol.commands import MAGIC_V2

from .protocol import IntegrityError

__all__ = ["SyncConn"]

_SIZE = struct.Struct(">i")


class SyncConn:
    """``connect(host, port)``, ``send(data)``, ``read_response()`` (a frame's payload: its
    type and data, as :func:`~smartnsq.compat.pynsq.protocol.unpack_response` reads it)."""

    def __init__(self, timeout: float = 1.0) -> None:
        self.buffer = b""
        self.timeout = timeout
        self.s: socket.socket | None = None

    def connect(self, host: str, port: int) -> None:
        assert isinstance(host, str), "host must be a str"
        assert isinstance(port, int), "port must be an int"
        self.s = socket.create_connection((host, port), timeout=self.timeout)
        self.s.sendall(MAGIC_V2)

    def _socket(self) -> socket.socket:
        if self.s is None:
            raise IntegrityError("SyncConn is not connected: call connect(host, port) first")
        return self.s

    def _readn(self, size: int) -> bytes:
        while len(self.buffer) < size:
            packet = self._socket().recv(4096)
            if not packet:
                raise IntegrityError(f"the connection closed before {size} bytes came")
            self.buffer += packet
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def read_response(self) -> bytes:
        """The next frame's payload (its 4-byte type, then its data)."""
        size = _SIZE.unpack(self._readn(4))[0]
        return self._readn(size)

    def send(self, data: bytes) -> None:
        self._socket().sendall(data)
