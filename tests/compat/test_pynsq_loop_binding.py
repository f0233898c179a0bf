"""Which event loop a pynsq Reader or Writer runs its handlers and callbacks on.

pynsq binds each Reader and Writer to ``IOLoop.current()`` when it is built; tornado's
``AsyncTestCase`` makes a new loop current for every test, and a Reader built in the test
must run its handler on that loop. A Reader whose loop is closed (the test case's
``tearDown``) without ``close()`` must not outlive it, consuming for a handler that can never
run again.
"""

from __future__ import annotations

import asyncio
import threading
import time
import unittest
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pynsq_support import DEADLINE, classic_nsqd, in_thread

import smartnsq.compat.pynsq_loops as loops
from smartnsq.compat import pynsq as nsq
from smartnsq.compat.pynsq import reader as pynsq_reader
from smartnsq.transport import loop_thread


@pytest.fixture(scope="module")
def nsqd() -> Iterator[str]:
    """A classic dev nsqd with topics ``t1``..``t4`` (channel ``c``)."""
    with classic_nsqd("binding-devcluster", "t1", "t2", "t3", "t4") as cluster:
        yield cluster.nsqd_tcp_addresses[0]


@pytest.fixture
def nsqd_on_class(request: pytest.FixtureRequest, nsqd: str) -> None:
    request.cls.nsqd = nsqd


def poll(condition: Callable[[], bool], bound: float = DEADLINE) -> bool:
    """Poll ``condition`` until it holds or ``bound`` passes."""
    deadline = time.monotonic() + bound
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)  # polling a condition, with a deadline
    return True


def test_each_object_binds_to_the_loop_current_when_it_is_built(nsqd: str) -> None:
    """No current loop: the first Reader gets a new one; a loop made current afterwards is
    the one the next Reader and Writer use, and the one run() runs (pynsq's IOLoop.current())."""

    def scenario() -> None:
        first = nsq.Reader("t1", "c", lambda m: True, nsqd_tcp_addresses=nsqd)
        made = first.io_loop
        assert asyncio.get_event_loop_policy().get_event_loop() is made  # set as current
        mine = asyncio.new_event_loop()
        asyncio.set_event_loop(mine)
        got: list[tuple[bytes, asyncio.AbstractEventLoop]] = []
        answers: list[Any] = []

        def both_seen() -> None:
            if got and answers:
                nsq.stop()

        def handler(message: nsq.Message) -> bool:
            got.append((message.body, asyncio.get_running_loop()))
            both_seen()
            return True

        def callback(conn: Any, data: Any) -> None:
            answers.append((data, asyncio.get_running_loop()))
            both_seen()

        second = nsq.Reader("t2", "c", handler, nsqd_tcp_addresses=nsqd)
        writer = nsq.Writer(nsqd)
        try:
            assert second.io_loop is mine and writer.io_loop is mine
            assert loops.user_loop() is mine
            writer.pub("t2", b"on mine", callback)
            watchdog = threading.Timer(DEADLINE, nsq.stop)
            watchdog.start()
            try:
                nsq.run()
            finally:
                watchdog.cancel()
            assert got == [(b"on mine", mine)]
            assert answers == [(b"OK", mine)]
        finally:
            writer.close()
            second.close().result(DEADLINE)
            first.close().result(DEADLINE)
            asyncio.set_event_loop(None)
            mine.close()
        assert made.is_closed()  # the one the layer made went with its last user

    in_thread(scenario)


def test_a_reader_whose_loop_closed_does_not_outlive_it(nsqd: str) -> None:
    """The loop closed (a test case's tearDown) while the Reader was never closed: the
    Reader closes itself, gives the shared loop thread back, and is let go."""
    before = loop_thread.shared_users()

    def scenario() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        reader = nsq.Reader("t3", "c", lambda m: True, nsqd_tcp_addresses=nsqd)
        assert reader.io_loop is loop
        try:
            loop.run_until_complete(asyncio.sleep(0))  # started: it subscribes
            asyncio.set_event_loop(None)
            loop.close()
            assert poll(lambda: reader._closed), "the Reader outlived its loop"
            assert poll(lambda: loop_thread.shared_users() == before)
            assert reader not in pynsq_reader._open_readers
        finally:
            reader.close().result(DEADLINE)

    in_thread(scenario)


tornado_testing = pytest.importorskip("tornado.testing")


@pytest.mark.usefixtures("nsqd_on_class")
class TornadoTestCase(tornado_testing.AsyncTestCase):  # type: ignore[misc, name-defined]
    """What a tornado application's tests do: a new IOLoop made current for each test, the
    objects under test built in ``setUp`` (the loop is current, not running yet)."""

    nsqd: str

    def setUp(self) -> None:
        # a Reader built earlier, while no loop was current (module level, another test...)
        asyncio.set_event_loop(None)
        self.earlier = nsq.Reader("t1", "c", lambda m: True, nsqd_tcp_addresses=self.nsqd)
        super().setUp()
        loop = self.io_loop.asyncio_loop
        self.handled: asyncio.Future[tuple[bytes, Any]] = loop.create_future()
        self.published: asyncio.Future[Any] = loop.create_future()
        self.reader = nsq.Reader("t4", "c", self.handler, nsqd_tcp_addresses=self.nsqd)
        self.writer = nsq.Writer(self.nsqd)

    def handler(self, message: nsq.Message) -> bool:
        if not self.handled.done():
            self.handled.set_result((message.body, asyncio.get_running_loop()))
        return True

    def callback(self, conn: Any, data: Any) -> None:
        if not self.published.done():
            self.published.set_result(data)

    def tearDown(self) -> None:
        self.writer.close()
        self.reader.close().result(DEADLINE)
        super().tearDown()
        self.earlier.close().result(DEADLINE)

    @tornado_testing.gen_test(timeout=DEADLINE)  # type: ignore[untyped-decorator]
    async def test_handlers_and_callbacks_run_on_the_test_cases_loop(self) -> None:
        loop = self.io_loop.asyncio_loop
        assert self.earlier.io_loop is not loop
        assert self.reader.io_loop is loop and self.writer.io_loop is loop
        self.writer.pub("t4", b"tornado", self.callback)
        assert await self.published == b"OK"
        assert await self.handled == (b"tornado", loop)


if __name__ == "__main__":
    unittest.main()
