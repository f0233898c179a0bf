"""``producer.retry.decide`` over its whole input space (hypothesis).

Whatever the failure, stage, attempt, time left, pinning and closing, the decision is one of
the documented four, never retries with no time left or while closing, never waits past the
deadline, keeps a pinned message's partition, and gives a ``Timeout`` caused by the failure
when time is up."""

from __future__ import annotations

import random
import ssl

from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq.errors import (
    ERROR_TABLE,
    Action,
    ConnectionClosed,
    ConnectionFailed,
    InvalidArgument,
    LookupFailed,
    NodeBackoff,
    NoLeader,
    NotWritable,
    NSQError,
    ProducerClosed,
    ProtocolError,
    Timeout,
    TLSNotOffered,
    TLSVerificationFailed,
    TopicNotFound,
    error_from_payload,
)
from smartnsq.producer.retry import NOT_WRITABLE, Next, Stage, decide

CODES = [*sorted(ERROR_TABLE), "E_SOMETHING_NEW"]


def _errors() -> st.SearchStrategy[BaseException]:
    server = st.builds(lambda code, command: error_from_payload(f"{code} text".encode(), command),
                       st.sampled_from(CODES),
                       st.sampled_from([None, "PUB", "MPUB", "PUB_TRACE", "SUB", "FIN"]))
    cert = ssl.SSLCertVerificationError("certificate verify failed")
    wrapped_cert = ConnectionFailed("TLS handshake failed")
    wrapped_cert.__cause__ = cert
    fixed = st.sampled_from([
        NoLeader("partition 0 has no leader now"),
        NotWritable("partition 0 is not writable now"),
        LookupFailed("no lookupd answered"), TopicNotFound("t"), Timeout("no answer"),
        ConnectionFailed("reset"), ConnectionClosed("closed"), ProducerClosed("closing"),
        OSError("refused"), cert, wrapped_cert, TLSVerificationFailed("h:1", "expired"),
        TLSNotOffered("h:1"), ProtocolError("garbage"), InvalidArgument("x", "bad"),
        ValueError("a bug"), RuntimeError("a bug"),
    ])
    backoff = st.builds(lambda s: NodeBackoff(("h", 1), s, None),
                        st.floats(0, 120, allow_nan=False))
    return st.one_of(server, fixed, backoff)


inputs = st.fixed_dictionaries({
    "error": _errors(),
    "stage": st.sampled_from(list(Stage)),
    "attempt": st.integers(1, 10_000),
    "time_left": st.one_of(st.floats(-100, 1e6, allow_nan=False), st.just(0.0)),
    "pinned": st.booleans(),
    "closing": st.booleans(),
    "timeout": st.floats(0.001, 1e6, allow_nan=False),
    "retry_delay": st.floats(0.001, 10, allow_nan=False),
    "extra": st.floats(0, 100, allow_nan=False),
    "seed": st.integers(0, 2**32 - 1),
})


def run(args: dict) -> object:
    return decide(args["error"], args["stage"], args["attempt"], args["time_left"],
                  pinned=args["pinned"], closing=args["closing"], topic="t",
                  timeout=args["timeout"], retry_delay=args["retry_delay"],
                  retry_delay_max=args["retry_delay"] + args["extra"],
                  rng=random.Random(args["seed"]))


@settings(max_examples=600, deadline=None)
@given(inputs)
def test_every_decision_keeps_the_rules(args: dict) -> None:
    error = args["error"]
    decision = run(args)
    assert decision.next in set(Next)
    if decision.next is Next.GIVE_UP:
        assert isinstance(decision.error, BaseException)
        assert not decision.probe
        return
    # a retry: only with time left, never while closing, never past the deadline
    assert args["time_left"] > 0 and not args["closing"]
    assert decision.error is None
    assert 0 <= decision.delay <= args["time_left"]
    cap = args["retry_delay"] + args["extra"]
    if isinstance(error, NodeBackoff):
        cap = max(cap, error.retry_in)
    assert decision.delay <= cap + 1e-9
    assert decision.keep_partition is args["pinned"]
    if decision.probe:
        assert args["pinned"] and args["stage"] is Stage.SEND
        assert getattr(error, "code", None) == NOT_WRITABLE
    # what is never retried
    assert not isinstance(error, InvalidArgument | TopicNotFound | ProducerClosed)
    assert getattr(error, "action", None) is not Action.GIVE_UP
    assert not isinstance(error, TLSVerificationFailed | TLSNotOffered | ssl.SSLError)


@settings(max_examples=200, deadline=None)
@given(inputs)
def test_no_time_left_gives_up_with_a_timeout_caused_by_the_failure(args: dict) -> None:
    args = {**args, "time_left": -abs(args["time_left"]), "closing": False}
    decision = run(args)
    assert decision.next is Next.GIVE_UP
    if isinstance(decision.error, Timeout) and decision.error is not args["error"]:
        assert decision.error.__cause__ is args["error"]
        assert "not acknowledged within" in str(decision.error)


@settings(max_examples=200, deadline=None)
@given(inputs)
def test_closing_gives_up(args: dict) -> None:
    decision = run({**args, "closing": True})
    assert decision.next is Next.GIVE_UP
    assert isinstance(decision.error, NSQError | ValueError | RuntimeError | OSError)


@settings(max_examples=200, deadline=None)
@given(inputs, st.sampled_from([NoLeader("x"), NotWritable("y")]))
def test_no_leader_refreshes_lookup_while_time_is_left(args: dict, error: NoLeader) -> None:
    args = {**args, "error": error, "closing": False, "time_left": abs(args["time_left"]) + 0.1}
    assert run(args).next is Next.REFRESH_AND_RETRY


@settings(max_examples=100, deadline=None)
@given(inputs)
def test_missing_routes_are_retried_while_time_is_left(args: dict) -> None:
    args = {**args, "error": LookupFailed("no lookupd answered"), "stage": Stage.ROUTE,
            "closing": False, "time_left": abs(args["time_left"]) + 0.1}
    assert run(args).next is Next.RETRY_AFTER
