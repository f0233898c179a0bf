"""Floor 1: the pure models the clients' asyncio shells carry out (no I/O; time passed in).

``partitions`` (which partition a publish goes to, which SUB reads one), ``sharding`` (keys to
partitions), ``rdy`` (RDY distribution), ``backoff`` (back-off and requeue delays), ``dialect``
(what the core asks the classic boundary), ``routes`` (route values), ``failover`` (the chase,
probes, holds, the wait for a leader) and ``lookupd_health`` (which lookupd to ask).
"""
