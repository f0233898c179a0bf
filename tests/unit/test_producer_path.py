"""The one publish path: one deadline rule, one maker of results, no import
circle inside ``smartnsq/producer``, and the blocking facade's answer slot.

``retry.answer_deadline`` is the only place a publish's time is cut to ``request_timeout``;
``results.Results`` is the only constructor of ``PublishResult``/``BatchResult`` the producer
uses; ``loop_thread.Slot`` is what ``sync.Producer.publish`` waits on.
"""

from __future__ import annotations

import ast
import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import smartnsq.producer as producer_package
from smartnsq import BatchResult, PublishResult
from smartnsq.errors import LoopTimeout
from smartnsq.producer.request import BatchRequest, Request
from smartnsq.producer.results import Results
from smartnsq.producer.retry import answer_deadline
from smartnsq.transport.loop_thread import LoopThread, Slot

# -- the deadline of one attempt ----------------------------------------------------------------


@pytest.mark.parametrize(("deadline", "now", "request_timeout", "expected"), [
    (10.0, 4.0, None, 10.0),  # no request_timeout: the call's deadline
    (10.0, 4.0, 2.0, 6.0),  # request_timeout ends first
    (10.0, 4.0, 6.0, 10.0),  # equal: the call's deadline
    (10.0, 4.0, 9.0, 10.0),  # the call's deadline ends first
    (10.0, 10.0, 2.0, 10.0),  # none left: at now, nothing may be sent
    (10.0, 11.0, 2.0, 10.0),  # past it: before now
])
def test_an_attempt_waits_until_the_call_deadline_or_request_timeout_whichever_first(
        deadline: float, now: float, request_timeout: float | None, expected: float) -> None:
    assert answer_deadline(deadline, now, request_timeout) == expected


def test_the_request_makes_the_call_deadline_from_its_start() -> None:
    request = Request("t", b"x", None, None, None, None, None, 2.5, 100.0)
    assert (request.start, request.deadline, request.timeout) == (100.0, 102.5, 2.5)
    batch = BatchRequest("t", [b"x"], None, None, None, None, 1.0, 7.0)
    assert batch.deadline == 8.0


# -- results --------------------------------------------------------------------------------


def _sent(topic: str = "t", target: int | None = 0, attempt: int = 1,
          address: tuple[str, int] = ("127.0.0.1", 4150)) -> Request:
    request = Request(topic, b"x", None, None, None, None, None, 1.0, 0.0)
    request.target, request.address, request.attempt = target, address, attempt
    request.traced = False
    return request


def test_a_plain_ok_to_a_first_attempt_is_one_shared_record_per_partition_and_node() -> None:
    results = Results()
    first = results.of(_sent(), b"OK", None)
    assert first == PublishResult("t", 0, "127.0.0.1:4150", None, None, None, None, 1)
    assert results.of(_sent(), b"OK", None) is first
    assert results.of(_sent(target=1), b"OK", None) is not first
    assert results.of(_sent(address=("127.0.0.1", 4151)), b"OK", None).node == "127.0.0.1:4151"
    assert results.of(_sent(topic="u"), b"OK", None).topic == "u"


def test_a_retried_publish_gets_its_own_record_with_its_attempts() -> None:
    results = Results()
    shared = results.of(_sent(), b"OK", None)
    retried = results.of(_sent(attempt=3), b"OK", None)
    assert retried is not shared and retried.attempts == 3 and shared.attempts == 1


def test_a_batch_gets_a_batch_result() -> None:
    batch = BatchRequest("t", [b"a", b"b"], None, None, None, None, 1.0, 0.0)
    batch.target, batch.address, batch.attempt, batch.traced = 2, ("127.0.0.1", 1), 1, False
    assert Results().of(batch, b"OK", None) == BatchResult("t", 2, "127.0.0.1:1", 2)


# -- no import circle inside the package ------------------------------------------------------


def _imports(path: Path) -> set[str]:
    """The sibling modules a producer module imports, TYPE_CHECKING blocks included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
    return found


def test_the_producer_package_has_no_import_circle() -> None:
    folder = Path(producer_package.__file__).parent
    graph = {p.stem: _imports(p) for p in folder.glob("*.py") if p.stem != "__init__"}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import circle: {' -> '.join((*path, module))}"
        if module in done:
            return
        for target in graph.get(module, ()):
            visit(target, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())


# -- the blocking facade's answer slot ----------------------------------------------------------


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread("test-slot").start()
    yield lt
    lt.stop()


def test_a_slot_settled_on_the_loop_wakes_its_caller_with_the_value(
        loop_thread: LoopThread) -> None:
    def settle_later(value: int, slot: Slot[int]) -> None:
        asyncio.get_running_loop().call_soon(slot.set_result, value)

    assert loop_thread.wait(loop_thread.call_slot(settle_later, 7), 5.0) == 7


def test_a_slot_raises_what_the_function_raises_or_what_settles_it(
        loop_thread: LoopThread) -> None:
    def refuse(slot: Slot[int]) -> None:
        raise ValueError("refused")

    def fail(slot: Slot[int]) -> None:
        slot.set_exception(KeyError("k"))

    with pytest.raises(ValueError, match="refused"):
        loop_thread.wait(loop_thread.call_slot(refuse), 5.0)
    with pytest.raises(KeyError):
        loop_thread.wait(loop_thread.call_slot(fail), 5.0)


def test_a_slot_not_settled_in_time_is_cancelled_on_the_loop(loop_thread: LoopThread) -> None:
    cancelled = threading.Event()

    def on_done(slot: Slot[int]) -> None:
        if slot.cancelled():
            cancelled.set()

    def never(slot: Slot[int]) -> None:
        slot.add_done_callback(on_done)

    slot = loop_thread.call_slot(never)
    with pytest.raises(LoopTimeout):
        loop_thread.wait(slot, 0.05)
    assert cancelled.wait(5.0)


def test_a_stopping_loop_thread_fails_a_slot_in_flight() -> None:
    lt = LoopThread("test-slot-stop").start()
    started = threading.Event()

    def never(slot: Slot[int]) -> None:
        started.set()

    slot = lt.call_slot(never)
    assert started.wait(5.0)
    lt.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        lt.wait(slot, 5.0)
