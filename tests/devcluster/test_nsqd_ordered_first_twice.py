"""The real server's duplicated first ordered delivery, reproduced on demand (docs/protocol.md
§10.1; docs/devcluster.md, "Real failure modes, on a clock"): the first SUB_ORDERED of a channel
with a backlog delivers its first message twice (same id, same attempts, even with RDY 1), and
FIN of the copy answers E_FIN_FAILED without closing the connection.

On the real server the copy can also come *after* the original's FIN was accepted, and is then
in flight: unanswered, it holds the ordered channel until msg_timeout
(``ordered_first_delivery_twice="after"``; ``"both"`` sends one copy of each kind, as the
drain that stalled for 60 s logged one dropped copy more than usual)."""

from __future__ import annotations

import pytest
from nsqd_helpers import running

from smartnsq.devcluster.nsqd.channels import Channel
from smartnsq.devcluster.nsqd.options import NsqdOptions
from smartnsq.devcluster.state import PartitionInfo
from smartnsq.protocol import commands
from smartnsq.protocol.frames import ErrorFrame, MessageFrame, Response


@pytest.mark.parametrize("twice", [True, "before", False])
async def test_first_sub_ordered_with_a_backlog_delivers_the_first_message_twice(
        twice: bool | str) -> None:
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
        assert isinstance(following, MessageFrame) and following.body == b"m1"


async def _ordered_backlog(nodes: object, bodies: tuple[bytes, ...] = (b"m0", b"m1"),
                           **identify: object) -> tuple[object, object]:
    """An ordered topic with ``bodies`` waiting; a SUB_ORDERED consumer at RDY 1."""
    nodes.topic("ord", ordered=True, channels=["ch"])  # type: ignore[attr-defined]
    leader = nodes.leader("ord")  # type: ignore[attr-defined]
    producer = await nodes.client(leader)  # type: ignore[attr-defined]
    for body in bodies:
        assert await producer.call(commands.pub("ord", body, 0)) == Response(b"OK")
    consumer = await nodes.client(leader, **identify)  # type: ignore[attr-defined]
    assert await consumer.call(commands.sub_ordered("ord", "ch", 0)) == Response(b"OK")
    consumer.expect(detail=True)
    consumer.send(commands.rdy(1))
    return producer, consumer


async def test_a_late_copy_follows_the_fin_and_is_in_flight() -> None:
    """``after``: nothing comes behind the original while it is in flight; once its FIN is
    accepted the copy comes (same id, same attempts), in flight: its FIN succeeds and only
    then does the next message come."""
    async with running(1, options=NsqdOptions(ordered_first_delivery_twice="after")) as nodes:
        _, consumer = await _ordered_backlog(nodes)
        channel = nodes.state.partition("ord", 0).channels["ch"]
        first = await consumer.message()
        assert (first.body, first.attempts) == (b"m0", 1)
        assert channel.in_flight == 1 and channel.twice.late is not None
        consumer.send(commands.fin(first.id))
        copy = await consumer.message()
        assert (copy.id, copy.attempts, copy.body) == (first.id, 1, b"m0")
        assert channel.in_flight == 1 and channel.finish_count == 1  # the copy holds it
        consumer.send(commands.fin(copy.id))  # accepted: no error frame before m1
        following = await consumer.message()
        assert (following.body, following.attempts) == (b"m1", 1)
        assert channel.finish_count == 2


async def test_an_unanswered_late_copy_holds_the_channel_until_msg_timeout() -> None:
    """The 60 s drain stall: the copy nobody answers is redelivered (attempts 2) when the
    consumer's msg_timeout expires, and the next message waits for it."""
    async with running(1, options=NsqdOptions(ordered_first_delivery_twice="after")) as nodes:
        _, consumer = await _ordered_backlog(nodes, msg_timeout=1000)
        channel = nodes.state.partition("ord", 0).channels["ch"]
        first = await consumer.message()
        consumer.send(commands.fin(first.id))
        copy = await consumer.message()
        assert (copy.id, copy.attempts) == (first.id, 1)
        again = await consumer.message()  # not m1: the copy timed out and comes back
        assert (again.id, again.attempts, again.body) == (first.id, 2, b"m0")
        assert channel.timeout_count == 1
        consumer.send(commands.fin(again.id))
        assert (await consumer.message()).body == b"m1"


