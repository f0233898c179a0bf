"""A tour of the ``smartnsq`` command line against an embedded dev cluster.

Runs the same commands you would type in a shell (``smartnsq lookup``, ``pub``, ``stats``,
``tail``), through ``smartnsq.cli.main`` so the example needs nothing but smartnsq itself:

    python examples/cli_tour.py

``main`` runs its own event loop, so it is called in a worker thread while the cluster serves
on this one.
"""

from __future__ import annotations

import asyncio
import io
import json
import sys

from smartnsq.cli import main
from smartnsq.devcluster import DevCluster


async def smartnsq(*argv: str, stdin: str = "") -> str:
    """Run one command like the shell would and return what it printed."""
    print(f"\n$ smartnsq {' '.join(argv)}")
    out, err = io.StringIO(), io.StringIO()
    code = await asyncio.to_thread(main, list(argv), stdin=io.StringIO(stdin), stdout=out,
                                   stderr=err)
    print(out.getvalue(), end="")
    if err.getvalue():
        print(err.getvalue(), end="", file=sys.stderr)
    if code != 0:
        raise SystemExit(f"smartnsq {argv[0]} exited with {code}")
    return out.getvalue()


async def tour() -> None:
    async with DevCluster(nodes=3, lookupds=2) as cluster:
        await cluster.create_topic("orders", partitions=3, replicas=2, channels=["billing"])
        lookupd = ",".join(cluster.lookupd_http_addresses)

        # where the topic lives: partitions, leaders, replicas, meta
        await smartnsq("lookup", "orders", "--lookupd", lookupd)

        # publish JSON lines sharded by customer: one customer's orders stay in order
        lines = "".join(json.dumps({"customer": f"c{i % 4}", "order": i}) + "\n"
                        for i in range(12))
        await smartnsq("pub", "orders", "--lookupd", lookupd, "--key-field", "customer",
                       stdin=lines)

        # one traced message on an explicit partition
        await smartnsq("pub", "orders", "--lookupd", lookupd, "--partition", "0",
                       "--trace-id", "777", stdin='{"customer": "vip", "order": 99}\n')

        # how deep each partition's channel is now
        await smartnsq("stats", "orders", "--lookupd", lookupd)

        # read everything back on a throwaway ephemeral channel, with partition and offsets
        await smartnsq("tail", "orders", "--lookupd", lookupd, "--from", "earliest",
                       "-n", "13", "--show", "meta")


if __name__ == "__main__":
    asyncio.run(tour())
