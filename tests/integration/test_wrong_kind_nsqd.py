"""An ``nsqd=`` address whose peer answers and is not nsqd's TCP port (nsqd's or lookupd's
HTTP port, some web server) is a configuration error, as the same mistake with ``lookupd=``
is: when every address given is of that kind the consumer fails at once with the sentence the
producer and the CLI give; with one real nsqd among them it consumes and logs the wrong one.
Real sockets on loopback; the same bodies on the real servers (``-m real``)."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from support import bounded

from smartnsq import Consumer, Producer
from smartnsq.errors import ProtocolError

ROOT = Path(__file__).resolve().parents[2]
SENTENCE = "not NSQ's TCP protocol: is this nsqd's TCP port (usually 4150)?"
FAST = 2.0  # what "at once" means here: a retry loop's first back-off alone is longer


async def consumer_error(addresses: list[str]) -> BaseException:
    consumer = Consumer("t", "c", nsqd=addresses, handler=lambda m: None)
    await consumer.start()
    try:
        with pytest.raises(ProtocolError) as info:
            async with bounded(FAST):
                await consumer.join()
    finally:
        await consumer.close()
    assert consumer.error is info.value
    return info.value


async def producer_error(addresses: list[str]) -> BaseException:
    async with Producer(nsqd=addresses) as producer:
        with pytest.raises(ProtocolError) as info:
            async with bounded(FAST):
                await producer.publish("t", b"x")
    return info.value


async def wrong_kind_fails_fast(cluster: Any) -> None:
    await cluster.create_topic("t", channels=["c"])
    for wrong in ([cluster.nsqd_http_addresses[0]], [cluster.lookupd_http_addresses[0]],
                  [cluster.nsqd_http_addresses[0], cluster.lookupd_http_addresses[0]]):
        consumed = await consumer_error(wrong)
        published = await producer_error(wrong)
        for error in (consumed, published):
            assert SENTENCE in str(error) and wrong[0] in str(error)


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_http_ports_as_nsqd_fail_fast_youzan(nsq_any_cluster: Any) -> None:
    await wrong_kind_fails_fast(nsq_any_cluster)


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1)
async def test_http_ports_as_nsqd_fail_fast_classic(nsq_any_cluster: Any) -> None:
    await wrong_kind_fails_fast(nsq_any_cluster)


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1)
async def test_one_real_nsqd_among_wrong_ones_consumes(nsq_any_cluster: Any) -> None:
    cluster = nsq_any_cluster
    await cluster.create_topic("t", channels=["c"])
    wrong = cluster.nsqd_http_addresses[0]
    got, warned = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()

    class Warned(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            text = record.getMessage()
            if record.levelno >= logging.WARNING and wrong in text and SENTENCE in text:
                loop.call_soon_threadsafe(warned.set)

    handler = Warned()
    logger = logging.getLogger("smartnsq")
    logger.addHandler(handler)
    try:
        async with Producer(nsqd=cluster.nsqd_tcp_addresses) as producer:
            await producer.publish("t", b"x")
        async with Consumer("t", "c", nsqd=[wrong, cluster.nsqd_tcp_addresses[0]],
                            handler=lambda m: got.set()) as consumer:
            async with bounded(10):
                await got.wait()
                await warned.wait()  # the wrong one said once what it looks like
            assert consumer.error is None
    finally:
        logger.removeHandler(handler)


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1)
async def test_the_cli_says_the_same_sentence_without_waiting_its_timeout(
        nsq_any_cluster: Any) -> None:
    """Each command is given 60 s; failing at once, it ends long before (the bound leaves
    room for a loaded machine's interpreter start, not for a retry loop)."""
    cluster = nsq_any_cluster
    await cluster.create_topic("t", channels=["c"])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SMARTNSQ_LOOKUPD", None)
    wrong = cluster.nsqd_http_addresses[0]
    for command in (["pub", "t", "--nsqd", wrong], ["tail", "t", "--nsqd", wrong, "-n", "1"],
                    ["pub", "t", "--lookupd", cluster.nsqd_tcp_addresses[0]],
                    ["tail", "t", "--lookupd", cluster.nsqd_tcp_addresses[0], "-n", "1"]):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "smartnsq", *command, "--timeout", "60",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, cwd=ROOT)
        async with bounded(20):
            _, err = await proc.communicate(b"hello\n")
        text = err.decode()
        assert proc.returncode == 1, (command, text)
        assert "usually 4150" in text and "Traceback" not in text, (command, text)