async def test_both_copies() -> None:
    """``both``: a copy while the original is in flight (its FIN fails) and one after the
    original's FIN (in flight: its FIN is accepted)."""
    async with running(1, options=NsqdOptions(ordered_first_delivery_twice="both")) as nodes:
        _, consumer = await _ordered_backlog(nodes)
        first = await consumer.message()
        early = await consumer.message()
        assert (early.id, early.attempts) == (first.id, 1)
        consumer.send(commands.fin(first.id))
        late = await consumer.message()
        assert (late.id, late.attempts) == (first.id, 1)
        consumer.send(commands.fin(late.id))
        assert (await consumer.message()).body == b"m1"
        answer = await consumer.call(commands.fin(early.id))  # nothing of m0 in flight now
        assert isinstance(answer, ErrorFrame) and answer.payload.startswith(b"E_FIN_FAILED")


async def test_a_late_copy_also_follows_a_req() -> None:
    """The copy comes once the original leaves flight, whatever the answer: after a REQ it
    comes first (attempts as the original's), then the requeued original (attempts + 1)."""
    async with running(1, options=NsqdOptions(ordered_first_delivery_twice="after")) as nodes:
        _, consumer = await _ordered_backlog(nodes)
        first = await consumer.message()
        consumer.send(commands.req(first.id, 0))
        copy = await consumer.message()
        assert (copy.id, copy.attempts) == (first.id, 1)
        consumer.send(commands.fin(copy.id))
        requeued = await consumer.message()
        assert (requeued.id, requeued.attempts) == (first.id, 2)


def test_the_mode_is_checked_and_random_picks_per_channel() -> None:
    with pytest.raises(ValueError, match="ordered_first_delivery_twice"):
        NsqdOptions(ordered_first_delivery_twice="sometimes")
    assert NsqdOptions(ordered_first_delivery_twice=True).resolved(False) \
        .ordered_first_delivery_twice == "before"
    picks = []
    for partition in range(16):
        p = PartitionInfo("rnd", partition, "n1", ["n1"])
        p.log.append(b"m")
        channel = Channel(p, "ch", ordered_topic=True, first_twice="random", start=0)
        channel.set_ordered(True)
        again = Channel(p, "ch", ordered_topic=True, first_twice="random", start=0)
        again.set_ordered(True)
        assert again.twice.due == channel.twice.due  # the same channel, the same pick
        picks.append(channel.twice.due)
    assert set(picks) == {"before", "after", "both", "reset"}


async def test_a_reset_refuses_the_originals_fin_then_sends_the_copy_in_flight() -> None:
    """``reset`` (seen once in about a hundred drains on the real cluster): the reader's reset
    takes the original out of flight before its FIN comes, so that FIN is refused, and the
    copy comes only after the refusal; the copy is in flight (its FIN is accepted) and the
    next message waits for it."""
    async with running(1, options=NsqdOptions(ordered_first_delivery_twice="reset")) as nodes:
        _, consumer = await _ordered_backlog(nodes)
        channel = nodes.state.partition("ord", 0).channels["ch"]
        first = await consumer.message()
        assert (first.body, first.attempts) == (b"m0", 1)
        answer = await consumer.call(commands.fin(first.id))
        assert isinstance(answer, ErrorFrame) and answer.payload.startswith(b"E_FIN_FAILED")
        copy = await consumer.message()
        assert (copy.id, copy.attempts, copy.body) == (first.id, 1, b"m0")
        assert channel.in_flight == 1
        consumer.send(commands.fin(copy.id))  # accepted: no error frame before m1
        following = await consumer.message()
        assert (following.body, following.attempts) == (b"m1", 1)
        assert channel.finish_count == 1


async def test_an_unanswered_reset_original_sends_its_copy_at_msg_timeout() -> None:
    async with running(1, options=NsqdOptions(ordered_first_delivery_twice="reset")) as nodes:
        _, consumer = await _ordered_backlog(nodes, msg_timeout=1000)
        first = await consumer.message()
        copy = await consumer.message()  # nothing answered: the copy after msg_timeout
        assert (copy.id, copy.attempts) == (first.id, 1)
        consumer.send(commands.fin(copy.id))
        assert (await consumer.message()).body == b"m1"
