"""An operator's rewind (``/channel/setoffset`` back) as an ordered subscription's link sees it,
against a genuine order regression.

What the real youzan nsqd sends after a setoffset back on an ordered channel (measured): the
messages from the new position again, each a fresh read from the queue (``attempts`` 1), with
internal ids and queue offsets going back together. That is a replay, not a broken order:
nothing is logged as an error and every replayed message is handled, the last handled one
too. The first replayed message alone is also what a verbatim copy of an earlier frame looks
like: the rewind is known (and logged) once the next delivery replays on from it
(``test_link_order_verdicts.py``). A message that goes back in one of the two and not the
other, or an older message that comes back redelivered (``attempts`` > 1) after newer ones,
is a regression, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from test_link_duplicates import Harness

from smartnsq.message import FINISHED


def mid(n: int) -> bytes:
    return n.to_bytes(8, "big") + bytes(8)


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.close()


def handled(h: Harness, n: int, offset: int, attempts: int = 1) -> None:
    """Deliver message ``n`` at ``offset`` and FIN it, as a handler that succeeded would."""
    msg = h.deliver(attempts, mid(n), offset)
    assert msg in h.queued
    h.rt.queue.pending.remove(msg)
    h.link.settle(msg, FINISHED, None, False)


def test_a_rewind_to_the_last_handled_message_hands_it_over_again(h: Harness) -> None:
    handled(h, 2, 0)
    handled(h, 3, 32)
    again = h.deliver(1, mid(3), 32)  # setoffset to exactly the last handled message
    assert again in h.queued
    assert h.duplicates == 0 and h.rt.order_errors == 0


def test_the_servers_duplicated_first_delivery_is_still_a_copy(h: Harness) -> None:
    handled(h, 2, 0)
    copy = h.deliver(1, mid(2), 0)  # the link's first message, again: the server's copy
    assert copy not in h.queued and h.duplicates == 1


def test_a_rewind_further_back_is_a_replay_not_an_error(
        h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    for n in range(2, 6):
        handled(h, n, 32 * (n - 2))
    with caplog.at_level(logging.INFO, "smartnsq.consumer"):
        replayed = h.deliver(1, mid(3), 32)
        assert replayed in h.queued and h.rt.order_errors == 0
        h.rt.queue.pending.remove(replayed)
        h.link.settle(replayed, FINISHED, None, False)
        # the replay goes on from 3: what tells a rewind from a copy of 3's frame
        assert h.deliver(1, mid(4), 64) in h.queued and h.rt.order_errors == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("rewound" in r.getMessage() for r in caplog.records)


def test_an_older_message_redelivered_after_newer_ones_is_a_regression(h: Harness) -> None:
    handled(h, 2, 0)
    handled(h, 3, 32)
    h.deliver(2, mid(2), 0)  # attempts 2: not a fresh read from a new position
    assert h.rt.order_errors == 1


def test_ids_and_offsets_that_disagree_are_a_regression(h: Harness) -> None:
    handled(h, 2, 0)
    handled(h, 5, 96)
    h.deliver(1, mid(4), 128)  # the id goes back, the offset forward
    assert h.rt.order_errors == 1
