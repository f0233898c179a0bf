"""The byte-stream transforms IDENTIFY can switch on, as the dev cluster's nsqd uses them.

There is one implementation, :mod:`smartnsq.protocol.compression`, shared with the client, so
the two ends cannot disagree on chunking or flushing. The server compresses everything it
writes after the upgrade (starting with the extra ``OK``) and decompresses everything it reads.
What is server-specific is only which deflate level a Go nsqd ends up using:
:func:`deflate_stream` takes Go's flate levels (-2 Huffman only, -1 default, 0 stored, 1..9)
and fails with Go's text outside them (``E_IDENTIFY_FAILED`` in ``nsqd_conn``).
"""

from __future__ import annotations

from ..protocol.compression import DeflateStream, SnappyStream
from ..protocol.compression import StreamTransform as Stream

__all__ = ["DeflateStream", "SnappyStream", "Stream", "deflate_stream"]

deflate_stream = DeflateStream.go_level
