"""The dev nsqd's unix-socket listener: beside the TCP port, made at start, gone at stop."""

from __future__ import annotations

import os

from smartnsq.devcluster import DevCluster
from smartnsq.model.routes import parse_address
from smartnsq.protocol import commands
from smartnsq.transport.connection import Connection


async def test_the_socket_lives_with_the_node() -> None:
    cluster = DevCluster(nodes=2, lookupds=1, mode="classic", unix_sockets=True)
    await cluster.start()
    try:
        paths = [parse_address(a)[0] for a in cluster.nsqd_unix_addresses]
        assert len(set(paths)) == 2 and all(os.path.exists(p) for p in paths)
        assert cluster.nsqd_tcp_addresses[0].startswith("127.0.0.1:")  # lookupd's, unchanged
        await cluster.stop_node(0)
        assert not os.path.exists(paths[0]) and os.path.exists(paths[1])
        await cluster.start_node(0)
        conn = await Connection.connect(paths[0], 0)
        try:
            assert await conn.request(commands.pub("t", b"x"), "PUB") == b"OK"
        finally:
            await conn.close()
        await cluster.stop()
        assert not any(os.path.exists(p) for p in paths)
        await cluster.start()  # the same servers again, on the same paths
        assert all(os.path.exists(p) for p in paths)
    finally:
        await cluster.stop()
    assert not os.path.exists(os.path.dirname(paths[0]))
