"""The producer's one retry decision (``smartnsq.producer.retry.decide``), branch by branch.

Every failure kind at every stage, for first and later attempts, with and without time left,
pinned or not, closing or not: the expected next step is a table; the invariants (no attempt
with no time left, no back-off past the deadline, a pinned message keeps its partition) are
checked over the whole product.
"""

from __future__ import annotations

import itertools
import random
import ssl

import pytest

from smartnsq.errors import (
    ConnectionClosed,
    ConnectionFailed,
    InvalidArgument,
    LookupFailed,
    NodeBackoff,
    NoLeader,
    NonRetriableServerError,
    ProducerClosed,
    RefreshLookupError,
    RetriableServerError,
    Timeout,
    TopicNotFound,
)
from smartnsq.producer.retry import Decision, Next, Stage, decide

BASE, CAP = 0.05, 1.0
R, A, N, G = Next.REFRESH_AND_RETRY, Next.RETRY_AFTER, Next.RETRY_NOW, Next.GIVE_UP


def failures() -> dict[str, BaseException]:
    return {
        "not leader": RefreshLookupError("E_FAILED_ON_NOT_LEADER", "", "PUB"),
        "not writable": RefreshLookupError("E_FAILED_ON_NOT_WRITABLE", "", "PUB"),
        "pub failed": RetriableServerError("E_PUB_FAILED", "", "PUB"),
        "bad message": NonRetriableServerError("E_BAD_MESSAGE", "", "PUB"),
        "no leader": NoLeader("partition 1 has no leader"),
        "closed": ConnectionClosed("reset"),
        "conn error": ConnectionFailed("refused"),
        "node backoff": NodeBackoff(("127.0.0.1", 4150), 0.7, None),
        "timeout": Timeout("no answer"),
        "os error": OSError("unreachable"),
        "lookup failed": LookupFailed("no lookupd answered"),
        "topic not found": TopicNotFound("t"),
        "producer closed": ProducerClosed("closing"),
        "invalid": InvalidArgument("partition", "too big", 9),
        "bug": RuntimeError("unexpected"),
    }


# (failure, stage) -> (next on attempt 1, next on attempt 3); missing pairs: give up
TABLE: dict[tuple[str, Stage], tuple[Next, Next]] = {
    ("not leader", Stage.SEND): (R, R),
    ("not writable", Stage.SEND): (R, R),
    ("not leader", Stage.CONNECT): (A, A),
    ("not writable", Stage.CONNECT): (A, A),
    ("not leader", Stage.ROUTE): (A, A),
    ("not writable", Stage.ROUTE): (A, A),
    ("pub failed", Stage.SEND): (A, A),
    ("pub failed", Stage.CONNECT): (A, A),
    ("pub failed", Stage.ROUTE): (A, A),
    ("no leader", Stage.ROUTE): (R, R),
    ("no leader", Stage.CONNECT): (R, R),
    ("no leader", Stage.SEND): (R, R),
    ("closed", Stage.SEND): (N, A),
    ("conn error", Stage.SEND): (N, A),
    ("node backoff", Stage.SEND): (N, A),
    ("closed", Stage.CONNECT): (A, A),
    ("conn error", Stage.CONNECT): (A, A),
    ("node backoff", Stage.CONNECT): (A, A),
    ("timeout", Stage.CONNECT): (A, A),
    ("os error", Stage.CONNECT): (A, A),
    ("timeout", Stage.ROUTE): (A, A),
    ("lookup failed", Stage.ROUTE): (A, A),
    ("timeout", Stage.SEND): (R, R),
}


def run(error: BaseException, stage: Stage, attempt: int = 1, time_left: float = 5.0, *,
        pinned: bool = False, closing: bool = False, seed: int = 1) -> Decision:
    return decide(error, stage, attempt, time_left, pinned=pinned, closing=closing,
                  topic="orders", timeout=5.0, retry_delay=BASE, retry_delay_max=CAP,
                  rng=random.Random(seed))


@pytest.mark.parametrize(("name", "stage"),
                         list(itertools.product(failures(), list(Stage))))
