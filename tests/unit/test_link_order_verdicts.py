"""What the delivery after an ordered partition's jump says about the jump.

A fresh read (``attempts`` 1) whose internal id and queue offset both go back is, by itself,
what an operator's rewind (``setoffset`` back) sends first, and also what a verbatim copy of an
earlier frame looks like. What follows tells them apart: a replay continues from the message
it went back to, while after a copy the server goes on from where the partition was before the
jump. So the jump is provisional: the next delivery confirms the rewind (logged at INFO then)
or makes it an order error (counted, logged at ERROR, passed to ``on_order_error``), and the
partition's position goes back to the one before the jump. An order error never becomes the
position the next in-order message is judged against, unless the partition really goes on
from it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator

import pytest
from test_link_duplicates import Harness
from test_link_rewinds import handled, mid

from smartnsq.errors import ServerError, error_from_payload
from smartnsq.message import FINISHED, REQUEUED, Message


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.close()


@pytest.fixture
def hooked(h: Harness) -> list[tuple[Message, str]]:
    """What ``on_order_error`` was called with."""
    calls: list[tuple[Message, str]] = []
    h.rt.config = dataclasses.replace(h.rt.config,
                                      on_order_error=lambda m, text: calls.append((m, text)))
    return calls


def lines(caplog: pytest.LogCaptureFixture, level: int, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "smartnsq.consumer" and r.levelno == level and text in r.getMessage()]


def backlog(h: Harness) -> None:
    """Messages 2..5 at offsets 0, 32, 64, 96, each handled."""
    for n in range(2, 6):
        handled(h, n, 32 * (n - 2))


def fin(h: Harness, msg: Message) -> None:
    h.rt.queue.pending.remove(msg)
    h.link.settle(msg, FINISHED, None, False)


def refusal(n: int) -> ServerError:
    ids = " ".join(str(b) for b in mid(n))
    return error_from_payload(f"E_FIN_FAILED FIN [{ids}] failed ErrType:7 ErrCode:0 : "
                              f"Message ID not in flight".encode(), "FIN")


def test_an_earlier_first_delivery_then_the_next_message_is_one_order_error(
        h: Harness, hooked: list[tuple[Message, str]],
        caplog: pytest.LogCaptureFixture) -> None:
    backlog(h)
    with caplog.at_level(logging.DEBUG, "smartnsq.consumer"):
        copy = h.deliver(1, mid(3), 32)  # message 3's frame again, byte for byte
        assert copy in h.queued  # handed over: nothing tells yet what it is
        assert h.rt.order_errors == 0 and hooked == []
        fin(h, copy)
        after = h.deliver(1, mid(6), 128)  # the server goes on after 5: no replay came
        assert after in h.queued
    assert h.rt.order_errors == 1
    text = ("order regression on t/0 at 127.0.0.1:4150: internal_id 3 after 5, queue_offset "
            "32 after 96 (no rewind: the next delivery, internal_id 6 at queue_offset 128, "
            "goes on from before it)")
    assert hooked == [(copy, text)]
    assert lines(caplog, logging.ERROR, "order regression") == [text]
    assert lines(caplog, logging.INFO, "rewound") == []
    fin(h, after)
    assert h.deliver(1, mid(7), 160) in h.queued and h.rt.order_errors == 1


def test_a_rewind_is_logged_once_the_next_delivery_replays_on(
        h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    backlog(h)
    with caplog.at_level(logging.INFO, "smartnsq.consumer"):
        replayed = h.deliver(1, mid(3), 32)
        assert lines(caplog, logging.INFO, "rewound") == []  # not yet known
        fin(h, replayed)
        fin(h, h.deliver(1, mid(4), 64))  # the replay goes on from 3: a rewind
    assert lines(caplog, logging.INFO, "rewound") == [
        "rewound on t/0 at 127.0.0.1:4150: internal_id 3 after 5, queue_offset 32 after 96 "
        "(the channel was set back: replaying)"]
    again = h.deliver(1, mid(5), 96)  # the last message handled before the rewind, replayed
    assert again in h.queued and h.duplicates == 0
    fin(h, again)
    assert h.deliver(1, mid(6), 128) in h.queued
    assert h.rt.order_errors == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_stray_frame_is_one_order_error_and_the_next_in_order_message_none(
        h: Harness, hooked: list[tuple[Message, str]]) -> None:
    backlog(h)
    stray = h.deliver(1, mid(1 << 56), 0)  # another partition's: id above, offset below
    assert stray in h.queued and h.rt.order_errors == 1
    fin(h, stray)
    after = h.deliver(1, mid(6), 128)  # judged against 5, the last good one
    assert after in h.queued and h.rt.order_errors == 1 and len(hooked) == 1
    fin(h, after)
    assert h.deliver(1, mid(7), 160) in h.queued and h.rt.order_errors == 1


def test_a_partition_that_goes_on_from_an_order_error_is_not_one_error_a_message(
        h: Harness) -> None:
    """Offsets that start again lower (ids still growing): one order error, then the partition
    goes on from there (each message right where the last one ended: raw_size 34), and the
    next messages are judged against it, not against 4."""
    for n in range(2, 5):
        handled(h, n, 34 * (n - 2))
    fin(h, h.deliver(1, mid(5), 0))
    assert h.rt.order_errors == 1
    for n in range(6, 9):
        fin(h, h.deliver(1, mid(n), 34 * (n - 5)))
    assert h.rt.order_errors == 1


def test_a_redelivery_of_the_jumps_message_leaves_the_verdict_to_the_next_one(
        h: Harness, hooked: list[tuple[Message, str]]) -> None:
    backlog(h)
    copy = h.deliver(1, mid(3), 32)
    h.rt.queue.pending.remove(copy)
    h.link.settle(copy, REQUEUED, 0.0, False)  # its handler failed
    fin(h, h.deliver(2, mid(3), 32))  # back with attempts 2: still undecided
    assert h.rt.order_errors == 0
    h.deliver(1, mid(6), 128)  # the server goes on after 5
    assert h.rt.order_errors == 1 and hooked[0][0] is copy


def test_a_refused_fin_of_the_jumps_message_is_reported_with_the_verdict(
        h: Harness) -> None:
    """The copy's FIN is refused (the server never sent it): held like any refused FIN of
    the message delivered last, then reported when the next delivery is no copy of it;
    the next delivery also decides the jump."""
    backlog(h)
    copy = h.deliver(1, mid(3), 32)
    fin(h, copy)
    refused = refusal(3)
    assert h.link.expected_error(refused)
    assert h.reported == []
    after = h.deliver(1, mid(6), 128)
    assert h.reported == [refused] and h.rt.order_errors == 1
    fin(h, after)
    assert h.deliver(1, mid(7), 160) in h.queued and h.rt.order_errors == 1


def test_a_refused_fin_during_a_rewind_leaves_the_replay_in_order(h: Harness) -> None:
    backlog(h)
    replayed = h.deliver(1, mid(3), 32)
    fin(h, replayed)
    refused = refusal(3)
    assert h.link.expected_error(refused)
    fin(h, h.deliver(1, mid(4), 64))  # the replay goes on: a rewind after all
    assert h.reported == [refused] and h.rt.order_errors == 0
    fin(h, h.deliver(1, mid(5), 96))
    assert h.deliver(1, mid(6), 128) in h.queued and h.rt.order_errors == 0


def test_a_connection_closing_before_the_verdict_reports_nothing(
        h: Harness, hooked: list[tuple[Message, str]],
        caplog: pytest.LogCaptureFixture) -> None:
    backlog(h)
    with caplog.at_level(logging.INFO, "smartnsq.consumer"):
        fin(h, h.deliver(1, mid(3), 32))
        h.link.closed()
    assert h.rt.order_errors == 0 and hooked == []
    assert lines(caplog, logging.INFO, "rewound") == []  # undecided: neither
