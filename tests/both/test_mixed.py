"""One client over a youzan cluster and a classic cluster at once (docs/compat.md), on the dev
clusters and on the real servers (``nsq_any_mixed``: youzan nsqd/nsqlookupd 0.3.7-HA beside
classic nsqd/nsqlookupd 1.3.0).

The Producer and the Consumers are given both clusters' lookupds. A topic only on the youzan
cluster is written to its partitions, one only on the classic cluster to its classic node, and
a topic on both (a migration) is written to each side as the ``MigrationPolicy`` says, each
sharding key always to one side, and read back from both.
"""

from __future__ import annotations

from typing import Any

from support import Watch, bounded, fresh_name

from smartnsq import Consumer, Producer
from smartnsq.compat import MigrationPolicy
from smartnsq.message import Message

WAIT = 30.0
KEYS = 16


async def _consume(lookupd: list[str], topic: str, want: set[bytes]) -> set[bytes]:
    got: set[bytes] = set()
    watch = Watch()

    def handle(message: Message) -> None:
        got.add(bytes(message.body))
        watch.poke()

    consumer = Consumer(topic, "ch", lookupd=lookupd, handler=handle,
                        lookup_options={"poll_interval": 0.5})
    async with bounded(10):
        await consumer.start()
    try:
        await watch.until(lambda: want <= got, WAIT, f"{len(want)} messages of {topic}")
    finally:
        async with bounded(10):
            await consumer.close(timeout=5)
    return got


async def test_one_client_over_a_youzan_and_a_classic_cluster(nsq_any_mixed: Any) -> None:
    pair = nsq_any_mixed
    new, old, moving = fresh_name("new"), fresh_name("old"), fresh_name("moving")
    await pair.youzan.create_topic(new, partitions=2, replicas=1, channels=["ch"])
    await pair.classic.create_topic(old, channels=["ch"])
    await pair.youzan.create_topic(moving, partitions=2, replicas=1, channels=["ch"])
    await pair.classic.create_topic(moving, channels=["ch"])
    lookupd = pair.lookupd_http_addresses
    youzan_nodes = set(pair.youzan.nsqd_tcp_addresses)
    classic_nodes = set(pair.classic.nsqd_tcp_addresses)

    sides: dict[str, set[str]] = {}
    async with Producer(lookupd=lookupd, migration=MigrationPolicy(youzan_percent=50),
                        lookup_options={"poll_interval": 0.5}) as producer:
        async with bounded(10):
            to_new = await producer.publish(new, b"n0", sharding_key="k", timeout=10)
            to_old = await producer.publish(old, b"o0", timeout=10)
        assert to_new.node in youzan_nodes and to_new.partition is not None
        assert to_old.node in classic_nodes and to_old.partition is None
        for round_ in range(2):
            for k in range(KEYS):
                async with bounded(10):
                    result = await producer.publish(moving, b"m%d-%d" % (k, round_),
                                                    sharding_key=f"key-{k}", timeout=10)
                side = "youzan" if result.node in youzan_nodes else "classic"
                assert result.node in youzan_nodes | classic_nodes
                assert (result.partition is None) == (side == "classic"), result
                sides.setdefault(f"key-{k}", set()).add(f"{side}:{result.node}:"
                                                        f"{result.partition}")
    # each key went to one side (and there to one partition or node), both sides got keys
    assert all(len(where) == 1 for where in sides.values()), sides
    used = {next(iter(where)).split(":", 1)[0] for where in sides.values()}
    assert used == {"youzan", "classic"}, sides

    assert await _consume(lookupd, new, {b"n0"}) == {b"n0"}
    assert await _consume(lookupd, old, {b"o0"}) == {b"o0"}
    want = {b"m%d-%d" % (k, r) for k in range(KEYS) for r in range(2)}
    assert await _consume(lookupd, moving, want) == want
