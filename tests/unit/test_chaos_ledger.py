"""The total-queue check's verdict on one topic (``smartnsq.devcluster.chaos``): what counts as
lost, phantom, duplicated and as a per-key order violation.

A publish that failed is unacknowledged: the server may still have stored it, and the
publisher has gone on with the key's next message, so such a message may show up anywhere in
the key's order without breaking the guarantee; acknowledged messages must keep theirs.
"""

from __future__ import annotations

from smartnsq.devcluster.chaos import _Ledger


def ledger(acked: list[str], unacked: list[str], delivered: list[str]) -> _Ledger:
    book = _Ledger("t", ordered=True)
    book.attempted.update(acked, unacked)
    book.acked.update(acked)
    for body in delivered:
        book.delivered(body)
    return book


def test_acknowledged_messages_out_of_order_are_a_violation() -> None:
    report = ledger(["k:0", "k:1", "k:2"], [], ["k:0", "k:2", "k:1"]).report(0.0, 1.0)
    assert report.order_violations == 1 and not report.ok


def test_an_unacknowledged_message_stored_late_is_not_a_violation() -> None:
    # k:1 timed out for the publisher, who went on with k:2; the server kept k:1 after all
    report = ledger(["k:0", "k:2"], ["k:1"], ["k:0", "k:2", "k:1"]).report(0.0, 1.0)
    assert report.order_violations == 0 and report.ok
    assert report.delivered == 3 and report.unacknowledged == 1 and report.phantom == 0


def test_lost_phantom_and_duplicates_are_counted_apart() -> None:
    book = ledger(["k:0", "k:1"], [], ["k:0", "k:0", "x:9"])
    report = book.report(0.0, 1.0)
    assert report.lost == 1 and report.lost_examples == ["k:1@pNone"]
    assert report.phantom == 1 and report.duplicated == 1 and not report.ok
