"""Classic NSQ's client rules (the client guide): union of every lookupd, back-off redials.

A classic cluster's lookupds do not know each other; a client asks all of them and uses the
union. A directly given nsqd that goes away is redialled with a growing delay until it is back.
Also the classic flavour of what a consumer sees: hex message ids, topics created on first use.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support import WAIT

from smartnsq import Consumer, Producer
from smartnsq.message import Message


async def first(consumer: Consumer) -> Message:
    async def read() -> Message:
        async for message in consumer:
            message.fin()
            return message
        raise AssertionError("the consumer closed")

    return await asyncio.wait_for(read(), WAIT)


@pytest.mark.nsq_cluster(nodes=1, lookupds=2, mode="classic")
async def test_any_lookupd_is_enough(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("t", channels=["c"])
    await nsq_cluster.stop_lookupd(0)
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses) as p:
        await p.publish("t", b"via the second lookupd")
    async with Consumer("t", "c", lookupd=nsq_cluster.lookupd_http_addresses) as consumer:
        message = await first(consumer)
    assert message.body == b"via the second lookupd"
    assert not message.youzan and len(message.id) == 16
    assert all(c in b"0123456789abcdef" for c in message.id)  # classic ids are ASCII hex


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, mode="classic")
async def test_direct_nsqd_redialled_after_it_returns(nsq_cluster: Any) -> None:
    node = nsq_cluster.nsqd_tcp_addresses[0]
    async with Consumer("fresh", "c", nsqd=[node], reconnect_delay=0.05,
                        reconnect_delay_max=0.2) as consumer:
        async with Producer(nsqd=[node]) as p:
            await p.publish("fresh", b"before")  # topic created on first use
            assert (await first(consumer)).body == b"before"
            await nsq_cluster.stop_node(0)
            await nsq_cluster.start_node(0)
            await p.publish("fresh", b"after", timeout=WAIT)
        assert (await first(consumer)).body == b"after"


def test_every_public_policy_field_has_a_meaning_in_the_reference() -> None:
    """The configuration reference is generated from the fields' doc() metadata."""
    import dataclasses

    from reference import config_table

    from smartnsq.compat.migration import MigrationPolicy
    from smartnsq.model.dialect import ClassicPolicy

    for cls in (ClassicPolicy, MigrationPolicy):
        public = [f for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")]
        assert public
        for f in public:
            assert f.metadata.get("doc"), f"{cls.__name__}.{f.name} has no doc()"
        table = config_table(f"{cls.__module__}.{cls.__qualname__}")
        rows = [line for line in table.splitlines() if line.startswith("| `")]
        assert len(rows) == len(public) and all(not row.endswith("|  |") for row in rows)
