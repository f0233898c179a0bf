"""A topic that is not there: ``retry.decide`` asks for a lookup check, ``retry.topic_gone``
says whether to give up with ``TopicNotFound`` (pure, in memory, and over its inputs with
hypothesis).

The rules: ``E_TOPIC_NOT_EXIST`` after a publish is retried only while lookup still lists the
topic (a topic being created, a partition moving) or could not be asked (a lookupd down says
nothing about the topic); lookup saying the topic is gone, or a node asked directly
(``nsqd=``: no lookup, the node is the only authority) answering it, gives up at once with a
``TopicNotFound`` naming how to create the topic, caused by the server's error.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq.errors import (
    ERROR_TABLE,
    TopicNotFound,
    TopicNotWritable,
    error_from_payload,
)
from smartnsq.producer.retry import (
    TOPIC_NOT_EXIST,
    Decision,
    Lookup,
    Next,
    Stage,
    decide,
    missing_topic,
    topic_gone,
)

COMMANDS = ["PUB", "MPUB", "PUB_TRACE", "MPUB_TRACE", "PUB_EXT", "MPUB_EXT", "DPUB"]


def _decide(error: BaseException, stage: Stage = Stage.SEND, time_left: float = 5.0,
            closing: bool = False) -> Decision:
    return decide(error, stage, 1, time_left, pinned=False, closing=closing, topic="t",
                  timeout=10.0, retry_delay=0.05, retry_delay_max=1.0, rng=random.Random(0))


def test_topic_not_exist_after_a_publish_asks_lookup_before_the_retry() -> None:
    error = error_from_payload(b"E_TOPIC_NOT_EXIST ", "PUB")
    decision = _decide(error)
    assert decision.next is Next.REFRESH_AND_RETRY
    assert decision.check_topic


def test_other_refusals_ask_nothing() -> None:
    for code in ("E_FAILED_ON_NOT_LEADER", "E_FAILED_ON_NOT_WRITABLE", "E_PUB_FAILED"):
        decision = _decide(error_from_payload(code.encode(), "PUB"))
        assert not decision.check_topic


def test_no_check_when_giving_up_anyway() -> None:
    error = error_from_payload(b"E_TOPIC_NOT_EXIST", "PUB")
    for decision in (_decide(error, time_left=0.0), _decide(error, closing=True)):
        assert decision.next is Next.GIVE_UP
        assert not decision.check_topic


def test_lookup_saying_gone_gives_up_naming_how_to_create_it() -> None:
    error = error_from_payload(b"E_TOPIC_NOT_EXIST ", "PUB")
    gone = topic_gone("orders", error, Lookup.GONE, node="127.0.0.1:4150")
    assert isinstance(gone, TopicNotFound) and type(gone) is TopicNotFound
    assert gone.topic == "orders"
    assert gone.__cause__ is error
    text = str(gone)
    assert "'orders'" in text and "127.0.0.1:4150" in text and "E_TOPIC_NOT_EXIST" in text
    assert "create_topic" in text and "/topic/create" in text


def test_a_topic_lookup_shows_without_channel_gives_up_with_that() -> None:
    """Lookup's own answer wins when it says more (no partition writable: create a channel)."""
    error = error_from_payload(b"E_TOPIC_NOT_EXIST", "PUB")
    hidden = TopicNotWritable("orders", "Topic has no channel")
    gone = topic_gone("orders", error, Lookup.GONE, node="n:1", found=hidden)
    assert gone is hidden and gone.__cause__ is error


def test_a_node_asked_directly_is_the_authority() -> None:
    error = error_from_payload(b"E_TOPIC_NOT_EXIST", "MPUB")
    gone = topic_gone("orders", error, Lookup.NONE, node="127.0.0.1:4150")
    assert isinstance(gone, TopicNotFound) and gone.__cause__ is error
    assert "127.0.0.1:4150" in str(gone) and "lookupd=" in str(gone)


def test_listed_or_silent_lookup_keeps_retrying() -> None:
    error = error_from_payload(b"E_TOPIC_NOT_EXIST", "PUB")
    assert topic_gone("t", error, Lookup.LISTED, node="n:1") is None
    assert topic_gone("t", error, Lookup.SILENT, node="n:1") is None


def test_missing_topic_keeps_the_topic_and_a_subclass_as_is() -> None:
    plain = missing_topic(TopicNotFound("orders"))
    assert type(plain) is TopicNotFound and plain.topic == "orders"
    assert "create it first" in str(plain) and not plain.retriable
    hidden = TopicNotWritable("orders", "x")
    assert missing_topic(hidden) is hidden


@settings(max_examples=300, deadline=None)
@given(code=st.sampled_from(sorted(ERROR_TABLE)), command=st.sampled_from(COMMANDS),
       stage=st.sampled_from(list(Stage)), attempt=st.integers(1, 50),
       time_left=st.floats(-1, 30, allow_nan=False), pinned=st.booleans(),
       closing=st.booleans())
def test_only_a_retried_topic_not_exist_after_a_send_checks(
        code: str, command: str, stage: Stage, attempt: int, time_left: float, pinned: bool,
        closing: bool) -> None:
    error = error_from_payload(code.encode(), command)
    decision = decide(error, stage, attempt, time_left, pinned=pinned, closing=closing,
                      topic="t", timeout=10.0, retry_delay=0.05, retry_delay_max=1.0,
                      rng=random.Random(attempt))
    assert decision.check_topic == (code == TOPIC_NOT_EXIST and stage is Stage.SEND
                                    and decision.next is not Next.GIVE_UP)


@settings(max_examples=200, deadline=None)
@given(answer=st.sampled_from(list(Lookup)), command=st.sampled_from(COMMANDS),
       topic=st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True),
       node=st.one_of(st.none(), st.just("127.0.0.1:4150")))
def test_gives_up_exactly_when_lookup_or_the_node_says_so(
        answer: Lookup, command: str, topic: str, node: str | None) -> None:
    error = error_from_payload(b"E_TOPIC_NOT_EXIST", command)
    gone = topic_gone(topic, error, answer, node=node)
    if answer in (Lookup.GONE, Lookup.NONE):
        assert isinstance(gone, TopicNotFound) and gone.topic == topic
        assert gone.__cause__ is error and not gone.retriable
        assert "create" in str(gone)
    else:
        assert gone is None
