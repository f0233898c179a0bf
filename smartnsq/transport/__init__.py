"""Floor 3: the asyncio shell over the codec: one nsqd connection, one HTTP client, the loop.

``connection`` (handshake, upgrades, pipelined calls, heartbeats), ``http`` (the library's one
HTTP/1.1 client, for nsqlookupd and nsqd's HTTP API), ``loop_thread`` (the background loop every
blocking facade runs on) and ``event_loop`` (which loop smartnsq creates: uvloop when installed).
"""
