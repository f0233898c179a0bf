"""The real server's duplicated first ordered delivery, reproduced on demand (issue 12, item 4:
"the duplicate first delivery"; ``real-cluster.md``, "Ordered channels deliver their first
message twice"): the first SUB_ORDERED of a channel with a backlog delivers its first message
twice (same id, same attempts, even with RDY 1), and FIN of the copy answers E_FIN_FAILED
without closing the connection."""

from __future__ import annotations

import pytest
from nsqd_helpers import running

from smartnsq.devcluster.nsqd import NsqdOptions
from smartnsq.protocol import ErrorFrame, Response, commands
from smartnsq.protocol.frames import Message


@pytest.mark.parametrize("twice", [True, False])
async def test_first_sub_ordered_with_a_backlog_delivers_the_first_message_twice(
        twice: bool) -> None:
    options = NsqdOptions(ordered_first_delivery_twice=twice)
    async with running(1, options=options) as nodes:
        nodes.topic("ord", ordered=True, channels=["ch"])
        leader = nodes.leader("ord")
        producer = await nodes.client(leader)
        for body in (b"m0", b"m1"):
            assert await producer.call(commands.pub("ord", body, 0)) == Response(b"OK")
        consumer = await nodes.client(leader)
        assert await consumer.call(commands.sub_ordered("ord", "ch", 0)) == Response(b"OK")
        consumer.expect(detail=True)
        consumer.send(commands.rdy(1))
        first = await consumer.message()
        assert first.body == b"m0" and first.attempts == 1
        if twice:
            copy = await consumer.message()
            assert (copy.id, copy.attempts, copy.body) == (first.id, 1, b"m0")
        consumer.send(commands.fin(first.id))
        following = await consumer.message()
        assert following.body == b"m1" and following.attempts == 1
        if twice:
            # the copy was never in flight: its FIN fails (not fatal)
            answer = await consumer.call(commands.fin(first.id))
            assert isinstance(answer, ErrorFrame), answer
            assert answer.payload.startswith(b"E_FIN_FAILED") and b"not in flight" in \
                answer.payload
        # the connection is still serving
        assert await producer.call(commands.pub("ord", b"m2", 0)) == Response(b"OK")
        consumer.send(commands.fin(following.id))
        assert (await consumer.message()).body == b"m2"


async def test_only_the_first_sub_ordered_duplicates() -> None:
    async with running(1, options=NsqdOptions(ordered_first_delivery_twice=True)) as nodes:
        nodes.topic("ord", ordered=True, channels=["ch"])
        leader = nodes.leader("ord")
        producer = await nodes.client(leader)
        consumer = await nodes.client(leader)
        # no backlog at the first SUB_ORDERED: nothing is duplicated, now or later
        assert await consumer.call(commands.sub_ordered("ord", "ch", 0)) == Response(b"OK")
        consumer.expect(detail=True)
        consumer.send(commands.rdy(1))
        assert await producer.call(commands.pub("ord", b"m0", 0)) == Response(b"OK")
        assert await producer.call(commands.pub("ord", b"m1", 0)) == Response(b"OK")
        got = await consumer.message()
        consumer.send(commands.fin(got.id))
        following = await consumer.message()
        assert isinstance(following, Message) and following.body == b"m1"
