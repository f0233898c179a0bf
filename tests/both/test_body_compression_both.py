"""Message bodies compressed by the publishing client (youzan/go-nsq's ``TopicsForCompress``),
on the dev cluster and the real youzan servers from the same bodies.

The server stores such a body as it came, marked in the ext JSON header; a consumer beside
go-nsq's must hand its handler the original with the two marks gone, and a body it cannot
decode must follow the documented path (requeued with back-off, or the give-up hook), never be
FINed unseen, never stop the consumer.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from both_support import Collector, consuming, is_real, producer
from support import bounded, cli, fresh_name, poke_on_log, rows

from smartnsq import BodyCompression, Consumer
from smartnsq.errors import ProtocolError
from smartnsq.message import Message
from smartnsq.model.backoff import RequeuePolicy
from smartnsq.protocol import body_compression

ORIGINAL = b'{"order": 42, "lines": [' + b'{"sku": "abc", "qty": 1}, ' * 2000 + b"]}"
QUICK = RequeuePolicy(initial=0.1, cap=0.2)


def go_style(codec: body_compression.BodyCodec) -> tuple[bytes, dict[str, str]]:
    packed = body_compression.compress(codec, ORIGINAL)
    assert packed is not None
    return packed


async def _ext_topic(cluster: Any, prefix: str) -> str:
    topic = fresh_name(prefix)
    await cluster.create_topic(topic, partitions=1, replicas=1, ext=True, channels=["ch"])
    return topic


async def test_go_style_compressed_bodies_reach_the_handler_as_the_originals(
        nsq_any_cluster: Any) -> None:
    """gzip, snappy and lz4, as go-nsq marks them: the handler gets the original bytes and the
    producer's own headers, without ``nsq.client.compress`` and ``nsq.msg.size``."""
    cluster = nsq_any_cluster
    topic = await _ext_topic(cluster, "bodyzip")
    async with producer(cluster) as pub:
        for codec in body_compression.CODECS:
            body, marks = go_style(codec)
            async with bounded(10):
                await pub.publish(topic, body, headers={**marks, "codec": codec})
    got = Collector()
    async with consuming(cluster, topic, "ch", got):
        await got.count(1)
        await got.until(lambda: len({m.headers["codec"] for m in got.messages}) == 3,
                        "one message of each codec")
    for message in got.messages:
        assert bytes(message.body) == ORIGINAL, message.headers
        assert message.headers == {"codec": message.headers["codec"]}
        assert message.body_error is None


async def test_async_for_hands_over_the_original_too(nsq_any_cluster: Any) -> None:
    """``async for`` (what ``smartnsq tail`` reads through) decodes as the workers do."""
    cluster = nsq_any_cluster
    topic = await _ext_topic(cluster, "bodyiter")
    body, marks = go_style("gzip")
    async with producer(cluster) as pub, bounded(10):
        await pub.publish(topic, body, headers=marks)
    consumer = Consumer(topic, "ch", lookupd=cluster.lookupd_http_addresses,
                        reconnect_delay=0.1)
    async with bounded(30), consumer:
        async for message in consumer:
            assert bytes(message.body) == ORIGINAL
            assert message.headers == {}
            break


async def test_an_undecodable_body_is_requeued_with_back_off_and_never_handled(
        nsq_any_cluster: Any) -> None:
    """A body marked gzip that is not gzip: the handler never sees it, it comes back (attempts
    grow), and the next message is handled: the consumer lives on."""
    cluster = nsq_any_cluster
    topic = await _ext_topic(cluster, "bodybad")
    async with producer(cluster) as pub, bounded(10):
        await pub.publish(topic, b"not gzip at all",
                          headers={body_compression.CODEC_HEADER: "1",
                                   body_compression.SIZE_HEADER: "100"})
        await pub.publish(topic, b"fine", headers={"k": "v"})
    got = Collector()
    with poke_on_log(got.watch, "smartnsq.consumer"):
        async with consuming(cluster, topic, "ch", got, requeue_policy=QUICK) as consumer:
            await got.count(1)
            await got.until(lambda: consumer.stats().undecodable >= 2,
                            "two deliveries refused, not handled")
    assert got.bodies == [b"fine"]


async def test_the_give_up_hook_gets_an_undecodable_body_with_its_error(
        nsq_any_cluster: Any) -> None:
    """Past ``max_attempts`` the give-up hook decides (here: it keeps the message and FINs
    it): it sees the body as stored, its marks and the reason."""
    cluster = nsq_any_cluster
    topic = await _ext_topic(cluster, "bodyhook")
    raw = gzip.compress(ORIGINAL)[:-9]  # cut short: a stream that never ends
    async with producer(cluster) as pub, bounded(10):
        await pub.publish(topic, raw, headers={body_compression.CODEC_HEADER: "1"})
    kept: list[Message] = []
    got = Collector()

    def hook(message: Message) -> None:
        kept.append(message)
        message.fin()
        got.watch.poke()

    async with consuming(cluster, topic, "ch", got, requeue_policy=QUICK, max_attempts=2,
                         on_give_up=hook):
        await got.until(lambda: bool(kept), "the give-up hook")
    assert got.messages == []
    (message,) = kept
    assert message.attempts == 3
    assert bytes(message.body) == raw
    assert message.headers == {body_compression.CODEC_HEADER: "1"}
    assert isinstance(message.body_error, ProtocolError)
    assert "gzip" in str(message.body_error)


