"""The dev cluster's nsqd: one module per part of the real server it reproduces.

``node`` (one nsqd: its listeners and what it serves), ``tcp`` (the TCP protocol's command
handlers), ``reader`` (the client-to-server byte stream, parsed as nsqd reads it; sans-I/O),
``identify``, ``auth``, ``publish``, ``http`` (the HTTP API), ``channels`` and ``first_twice``
(delivery), ``options`` (the node's settings), ``error_frames`` (errors worded as Go words
them) and ``view`` (what the handlers need from the node).
"""