def test_the_table(name: str, stage: Stage) -> None:
    first, later = TABLE.get((name, stage), (G, G))
    for attempt, expected in ((1, first), (3, later)):
        error = failures()[name]
        decision = run(error, stage, attempt)
        assert decision.next is expected, (name, stage, attempt, decision)
        if expected is G:
            assert decision.error is error  # raised as it is
        elif expected is N:
            assert decision.delay == 0
        else:
            assert 0 < decision.delay <= CAP


def test_back_off_doubles_per_attempt_up_to_the_cap() -> None:
    error = RetriableServerError("E_PUB_FAILED", "", "PUB")
    delays = [run(error, Stage.SEND, n, 100.0).delay for n in range(1, 10)]
    assert delays[0] <= BASE and delays[1] <= 2 * BASE and delays[-1] <= CAP
    assert delays[-1] >= CAP / 2  # jitter cuts at most half
    lost = [run(ConnectionClosed("x"), Stage.SEND, n, 100.0).delay for n in (2, 3)]
    assert lost[0] <= BASE < lost[1]  # a lost connection backs off one step behind


def test_a_certificate_that_does_not_verify_is_not_retried() -> None:
    verify = ssl.SSLCertVerificationError(1, "certificate verify failed")
    wrapped = ConnectionFailed("TLS handshake failed")
    wrapped.__cause__ = verify
    backing_off = NodeBackoff(("127.0.0.1", 1), 0.5, wrapped)
    for error in (wrapped, backing_off):
        decision = run(error, Stage.CONNECT)
        assert decision.next is G and decision.error is error
    refused = ConnectionFailed("refused")
    refused.__cause__ = ConnectionRefusedError()
    assert run(refused, Stage.CONNECT).next is A
    flagged = ConnectionFailed("not worth retrying")
    flagged.retriable = False  # type: ignore[misc]
    assert run(flagged, Stage.CONNECT).next is G


def test_a_node_backing_off_is_waited_out_unless_the_routes_change() -> None:
    # (the wait is Producer's: every back-off ends at a route change of the topic, so a
    # publish to a node that left follows the new leader; tests/integration/
    # test_failover_recovery.py)
    decision = run(NodeBackoff(("127.0.0.1", 1), 0.7, None), Stage.CONNECT)
    assert decision.next is A and decision.delay >= 0.7


@pytest.mark.parametrize(("name", "stage"),
                         list(itertools.product(failures(), list(Stage))))
def test_no_attempt_with_no_time_left(name: str, stage: Stage) -> None:
    error = failures()[name]
    for time_left in (0.0, -0.03):
        decision = run(error, stage, 2, time_left)
        assert decision.next is G
        if (name, stage) in TABLE:  # would have retried: the deadline's Timeout instead
            assert isinstance(decision.error, Timeout)
            assert decision.error.__cause__ is error
            assert "within 5s" in str(decision.error)
        else:
            assert decision.error is error


@pytest.mark.parametrize(("name", "stage"), sorted(TABLE, key=str))
def test_a_back_off_never_runs_past_the_deadline(name: str, stage: Stage) -> None:
    for time_left, seed in itertools.product((0.001, 0.02, 0.3, 5.0), range(5)):
        decision = run(failures()[name], stage, 6, time_left, seed=seed)
        assert decision.next is not G
        assert decision.delay <= time_left


@pytest.mark.parametrize(("name", "stage"), sorted(TABLE, key=str))
def test_a_pinned_message_keeps_its_partition(name: str, stage: Stage) -> None:
    assert run(failures()[name], stage, pinned=True).keep_partition
    assert not run(failures()[name], stage, pinned=False).keep_partition


@pytest.mark.parametrize(("name", "stage"),
                         list(itertools.product(failures(), list(Stage))))
def test_closing_retries_nothing(name: str, stage: Stage) -> None:
    error = failures()[name]
    decision = run(error, stage, closing=True)
    assert decision.next is G
    if (name, stage) in TABLE:
        assert isinstance(decision.error, ProducerClosed)
        assert decision.error.__cause__ is error
    else:
        assert decision.error is error
