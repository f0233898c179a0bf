"""Bad inputs end in documented smartnsq errors naming what was wrong, never
in ``TypeError``/``AttributeError``/``OverflowError``/``RuntimeError``/``ValueError`` from deep
inside, and a refused call leaves nothing half-done behind."""

from __future__ import annotations

import asyncio
import math
import socket
from typing import Any

import pytest
from support import WAIT, BackgroundCluster, Watch, bounded

from smartnsq import Consumer, Producer, sync
from smartnsq.errors import ConnectionFailed, InvalidArgument, NSQError, ProtocolError
from smartnsq.message import Message
from smartnsq.protocol import frames


def refused_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("kind", ["Producer", "Consumer", "sync.Producer"])
@pytest.mark.parametrize("field,value", [("lookupd", 5), ("lookupd", b"127.0.0.1:4161"),
                                         ("nsqd", 5), ("config", 5), ("loop_thread", 5)])
def test_bad_constructor_arguments_name_the_field(kind: str, field: str, value: Any) -> None:
    if field == "loop_thread" and not kind.startswith("sync"):
        pytest.skip("only the facades take a loop thread")
    kwargs: dict[str, Any] = {field: value}
    if field not in ("lookupd", "nsqd"):
        kwargs["lookupd"] = [refused_address()]
    with pytest.raises(InvalidArgument) as info:
        if kind == "Producer":
            Producer(**kwargs)
        elif kind == "Consumer":
            Consumer("t", "c", handler=lambda m: None, **kwargs)
        else:
            sync.Producer(**kwargs).close()
    assert info.value.field == field


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_publish_many_of_none_names_bodies(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("bad_bodies")
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses) as p:
        for bodies in (None, 5, b"one body"):
            with pytest.raises(InvalidArgument) as info:
                await p.publish_many("bad_bodies", bodies)  # type: ignore[arg-type]
            assert info.value.field == "bodies"


# "Producer.close(timeout="1") also leaves 2 connections and 2 tasks open"
@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_a_bad_close_timeout_is_refused_before_closing_anything(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("bad_close", partitions=2)
    p = Producer(lookupd=nsq_cluster.lookupd_http_addresses)
    await p.publish("bad_close", b"a", partition=0)
    await p.publish("bad_close", b"b", partition=1)
    pending = [p.publish_nowait("bad_close", b"c", partition=i) for i in (0, 1)]
    with pytest.raises(InvalidArgument) as info:
        await p.close(timeout="1")  # type: ignore[arg-type]
    assert info.value.field == "timeout"
    assert not p.closed
    await asyncio.gather(*pending)
    async with bounded(5.0):
        await p.close(timeout=1)
    assert p.closed and not p.pool.connections


def test_the_sync_producer_takes_a_very_long_timeout() -> None:
    bg = BackgroundCluster(1, {"long_timeout": 1}, WAIT)
    try:
        check_long_timeout(bg.lookupd)
    finally:
        bg.stop()


def check_long_timeout(lookupd: list[str]) -> None:
    with sync.Producer(lookupd=lookupd) as p:
        # OverflowError from the facade's wait before: 1e10 s is past the platform's lock limit
        assert p.publish("long_timeout", b"x", timeout=1e10).partition == 0
        with pytest.raises(InvalidArgument) as info:
            p.publish_many("long_timeout", None)  # type: ignore[arg-type]
        assert info.value.field == "bodies"
        with pytest.raises(InvalidArgument):
            p.publish("long_timeout", b"x", timeout="5")  # type: ignore[arg-type]


def test_sync_objects_used_after_close_raise_the_async_clients_error() -> None:
    p = sync.Producer(lookupd=[refused_address()])
    p.close()
    for call in (lambda: p.publish("t", b"x"), lambda: p.publish_many("t", [b"x"]),
                 lambda: p.routes("t"), lambda: p.set_trace(True)):
        with pytest.raises(ConnectionFailed):
            call()
    c = sync.Consumer("t", "c", lookupd=[refused_address()], handler=lambda m: None)
    c.close()
    for call in (lambda: iter(c), lambda: c.stats(lag=True), lambda: c.set_max_in_flight(3),
                 lambda: c.set_trace(True), lambda: c.is_starved()):
        with pytest.raises(ConnectionFailed):
            call()
    assert c.stats().received == 0  # the last snapshot stays readable


def test_a_classic_message_id_that_is_not_hex_is_a_protocol_error() -> None:
    msg = frames.MessageFrame(0, 1, b"not-hex-at-all!!", b"body", youzan=False)
    with pytest.raises(ProtocolError):
        msg.internal_id  # noqa: B018


# "OverflowError (message.req(math.inf) after the message is already marked requeued)"
@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_an_infinite_requeue_delay_is_refused_and_the_message_stays_answerable(
        nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("req_inf", channels=["c"])
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses) as p:
        await p.publish("req_inf", b"x")
    watch = Watch()
    refused: list[BaseException] = []
    finished: list[Message] = []

    async def handler(msg: Message) -> None:
        for delay in (math.inf, math.nan, -1.0):
            try:
                msg.req(delay)
            except NSQError as exc:
                refused.append(exc)
        msg.fin()
        finished.append(msg)
        watch.poke()

    consumer = Consumer("req_inf", "c", lookupd=nsq_cluster.lookupd_http_addresses,
                        handler=handler, auto_finish=False)
    await consumer.start()
    try:
        await watch.until(lambda: bool(finished), WAIT, "the message finished")
        assert len(refused) == 3
        assert all(isinstance(e, InvalidArgument) for e in refused)
    finally:
        await consumer.close()