async def test_decompression_can_be_turned_off(nsq_any_cluster: Any) -> None:
    """``decompress=False``: the bytes as stored and the marks, as go-nsq's
    ``DisableMessageDecompress`` gives them."""
    cluster = nsq_any_cluster
    topic = await _ext_topic(cluster, "bodyoff")
    body, marks = go_style("lz4")
    async with producer(cluster) as pub, bounded(10):
        await pub.publish(topic, body, headers=marks)
    got = Collector()
    async with consuming(cluster, topic, "ch", got, decompress=False):
        await got.count(1)
    assert bytes(got.messages[0].body) == body
    assert got.messages[0].headers == marks


async def test_a_body_over_the_decompressed_size_bound_is_not_decoded(
        nsq_any_cluster: Any) -> None:
    """``max_decompressed_size``: a body that would grow past it is refused before it is
    made (and requeued, as any undecodable body)."""
    cluster = nsq_any_cluster
    topic = await _ext_topic(cluster, "bodybig")
    body, marks = go_style("snappy")
    async with producer(cluster) as pub, bounded(10):
        await pub.publish(topic, body, headers=marks)
    got = Collector()
    with poke_on_log(got.watch, "smartnsq.consumer"):
        async with consuming(cluster, topic, "ch", got, requeue_policy=QUICK,
                             max_decompressed_size=1024) as consumer:
            await got.until(lambda: consumer.stats().undecodable >= 1, "a refused delivery")
    assert got.messages == []


def _with_index(i: int) -> bytes:
    """A body youzan's Go client program reads (``yzgo consume``): a 10-digit index, then
    padding, large enough to be compressed."""
    return f"{i:010d}".encode() + ORIGINAL


async def test_the_producer_compresses_large_bodies_as_go_nsq_does(nsq_any_cluster: Any) -> None:
    """``Producer(compress=...)``: a body of ``min_size`` or more is stored compressed and
    marked (as a consumer that does not decode sees it); a smaller one, a batch and a
    publish to a topic outside the mapping go as they are. A decoding consumer reads the
    originals with the caller's headers only."""
    cluster = nsq_any_cluster
    topic = await _ext_topic(cluster, "bodypub")
    other = await _ext_topic(cluster, "bodyother")
    setting = BodyCompression("snappy", min_size=1000)
    async with producer(cluster, compress={topic: setting}) as pub, bounded(10):
        await pub.publish(topic, ORIGINAL, headers={"k": "v"}, trace_id=77)
        await pub.publish(topic, b"small" * 10)
        await pub.publish_many(topic, [ORIGINAL])
        await pub.publish(other, ORIGINAL)
    raw = Collector()
    async with consuming(cluster, topic, "ch", raw, decompress=False):
        await raw.until(lambda: len(raw.messages) >= 3, "three messages")
    stored = {len(m.body): m for m in raw.messages}
    packed = next(m for m in raw.messages if m.headers.get(body_compression.CODEC_HEADER))
    assert packed.headers == {"k": "v", body_compression.CODEC_HEADER: "2",
                              body_compression.SIZE_HEADER: str(len(ORIGINAL))}
    assert len(packed.body) < len(ORIGINAL) and packed.trace_id == 77
    assert sorted(stored) == sorted([len(packed.body), 50, len(ORIGINAL)])
    plain = Collector()
    async with consuming(cluster, other, "ch", plain, decompress=False):
        await plain.count(1)
    assert bytes(plain.messages[0].body) == ORIGINAL and plain.messages[0].headers == {}


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4"])
async def test_youzans_go_client_reads_what_the_producer_compressed(
        codec: body_compression.BodyCodec, nsq_any_cluster: Any) -> None:
    """The independent check: youzan's own Go client (go-nsq v1.7.2-HA, ``yzgo``) consumes
    what smartnsq compressed, each codec, and finds its bodies' indexes (it parses the
    index at the start of each body it is handed)."""
    cluster = nsq_any_cluster
    if not is_real(cluster):
        pytest.skip("youzan's Go client runs beside the real servers only")
    topic = await _ext_topic(cluster, f"bodygo{codec}")
    async with producer(cluster, compress=BodyCompression(codec)) as pub, bounded(10):
        for i in range(3):
            await pub.publish(topic, _with_index(i), headers={"i": str(i)})
    yzgo = Path(os.environ["SMARTNSQ_REAL_NSQ"]) / "youzan" / "yzgo"
    done = await asyncio.wait_for(asyncio.to_thread(
        subprocess.run, [str(yzgo), "consume", topic, "ch", "3", "10", "1",
                         ",".join(cluster.lookupd_http_addresses)],
        capture_output=True, text=True, timeout=60), 70)
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and result, done.stdout + done.stderr
    # yzgo counts the distinct indexes it parsed: the same bodies compressed but unmarked
    # never reach 3 (tried: it waits until killed)
    assert json.loads(result[0][len("RESULT "):])["distinct"] == 3, result



async def test_smartnsq_tail_prints_the_original(nsq_any_cluster: Any) -> None:
    """``smartnsq tail``: a go-nsq-compressed body is printed as the original, its headers
    without the two marks."""
    cluster = nsq_any_cluster
    topic = await _ext_topic(cluster, "bodytail")
    body, marks = go_style("lz4")
    async with producer(cluster) as pub, bounded(10):
        await pub.publish(topic, body, headers={**marks, "k": "v"})
    code, out, err = await cli("tail", topic, "--channel", "ch", "-n", "1", "--json",
                               "--lookupd", cluster.lookupd_http_addresses[0], timeout=60)
    assert code == 0, err
    (row,) = rows(out)
    assert row["body"].encode() == ORIGINAL and row["headers"] == {"k": "v"}
