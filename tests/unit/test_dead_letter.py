"""``dead_letter``'s pure decisions and the give-up path's answers, in memory.

Which messages may be parked (ordered ones only with the opt-in), what the copy's origin
headers say (and that youzan's header rules take them), the last error's one bounded line, and
the order of the answers: FIN only after the park is confirmed, REQ (never FIN) when it fails.
The real publishes are in ``tests/both/test_dead_letter_both.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from smartnsq.consumer import deadletter as dl
from smartnsq.consumer.config import ConsumerConfig
from smartnsq.consumer.handling import PARK_RETRY_FLOOR, failed, give_up, undecodable
from smartnsq.consumer.runtime import Runtime
from smartnsq.errors import InvalidArgument, ProtocolError
from smartnsq.message import FINISHED, PENDING, REQUEUED, Message
from smartnsq.model.backoff import RequeuePolicy
from smartnsq.protocol import commands
from smartnsq.protocol import validate as v

PARTITION = 3
INTERNAL_ID = (PARTITION << 50) | 7


def youzan_message(attempts: int = 4, *, trace_id: int = 99, offset: int | None = 340,
                   headers: bytes | None = b'{"k":"v","##trace_id":"99","n":5}') -> Message:
    msg_id = INTERNAL_ID.to_bytes(8, "big") + trace_id.to_bytes(8, "big")
    return Message(0, attempts, msg_id, b"poison", 4 if headers else 0, headers,
                   queue_offset=offset, raw_size=40)


def classic_message(attempts: int = 4) -> Message:
    return Message(0, attempts, b"0a1b2c3d4e5f6071", b"poison", youzan=False)


class FakeLink:
    """A responder that records the consumer's answers."""

    topic, channel, node = "orders", "billing", "127.0.0.1:4150"

    def __init__(self, ordered: bool = False) -> None:
        self.ordered = ordered
        self.dead = False
        self.answers: list[tuple[str, bool]] = []
        self.delays: list[float | None] = []

    def settle(self, message: Message, state: int, delay: float | None,
               backoff: bool) -> None:
        message._state = state
        self.answers.append(("FIN" if state == FINISHED else "REQ", backoff))
        self.delays.append(delay)

    def answer(self, message: Message, state: int, delay: float | None,
               backoff: bool) -> None:
        self.settle(message, state, delay, backoff)

    def touch(self, message: Message) -> None: ...

    def give_back(self, message: Message) -> None:
        self.settle(message, REQUEUED, 0.0, False)


def delivered(msg: Message, link: FakeLink) -> Message:
    msg._responder = link
    msg._state = PENDING
    msg._auto = True
    return msg


def runtime(**options: Any) -> tuple[Runtime, list[tuple[Message, str]]]:
    """A runtime whose dead-letter target is a recording hook (or ``options``' own)."""
    parked: list[tuple[Message, str]] = []
    options.setdefault("max_attempts", 3)

    def hook(message: Message) -> None:
        parked.append((message, "hook"))

    options.setdefault("dead_letter", hook)
    cfg = ConsumerConfig(**options)
    rt = Runtime("orders", "billing", cfg)
    rt.dead_letters = dl.DeadLetters("orders", "billing", cfg, _no_producer)
    return rt, parked


def _no_producer() -> Any:
    raise AssertionError("no producer in these tests")


# -- which messages are parked ------------------------------------------------------------


def test_ordered_messages_are_parked_only_with_the_opt_in() -> None:
    def hook(m: Message) -> None: ...

    assert not dl.applies(ConsumerConfig(), ordered=False)
    plain = ConsumerConfig(max_attempts=2, dead_letter="orders_dead")
    assert dl.applies(plain, ordered=False) and not dl.applies(plain, ordered=True)
    opted = dataclasses.replace(plain, dead_letter=hook, dead_letter_ordered=True)
    assert dl.applies(opted, ordered=True) and dl.applies(opted, ordered=False)


