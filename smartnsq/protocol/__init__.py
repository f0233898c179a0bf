"""smartnsq's sans-I/O codec: NSQ bytes in, typed values out, and commands to bytes.

Nothing here touches sockets, event loops, threads or clocks, so every layout is tested in
memory. Connections feed received bytes to ``frames.FrameReader`` and write what ``commands``
builds; ``responses``, ``identify``, ``lookup``, ``admin`` and ``http`` read what the servers
answer; ``validate`` and ``numbers`` check values before anything is built.
"""
