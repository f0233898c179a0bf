"""A youzan cluster that has just started: the leader lookupd answers ``/topic/create`` with
``HTTP 400 ... No node is available for topic`` while enough nsqd run but not all of them
have registered yet. ``create_topic`` waits for them within its deadline; a cluster with
enough nodes registered that still refuses is an error at once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from smartnsq.admin import AsyncAdmin
from smartnsq.errors import AdminError, Timeout


def _watch_refusals(admin: AsyncAdmin) -> asyncio.Event:
    """An event set when the lookupd refused a create (the test then lets the node in)."""
    refused = asyncio.Event()
    write = admin._write

    async def watched(*args: Any, **kwargs: Any) -> Any:
        try:
            return await write(*args, **kwargs)
        except AdminError:
            refused.set()
            raise

    admin._write = watched  # type: ignore[method-assign]
    return refused


@pytest.mark.nsq_cluster(nodes=3)
async def test_create_waits_for_nodes_still_registering(nsq_cluster: Any) -> None:
    lookupd = nsq_cluster.lookupd_http_addresses
    await nsq_cluster.stop_node(2)  # up, but not registered with the lookupd yet
    async with AsyncAdmin(lookupd, timeout=5.0) as admin:
        refused = _watch_refusals(admin)
        create = asyncio.create_task(admin.create_topic(
            "fresh", partitions=1, replicas=3, timeout=60.0, resend_interval=0.2,
            poll_interval=0.05))
        waiting = asyncio.create_task(refused.wait())
        await asyncio.wait({create, waiting}, return_when=asyncio.FIRST_COMPLETED)
        assert not create.done() or create.exception() is None, create.exception()
        await nsq_cluster.start_node(2)  # its registration arrives
        state = await create
        waiting.cancel()
    assert state.done


@pytest.mark.nsq_cluster(nodes=3)
async def test_create_past_its_deadline_says_what_the_lookupd_answered(
        nsq_cluster: Any) -> None:
    await nsq_cluster.stop_node(2)
    async with AsyncAdmin(nsq_cluster.lookupd_http_addresses, timeout=5.0) as admin:
        with pytest.raises(Timeout) as caught:
            await admin.create_topic("never", partitions=1, replicas=3, timeout=1.0,
                                     resend_interval=0.2, poll_interval=0.05)
    assert "No node is available" in str(caught.value)
