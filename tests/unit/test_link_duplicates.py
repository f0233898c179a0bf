"""The duplicated first delivery of a fresh ordered channel, as the subscription's link answers
it. The link, its flow control and its dispatch queue are real (on an event loop that does
not run); its connection is a list of the answers sent (RDY apart).

The rule (nsqd records a message in flight before writing it, and writes it even when the id
is in flight already): a copy that comes before any answer to the original left is not in
flight and is not answered; one that comes after the original's FIN may be, and is FINed;
one that comes after its REQ may be, and is handled as a delivery.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from smartnsq.consumer.config import ConsumerConfig
from smartnsq.consumer.dispatch import Dispatch
from smartnsq.consumer.flow import Flow
from smartnsq.consumer.link import Link
from smartnsq.consumer.runtime import Runtime
from smartnsq.errors import error_from_payload
from smartnsq.message import FINISHED, PENDING, REQUEUED, Message, claimed
from smartnsq.protocol import commands

ID = bytes([0, 0, 0, 0, 0, 0, 0, 2]) + bytes(8)
NEXT = bytes([0, 0, 0, 0, 0, 0, 0, 3]) + bytes(8)
REFUSED = error_from_payload(b"E_FIN_FAILED FIN [0 0 0 0 0 0 0 2 0 0 0 0 0 0 0 0] failed "
                             b"ErrType:7 ErrCode:0 : Message ID not in flight (after FIN)",
                             "FIN")


class Harness:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.loop = asyncio.new_event_loop()
        cfg = ConsumerConfig()
        rt = Runtime("t", "c", cfg)
        rt.trace = False
        rt.loop = self.loop
        rt.loop_thread_id = -1
        rt.flow = Flow(self.loop, 10, cfg.backoff_policy, cfg.rdy_tick_interval,
                       cfg.low_rdy_idle_timeout)
        rt.queue = Dispatch(self.loop)
        self.rt = rt

        def send(data: bytes, now: bool = False) -> None:
            if not data.startswith(b"RDY "):
                self.sent.append(data)

        conn: Any = SimpleNamespace(send=send, send_now=send, address_text="127.0.0.1:4150",
                                    is_youzan=True,
                                    local_address="127.0.0.1:1", is_closed=False,
                                    last_receive=0.0, max_rdy_count=2500)
        self.reported: list[Any] = []  # server errors the link hands the subscription
        self.link = Link(rt, conn, 0, ordered=True, detail=True, report=self.reported.append)
        rt.flow.add(self.link)

    @property
    def queued(self) -> list[Message]:
        """What waits in the dispatch queue for a worker."""
        return list(self.rt.queue.pending)

    @property
    def duplicates(self) -> int:
        return self.link.counts.duplicates

    def close(self) -> None:
        self.rt.flow.close()
        self.loop.close()

    def deliver(self, attempts: int = 1, msg_id: bytes = ID, offset: int = 0) -> Message:
        msg = Message(0, attempts, msg_id, b"body", queue_offset=offset, raw_size=34)
        self.link.on_message(msg)
        return msg


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.close()


def test_a_copy_while_the_original_is_pending_is_not_answered(h: Harness) -> None:
    original = h.deliver()
    assert h.queued == [original]
    h.deliver()  # the copy: same id, same attempts
    assert h.queued == [original] and h.sent == [] and h.duplicates == 1
    assert original._state == PENDING and h.link.in_flight == 1
    h.link.settle(original, FINISHED, None, False)  # the handler succeeded
    assert h.sent == [commands.fin(ID)]  # one FIN: the original's


def test_a_dropped_copy_is_fined_once_its_originals_fin_fails(h: Harness) -> None:
    """Seen on the real server (tests/both/test_ordered.py): the copy came while the original
    was unanswered, yet the original's FIN failed and the server still held one message in
    flight: the copy, recorded after that FIN. The id is FINed once more, and the failures of
    both FINs are expected, not server errors."""
    original = h.deliver()
    h.deliver()  # the copy, dropped
    h.link.settle(original, FINISHED, None, False)
    assert h.sent == [commands.fin(ID)]
    failed = error_from_payload(b"E_FIN_FAILED FIN [0 0 0 0 0 0 0 2 0 0 0 0 0 0 0 0] failed "
                                b"ErrType:7 ErrCode:0 : Message ID not in flight", "FIN")
    assert h.link.expected_error(failed)  # the original's FIN failed: FIN again
    assert h.sent == [commands.fin(ID), commands.fin(ID)]
    assert h.link.expected_error(failed)  # that FIN failed too: the copy was not in flight
    assert h.sent == [commands.fin(ID), commands.fin(ID)] and h.reported == []
    # nothing else is expected: a third refusal is held until the next delivery, which
    # is no copy of the id, and then reported
    assert h.link.expected_error(failed) and h.reported == []
    h.deliver(msg_id=NEXT, offset=1)
    assert h.reported == [failed]


def test_a_copy_while_another_thread_claims_the_original_is_not_answered(h: Harness) -> None:
    """The sync facade's handler thread claimed the FIN; the loop has not sent it yet: the
    copy came before it and is not in flight."""
    original = h.deliver()
    original._state = claimed(FINISHED)
    h.deliver()
    assert h.sent == [] and h.duplicates == 1


def test_a_copy_after_the_fin_is_fined_and_its_failure_is_expected(h: Harness) -> None:
    original = h.deliver()
    h.link.settle(original, FINISHED, None, False)
    h.deliver()
    assert h.sent == [commands.fin(ID), commands.fin(ID)]
    assert h.queued == [original] and h.duplicates == 1 and h.link.in_flight == 0
    assert h.rt.finished == 1  # the copy's FIN is not an answer to a delivery
    youzan = error_from_payload(b"E_FIN_FAILED FIN [0 0 0 0 0 0 0 2 0 0 0 0 0 0 0 0] failed "
                                b"ErrType:7 ErrCode:0 : Message ID not in flight", "FIN")
    other = error_from_payload(b"E_FIN_FAILED FIN [0 0 0 0 0 0 0 3 0 0 0 0 0 0 0 0] failed "
                               b"ErrType:7 ErrCode:0 : Message ID not in flight", "FIN")
    assert not h.link.expected_error(other)
    assert h.link.expected_error(youzan)
    # the original's FIN may be refused as well (seen on the real server: both FINs of the
    # id refused, the drain complete), but no more than the two FINs sent: a third is
    # reported once the next delivery shows it was no copy's
    assert h.link.expected_error(youzan)
    assert h.link.expected_error(youzan) and h.reported == []
    h.deliver(msg_id=NEXT, offset=1)
    assert h.reported == [youzan]


def test_a_copy_after_the_req_is_handled_as_a_delivery(h: Harness) -> None:
    original = h.deliver()
    h.link.settle(original, REQUEUED, 0.0, False)
    copy = h.deliver()
    assert h.queued == [original, copy] and h.duplicates == 0
    assert copy._state == PENDING and h.link.in_flight == 1
    again = h.deliver(attempts=2)  # the requeued original, once the copy was answered
    h.link.settle(copy, FINISHED, None, False)
    assert h.queued == [original, copy, again]


def test_a_redelivery_after_a_timeout_is_handled(h: Harness) -> None:
    original = h.deliver()
    h.link.settle(original, FINISHED, None, False)
    h.deliver()  # the late copy, FINed
    redelivered = h.deliver(attempts=2)  # (had the copy timed out)
    assert redelivered in h.queued and h.duplicates == 1


# -- the reset: the original's FIN refused before its copy comes (real server, ~1 in 100) --------

def test_a_refusal_before_the_copy_is_the_duplicates_not_a_server_error(h: Harness) -> None:
    """The reader's reset dropped the original from flight before our FIN came: the FIN is
    refused, then the copy comes (in flight). The refusal is held until the copy shows what
    it was, and is not reported; the copy is FINed, and one refusal of that FIN is still
    expected (were the server to refuse it too)."""
    original = h.deliver()
    h.link.settle(original, FINISHED, None, False)
    assert h.link.expected_error(REFUSED) and h.reported == []
    h.deliver()  # the copy
    assert h.sent == [commands.fin(ID), commands.fin(ID)] and h.duplicates == 1
    assert h.link.copy_fins.held is None
    h.deliver(msg_id=NEXT, offset=1)
    assert h.reported == []
    assert h.link.expected_error(REFUSED)  # the copy's FIN, refused after all: expected
    assert h.reported == []


def test_a_fin_that_came_too_late_is_reported_when_the_message_comes_back(h: Harness) -> None:
    """A handler slower than msg_timeout: nsqd requeued the message, refuses the FIN and
    delivers it again with attempts + 1; that redelivery reports the refusal."""
    original = h.deliver()
    h.link.settle(original, FINISHED, None, False)
    assert h.link.expected_error(REFUSED) and h.reported == []
    again = h.deliver(attempts=2)
    assert h.reported == [REFUSED] and again in h.queued and h.duplicates == 0


def test_a_held_refusal_is_reported_when_the_connection_closes(h: Harness) -> None:
    original = h.deliver()
    h.link.settle(original, FINISHED, None, False)
    assert h.link.expected_error(REFUSED)
    h.link.closed()
    assert h.reported == [REFUSED]


def test_only_the_last_delivered_and_finished_message_is_held(h: Harness) -> None:
    """A refusal naming another id, or a message not FINed yet, is reported at once."""
    original = h.deliver()
    assert not h.link.expected_error(REFUSED)  # PENDING: our FIN has not even left
    h.link.settle(original, FINISHED, None, False)
    other = error_from_payload(b"E_FIN_FAILED FIN [0 0 0 0 0 0 0 9 0 0 0 0 0 0 0 0] failed "
                               b"ErrType:7 ErrCode:0 : Message ID not in flight", "FIN")
    assert not h.link.expected_error(other)