@pytest.mark.parametrize(("options", "name"), [
    ({"dead_letter": "orders_dead", "max_attempts": 0}, "dead_letter"),  # never past it
    ({"dead_letter": "bad topic!", "max_attempts": 2}, "dead_letter"),
    ({"dead_letter": 42, "max_attempts": 2}, "dead_letter"),
    ({"dead_letter_ordered": True, "max_attempts": 2}, "dead_letter_ordered"),
    ({"dead_letter_ordered": 1, "dead_letter": "d", "max_attempts": 2},
     "dead_letter_ordered"),
])
def test_a_dead_letter_that_cannot_work_is_refused_when_built(options: dict[str, Any],
                                                               name: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        ConsumerConfig(**options)
    assert name in str(caught.value)


# -- what the copy says -------------------------------------------------------------------


def test_the_origin_headers_of_a_youzan_message() -> None:
    msg = youzan_message()
    headers = dl.origin_headers(msg, "orders", "billing", "RuntimeError: boom")
    assert headers == {
        "smartnsq.dl.topic": "orders", "smartnsq.dl.channel": "billing",
        "smartnsq.dl.partition": str(PARTITION), "smartnsq.dl.offset": "340",
        "smartnsq.dl.attempts": "4", "smartnsq.dl.error": "RuntimeError: boom",
        "smartnsq.dl.trace_id": "99", "smartnsq.dl.id": str(INTERNAL_ID)}
    assert all(name.startswith(dl.HEADER_PREFIX) for name in headers)
    # the names and values pass the server's header rules, and encode as one JSON object
    v.check_headers({**dl.copy_headers(msg.headers), **headers})
    assert commands.encode_headers(headers).startswith(b'{"smartnsq.dl.topic":"orders"')


def test_the_origin_headers_of_a_message_without_partition_offset_or_trace() -> None:
    assert dl.origin_headers(classic_message(), "t", "c", "E") == {
        "smartnsq.dl.topic": "t", "smartnsq.dl.channel": "c", "smartnsq.dl.attempts": "4",
        "smartnsq.dl.error": "E", "smartnsq.dl.id": "0a1b2c3d4e5f6071"}
    plain = dl.origin_headers(youzan_message(trace_id=0, offset=None), "t", "c", "E")
    assert "smartnsq.dl.trace_id" not in plain and "smartnsq.dl.offset" not in plain
    assert plain["smartnsq.dl.partition"] == str(PARTITION)


def test_the_original_headers_are_kept_but_the_trace_header_and_old_origins() -> None:
    copied = dl.copy_headers({"k": "v", "##trace_id": "99", "n": "5",
                              "smartnsq.dl.topic": "older", "bad name": "x"})
    assert copied == {"k": "v", "n": "5"}


def test_the_last_error_is_one_bounded_line() -> None:
    long = RuntimeError("first line " + "x" * 1000 + "\nsecond line")
    line = dl.error_line(long)
    assert "\n" not in line and len(line) == dl.MAX_ERROR_LENGTH
    assert line.startswith("RuntimeError: first line") and line.endswith("...")
    assert dl.error_line(ValueError()) == "ValueError"
    assert dl.error_line("a\n b\tc") == "a b c"
    assert dl.error_line(None) == dl.UNKNOWN_ERROR


def test_last_errors_are_bounded_and_forgotten_once_parked() -> None:
    errors = dl.LastErrors(limit=2)
    for n in range(3):
        errors.note(b"%016d" % n, KeyError(n))
    assert len(errors) == 2
    assert errors.peek(b"%016d" % 0) == dl.UNKNOWN_ERROR  # the oldest went first
    assert errors.pop(b"%016d" % 2) == "KeyError: 2"
    assert errors.pop(b"%016d" % 2) == dl.UNKNOWN_ERROR


# -- the answers --------------------------------------------------------------------------


def test_a_failed_attempt_notes_the_error_its_copy_will_carry() -> None:
    rt, _ = runtime()
    link = FakeLink()
    msg = delivered(youzan_message(attempts=3), link)
    failed(rt, msg, link, RuntimeError("db down"))
    assert link.answers == [("REQ", True)]
    assert rt.dead_letters is not None
    assert rt.dead_letters.errors.peek(msg.id) == "RuntimeError: db down"


def test_past_max_attempts_the_message_is_parked_then_fined() -> None:
    rt, parked = runtime()
    link = FakeLink()
    msg = delivered(youzan_message(), link)
    assert asyncio.run(give_up(rt, msg, link))
    assert parked == [(msg, "hook")] and link.answers == [("FIN", False)]
    assert rt.give_ups == 1 and rt.dead_letters is not None and rt.dead_letters.parked == 1


def test_a_park_that_fails_requeues_and_never_fins() -> None:
    def broken(message: Message) -> None:
        raise ConnectionError("dead-letter store unreachable")

    rt, _ = runtime(dead_letter=broken, requeue_policy=RequeuePolicy(initial=0.0))
    link = FakeLink()
    msg = delivered(youzan_message(), link)
    assert asyncio.run(give_up(rt, msg, link))
    assert link.answers == [("REQ", True)]
    assert link.delays == [PARK_RETRY_FLOOR]  # (not the policy's 0: the target is down)
    assert rt.dead_letters is not None and rt.dead_letters.parked == 0


def test_an_async_hook_is_awaited_before_the_fin() -> None:
    order: list[str] = []

    async def hook(message: Message) -> None:
        await asyncio.sleep(0)
        order.append("parked")

    rt, _ = runtime(dead_letter=hook)
    link = FakeLink()
    msg = delivered(youzan_message(), link)
    original = link.settle

    def settle(message: Message, state: int, delay: float | None, backoff: bool) -> None:
        order.append("FIN" if state == FINISHED else "REQ")
        original(message, state, delay, backoff)

    link.settle = settle  # type: ignore[method-assign]
    assert asyncio.run(give_up(rt, msg, link))
    assert order == ["parked", "FIN"]


def test_an_ordered_message_is_not_skipped_without_the_opt_in() -> None:
    rt, parked = runtime()
    link = FakeLink(ordered=True)
    msg = delivered(youzan_message(), link)
    assert not asyncio.run(give_up(rt, msg, link))  # handled again
    assert parked == [] and link.answers == []
    rt, parked = runtime(dead_letter_ordered=True)
    assert asyncio.run(give_up(rt, msg, link))
    assert parked == [(msg, "hook")] and link.answers == [("FIN", False)]


def test_an_undecodable_body_is_parked_past_max_attempts_with_its_reason() -> None:
    seen: list[str] = []

    def hook(message: Message) -> None:
        assert message.body_error is not None
        seen.append(str(message.body_error))

    rt, _ = runtime(dead_letter=hook)
    link = FakeLink()
    early = delivered(youzan_message(attempts=2), link)
    early._body_error = ProtocolError("gzip: not a gzip stream")
    asyncio.run(undecodable(rt, early, link))
    assert link.answers == [("REQ", False)] and seen == []  # not yet past max_attempts
    late = delivered(youzan_message(attempts=4), link)
    late._body_error = ProtocolError("gzip: not a gzip stream")
    asyncio.run(undecodable(rt, late, link))
    assert seen == ["gzip: not a gzip stream"] and link.answers[-1] == ("FIN", False)


# -- the counters -------------------------------------------------------------------------


def test_the_snapshot_and_prometheus_count_the_parked_messages() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    from smartnsq.consumer.observe import snapshot
    from smartnsq.observability import prometheus

    rt, _ = runtime()
    link = FakeLink()
    for n in range(2):
        msg = delivered(youzan_message(), link)
        msg.id = bytes([n]) + msg.id[1:]
        assert asyncio.run(give_up(rt, msg, link))
    stats = snapshot(rt, None, None, 10, None)
    assert (stats.dead_lettered, stats.give_ups) == (2, 2)

    class Client:
        channel = "billing"

        def stats(self, **kwargs: Any) -> Any:
            return stats

    registry = prometheus_client.CollectorRegistry()
    registry.register(prometheus.Collector(Client()))
    text = prometheus_client.generate_latest(registry).decode()
    samples = {s.name: s.value for family in text_string_to_metric_families(text)
               for s in family.samples if s.labels.get("topic") == "orders"}
    assert samples["smartnsq_consumer_dead_lettered_messages_total"] == 2
    assert samples["smartnsq_consumer_give_ups_total"] == 2
