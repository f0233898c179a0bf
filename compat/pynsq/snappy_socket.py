"""pynsq's ``nsq.snappy_socket``: a socket that decodes the snappy framing format it
receives, and the encoder for what is sent, over smartnsq's snappy stream
(:mod:`smartnsq.protocol.compression`, python-snappy).

pynsq's ``AsyncConn`` swapped its socket for these after negotiating snappy; smartnsq's
connection negotiates and compresses by itself, so these are for a program driving its own
socket.
"""

from __future__ import annotations

import socket

from smartnsq.protocol.compression import SnappyStream

from .deflate_socket import TransformSocket

__all__ = ["SnappyEncoder", "SnappySocket"]


class SnappySocket(TransformSocket):
    """``SnappySocket(socket)``: the snappy framing format, as nsqd sends it."""

    def __init__(self, socket: socket.socket) -> None:
        super().__init__(socket, SnappyStream())


class SnappyEncoder:
    """``encode(data)``: the snappy-framed bytes for nsqd (one stream: its identifier once)."""

    def __init__(self) -> None:
        self._stream = SnappyStream()

    def encode(self, data: bytes) -> bytes:
        return self._stream.compress(data)
